#!/usr/bin/env bash
# gpu_session.sh — the small-M tensor-core product (cuda_gemm_small.cu) in
# one lease of the GPU machine, in priority order, each stage under its own
# time limit: build, ctest -L gpu -R 'ops|graphs|deterministic' (with
# KILN_CUDA_SMALLM=1, so the graph and fused-op tests run it too), Llama-3.1-8B
# decode at 64 sequences with KILN_CUDA_SMALLM=1 and =0, bench_gemv --smallm,
# then Qwen3-0.6B at 64 and both models at 32 sequences (dummy weights).
# Logs go to $OUT; summary.log is the short version. On the device machine:
#
#   cd tmp/smallm && OUT=$OUT bash dev/smallm/gpu_session.sh 285
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/smallm-out}
BUDGET=${1:-285}
source dev/session.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
say "build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu bench_forward bench_gemv test_cuda_ops test_cuda_graphs \
    test_deterministic >>"$OUT/build.log" 2>&1
brc=$?
[ $brc = 0 ] || { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
say "build ok"
B=build-gpu

say "ctest"
timeout 110 env KILN_CUDA_SMALLM=1 KILN_TOKENIZERS=/nonexistent ctest --test-dir $B -L gpu -R 'ops|graphs|deterministic' -V >"$OUT/tests.log" 2>&1
say "ctest rc=$?"
grep -E "smallm|tests passed|Test +#|FAIL|Failure|relative error|NaN|differ" "$OUT/tests.log" | grep -v "^ *[0-9]*: *matmul.*smallm" | tail -12 | tee -a "$S"
grep -cE "matmul .*smallm" "$OUT/tests.log" | sed 's/^/smallm matmul cases run: /' | tee -a "$S"

L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
bench "llama b64 smallm=1" 40 "KILN_CUDA_SMALLM=1" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
bench "llama b64 smallm=0" 40 "KILN_CUDA_SMALLM=0" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
say "bench_gemv"
timeout $(( $(left) < 70 ? $(left) : 70 )) $B/bench_gemv --smallm >"$OUT/gemv.log" 2>&1
say "bench_gemv rc=$?"
grep -E "copy bandwidth|n=(8|16|32|64) " "$OUT/gemv.log" | tee -a "$S" >/dev/null
bench "qwen3 b64 smallm=1" 25 "KILN_CUDA_SMALLM=1" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
bench "qwen3 b64 smallm=0" 25 "KILN_CUDA_SMALLM=0" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
bench "llama b32 smallm=1" 35 "KILN_CUDA_SMALLM=1" --model $L --prompt-len 128 --decode 32 --batch 32 --repeat 2
bench "llama b32 smallm=0" 35 "KILN_CUDA_SMALLM=0" --model $L --prompt-len 128 --decode 32 --batch 32 --repeat 2
bench "qwen3 b32 smallm=1" 25 "KILN_CUDA_SMALLM=1" --model $Q --prompt-len 128 --decode 32 --batch 32 --repeat 2
bench "qwen3 b32 smallm=0" 25 "KILN_CUDA_SMALLM=0" --model $Q --prompt-len 128 --decode 32 --batch 32 --repeat 2
say "done"
