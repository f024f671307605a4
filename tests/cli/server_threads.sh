#!/usr/bin/env bash
# Every thread of `kiln serve` at once: the loop thread, the engine thread,
# two tokenizer workers (every body through the pool) and two CPU backend
# threads, under concurrent completions (plain and streamed), chat,
# tokenize/detokenize, a client that disconnects mid-stream, metrics and
# health, then SIGTERM. Greedy outputs produced concurrently must equal the
# same request served alone (batch invariance), and the server must exit 0.
# Short in a release build; the ThreadSanitizer build (label tsan) runs it
# to catch data races, which make the server exit non-zero.
SERVE_NODE=0
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
t="$KILN_SRC/tests/server/chatml.jinja"
fail=0
D="$SERVE_TMP/out" # removed with the servers' files
mkdir -p "$D"
serve_start S --model "$m" --skip-sampler-warmup --threads 2 --chat-template "$t" \
    --tokenizer-workers 2 --tokenizer-inline-bytes 0 --shutdown-timeout 30
post() { # name path body [curl options]: writes $D/name.out (body) and $D/name.code
    curl -sS -o "$D/$1.out" -w '%{http_code}' "${@:4}" -H 'Content-Type: application/json' \
        -d "$3" "$URL_S$2" >"$D/$1.code" 2>"$D/$1.err"
}
greedy='"max_tokens": 24, "temperature": 0'
# the truth: one greedy completion served alone
post alone /v1/completions "{\"prompt\": \"Once upon a time\", $greedy}"
# then everything at once
for i in 1 2 3 4; do post "c$i" /v1/completions "{\"prompt\": \"Once upon a time\", $greedy}" & done
post s1 /v1/completions "{\"prompt\": \"Once upon a time\", $greedy, \"stream\": true}" &
post chat /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}' &
post tok /tokenize '{"prompt": "Lily and Tom went to the park."}' &
post gen /generate '{"text": "The dog", "sampling_params": {"max_new_tokens": 16, "temperature": 0.8}}' &
post cut /v1/completions "{\"prompt\": \"Tom\", \"max_tokens\": 400, \"stream\": true}" --max-time 0.5 &
for i in 1 2 3; do curl -s -o /dev/null "$URL_S/metrics" & curl -s -o /dev/null "$URL_S/health" & done
wait
for n in alone c1 c2 c3 c4 s1 chat tok gen; do
    [ "$(cat "$D/$n.code")" = 200 ] || { echo "FAIL: $n: HTTP $(cat "$D/$n.code") $(head -c 300 "$D/$n.out")"; fail=1; }
done
text() { sed -n 's/.*"text" *: *"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$1" | head -1; }
want=$(text "$D/alone.out")
[ -n "$want" ] || { echo "FAIL: no text in $(head -c 300 "$D/alone.out")"; fail=1; }
for i in 1 2 3 4; do
    got=$(text "$D/c$i.out")
    [ "$got" = "$want" ] || { echo "FAIL: concurrent c$i: '$got' (alone: '$want')"; fail=1; }
done
# the streamed one: its text pieces joined give the same text
streamed=$(grep '^data: {' "$D/s1.out" | sed -n 's/.*"text" *: *"\(\([^"\\]\|\\.\)*\)".*/\1/p' | tr -d '\n')
[ "$streamed" = "$want" ] || { echo "FAIL: streamed '$streamed' (alone: '$want')"; fail=1; }
# detokenize what tokenize gave: the text comes back
ids=$(sed -n 's/.*"tokens" *: *\(\[[0-9, ]*\]\).*/\1/p' "$D/tok.out")
post detok /detokenize "{\"tokens\": $ids}"
grep -q 'Lily and Tom went to the park.' "$D/detok.out" || { echo "FAIL: detokenize: $(head -c 300 "$D/detok.out")"; fail=1; }
kill -TERM "$PID_S"
serve_wait S || fail=1
[ $fail -eq 0 ] && echo "threads: ok ('$want' alone and 5 times concurrently)"
exit $fail
