#!/usr/bin/env bash
# `kiln bench serving` against `kiln serve` (bundled stories260K model, on
# loopback): every dataset and backend completes with no failures, the
# server's usage counts are used, and the report and JSON line pass
# tests/bench/check_result.mjs.
set -u
src="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
kiln="${KILN:-$src/build/kiln}"
model="${KILN_MODELS:-$src/models}/stories260K"
tmp=$(mktemp -d)
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
# stories260K has no chat template; a plain one lets the chat route run.
"$kiln" serve --model "$model" --host 127.0.0.1 --port "$port" --threads 1 \
  --chat-template "$src/tests/fixtures/bench/plain_chat_template.jinja" > "$tmp/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$tmp"' EXIT
url="http://127.0.0.1:$port"
up=0
for _ in $(seq 100); do
  if node -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' "$url/v1/models"; then
    up=1; break
  fi
  kill -0 $server 2>/dev/null || break
  sleep 0.2
done
[ $up = 1 ] || { echo "FAIL: kiln serve did not come up"; tail -20 "$tmp/serve.log"; exit 1; }
fail=0; runs=0

case_() {
  local name=$1 expect=$2; shift 2
  runs=$((runs + 1))
  if ! "$kiln" bench serving --base-url "$url" --disable-tqdm --output-file "$tmp/$name.jsonl" "$@" \
       > "$tmp/$name.txt" 2> "$tmp/$name.err"; then
    echo "FAIL: $name: kiln bench failed"; tail -5 "$tmp/$name.err"; sed 's/^/  | /' "$tmp/$name.txt" | tail -8
    fail=$((fail + 1)); return
  fi
  if node "$src/tests/bench/check_result.mjs" "$tmp/$name.txt" "$tmp/$name.jsonl" "$expect"; then
    echo "ok: $name"
  else
    echo "FAIL: $name"; sed 's/^/  | /' "$tmp/$name.txt"; fail=$((fail + 1))
  fi
}

gen="--num-prompts 6 --random-input-len 24 --random-output-len 8 --random-range-ratio 1 --max-concurrency 3"
# The server counts exactly the prompt tokens the client built (6 x 24) and
# generates exactly the tokens asked for (6 x 8, ignore_eos).
for b in openai kiln; do
  case_ "random_$b" '{"num_prompts":6,"completed":6,"failed":0,"max_concurrency":3,"source":"usage",
        "ranges":{"total_input_tokens":[144,144],"total_input_tokens_server":[144,144],
        "total_output_tokens":[48,48],"mean_ttft_ms":[0.01,60000]}}' --backend "$b" $gen
done
case_ random_chat '{"num_prompts":6,"completed":6,"failed":0,"source":"usage","ranges":{"total_output_tokens":[48,48]}}' \
  --backend openai-chat $gen
case_ nostream '{"num_prompts":6,"completed":6,"failed":0}' --backend openai $gen --disable-stream
case_ sharegpt '{"num_prompts":4,"completed":4,"failed":0}' --backend openai --dataset-name sharegpt \
  --dataset-path "$src/tests/fixtures/bench/sharegpt_small.json" --sharegpt-context-len 200 --num-prompts 10
case_ shared_prefix '{"num_prompts":6,"completed":6,"failed":0,"ranges":{"total_output_tokens":[24,24]}}' \
  --backend kiln --dataset-name shared-prefix --gsp-num-groups 2 --gsp-prompts-per-group 3 \
  --gsp-system-prompt-len 40 --gsp-question-len 8 --gsp-output-len 4
case_ score '{"num_prompts":4,"completed":4,"failed":0,"ranges":{"total_items":[12,12]}}' \
  --dataset-name score --num-prompts 4 --score-query-len 12 --score-item-len 4 --score-num-items 3
case_ rate '{"num_prompts":6,"completed":6,"failed":0}' --backend openai $gen --request-rate 20

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
