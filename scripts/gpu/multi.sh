#!/usr/bin/env bash
# multi.sh — several GPUs of one machine in one run (docs/perf.md "GPU:
# several GPUs"): build, `ctest -L gpu_multi`, then `kiln bench offline`
# with dummy weights, each layout beside the same model on one GPU in the
# same run (tensor parallel also with NCCL alone: KILN_CUDA_ONE_SHOT=0),
# `--nnodes 2` on this host over sockets, and `kiln serve --tp 2` under
# `kiln bench serving`. Needs two
# GPUs (four for the gpu_four tests, run when present); NCCL's NVLink
# multicast stays off (NCCL_NVLS_ENABLE=0). Logs in $OUT (summary.log is
# the short version).
#
#   OUT=$OUT bash scripts/gpu/multi.sh [BUDGET_S]
# STAGES: any of "tests bench nodes serve" (default: all). CASES: "label|ENV=V ...|
# kiln bench offline args" lines (default below).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/multi-out}
BUDGET=${1:-560}
STAGES=${STAGES:-"tests bench nodes serve"}
source scripts/gpu/common.sh
export NCCL_NVLS_ENABLE=0
build kiln test_cuda_nccl

# model folders: a config from models/configs/ and a tokenizer from the
# fetched cache (scripts/fetch-tokenizers.sh; random prompts, so any
# tokenizer whose ids fit the vocabulary serves)
model_dir() { # model_dir NAME CONFIG TOKENIZER
  local d=/tmp/kiln-multi-$1
  mkdir -p "$d" && cp "models/configs/$2.json" "$d/config.json" && cp .cache/tokenizers/"$3"/* "$d/"
  echo "$d"
}
LL=$(model_dir llama llama-3.1-8b llama3)
QW=$(model_dir qwen qwen3-30b-a3b qwen3)
DS=$(model_dir ds deepseek-v2-lite llama2)
n_gpu=$(nvidia-smi -L | grep -c '^GPU')
say "GPUs: $n_gpu"

if want tests; then
  say "ctest -L gpu_multi"
  KILN_TOKENIZERS=/nonexistent timeout "$(lim 330)" ctest --test-dir "$B" -L '^gpu_multi$' --timeout 320 \
    --output-on-failure >"$OUT/ctest-multi.log" 2>&1
  say "ctest rc=$?"
  grep -E 'tests passed|tests failed|Test +#' "$OUT/ctest-multi.log" | tail -6 | tee -a "$S"
  if [ "$n_gpu" -ge 4 ]; then
    timeout "$(lim 200)" ctest --test-dir "$B" -L '^gpu_four$' --timeout 190 --output-on-failure \
      >"$OUT/ctest-four.log" 2>&1
    say "ctest gpu_four rc=$?"
  fi
fi

R="--dataset-name random --random-range-ratio 1"
B1="$R --random-input-len 128 --random-output-len 256 --num-prompts 4 --max-concurrency 1"
Q1="$R --random-input-len 128 --random-output-len 128 --num-prompts 4 --max-concurrency 1"
B64="$R --random-input-len 128 --random-output-len 128 --num-prompts 128 --max-concurrency 64"
B256="$R --random-input-len 128 --random-output-len 128 --num-prompts 256 --max-concurrency 256"
C64="$R --random-input-len 4096 --random-output-len 128 --num-prompts 64 --max-concurrency 64"
C256="$R --random-input-len 4096 --random-output-len 128 --num-prompts 256 --max-concurrency 256"
P8K="$R --random-input-len 8192 --random-output-len 1 --num-prompts 8 --max-concurrency 1"
U="--dummy-routing uniform"
N="KILN_CUDA_ONE_SHOT=0"
CASES=${CASES:-"llama b1 one||--model $LL $B1
llama b1 tp2||--model $LL $B1 --tp 2
llama b1 tp2 nccl|$N|--model $LL $B1 --tp 2
llama b64 one||--model $LL $B64
llama b64 tp2||--model $LL $B64 --tp 2
llama b64 tp2 nccl|$N|--model $LL $B64 --tp 2
llama prefill 8192 one||--model $LL $P8K
llama prefill 8192 tp2||--model $LL $P8K --tp 2
qwen b1 one||--model $QW $U $Q1
qwen b1 tp2||--model $QW $U $Q1 --tp 2
qwen b1 tp2 ep2||--model $QW $U $Q1 --tp 2 --ep 2
qwen b64 one||--model $QW $U $B64
qwen b64 tp2||--model $QW $U $B64 --tp 2
qwen b64 tp2 ep2||--model $QW $U $B64 --tp 2 --ep 2
qwen b256 one||--model $QW $U $B256
qwen b256 tp2||--model $QW $U $B256 --tp 2
qwen b256 tp2 ep2||--model $QW $U $B256 --tp 2 --ep 2
ds c64 one||--model $DS $U $C64
ds c64 tp2 ep2||--model $DS $U $C64 --tp 2 --ep 2
ds c64 dp2 ep2||--model $DS $U $C64 --tp 2 --ep 2 --dp 2 --enable-dp-attention
ds c256 one||--model $DS $U $C256
ds c256 tp2 ep2||--model $DS $U $C256 --tp 2 --ep 2
ds c256 dp2 ep2||--model $DS $U $C256 --tp 2 --ep 2 --dp 2 --enable-dp-attention"}

if want bench; then
  while IFS='|' read -r label envs args; do
    [ -n "$label" ] || continue
    [ "$(left)" -gt 60 ] || { say "skip $label (time)"; continue; }
    echo "== $label [$envs]" >>"$OUT/bench.log"
    # shellcheck disable=SC2086
    env $envs timeout "$(lim 150)" "$B/kiln" bench offline --device cuda --load-format dummy $args \
      >>"$OUT/bench.log" 2>&1
    rc=$?
    say "$label rc=$rc: $(awk -v l="== $label [$envs]" '$0==l{p=1;next} /^== /{p=0} p' "$OUT/bench.log" |
      grep -E 'Output token throughput|Mean TPOT|Mean TTFT|KV cache' | tr -s ' ' | tr '\n' ' ')"
  done <<<"$CASES"
fi

# two nodes on this host, NCCL held to sockets (and the one-shot kernel
# off, as between machines): one process a node, each on its own GPU
if want nodes && [ "$(left)" -gt 90 ]; then
  for i in 1 0; do
    env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $N CUDA_VISIBLE_DEVICES=$i timeout "$(lim 120)" "$B/kiln" bench offline \
      --device cuda --load-format dummy --model "$LL" $B1 --tp 2 --nnodes 2 --node-rank $i \
      --dist-init-addr 127.0.0.1:29555 >"$OUT/node$i.log" 2>&1 &
  done
  wait
  say "--nnodes 2 over sockets: $(grep -E 'Output token throughput|Mean TPOT' "$OUT/node0.log" | tr -s ' ' | tr '\n' ' ')"
fi

if want serve && [ "$(left)" -gt 120 ]; then
  "$B/kiln" serve "$LL" --load-format dummy --device cuda --tp 2 --port 30123 >"$OUT/serve.log" 2>&1 &
  pid=$! t=0
  while ! grep -q listening "$OUT/serve.log"; do
    sleep 2; t=$((t + 2)); [ $t -gt 240 ] && break; kill -0 $pid 2>/dev/null || break
  done
  say "serve --tp 2 up after ${t}s"
  timeout "$(lim 300)" "$B/kiln" bench serving --base-url http://127.0.0.1:30123 --backend kiln \
    --tokenizer "$LL" $R --random-input-len 1024 --random-output-len 256 --num-prompts 1000 \
    >"$OUT/bench-serving.log" 2>&1
  say "bench serving rc=$?"
  grep -E 'Successful|duration|Output token throughput|Total token|Mean TTFT|Mean TPOT' "$OUT/bench-serving.log" |
    tee -a "$S"
  kill -INT $pid; sleep 5; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
fi
say "done"
