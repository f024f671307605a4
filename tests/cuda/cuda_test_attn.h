/* cuda_test_attn.h — the batches of the attention kernel tests
 * (test_attn_prefill.c, test_mla_mha.c): paged-batch metadata on the host
 * and the device, a run of a backend's attention on it, and the
 * comparisons. Include after cmocka.h. */
#ifndef KILN_TESTS_CUDA_TEST_ATTN_H
#define KILN_TESTS_CUDA_TEST_ATTN_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tensor/backend.h"

/* A device copy of `bytes` of host memory h, on backend dev. */
static void *dev_from(struct backend *dev, const void *h, size_t bytes) {
    void *d = dev->ops->alloc(dev->ctx, bytes);
    assert_non_null(d);
    dev->ops->upload(dev->ctx, d, h, bytes);
    /* other contexts (streams) read it: the copy first */
    dev->ops->synchronize(dev->ctx);
    return d;
}

/* One batch: host and device copies of the metadata. */
struct batch {
    int n_tokens, n_seqs, page_size;
    int32_t *pos, *q_start, *page_start, *pages;
    struct backend_batch hb, db;
    void *dpos, *dqs, *dps, *dpg;
};

static void batch_make(struct backend *dev, struct batch *b, int page_size, int n_seqs, const int *first_pos,
                       const int *n_new, const int32_t *const *seq_pages, const int *n_pages) {
    b->page_size = page_size, b->n_seqs = n_seqs, b->n_tokens = 0;
    int tp = 0;
    for (int s = 0; s < n_seqs; s++) b->n_tokens += n_new[s], tp += n_pages[s];
    b->pos = xmalloc((size_t)b->n_tokens * 4 + 4);
    b->q_start = xmalloc((size_t)(n_seqs + 1) * 4);
    b->page_start = xmalloc((size_t)(n_seqs + 1) * 4);
    b->pages = xmalloc((size_t)tp * 4 + 4);
    int t = 0, pg = 0;
    for (int s = 0; s < n_seqs; s++) {
        b->q_start[s] = t, b->page_start[s] = pg;
        for (int i = 0; i < n_new[s]; i++) b->pos[t++] = first_pos[s] + i;
        for (int i = 0; i < n_pages[s]; i++) b->pages[pg++] = seq_pages[s][i];
    }
    b->q_start[n_seqs] = t, b->page_start[n_seqs] = pg;
    b->dpos = dev_from(dev, b->pos, (size_t)t * 4 + 4);
    b->dqs = dev_from(dev, b->q_start, (size_t)(n_seqs + 1) * 4);
    b->dps = dev_from(dev, b->page_start, (size_t)(n_seqs + 1) * 4);
    b->dpg = dev_from(dev, b->pages, (size_t)pg * 4 + 4);
    b->hb = (struct backend_batch){t, n_seqs, page_size, b->pos, b->q_start, b->page_start, b->pages};
    b->db = (struct backend_batch){t, n_seqs, page_size, b->dpos, b->dqs, b->dps, b->dpg};
}

static void batch_free(struct backend *dev, struct batch *b) {
    free(b->pos), free(b->q_start), free(b->page_start), free(b->pages);
    dev->ops->free(dev->ctx, b->dpos), dev->ops->free(dev->ctx, b->dqs);
    dev->ops->free(dev->ctx, b->dps), dev->ops->free(dev->ctx, b->dpg);
}

/* Runs be's attention on batch b (q rows from dq; buffers on dev, the
 * backend that made the batch), returns the output rows [n_tokens][ldo]
 * downloaded (poisoned with NaN before the run). */
static float *run_gpu(struct backend *dev, struct backend *be, const struct batch *b, const float *dq,
                      long ldq, long ldo, const void *kc, const void *vc, const struct attn_params *p) {
    size_t n = (size_t)b->n_tokens * (size_t)ldo;
    float *h = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *dout = dev_from(dev, h, n * 4);
    /* be may be another context (stream) than dev: dev's copies land first */
    dev->ops->synchronize(dev->ctx);
    be->ops->attention(be->ctx, dout, ldo, dq, ldq, kc, vc, p, &b->db);
    be->ops->synchronize(be->ctx);
    dev->ops->download(dev->ctx, h, dout, n * 4);
    dev->ops->free(dev->ctx, dout);
    return h;
}

static double rel_err(const float *g, const float *c, long rows, long width, long ld) {
    double num = 0, den = 0;
    for (long r = 0; r < rows; r++)
        for (long k = 0; k < width; k++) {
            double a = g[r * ld + k], b = c[r * ld + k];
            if (isnan(a) || isnan(b)) fail_msg("NaN at row %ld col %ld (gpu %g cpu %g)", r, k, a, b);
            num += (a - b) * (a - b), den += b * b;
        }
    return sqrt(num / den);
}

/* rows [0, rows) of x and y, `width` floats each, the same bits */
static void expect_same_bits(const char *what, const float *x, long ldx, const float *y, long ldy,
                             long rows, long width) {
    for (long r = 0; r < rows; r++)
        if (memcmp(x + r * ldx, y + r * ldy, (size_t)width * 4))
            fail_msg("%s: row %ld differs", what, r);
    printf("    %s: %ld rows, same bits\n", what, rows);
}

#endif
