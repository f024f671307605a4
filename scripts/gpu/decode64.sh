#!/usr/bin/env bash
# decode64.sh — the 64-sequence decode step (Llama-3.1-8B, Qwen3-0.6B) in
# one run: build, the kernel tests that the step's changes touch, decode
# benchmarks of each knob against the default in alternating order, a
# CUPTI trace of the default (scripts/gpu/trace.sh), then `ctest -L gpu` if the
# budget allows. Logs in $OUT (summary.log is the short version).
#
#   OUT=$OUT bash scripts/gpu/decode64.sh [BUDGET_S]
# VARIANTS: "label|ENV=V ..." lines benchmarked beside the default.
# STAGES: any of "tests bench trace ctest" (default: all).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode64-out}
BUDGET=${1:-500}
STAGES=${STAGES:-"tests bench trace ctest"}
source scripts/gpu/common.sh
bench_show() {
  grep -E "^decode" | sed -E 's/.*batch ([0-9]+) at context ([0-9]+): ([0-9.]+) tok\/s \(([0-9.]+) ms\/step.*/b\1 ctx\2: \3 tok\/s \4 ms;/' | tr '\n' ' '
}
L=models/configs/llama-3.1-8b.json Q=models/configs/qwen3-0.6b.json
VARIANTS=${VARIANTS:-"default|
norope|KILN_CUDA_WGMMA_ROPE=0
noglu|KILN_CUDA_WGMMA_GLU=0
W4|KILN_CUDA_AD_W=4"}
# Qwen3-0.6B at 64 and both models at batch 1 (contexts 128 and 4096)
QVARIANTS=${QVARIANTS-"default|
nowgmma|KILN_CUDA_WGMMA=0"}
B1VARIANTS=${B1VARIANTS-"default|
W2|KILN_CUDA_AD_W=2"}
# test runs: "ENV=V ...|test" lines
TESTS=${TESTS:-"|test_matmul_wgmma
|test_cuda_ops
|test_cuda_pdl
|test_deterministic
KILN_CUDA_AD_W=2|test_cuda_ops
KILN_CUDA_AD_W=2|test_deterministic
KILN_CUDA_AD_W=2|test_cuda_pdl"}
TRACE_ENV=${TRACE_ENV:-}

build

if want tests; then
  while IFS='|' read -r envs t; do
    [ -n "$t" ] || continue
    [ "$(left)" -gt 60 ] || break
    log="$OUT/$t${envs:+-alt}.log"
    (cd "$B/tests" && env $envs KILN_FIXTURES=$PWD/../../tests/fixtures timeout "$(lim 120)" ./$t) >"$log" 2>&1
    say "$t [$envs] rc=$? $(grep -E 'PASSED|FAILED' "$log" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Error|error:|fail' "$log" | head -5 | tee -a "$S"
  done <<<"$TESTS"
  grep -E '^  (glu|mlp)' "$OUT/test_matmul_wgmma.log" | tee -a "$S"
fi

if want bench; then
  for round in 1 2; do
    while IFS='|' read -r label envs; do
      [ -n "$label" ] || continue
      bench "L64 $label r$round" 90 "$envs" --model $L --prompt-len 128 --decode 32 --batch 64 --repeat 2
    done <<<"$VARIANTS"
  done
  while IFS='|' read -r label envs; do
    [ -n "$label" ] || continue
    bench "Q64 $label" 60 "$envs" --model $Q --prompt-len 128 --decode 32 --batch 64 --repeat 2
  done <<<"$QVARIANTS"
  while IFS='|' read -r label envs; do
    [ -n "$label" ] || continue
    bench "L1 $label" 60 "$envs" --model $L --prompt-len 128,4096 --decode 64 --repeat 2
    bench "Q1 $label" 60 "$envs" --model $Q --prompt-len 128,4096 --decode 64 --repeat 2
  done <<<"$B1VARIANTS"
fi

if want trace && [ "$(left)" -gt 90 ]; then
  # TRACE_CASES: scripts/gpu/trace.sh CASES lines ("name|ENV|bench_forward args")
  CASES=${TRACE_CASES:-"llama64|$TRACE_ENV|--model $L --prompt-len 128 --decode 32 --batch 64 --repeat 1"} \
    OUT=$OUT/trace REBUILD= B=$B bash scripts/gpu/trace.sh "$(( $(left) - 30 ))" >/dev/null 2>&1
  for f in "$OUT"/trace/*.summary.txt; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .summary.txt)
    cp "$f" "$OUT/trace-$n.txt"
    say "trace $n"; head -24 "$f" | tee -a "$S"
  done
fi

want ctest && ctest_gpu 14
say "done"
