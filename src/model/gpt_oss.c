/* gpt_oss.c — the gpt-oss family (gpt_oss): the llama-like attention
 * (llama.c) with q/k/v/o biases and an attention sink per head, sliding
 * and full layers per layer_types, yarn rope; every layer a mixture of
 * experts whose router has a bias and whose experts have biases and the
 * clamped SwiGLU (moe_experts.act). The experts are stored fused, in bf16
 * (`gate_up_proj` [E, hidden, 2 inter] with gate and up interleaved along
 * the last dimension, `down_proj` [E, inter, hidden]: [in][out], the
 * transpose of nn.Linear's) or in MXFP4 (`*_blocks` / `*_scales`, [out][in]
 * by rows, gate and up interleaved by rows); both become one [out][in]
 * matrix per expert and product at load (gpt_oss_experts.c). Tensor
 * parallel splits the heads (their sinks with them) and every expert's
 * columns, expert parallel the experts, as the other families. */
#include <math.h>
#include <stdio.h>

#include "base/error.h"
#include "model/model_internal.h"

/* What transformers' gpt-oss uses of the shared fields: hidden_act and
 * mlp_bias are not read by its modeling code, so they stay accepted. */
static int gpt_oss_check(const struct model_config *c, const char *file, struct kiln_error *err) {
    if (c->n_heads % c->n_kv_heads)
        return kiln_errorf(err,
                           "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads "
                           "(%d)",
                           file, c->n_heads, c->n_kv_heads);
    if (c->partial_rotary_factor != 1.0)
        return kiln_errorf(err, "%s: partial_rotary_factor %g is not supported (the whole head is "
                                "rotated)",
                           file, c->partial_rotary_factor);
    if (c->head_dim % 2)
        return kiln_errorf(err, "%s: head_dim %d must be even (rotary pairs)", file, c->head_dim);
    return 0;
}

static int gpt_oss_layer_is_moe(const struct model_config *c, int layer) {
    (void)c, (void)layer;
    return 1;
}

static int gpt_oss_load_layer(struct weight_source *ws, int l, struct layer *L, struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    if (c->shard.dp_size > 1)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED, "gpt_oss: data parallel attention is for MLA models");
    char name[128];
    L->attn_kind = LAYER_ATTN_MHA;
    L->mlp_kind = LAYER_MLP_MOE;
    /* a sink per query head: tensor parallel, the rank's heads' */
    snprintf(name, sizeof name, "model.layers.%d.self_attn.sinks", l);
    const char *names[1] = {name};
    const long whole[1] = {(long)c->n_heads * model_tp(c)};
    struct ws_slice sl;
    return mha_load(ws, l, &L->mha, err) ||
           ws_vector_cat(ws, names, whole, ws_split(&sl, c, 0, c->n_heads), 1, NAN, &L->mha.sinks, err) ||
           gpt_oss_moe_load(ws, l, &L->moe, err);
}

const struct model_family family_gpt_oss = {
    .name = "gpt-oss",
    .check_config = gpt_oss_check,
    .kv_layout = mha_kv_layout,
    .act_widths = mha_act_widths,
    .rope_dim = mha_rope_dim,
    .attn_scale = mha_attn_scale,
    .layer_is_moe = gpt_oss_layer_is_moe,
    .load_layer = gpt_oss_load_layer,
    .forward_layer = mha_mlp_forward_layer,
};
