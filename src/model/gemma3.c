/* gemma3.c — the Gemma-3 family (gemma3_text): llama's attention with
 * per-head q/k norms, sliding layers (their own window and rope base) and
 * global ones, the attention scale from query_pre_attn_scalar; a GeGLU MLP
 * (tanh GELU); sandwich norms (each sublayer's output is normalised before
 * it joins the residual stream); every RMSNorm weight read as 1 + w
 * (ws_norm); the embedding scaled by √hidden_size (model.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"

static int gemma3_check(const struct model_config *c, const char *file, struct kiln_error *err) {
    if (strcmp(c->hidden_act, "gelu_pytorch_tanh"))
        return kiln_errorf(err, "%s: %s '%.32s' is not supported for gemma3 (only gelu_pytorch_tanh)",
                           file, c->hidden_act_key, c->hidden_act);
    if (c->mlp_bias) return kiln_errorf(err, "%s: mlp_bias true is not supported", file);
    if (c->partial_rotary_factor != 1.0)
        return kiln_errorf(err, "%s: partial_rotary_factor %g is not supported (the whole head is "
                                "rotated)",
                           file, c->partial_rotary_factor);
    if (c->attn_logit_softcapping)
        return kiln_errorf(err, "%s: attn_logit_softcapping %g is not supported (only null)", file,
                           c->attn_logit_softcapping);
    if (c->final_logit_softcapping)
        return kiln_errorf(err, "%s: final_logit_softcapping %g is not supported (only null)", file,
                           c->final_logit_softcapping);
    if (c->bidirectional)
        return kiln_errorf(err, "%s: use_bidirectional_attention true is not supported (only causal "
                                "attention)",
                           file);
    if (c->n_heads % c->n_kv_heads)
        return kiln_errorf(err,
                           "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads "
                           "(%d)",
                           file, c->n_heads, c->n_kv_heads);
    return 0;
}

static double gemma3_attn_scale(const struct model_config *c) {
    return 1.0 / sqrt(c->query_pre_attn_scalar);
}

static int dense_only(const struct model_config *c, int layer) {
    (void)c, (void)layer;
    return 0;
}

static int gemma3_load_layer(struct weight_source *ws, int l, struct layer *L, struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    char name[96];
    L->attn_kind = LAYER_ATTN_MHA;
    L->mlp_kind = LAYER_MLP_DENSE;
    snprintf(name, sizeof name, "model.layers.%d.mlp", l);
    if (mha_load(ws, l, &L->mha, err) || dense_load(ws, name, c->intermediate_size, &L->dense, err))
        return -1;
    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
    if (ws_norm(ws, name, c->hidden_size, &L->ln_post_attn, err)) return -1;
    snprintf(name, sizeof name, "model.layers.%d.post_feedforward_layernorm.weight", l);
    return ws_norm(ws, name, c->hidden_size, &L->ln_post_mlp, err);
}

/* h += delta (the previous sublayer's normalised output); the attention
 * (mha_forward_norm: the layer's window and rope) into delta, normalised
 * by post_attention_layernorm; h += delta, pre_feedforward_layernorm, the
 * GeGLU MLP into delta, normalised by post_feedforward_layernorm (the next
 * layer or the final norm adds it). */
static void gemma3_forward_layer(const struct fwd *f, int l, const struct layer *L) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long n = f->n, d = c->hidden_size, inter = c->intermediate_size, ld = 2 * inter;
    float eps = (float)c->rms_norm_eps;
    struct backend_norm nm = layer_norm_in(f, l, L->ln_attn);
    mha_forward_norm(f, l, &L->mha, &nm, a->delta);
    model_reduce_delta(f);
    ops->rmsnorm(ctx, a->delta, d, a->delta, d, L->ln_post_attn, n, d, eps);
    ops->add_rmsnorm(ctx, a->h, a->delta, a->xn, L->ln_mlp, n, d, eps);
    float *g = a->g, *u = g + inter;
    const struct backend_weight parts[2] = {L->dense.gate, L->dense.up};
    model_matmul_cat(m, g, ld, a->xn, d, &L->dense.gate_up, parts, 2, NULL, n);
    ops->gelu_tanh_mul(ctx, g, ld, g, ld, u, ld, n, inter);
    ops->matmul(ctx, a->delta, d, g, ld, &L->dense.down, NULL, n);
    model_reduce_delta(f);
    ops->rmsnorm(ctx, a->delta, d, a->delta, d, L->ln_post_mlp, n, d, eps);
}

const struct model_family family_gemma3 = {
    .name = "gemma3",
    .check_config = gemma3_check,
    .kv_layout = mha_kv_layout,
    .act_widths = mha_act_widths,
    .rope_dim = mha_rope_dim,
    .attn_scale = gemma3_attn_scale,
    .layer_is_moe = dense_only,
    .load_layer = gemma3_load_layer,
    .forward_layer = gemma3_forward_layer,
};
