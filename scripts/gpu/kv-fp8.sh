#!/usr/bin/env bash
# kv-fp8.sh — the decode attention on the FP8 KV cache
# (src/backend/cuda/cuda_attn_decode.cu) in one run on a GPU machine, each
# stage under its own time limit: build; test_attn_features (every
# attention path on the bf16 and FP8 caches against the CPU, windows,
# sinks, batch invariance), test_cuda_ops and test_deterministic; then
# bench_forward on Llama-3.1-8B with dummy weights, the bf16 cache beside
# --kv-cache-dtype fp8_e4m3 in the same run: 64 sequences at context
# 4096, 1 and 8 sequences at 32,768 (16 at 32,768: the FP8 cache only,
# the bf16 one does not fit an 80 GB GPU); ncu: Nsight Compute on one
# decode attention launch of each cache at 8 × 8192 (throughput, stalls).
# Logs go to $OUT; summary.log is the short version.
#
#   bash scripts/gpu/kv-fp8.sh [budget-seconds] [stages]
#   stages: a word list of test bench ncu (default: test bench)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kvfp8-out}
BUDGET=${1:-550}
STAGES=${2:-"test bench"}
source scripts/gpu/common.sh # summary.log, left/say/want/lim/bench, the GPU, the libraries
build kiln bench_forward test_attn_features test_cuda_ops test_deterministic

if want test; then
  say "ctest (3 GPU tests)"
  (cd "$B" && KILN_TOKENIZERS=/nonexistent timeout "$(lim 200)" ctest -R 'test_attn_features|test_cuda_ops|test_deterministic' \
    -j3 --output-on-failure -V) >"$OUT/ctest.log" 2>&1
  say "ctest rc=$?"
  grep -E "tests passed|tests failed|\[  FAILED|Failure" "$OUT/ctest.log" | head -12 | tee -a "$S"
  # the worst decode rows on the FP8 cache (the decode kernel: [auto])
  grep -E "(decode|many).* fp8 .*\[auto\]" "$OUT/ctest.log" | awk '{for(i=1;i<=NF;i++) if($i=="row") print $(i+1), $0}' |
    sort -g | tail -3 | tee -a "$S"
fi
M=models/configs/llama-3.1-8b.json
if want ncu; then
  for kv in ${NCU_KV:-auto fp8_e4m3}; do
    [ "$(left)" -gt 60 ] || break
    timeout "$(lim 120)" ncu --clock-control none --kernel-name regex:ad_kernel --launch-skip 200 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats "$B/bench_forward" --device cuda --load-format dummy --model $M --prompt-len 8192 \
      --decode 16 --batch 8 --kv-cache-dtype $kv --repeat 1 >"$OUT/ncu-$kv.txt" 2>&1
    say "ncu $kv rc=$?"
    grep -E "ad_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Block Limit|Grid Size|No Eligible|Issued Warp|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth|Stall|stall" \
      "$OUT/ncu-$kv.txt" | head -40 | tee -a "$S"
  done
fi
if want bench; then
  bench "bf16 kv 64x4096" 120 "" --model $M --prompt-len 4096 --decode 32 --batch 64
  bench "fp8 kv 64x4096" 120 "" --model $M --prompt-len 4096 --decode 32 --batch 64 --kv-cache-dtype fp8_e4m3
  bench "bf16 kv 1x32768" 90 "" --model $M --prompt-len 32768 --decode 32 --batch 1
  bench "fp8 kv 1x32768" 90 "" --model $M --prompt-len 32768 --decode 32 --batch 1 --kv-cache-dtype fp8_e4m3
  bench "bf16 kv 8x32768" 120 "" --model $M --prompt-len 32768 --decode 32 --batch 8
  bench "fp8 kv 8x32768" 120 "" --model $M --prompt-len 32768 --decode 32 --batch 8 --kv-cache-dtype fp8_e4m3
  bench "fp8 kv 16x32768" 150 "" --model $M --prompt-len 32768 --decode 32 --batch 16 --kv-cache-dtype fp8_e4m3
fi
say "done"
