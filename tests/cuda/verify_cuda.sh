#!/usr/bin/env bash
# kiln verify --device cuda on every oracle model, page sizes 1 and 16,
# chunks 3 and 64, within the bf16 tolerance of docs/cuda.md (override with
# KILN_CUDA_TOL). Skips (exit 0 with a note) when no GPU can be opened.
set -u
tol=${KILN_CUDA_TOL:-5e-2}
fail=0; runs=0
check() {
  local out rc last
  out=$("$KILN" verify --device cuda --tolerance "$tol" "$@" 2>&1)
  rc=$?
  runs=$((runs + 1))
  last=$(printf '%s\n' "$out" | tail -1)
  if [ $rc -ne 0 ] || ! printf '%s' "$last" | grep -Eq '^max_abs_err=[0-9.e+-]+ rows=[1-9][0-9]*$'; then
    echo "FAIL: kiln verify --device cuda $*"; printf '%s\n' "$out"; fail=$((fail + 1))
  else
    echo "ok: $* -> $(printf '%s' "$out" | grep -o 'mode=[a-z]* max_abs_err=[^ ]*' | tr '\n' ' ')"
  fi
}
probe=$("$KILN" verify --device cuda --model "$KILN_FIXTURES/oracle/tiny-models/llama" \
  --reference "$KILN_FIXTURES/oracle/tiny-models/llama/reference.safetensors" --tolerance 1e9 2>&1)
if printf '%s' "$probe" | grep -q "no CUDA device\|built without CUDA"; then
  echo "skipped: $probe"; exit 0
fi
for arch in ${KILN_CUDA_ARCHS:-llama qwen2 qwen3 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3}; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  for ps in 1 16; do
    for chunk in 3 64; do
      check --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
    done
  done
done
check --model "$KILN_MODELS/stories260K" --reference "$KILN_MODELS/stories260K/reference.safetensors" --page-size 64 --chunk 7
echo "$((runs - fail)) passed, $fail failed (tolerance $tol)"
[ $fail -eq 0 ]
