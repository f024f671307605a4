# shellcheck shell=bash disable=SC2154
# tests/cuda/lib/moe_counts.sh — sourced by the GPU tests that compare MoE
# routing counts between the CPU and CUDA (bench_moe_counts.sh,
# bench_fp8_moe.sh, bench_gpt_oss.sh). Needs $bf (bench_forward) and $tmp
# (a scratch folder); counts into runs and fail.
#
#   moe_counts LABEL [EXTRA_RE] -- bench_forward args...
# runs bench_forward with the args on the CPU and on CUDA (environment as
# the caller set it) and fails the case unless CUDA exits 0 and every MoE
# count line (experts touched per layer, expert bytes) is the same on both;
# with EXTRA_RE, CUDA's output must also have a line matching it. A machine
# without a GPU fails the whole test at once.
moe_counts() {
  local label=$1 extra=""
  shift
  if [ "$1" != "--" ]; then extra=$1; shift; fi
  shift
  "$bf" "$@" --device cpu --threads 2 >"$tmp/cpu.txt" 2>&1
  "$bf" "$@" --device cuda >"$tmp/gpu.txt" 2>&1
  local rc=$? c g
  runs=$((runs + 1))
  if grep -q "no CUDA device\|built without CUDA" "$tmp/gpu.txt"; then
    echo "FAIL: this test needs a CUDA GPU (ctest -L gpu on the GPU machine)"; cat "$tmp/gpu.txt"; exit 1
  fi
  c=$(grep -E '^(MoE layer|expert bytes)' "$tmp/cpu.txt"); g=$(grep -E '^(MoE layer|expert bytes)' "$tmp/gpu.txt")
  if [ $rc -ne 0 ] || [ -z "$c" ] || [ "$c" != "$g" ] || { [ -n "$extra" ] && ! grep -qE "$extra" "$tmp/gpu.txt"; }; then
    echo "FAIL: $label (rc $rc)"; echo "  cpu:"; sed 's/^/  | /' "$tmp/cpu.txt"
    echo "  cuda:"; sed 's/^/  | /' "$tmp/gpu.txt"
    fail=$((fail + 1))
  else
    echo "ok: $label: the CPU's and CUDA's counts agree"; grep -E '^MoE layer [01]:|^decode bound' "$tmp/gpu.txt" | head -3
  fi
}
