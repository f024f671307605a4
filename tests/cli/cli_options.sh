#!/usr/bin/env bash
# Every command reads its options the same way, as Python's argparse (so
# SGLang) does: `--opt value` and `--opt=value`, unambiguous prefixes, SGLang's
# --model-path and a positional model; errors name the option (exit 2) and
# --help comes from the same table. Truth: llama2.c's greedy ids for the
# bundled model (models/stories260K/reference_llama2c.json).
set -u
: "${KILN:?}" "${KILN_MODELS:?}"
M="$KILN_MODELS/stories260K"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

# llama2.c's first 8 ids after BOS for the empty prompt
want=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prompts"][1]; assert p["prompt_ids"]==[1]; print(",".join(map(str,p["generated_ids"][:8])))' "$M/reference_llama2c.json")

# generate: each spelling gives the reference ids
spellings=(
  "--model $M --ids 1 --max-tokens 8"
  "--model=$M --ids=1 --max-tokens=8"
  "--model-path $M --ids 1 --max-tok 8"
  "--model-path=$M --id=1 --max=8"
  "$M --ids 1 --max-tokens 8"
  "--ids 1 $M --max-tokens=8 --threads=1"
  "--ids 1 --max-tokens 8 -- $M"
)
for s in "${spellings[@]}"; do
  # shellcheck disable=SC2086
  got=$("$KILN" generate $s 2>"$tmp/err")
  if [ "$got" = "$want" ]; then ok "generate $s"; else bad "generate $s: got '$got' want '$want': $(cat "$tmp/err")"; fi
done

# usage errors: exit 2, one message naming the option
expect_usage() { # expect_usage PATTERN -- kiln args...
  local pat=$1; shift 2
  local err rc
  err=$(timeout 30 "$KILN" "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 2 ] && printf '%s' "$err" | grep -Fq -- "$pat"; then ok "$* -> $(printf '%s' "$err" | head -1)"
  else bad "$* (rc=$rc, want 2 and '$pat'): $err"; fi
}
expect_usage "unknown option '--no-such'" -- generate --ids 1 --no-such 3
expect_usage "ambiguous option '--max'" -- serve --max 5
expect_usage "--max-running-requests" -- serve --max 5
expect_usage "--port: expected an integer in [0, 65535], got '70000'" -- serve --port=70000
expect_usage "--port: expected an integer in [0, 65535], got ' 80'" -- serve --port " 80"
expect_usage "--threads: expected an integer in [1, 1024], got '2x'" -- generate --ids 1 --threads 2x
expect_usage "--max-tokens needs a value" -- generate --ids 1 --max-tokens
expect_usage "--model needs a value (got the option '--ids'" -- generate --model --ids 1
expect_usage "--skip-warmup takes no value" -- serve --skip-warmup=yes
expect_usage "--schedule-policy: expected one of fcfs|lpm|priority, got 'lifo'" -- serve --schedule-policy lifo
expect_usage "--mem-fraction-static: expected a number in" -- serve --mem-fraction-static 1.5
expect_usage "unexpected argument 'extra'" -- generate "$M" extra --ids 1
expect_usage "the model is given twice" -- generate "$M" --model /elsewhere --ids 1
expect_usage "unknown option '--device'" -- bench serving --device cpu
expect_usage "--num-prompts: expected an integer" -- bench offline --num-prompts=0
expect_usage "--speculative-algorithm EAGLE: not supported; NGRAM is" -- serve --speculative-algorithm EAGLE
expect_usage "need --speculative-algorithm NGRAM" -- serve --speculative-num-draft-tokens 3
expect_usage "--speculative-num-draft-tokens: expected an integer in [1, 16]" -- serve --speculative-algorithm NGRAM --speculative-num-draft-tokens 17
expect_usage "is above the max" -- serve --speculative-algorithm NGRAM --speculative-ngram-min-match-window-size 5 --speculative-ngram-max-match-window-size 2
expect_usage "unknown option '--speculative-algorithm'" -- bench serving --speculative-algorithm NGRAM

# --help: generated from the table (every option, prefixes work for it too), exit 0
for c in serve generate verify bench chat-template tokenize detokenize profile-report; do
  out=$("$KILN" "$c" --help 2>&1); rc=$?
  if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q "^usage: kiln $c"; then ok "$c --help"; else bad "$c --help (rc=$rc): $out"; fi
done
out=$("$KILN" serve --hel); printf '%s' "$out" | grep -q -- "--model, --model-path MODEL" && ok "serve --hel" || bad "serve --hel: $out"
for o in --host --port --api-key --served-model-name --chat-template --max-running-requests --context-length \
         --schedule-policy --enable-trace --device --threads --page-size; do
  "$KILN" serve --help | grep -q -- "^  $o" || bad "serve --help lacks $o"
done

# verify: --model-path, prefixes and = spellings reach the check
out=$("$KILN" verify --model-path="$M" --ref "$M/reference.safetensors" --tol=1e-3 --chunk=4 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q "^max_abs_err="; then ok "verify --model-path= --ref --tol= --chunk="; else bad "verify (rc=$rc): $out"; fi
# verify --routing-check: a dense model has no choices to compare; one rank only
out=$("$KILN" verify --model "$M" --reference "$M/reference.safetensors" --routing-check 2>&1); rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q -- "--routing-check: .*stories260K has no MoE layers"; then
  ok "verify --routing-check on a dense model"; else bad "verify --routing-check on a dense model (rc=$rc): $out"; fi
out=$("$KILN" verify --model "$M" --reference "$M/reference.safetensors" --routing-check --tp 2 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "--routing-check runs on one rank"; then
  ok "verify --routing-check --tp 2"; else bad "verify --routing-check --tp 2 (rc=$rc): $out"; fi

# tokenize: --tok prefix and --tokenizer=DIR
got=$(echo '"Once upon a time"' | "$KILN" tokenize --tok="$M" --add 2>&1)
want_ids=$(echo '"Once upon a time"' | "$KILN" tokenize --tokenizer "$M" --add-special 2>&1)
[ -n "$got" ] && [ "$got" = "$want_ids" ] && ok "tokenize --tok= --add" || bad "tokenize: '$got' vs '$want_ids'"

[ $fail -eq 0 ] && echo "all option checks passed"
exit $fail
