#!/usr/bin/env python3
"""random_checkpoint.py — a Hugging Face checkpoint with random weights, for
peers that cannot make dummy weights themselves (llama.cpp reads a GGUF
that its convert_hf_to_gguf.py makes from a checkpoint), so that kiln and
the peer run the very same weights (docs/perf.md and docs/perf-models.md,
the llama.cpp rows).

  random_checkpoint.py CONFIG TOKENIZER_DIR OUT_DIR [--seed N]

CONFIG is a config.json (models/configs/); TOKENIZER_DIR holds the model's
tokenizer.json and tokenizer_config.json (copied). Architectures:
  - llama (LlamaForCausalLM): bf16 weights, std 0.02, norms 1;
  - gpt_oss (GptOssForCausalLM): bf16 attention (with biases and sinks),
    router and embeddings; the experts as the published checkpoints store
    them when the config has an mxfp4 quantization_config (random e2m1
    codes, e8m0 exponents 118-121: values up to 6 · 2^-6), else bf16.
One safetensors file per layer plus model.safetensors.index.json. Tensors
are drawn on the GPU when there is one (torch), else on the CPU.
"""
import json, os, shutil, sys
import torch
from safetensors.torch import save_file

cfg_path, tok_dir, dst = sys.argv[1:4]
seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
cfg = json.load(open(cfg_path))
arch = cfg.get("model_type")
if arch not in ("llama", "gpt_oss"):
    sys.exit(f"random_checkpoint.py: {cfg_path}: model_type {arch!r}: only llama and gpt_oss are written")
os.makedirs(dst, exist_ok=True)
cfg.setdefault("torch_dtype", "bfloat16")
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok_dir, f), dst)

dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(device=dev).manual_seed(seed)
H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
NQ, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
D = cfg.get("head_dim") or H // NQ


def bf(*shape, std=0.02):
    return (torch.randn(*shape, device=dev, generator=g) * std).to(torch.bfloat16).cpu()


def u8(*shape, lo=0, hi=256):
    return torch.randint(lo, hi, shape, device=dev, generator=g, dtype=torch.uint8).cpu()


def ones():
    return torch.ones(H, dtype=torch.bfloat16)


index = {}


def put(name, tensors):
    save_file(tensors, os.path.join(dst, name))
    index.update({k: name for k in tensors})


put("model-embed.safetensors", {"model.embed_tokens.weight": bf(V, H), "lm_head.weight": bf(V, H),
                                "model.norm.weight": ones()})
mxfp4 = (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4"
for layer in range(L):
    p = f"model.layers.{layer}."
    t = {p + "input_layernorm.weight": ones(), p + "post_attention_layernorm.weight": ones(),
         p + "self_attn.q_proj.weight": bf(NQ * D, H), p + "self_attn.k_proj.weight": bf(NKV * D, H),
         p + "self_attn.v_proj.weight": bf(NKV * D, H), p + "self_attn.o_proj.weight": bf(H, NQ * D)}
    if arch == "llama":
        F = cfg["intermediate_size"]
        t.update({p + "mlp.gate_proj.weight": bf(F, H), p + "mlp.up_proj.weight": bf(F, H),
                  p + "mlp.down_proj.weight": bf(H, F)})
    else:
        E, F = cfg["num_local_experts"], cfg["intermediate_size"]
        t.update({p + "self_attn.q_proj.bias": bf(NQ * D), p + "self_attn.k_proj.bias": bf(NKV * D),
                  p + "self_attn.v_proj.bias": bf(NKV * D), p + "self_attn.o_proj.bias": bf(H),
                  p + "self_attn.sinks": bf(NQ, std=1.0), p + "mlp.router.weight": bf(E, H),
                  p + "mlp.router.bias": bf(E), p + "mlp.experts.gate_up_proj_bias": bf(E, 2 * F),
                  p + "mlp.experts.down_proj_bias": bf(E, H)})
        x = p + "mlp.experts."
        if mxfp4:
            t.update({x + "gate_up_proj_blocks": u8(E, 2 * F, H // 32, 16),
                      x + "gate_up_proj_scales": u8(E, 2 * F, H // 32, lo=118, hi=122),
                      x + "down_proj_blocks": u8(E, H, F // 32, 16),
                      x + "down_proj_scales": u8(E, H, F // 32, lo=118, hi=122)})
        else:
            t.update({x + "gate_up_proj": bf(E, H, 2 * F), x + "down_proj": bf(E, F, H)})
    put(f"model-{layer:05d}.safetensors", t)
json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
print(f"random_checkpoint.py: {arch}, {L} layers{' (MXFP4 experts)' if mxfp4 else ''} -> {dst}")
