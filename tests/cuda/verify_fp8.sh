#!/usr/bin/env bash
# kiln verify --device cuda with FP8 (e4m3, block-scaled) weights
# (docs/cuda.md, "FP8 weights", derives the tolerances):
#  - the dense FP8 oracle models (tiny-models-fp8/llama_fp8, qwen3_fp8:
#    32x32 blocks), whose reference is fp32 with the dequantized weights:
#    page sizes 1 and 16, chunks 3 and 64, within KILN_CUDA_TOL_FP8
#    (default 0.4: the bf16 models measure up to 0.19 with one 2^-9
#    rounding per product, the activations'; the FP8 paths add the
#    dequantized weight's, about sqrt(2) times the error, 0.27, and a 1.5x
#    margin; the GEMV keeps fp32); once more with --deterministic (the
#    tile kernel for every product);
#  - --quantization fp8 on the bf16 oracle models (llama, qwen2, qwen3;
#    128x128 blocks) against their bf16 reference: the quantization itself
#    moves these logits (the CPU backend, which computes the same FP8
#    weights exactly in fp32, measures llama 3.46, qwen2 2.25, qwen3 1.55,
#    page sizes 1 and 16 alike); the GPU must be within that plus the 0.4
#    of its roundings, and off by at least 0.1 (the weights really were
#    quantized).
# Fails when no GPU can be opened.
set -u
fail=0; runs=0
verify() {
  "$KILN" verify --device cuda "$@" 2>&1
}
check() { # check TOL [FLOOR] -- args
  local tol=$1 floor=$2 out rc last err
  shift 3
  out=$(verify --tolerance "$tol" "$@")
  rc=$?
  runs=$((runs + 1))
  last=$(printf '%s\n' "$out" | tail -1)
  err=$(printf '%s\n' "$last" | sed -n 's/^max_abs_err=\([0-9.e+-]*\) rows=[1-9][0-9]*$/\1/p')
  if [ $rc -ne 0 ] || [ -z "$err" ] || ! awk -v e="$err" -v f="$floor" 'BEGIN { exit !(e >= f) }'; then
    echo "FAIL: kiln verify --device cuda --tolerance $tol $* (error at least $floor expected)"
    printf '%s\n' "$out"; fail=$((fail + 1))
  else
    echo "ok: $* -> max_abs_err=$err (tolerance $tol)"
  fi
}
probe=$(verify --model "$KILN_FIXTURES/oracle/tiny-models-fp8/llama_fp8" \
  --reference "$KILN_FIXTURES/oracle/tiny-models-fp8/llama_fp8/reference.safetensors" --tolerance 1e9)
if printf '%s' "$probe" | grep -q "no CUDA device\|built without CUDA"; then
  echo "FAIL: this test needs a CUDA GPU (it runs under ctest -L gpu on the GPU machine): $probe"; exit 1
fi
tol=${KILN_CUDA_TOL_FP8:-0.4}
echo "== FP8 checkpoints"
for arch in llama qwen3; do
  dir="$KILN_FIXTURES/oracle/tiny-models-fp8/${arch}_fp8"
  for ps in 1 16; do
    for chunk in 3 64; do
      check "$tol" 0 -- --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
    done
  done
  check "$tol" 0 -- --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk 3 --deterministic
done
echo "== --quantization fp8 on bf16 checkpoints"
for pair in llama:3.46 qwen2:2.25 qwen3:1.55; do
  arch=${pair%%:*}; cpu=${pair#*:}
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  qtol=$(awk -v c="$cpu" -v t="$tol" 'BEGIN { print c + t }')
  for ps in 1 16; do
    check "$qtol" 0.1 -- --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk 3 \
      --quantization fp8
  done
done
# a tolerance that cannot hold must fail: the check compares
if verify --model "$KILN_FIXTURES/oracle/tiny-models-fp8/llama_fp8" \
     --reference "$KILN_FIXTURES/oracle/tiny-models/llama/reference.safetensors" >/dev/null 2>&1; then
  echo "FAIL: the FP8 model passed against the bf16 model's reference"; fail=$((fail + 1))
fi
runs=$((runs + 1))
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
