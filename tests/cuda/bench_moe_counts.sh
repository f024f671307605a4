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
fail=0; runs=0
for batch in 1 4 8; do
  args=(--model "$tmp/config.json" --load-format dummy --prompt-len 24 --decode 6 --batch "$batch" --repeat 1
        --dummy-routing uniform)
  "$bf" "${args[@]}" --device cpu --threads 2 > "$tmp/cpu.txt" 2>&1
  KILN_CUDA_MOE=device "$bf" "${args[@]}" --device cuda > "$tmp/gpu.txt" 2>&1
  runs=$((runs + 1))
  if grep -q "no CUDA device\|built without CUDA" "$tmp/gpu.txt"; then
    echo "FAIL: this test needs a CUDA GPU (ctest -L gpu on the GPU machine)"; cat "$tmp/gpu.txt"; exit 1
  fi
  c=$(grep -E '^(MoE layer|expert bytes)' "$tmp/cpu.txt"); g=$(grep -E '^(MoE layer|expert bytes)' "$tmp/gpu.txt")
  if [ -z "$c" ] || [ "$c" != "$g" ] || ! grep -qE '^decode bound .* GB/s copy = ' "$tmp/gpu.txt"; then
    echo "FAIL: batch $batch"; echo "  cpu:"; sed 's/^/  | /' "$tmp/cpu.txt"; echo "  cuda:"; sed 's/^/  | /' "$tmp/gpu.txt"
    fail=$((fail + 1))
  else
    echo "ok: batch $batch: the CPU's and CUDA's counts agree"; grep -E '^MoE layer 0|^decode bound' "$tmp/gpu.txt"
  fi
done
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
