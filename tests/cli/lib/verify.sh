# tests/cli/lib/verify.sh — what the `kiln verify` test scripts share
# (sourced, after `set -u`; tests/cli/verify_oracle.sh on the CPU, the
# tests/cuda/verify_*.sh scripts with VERIFY_DEVICE=cuda): one verify run
# and its max_abs_err, the checks, the oracle models' grid of page sizes
# and chunks, the pass/fail count, and the checks that the GPUs a script
# needs are there. $KILN and $KILN_FIXTURES come from ctest.
fail=0; runs=0

# kiln_verify ARGS...: `kiln verify [--device $VERIFY_DEVICE] ARGS` (at
# most 300 s); its output in $out, its last line's max_abs_err in $err
# (empty when the run failed or printed no such line). Status 0 when $err
# was read.
kiln_verify() {
  out=$(timeout 300 "$KILN" verify ${VERIFY_DEVICE:+--device "$VERIFY_DEVICE"} "$@" 2>&1)
  local rc=$?
  err=$(printf '%s\n' "$out" | tail -1 | sed -n 's/^max_abs_err=\([0-9.e+-]*\) rows=[1-9][0-9]*$/\1/p')
  [ $rc -eq 0 ] && [ -n "$err" ]
}

# verify_fail WHAT: one more failure, named, with the end of $out
verify_fail() {
  echo "FAIL: $1"; printf '%s\n' "$out" | tail -30; fail=$((fail + 1))
}

# check ARGS...: one verify within $tol (default 1e-3)
check() {
  runs=$((runs + 1))
  if kiln_verify --tolerance "${tol:-1e-3}" "$@"; then
    echo "ok: $* -> $(printf '%s' "$out" | grep -o 'mode=[a-z0-9]* max_abs_err=[^ ]*' | tr '\n' ' ')"
  else
    verify_fail "kiln verify --tolerance ${tol:-1e-3} $*"
  fi
}

# check_floor TOL FLOOR ARGS...: one verify within TOL whose error is at
# least FLOOR (what the run changes must show: an FP8 cache, quantized
# weights)
check_floor() {
  local t=$1 floor=$2; shift 2
  runs=$((runs + 1))
  if kiln_verify --tolerance "$t" "$@" && awk -v e="$err" -v f="$floor" 'BEGIN { exit !(e >= f) }'; then
    echo "ok: $* -> max_abs_err=$err (tolerance $t, at least $floor)"
  else
    verify_fail "kiln verify --tolerance $t $* (an error of at least $floor expected; got '${err}')"
  fi
}

# check_fails WHAT ARGS...: a verify that must fail (a reference that is
# not the model's: the comparison really compares)
check_fails() {
  local what=$1; shift
  runs=$((runs + 1))
  if kiln_verify "$@"; then
    echo "FAIL: $what passed"; fail=$((fail + 1))
  else
    echo "ok: $what fails"
  fi
}

# verify_grid SET ARCH...: check on oracle/SET/ARCH for each ARCH at page
# sizes 1 and 16, chunks 3 and 64
verify_grid() {
  local set=$1 arch dir ps chunk; shift
  for arch in "$@"; do
    dir="$KILN_FIXTURES/oracle/$set/$arch"
    for ps in 1 16; do
      for chunk in 3 64; do
        check --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
      done
    done
  done
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
