#!/usr/bin/env bash
# fp8.sh — the FP8-weight products (src/backend/cuda/cuda_fp8.cu, fp8_matmul
# in cuda_matmul.cu) in one run on a GPU machine, in priority order, each
# stage under its own time limit: build, test_cuda_fp8 (every product path
# against the CPU, FP8 dummy weights against the host bytes),
# test_wgmma_fp8 (the e4m3 wgmma product),
# test_model_cuda (with its FP8 cases), verify_fp8.sh (the oracle),
# then bench_forward on Llama-3.1-8B with dummy weights, bf16 beside
# --quantization fp8 in the same run (and fp8 with KILN_CUDA_WGMMA_FP8=0,
# the tile kernel and cuBLASLt's block-scaled FP8 instead of the e4m3
# wgmma product): batch-1 and
# 64-sequence decode, prefill 512, 2048 and 8192; gemm: bench_gemm_fp8 (the
# products alone at 512, 2048 and 8192 rows, TFLOP/s beside bf16). Logs go
# to $OUT; summary.log is the short version.
#
#   bash scripts/gpu/fp8.sh [budget-seconds] [stages]
#   stages: a word list of test model verify decode prefill gemm
#   (default: all)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fp8-out}
BUDGET=${1:-550}
STAGES=${2:-"test model verify decode prefill gemm"}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
build kiln bench_forward bench_gemm_fp8 test_cuda_fp8 test_wgmma_fp8 test_model_cuda

run() { # label limit command... (output appended to $OUT/tests.log)
  local label=$1 l=$2; shift 2
  [ "$(left)" -gt 15 ] || { say "skip $label (time)"; return 1; }
  echo "== $label" >>"$OUT/tests.log"
  timeout "$(lim "$l")" "$@" >>"$OUT/tests.log" 2>&1
  local rc=$?
  say "$label rc=$rc"
  return $rc
}
section() { awk -v l="== $1" '$0==l{p=1;next} /^== /{p=0} p' "$OUT/tests.log"; }

if want test; then
  run "test_cuda_fp8" 150 "$B/tests/test_cuda_fp8"
  section test_cuda_fp8 | grep -E "rel err|cuBLASLt|PASSED|FAILED|Failure|differ|NaN" | head -60 | tee -a "$S"
  run "test_wgmma_fp8" 120 "$B/tests/test_wgmma_fp8"
  section test_wgmma_fp8 | grep -E "rel err|rope rows|PASSED|FAILED|Failure|differ|NaN" | head -40 | tee -a "$S"
fi
if want model; then
  run "test_model_cuda" 300 "$B/tests/test_model_cuda"
  section test_model_cuda | grep -E "FP8|PASSED|FAILED|Failure" | tail -12 | tee -a "$S"
fi
if want verify; then
  run "verify_fp8.sh" 150 env KILN="$B/kiln" KILN_SRC="$PWD" KILN_FIXTURES=tests/fixtures bash tests/cuda/verify_fp8.sh
  section verify_fp8.sh | grep -E "^ok|FAIL|passed" | tail -30 | tee -a "$S"
fi
M=models/configs/llama-3.1-8b.json
if want decode; then
  bench "llama8b bf16 b1" 90 "" --model $M --prompt-len 128 --decode 64 --batch 1
  bench "llama8b fp8 b1" 90 "" --model $M --prompt-len 128 --decode 64 --batch 1 --quantization fp8
  bench "llama8b bf16 b64" 120 "" --model $M --prompt-len 128 --decode 32 --batch 64
  bench "llama8b fp8 b64" 120 "" --model $M --prompt-len 128 --decode 32 --batch 64 --quantization fp8
  bench "llama8b fp8 b64 (tile kernel)" 120 "KILN_CUDA_WGMMA_FP8=0" --model $M --prompt-len 128 \
    --decode 32 --batch 64 --quantization fp8
fi
if want prefill; then
  bench "llama8b bf16 prefill" 150 "" --model $M --prompt-len 512,2048,8192 --decode 1 --batch 1
  bench "llama8b fp8 prefill" 150 "" --model $M --prompt-len 512,2048,8192 --decode 1 --batch 1 --quantization fp8
  bench "llama8b fp8 prefill (no e4m3 wgmma)" 150 "KILN_CUDA_WGMMA_FP8=0" --model $M --prompt-len 512,2048,8192 \
    --decode 1 --batch 1 --quantization fp8
fi
if want gemm && [ "$(left)" -gt 30 ]; then
  timeout "$(lim 200)" "$B/bench_gemm_fp8" --n 512,2048,8192 >"$OUT/gemm.log" 2>&1
  say "bench_gemm_fp8 rc=$?"
  grep -E "TFLOP" "$OUT/gemm.log" | tee -a "$S"
fi
say "done"
