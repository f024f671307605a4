#!/usr/bin/env bash
# products.sh — the product-path work (PDL, GEMV K split, fused norm /
# SwiGLU handoffs, cuBLASLt) in one run on a GPU machine, in priority
# order, each stage under its own time limit: build, the op / graph /
# deterministic tests, a short verify, bench_gemv (all variants), then
# bench_forward on Qwen3-0.6B and Llama-3.1-8B (dummy weights), each
# measured with the new path (defaults) and the old one in the same run:
#   old = KILN_CUDA_PDL=0 KILN_CUDA_FUSE=0 KILN_CUDA_GEMV_KS=1 KILN_CUDA_LT=0
# plus a KILN_CUDA_PROFILE=1 run (per-operation device time of a Llama
# prefill of 512 and 16 eager decode steps). Logs go to $OUT; summary.log
# is the short version.
#
#   bash scripts/gpu/products.sh [budget-seconds] [stages]
#   stages: a word list of test verify ctest gemv llama qwen llama-b64 profile
#   (default: all but verify, which ctest covers)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mmpath-out}
BUDGET=${1:-280}
STAGES=${2:-"test ctest gemv llama qwen llama-b64 profile"}
OLD="KILN_CUDA_PDL=0 KILN_CUDA_FUSE=0 KILN_CUDA_GEMV_KS=1 KILN_CUDA_LT=0"
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
pc_args=(-DPKG_CONFIG_EXECUTABLE="$PKGCONF")

say "build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${pc_args[@]}" >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu kiln bench_forward bench_gemv test_cuda_ops test_cuda_graphs \
    test_deterministic >>"$OUT/build.log" 2>&1
brc=$?
[ $brc = 0 ] || { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
say "build ok"
B=build-gpu

run() { # label limit command... (output appended to $OUT/tests.log)
  local label=$1 lim=$2; shift 2
  [ "$(left)" -gt 15 ] || { say "skip $label (time)"; return 1; }
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  echo "== $label" >>"$OUT/tests.log"
  timeout "$lim" "$@" >>"$OUT/tests.log" 2>&1
  local rc=$?
  say "$label rc=$rc"
  return $rc
}

if want test; then
  run "test_cuda_ops" 100 $B/tests/test_cuda_ops
  awk '/^== test_cuda_ops/{p=1} /^== /&&!/test_cuda_ops/{p=0} p' "$OUT/tests.log" |
    grep -E "PASSED|FAILED|Failure|relative error|differ|NaN|chain|ERROR" | head -30 | tee -a "$S"
  run "test_cuda_graphs" 60 $B/tests/test_cuda_graphs
  grep -E "N=(3|8|13) step 4|FAILED|PASSED" "$OUT/tests.log" | tail -8 | tee -a "$S"
  run "test_deterministic" 60 $B/tests/test_deterministic
  grep -E "differ|FAILED|PASSED" "$OUT/tests.log" | tail -4 | tee -a "$S"
fi

if want ctest; then
  run "ctest -L gpu" 120 env KILN_TOKENIZERS=/nonexistent ctest --test-dir $B -L '^gpu$' --output-on-failure
  grep -E "tests passed|Test +#|FAIL" "$OUT/tests.log" | tail -8 | tee -a "$S"
fi

if want verify; then
  F=tests/fixtures/oracle/tiny-models
  for a in llama qwen2 qwen3; do
    run "verify $a" 20 $B/kiln verify --device cuda --model $F/$a --reference $F/$a/reference.safetensors --page-size 16 --chunk 3 --tolerance 0.25
  done
  run "verify qwen2 bf16x2" 20 env KILN_CUDA_MATMUL=bf16x2 $B/kiln verify --device cuda --model $F/qwen2 --reference $F/qwen2/reference.safetensors --page-size 1 --chunk 64 --tolerance 1e-3
  grep -E "^max_abs_err|FAIL|error" "$OUT/tests.log" | tail -8 | tee -a "$S"
fi

if want gemv; then
  say "bench_gemv"
  timeout $(( $(left) < 75 ? $(left) : 75 )) $B/bench_gemv >"$OUT/gemv.log" 2>&1
  say "bench_gemv rc=$?"
  grep -E "copy bandwidth|n=1 over" "$OUT/gemv.log" | tee -a "$S"
fi

bench_show() { # the ms per step, not the per-sequence rate
  grep -E "^(prefill|decode)" | sed -E 's/\(([0-9.]+ ms)[^)]*\)/(\1)/; s/, [0-9.]+ tok\/s per sequence//' | tr '\n' ' '
}
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
if want llama; then
  bench "llama b1 new" 40 "" --model $L --prompt-len 128 --decode 32 --repeat 2
  bench "llama b1 old" 40 "$OLD" --model $L --prompt-len 128 --decode 32 --repeat 2
  bench "llama pp new" 45 "" --model $L --prompt-len 512,8192 --decode 0 --repeat 3
  bench "llama pp old" 45 "$OLD" --model $L --prompt-len 512,8192 --decode 0 --repeat 3
fi
if want qwen; then
  bench "qwen3 b1 new" 25 "" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 b1 old" 25 "$OLD" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 b1 pdl=0" 25 "KILN_CUDA_PDL=0" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 b1 fuse=0" 25 "KILN_CUDA_FUSE=0" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 b1 ks=1" 25 "KILN_CUDA_GEMV_KS=1" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 b1 ks=4" 25 "KILN_CUDA_GEMV_KS=4" --model $Q --prompt-len 128 --decode 64 --repeat 2
  bench "qwen3 pp new" 30 "" --model $Q --prompt-len 512,8192 --decode 0 --repeat 3
  bench "qwen3 pp old" 30 "$OLD" --model $Q --prompt-len 512,8192 --decode 0 --repeat 3
  bench "qwen3 b64 new" 30 "" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
  bench "qwen3 b64 old" 30 "$OLD" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
fi
if want llama-b64; then
  bench "llama b64 new" 50 "" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
  bench "llama b64 old" 50 "$OLD" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
fi
if want profile; then
  prof() { # label env args... : KILN_CUDA_PROFILE=1 run, its table into the summary
    local label=$1 envs=$2; shift 2
    bench "$label" 45 "KILN_CUDA_PROFILE=1 $envs" "$@"
    awk -v l="== $label [KILN_CUDA_PROFILE=1 $envs]" '$0==l{p=1;next} /^== /{p=0} p' "$OUT/bench.log" |
      grep -A24 "cuda profile" | tee -a "$S"
  }
  prof "qwen3 profile b1" "" --model $Q --prompt-len 128 --decode 64 --no-graphs --repeat 2
  prof "llama profile pp512+b1" "" --model $L --prompt-len 512 --decode 16 --no-graphs --repeat 3
  prof "llama profile b64" "" --model $L --prompt-len 128 --decode 8 --batch 64 --no-graphs --repeat 1
fi
say "done"
