#!/usr/bin/env bash
# FP8 mixture-of-experts models end to end on the GPU: bench_forward with
# dummy weights quantized at load (--quantization fp8: on CUDA the codes
# and scales are made on the device, cuda_dummy.cu) and --dummy-routing
# uniform, on small Qwen3-MoE, DeepSeek-V2 (two shared experts beside the
# routed ones; MLA's kv_b_proj dequantized from device-made FP8) and
# DeepSeek-V3 (one shared expert fused into the routed list) configs, on
# the CPU and on CUDA. The uniform draw depends only on each token's KV
# slot, position and layer, never on the values, so every MoE count line
# (experts touched per layer, decode and prefill) must be the same on both:
# the FP8 load, prefill (the grouped mma product) and graph-replayed decode
# (the grouped GEMV) all ran through. The products themselves are checked
# against the CPU by test_cuda_moe_quant.
set -u
bf="$(dirname "$KILN")/bench_forward"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common='"hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
 "vocab_size": 1024, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "eos_token_id": 2'
cat > "$tmp/qwen3_moe.json" <<EOF
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
 "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 4,
 "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, $common}
EOF
mla='"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 16,
 "num_experts_per_tok": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
 "qk_rope_head_dim": 32, "v_head_dim": 64, "attention_bias": false'
cat > "$tmp/deepseek_v2.json" <<EOF
{"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", $mla, "n_shared_experts": 2,
 "q_lora_rank": null, "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
 "norm_topk_prob": false, "routed_scaling_factor": 1.0, $common}
EOF
cat > "$tmp/deepseek_v3.json" <<EOF
{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", $mla, "n_shared_experts": 1,
 "q_lora_rank": 128, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
 "norm_topk_prob": true, "routed_scaling_factor": 2.5, "rope_interleave": true, $common}
EOF
source "$KILN_SRC/tests/cuda/lib/moe_counts.sh"
fail=0; runs=0
for model in qwen3_moe deepseek_v2 deepseek_v3; do
  for batch in 1 8; do
    moe_counts "$model batch $batch" -- --model "$tmp/$model.json" --load-format dummy --quantization fp8 \
      --prompt-len 200 --decode 6 --batch "$batch" --repeat 1 --dummy-routing uniform
  done
done
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
