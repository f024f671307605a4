#!/usr/bin/env bash
# moe.sh — MoE on the GPU in one run: build, the MoE and model
# tests, then decode benchmarks of the MoE configs (KILN_CUDA_MOE=device, the default,
# the device path with graphs, against the default host sort and cuBLAS per
# expert without graphs),
# a dense check (Llama-3.1-8B at 64 sequences), and `ctest -L gpu` if the
# budget allows. Logs in $OUT (summary.log is the short version).
#
#   OUT=$OUT bash scripts/gpu/moe.sh [BUDGET_S]
# STAGES: any of "tests bench ctest" (default: all). BENCH: "label|ENV=V ...|args" lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/moe-out}
BUDGET=${1:-560}
STAGES=${STAGES:-"tests bench ctest"}
source scripts/gpu/common.sh
Q30=models/configs/qwen3-30b-a3b.json DS=models/configs/deepseek-v2-lite.json L=models/configs/llama-3.1-8b.json
TESTS=${TESTS:-"test_cuda_moe test_model_cuda test_cuda_graphs"}
D=KILN_CUDA_MOE=device
BENCH=${BENCH:-"q30 b1|$D|--model $Q30 --prompt-len 128 --decode 32 --repeat 2
q30 b1 host||--model $Q30 --prompt-len 128 --decode 32 --repeat 2
q30 b64|$D|--model $Q30 --prompt-len 128 --decode 32 --batch 64 --repeat 2
q30 b64 host||--model $Q30 --prompt-len 128 --decode 32 --batch 64 --repeat 2
q30 b256|$D|--model $Q30 --prompt-len 128 --decode 16 --batch 256 --repeat 2
ds b1|$D|--model $DS --prompt-len 128 --decode 32 --repeat 2
ds b64|$D|--model $DS --prompt-len 128 --decode 32 --batch 64 --repeat 2
ds b64 host||--model $DS --prompt-len 128 --decode 32 --batch 64 --repeat 2
llama b64||--model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2"}

build

if want tests; then
  for t in $TESTS; do
    [ "$(left)" -gt 60 ] || break
    (cd "$B/tests" && KILN_FIXTURES=$PWD/../../tests/fixtures timeout "$(lim 150)" ./$t) >"$OUT/$t.log" 2>&1
    say "$t rc=$? $(grep -E 'PASSED|FAILED' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E '^  [a-z].*(path|range|differ)|^\[  FAILED|rel err|error|Error' "$OUT/$t.log" | head -40 | tee -a "$S"
  done
fi

if want bench; then
  while IFS='|' read -r label envs args; do
    [ -n "$label" ] || continue
    bench "$label" 150 "$envs" $args
  done <<<"$BENCH"
  grep -E '^device copy' "$OUT/bench.log" | head -2 | tee -a "$S"
fi

want ctest && ctest_gpu 16
say "done"
