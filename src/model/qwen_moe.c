/* qwen_moe.c — the Qwen-MoE family (qwen2_moe, qwen3_moe): the llama-like
 * attention (llama.c) with a mixture-of-experts MLP (moe.c) on the sparse
 * layers: softmax routing, Qwen2-MoE's one shared expert behind a sigmoid
 * gate. Layers listed in mlp_only_layers, and those off the
 * decoder_sparse_step, keep a dense MLP. */
#include <stdio.h>

#include "model/model_internal.h"

static int qwen_moe_layer_is_moe(const struct model_config *c, int layer) {
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer) return 0;
    return (layer + 1) % c->decoder_sparse_step == 0;
}

static int qwen_moe_load_layer(struct weight_source *ws, int l, struct layer *L,
                               struct kiln_error *err) {
    static const struct moe_kind kind = {.renormalize_single = 1, .scaling = 1.0f};
    L->attn_kind = LAYER_ATTN_MHA;
    return mha_load(ws, l, &L->mha, err) || mlp_load(ws, l, &kind, L, err);
}

void mha_mlp_forward_layer(const struct fwd *f, int l, const struct layer *L) {
    struct activations *a = &f->m->act;
    struct backend_norm nm = layer_norm_in(f, l, L->ln_attn);
    mha_forward_norm(f, l, &L->mha, &nm, a->delta);
    model_defer_delta(f);
    nm = layer_norm_delta(f, L->ln_mlp);
    mlp_forward_norm(f, L, &nm, a->delta);
    model_defer_delta(f);
}

const struct model_family family_qwen_moe = {
    .name = "qwen-moe",
    .check_config = mha_check,
    .kv_layout = mha_kv_layout,
    .act_widths = mha_act_widths,
    .rope_dim = mha_rope_dim,
    .attn_scale = mha_attn_scale,
    .layer_is_moe = qwen_moe_layer_is_moe,
    .load_layer = qwen_moe_load_layer,
    .forward_layer = mha_mlp_forward_layer,
};
