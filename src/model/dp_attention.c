/* dp_attention.c — data parallel attention for the MLA models
 * (model_parallel.dp_size > 1; docs/distributed.md, "DP attention").
 *
 * The tp_size ranks form dp_size groups of attn_tp = tp_size / dp_size
 * consecutive ranks. Each group holds the whole attention of every layer
 * (its heads split over the group's ranks when attn_tp > 1) and computes
 * it for its own sequences only (batch.seq_group), writing only their
 * latent KV rows; everything else (embedding, MLPs, lm_head) is split over
 * all tp_size ranks as under tensor parallel, over every row of the step.
 *
 * Every rank holds the step's whole batch (rank 0 broadcasts it) and the
 * whole residual stream: the MLP's all-reduce leaves every row's output on
 * every rank. A layer's attention then runs as:
 *
 *   1. the input norm over all rows (as without DP attention);
 *   2. the group's rows of the normed input gathered into a sub-batch of
 *      its sequences (own rows, positions, KV slots and pages, staged once
 *      per step by dp_step_begin), attention and o_proj over them;
 *   3. an all-gather over all ranks of every rank's output rows, padded
 *      to M, the most rows any group has this step: recv[tp][M][hidden];
 *   4. row t of the step's delta = the sum, in rank order, of its group's
 *      ranks' partial outputs for it (one rank: a copy), so delta holds
 *      the attention output of every row on every rank, as the all-reduce
 *      of tensor parallel would, and the MLP proceeds over all rows.
 *
 * A group without sequences in a step (an IDLE batch) computes no
 * attention but still takes part in the all-gather and the MLP, so the
 * ranks' collectives stay in step. M and the rows' places come from the
 * broadcast batch, which every rank holds, so no counts are exchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "model/model_internal.h"

struct dp_attn {
    /* the step's sub-batch of this rank's group */
    long n, n_own, M;      /* rows of the step, of the group, the most of any group */
    int32_t *host;         /* host copy of the metadata below */
    int32_t *dev;          /* device metadata, `cap` ints */
    size_t cap;
    const int32_t *own;    /* [n_own] the group's rows in the step's numbering */
    const int32_t *slot;   /* [n_own] their KV slots */
    const int32_t *back;   /* [attn_tp][n] row t's place in recv, per rank of its group */
    struct batch sub;      /* the group's sequences (host arrays, for mla_attend's plan) */
    struct backend_batch bb; /* the same on the device */
    float *recv;           /* [tp][max_batch_tokens][hidden] device */
    float *tmp;            /* [max_batch_tokens][hidden] device: attn_tp > 1 */
};

int dp_attention_check(const struct model_config *c, const struct model_parallel *p, const char *file,
                       struct kiln_error *err) {
    int tp = p->tp_size > 1 ? p->tp_size : 1, dp = p->dp_size;
    if (dp > DP_MAX_GROUPS)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED, "the data parallel size %d is above %d", dp,
                           DP_MAX_GROUPS);
    if (tp % dp)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "the data parallel size (%d) must divide the tensor parallel size (%d): "
                           "each DP attention group is tp / dp ranks",
                           dp, tp);
    if (model_family_of(c) != &family_deepseek)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "%s: DP attention needs multi-head latent attention (DeepSeek-V2/V3), "
                           "not model_type %s: its latent KV is what each group keeps for its own "
                           "sequences",
                           file, c->model_type);
    if (p->dp_rank != p->tp_rank / (tp / dp))
        return kiln_errorc(err, KILN_ERR_BAD_INPUT,
                           "rank %d belongs to DP attention group %d of %d, not %d", p->tp_rank,
                           p->tp_rank / (tp / dp), dp, p->dp_rank);
    return 0;
}

size_t dp_act_floats(const struct model_config *c, long T) {
    if (c->shard.dp_size <= 1) return 0;
    size_t d = (size_t)c->hidden_size;
    return (size_t)T * d * ((size_t)c->shard.tp_size + (c->shard.attn_tp_size > 1));
}

int dp_reserve(struct model *m, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    if (c->shard.dp_size <= 1) return 0;
    struct dp_attn *dp = xcalloc(1, sizeof *dp);
    m->dp = dp;
    size_t rows = (size_t)m->max_batch_tokens * (size_t)c->hidden_size;
    dp->recv = m->be->ops->alloc(m->be->ctx, rows * (size_t)c->shard.tp_size * 4);
    if (c->shard.attn_tp_size > 1) dp->tmp = m->be->ops->alloc(m->be->ctx, rows * 4);
    if (!dp->recv || (c->shard.attn_tp_size > 1 && !dp->tmp))
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the DP attention gather");
    return 0;
}

void dp_free(struct model *m) {
    struct dp_attn *dp = m->dp;
    if (!dp) return;
    void *ctx = m->be->ctx;
    if (dp->recv) m->be->ops->free(ctx, dp->recv);
    if (dp->tmp) m->be->ops->free(ctx, dp->tmp);
    if (dp->dev) m->be->ops->free(ctx, dp->dev);
    free(dp->host);
    free(dp);
    m->dp = NULL;
}

static int group_of(const struct batch *b, int s) { return b->seq_group ? b->seq_group[s] : 0; }

void dp_step_begin(struct model *m, const struct model_step *s) {
    struct dp_attn *dp = m->dp;
    const struct model_config *c = &m->cfg;
    const struct batch *b = s->host;
    int G = c->shard.dp_size, g = c->shard.dp_rank, at = c->shard.attn_tp_size;
    /* the runner pads only decode graphs, which DP attention does not record */
    KILN_ASSERT(b && b->n_tokens == s->bb->n_tokens && b->n_seqs == s->bb->n_seqs);
    long n = b->n_tokens;
    int S = b->n_seqs;
    /* rows and sequences per group; a row's index within its group */
    long count[DP_MAX_GROUPS] = {0};
    KILN_ASSERT(G <= DP_MAX_GROUPS);
    int s_own = 0;
    long p_own = 0;
    for (int q = 0; q < S; q++) {
        int gq = group_of(b, q);
        KILN_ASSERT(gq >= 0 && gq < G);
        count[gq] += b->q_start[q + 1] - b->q_start[q];
        if (gq == g) s_own++, p_own += b->kv_page_start[q + 1] - b->kv_page_start[q];
    }
    long M = 0;
    for (int i = 0; i < G; i++) M = count[i] > M ? count[i] : M;
    dp->n = n, dp->n_own = count[g], dp->M = M;
    /* own[n_own] pos[n_own] slot[n_own] q_start[s_own+1] kv_len[s_own]
     * page_start[s_own+1] pages[p_own] back[at][n] */
    size_t need = (size_t)(3 * count[g] + 3 * s_own + 2 + p_own) + (size_t)at * (size_t)n;
    if (need > dp->cap) {
        if (dp->dev) m->be->ops->free(m->be->ctx, dp->dev);
        dp->cap = need * 2 > 1024 ? need * 2 : 1024;
        dp->dev = m->be->ops->alloc(m->be->ctx, dp->cap * 4);
        if (!dp->dev) {
            fprintf(stderr, "kiln: rank %d: out of device memory for a DP attention step\n",
                    c->shard.tp_rank);
            exit(1);
        }
        free(dp->host);
        dp->host = xmalloc(dp->cap * 4);
    }
    int32_t *h = dp->host, *own = h, *pos = own + count[g], *slot = pos + count[g],
            *qs = slot + count[g], *kvl = qs + s_own + 1, *ps = kvl + s_own, *pages = ps + s_own + 1,
            *back = pages + p_own;
    long seen[DP_MAX_GROUPS] = {0}, ro = 0;
    int so = 0;
    long po = 0;
    for (int q = 0; q < S; q++) {
        int gq = group_of(b, q);
        long r0 = b->q_start[q], r1 = b->q_start[q + 1];
        for (long t = r0; t < r1; t++)
            for (int k = 0; k < at; k++) /* rank k of group gq sent this row at its place */
                back[(size_t)k * (size_t)n + (size_t)t] = (int32_t)(((long)gq * at + k) * M + seen[gq] + (t - r0));
        seen[gq] += r1 - r0;
        if (gq != g) continue;
        qs[so] = (int32_t)ro;
        kvl[so] = b->kv_len[q];
        ps[so] = (int32_t)po;
        for (int32_t pg = b->kv_page_start[q]; pg < b->kv_page_start[q + 1]; pg++) pages[po++] = b->kv_pages[pg];
        for (long t = r0; t < r1; t++, ro++) {
            own[ro] = (int32_t)t;
            pos[ro] = b->positions[t];
            slot[ro] = b->out_slot[t];
        }
        so++;
    }
    qs[so] = (int32_t)ro;
    ps[so] = (int32_t)po;
    m->be->ops->upload(m->be->ctx, dp->dev, h, need * 4);
    const int32_t *d = dp->dev;
    dp->own = d;
    dp->slot = d + (slot - h);
    dp->back = d + (back - h);
    dp->sub = (struct batch){.mode = b->mode, .n_tokens = (int)ro, .positions = pos, .out_slot = slot,
                             .n_seqs = so, .q_start = qs, .kv_len = kvl, .kv_page_start = ps,
                             .kv_pages = pages, .page_size = b->page_size};
    dp->bb = (struct backend_batch){.n_tokens = (int)ro, .n_seqs = so, .page_size = b->page_size,
                                    .positions = d + (pos - h), .q_start = d + (qs - h),
                                    .kv_page_start = d + (ps - h), .kv_pages = d + (pages - h)};
}

void dp_attention(const struct fwd *f, int l, const struct attn_mla *a, dp_attn_fn attn) {
    struct model *m = f->m;
    struct dp_attn *dp = m->dp;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long d = c->hidden_size, M = dp->M;
    if (M == 0) return; /* no rows anywhere */
    float *send = dp->recv + (size_t)c->shard.tp_rank * (size_t)M * (size_t)d;
    if (dp->n_own > 0) {
        /* the group's rows of the normed input (act.xs is free until the head) */
        ops->gather_rows(ctx, m->act.xs, m->act.xn, d, dp->own, dp->n_own);
        struct fwd sf = *f;
        sf.bb = &dp->bb;
        sf.n = dp->n_own;
        sf.pos = dp->bb.positions;
        sf.slot = dp->slot;
        sf.host = &dp->sub;
        attn(&sf, l, a, m->act.xs, send);
    }
    model_tp_gather(m, send, dp->recv, (size_t)M * (size_t)d * 4);
    /* every row from its group: its ranks' partial sums, in rank order */
    ops->gather_rows(ctx, m->act.delta, dp->recv, d, dp->back, dp->n);
    for (int k = 1; k < c->shard.attn_tp_size; k++) {
        ops->gather_rows(ctx, dp->tmp, dp->recv, d, dp->back + (size_t)k * (size_t)dp->n, dp->n);
        ops->add(ctx, m->act.delta, dp->tmp, dp->n * d);
    }
}
