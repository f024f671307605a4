#!/usr/bin/env bash
# moe.sh — MoE on the GPU in one run: build, the MoE and model tests, then
# decode and prefill benchmarks of the MoE configs with uniform routing,
# each optimization of docs/perf-models.md's "on and off" table beside the default
# in the same run (the device path against the host sort and cuBLAS per
# expert, shared-expert fusion, the shared experts on a second stream, the
# MHA form of MLA prefill), and `ctest -L gpu` if the budget allows. Logs
# in $OUT (summary.log is the short version).
#
#   OUT=$OUT bash scripts/gpu/moe.sh [BUDGET_S]
# STAGES: any of "tests bench ctest" (default: all). BENCH: "label|ENV=V ...|args" lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/moe-out}
BUDGET=${1:-560}
STAGES=${STAGES:-"tests bench ctest"}
source scripts/gpu/common.sh
Q30=models/configs/qwen3-30b-a3b.json DS=models/configs/deepseek-v2-lite.json
TESTS=${TESTS:-"test_cuda_moe test_model_cuda test_cuda_graphs"}
U="--dummy-routing uniform"
F0=KILN_SHARED_EXPERTS_FUSION=0
BENCH=${BENCH:-"ds b1|| --model $DS --prompt-len 128 --decode 32 $U
ds b1 unfused, two streams|$F0| --model $DS --prompt-len 128 --decode 32 $U
ds b1 unfused, one stream|$F0 KILN_CUDA_DUAL_STREAM=0| --model $DS --prompt-len 128 --decode 32 $U
ds b64|| --model $DS --prompt-len 128 --decode 32 --batch 64 $U
ds b64 unfused, two streams|$F0| --model $DS --prompt-len 128 --decode 32 --batch 64 $U
ds b64 unfused, one stream|$F0 KILN_CUDA_DUAL_STREAM=0| --model $DS --prompt-len 128 --decode 32 --batch 64 $U
ds b64 host|KILN_CUDA_MOE=host| --model $DS --prompt-len 128 --decode 32 --batch 64 $U
q30 b1|| --model $Q30 --prompt-len 128 --decode 32 $U
q30 b1 host|KILN_CUDA_MOE=host| --model $Q30 --prompt-len 128 --decode 32 $U
q30 b64|| --model $Q30 --prompt-len 128 --decode 32 --batch 64 $U
q30 b64 host|KILN_CUDA_MOE=host| --model $Q30 --prompt-len 128 --decode 32 --batch 64 $U
ds prefill|| --model $DS --prompt-len 512,8192 --decode 1 $U
ds prefill absorbed|KILN_MLA_FORM=absorbed| --model $DS --prompt-len 512,8192 --decode 1 $U"}

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
