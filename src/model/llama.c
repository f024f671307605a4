/* llama.c — the llama-like family (llama, qwen2, qwen3): multi-head
 * attention with GQA (Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm)
 * and the SwiGLU MLP. The Qwen MoE family reuses this attention and MLP. */
#include <math.h>
#include <stdio.h>

#include "base/error.h"
#include "model/model_internal.h"

int mha_check(const struct model_config *c, const char *file, struct kiln_error *err) {
    if (c->n_heads % c->n_kv_heads)
        return kiln_errorf(err,
                           "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads "
                           "(%d)",
                           file, c->n_heads, c->n_kv_heads);
    return family_check_common(c, file, err);
}

struct kv_layer_layout mha_kv_layout(const struct model_config *c, int layer) {
    (void)layer;
    long w = (long)c->n_kv_heads * c->head_dim;
    return (struct kv_layer_layout){.k_width = w, .v_width = w, .v_in_k = 0};
}

void mha_act_widths(const struct model_config *c, struct act_widths *w) {
    w->q = (long)c->n_heads * c->head_dim;
    w->k = w->v = (long)c->n_kv_heads * c->head_dim;
    w->att = w->q;
    w->stacked_qkv = 1;
}

int mha_rope_dim(const struct model_config *c) { return c->head_dim; }
double mha_attn_scale(const struct model_config *c) { return 1.0 / sqrt((double)c->head_dim); }

static int llama_load_layer(struct weight_source *ws, int l, struct layer *L, struct kiln_error *err) {
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.mlp", l);
    L->attn_kind = LAYER_ATTN_MHA;
    L->mlp_kind = LAYER_MLP_DENSE;
    return mha_load(ws, l, &L->mha, err) ||
           dense_load(ws, name, ws->m->cfg.intermediate_size, &L->dense, err);
}

/* The layer's norms travel with the products that read them (norm_matmul,
 * norm_swiglu_mlp) where the backend fuses them. */
static void llama_forward_layer(const struct fwd *f, int l, const struct layer *L) {
    struct activations *a = &f->m->act;
    struct backend_norm nm = layer_norm_in(f, l, L->ln_attn);
    mha_forward_norm(f, l, &L->mha, &nm, a->delta);
    model_defer_delta(f);
    nm = layer_norm_delta(f, L->ln_mlp);
    dense_forward_norm(f, &L->dense, f->m->cfg.intermediate_size, &nm, a->delta);
    model_defer_delta(f);
}

static int dense_only(const struct model_config *c, int layer) {
    (void)c, (void)layer;
    return 0;
}

const struct model_family family_llama = {
    .name = "llama-like",
    .check_config = mha_check,
    .kv_layout = mha_kv_layout,
    .act_widths = mha_act_widths,
    .rope_dim = mha_rope_dim,
    .attn_scale = mha_attn_scale,
    .layer_is_moe = dense_only,
    .load_layer = llama_load_layer,
    .forward_layer = llama_forward_layer,
};

/* Tensor parallel: the rank's query heads (q rows, o_proj columns, their
 * biases) and KV heads (k, v rows; one replicated head where there are
 * more ranks than KV heads); o_proj's bias is added by rank 0 only, so
 * the all-reduce of the ranks' outputs adds it once. */
int mha_load(struct weight_source *ws, int l, struct attn_mha *a, struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    int tp = model_tp(c);
    long d = c->hidden_size, hd = c->head_dim, qw = (long)c->n_heads * hd,
         kw = (long)c->n_kv_heads * hd;
    long kv_whole = (long)(tp > 1 ? c->shard.kv_heads : c->n_kv_heads) * hd;
    char name[256];
#define P(suffix) (snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, suffix), name)
    char names[3][256];
    const char *np[3] = {names[0], names[1], names[2]};
    const long qkv_rows[3] = {qw * tp, kv_whole, kv_whole};
    long kv0 = model_shard_kv_head0(c) * hd;
    const struct ws_slice qkv_sl[3] = {{0, c->shard.tp_rank * qw, qw}, {0, kv0, kw}, {0, kv0, kw}};
    const struct ws_slice *sl = tp > 1 ? qkv_sl : NULL;
    struct ws_slice o_sl;
    static const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
    struct backend_weight parts[3];
    for (int i = 0; i < 3; i++)
        snprintf(names[i], sizeof names[i], "model.layers.%d.self_attn.%s.weight", l, proj[i]);
    if (ws_matrix_cat(ws, np, qkv_rows, sl, 3, d, &a->wqkv, parts, err) ||
        ws_proj(ws, P("o_proj.weight"), d, qw * tp, ws_split(&o_sl, c, 1, qw), &a->wo, err))
        return -1;
    a->wq = parts[0], a->wk = parts[1], a->wv = parts[2];
    if (c->attention_bias) {
        for (int i = 0; i < 3; i++)
            snprintf(names[i], sizeof names[i], "model.layers.%d.self_attn.%s.bias", l, proj[i]);
        if (ws_vector_cat(ws, np, qkv_rows, sl, 3, NAN, &a->bqkv, err)) return -1;
    }
    if (c->o_proj_bias && c->shard.tp_rank == 0 && ws_vector(ws, P("o_proj.bias"), d, NAN, &a->bo, err))
        return -1;
    if (c->qk_norm && (ws_norm(ws, P("q_norm.weight"), hd, &a->q_norm, err) ||
                       ws_norm(ws, P("k_norm.weight"), hd, &a->k_norm, err)))
        return -1;
#undef P
    return 0;
}

/* qk_rope_store's arguments for layer l */
static struct backend_rope_store rope_args(const struct fwd *f, int l, const struct attn_mha *a) {
    const struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    return (struct backend_rope_store){
        .n_heads = (int)c->n_heads, .n_kv_heads = (int)c->n_kv_heads, .head_dim = (int)c->head_dim,
        .q_norm = a->q_norm, .k_norm = a->k_norm, .eps = (float)c->rms_norm_eps,
        .rot_dim = m->rope_dim, .pos = f->pos,
        .cos_sin = m->rope_table_local && model_config_layer_slides(c, l) ? m->rope_table_local
                                                                          : m->rope_table,
        .interleaved = c->rope.interleaved, .k_cache = f->kv->k[l], .v_cache = f->kv->v[l],
        .kv_stride = (long)c->n_kv_heads * c->head_dim, .slots = f->slot,
        .k_scale = m->layers[l].k_scale, .v_scale = m->layers[l].v_scale};
}

/* The layer's attention input norm (nm), the q|k|v product with the
 * stacked weight (row i of act.qkv holds q | k | v, row stride
 * L = qw + 2 kw), q/k norms, rope and the cache stores in one backend call;
 * then attention and o_proj into out in another. */
void mha_forward_norm(const struct fwd *f, int l, const struct attn_mha *a,
                      const struct backend_norm *nm, float *out) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = c->hidden_size, hd = c->head_dim, H = c->n_heads, KH = c->n_kv_heads;
    long qw = H * hd, kw = KH * hd, L = qw + 2 * kw;
    const struct backend_weight parts[3] = {a->wq, a->wk, a->wv};
    const struct backend_stack w = {.cat = a->wqkv, .parts = parts, .count = 3};
    struct backend_rope_store r = rope_args(f, l, a);
    ops->norm_matmul_rope(ctx, nm, m->act.qkv, L, &w, a->bqkv, n, &r);
    struct attn_params p = {.n_heads = (int)H, .n_kv_heads = (int)KH, .dk = (int)hd,
                            .dv = (int)hd, .k_stride = kw, .v_stride = kw, .scale = m->attn_scale,
                            .k_scale = r.k_scale, .v_scale = r.v_scale,
                            .window = model_config_layer_window(c, l), .sinks = a->sinks};
    ops->attention_matmul(ctx, out, d, m->act.att, qw, m->act.qkv, L, r.k_cache, r.v_cache, &p,
                          f->bb, &a->wo, a->bo, n);
}

/* Tensor parallel: inter is the rank's share of the intermediate
 * columns (gate and up rows, down columns), inter x tp_size the whole. */
int dense_load(struct weight_source *ws, const char *prefix, long inter, struct mlp_dense *dm,
               struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    long d = c->hidden_size, whole = inter * model_tp(c);
    char name[256];
#define P(suffix) (snprintf(name, sizeof name, "%s.%s", prefix, suffix), name)
    char gu[2][256];
    const char *np[2] = {gu[0], gu[1]};
    const long rows[2] = {whole, whole};
    struct ws_slice sl[2], down_sl;
    ws_split(&sl[0], c, 0, inter);
    const struct ws_slice *slp = ws_split(&sl[1], c, 0, inter) ? sl : NULL;
    struct backend_weight parts[2];
    snprintf(gu[0], sizeof gu[0], "%s.gate_proj.weight", prefix);
    snprintf(gu[1], sizeof gu[1], "%s.up_proj.weight", prefix);
    if (ws_matrix_cat(ws, np, rows, slp, 2, d, &dm->gate_up, parts, err) ||
        ws_proj(ws, P("down_proj.weight"), d, whole, ws_split(&down_sl, c, 1, inter), &dm->down, err))
        return -1;
    dm->gate = parts[0], dm->up = parts[1];
#undef P
    return 0;
}

void dense_forward(const struct fwd *f, const struct mlp_dense *dm, long inter, const float *x,
                   float *out) {
    struct model *m = f->m;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = m->cfg.hidden_size;
    /* one product with gate|up: row i of act.g is g | u (stride 2·inter);
     * silu(g)·u overwrites g in place */
    float *g = m->act.g, *u = g + inter;
    long L = 2 * inter;
    const struct backend_weight gu_parts[2] = {dm->gate, dm->up};
    model_matmul_cat(m, g, L, x, d, &dm->gate_up, gu_parts, 2, NULL, n);
    ops->silu_mul(ctx, g, L, g, L, u, L, n, inter);
    ops->matmul(ctx, out, d, g, L, &dm->down, NULL, n);
}

/* The MLP's input norm (nm) and the whole SwiGLU MLP in one backend call
 * (norm_swiglu_mlp). */
void dense_forward_norm(const struct fwd *f, const struct mlp_dense *dm, long inter,
                        const struct backend_norm *nm, float *out) {
    struct model *m = f->m;
    const struct backend_weight parts[2] = {dm->gate, dm->up};
    const struct backend_stack gu = {.cat = dm->gate_up, .parts = parts, .count = 2};
    m->be->ops->norm_swiglu_mlp(m->be->ctx, nm, out, m->cfg.hidden_size, &gu, &dm->down, m->act.g,
                                2 * inter, f->n);
}
