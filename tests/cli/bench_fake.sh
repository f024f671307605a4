#!/usr/bin/env bash
# `kiln bench serving` against a fake server with known timings
# (tests/bench/fake_server.mjs: first token after 50 ms, then one every
# 20 ms): the reported TTFT / ITL / TPOT / E2E match those timings, every
# backend and dataset works, failures (HTTP errors, refused connections,
# malformed or failing streams, hangs) are counted with their messages and
# never hang the client, and the JSON line has every field and agrees with
# the report (tests/bench/check_result.mjs).
set -u
src="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
kiln="${KILN:-$src/build/kiln}"
tmp=$(mktemp -d)
node "$src/tests/bench/fake_server.mjs" 50 20 > "$tmp/server.out" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 50); do grep -qs PORT "$tmp/server.out" && break; sleep 0.1; done
port=$(awk '/PORT/ {print $2}' "$tmp/server.out")
[ -n "$port" ] || { echo "FAIL: the fake server did not start"; exit 1; }
url="http://127.0.0.1:$port"
fail=0; runs=0

# case NAME EXPECTED-RC EXPECT-JSON kiln-bench-args...
case_() {
  local name=$1 want_rc=$2 expect=$3; shift 3
  runs=$((runs + 1))
  "$kiln" bench serving --disable-tqdm --output-file "$tmp/$name.jsonl" "$@" > "$tmp/$name.txt" 2> "$tmp/$name.err"
  local rc=$?
  if [ "$rc" != "$want_rc" ]; then
    echo "FAIL: $name: exit code $rc, expected $want_rc"; sed 's/^/  /' "$tmp/$name.err" | tail -5
    fail=$((fail + 1)); return
  fi
  if node "$src/tests/bench/check_result.mjs" "$tmp/$name.txt" "$tmp/$name.jsonl" "$expect"; then
    echo "ok: $name"
  else
    echo "FAIL: $name"; sed 's/^/  | /' "$tmp/$name.txt"; fail=$((fail + 1))
  fi
}

# 8 requests x 10 tokens, 4 at a time: TTFT 50, ITL 20, E2E 50 + 9*20 = 230.
# Lower bounds are the server's own delays; the upper ones leave room for
# a busy 2-core machine.
gen="--num-prompts 8 --random-input-len 16 --random-output-len 10 --random-range-ratio 1 --max-concurrency 4"
timing='"mean_ttft_ms":[49,150],"median_ttft_ms":[49,150],"mean_itl_ms":[19.5,45],"median_itl_ms":[19,45],
        "mean_tpot_ms":[19.5,45],"mean_e2e_latency_ms":[229,450],"total_input_tokens":[128,128],
        "total_output_tokens":[80,80]'
for b in openai openai-chat kiln; do
  case_ "stream_$b" 0 "{\"num_prompts\":8,\"completed\":8,\"failed\":0,\"source\":\"usage\",\"max_concurrency\":4,
        \"details\":true,\"itl_per_request\":9,\"ranges\":{$timing}}" \
    --base-url "$url" --backend "$b" $gen --output-details
done

# Non-streaming: the first token is the whole response (so TPOT and ITL are 0,
# as in bench_serving).
case_ nostream 0 '{"num_prompts":8,"completed":8,"ranges":{"mean_ttft_ms":[229,450],"mean_e2e_latency_ms":[229,450],
      "mean_itl_ms":[0,0],"mean_tpot_ms":[0,0]}}' \
  --base-url "$url" --backend openai $gen --disable-stream

# No usage from the server: generated tokens come from re-tokenizing.
case_ nousage 0 '{"num_prompts":8,"completed":8,"source":"retokenized"}' --base-url "$url/nousage" --backend openai $gen

# Text with NUL characters (valid JSON; dummy weights generate them) is
# text like any other, streamed or whole.
for b in openai kiln; do
  case_ "nul_$b" 0 '{"num_prompts":8,"completed":8,"failed":0,"source":"usage","total_output_tokens":[80,80]}' \
    --base-url "$url/nul" --backend "$b" $gen --warmup-requests 0
done

# Failures are counted, reported with their message, and never hang.
case_ http_error 1 '{"num_prompts":8,"completed":0,"failed":8,"error":"HTTP 500: fake internal error"}' \
  --base-url "$url/error" --backend openai $gen --warmup-requests 0
case_ flaky 0 '{"num_prompts":8,"completed":4,"failed":4,"error":"HTTP 503"}' \
  --base-url "$url/flaky" --backend openai $gen --warmup-requests 0
case_ malformed 1 '{"num_prompts":8,"failed":8,"error":"malformed stream chunk"}' \
  --base-url "$url/malformed" --backend openai $gen --warmup-requests 0
case_ midfail 1 '{"num_prompts":8,"failed":8,"error":"server error: fake failure mid-stream"}' \
  --base-url "$url/midfail" --backend openai-chat $gen --warmup-requests 0
case_ refused 1 '{"num_prompts":8,"failed":8,"error":"connect"}' \
  --base-url "http://127.0.0.1:1" --backend kiln $gen --warmup-requests 0
start=$(date +%s%N)
case_ hang 1 '{"num_prompts":8,"failed":8,"error":"timed out after 0.5 s"}' \
  --base-url "$url/hang" --backend kiln $gen --warmup-requests 0 --timeout 0.5
ms=$(( ($(date +%s%N) - start) / 1000000 ))
# Two waves of 4 (the cap) x 0.5 s, plus start-up.
if [ $ms -gt 4000 ]; then echo "FAIL: hang case took ${ms} ms"; fail=$((fail + 1)); fi

# A warm-up that fails stops before the run, with the server's message.
runs=$((runs + 1))
if "$kiln" bench serving --base-url "$url/error" --backend openai $gen > "$tmp/w.txt" 2> "$tmp/w.err" ||
   ! grep -q "warmup failed.*HTTP 500" "$tmp/w.err"; then
  echo "FAIL: warmup_error"; cat "$tmp/w.err"; fail=$((fail + 1))
else echo "ok: warmup_error"; fi

# Datasets.
case_ sharegpt 0 '{"num_prompts":4,"completed":4}' --base-url "$url" --backend openai --dataset-name sharegpt \
  --dataset-path "$src/tests/fixtures/bench/sharegpt_small.json" --sharegpt-context-len 200 --num-prompts 10
case_ shared_prefix 0 '{"num_prompts":6,"completed":6,"ranges":{"total_output_tokens":[24,24]}}' \
  --base-url "$url" --backend kiln --dataset-name shared-prefix --gsp-num-groups 2 --gsp-prompts-per-group 3 \
  --gsp-system-prompt-len 40 --gsp-question-len 8 --gsp-output-len 4
case_ score 0 '{"num_prompts":5,"completed":5,"ranges":{"mean_ttft_ms":[49,150],"total_output_tokens":[0,0],
      "total_items":[15,15]},"equal":[["mean_ttft_ms","mean_e2e_latency_ms"]]}' \
  --base-url "$url" --dataset-name score --num-prompts 5 --score-query-len 12 --score-item-len 4 --score-num-items 3

# Poisson arrivals at 10 req/s: 8 requests spread over several hundred ms,
# so the run lasts longer than one wave of all-at-once requests.
case_ rate 0 '{"num_prompts":8,"completed":8,"ranges":{"duration":[0.45,5]}}' \
  --base-url "$url" --backend openai --num-prompts 8 --random-input-len 8 --random-output-len 4 \
  --random-range-ratio 1 --request-rate 10 --seed 3
grep -q '"request_rate":10' "$tmp/rate.jsonl" || { echo "FAIL: rate: request_rate not 10 in JSON"; fail=$((fail + 1)); }

# The same seed gives the same workload.
a=$("$kiln" bench serving --base-url "$url" --num-prompts 5 --random-input-len 30 --random-output-len 3 \
    --random-range-ratio 0.2 --seed 7 --disable-tqdm | grep '^Total input tokens')
b=$("$kiln" bench serving --base-url "$url" --num-prompts 5 --random-input-len 30 --random-output-len 3 \
    --random-range-ratio 0.2 --seed 7 --disable-tqdm | grep '^Total input tokens')
runs=$((runs + 1))
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok: seed"; else echo "FAIL: seed: '$a' vs '$b'"; fail=$((fail + 1)); fi

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
