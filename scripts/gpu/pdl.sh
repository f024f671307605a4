#!/usr/bin/env bash
# pdl.sh — programmatic dependent launch for the rope / KV store,
# decode attention, embedding and sampling kernels, in one
# run of the GPU machine: build, the GPU tests (test_cuda_pdl: PDL on vs
# KILN_CUDA_PDL=0 bit for bit; ops, graphs, deterministic, generate), then
# bench_forward batch-1 decode at contexts 128 and 4096 for Qwen3-0.6B and
# Llama-3.1-8B (dummy weights), default against KILN_CUDA_PDL=0 (ordinary
# launches) in alternating order in the same run, and a KILN_CUDA_PROFILE=1
# eager run of Qwen3 b1. Logs go to $OUT; summary.log
# is the short version. On the device machine:
#
#   OUT=$OUT bash scripts/gpu/pdl.sh 230
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pdl-out}
BUDGET=${1:-230}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
say "build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu bench_forward test_cuda_pdl test_cuda_ops test_cuda_graphs \
    test_deterministic kiln >>"$OUT/build.log" 2>&1
brc=$?
[ $brc = 0 ] || { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
say "build ok"
B=build-gpu

say "test_cuda_pdl"
timeout 40 $B/tests/test_cuda_pdl >"$OUT/test_pdl.log" 2>&1
say "test_cuda_pdl rc=$?"
grep -E "differ|non-finite|PASSED|FAILED|fail" "$OUT/test_pdl.log" | tee -a "$S"

bench_show() { grep -E "^decode" | sed 's/ (.*//' | tr '\n' ' '; }
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
A="--prompt-len 128,4096 --decode 64 --repeat 3"
bench "qwen3 b1 pdl" 20 "" --model $Q $A
bench "qwen3 b1 pdl-off" 20 "KILN_CUDA_PDL=0" --model $Q $A
bench "qwen3 b1 pdl (2)" 20 "" --model $Q $A
bench "qwen3 b1 pdl-off (2)" 20 "KILN_CUDA_PDL=0" --model $Q $A
bench "llama b1 pdl" 35 "" --model $L $A
bench "llama b1 pdl-off" 35 "KILN_CUDA_PDL=0" --model $L $A

say "profile"
timeout $(( $(left) < 20 ? $(left) : 20 )) env KILN_CUDA_PROFILE=1 $B/bench_forward --device cuda \
  --load-format dummy --model $Q --prompt-len 128 --decode 32 --repeat 1 --no-graphs >"$OUT/profile.log" 2>&1
say "profile rc=$?"

say "ctest"
lim=$(left); [ "$lim" -gt 5 ] || lim=5
timeout $lim env KILN_TOKENIZERS=/nonexistent ctest --test-dir $B -L '^gpu$' -R 'ops|graphs|deterministic|generate' -V >"$OUT/tests.log" 2>&1
say "ctest rc=$?"
grep -E "tests passed|Test +#|FAIL|Failure|differ" "$OUT/tests.log" | tail -16 | tee -a "$S"
bench "llama b1 pdl (2)" 30 "" --model $L $A
say "done"
