#!/usr/bin/env bash
# prefill-attention.sh — the wgmma prefill attention (src/backend/cuda/hopper/
# attn_prefill.cu) in one run on a GPU machine, in priority order, each
# stage under its own time limit: build; test_attn_prefill (every kernel
# against the CPU, bitwise default-vs-fa3 / batch-invariance checks); the
# SASS of the kernel (HGMMA count); bench_attention (one layer at
# Llama-3.1-8B's shape, 512 / 4096 / 8192 tokens, fa2 vs fa3, beside a
# cuBLAS bf16 product); bench_forward prefill 512 and 8192 on Llama-3.1-8B and Qwen3-0.6B
# (dummy weights) with KILN_CUDA_FA=fa2 and the default; then ctest -L gpu
# -R 'ops|graphs|deterministic|verify'. Logs go to $OUT; summary.log is the
# short version. STAGES (default "test sass attn fwd ctest") picks stages.
#
#   OUT=$OUT bash scripts/gpu/prefill-attention.sh 285
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fa3-out}
BUDGET=${1:-285}
STAGES=${STAGES:-test sass attn fwd ctest}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
say "build"
targets="bench_attention test_attn_prefill bench_forward"
want ctest && targets="$targets kiln test_cuda_ops test_cuda_graphs test_deterministic"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu $targets >>"$OUT/build.log" 2>&1
brc=$?
[ $brc = 0 ] || { say "build FAILED"; grep -B2 -A12 -m3 error "$OUT/build.log" | head -60 | tee -a "$S"; exit 1; }
grep -E "C75[0-9][0-9]" "$OUT/build.log" | head -5 | tee -a "$S"
say "build ok"
B=build-gpu

if want test; then
  say "test_attn_prefill"
  timeout "$(lim 90)" $B/tests/test_attn_prefill >"$OUT/test_attn_prefill.log" 2>&1
  say "test_attn_prefill rc=$?"
  grep -E "H=|rel err|same bits|differs|FAIL|PASSED|NaN|relative error|not run" "$OUT/test_attn_prefill.log" | head -60 | tee -a "$S"
fi
if want sass; then
  o=$(find $B -name 'attn_prefill.cu.o' | head -1)
  cuobjdump -sass "$o" >"$OUT/attn_prefill.sass" 2>&1
  say "SASS: $(grep -c HGMMA "$OUT/attn_prefill.sass") HGMMA, $(grep -cE 'LDL|STL' "$OUT/attn_prefill.sass") LDL/STL, $(grep -c 'HMMA' "$OUT/attn_prefill.sass") HMMA"
fi
if want attn; then
  say "bench_attention"
  timeout "$(lim 60)" $B/bench_attention >"$OUT/bench_attention.log" 2>&1
  say "bench_attention rc=$?"
  cat "$OUT/bench_attention.log" | tee -a "$S"
fi
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
if want fwd; then
  bench "llama default" 45 "KILN_CUDA_FA=auto" --model $L --prompt-len 512,8192 --decode 0
  bench "llama fa2" 45 "KILN_CUDA_FA=fa2" --model $L --prompt-len 512,8192 --decode 0
  bench "qwen3 default" 30 "KILN_CUDA_FA=auto" --model $Q --prompt-len 512,8192 --decode 0
  bench "qwen3 fa2" 30 "KILN_CUDA_FA=fa2" --model $Q --prompt-len 512,8192 --decode 0
fi
if want ctest; then
  say "ctest"
  timeout "$(lim 150)" env KILN_TOKENIZERS=/nonexistent ctest --test-dir $B -L '^gpu$' -R 'ops|graphs|deterministic|verify' -V >"$OUT/ctest.log" 2>&1
  say "ctest rc=$?"
  grep -E "tests passed|Test +#|FAIL|Failure|relative error|NaN|differ" "$OUT/ctest.log" | tail -15 | tee -a "$S"
fi
say "done"
