#!/usr/bin/env bash
# ncu-wgmma.sh — Nsight Compute on the small-M wgmma product at 64 rows,
# one launch per Llama-3.1-8B shape (bench_gemv --quick drives it), for
# why the split-K shapes stream below the S = 1 one. Logs in $OUT.
#   OUT=$OUT bash scripts/gpu/ncu-wgmma.sh [BUDGET_S]
# SHAPES: "rows cols" lines; SECTIONS: ncu --section names.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ncu-out}
BUDGET=${1:-300}
source scripts/gpu/common.sh
SHAPES=${SHAPES:-"6144 4096
4096 14336
4096 4096"}
SECTIONS=${SECTIONS:-"SpeedOfLight MemoryWorkloadAnalysis WarpStateStats Occupancy LaunchStats SchedulerStats"}
if [ ! -x "$B/bench_gemv" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
    ninja -C "$B" bench_gemv >>"$OUT/build.log" 2>&1 || { say "build FAILED"; exit 1; }
fi
sec=""; for s in $SECTIONS; do sec="$sec --section $s"; done
while read -r r k; do
  [ -n "$r" ] || continue
  [ "$(left)" -gt 40 ] || break
  KILN_CUDA_WGMMA_MIN_MB=0 timeout "$(lim 120)" ncu --clock-control none --kernel-name regex:wgmma_kernel \
    --launch-skip 30 --launch-count 1 $sec "$B/bench_gemv" --device cuda --rows $r --cols $k --n 64 --quick \
    >"$OUT/ncu-$r-$k.txt" 2>&1
  say "ncu $r x $k rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Block Limit|Grid Size|No Eligible|Issued Warp|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth|Stall" "$OUT/ncu-$r-$k.txt" | head -30 | tee -a "$S"
done <<<"$SHAPES"
