# tests/cuda/lib/verify.sh — what the `kiln verify --device cuda` test
# scripts share (sourced, after `set -u`): one verify run and its
# max_abs_err, the pass/fail count, and the checks that the GPUs a script
# needs are there. $KILN and $KILN_FIXTURES come from ctest.
fail=0; runs=0

# cuda_verify ARGS...: `kiln verify --device cuda ARGS` (at most 300 s);
# its output in $out, its last line's max_abs_err in $err (empty when the
# run failed or printed no such line). Status 0 when $err was read.
cuda_verify() {
  out=$(timeout 300 "$KILN" verify --device cuda "$@" 2>&1)
  local rc=$?
  err=$(printf '%s\n' "$out" | tail -1 | sed -n 's/^max_abs_err=\([0-9.e+-]*\) rows=[1-9][0-9]*$/\1/p')
  [ $rc -eq 0 ] && [ -n "$err" ]
}

# verify_fail WHAT: one more failure, named, with the end of $out
verify_fail() {
  echo "FAIL: $1"; printf '%s\n' "$out" | tail -30; fail=$((fail + 1))
}

# check ARGS...: one verify within $tol
check() {
  runs=$((runs + 1))
  if cuda_verify --tolerance "$tol" "$@"; then
    echo "ok: $* -> $(printf '%s' "$out" | grep -o 'mode=[a-z0-9]* max_abs_err=[^ ]*' | tr '\n' ' ')"
  else
    verify_fail "kiln verify --device cuda --tolerance $tol $*"
  fi
}

# check_floor TOL FLOOR ARGS...: one verify within TOL whose error is at
# least FLOOR (what the run changes must show: an FP8 cache, quantized
# weights)
check_floor() {
  local t=$1 floor=$2; shift 2
  runs=$((runs + 1))
  if cuda_verify --tolerance "$t" "$@" && awk -v e="$err" -v f="$floor" 'BEGIN { exit !(e >= f) }'; then
    echo "ok: $* -> max_abs_err=$err (tolerance $t, at least $floor)"
  else
    verify_fail "kiln verify --device cuda --tolerance $t $* (an error of at least $floor expected; got '${err}')"
  fi
}

# need_gpu: the test fails, saying so, where no CUDA GPU can be opened
need_gpu() {
  local probe
  probe=$("$KILN" verify --device cuda --model "$KILN_FIXTURES/oracle/tiny-models/llama" \
    --reference "$KILN_FIXTURES/oracle/tiny-models/llama/reference.safetensors" --tolerance 1e9 2>&1)
  if printf '%s' "$probe" | grep -q "no CUDA device\|built without CUDA"; then
    echo "FAIL: this test needs a CUDA GPU (it runs under ctest -L gpu on the GPU machine): $probe"
    exit 1
  fi
}

# need_gpus N: the same where fewer than N GPUs are there
need_gpus() {
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "${n:-0}" -lt "$1" ]; then
    echo "FAIL: this test needs $1 or more GPUs (found ${n:-0}): run it on such a machine (ctest -L gpu_multi, gpu_four)"
    exit 1
  fi
}

# verify_done: the count; the script's status
verify_done() {
  echo "$((runs - fail)) passed, $fail failed"
  [ $fail -eq 0 ]
}
