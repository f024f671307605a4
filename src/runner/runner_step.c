/* runner_step.c — one forward step: the batch checked and staged on the
 * device, the layers run eagerly or from a decode bucket's graph, and the
 * tail (final norm, lm_head, logits download or device sampling). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "runner/runner_internal.h"

/* The decode batch sizes graphs are recorded for: 1, 2, 4, 8, 12, then
 * every multiple of 8 up to 256. */
int runner_bucket_size(int i) { return i < 4 ? 1 << i : i == 4 ? 12 : 8 * (i - 3); }

int runner_bucket_for(const struct runner *r, long n) {
    long cap = r->max_seqs < r->max_batch_tokens ? r->max_seqs : r->max_batch_tokens;
    for (int i = 0; i < RUNNER_GRAPH_BUCKETS; i++) {
        long s = runner_bucket_size(i);
        if (s > cap) return -1;
        if (s >= n) return i;
    }
    return -1;
}

void runner_drop_graphs(struct runner *r) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < RUNNER_GRAPH_BUCKETS; i++) {
            if (r->graphs[k][i]) r->be->ops->graph_destroy(r->be->ctx, r->graphs[k][i]);
            r->graphs[k][i] = NULL;
            r->graph_warm[k][i] = 0;
        }
}

static int check_batch(const struct runner *r, const struct batch *b, struct kiln_error *err) {
    const struct kv_pool *kv = &r->kv;
    if (b->n_tokens < 0 || b->n_tokens > r->max_batch_tokens)
        return kiln_errorf(err, "batch of %d tokens exceeds the reserved %d", b->n_tokens,
                           r->max_batch_tokens);
    if (b->n_seqs < 0 || b->n_seqs > r->max_seqs)
        return kiln_errorf(err, "batch of %d sequences exceeds the reserved %d", b->n_seqs, r->max_seqs);
    if (b->page_size != kv->page_size)
        return kiln_errorf(err, "batch page size %d differs from the KV pool's %d", b->page_size,
                           kv->page_size);
    if (b->kv_page_start[b->n_seqs] > r->pages_cap)
        return kiln_errorf(err, "batch names %d KV pages, more than the reserved %ld",
                           b->kv_page_start[b->n_seqs], r->pages_cap);
    long slots = (long)kv->n_pages * kv->page_size;
    for (int i = 0; i < b->n_tokens; i++) {
        KILN_ASSERT(b->input_ids[i] >= 0 && b->input_ids[i] < r->vocab);
        KILN_ASSERT(b->positions[i] >= 0 && b->positions[i] < r->max_context);
        KILN_ASSERT(b->out_slot[i] >= 0 && b->out_slot[i] < slots);
    }
    KILN_ASSERT(b->q_start[0] == 0 && b->q_start[b->n_seqs] == b->n_tokens);
    KILN_ASSERT(!b->swa_out_slot == !b->swa_kv_pages && (!b->swa_out_slot || r->swa_window > 0));
    if (r->swa_window > 0) {
        KILN_ASSERT(b->swa_out_slot);
        long swa_slots = (long)kv->n_swa_pages * kv->page_size;
        for (int i = 0; i < b->n_tokens; i++) KILN_ASSERT(b->swa_out_slot[i] >= 0 && b->swa_out_slot[i] < swa_slots);
    }
    return 0;
}

const struct batch *runner_swa_fill(struct runner *r, const struct batch *b, struct batch *out) {
    if (r->swa_window <= 0 || b->swa_out_slot || b->mode == BATCH_MODE_IDLE || b->n_tokens == 0) return b;
    const struct kv_pool *kv = &r->kv;
    int ps = b->page_size, np = b->kv_page_start[b->n_seqs];
    KILN_ASSERT(b->n_tokens <= r->max_batch_tokens && np <= r->pages_cap);
    for (int i = 0; i < np; i++) r->swa_pages_host[i] = kv_pool_swa_page(kv, b->kv_pages[i]);
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t s = kv_pool_swa_page(kv, b->out_slot[t] / ps);
        /* a token writes where the window still reads: its page has a sliding page */
        KILN_ASSERT(s > 0);
        r->swa_slot_host[t] = s * ps + b->out_slot[t] % ps;
    }
    *out = *b;
    out->swa_out_slot = r->swa_slot_host;
    out->swa_kv_pages = r->swa_pages_host;
    return out;
}

/* Padding rows write to the pool's scratch page (taken once, when padding
 * is first needed). Returns -1 when no page is free. */
static int take_scratch_page(struct runner *r) {
    struct kv_pool *kv = &r->kv;
    if (r->follower) return kv->scratch_page >= 0 ? 0 : -1; /* rank 0's, from its step */
    if (kv->scratch_page < 0 && kv_pool_alloc(kv, 1, &kv->scratch_page)) {
        kv->scratch_page = -1;
        return -1;
    }
    return 0;
}

/* Packs the batch (padded with `pad` one-token sequences at position 0 that
 * write to the scratch page) into the staging buffer and uploads it in one
 * copy. The logit rows go in the order r->perm gives; with device
 * sampling, the parameters of the n_sample sampled rows (want_logits rows
 * first in perm, so these are perm[n_want..]) follow, then greedy ones up
 * to n_fill rows (graph padding), and the adjustments in a second copy. */
static void stage_batch(struct runner *r, const struct batch *b, int pad,
                        const struct runner_sampling *smp, int n_want, int n_fill) {
    const struct backend_ops *ops = r->be->ops;
    long T = r->max_batch_tokens, S = r->max_seqs;
    int32_t *h = r->stage_host;
    if (r->stage_busy) ops->synchronize(r->be->ctx); /* the last step's copy may still read it */
    int n = b->n_tokens, ns = b->n_seqs, np = b->kv_page_start[ns];
    int32_t *ids = h, *pos = h + T, *slot = h + 2 * T, *rows = h + 3 * T, *qs = h + 4 * T,
            *ps = qs + S + 1, *pages = h + r->stage_pages_off;
    memcpy(ids, b->input_ids, (size_t)n * 4);
    memcpy(pos, b->positions, (size_t)n * 4);
    memcpy(slot, b->out_slot, (size_t)n * 4);
    for (int j = 0; j < b->n_logit_rows; j++) rows[j] = b->logit_rows[r->perm[j]];
    memcpy(qs, b->q_start, (size_t)(ns + 1) * 4);
    memcpy(ps, b->kv_page_start, (size_t)(ns + 1) * 4);
    memcpy(pages, b->kv_pages, (size_t)np * 4);
    for (int i = 0; i < pad; i++) {
        ids[n + i] = 0;
        pos[n + i] = 0;
        slot[n + i] = r->kv.scratch_page * b->page_size;
        qs[ns + i + 1] = n + i + 1;
        ps[ns + i + 1] = np + i + 1;
        pages[np + i] = r->kv.scratch_page;
    }
    if (r->swa_window > 0) { /* the sliding slots, then the sliding pages */
        int32_t *sslot = h + r->stage_swa_off, *spages = sslot + T, scratch = KV_SWA_PAD;
        memcpy(sslot, b->swa_out_slot, (size_t)n * 4);
        memcpy(spages, b->swa_kv_pages, (size_t)np * 4);
        for (int i = 0; i < pad; i++) {
            sslot[n + i] = scratch * b->page_size;
            spages[np + i] = scratch;
        }
    }
    if (smp) {
        struct backend_sample_row *sr = (struct backend_sample_row *)(h + r->stage_srows_off);
        int n_sample = b->n_logit_rows - n_want;
        for (int j = 0; j < n_sample; j++) {
            int row = r->perm[n_want + j];
            int ms = smp->mask_slot ? smp->mask_slot[row] : -1;
            sr[j] = smp->rows[row];
            sr[j].mask = ms >= 0 ? r->smask + (size_t)ms * (size_t)r->mask_words : NULL;
        }
        if (n_fill > n_sample) memset(sr + n_sample, 0, (size_t)(n_fill - n_sample) * sizeof *sr);
        if (smp->n_adj > 0) {
            memcpy(r->sadj_host, smp->adj, (size_t)smp->n_adj * sizeof *smp->adj);
            ops->upload(r->be->ctx, r->sadj, r->sadj_host, (size_t)smp->n_adj * sizeof *smp->adj);
        }
    }
    /* one copy: everything before the page list, and the pages in use */
    ops->upload(r->be->ctx, r->stage, h, (size_t)(r->stage_pages_off + np + pad) * 4);
    if (r->swa_window > 0) /* the sliding slots [T], then the pages in use */
        ops->upload(r->be->ctx, r->swa_slot, h + r->stage_swa_off, (size_t)(T + np + pad) * 4);
    r->stage_busy = r->stage_pinned;
}

/* The step's batch on the device: bb[0] the full layers', bb[1] (a hybrid
 * pool) the sliding layers'. */
static void step_of(struct runner *r, const struct batch *b, int np, int nseq, struct backend_batch bb[2],
                    struct model_step *s) {
    bb[0] = (struct backend_batch){.n_tokens = np, .n_seqs = nseq, .page_size = b->page_size,
                                   .positions = r->pos, .q_start = r->q_start, .kv_page_start = r->page_start,
                                   .kv_pages = r->pages};
    *s = (struct model_step){.bb = &bb[0], .ids = r->ids, .slot = r->slot, .host = b};
    if (r->swa_window > 0) {
        bb[1] = bb[0];
        bb[1].kv_pages = r->swa_pages;
        s->swa_bb = &bb[1];
        s->swa_slot = r->swa_slot;
    }
}

void runner_stage_plain(struct runner *r, const struct batch *b, struct backend_batch bb[2], struct model_step *s) {
    for (int j = 0; j < b->n_logit_rows; j++) r->perm[j] = j;
    stage_batch(r, b, 0, NULL, b->n_logit_rows, 0);
    step_of(r, b, b->n_tokens, b->n_seqs, bb, s);
}

/* Final norm, lm_head and sampling of all np rows of the residual stream
 * (a decode batch, padding included): what graphs [1] record after the
 * layers. */
static void sample_tail(struct runner *r, long np) {
    const struct backend_ops *ops = r->be->ops;
    void *ctx = r->be->ctx;
    long V = r->vocab;
    if (np <= r->logit_chunk) { /* one product */
        model_norm_lm_head(r->m, r->logits, np);
        ops->sample(ctx, r->stok, r->logits, V, np, V, r->srows, r->sadj);
        return;
    }
    model_final_norm(r->m, NULL, np);
    for (long r0 = 0; r0 < np; r0 += r->logit_chunk) {
        long n = np - r0 < r->logit_chunk ? np - r0 : r->logit_chunk;
        model_lm_head(r->m, r->logits, r0, n);
        ops->sample(ctx, r->stok + r0, r->logits, V, n, V, r->srows + r0, r->sadj);
    }
}

static void run_step(struct runner *r, const struct model_step *s, int kind) {
    model_forward_layers(r->m, &r->kv, s);
    if (kind) sample_tail(r, s->bb->n_tokens);
}

static int forward_body(struct runner *r, const struct batch *b, const struct runner_sampling *smp,
                        int32_t *tokens, float *logits, struct kiln_error *err) {
    if (b->mode == BATCH_MODE_IDLE || b->n_tokens == 0) return 0;
    struct batch filled;
    b = runner_swa_fill(r, b, &filled);
    if (check_batch(r, b, err)) return -1;
    const struct backend_ops *ops = r->be->ops;
    void *ctx = r->be->ctx;
    long n = b->n_tokens, V = r->vocab;
    int n_lr = b->n_logit_rows, n_want = n_lr;
    if (n_lr < 0 || n_lr > r->max_batch_tokens)
        return kiln_errorf(err, "batch asks for %d logit rows, more than the reserved %d", n_lr,
                           r->max_batch_tokens);
    if (smp) {
        if (!r->sample_on) return kiln_errorf(err, "runner_forward_sample: the backend does not sample");
        n_want = 0;
        for (int j = 0; j < n_lr; j++) n_want += smp->want_logits && smp->want_logits[j];
        if (n_lr - n_want > r->max_seqs)
            return kiln_errorf(err, "%d rows to sample on the device, more than the reserved %d",
                               n_lr - n_want, r->max_seqs);
        if (smp->n_adj < 0 || smp->n_adj > r->adj_cap)
            return kiln_errorf(err, "%d sampling adjustments, more than the reserved %d", smp->n_adj,
                               r->adj_cap);
        if (smp->n_mask_slots < 0 || smp->n_mask_slots > r->max_seqs)
            return kiln_errorf(err, "%d grammar mask slots, more than the reserved %d", smp->n_mask_slots,
                               r->max_seqs);
        for (int j = 0; j < n_lr; j++) {
            const struct backend_sample_row *sr = &smp->rows[j];
            if (smp->want_logits && smp->want_logits[j]) continue;
            KILN_ASSERT(sr->n_adj >= 0 && sr->adj_start >= 0 && sr->adj_start + sr->n_adj <= smp->n_adj);
            KILN_ASSERT(!smp->mask_slot || smp->mask_slot[j] < smp->n_mask_slots);
        }
    }
    if (r->pp) { /* pipeline stages: a step of their own, heard of first */
        if (smp) return kiln_errorf(err, "pipeline parallel: the logits are sampled on the host only");
        if (r->lead && runner_lead_step(r, b, NULL, err)) return -1;
        return runner_pp_step(r, b, logits, err);
    }
    int n_sample = n_lr - n_want;
    /* rows that want logits first (their logits download as one block) */
    for (int j = 0, w = 0, sj = n_want; j < n_lr; j++) {
        if (!smp || (smp->want_logits && smp->want_logits[j])) r->perm[w++] = j;
        else r->perm[sj++] = j;
    }

    /* Decode steps (one token per sequence) replay a graph recorded for the
     * next bucket size, padded with one-token sequences. */
    int gi = -1, pad = 0;
    if (r->graphs_on && b->n_tokens == b->n_seqs && (gi = runner_bucket_for(r, n)) >= 0) {
        pad = runner_bucket_size(gi) - (int)n;
        if ((pad > 0 && take_scratch_page(r)) || b->kv_page_start[b->n_seqs] + pad > r->pages_cap) {
            gi = -1;
            pad = 0;
        }
    }
    /* A decode step whose every row samples on the device runs the whole
     * step, sampling included, from graphs [1]. */
    /* A step with grammar masks keeps its tail out of the graph: the masks
     * are computed while the layers run and uploaded before the sampler. */
    int masked = smp && smp->fill_masks;
    int kind = smp && !masked && gi >= 0 && n_want == 0 && n_lr == n && r->graph_sample_on;
    for (int j = 0; kind && j < n_lr; j++) kind = b->logit_rows[j] == j;
    /* the other ranks run this step too: they hear of it before it runs */
    if (r->lead && runner_lead_step(r, b, smp, err)) return -1;
    stage_batch(r, b, pad, smp, n_want, kind ? (int)n + pad : n_sample);
    long np = n + pad;
    struct backend_batch bb[2];
    struct model_step s;
    step_of(r, b, (int)np, b->n_seqs + pad, bb, &s);
    if (gi < 0) {
        model_forward_layers(r->m, &r->kv, &s);
    } else if (r->graphs[kind][gi]) {
        if (ops->graph_launch(ctx, r->graphs[kind][gi])) { /* stale: scratch moved */
            runner_drop_graphs(r);
            run_step(r, &s, kind);
            r->graph_warm[kind][gi] = 1;
        }
    } else if (!r->graph_warm[kind][gi]) {
        /* the first step of a size runs eagerly: scratch and library state
         * settle before anything is recorded */
        run_step(r, &s, kind);
        r->graph_warm[kind][gi] = 1;
    } else {
        ops->graph_begin(ctx);
        run_step(r, &s, kind);
        r->graphs[kind][gi] = ops->graph_end(ctx);
        if (!r->graphs[kind][gi] || ops->graph_launch(ctx, r->graphs[kind][gi])) {
            log_warn("runner: recording a decode graph failed; running without graphs");
            runner_drop_graphs(r);
            r->graphs_on = 0;
            run_step(r, &s, kind);
        }
    }
    if (masked) {
        /* the device runs the layers meanwhile; the upload is queued after
         * them and before the sampling kernels (one stream) */
        smp->fill_masks(smp->fill_user);
        if (smp->n_mask_slots > 0 && r->smask)
            ops->upload(ctx, r->smask, r->smask_host,
                        (size_t)smp->n_mask_slots * (size_t)r->mask_words * 4);
    }
    if (kind) {
        ops->download(ctx, r->stok_host, r->stok, (size_t)n * 4);
        if (tokens) memcpy(tokens, r->stok_host, (size_t)n * 4);
        r->stage_busy = 0;
        return 0;
    }

    if (n_lr == 0) return 0;
    /* only the rows that need logits go through the final norm and lm_head */
    model_final_norm(r->m, r->rows, n_lr);
    for (long r0 = 0; r0 < n_lr; r0 += r->logit_chunk) {
        long rn = n_lr - r0 < r->logit_chunk ? n_lr - r0 : r->logit_chunk;
        model_lm_head(r->m, r->logits, r0, rn);
        if (r0 < n_want && logits) { /* a follower (logits NULL) drops them */
            long w = n_want - r0 < rn ? n_want - r0 : rn;
            ops->download(ctx, logits + r0 * V, r->logits, (size_t)(w * V) * 4);
        }
        long lo = r0 > n_want ? r0 : n_want;
        if (lo < r0 + rn)
            ops->sample(ctx, r->stok + (lo - n_want), r->logits + (lo - r0) * V, V, r0 + rn - lo, V,
                        r->srows + (lo - n_want), r->sadj);
    }
    if (n_sample) {
        ops->download(ctx, r->stok_host, r->stok, (size_t)n_sample * 4);
        for (int j = 0; tokens && j < n_sample; j++) tokens[r->perm[n_want + j]] = r->stok_host[j];
    }
    r->stage_busy = 0; /* a download waited for the stream */
    return 0;
}

/* The step, then whether the backend could run all of it
 * (backend_ops.step_status): an operation that could not get device
 * memory skipped its work, so the step fails and what it wrote (logits, tokens, the
 * batch's KV slots) is garbage the caller discards. The backend gave its
 * grow-on-demand scratch back, which makes recorded graphs stale, and a
 * size whose eager first run failed must run eagerly again before it is
 * recorded: the graphs go. */
int runner_forward_impl(struct runner *r, const struct batch *b, const struct runner_sampling *smp,
                        int32_t *tokens, float *logits, struct kiln_error *err) {
    int rc = forward_body(r, b, smp, tokens, logits, err);
    const struct backend_ops *ops = r->be->ops;
    struct kiln_error st = {0};
    if (ops->step_status && ops->step_status(r->be->ctx, &st)) {
        runner_drop_graphs(r);
        if (rc == 0 && err) *err = st;
        return -1;
    }
    return rc;
}

int runner_forward(struct runner *r, const struct batch *b, float *logits, struct kiln_error *err) {
    return runner_forward_impl(r, b, NULL, NULL, logits, err);
}

int runner_forward_sample(struct runner *r, const struct batch *b, const struct runner_sampling *s,
                          int32_t *tokens, float *logits, struct kiln_error *err) {
    return runner_forward_impl(r, b, s, tokens, logits, err);
}
