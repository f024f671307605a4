/* cpu_attention.c — causal attention over the paged KV cache.
 *
 * One (token, head) pair at a time, split across threads. Each query row
 * scans its own sequence's positions 0..pos in order: scores, then a max, an
 * exp-sum and the weighted sum of values, all in position order. That order
 * depends only on the row's own position, never on the batch or on how the
 * prompt was chunked, so results are batch-invariant (docs/design.md, "On the
 * CPU"). */
#include <math.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/threadpool.h"

struct attn_job {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const float *k_cache, *v_cache;
    const struct attn_params *p;
    const struct backend_batch *b;
    float *scratch; /* [nth][max_context] */
    long max_context;
};

static int seq_of_token(const struct backend_batch *b, long t) {
    int lo = 0, hi = b->n_seqs - 1; /* last s with q_start[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[k + l] * b[k + l];
    for (; k < n; k++) acc[k & 7] += a[k] * b[k];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void attn_one(const struct attn_job *j, long t, int h, float *scores) {
    const struct attn_params *p = j->p;
    const struct backend_batch *b = j->b;
    int s = seq_of_token(b, t);
    int pos = b->positions[t];
    int group = p->n_heads / p->n_kv_heads, g = h / group;
    const int32_t *pages = b->kv_pages + b->kv_page_start[s];
    const float *q = j->q + t * j->ldq + (long)h * p->dk;
    long n = (long)pos + 1;
    KILN_ASSERT(n <= j->max_context);
    float mx = -INFINITY;
    for (long i = 0; i < n; i++) {
        long slot = (long)pages[i / b->page_size] * b->page_size + i % b->page_size;
        const float *k = j->k_cache + slot * p->k_stride + (long)g * p->dk;
        float sc = dot(q, k, p->dk) * p->scale;
        scores[i] = sc;
        if (sc > mx) mx = sc;
    }
    float sum = 0.0f;
    for (long i = 0; i < n; i++) {
        scores[i] = expf(scores[i] - mx);
        sum += scores[i];
    }
    float *o = j->out + t * j->ldo + (long)h * p->dv;
    for (int d = 0; d < p->dv; d++) o[d] = 0.0f;
    for (long i = 0; i < n; i++) {
        long slot = (long)pages[i / b->page_size] * b->page_size + i % b->page_size;
        const float *v = j->v_cache + slot * p->v_stride + (long)g * p->dv;
        float w = scores[i];
        for (int d = 0; d < p->dv; d++) o[d] += w * v[d];
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < p->dv; d++) o[d] *= inv;
}

static void attn_worker(void *arg, int ith, int nth) {
    const struct attn_job *j = arg;
    long total = (long)j->b->n_tokens * j->p->n_heads, lo, hi;
    threadpool_split(total, ith, nth, &lo, &hi);
    float *scores = j->scratch + (long)ith * j->max_context;
    for (long w = lo; w < hi; w++) attn_one(j, w / j->p->n_heads, (int)(w % j->p->n_heads), scores);
}

void cpu_attention(void *ctx, float *out, long ldo, const float *q, long ldq, const void *k_cache,
                   const void *v_cache, const struct attn_params *p, const struct backend_batch *b) {
    struct cpu_ctx *c = ctx;
    KILN_ASSERT_MSG(c->attn_scratch, "cpu backend: reserve() was not called");
    struct attn_job j = {out, ldo, q, ldq, k_cache, v_cache, p, b, c->attn_scratch, c->max_context};
    threadpool_run(c->tp, attn_worker, &j);
}
