#!/usr/bin/env bash
# --model (and --tokenizer) take a Hugging Face id whose files are in the
# local Hugging Face cache, laid out as huggingface_hub writes it
# (hub/models--ORG--NAME/{blobs,refs/main,snapshots/<commit>/} with the
# snapshot's files linked to blobs); refs/main picks the snapshot; HF_HOME,
# HF_HUB_CACHE and the ~/.cache default are honoured; an id that is not
# there is a clear error (nothing is downloaded). Truth: llama2.c's greedy
# ids for the bundled model.
export SERVE_NODE=0
source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/knob_line.sh"
M="$(cd "$KILN_MODELS/stories260K" && pwd)"
tmp="$SERVE_TMP"
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

# mkcache HUB: kiln-test/stories260K with two snapshots; refs/main names the
# good one, the other has a broken config.json
mkcache() {
  python3 - "$M" "$1" <<'PY'
import hashlib, os, shutil, sys
src, hub = sys.argv[1], sys.argv[2]
repo = os.path.join(hub, "models--kiln-test--stories260K")
main, old = "0123456789abcdef0123456789abcdef01234567", "89abcdef0123456789abcdef0123456789abcdef"
os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
def put(rev, name, data):
    sha = hashlib.sha256(data).hexdigest()
    open(os.path.join(repo, "blobs", sha), "wb").write(data)
    d = os.path.join(repo, "snapshots", rev)
    os.makedirs(d, exist_ok=True)
    os.symlink(os.path.join("..", "..", "blobs", sha), os.path.join(d, name))
for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]:
    put(main, f, open(os.path.join(src, f), "rb").read())
put(old, "config.json", b"{ broken")
open(os.path.join(repo, "refs", "main"), "w").write(main)
PY
}
mkcache "$tmp/hf/hub"
want=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prompts"][1]; print(",".join(map(str,p["generated_ids"][:8])))' "$M/reference_llama2c.json")

gen() { # gen ENV... -- : kiln generate of the id, 8 tokens after BOS
  env "$@" "$KILN" generate kiln-test/stories260K --ids 1 --max-tokens 8 2>"$tmp/err"
}
got=$(gen HF_HOME="$tmp/hf" HF_HUB_CACHE=)
[ "$got" = "$want" ] && ok "HF_HOME" || bad "HF_HOME: '$got': $(cat "$tmp/err")"
got=$(gen HF_HOME="$tmp/elsewhere" HF_HUB_CACHE="$tmp/hf/hub")
[ "$got" = "$want" ] && ok "HF_HUB_CACHE wins over HF_HOME" || bad "HF_HUB_CACHE: '$got': $(cat "$tmp/err")"
mkdir -p "$tmp/home/.cache/huggingface" && mkcache "$tmp/home/.cache/huggingface/hub"
got=$(gen -u HF_HOME -u HF_HUB_CACHE -u XDG_CACHE_HOME HOME="$tmp/home")
[ "$got" = "$want" ] && ok "~/.cache/huggingface by default" || bad "default cache: '$got': $(cat "$tmp/err")"
got=$(env HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" generate --model-path=kiln-test/stories260K --ids 1 --max-tokens 8 2>"$tmp/err")
[ "$got" = "$want" ] && ok "--model-path=ID" || bad "--model-path=ID: '$got': $(cat "$tmp/err")"
ids=$(echo '"Once upon a time"' | env HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" tokenize --tokenizer kiln-test/stories260K 2>&1)
want_ids=$(echo '"Once upon a time"' | "$KILN" tokenize --tokenizer "$M" 2>&1)
[ "$ids" = "$want_ids" ] && ok "tokenize --tokenizer ID" || bad "tokenize --tokenizer ID: '$ids' vs '$want_ids'"

# errors: one line naming what was looked for, exit 1, nothing loaded
expect_err() { # expect_err NAME PATTERN -- env/args
  local name=$1 pat=$2; shift 3
  local err rc
  # the start-up line listing the KILN_* knobs the test environment sets is not an error
  err=$(env "$@" 2>&1 >/dev/null); rc=$?
  err=$(printf '%s\n' "$err" | drop_knob_line)
  if [ $rc -eq 1 ] && printf '%s' "$err" | grep -Fq -- "$pat" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then ok "$name: $err"
  else bad "$name (rc=$rc, want 1 and '$pat'): $err"; fi
}
expect_err "id not in the cache" "'kiln-test/nothing' is neither a folder nor a model in the Hugging Face cache (no $tmp/hf/hub/models--kiln-test--nothing); kiln does not download" -- \
  HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" generate kiln-test/nothing --ids 1
expect_err "serve: id not in the cache" "huggingface-cli download kiln-test/nothing" -- \
  HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" serve --model kiln-test/nothing --port 0
echo ffffffffffffffffffffffffffffffffffffffff > "$tmp/hf/hub/models--kiln-test--stories260K/refs/main"
expect_err "refs/main names a missing snapshot" "refs/main names the snapshot ffffffffffffffffffffffffffffffffffffffff" -- \
  HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" generate kiln-test/stories260K --ids 1
rm "$tmp/hf/hub/models--kiln-test--stories260K/refs/main"
expect_err "two snapshots, no refs/main" "has 2 snapshots" -- \
  HF_HOME="$tmp/hf" HF_HUB_CACHE= "$KILN" generate kiln-test/stories260K --ids 1
mkcache "$tmp/hf2/hub" && rm "$tmp/hf2/hub/models--kiln-test--stories260K/refs/main"
rm -rf "$tmp/hf2/hub/models--kiln-test--stories260K/snapshots/89abcdef0123456789abcdef0123456789abcdef"
got=$(gen HF_HOME="$tmp/hf2" HF_HUB_CACHE=)
[ "$got" = "$want" ] && ok "the only snapshot when there is no refs/main" || bad "only snapshot: '$got': $(cat "$tmp/err")"

# kiln serve ID: the id is the served model name (as SGLang's model path is)
export HF_HOME="$tmp/hf2" HF_HUB_CACHE=
serve_start H kiln-test/stories260K --skip-sampler-warmup --threads 1
out=$(python3 -c 'import json,sys,urllib.request; print([m["id"] for m in json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models"))["data"]])' "$URL_H" 2>&1)
[ "$out" = "['kiln-test/stories260K']" ] && ok "served model name is the id" || bad "/v1/models: $out"
serve_stop H || bad "H did not stop cleanly"

[ $fail -eq 0 ] && echo "all Hugging Face cache checks passed"
exit $fail
