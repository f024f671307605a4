#!/usr/bin/env python3
"""How far transformers itself lands from an oracle model's reference in bf16.

The oracle's reference logits (reference.safetensors: p<i>.ids and fp32
p<i>.logits of every position) are computed in fp32. This loads the same
checkpoint in bf16 (weights and activations, eager attention, as a user of
transformers runs it) and prints, per model, the largest absolute
difference of its logits from the reference over every position of every
prompt, and the same over the positions before the first position where
a MoE router's top-k differs from the fp32 run's (a flipped expert is a
jump no tolerance bounds; `kiln verify --routing-check` counts those rows
instead of comparing them). These figures are the bf16 noise level a GPU
run in bf16 is held to (docs/cuda-testing.md).

Usage: hf_bf16_noise.py MODEL_DIR...   (an MXFP4 folder is read with
Mxfp4Config(dequantize=True), its experts in bf16)
"""
import json, os, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def load(d, dtype):
    cfg = json.load(open(os.path.join(d, "config.json")))
    kw = dict(dtype=dtype, attn_implementation="eager")
    if cfg.get("quantization_config", {}).get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(d, **kw).eval()


def run(model, ids):
    """Logits (fp32) and, per MoE layer, the top-k expert sets of every position."""
    with torch.no_grad():
        out = model(ids[None], output_router_logits=True) if hasattr(model.config, "num_local_experts") \
            or hasattr(model.config, "num_experts") else model(ids[None])
    choices = []
    k = getattr(model.config, "num_experts_per_tok", 0)
    for rl in (getattr(out, "router_logits", None) or ()):
        rl = rl.reshape(ids.numel(), -1).float()
        choices.append(torch.sort(torch.topk(rl, k, dim=-1).indices, dim=-1).values)
    return out.logits[0].float(), choices


for d in sys.argv[1:]:
    ref = load_file(os.path.join(d, "reference.safetensors"))
    name = os.path.basename(os.path.normpath(d))
    try:
        m32, m16 = load(d, torch.float32), load(d, torch.bfloat16)
    except Exception as e:
        print(f"{name}: cannot load ({type(e).__name__}: {e})", flush=True)
        continue
    worst = worst_before = 0.0
    flips = rows = 0
    for i in range(len([key for key in ref if key.endswith(".ids")])):
        ids = ref[f"p{i}.ids"].long()
        want = ref[f"p{i}.logits"].float()
        got, ch16 = run(m16, ids)
        _, ch32 = run(m32, ids)
        diff = (got - want).abs().amax(dim=-1)
        first = ids.numel()
        for a, b in zip(ch16, ch32):
            bad = (a != b).any(dim=-1).nonzero()
            if bad.numel():
                first = min(first, int(bad[0]))
        flips += int(first < ids.numel())
        rows += ids.numel()
        worst = max(worst, float(diff.max()))
        if first > 0:
            worst_before = max(worst_before, float(diff[:first].max()))
    print(f"{name}: bf16 max_abs_err={worst:.4f} before_first_flip={worst_before:.4f} "
          f"prompts_with_flips={flips} rows={rows}", flush=True)
