#!/usr/bin/env bash
# `kiln serve` start-up: what can fail without the model fails before it
# loads (a port in use, a --host that does not resolve or bind, a missing or
# broken --chat-template), with one clear message; --host takes names
# ("localhost") and IPv6 literals; a model whose tokenizer_config.json holds
# Python's int(1e30) (Llama-2/3, gpt-oss) serves chat completions.
export SERVE_NODE=0
source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/knob_line.sh"
M="$(cd "$KILN_MODELS/stories260K" && pwd)"
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

# expect_early NAME RC PATTERN -- serve args: exits RC with PATTERN on stderr,
# and the model never loaded (its "kiln serve: model" line is missing)
expect_early() {
  local name=$1 want_rc=$2 pat=$3; shift 4
  local rc
  timeout 60 "$KILN" serve --skip-sampler-warmup "$@" >"$SERVE_TMP/early.out" 2>"$SERVE_TMP/early.err"; rc=$?
  if [ $rc -eq "$want_rc" ] && grep -Fq -- "$pat" "$SERVE_TMP/early.err" && ! grep -q "kiln serve: model" "$SERVE_TMP/early.out" \
     && ! drop_knob_line <"$SERVE_TMP/early.err" | grep -q "INFO"; then
    ok "$name: $(grep -F -- "$pat" "$SERVE_TMP/early.err")"
  else
    bad "$name (rc=$rc, want $want_rc and '$pat' before the model loads)"; cat "$SERVE_TMP/early.out" "$SERVE_TMP/early.err"
  fi
}

# a port in use: a listener of our own holds it
python3 - "$SERVE_TMP/port" <<'PY' &
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
time.sleep(120)
PY
holder=$!
for _ in $(seq 1 100); do [ -s "$SERVE_TMP/port" ] && break; sleep 0.05; done
busy=$(cat "$SERVE_TMP/port")
expect_early "port in use" 1 "cannot listen on 127.0.0.1:$busy: Address already in use" -- --model "$M" --port "$busy"
kill "$holder" 2>/dev/null

# an address this machine does not have (TEST-NET-1, RFC 5737)
expect_early "address not here" 1 "cannot listen on 192.0.2.1:" -- --model "$M" --host 192.0.2.1 --port 0
# a name that does not resolve (.invalid, RFC 2606); where the resolver
# cannot answer quickly, the check is skipped rather than waited for
t0=$(date +%s)
if timeout 20 python3 -c 'import socket; socket.getaddrinfo("no-such-host.invalid", 80)' 2>/dev/null; then
  echo "skip: no-such-host.invalid resolves here"
elif [ $(( $(date +%s) - t0 )) -lt 15 ]; then
  expect_early "name does not resolve" 2 "--host 'no-such-host.invalid': cannot resolve" -- --model "$M" --host no-such-host.invalid --port 0
else
  echo "skip: the resolver is slow here"
fi

# --chat-template: missing, and a template that does not compile
expect_early "missing --chat-template" 2 "--chat-template: $SERVE_TMP/none.jinja: cannot open" -- \
  --model "$M" --port 0 --chat-template "$SERVE_TMP/none.jinja"
printf '{%% for m in messages %%}{{ m.content }' > "$SERVE_TMP/bad.jinja"
expect_early "broken --chat-template" 2 "--chat-template $SERVE_TMP/bad.jinja:" -- --model "$M" --port 0 --chat-template "$SERVE_TMP/bad.jinja"

# http_get URL -> prints the status and body
http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as r:
    print(r.status, r.read().decode())
PY
}

# --host localhost (a name) and ::1 (an IPv6 literal, also in brackets)
serve_start L --model "$M" --skip-sampler-warmup --threads 1 --host localhost
port=${URL_L##*:}
out=$(http_get "http://127.0.0.1:$port/v1/models" 2>&1)
case "$out" in 200*stories260K*) ok "--host localhost: $URL_L answers on 127.0.0.1";; *) bad "--host localhost: $out";; esac
serve_stop L || bad "L did not stop cleanly"
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
  for h in ::1 '[::1]'; do
    serve_start V6 --model "$M" --skip-sampler-warmup --threads 1 --host "$h"
    port=${URL_V6##*:}
    out=$(http_get "http://[::1]:$port/health" 2>&1)
    case "$URL_V6" in "http://[::1]:"*) ;; *) bad "--host $h: printed URL $URL_V6";; esac
    case "$out" in 200*) ok "--host $h: $URL_V6";; *) bad "--host $h: $out";; esac
    serve_stop V6 || bad "V6 did not stop cleanly"
    rm -f "$SERVE_TMP/V6.status" "$SERVE_TMP/V6.pid"
  done
else
  echo "skip: no IPv6 loopback"
fi

# tokenizer_config.json with model_max_length = int(1e30): chat completions work
mkdir -p "$SERVE_TMP/big"
for f in config.json generation_config.json model.safetensors tokenizer.json; do ln -s "$M/$f" "$SERVE_TMP/big/$f"; done
python3 - "$M/tokenizer_config.json" "$SERVE_TMP/big/tokenizer_config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["model_max_length"] = int(1e30)
cfg["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
open(sys.argv[2], "w").write(json.dumps(cfg, indent=2))
PY
grep -q '"model_max_length": 1000000000000000019884624838656' "$SERVE_TMP/big/tokenizer_config.json" || bad "fixture"
serve_start B --model "$SERVE_TMP/big" --skip-sampler-warmup --threads 1
out=$(python3 - "$URL_B" <<'PY' 2>&1
import json, sys, urllib.request, urllib.error
body = json.dumps({"model": "big", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 4}).encode()
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", body, {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        d = json.load(r)
        print(r.status, d["usage"]["completion_tokens"], repr(d["choices"][0]["message"]["content"]))
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
)
case "$out" in "200 4 "*) ok "chat with model_max_length 1e30: $out";; *) bad "chat with model_max_length 1e30: $out";; esac
serve_stop B || bad "B did not stop cleanly"

[ $fail -eq 0 ] && echo "all start-up checks passed"
exit $fail
