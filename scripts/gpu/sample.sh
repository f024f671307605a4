#!/usr/bin/env bash
# One run on a GPU machine for the device sampler (docs/cuda-decode.md,
# "Sampling on the GPU"): build, the gpu tests that touch sampling, then
# bench_sample and bench_forward (device sampling against --logits in the
# same process). Logs under $OUT. Stage: 1 = tests + quick benches,
# 2 = tests + the full bench set.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}
STAGE=${1:-1}
eval "$(scripts/gpu-check.sh --env 2>/dev/null | grep '^export')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPKG_CONFIG_EXECUTABLE="$PKGCONF" >"$O/cmake.log" 2>&1 || { tail -20 "$O/cmake.log"; exit 1; }
ninja -C build-gpu kiln test_cuda_sample test_cuda_graphs test_deterministic test_cuda_ops bench_forward \
  bench_sample >"$O/build.log" 2>&1 \
  || { grep -B2 -A12 -m3 error "$O/build.log" | head -50; exit 1; }
echo "build ok ($(( $(date +%s) - t0 )) s)"
export KILN_FIXTURES=$PWD/tests/fixtures KILN_MODELS=$PWD/models KILN=$PWD/build-gpu/kiln
timeout 150 build-gpu/tests/test_cuda_sample >"$O/test_cuda_sample.log" 2>&1
echo "test_cuda_sample rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E '^\s+(greedy|adjustments|kept sets|draw|batch|engine)|UNEXPLAINED|accepted|FAILED|PASSED|ERROR|differ|Failure' "$O/test_cuda_sample.log" | head -60
grep -E 'model .* step 3' "$O/test_cuda_sample.log" | head -12
timeout 100 bash tests/cuda/generate_cuda.sh >"$O/generate.log" 2>&1
echo "generate_cuda rc=$?"; tail -7 "$O/generate.log"
timeout 60 build-gpu/tests/test_cuda_graphs >"$O/graphs.log" 2>&1
echo "test_cuda_graphs rc=$? $(grep -E 'PASSED|FAILED' "$O/graphs.log" | tr '\n' ' ')"
echo "== bench_sample ($(( $(date +%s) - t0 )) s)"
timeout 60 build-gpu/bench_sample --iters 20 >"$O/bench_sample.log" 2>&1; echo "rc=$?"
cat "$O/bench_sample.log"
BF="build-gpu/bench_forward --load-format dummy --device cuda --prompt-len 128 --both"
run_bf() {
  local tag=$1; shift
  out=$(timeout 120 "$@" 2>&1); echo "$out" >>"$O/bench_forward.log"
  echo "-- $tag: $(echo "$out" | grep -E '^(decode|bench_forward)' | sed 's/ (.* GB\/step)//' | tr '\n' ' ')"
}
echo "== bench_forward ($(( $(date +%s) - t0 )) s)"
run_bf "qwen3 b1" $BF --model models/configs/qwen3-0.6b.json --decode 64 --repeat 3 --batch 1
run_bf "qwen3 b64" $BF --model models/configs/qwen3-0.6b.json --decode 32 --repeat 3 --batch 64
run_bf "qwen3 b1 KILN_GRAPH_SAMPLE=0" env KILN_GRAPH_SAMPLE=0 $BF --model models/configs/qwen3-0.6b.json --decode 64 --repeat 3 --batch 1
run_bf "qwen3 b64 KILN_GRAPH_SAMPLE=0" env KILN_GRAPH_SAMPLE=0 $BF --model models/configs/qwen3-0.6b.json --decode 32 --repeat 3 --batch 64
if [ "$STAGE" = 2 ]; then
  run_bf "qwen3 b256" $BF --model models/configs/qwen3-0.6b.json --decode 32 --repeat 2 --batch 256
  run_bf "llama b1" $BF --model models/configs/llama-3.1-8b.json --decode 32 --repeat 2 --batch 1
  run_bf "llama b64" $BF --model models/configs/llama-3.1-8b.json --decode 32 --repeat 2 --batch 64
  echo "== kiln bench offline, Qwen3-0.6B dummy, 256 prompts 256 -> 64, greedy ($(( $(date +%s) - t0 )) s)"
  for gs in 1 0; do
    out=$(KILN_GPU_SAMPLE=$gs timeout 90 build-gpu/kiln bench offline --device cuda \
      --model models/configs/qwen3-0.6b.json --tokenizer tok-qwen3 --load-format dummy \
      --dataset-name random --num-prompts 256 --random-input-len 256 --random-output-len 64 \
      --random-range-ratio 1 --disable-tqdm 2>&1)
    echo "$out" >>"$O/offline.log"
    echo "-- KILN_GPU_SAMPLE=$gs: $(echo "$out" | grep -E 'Successful|Output token throughput|Mean TPOT|Benchmark duration|warm-up' | tr -s ' ' | tr '\n' ';')"
  done
  echo "== test_deterministic, test_cuda_ops ($(( $(date +%s) - t0 )) s)"
  (cd build-gpu/tests && timeout 60 ./test_deterministic >"$O/det.log" 2>&1; echo "test_deterministic rc=$?")
  timeout 60 build-gpu/tests/test_cuda_ops >"$O/ops.log" 2>&1; echo "test_cuda_ops rc=$? $(grep -E 'PASSED|FAILED' "$O/ops.log" | tr '\n' ' ')"
  KILN_TOKENIZERS=/nonexistent timeout 100 ctest --test-dir build-gpu -R cuda_verify_cuda --output-on-failure -V >"$O/verify.log" 2>&1
  echo "verify_cuda rc=$? $(grep -E 'passed, ' "$O/verify.log" | tail -1)"
fi
echo "done ($(( $(date +%s) - t0 )) s)"
