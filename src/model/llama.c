/* llama.c — the llama-like family: multi-head attention with GQA (Llama,
 * Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm) and the SwiGLU MLP.
 * The Qwen MoE models reuse this attention. */
#include <math.h>
#include <stdio.h>

#include "base/error.h"
#include "model/model_internal.h"

int mha_load(struct weight_source *ws, int l, struct attn_mha *a, struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    long d = c->hidden_size, hd = c->head_dim, qw = (long)c->n_heads * hd,
         kw = (long)c->n_kv_heads * hd;
    char name[256];
#define P(suffix) (snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, suffix), name)
    if (ws_matrix(ws, P("q_proj.weight"), qw, d, &a->wq, err) ||
        ws_matrix(ws, P("k_proj.weight"), kw, d, &a->wk, err) ||
        ws_matrix(ws, P("v_proj.weight"), kw, d, &a->wv, err) ||
        ws_matrix(ws, P("o_proj.weight"), d, qw, &a->wo, err))
        return -1;
    if (c->attention_bias &&
        (ws_vector(ws, P("q_proj.bias"), qw, NAN, &a->bq, err) ||
         ws_vector(ws, P("k_proj.bias"), kw, NAN, &a->bk, err) ||
         ws_vector(ws, P("v_proj.bias"), kw, NAN, &a->bv, err)))
        return -1;
    if (c->o_proj_bias && ws_vector(ws, P("o_proj.bias"), d, NAN, &a->bo, err)) return -1;
    if (c->qk_norm && (ws_vector(ws, P("q_norm.weight"), hd, 1.0f, &a->q_norm, err) ||
                       ws_vector(ws, P("k_norm.weight"), hd, 1.0f, &a->k_norm, err)))
        return -1;
#undef P
    return 0;
}

void mha_forward(const struct fwd *f, int l, const struct attn_mha *a, const float *x, float *out) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = c->hidden_size, hd = c->head_dim, H = c->n_heads, KH = c->n_kv_heads;
    long qw = H * hd, kw = KH * hd;
    float *q = m->act.q, *k = m->act.k, *v = m->act.v, *att = m->act.att;
    float eps = (float)c->rms_norm_eps;

    ops->matmul(ctx, q, qw, x, d, &a->wq, a->bq, n);
    ops->matmul(ctx, k, kw, x, d, &a->wk, a->bk, n);
    ops->matmul(ctx, v, kw, x, d, &a->wv, a->bv, n);
    if (a->q_norm) {
        ops->rmsnorm(ctx, q, hd, q, hd, a->q_norm, n * H, hd, eps);
        ops->rmsnorm(ctx, k, hd, k, hd, a->k_norm, n * KH, hd, eps);
    }
    ops->rope(ctx, q, qw, n, (int)H, hd, m->rope_dim, f->pos, m->rope_table, c->rope.interleaved);
    ops->rope(ctx, k, kw, n, (int)KH, hd, m->rope_dim, f->pos, m->rope_table, c->rope.interleaved);
    ops->kv_store(ctx, f->kv->k[l], kw, k, kw, kw, f->slot, n);
    ops->kv_store(ctx, f->kv->v[l], kw, v, kw, kw, f->slot, n);
    struct attn_params p = {.n_heads = (int)H, .n_kv_heads = (int)KH, .dk = (int)hd,
                            .dv = (int)hd, .k_stride = kw, .v_stride = kw, .scale = m->attn_scale};
    ops->attention(ctx, att, qw, q, qw, f->kv->k[l], f->kv->v[l], &p, f->bb);
    ops->matmul(ctx, out, d, att, qw, &a->wo, a->bo, n);
}

int dense_load(struct weight_source *ws, const char *prefix, long inter, struct mlp_dense *dm,
               struct kiln_error *err) {
    long d = ws->m->cfg.hidden_size;
    char name[256];
#define P(suffix) (snprintf(name, sizeof name, "%s.%s", prefix, suffix), name)
    if (ws_matrix(ws, P("gate_proj.weight"), inter, d, &dm->gate, err) ||
        ws_matrix(ws, P("up_proj.weight"), inter, d, &dm->up, err) ||
        ws_matrix(ws, P("down_proj.weight"), d, inter, &dm->down, err))
        return -1;
#undef P
    return 0;
}

void dense_forward(const struct fwd *f, const struct mlp_dense *dm, long inter, const float *x,
                   float *out) {
    struct model *m = f->m;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = m->cfg.hidden_size;
    float *g = m->act.g, *u = m->act.u;
    ops->matmul(ctx, g, inter, x, d, &dm->gate, NULL, n);
    ops->matmul(ctx, u, inter, x, d, &dm->up, NULL, n);
    ops->silu_mul(ctx, g, inter, g, inter, u, inter, n, inter);
    ops->matmul(ctx, out, d, g, inter, &dm->down, NULL, n);
}
