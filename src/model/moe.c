/* moe.c — the mixture-of-experts MLP of the Qwen-MoE and DeepSeek families.
 *
 * Router logits in fp32, routing per the config (softmax or sigmoid scores,
 * greedy, group-limited or DeepSeek-V3's noaux_tc with a correction bias),
 * the chosen experts' SwiGLU MLPs, and the shared expert(s): Qwen2-MoE adds
 * one shared expert scaled by a sigmoid gate; DeepSeek adds its shared
 * experts (one MLP of n_shared × moe_intermediate_size) unscaled. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/model_internal.h"

int moe_load(struct weight_source *ws, int l, const struct moe_kind *kind, struct mlp_moe *moe,
             struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, E = c->n_experts, F = c->moe_intermediate_size;
    char name[256], prefix[128];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", l);
    snprintf(name, sizeof name, "%s.gate.weight", prefix);
    if (ws_matrix(ws, name, E, d, &moe->router, err)) return -1;
    if (c->has_score_correction_bias) {
        snprintf(name, sizeof name, "%s.gate.e_score_correction_bias", prefix);
        if (ws_vector(ws, name, E, NAN, &moe->correction_bias, err)) return -1;
    }
    moe->gate = model_own(m, xcalloc((size_t)E, sizeof *moe->gate));
    moe->up = model_own(m, xcalloc((size_t)E, sizeof *moe->up));
    moe->down = model_own(m, xcalloc((size_t)E, sizeof *moe->down));
    for (long e = 0; e < E; e++) {
        snprintf(name, sizeof name, "%s.experts.%ld.gate_proj.weight", prefix, e);
        if (ws_matrix(ws, name, F, d, &moe->gate[e], err)) return -1;
        snprintf(name, sizeof name, "%s.experts.%ld.up_proj.weight", prefix, e);
        if (ws_matrix(ws, name, F, d, &moe->up[e], err)) return -1;
        snprintf(name, sizeof name, "%s.experts.%ld.down_proj.weight", prefix, e);
        if (ws_matrix(ws, name, d, F, &moe->down[e], err)) return -1;
    }
    moe->experts = (struct moe_experts){.n_experts = (int)E, .hidden = (int)d, .inter = (int)F,
                                        .gate = moe->gate, .up = moe->up, .down = moe->down};
    moe->route = (struct moe_route_params){
        .n_experts = (int)E,
        .top_k = c->n_experts_per_tok,
        .scoring = c->scoring == MOE_SCORING_SIGMOID ? MOE_ROUTE_SIGMOID : MOE_ROUTE_SOFTMAX,
        .method = c->topk_method == MOE_TOPK_NOAUX_TC        ? MOE_ROUTE_NOAUX_TC
                  : c->topk_method == MOE_TOPK_GROUP_LIMITED ? MOE_ROUTE_GROUP_LIMITED
                                                             : MOE_ROUTE_GREEDY,
        .n_group = c->n_group > 0 ? c->n_group : 1,
        .topk_group = c->topk_group > 0 ? c->topk_group : 1,
        .renormalize = c->norm_topk_prob && (kind->renormalize_single || c->n_experts_per_tok > 1),
        .scaling = kind->scaling,
        .scale_when_renormalized = kind->scale_when_renormalized,
    };
    if (kind->shared_summed && c->n_shared_experts > 0) {
        snprintf(name, sizeof name, "%s.shared_experts", prefix);
        moe->shared_inter = (long)c->n_shared_experts * F;
        if (dense_load(ws, name, moe->shared_inter, &moe->shared, err)) return -1;
        moe->has_shared = 1;
        /* Shared-expert fusion: one shared expert has the routed
         * experts' shape, so it joins their list as expert E, chosen by
         * every token with weight 1 (the routed weights carry the scaling
         * factor already): one expert MLP call computes both, and backends
         * that group experts (the CUDA device path) run it in the same
         * grouped products. Sums in the same order as the separate MLP
         * plus the add, so results do not change. Several shared experts
         * (DeepSeek-V2's two: one MLP of 2 x F whose down projection would
         * have to be split by columns) stay separate. */
        if (m->fuse_shared && c->n_shared_experts == 1) {
            struct backend_weight *g = model_own(m, xcalloc((size_t)E + 1, sizeof *g));
            struct backend_weight *u = model_own(m, xcalloc((size_t)E + 1, sizeof *u));
            struct backend_weight *dn = model_own(m, xcalloc((size_t)E + 1, sizeof *dn));
            memcpy(g, moe->gate, (size_t)E * sizeof *g);
            memcpy(u, moe->up, (size_t)E * sizeof *u);
            memcpy(dn, moe->down, (size_t)E * sizeof *dn);
            g[E] = moe->shared.gate, u[E] = moe->shared.up, dn[E] = moe->shared.down;
            moe->gate = g, moe->up = u, moe->down = dn;
            moe->experts = (struct moe_experts){.n_experts = (int)E + 1, .hidden = (int)d, .inter = (int)F,
                                                .gate = g, .up = u, .down = dn};
            moe->route.n_fused = 1;
            moe->shared_fused = 1;
        }
    } else if (!kind->shared_summed && c->shared_expert_intermediate_size > 0) {
        snprintf(name, sizeof name, "%s.shared_expert", prefix);
        moe->shared_inter = c->shared_expert_intermediate_size;
        if (dense_load(ws, name, moe->shared_inter, &moe->shared, err)) return -1;
        snprintf(name, sizeof name, "%s.shared_expert_gate.weight", prefix);
        if (ws_matrix(ws, name, 1, d, &moe->shared_gate, err)) return -1;
        moe->has_shared = 1;
    }
    return 0;
}

int mlp_load(struct weight_source *ws, int l, const struct moe_kind *kind, struct layer *L,
             struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    L->mlp_kind = model_config_layer_is_moe(c, l) ? LAYER_MLP_MOE : LAYER_MLP_DENSE;
    if (L->mlp_kind == LAYER_MLP_MOE) return moe_load(ws, l, kind, &L->moe, err);
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.mlp", l);
    return dense_load(ws, name, c->intermediate_size, &L->dense, err);
}

/* The MoE path normalises on its own (its products read xn several
 * times); a dense MLP takes the norm along (norm_swiglu_mlp). */
void mlp_forward_norm(const struct fwd *f, const struct layer *L, const struct backend_norm *nm,
                      float *out) {
    struct model *m = f->m;
    if (L->mlp_kind == LAYER_MLP_MOE) {
        m->be->ops->add_rmsnorm(m->be->ctx, nm->h, nm->delta, nm->x, nm->w, f->n, nm->dim, nm->eps);
        moe_forward(f, &L->moe, nm->x, out);
    } else {
        dense_forward_norm(f, &L->dense, m->cfg.intermediate_size, nm, out);
    }
}

void moe_forward(const struct fwd *f, const struct mlp_moe *moe, const float *x, float *out) {
    struct model *m = f->m;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = m->cfg.hidden_size, E = moe->route.n_experts;
    int k = moe->route.top_k + moe->route.n_fused;
    ops->matmul(ctx, m->act.router, E, x, d, &moe->router, NULL, n);
    ops->moe_route(ctx, m->act.moe_ids, m->act.moe_w, m->act.router, moe->correction_bias,
                   &moe->route, n);
    ops->moe_ffn(ctx, out, x, m->act.moe_ids, m->act.moe_w, k, &moe->experts, n);
    if (!moe->has_shared || moe->shared_fused) return;
    dense_forward(f, &moe->shared, moe->shared_inter, x, m->act.shared);
    if (moe->shared_gate.data) {
        ops->matmul(ctx, m->act.gate1, 1, x, d, &moe->shared_gate, NULL, n);
        ops->gated_add(ctx, out, m->act.shared, m->act.gate1, 1, n, d);
    } else {
        ops->add(ctx, out, m->act.shared, n * d);
    }
}
