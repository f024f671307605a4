#!/usr/bin/env bash
# `kiln serve --device cuda` loads the checkpoint while it warms up
# (weight_upload_later: the copies run on a loader thread during the KV
# pool sizing and the warm-up; weights_finish waits before the first
# request). With the loader slowed down (KILN_CUDA_UPLOAD_DELAY_MS, a test
# hook) the copies outlast the warm-up, so the log must show a wait after
# it, and greedy /generate answers must be the ids the CPU backend prints
# for the same prompts (stories260K, fp32 products and cache with
# KILN_CUDA_KV=f32: logits within 3e-5 of the CPU's, as in
# generate_cuda.sh). Were the wait missing, the first requests would run
# on zeroed weights and their ids would differ. A second server drafts
# tokens (--speculative-algorithm NGRAM: drafted rows run as prefill rows
# with the logits of every position) and must give the same ids.
set -u
SERVE_NODE=0 source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/knob_line.sh"
M="$KILN_MODELS/stories260K"
probe=$("$KILN" generate --device cuda --model "$M" --ids 1 --max-tokens 1 2>&1)
if printf '%s' "$probe" | grep -q "no CUDA device\|built without CUDA"; then
  echo "FAIL: this test needs a CUDA GPU (it runs under ctest -L gpu on the GPU machine): $probe"; exit 1
fi
export KILN_CUDA_KV=f32
KILN_CUDA_UPLOAD_DELAY_MS=150 serve_start A --model "$M" --device cuda
log_line=$(grep "start-up:" "$LOG_A")
echo "$log_line"
waited=$(printf '%s' "$log_line" | sed -n 's/.*; \([0-9.]*\) s waited after the warm-up.*/\1/p')
if [ -z "$waited" ] || ! awk -v w="$waited" 'BEGIN { exit !(w > 0.05) }'; then
  echo "FAIL: the weights' copies did not outlast the warm-up (waited '${waited}' s): the test cannot see a missing wait"
  exit 1
fi
serve_start B --model "$M" --device cuda --speculative-algorithm NGRAM --speculative-num-draft-tokens 4
fail=0; runs=0
for url in "$URL_A" "$URL_B"; do
for ids in 1 1,403,407,261 1,9,27,300,41 1,320,218,99,5,11,70 1,2,3; do
  cpu=$("$KILN" generate --model "$M" --ids "$ids" --max-tokens 48 --ignore-eos --device cpu 2>&1 | grep -v " INFO\] " | head -1)
  gpu=$(python3 - "$url" "$ids" <<'PY'
import json, sys, urllib.request
url, ids = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}}
req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=60))
print(",".join(str(i) for i in out["output_ids"]))
PY
)
  runs=$((runs + 1))
  n=$(echo "$gpu" | tr ',' '\n' | wc -l)
  if [ -z "$gpu" ] || [ "$gpu" != "$cpu" ]; then
    echo "FAIL: --ids $ids"; echo "  cpu:   $cpu"; echo "  serve: $gpu"; fail=$((fail + 1))
  else
    echo "ok: --ids $ids: $n served ids equal the CPU's ($url)"
  fi
done
done
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
