/* moe.c — the mixture-of-experts MLP of the Qwen-MoE and DeepSeek families.
 *
 * Router logits in fp32, routing per the config (softmax or sigmoid scores,
 * greedy, group-limited or DeepSeek-V3's noaux_tc with a correction bias),
 * the chosen experts' SwiGLU MLPs, and the shared expert(s): Qwen2-MoE adds
 * one shared expert scaled by a sigmoid gate; DeepSeek adds its shared
 * experts (one MLP of n_shared × moe_intermediate_size) unscaled.
 * Benchmarks may route uniformly at random instead (model_options.
 * dummy_routing) and count the experts each forward touches
 * (model_options.moe_count, read with model_moe_counts). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model_internal.h"

/* The shared expert can join the routed list as one more expert: the same
 * dtype as the routed experts, and FP8 parts that carry their own scales
 * in the routed experts' block shape (its gate and up are parts of one
 * stacked gate|up weight). Otherwise it runs as its own dense MLP. */
static int fusable_fp8(const struct mlp_moe *moe) {
    const struct backend_weight *r = &moe->gate[0], *p[3] = {&moe->shared.gate, &moe->shared.up, &moe->shared.down};
    for (int i = 0; i < 3; i++) {
        if (p[i]->dtype != r->dtype) return 0;
        if (r->dtype == DTYPE_F8_E4M3 &&
            (!p[i]->scale || p[i]->block_rows != r->block_rows || p[i]->block_cols != r->block_cols))
            return 0;
    }
    return 1;
}

int moe_load(struct weight_source *ws, int l, const struct moe_kind *kind, struct mlp_moe *moe,
             struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, E = c->n_experts, F = c->moe_intermediate_size;
    /* Tensor parallel: every expert's intermediate columns split like a
     * dense MLP's (F is the rank's share); expert parallel: the rank's
     * experts [e0, e0 + El) whole, the others not loaded. The router is
     * whole on every rank, so every rank routes the same. */
    int ep = c->shard.ep_size > 1;
    long e0 = ep ? c->shard.expert0 : 0, El = ep ? c->shard.n_experts : E, Fw = ep ? F : F * model_tp(c);
    struct ws_slice gu_sl, down_sl;
    const struct ws_slice *gu_part = ep ? NULL : ws_split(&gu_sl, c, 0, F);
    const struct ws_slice *dn_part = ep ? NULL : ws_split(&down_sl, c, 1, F);
    char name[256], prefix[128];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", l);
    snprintf(name, sizeof name, "%s.gate.weight", prefix);
    if (ws_matrix(ws, name, E, d, NULL, &moe->router, err)) return -1;
    if (c->has_score_correction_bias) {
        snprintf(name, sizeof name, "%s.gate.e_score_correction_bias", prefix);
        if (ws_vector(ws, name, E, NAN, &moe->correction_bias, err)) return -1;
    }
    moe->gate = model_own(m, xcalloc((size_t)El, sizeof *moe->gate));
    moe->up = model_own(m, xcalloc((size_t)El, sizeof *moe->up));
    moe->down = model_own(m, xcalloc((size_t)El, sizeof *moe->down));
    for (long i = 0; i < El; i++) {
        long e = e0 + i;
        snprintf(name, sizeof name, "%s.experts.%ld.gate_proj.weight", prefix, e);
        if (ws_proj(ws, name, Fw, d, gu_part, &moe->gate[i], err)) return -1;
        snprintf(name, sizeof name, "%s.experts.%ld.up_proj.weight", prefix, e);
        if (ws_proj(ws, name, Fw, d, gu_part, &moe->up[i], err)) return -1;
        snprintf(name, sizeof name, "%s.experts.%ld.down_proj.weight", prefix, e);
        if (ws_proj(ws, name, d, Fw, dn_part, &moe->down[i], err)) return -1;
    }
    moe->experts = (struct moe_experts){.n_experts = (int)El, .hidden = (int)d, .inter = (int)F,
                                        .gate = moe->gate, .up = moe->up, .down = moe->down,
                                        .first = (int)e0};
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
        .uniform = m->route_uniform,
        .layer = l,
    };
    if (kind->shared_summed && c->n_shared_experts > 0) {
        snprintf(name, sizeof name, "%s.shared_experts", prefix);
        moe->shared_inter = moe_shared_inter(c);
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
         * have to be split by columns) stay separate. Tensor parallel
         * keeps it: the shared expert's columns split like the routed
         * ones', same shapes; expert parallel does not fuse (m->fuse_shared
         * is off: the routed experts are whole, the shared one split). */
        if (m->fuse_shared && c->n_shared_experts == 1 && fusable_fp8(moe)) {
            KILN_ASSERT(!ep && moe->shared_inter == F);
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
        moe->shared_inter = moe_shared_inter(c);
        if (dense_load(ws, name, moe->shared_inter, &moe->shared, err)) return -1;
        /* whole on every rank: sigmoid(x · gate) scales the shared MLP's
         * output row by row, so it scales each rank's partial sum alike */
        snprintf(name, sizeof name, "%s.shared_expert_gate.weight", prefix);
        if (ws_matrix(ws, name, 1, d, NULL, &moe->shared_gate, err)) return -1;
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
        model_norm(f, nm);
        moe_forward(f, &L->moe, nm->x, out);
    } else {
        dense_forward_norm(f, &L->dense, m->cfg.intermediate_size, nm, out);
    }
}

/* The shared expert's MLP into act.shared (and Qwen2-MoE's gate logit
 * into act.gate1). */
static void moe_shared(const struct fwd *f, const struct mlp_moe *moe, const float *x) {
    struct model *m = f->m;
    dense_forward(f, &moe->shared, moe->shared_inter, x, m->act.shared);
    if (moe->shared_gate.data)
        m->be->ops->matmul(m->be->ctx, m->act.gate1, 1, x, m->cfg.hidden_size, &moe->shared_gate, NULL, f->n);
}

/* The step's routing to the trace (model_set_route_trace). */
static void moe_trace(struct model *m, const struct mlp_moe *moe, const struct moe_route_params *rp, long n,
                      long E, int k) {
    float *lg = xmalloc((size_t)(n * E) * sizeof *lg);
    int32_t *ids = xmalloc((size_t)(n * k) * sizeof *ids);
    m->be->ops->download(m->be->ctx, lg, m->act.router, (size_t)(n * E) * sizeof *lg);
    m->be->ops->download(m->be->ctx, ids, m->act.moe_ids, (size_t)(n * k) * sizeof *ids);
    m->route_trace.fn(m->route_trace.user, rp->layer, n, (int)E, k, lg, ids, rp, moe->correction_bias);
    free(lg);
    free(ids);
}

void model_set_route_trace(struct model *m, const struct model_route_trace *t) {
    m->route_trace = t ? *t : (struct model_route_trace){0};
}

void moe_forward(const struct fwd *f, const struct mlp_moe *moe, const float *x, float *out) {
    struct model *m = f->m;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = m->cfg.hidden_size, E = moe->route.n_experts;
    int k = moe->route.top_k + moe->route.n_fused;
    struct moe_route_params rp = moe->route;
    if (rp.uniform) rp.key_slot = f->slot, rp.key_pos = f->pos;
    rp.count = moe->count[f->bb->n_tokens == f->bb->n_seqs ? 0 : 1];
    int shared = moe->has_shared && !moe->shared_fused;
    /* Dual stream (backends that have one, small steps): the shared
     * expert's MLP runs beside the routed chain and joins before the add. */
    int side = shared && ops->side_begin && ops->side_begin(ctx, n);
    if (side) {
        moe_shared(f, moe, x);
        ops->side_end(ctx);
    }
    ops->matmul(ctx, m->act.router, E, x, d, &moe->router, moe->router_bias, n);
    ops->moe_route(ctx, m->act.moe_ids, m->act.moe_w, m->act.router, moe->correction_bias, &rp, n);
    if (m->route_trace.fn) moe_trace(m, moe, &rp, n, E, k);
    ops->moe_ffn(ctx, out, x, m->act.moe_ids, m->act.moe_w, k, &moe->experts, n);
    if (!shared) return;
    if (side) ops->side_join(ctx);
    else moe_shared(f, moe, x);
    if (moe->shared_gate.data) {
        ops->gated_add(ctx, out, m->act.shared, m->act.gate1, 1, n, d);
    } else {
        ops->add(ctx, out, m->act.shared, n * d);
    }
}

int model_routing_parse(const char *name, enum model_routing *out) {
    if (!strcmp(name, "model")) *out = MODEL_ROUTING_MODEL;
    else if (!strcmp(name, "uniform")) *out = MODEL_ROUTING_UNIFORM;
    else return -1;
    return 0;
}

int model_moe_layers(const struct model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) n += m->layers[l].mlp_kind == LAYER_MLP_MOE;
    return n;
}

static size_t weight_bytes(const struct backend_weight *w) { return w->data ? backend_weight_bytes(w) : 0; }

int moe_finish_load(struct model *m, struct kiln_error *err) {
    int n = model_moe_layers(m);
    if (m->route_uniform && n)
        log_warn("--dummy-routing uniform: the %d MoE layers route every token to uniformly random experts, "
                 "a benchmark tool: outputs are meaningless", n);
    else if (m->route_uniform)
        log_warn("--dummy-routing uniform: the model has no MoE layers, nothing changes");
    const struct backend_ops *ops = m->be->ops;
    for (int l = 0; ops->moe_experts_refuse && l < m->cfg.n_layers; l++) {
        if (m->layers[l].mlp_kind != LAYER_MLP_MOE) continue;
        const struct moe_experts *e = &m->layers[l].moe.experts;
        const char *why = ops->moe_experts_refuse(m->be->ctx, e);
        if (why)
            return kiln_errorf(err, "layer %d: the %s experts (%d, hidden %d, inter %d) cannot run on the %s backend: %s",
                               l, dtype_name(e->gate[0].dtype), e->n_experts, e->hidden, e->inter, ops->name, why);
    }
    if (!m->moe_count || !n) return 0;
    /* a record and its flags per layer and kind of step, 16-byte aligned */
    m->moe_count_stride = (sizeof(struct moe_route_count) + (size_t)m->cfg.n_experts * 4 + 15) & ~(size_t)15;
    m->moe_counts = m->be->ops->alloc(m->be->ctx, m->moe_count_stride * 2 * (size_t)n);
    if (!m->moe_counts)
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the MoE counts");
    for (int l = 0, i = 0; l < m->cfg.n_layers; l++) {
        struct mlp_moe *moe = &m->layers[l].moe;
        if (m->layers[l].mlp_kind != LAYER_MLP_MOE) continue;
        for (int k = 0; k < 2; k++, i++)
            moe->count[k] = (struct moe_route_count *)((char *)m->moe_counts + (size_t)i * m->moe_count_stride);
    }
    return 0;
}

void moe_free(struct model *m) {
    if (m->moe_counts) m->be->ops->free(m->be->ctx, m->moe_counts);
    m->moe_counts = NULL;
}

int model_moe_count_set(struct model *m, int on, int reset) {
    if (!m->moe_counts) return -1;
    const struct backend_ops *ops = m->be->ops;
    size_t bytes = m->moe_count_stride * 2 * (size_t)model_moe_layers(m);
    char *h = xcalloc(1, bytes);
    if (!reset) ops->download(m->be->ctx, h, m->moe_counts, bytes);
    for (size_t off = 0; off < bytes; off += m->moe_count_stride) ((struct moe_route_count *)(h + off))->enabled = on;
    ops->upload(m->be->ctx, m->moe_counts, h, bytes);
    ops->synchronize(m->be->ctx);
    free(h);
    return 0;
}

int model_moe_counts(struct model *m, struct model_moe_layer *out, int max) {
    if (!m->moe_counts) return 0;
    int n = model_moe_layers(m);
    KILN_ASSERT(max >= n);
    size_t bytes = m->moe_count_stride * 2 * (size_t)n;
    char *h = xmalloc(bytes);
    m->be->ops->download(m->be->ctx, h, m->moe_counts, bytes);
    for (int l = 0, i = 0; l < m->cfg.n_layers; l++) {
        const struct mlp_moe *moe = &m->layers[l].moe;
        if (m->layers[l].mlp_kind != LAYER_MLP_MOE) continue;
        struct model_moe_layer *o = &out[i];
        *o = (struct model_moe_layer){.layer = l, .n_experts = moe->route.n_experts, .top_k = moe->route.top_k};
        o->expert_bytes = weight_bytes(&moe->gate[0]) + weight_bytes(&moe->up[0]) + weight_bytes(&moe->down[0]);
        if (moe->has_shared)
            o->shared_bytes = weight_bytes(&moe->shared.gate) + weight_bytes(&moe->shared.up) +
                              weight_bytes(&moe->shared.down) + weight_bytes(&moe->shared_gate);
        struct model_moe_steps *dst[2] = {&o->decode, &o->other};
        for (int k = 0; k < 2; k++) {
            const struct moe_route_count *c =
                (const struct moe_route_count *)(h + (size_t)(2 * i + k) * m->moe_count_stride);
            *dst[k] = (struct model_moe_steps){.calls = (long)c->calls, .sum = c->sum, .rows = c->rows,
                                               .min = c->min, .max = c->max};
        }
        i++;
    }
    free(h);
    return n;
}

static void report_steps(FILE *out, const char *what, const struct model_moe_steps *s, const struct model_moe_layer *c) {
    if (!s->calls) {
        fprintf(out, "; %s: none", what);
        return;
    }
    double mean = (double)s->sum / (double)s->calls;
    fprintf(out, "; %s: %.1f (min %d, max %d) over %ld steps of %.1f rows, %.3f MB/step", what, mean, s->min,
            s->max, s->calls, (double)s->rows / (double)s->calls, mean * (double)c->expert_bytes / 1e6);
}

struct model_moe_totals model_moe_report(FILE *out, const struct model_moe_layer *c, int n) {
    struct model_moe_totals t = {0};
    if (n > 0) t.decode_steps = c[0].decode.calls, t.other_steps = c[0].other.calls;
    for (int i = 0; i < n; i++) {
        const struct model_moe_layer *l = &c[i];
        fprintf(out, "MoE layer %d: experts touched of %d (top %d), %.3f MB each", l->layer, l->n_experts, l->top_k,
                (double)l->expert_bytes / 1e6);
        report_steps(out, "decode", &l->decode, l);
        report_steps(out, "prefill/mixed", &l->other, l);
        if (l->shared_bytes) fprintf(out, "; shared %.3f MB/step", (double)l->shared_bytes / 1e6);
        fprintf(out, "\n");
        if (l->decode.calls) t.decode_bytes += (double)l->decode.sum / (double)l->decode.calls * (double)l->expert_bytes;
        if (l->other.calls) t.other_bytes += (double)l->other.sum / (double)l->other.calls * (double)l->expert_bytes;
        t.shared_bytes += (double)l->shared_bytes;
        t.routed_bytes += (double)l->n_experts * (double)l->expert_bytes;
    }
    if (t.decode_steps)
        fprintf(out, "expert bytes read per decode step: %.4f GB of routed experts (mean of %ld steps; all routed "
                     "experts: %.4f GB) + %.4f GB of shared experts\n",
                t.decode_bytes / 1e9, t.decode_steps, t.routed_bytes / 1e9, t.shared_bytes / 1e9);
    if (t.other_steps)
        fprintf(out, "expert bytes read per prefill/mixed step: %.4f GB of routed experts (mean of %ld steps)\n",
                t.other_bytes / 1e9, t.other_steps);
    return t;
}
