#!/usr/bin/env bash
# kiln verify on every oracle model (page sizes 1 and 16, chunks 3 and 64;
# tiny-models-more: sliding-window model types, gpt_oss's attention sinks
# and clamped-SwiGLU experts)
# (deepseek_v2 and deepseek_v3 also with MLA's absorbed and MHA forms
# forced), on the FP8 oracle models (float8_e4m3fn projections with 32x32
# block scales, the DeepSeek-V3 / Qwen3-FP8 format: the CPU dequantizes
# exactly and multiplies in fp32, as the reference does) and on the bundled
# stories260K model; every row must be within 1e-3 of the Hugging Face
# fp32 logits; with an FP8 KV cache, within a tolerance derived below.
set -u
source "$KILN_SRC/tests/cli/lib/verify.sh"
tol=1e-3
verify_grid tiny-models llama qwen2 qwen3 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3
# model types whose prompts run past their sliding window (8 positions)
verify_grid tiny-models-more mistral gemma3 gpt_oss
# gpt_oss with MXFP4 experts (scripts/oracle/make_mxfp4_gpt_oss.py made
# it; its reference comes from the dequantized weights); it must fail
# against the bf16 model's reference (its blocks were read: 4-bit experts
# move these logits far past 1e-3)
verify_grid tiny-models-more gpt_oss_mxfp4
check_fails "the MXFP4 gpt_oss against the bf16 model's reference" \
  --model "$KILN_FIXTURES/oracle/tiny-models-more/gpt_oss_mxfp4" \
  --reference "$KILN_FIXTURES/oracle/tiny-models-more/gpt_oss/reference.safetensors"
# MLA: each form forced on every sequence (KILN_MLA_FORM; auto above)
for form in absorbed mha; do
  for arch in deepseek_v2 deepseek_v3; do
    dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
    for ps in 1 16; do
      for chunk in 3 64; do
        KILN_MLA_FORM=$form check --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
      done
    done
  done
done
verify_grid tiny-models-fp8 llama_fp8 qwen3_fp8 qwen3_moe_fp8 deepseek_v3_fp8
for form in absorbed mha; do
  dir="$KILN_FIXTURES/oracle/tiny-models-fp8/deepseek_v3_fp8"
  KILN_MLA_FORM=$form check --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk 3
done
# FP8 KV cache (--kv-cache-dtype fp8_e4m3, scales 1: these checkpoints have
# none). e4m3 keeps 3 mantissa bits, so every cached K/V element moves by
# up to 2^-4 of itself; through the layers of these random tiny models
# that moved the logits by (measured, the same for page sizes 1/16, chunks
# 3/64 and both MLA forms) llama 1.95, qwen2 1.77, qwen3 0.963,
# deepseek_v2 2.73, deepseek_v3 4.03 (FP8 weights moved them 1-6 alike).
# Tolerance 6: the largest (4.03) with a 1.5x margin. And the error must be
# at least 0.1: 5000x the fp32 cache's 2e-5 and 10x under the smallest
# measured, so a cache that stayed fp32 (the option ignored) fails.
check_fp8() { check_floor 6 0.1 --kv-cache-dtype fp8_e4m3 "$@"; }
for arch in llama qwen2 qwen3 deepseek_v2 deepseek_v3; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  for ps in 1 16; do
    check_fp8 --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk 3
  done
done
# the sliding-window models (measured: mistral 1.57, gemma3 0.371, gpt_oss 4.34)
for arch in mistral gemma3 gpt_oss; do
  dir="$KILN_FIXTURES/oracle/tiny-models-more/$arch"
  for ps in 1 16; do
    check_fp8 --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk 3
  done
done
for form in absorbed mha; do
  for arch in deepseek_v2 deepseek_v3; do
    dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
    KILN_MLA_FORM=$form check_fp8 --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk 64
  done
done
check --model "$KILN_MODELS/stories260K" --reference "$KILN_MODELS/stories260K/reference.safetensors" --page-size 64 --chunk 7
# A tolerance that cannot hold must fail: the check really compares.
check_fails "verify against another model's reference" --model "$KILN_FIXTURES/oracle/tiny-models/llama" \
  --reference "$KILN_FIXTURES/oracle/tiny-models/qwen2/reference.safetensors"
# FP8 moved these logits 1-6 from the bf16 model's: the FP8 checkpoint
# must fail against the bf16 reference (its FP8 weights were read)
check_fails "the FP8 model against the bf16 model's reference" \
  --model "$KILN_FIXTURES/oracle/tiny-models-fp8/llama_fp8" \
  --reference "$KILN_FIXTURES/oracle/tiny-models/llama/reference.safetensors"
verify_done
