#!/usr/bin/env bash
# attention.sh — everything the attention work needs from one run on
# a GPU machine, in priority order, each stage under its own time limit:
# build (kiln + the lab), the attention lab (validation, batch invariance,
# kernel benchmark vs measured limits), ctest -L gpu, then bench_forward
# on Llama-3.1-8B and Qwen3-0.6B shapes (dummy weights): the new kernels,
# the first scalar kernel (KILN_CUDA_ATTN=scalar) and --deterministic.
# Logs go to $OUT (summary.log last).
#
#   [SKIP_BEFORE=1] bash scripts/gpu/attention.sh [budget-seconds]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/attn-out}
BUDGET=${1:-340}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
pc_args=(-DPKG_CONFIG_EXECUTABLE="$PKGCONF")

say "build"
make -C dev attention >"$OUT/lab_build.log" 2>&1 &
lab_pid=$!
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${pc_args[@]}" >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu kiln bench_forward test_cuda_ops test_deterministic >>"$OUT/build.log" 2>&1
brc=$?
wait $lab_pid; lrc=$?
[ $lrc = 0 ] || { say "lab build FAILED"; tail -30 "$OUT/lab_build.log" | tee -a "$S"; }
[ $brc = 0 ] || { say "kiln build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }

if [ $lrc = 0 ]; then
  say "attention lab"
  timeout 100 dev/build/attention_lab >"$OUT/lab.log" 2>&1; say "lab rc=$?"
  grep -E "FAIL|DIFFERENT|bitwise|limits|checks" "$OUT/lab.log" | tee -a "$S"
fi

say "ctest -L gpu"
KILN_TOKENIZERS=/nonexistent timeout 150 ctest --test-dir build-gpu -L '^gpu$' --output-on-failure -V >"$OUT/ctest.log" 2>&1
say "ctest rc=$?"
grep -E "R alone|  attention .*tokens|deterministic n=|FAILED|Test +#|tests passed|FAIL:" "$OUT/ctest.log" | tail -40 | tee -a "$S"

B=build-gpu/bench_forward
bench() { # label limit args...
  local label=$1 lim=$2; shift 2
  [ "$(left)" -gt 20 ] || { say "skip $label (time)"; return; }
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  echo "== $label" >>"$OUT/bench.log"
  timeout "$lim" "$B" --device cuda --load-format dummy "$@" >>"$OUT/bench.log" 2>&1
  say "$label rc=$?"
  awk '/^== /{p=0} p; $0=="== '"$label"'"{p=1}' "$OUT/bench.log" | grep -E "^(prefill|decode)" | tee -a "$S"
}
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
bench "llama new" 70 --model $L --prompt-len 128,512,4096,8192 --decode 32 --repeat 3
bench "qwen3 new" 40 --model $Q --prompt-len 128,512,4096,8192 --decode 32 --repeat 3
[ -n "${SKIP_BEFORE:-}" ] || KILN_CUDA_ATTN=scalar bench "llama scalar(before)" 70 --model $L --prompt-len 128,512,4096,8192 --decode 16 --repeat 1
[ -n "${SKIP_BEFORE:-}" ] || KILN_CUDA_ATTN=scalar bench "qwen3 scalar(before)" 40 --model $Q --prompt-len 128,512,4096,8192 --decode 16 --repeat 1
bench "llama deterministic" 60 --model $L --prompt-len 512,8192 --decode 16 --repeat 2 --deterministic
bench "qwen3 deterministic" 40 --model $Q --prompt-len 512,8192 --decode 16 --repeat 2 --deterministic
say "done"
