#!/usr/bin/env bash
# Uniform dummy routing end to end on the GPU: bench_forward on a small
# Qwen3-MoE config with dummy weights, --dummy-routing uniform, on the CPU
# and on CUDA with the device MoE path (KILN_CUDA_MOE=device: the decode
# steps replay graphs). The draw depends only on each token's KV slot,
# position and layer, which both runs lay out alike, so every MoE count
# line (experts touched per layer, decode and prefill, mean / min / max)
# must be the same on both; the GPU's counting runs inside the replayed
# graphs. Batch sizes are decode graph buckets (no padding rows). The
# CUDA run must also print the decode bound against the copy bandwidth.
set -u
bf="$(dirname "$KILN")/bench_forward"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/config.json" <<'EOF'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
 "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 4,
 "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
 "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 1024,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "eos_token_id": 2}
EOF
source "$KILN_SRC/tests/cuda/lib/moe_counts.sh"
fail=0; runs=0
export KILN_CUDA_MOE=device
for batch in 1 4 8; do
  moe_counts "batch $batch" '^decode bound .* GB/s copy = ' -- --model "$tmp/config.json" --load-format dummy \
    --prompt-len 24 --decode 6 --batch "$batch" --repeat 1 --dummy-routing uniform
done
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
