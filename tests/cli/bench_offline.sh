#!/usr/bin/env bash
# `kiln bench offline` runs each workload through the engine in-process
# (bundled stories260K model) and reports like the serving client: every
# request completes, counts add up, the output lengths asked for are the
# ones generated (ignore_eos), and the JSON line has every field.
set -u
src="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
kiln="${KILN:-$src/build/kiln}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0; runs=0

case_() {
  local name=$1 expect=$2; shift 2
  runs=$((runs + 1))
  if ! "$kiln" bench offline --threads 1 --disable-tqdm --output-file "$tmp/$name.jsonl" "$@" \
       > "$tmp/$name.txt" 2> "$tmp/$name.err"; then
    echo "FAIL: $name: kiln bench failed"; tail -5 "$tmp/$name.err"; fail=$((fail + 1)); return
  fi
  if node "$src/tests/bench/check_result.mjs" "$tmp/$name.txt" "$tmp/$name.jsonl" "$expect"; then
    echo "ok: $name"
  else
    echo "FAIL: $name"; sed 's/^/  | /' "$tmp/$name.txt"; fail=$((fail + 1))
  fi
}

case_ random '{"num_prompts":6,"completed":6,"failed":0,"source":"usage","max_concurrency":3,"details":true,
      "itl_per_request":7,"ranges":{"total_input_tokens":[144,144],"total_output_tokens":[48,48]}}' \
  --num-prompts 6 --random-input-len 24 --random-output-len 8 --random-range-ratio 1 --max-concurrency 3 \
  --output-details
# With a fixed output length the entry whose completion is empty is kept
# (bench_serving prunes by the output length it will ask for): 5 of 8.
case_ sharegpt '{"num_prompts":5,"completed":5,"failed":0,"ranges":{"total_output_tokens":[30,30]}}' --dataset-name sharegpt \
  --dataset-path "$src/tests/fixtures/bench/sharegpt_small.json" --sharegpt-context-len 200 \
  --sharegpt-output-len 6 --num-prompts 10
case_ shared_prefix '{"num_prompts":6,"completed":6,"ranges":{"total_output_tokens":[24,24]}}' \
  --dataset-name shared-prefix --gsp-num-groups 2 --gsp-prompts-per-group 3 --gsp-system-prompt-len 40 \
  --gsp-question-len 8 --gsp-output-len 4
case_ score '{"num_prompts":4,"completed":4,"ranges":{"total_output_tokens":[0,0],"total_items":[12,12]},
      "equal":[["mean_ttft_ms","mean_e2e_latency_ms"]]}' \
  --dataset-name score --num-prompts 4 --score-query-len 12 --score-item-len 4 --score-num-items 3
case_ rate '{"num_prompts":5,"completed":5}' --num-prompts 5 --random-input-len 8 --random-output-len 4 \
  --request-rate 20 --seed 2
# A prompt longer than the model's context (512) is refused by the engine:
# counted as failed with the engine's message, not dropped.
runs=$((runs + 1))
"$kiln" bench offline --threads 1 --disable-tqdm --warmup-requests 0 --num-prompts 2 --random-input-len 600 \
  --random-output-len 4 --random-range-ratio 1 > "$tmp/long.txt" 2>&1
if [ $? -eq 1 ] && grep -q "^Failed requests: *2" "$tmp/long.txt" && grep -q "engine_submit" "$tmp/long.txt"; then
  echo "ok: too_long"
else
  echo "FAIL: too_long"; sed 's/^/  | /' "$tmp/long.txt"; fail=$((fail + 1))
fi

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
