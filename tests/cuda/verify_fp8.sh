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
VERIFY_DEVICE=cuda
source "$KILN_SRC/tests/cli/lib/verify.sh"
need_gpu
tol=${KILN_CUDA_TOL_FP8:-0.4}
echo "== FP8 checkpoints"
for arch in llama qwen3; do
  dir="$KILN_FIXTURES/oracle/tiny-models-fp8/${arch}_fp8"
  for ps in 1 16; do
    for chunk in 3 64; do
      check_floor "$tol" 0 --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk $chunk
    done
  done
  check_floor "$tol" 0 --model "$dir" --reference "$dir/reference.safetensors" --page-size 16 --chunk 3 --deterministic
done
echo "== --quantization fp8 on bf16 checkpoints"
for pair in llama:3.46 qwen2:2.25 qwen3:1.55; do
  arch=${pair%%:*}; cpu=${pair#*:}
  dir="$KILN_FIXTURES/oracle/tiny-models/$arch"
  qtol=$(awk -v c="$cpu" -v t="$tol" 'BEGIN { print c + t }')
  for ps in 1 16; do
    check_floor "$qtol" 0.1 --model "$dir" --reference "$dir/reference.safetensors" --page-size $ps --chunk 3 \
      --quantization fp8
  done
done
# a tolerance that cannot hold must fail: the check compares
check_fails "the FP8 model against the bf16 model's reference" --model "$KILN_FIXTURES/oracle/tiny-models-fp8/llama_fp8" \
  --reference "$KILN_FIXTURES/oracle/tiny-models/llama/reference.safetensors"
verify_done
