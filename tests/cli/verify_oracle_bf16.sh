#!/usr/bin/env bash
# kiln verify with KILN_CPU_MATMUL=bf16 (products of bf16 weights with
# activations rounded to bf16; docs/cpu-matmul.md says why these checks):
#  - the dense oracle models (llama, qwen2, qwen3), page sizes 1 and 16,
#    chunks 3 and 64: within 0.25 absolute of the Hugging Face fp32 logits
#    (up to ~8), the bound the GPU's bf16 products are held to, and more
#    than 1e-2 away from them (the mode really rounds: the f32 mode is
#    within 3e-5);
#  - every model, MoE included: each sequence as one prefill, token by
#    token, and mixed into chunked batches gives the same error (the rows'
#    bits do not depend on the batch; MLA models with each form forced);
#  - the MoE models with --routing-check (an fp32 CPU runner beside: every
#    expert choice the same, or flipped at a near tie that the mode's own
#    router logits explain) within 0.25 on the rows before any flip, and
#    the router logits within 0.25; across them at least one flip, so the
#    near-tie path is exercised;
#  - stories260K has fp32 weights, which the mode leaves alone: 1e-3.
set -u
export KILN_CPU_MATMUL=bf16
fail=0; runs=0; flips=0
# check TOL MIN_ERR ARGS...: verify passes at TOL, its error is at least
# MIN_ERR, and the three modes report the same error.
check() {
  local tol=$1 min=$2 out rc last errs
  shift 2
  out=$("$KILN" verify --tolerance "$tol" "$@" 2>&1)
  rc=$?
  runs=$((runs + 1))
  last=$(printf '%s\n' "$out" | tail -1)
  errs=$(printf '%s\n' "$out" | sed -n 's/^mode=[a-z]* max_abs_err=\([^ ]*\) .*/\1/p' | sort -u)
  if [ $rc -ne 0 ] || ! printf '%s' "$last" | grep -Eq '^max_abs_err=[0-9.e+-]+ rows=[1-9][0-9]*$'; then
    echo "FAIL: kiln verify --tolerance $tol $*"; printf '%s\n' "$out"; fail=$((fail + 1))
  elif [ "$(printf '%s\n' "$errs" | wc -l)" -ne 1 ] || [ "$(printf '%s\n' "$out" | grep -c '^mode=')" -ne 3 ]; then
    echo "FAIL: the modes disagree (batch invariance): kiln verify $*"; printf '%s\n' "$out"; fail=$((fail + 1))
  elif ! awk -v e="${last#max_abs_err=}" -v m="$min" 'BEGIN { split(e, a, " "); exit !(a[1] + 0 >= m + 0) }'; then
    echo "FAIL: error below $min, is the bf16 mode on? kiln verify $*"; printf '%s\n' "$out"; fail=$((fail + 1))
  else
    echo "ok: $* -> $last"
    flips=$((flips + $(printf '%s\n' "$out" | sed -n 's/^routing .* flips=\([0-9]*\) .*/\1/p' | awk '{s += $1} END {print s + 0}')))
  fi
}
for arch in llama qwen2 qwen3; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  for ps in 1 16; do
    for chunk in 3 64; do
      check 0.25 1e-2 --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
    done
  done
done
for arch in qwen2_moe qwen3_moe; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  check 0.25 1e-2 --routing-check --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk 3
done
# MLA picks its form per sequence from its new tokens (a prompt takes the
# MHA form, a decode row the absorbed one), and the two forms round
# differently: the modes agree with either form forced on every row
for arch in deepseek_v2 deepseek_v3; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  for form in absorbed mha; do
    KILN_MLA_FORM=$form check 0.25 1e-2 --routing-check --model "$dir" --reference "$dir/reference.safetensors" \
      --page-size 16 --chunk 3
  done
done
check 1e-3 0 --model "$KILN_MODELS/stories260K" --reference "$KILN_MODELS/stories260K/reference.safetensors" --page-size 64 --chunk 7
if [ "$flips" -eq 0 ]; then
  echo "FAIL: no MoE run flipped an expert choice: the routing check's near-tie path went unexercised"
  fail=$((fail + 1))
else
  echo "ok: $flips expert choices flipped at near ties across the MoE runs, each explained by the router logits"
fi
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
