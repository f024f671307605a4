#!/usr/bin/env bash
# gpt-oss end to end on the GPU with dummy weights (bench_forward
# --load-format dummy): random expert weights, expert biases and the
# clamped SwiGLU on the MoE device path (prefill: the mma.sync or wgmma
# products; decode: the grouped GEMV, replayed from graphs), attention
# sinks and sliding windows (prompts past the window).
#  - a small gpt-oss config (hidden 256, inner 128: multiples of 64, the
#    device path) with --dummy-routing uniform on the CPU and on CUDA: the
#    draw depends only on each token's KV slot, position and layer, so
#    every MoE count line must be the same on both;
#  - models/configs/gpt-oss-20b.json (its MXFP4 quantization_config: the
#    dummy experts are MXFP4 on the GPU, the products of cuda_moe_quant.cu)
#    at batch 1 and 8: it must load and run prefill and decode; with
#    KILN_CUDA_MOE=host it must be refused at load.
# The products themselves are checked against the CPU by test_cuda_moe and
# test_cuda_moe_quant.
set -u
bf="$(dirname "$KILN")/bench_forward"
cfg="$(cd "$(dirname "$0")/../.." && pwd)/models/configs/gpt-oss-20b.json"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/gpt_oss.json" <<'JSON'
{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": true, "hidden_size": 256,
 "intermediate_size": 128, "num_local_experts": 16, "num_experts_per_tok": 4, "num_hidden_layers": 2,
 "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu", "swiglu_limit": 7.0,
 "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
 "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 256,
                  "rope_type": "yarn", "truncate": false},
 "vocab_size": 1024, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "eos_token_id": 2}
JSON
source "$KILN_SRC/tests/cuda/lib/moe_counts.sh"
fail=0; runs=0
for batch in 1 8; do
  moe_counts "small gpt_oss batch $batch" -- --model "$tmp/gpt_oss.json" --load-format dummy --prompt-len 200 \
    --decode 6 --batch "$batch" --repeat 1 --dummy-routing uniform
done
for batch in 1 8; do
  "$bf" --model "$cfg" --load-format dummy --device cuda --prompt-len 512 --decode 8 --batch "$batch" --repeat 1 \
    > "$tmp/20b.txt" 2>&1
  rc=$?
  runs=$((runs + 1))
  if [ $rc -ne 0 ] || ! grep -qE '^decode tg[0-9]+ batch' "$tmp/20b.txt"; then
    echo "FAIL: gpt-oss-20b dummy batch $batch (rc $rc)"; sed 's/^/  | /' "$tmp/20b.txt"; fail=$((fail + 1))
  else
    echo "ok: gpt-oss-20b dummy batch $batch: $(grep -E '^decode tg[0-9]+ batch' "$tmp/20b.txt" | head -1)"
  fi
done
# MXFP4 experts run on the MoE device path only: with the host path forced
# the load stops, naming the layer and the knob (not the first forward)
KILN_CUDA_MOE=host "$bf" --model "$cfg" --load-format dummy --device cuda --prompt-len 16 --decode 1 \
  > "$tmp/host.txt" 2>&1
rc=$?
runs=$((runs + 1))
if [ $rc -ne 0 ] && grep -q "layer 0: the MXFP4 experts .*KILN_CUDA_MOE=host is set" "$tmp/host.txt" &&
  ! grep -qE '^prefill' "$tmp/host.txt"; then
  echo "ok: KILN_CUDA_MOE=host refuses MXFP4 experts at load"
else
  echo "FAIL: KILN_CUDA_MOE=host with MXFP4 experts (rc $rc)"; sed 's/^/  | /' "$tmp/host.txt"; fail=$((fail + 1))
fi
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
