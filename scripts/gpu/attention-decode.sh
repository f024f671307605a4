#!/usr/bin/env bash
# attention-decode.sh — one run on a GPU machine for the decode attention
# kernel (src/backend/cuda/cuda_attn_decode.cu), each stage under a time
# guard, most important first: build (kiln targets and the lab in
# parallel); the lab's validation and invariance checks beside the GPU
# tests (test_cuda_ops, test_deterministic, test_cuda_graphs); the lab's
# decode benchmark alone on the GPU; then bench_forward decode with the
# fp32 split-KV kernel (KILN_CUDA_ATTN=split) and the default (auto) on
# Llama-3.1-8B and Qwen3-0.6B shapes (dummy weights). Logs in $OUT,
# summary.log last.
#
#   bash scripts/gpu/attention-decode.sh [budget-seconds]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/attn-out}
BUDGET=${1:-285}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries

say "build"
make -C dev attention >"$OUT/lab_build.log" 2>&1 &
lab_pid=$!
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE="$PKGCONF" >"$OUT/build.log" 2>&1 &&
  ninja -C build-gpu kiln bench_forward test_cuda_ops test_deterministic test_cuda_graphs >>"$OUT/build.log" 2>&1
brc=$?
wait $lab_pid; lrc=$?
[ $lrc = 0 ] || { say "lab build FAILED"; grep -B2 -A10 -m3 error "$OUT/lab_build.log" | head -40 | tee -a "$S"; }
[ $brc = 0 ] || { say "kiln build FAILED"; grep -B2 -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
say "built"

if [ $lrc = 0 ]; then
  timeout 110 dev/build/attention_lab --validate >"$OUT/lab_validate.log" 2>&1 &
  val_pid=$!
fi
say "ctest (3 GPU tests) beside the lab's validation"
(cd build-gpu && KILN_TOKENIZERS=/nonexistent timeout 150 ctest -R 'test_cuda_ops|test_deterministic|test_cuda_graphs' \
  -j3 --output-on-failure -V) >"$OUT/ctest.log" 2>&1
say "ctest rc=$?"
grep -E "tests passed|tests failed|Test +#|FAILED|R alone|deterministic n=|decode invariance|\[  (PASSED|FAILED) \]" "$OUT/ctest.log" | tail -24 | tee -a "$S"
grep -B1 "rel err" "$OUT/ctest.log" | grep -A1 -E "attention H=" | grep "rel err" | sort -k5 -g | tail -3 | tee -a "$S"
if [ $lrc = 0 ]; then
  wait $val_pid; say "lab validate rc=$?"
  grep -E "FAIL|DIFFERENT|bitwise|checks|Assert|assert|error" "$OUT/lab_validate.log" | head -40 | tee -a "$S"
  grep -E "^  (dec32|dec64|auto) " "$OUT/lab_validate.log" | sort -k3 -g | tail -2 | tee -a "$S"
  if [ "$(left)" -gt 150 ]; then
    say "lab bench"
    timeout 70 dev/build/attention_lab --bench >"$OUT/lab_bench.log" 2>&1; say "lab bench rc=$?"
    cat "$OUT/lab_bench.log" | tail -45 >>"$S"
  fi
fi

B=build-gpu/bench_forward
bench() { # label limit args...
  local label=$1 lim=$2; shift 2
  [ "$(left)" -gt 15 ] || { say "skip $label (time)"; return; }
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  echo "== $label" >>"$OUT/bench.log"
  timeout "$lim" "$B" --device cuda --load-format dummy "$@" >>"$OUT/bench.log" 2>&1
  local rc=$?
  say "$label rc=$rc: $(awk '/^== /{p=0} p; $0=="== '"$label"'"{p=1}' "$OUT/bench.log" | grep -E "^decode" | sed -E 's/ \(.*//' | tr '\n' ';')"
}
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
for m in Q L; do
  cfg=${!m}
  for impl in split auto; do
    KILN_CUDA_ATTN=$impl bench "$m b1 $impl" 45 --model $cfg --prompt-len 128,4096 --decode 32 --repeat 2
  done
done
for m in Q L; do
  cfg=${!m}
  for n in 64 256; do
    for impl in split auto; do
      KILN_CUDA_ATTN=$impl bench "$m b$n $impl" 40 --model $cfg --prompt-len 128 --decode 32 --batch $n --repeat 2
    done
  done
done
grep -m1 "device copy" "$OUT/bench.log" | tee -a "$S"
if [ "$(left)" -gt 50 ]; then # the oracle check (decode rows of the dense models on the bf16 cache)
  (cd build-gpu && KILN_TOKENIZERS=/nonexistent timeout $(( $(left) - 5 )) ctest -R cuda_verify_cuda --output-on-failure) >"$OUT/verify.log" 2>&1
  say "verify_cuda rc=$? $(grep -E 'tests passed|tests failed' "$OUT/verify.log")"
fi
say "done"
