/* runner_warmup.c — start-up warm-up: prefill sizes, every decode
 * bucket's graph, and the device sampler's first-use costs. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "runner/runner_internal.h"

/* Sampling parameters for warm-up row j: greedy and the configurations
 * the CPU sampler's warm-up uses, in turn. */
static void warm_params(struct backend_sample_row *row, int j) {
    memset(row, 0, sizeof *row);
    static const float temp[6] = {0, 0.7f, 1.0f, 0.8f, 1.2f, 0.6f}, top_p[6] = {1, 0.9f, 1, 0.95f, 1, 0.8f};
    static const int top_k[6] = {0, 0, 50, 40, 0, 20};
    row->temperature = temp[j % 6];
    row->top_p = top_p[j % 6];
    row->top_k = top_k[j % 6];
    row->min_p = j % 6 == 4 ? 0.05f : 0.0f;
    row->seed = (uint64_t)j;
    row->step = 1;
}

/* One-token sequences at position 0 on `page` (decode buckets) or one
 * sequence of n tokens on pages[] (prefill), all rows asking for logits so
 * the lm_head's shapes are warmed too. */
static int warm_step(struct runner *r, int n, int n_seqs, const int32_t *pages, int n_pages,
                     float *logits, int sample, struct kiln_error *err) {
    int ps = r->kv.page_size;
    int32_t *buf = xmalloc((size_t)(5 * n + 3 * (n_seqs + 1) + n_pages + n_seqs) * 4);
    int32_t *ids = buf, *pos = ids + n, *slot = pos + n, *rows = slot + n, *qs = rows + n,
            *kvl = qs + n_seqs + 1, *pst = kvl + n_seqs + 1, *pg = pst + n_seqs + 1;
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)((i * 7919 + 13) % r->vocab);
        pos[i] = n_seqs == 1 ? i : 0;
        slot[i] = n_seqs == 1 ? pages[i / ps] * ps + i % ps : pages[0] * ps;
        rows[i] = i;
    }
    for (int s = 0; s <= n_seqs; s++) {
        qs[s] = n_seqs == 1 ? (s ? n : 0) : s;
        pst[s] = n_seqs == 1 ? (s ? n_pages : 0) : s;
        if (s < n_seqs) kvl[s] = n_seqs == 1 ? n : 1;
    }
    for (int i = 0; i < n_pages; i++) pg[i] = pages[i];
    for (int s = n_pages; s < n_seqs; s++) pg[s] = pages[0];
    int rows_wanted = n < r->logit_chunk ? n : r->logit_chunk;
    struct batch b = {.mode = n_seqs == n ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = n,
                      .input_ids = ids, .positions = pos, .out_slot = slot, .n_seqs = n_seqs,
                      .q_start = qs, .kv_len = kvl, .kv_page_start = pst, .kv_pages = pg,
                      .page_size = ps, .n_logit_rows = rows_wanted, .logit_rows = rows};
    int rc;
    if (sample) { /* every row sampled on the device: graphs [1] */
        struct backend_sample_row *sr = xmalloc((size_t)rows_wanted * sizeof *sr);
        int32_t *tok = xmalloc((size_t)rows_wanted * 4);
        for (int j = 0; j < rows_wanted; j++) warm_params(&sr[j], j);
        struct runner_sampling smp = {.rows = sr};
        rc = runner_forward_sample(r, &b, &smp, tok, logits, err);
        free(sr);
        free(tok);
    } else {
        rc = runner_forward(r, &b, logits, err);
    }
    free(buf);
    return rc;
}

int runner_warmup(struct runner *r, struct kiln_error *err) {
    if (!r->be->ops->graph_begin) return 0;
    struct kv_pool *kv = &r->kv;
    double t0 = time_now();
    int ps = kv->page_size, rc = 0, n_dec = 0, n_pre = 0;
    float *logits = xmalloc((size_t)r->logit_chunk * (size_t)r->vocab * 4);
    int longest = r->max_batch_tokens < r->max_context ? r->max_batch_tokens : r->max_context;
    int n_pages = (longest + ps - 1) / ps;
    if (n_pages > kv_pool_available(kv) - 1) n_pages = kv_pool_available(kv) - 1;
    if (n_pages < 1) {
        free(logits);
        return kiln_errorf(err, "warm-up: the KV pool has no free pages");
    }
    int32_t *pages = xmalloc((size_t)n_pages * 4);
    KILN_ASSERT(kv_pool_alloc(kv, n_pages, pages) == 0);
    /* Prefill sizes first: they grow the backend's scratch to its largest,
     * and scratch moving would make graphs recorded before it stale. */
    /* prefill: every power of two up to the longest batch, and that batch */
    for (int t = 1; rc == 0; t = t * 2 < longest ? t * 2 : longest) {
        if (t > n_pages * ps) t = n_pages * ps;
        rc = warm_step(r, t, 1, pages, (t + ps - 1) / ps, logits, 0, err);
        n_pre++;
        if (t >= longest || t >= n_pages * ps) break;
    }
    r->be->ops->synchronize(r->be->ctx);
    double t1 = time_now();
    /* decode buckets: the first run is eager, the second records the graph;
     * with device sampling, both kinds (with and without the sampling tail) */
    int kinds = r->sample_on && r->graph_sample_on ? 2 : 1;
    for (int i = 0; i < RUNNER_GRAPH_BUCKETS && rc == 0; i++) {
        int s = runner_bucket_size(i);
        if (runner_bucket_for(r, s) != i) break;
        for (int kind = 0; kind < kinds; kind++)
            for (int k = 0; k < 2 && rc == 0; k++)
                rc = warm_step(r, s, s, pages, 1, logits, kind, err);
        n_dec++;
    }
    r->be->ops->synchronize(r->be->ctx);
    double t2 = time_now();
    kv_pool_release(kv, pages, n_pages);
    free(pages);
    free(logits);
    if (rc == 0)
        log_info("warm-up: %d prefill sizes (1..%d tokens) in %.2f s, %d decode buckets (1..%d "
                 "sequences, graphs recorded%s) in %.2f s",
                 n_pre, longest, t1 - t0, n_dec, runner_bucket_size(n_dec - 1),
                 kinds == 2 ? ", with and without device sampling" : "", t2 - t1);
    return rc;
}

double runner_sample_warmup(struct runner *r) {
    if (!r->sample_on) return 0;
    double t0 = time_now();
    const struct backend_ops *ops = r->be->ops;
    void *ctx = r->be->ctx;
    long V = r->vocab, rows = r->logit_chunk < r->max_seqs ? r->logit_chunk : r->max_seqs;
    /* rows like a model's: a broad bulk and a few peaks */
    float *h = xmalloc((size_t)V * 4);
    uint64_t z = 0x5eed;
    for (long i = 0; i < V; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(z >> 40) / 16777216.0 * 8.0 - 4.0) + (i % 4099 == 0 ? 15.0f : 0.0f);
    }
    struct backend_sample_row *sr = (struct backend_sample_row *)(r->stage_host + r->stage_srows_off);
    if (r->stage_busy) ops->synchronize(ctx);
    for (long j = 0; j < rows; j++) warm_params(&sr[j], (int)j);
    ops->upload(ctx, r->srows, sr, (size_t)rows * sizeof *sr);
    /* no adjustments: the rows stay as uploaded */
    for (long j = 0; j < rows; j++) ops->upload(ctx, r->logits + j * V, h, (size_t)V * 4);
    /* batch sizes 1, 2, 4, ... up to the largest decode batch */
    for (long n = 1;; n = n * 2 < rows ? n * 2 : rows) {
        ops->sample(ctx, r->stok, r->logits, V, n, V, r->srows, r->sadj);
        if (n == rows) break;
    }
    ops->synchronize(ctx);
    r->stage_busy = 0;
    free(h);
    return time_now() - t0;
}
