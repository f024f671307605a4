#!/usr/bin/env python3
"""Make an MXFP4 copy of the tiny gpt_oss oracle model, with reference logits.

The copy uses the checkpoint format of the published openai/gpt-oss models:
each layer's fused experts are stored as
  model.layers.N.mlp.experts.gate_up_proj_blocks  uint8 [E, 2*inter, hidden/32, 16]
  model.layers.N.mlp.experts.gate_up_proj_scales  uint8 [E, 2*inter, hidden/32]
  model.layers.N.mlp.experts.down_proj_blocks     uint8 [E, hidden, inter/32, 16]
  model.layers.N.mlp.experts.down_proj_scales     uint8 [E, hidden, inter/32]
i.e. the bf16 tensors gate_up_proj [E, hidden, 2*inter] and down_proj
[E, inter, hidden] transposed to [E, out, in] (gate_up's rows keep the
gate/up interleaving: row 2j is gate j, row 2j+1 up j) and cut into blocks of
32 values along `in`. A block is 16 bytes of e2m1 codes, two a byte, the LOW
nibble holding the even element; its scale byte is an e8m0 exponent:
value = FP4_VALUES[code] * 2^(scale - 127), FP4_VALUES = [0, .5, 1, 1.5, 2,
3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6] (transformers'
integrations/mxfp4.py convert_moe_packed_tensors reads exactly this). The
scale of a block is the OCP MX one, 2^(floor(log2(amax)) - 2) (e2m1's
largest exponent is 2), and each value rounds to the nearest e2m1 code
(ties to the even code), saturating at +-6. The biases, attention, router,
embeddings, norms and lm_head stay as they were (bf16). config.json gains
quantization_config {"quant_method": "mxfp4", "modules_to_not_convert": [...]}
as the published checkpoints write it.

reference.safetensors holds the source model's p<i>.ids and the fp32 logits
that transformers computes from the DEQUANTIZED weights (an fp32 checkpoint
of them, eager attention). Where this transformers can also read the MXFP4
folder itself (Mxfp4Config(dequantize=True)), its logits are compared with
that reference and the difference is recorded in reference.json: 0 means
transformers reads the blocks, scales and nibble order as written here.

Usage: make_mxfp4_gpt_oss.py SRC_TINY_MODELS_MORE DST_DIR
Writes DST_DIR/gpt_oss_mxfp4. Runs on any machine with torch, safetensors
and transformers (CPU is enough).
"""
import json, os, shutil, sys, tempfile
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

SRC, DST = os.path.join(sys.argv[1], "gpt_oss"), os.path.join(sys.argv[2], "gpt_oss_mxfp4")
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                           -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def e2m1_code(x):
    """Nearest e2m1 code of each element of x (float64, |x| <= 6 after the
    clamp), ties to the code with an even mantissa bit, as round-to-nearest-even."""
    x = x.clamp(-6.0, 6.0)
    mag = FP4_VALUES[:8]                                    # codes 0..7, increasing
    d = (x.abs()[..., None] - mag).abs()                    # distance to each magnitude
    best = d.min(dim=-1, keepdim=True).values
    tied = d == best
    # among the tied magnitudes prefer the even code (mantissa bit 0)
    even = tied & (torch.arange(8) % 2 == 0)
    pick = torch.where(even.any(-1, keepdim=True), even, tied)
    code = pick.to(torch.int64).argmax(-1)
    neg = (x < 0) | ((x == 0) & torch.signbit(x))
    return (code + 8 * neg.to(torch.int64)).to(torch.uint8)


def quantize(w_out_in):
    """w [E, out, in] (in % 32 == 0) -> (blocks uint8 [E, out, in/32, 16],
    scales uint8 [E, out, in/32], dequantized float32 [E, out, in])."""
    E, O, I = w_out_in.shape
    assert I % 32 == 0, f"rows of {I} values do not split into blocks of 32"
    x = w_out_in.double().reshape(E, O, I // 32, 32)
    amax = x.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-300))) - 2, torch.full_like(amax, -127))
    exp = exp.clamp(-127, 127)
    scale = torch.pow(2.0, exp)
    code = e2m1_code(x / scale[..., None])
    deq = FP4_VALUES[code.long()] * scale[..., None]
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    scales = (exp + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous(), deq.reshape(E, O, I).float()


def main():
    os.makedirs(DST, exist_ok=True)
    w = load_file(os.path.join(SRC, "model.safetensors"))
    out, deq_all, n_q, moved = {}, {}, 0, 0.0
    for k, t in w.items():
        if k.endswith(".mlp.experts.gate_up_proj") or k.endswith(".mlp.experts.down_proj"):
            b, s, d = quantize(t.float().transpose(1, 2))   # [E, out, in]
            out[k + "_blocks"], out[k + "_scales"] = b, s
            deq_all[k] = d.transpose(1, 2).contiguous()      # back to [E, in, out]
            moved = max(moved, (deq_all[k] - t.float()).abs().max().item())
            n_q += 1
        else:
            out[k], deq_all[k] = t, t.float()
    save_file(out, os.path.join(DST, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    json.dump(cfg, open(os.path.join(DST, "config.json"), "w"), indent=2)
    for f in os.listdir(SRC):
        if f not in ("model.safetensors", "config.json", "reference.safetensors", "reference.json"):
            shutil.copy(os.path.join(SRC, f), DST)

    # Reference: the dequantized weights as an fp32 checkpoint, loaded by transformers.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(SRC, "config.json"), tmp)
        save_file({k: v.contiguous() for k, v in deq_all.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
    # transformers reading the MXFP4 folder itself, where it can
    direct, direct_note = None, None
    try:
        from transformers import Mxfp4Config
        direct = AutoModelForCausalLM.from_pretrained(DST, dtype=torch.float32, attn_implementation="eager",
                                                      quantization_config=Mxfp4Config(dequantize=True)).eval()
    except Exception as e:  # no Mxfp4Config, or it needs kernels this machine lacks
        direct_note = f"{type(e).__name__}: {e}"[:300]
    # its dequantized expert weights against ours, element by element
    wdiff, wdtype = None, None
    if direct is not None:
        sd = direct.state_dict()
        for k, v in deq_all.items():
            if k in sd and (k.endswith(".mlp.experts.gate_up_proj") or k.endswith(".mlp.experts.down_proj")):
                wdtype = str(sd[k].dtype)
                d = (sd[k].float() - v).abs().max().item() if sd[k].shape == v.shape else float("inf")
                wdiff = d if wdiff is None else max(wdiff, d)
    ref_src = load_file(os.path.join(SRC, "reference.safetensors"))
    ref, worst, direct_diff = {}, 0.0, 0.0
    for k in sorted(x for x in ref_src if x.endswith(".ids")):
        ids = ref_src[k]
        with torch.no_grad():
            lg = model(ids.long()[None]).logits[0].float()
            if direct is not None:
                direct_diff = max(direct_diff, (direct(ids.long()[None]).logits[0].float() - lg).abs().max().item())
        ref[k], ref[k.replace(".ids", ".logits")] = ids, lg.contiguous()
        worst = max(worst, (lg - ref_src[k.replace(".ids", ".logits")]).abs().max().item())
    save_file(ref, os.path.join(DST, "reference.safetensors"))
    meta = {"arch": "gpt_oss", "source": "gpt_oss", "compute": "fp32 with the dequantized mxfp4 experts, eager attention",
            "transformers": __import__("transformers").__version__, "quantized_tensors": n_q,
            "max_abs_weight_change": moved, "max_abs_diff_vs_bf16_reference": worst,
            "transformers_mxfp4_dequantize_max_abs_diff": direct_diff if direct is not None else None,
            "transformers_mxfp4_dequantize_max_abs_weight_diff": wdiff, "transformers_mxfp4_weight_dtype": wdtype}
    if direct_note:
        meta["transformers_mxfp4_dequantize_unavailable"] = direct_note
    json.dump(meta, open(os.path.join(DST, "reference.json"), "w"), indent=1)
    print(f"gpt_oss_mxfp4: {n_q} mxfp4 tensors, weights moved up to {moved:.3f}, logits {worst:.3f} from the "
          f"bf16 model's; transformers' own mxfp4 read: "
          f"{direct_diff if direct is not None else 'unavailable (' + direct_note + ')'}; its expert weights: "
          f"{wdiff} ({wdtype})", flush=True)


if __name__ == "__main__":
    main()
