#!/usr/bin/env bash
# wgmma.sh — the small-M wgmma product (src/backend/cuda/hopper/
# gemm_wgmma.cu) in one run on a GPU machine, in priority order, each
# stage under its own time limit: build, the SASS check (HGMMA / UTMALDG),
# test_matmul_wgmma, bench_gemv --wgmma (cuBLASLt vs the kernel, % of the
# copy bandwidth), Llama-3.1-8B decode at 64 sequences with KILN_CUDA_WGMMA=1
# and =0, ctest -L '^gpu$' -R 'ops|graphs|deterministic', then Llama at 32 and
# Qwen3-0.6B at 64 sequences (dummy weights). Logs go to $OUT; summary.log
# is the short version. On the device machine:
#
#   OUT=$OUT bash scripts/gpu/wgmma.sh 285
# STAGES="test gemv llama64 ctest llama32 qwen64 profile" selects stages
# (default: all but profile; profile: KILN_CUDA_PROFILE=1, eager, per-op
# medians of Llama-3.1-8B's products at 64 rows, the kernel on and off).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/wgmma-out}
BUDGET=${1:-285}
STAGES=${STAGES:-"test gemv llama64 ctest llama32 qwen64"}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
say "build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu bench_forward bench_gemv test_matmul_wgmma test_cuda_ops test_cuda_graphs \
    test_deterministic >>"$OUT/build.log" 2>&1
brc=$?
[ $brc = 0 ] || { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
say "build ok"
B=build-gpu

O=$(find $B -name 'gemm_wgmma.cu.o' | head -1)
if command -v cuobjdump >/dev/null && [ -n "$O" ]; then
  cuobjdump -sass "$O" >"$OUT/sass.txt" 2>&1
  say "SASS $(basename $O): $(grep -cE 'HGMMA' "$OUT/sass.txt") HGMMA, $(grep -cE 'UTMALDG' "$OUT/sass.txt") UTMALDG, $(grep -cE 'HMMA' "$OUT/sass.txt") HMMA; $(grep -m1 -oE 'HGMMA\.[^ ]*' "$OUT/sass.txt")"
else
  say "no cuobjdump or object ($O)"
fi

if want test; then
  say "test_matmul_wgmma"
  timeout 90 $B/tests/test_matmul_wgmma >"$OUT/wgmma_test.log" 2>&1
  say "test_matmul_wgmma rc=$?"
  grep -E "rel err|PASSED|FAILED|fail|Error|error" "$OUT/wgmma_test.log" | awk '{print}' |
    grep -vE "rel err [0-9.]+e-0[5-9]" | tail -14 | tee -a "$S"
  grep -oE "rel err [0-9.e+-]+" "$OUT/wgmma_test.log" | sort -t' ' -k3 -g | tail -1 | sed 's/^/max /' | tee -a "$S"
fi

L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json

if want gemv; then
  say "bench_gemv --wgmma"
  timeout $(( $(left) < 80 ? $(left) : 80 )) $B/bench_gemv --wgmma >"$OUT/gemv.log" 2>&1
  say "bench_gemv rc=$?"
  grep -E "copy bandwidth" "$OUT/gemv.log" | tee -a "$S"
  # one line per shape and n: % of copy for each variant and for the kernel alone
  awk '/ n=/ { key=$1" "$3" "$4; v=$0; sub(/.*n=[0-9]+ +/, "", v); name=v; sub(/ +[0-9.]+ us.*/, "", name);
         pc=$0; sub(/.*GB\/s +/, "", pc); sub(/%.*/, "", pc); row[key]=row[key] sprintf(" %s=%s", name, pc) }
       END { for (k in row) print k row[k] }' "$OUT/gemv.log" | sort -k1,1n -k3 | tee -a "$S" >/dev/null
fi
want llama64 && bench "llama b64 wgmma=1" 45 "KILN_CUDA_WGMMA=1" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
want llama64 && bench "llama b64 wgmma=0" 45 "KILN_CUDA_WGMMA=0" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2

if want ctest && [ "$(left)" -gt 40 ]; then
  say "ctest"
  lim=$(( $(left) - 30 )); [ $lim -gt 120 ] && lim=120
  timeout $lim env KILN_TOKENIZERS=/nonexistent ctest --test-dir $B -L '^gpu$' -R 'ops|graphs|deterministic|wgmma' -V >"$OUT/tests.log" 2>&1
  say "ctest rc=$?"
  grep -E "tests passed|Test +#|FAIL|Failure|NaN" "$OUT/tests.log" | tail -10 | tee -a "$S"
fi
want llama32 && bench "llama b32 wgmma=1" 35 "KILN_CUDA_WGMMA=1" --model $L --prompt-len 128 --decode 32 --batch 32 --repeat 2
want llama32 && bench "llama b32 wgmma=0" 35 "KILN_CUDA_WGMMA=0" --model $L --prompt-len 128 --decode 32 --batch 32 --repeat 2
want qwen64 && bench "qwen3 b64 wgmma=1" 25 "KILN_CUDA_WGMMA=1" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
want qwen64 && bench "qwen3 b64 wgmma=0" 25 "KILN_CUDA_WGMMA=0" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
want qwen64 && bench "qwen3 b64 wgmma=1 all sizes" 25 "KILN_CUDA_WGMMA=1 KILN_CUDA_WGMMA_MIN_MB=0" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
if want profile; then
  for v in 1 0; do
    [ "$(left)" -gt 25 ] || { say "skip profile $v (time)"; continue; }
    KILN_CUDA_WGMMA=$v KILN_CUDA_PROFILE=1 timeout 30 $B/bench_forward --device cuda --load-format dummy \
      --model $L --prompt-len 128 --decode 16 --batch 64 --repeat 1 --no-graphs >"$OUT/profile$v.log" 2>&1
    say "profile wgmma=$v rc=$?"
    grep -E "^  (norm_matmul|matmul|norm_swiglu_mlp) n=64 " "$OUT/profile$v.log" | cut -c1-120 | tee -a "$S"
  done
fi
say "done"
