#!/usr/bin/env bash
# kiln verify --device cuda over two GPUs of one machine (label gpu_multi:
# `ctest -L gpu_multi` where there are two or more), NCCL carrying the
# model's collectives, in KILN_CUDA_MATMUL=bf16x2 mode (fp32-grade
# products) within KILN_CUDA_TOL_X2 (default 1e-3, the CPU's tolerance),
# page sizes 1 and 16, chunk 3:
#  - --tp 2 on every oracle model (Gemma-3 and gpt-oss too), the MoE ones
#    also --tp 2 --ep 2;
#  - --tp 2 --dp 2 --enable-dp-attention (and with --ep 2) on the MLA ones.
# Fails, saying so, with fewer than two GPUs. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0) unless the environment says otherwise.
set -u
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export KILN_CUDA_MATMUL=bf16x2
tol=${KILN_CUDA_TOL_X2:-1e-3}
VERIFY_DEVICE=cuda
source "$KILN_SRC/tests/cli/lib/verify.sh"
need_gpus 2
for arch in llama qwen2 qwen3 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  for ps in 1 16; do
    check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --page-size $ps --chunk 3
    case $arch in
    *moe* | deepseek*) check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --ep 2 --page-size $ps --chunk 3 ;;
    esac
    case $arch in
    deepseek*)
      check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --dp 2 --enable-dp-attention --page-size $ps --chunk 3
      check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --ep 2 --dp 2 --enable-dp-attention --page-size $ps --chunk 3
      ;;
    esac
  done
done
# sliding and full layers (hybrid KV pools, whose sliding pages rank 0's
# steps carry); gpt-oss's sinks and fused experts split (bf16 and MXFP4)
for arch in gemma3 gpt_oss gpt_oss_mxfp4; do
  dir="$KILN_FIXTURES/oracle/tiny-models-more/$arch"
  for ps in 1 16; do
    check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --page-size $ps --chunk 3
    case $arch in
    gpt_oss*) check --model "$dir" --reference "$dir/reference.safetensors" --tp 2 --ep 2 --page-size $ps --chunk 3 ;;
    esac
  done
done
verify_done
