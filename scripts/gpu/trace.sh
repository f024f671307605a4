#!/usr/bin/env bash
# trace.sh — kernel timelines of decode steps under graphs (CUPTI,
# scripts/gpu/cupti_trace.c) in one run: build kiln's bench_forward, build
# the tracer against the machine's CUPTI, run each case untraced and traced,
# and summarise the traces (scripts/gpu/trace_summary.py). Logs in $OUT.
#
#   OUT=$OUT bash scripts/gpu/trace.sh [BUDGET_S]
# CASES: "name|ENV=V ...|bench_forward args" lines (default: Llama-3.1-8B
# and Qwen3-0.6B at 64 sequences, context 128 + 32 steps).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/trace-out}
BUDGET=${1:-300}
source scripts/gpu/common.sh
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
CASES=${CASES:-"llama64||--model $L --prompt-len 128 --decode 32 --batch 64
qwen64||--model $Q --prompt-len 128 --decode 32 --batch 64"}

say "build"
if [ ! -x "$B/bench_forward" ] || [ -n "${REBUILD-1}" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
    ninja -C "$B" bench_forward ${TARGETS:-} >>"$OUT/build.log" 2>&1 ||
    { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
fi
say "build ok"

H=$(find /usr/local/cuda* /opt /usr -name cupti.h -path '*include*' 2>/dev/null | head -1)
HD=$(dirname "$H")
LIB=$(find /usr/local/cuda* /opt /usr -name 'libcupti.so*' 2>/dev/null | head -1)
CI=$(dirname "$(command -v nvcc)")/../include
rec() { grep -ohE "CUpti_Activity$1[0-9]+" "$HD"/cupti_activity*.h | sort -V | tail -1; }
say "cupti: $H $LIB $(rec Kernel) $(rec Memcpy) $(rec Memset)"
gcc -O2 -shared -fPIC -I"$HD" -I"$CI" -DKERNEL_REC=$(rec Kernel) -DMEMCPY_REC=$(rec Memcpy) \
  -DMEMSET_REC=$(rec Memset) scripts/gpu/cupti_trace.c -o "$OUT/libtrace.so" "$LIB" \
  -Wl,-rpath,"$(dirname "$LIB")" >"$OUT/tracer.log" 2>&1 || { say "tracer build FAILED"; head -30 "$OUT/tracer.log" | tee -a "$S"; exit 1; }

while IFS='|' read -r name envs args; do
  [ -n "$name" ] || continue
  bench "$name" 120 "$envs" $args
  [ "$(left)" -gt 30 ] || { say "skip trace $name (time)"; continue; }
  env $envs CUDA_INJECTION64_PATH="$OUT/libtrace.so" KILN_TRACE_OUT="/tmp/$name.csv" \
    timeout "$(lim 150)" "$B/bench_forward" --device cuda --load-format dummy $args >"$OUT/$name.traced.log" 2>&1
  say "$name traced rc=$?: $(grep -E '^decode' "$OUT/$name.traced.log" | tr '\n' ' ')"
  python3 scripts/gpu/trace_summary.py "/tmp/$name.csv" ${SUMMARY_ARGS:-} >"$OUT/$name.summary.txt" 2>&1
  head -40 "$OUT/$name.summary.txt" | tee -a "$S"
done <<<"$CASES"
say "done"
