#!/usr/bin/env bash
# kiln verify --device cuda on the FP8 mixture-of-experts oracle models
# (tests/fixtures/oracle/tiny-models-fp8: qwen3_moe_fp8, deepseek_v3_fp8,
# float8_e4m3fn projections and experts with 32x32 block scales; the
# reference is fp32 with the dequantized weights), page sizes 1 and 16,
# chunks 3 and 64, deepseek_v3_fp8 also with MLA's absorbed and MHA forms
# forced.
#
# Mode: KILN_CUDA_MATMUL=bf16x2, the fp32-grade mode, within
# KILN_CUDA_TOL_X2 (default 1e-3, the CPU backend's tolerance on these
# models). Why that bound holds: the FP8 experts run the grouped GEMV with
# fp32 token rows and fp32 SwiGLU rows (cuda_moe_quant.cu), each weight the
# CPU's value (code x block scale, one fp32 rounding); kv_b_proj is
# dequantized to fp32 at load (model/deepseek.c); the products around them
# are fp32-grade in this mode and the KV cache is fp32. What is left is
# the order of fp32 sums, ~1e-6 relative (test_cuda_moe_quant measures the
# expert products within 1e-5 of the CPU's), far under 1e-3 on logits up
# to ~8.
#
# The default mode (bf16 activations) is left out on these models as on
# the 16-bit MoE ones (verify_cuda.sh): a bf16 rounding of the router's
# input can flip an expert choice, a jump no tolerance bounds. Its FP8
# expert kernels (the bf16 GEMV and the mma product) are checked against
# the CPU by test_cuda_moe_quant (within 1e-2, two bf16 roundings).
# Needs a GPU: fails with a note where none can be opened.
set -u
VERIFY_DEVICE=cuda
source "$KILN_SRC/tests/cli/lib/verify.sh"
tol=${KILN_CUDA_TOL_X2:-1e-3}
fp8="$KILN_FIXTURES/oracle/tiny-models-fp8"
need_gpu
export KILN_CUDA_MATMUL=bf16x2
verify_grid tiny-models-fp8 qwen3_moe_fp8 deepseek_v3_fp8
for form in absorbed mha; do
  dir="$fp8/deepseek_v3_fp8"
  for chunk in 3 64; do
    KILN_MLA_FORM=$form check --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk $chunk
  done
done
verify_done
