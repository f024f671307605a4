/* cuda_profile.c — KILN_CUDA_PROFILE=1: where the GPU time of a run goes,
 * operation by operation.
 *
 * cuda_profile_install swaps the backend's table for a copy whose entries
 * record a CUDA event before and after the real operation (on the one
 * stream, so the interval is that operation's device time plus the gap
 * before it). Intervals are read back at every synchronize / download (the
 * stream is idle then) and summed per key: the operation, n and, for
 * products, the weight's shape, so a prefill's GEMMs show up shape by shape
 * with their TFLOP/s and weight GB/s. Nothing is timed while a graph is
 * being recorded; a replay is one interval ("graph_launch"). The table is
 * printed to stderr when the backend is destroyed or the process exits,
 * sorted by median × calls ("steady ms"): first calls pay for lazy module
 * loading and cuBLAS's heuristics (milliseconds), which the total keeps and
 * the median drops; rates (TFLOP/s, weight GB/s) come from the median.
 *
 * For finding what to speed up, not for production: the events cost a few
 * microseconds per operation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

enum { PROF_KEYS = 512, PROF_PENDING = 4096, PROF_MAX = 8 };

struct prof_key {
    char name[96];
    long calls;
    double ms, flops, bytes; /* flops, bytes: of one call */
    float *us;               /* every call's time */
    long cap;
};

struct prof {
    struct backend_ops orig, ops;
    struct cuda_ctx *c;
    struct prof_key keys[PROF_KEYS];
    int n_keys;
    cudaEvent_t ev[PROF_PENDING][2];
    int key_of[PROF_PENDING];
    double flops_of[PROF_PENDING], bytes_of[PROF_PENDING];
    int n_pend;
    int printed;
};

static struct prof *all[PROF_MAX];
static int n_all;

static struct prof *P(void *ctx) { return (struct prof *)((struct cuda_ctx *)ctx)->prof; }

static int key_index(struct prof *p, const char *name) {
    for (int i = 0; i < p->n_keys; i++)
        if (!strcmp(p->keys[i].name, name)) return i;
    if (p->n_keys == PROF_KEYS) return PROF_KEYS - 1; /* overflow: lumped into the last */
    struct prof_key *k = &p->keys[p->n_keys];
    snprintf(k->name, sizeof k->name, "%s", name);
    return p->n_keys++;
}

static void harvest(struct prof *p) {
    if (!p->n_pend) return;
    CUDA_CHECK(cudaEventSynchronize(p->ev[p->n_pend - 1][1]));
    for (int i = 0; i < p->n_pend; i++) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, p->ev[i][0], p->ev[i][1]));
        struct prof_key *k = &p->keys[p->key_of[i]];
        if (k->calls == k->cap) {
            k->cap = k->cap ? 2 * k->cap : 64;
            float *u = realloc(k->us, (size_t)k->cap * sizeof *u);
            if (!u) abort();
            k->us = u;
        }
        k->us[k->calls++] = ms * 1e3f;
        k->ms += ms;
        k->flops = p->flops_of[i];
        k->bytes = p->bytes_of[i];
    }
    p->n_pend = 0;
}

/* Starts an interval; returns its slot, or -1 when not timing (capture). */
static int begin(void *ctx, const char *name, double flops, double bytes) {
    struct prof *p = P(ctx);
    if (p->c->capturing) return -1;
    if (p->n_pend == PROF_PENDING) harvest(p);
    int s = p->n_pend++;
    p->key_of[s] = key_index(p, name);
    p->flops_of[s] = flops;
    p->bytes_of[s] = bytes;
    CUDA_CHECK(cudaEventRecord(p->ev[s][0], p->c->stream));
    return s;
}

static void end(void *ctx, int s) {
    struct prof *p = P(ctx);
    if (s >= 0) CUDA_CHECK(cudaEventRecord(p->ev[s][1], p->c->stream));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void print(struct prof *p) {
    if (p->printed) return;
    p->printed = 1;
    harvest(p);
    double total = 0, steady = 0;
    double *med = calloc((size_t)p->n_keys + 1, sizeof *med);
    int *order = malloc((size_t)(p->n_keys + 1) * sizeof *order);
    for (int i = 0; i < p->n_keys; i++) {
        struct prof_key *k = &p->keys[i];
        qsort(k->us, (size_t)k->calls, sizeof *k->us, cmp_float);
        med[i] = k->calls ? k->us[k->calls / 2] : 0;
        total += k->ms;
        steady += med[i] * (double)k->calls / 1e3;
        order[i] = i;
    }
    for (int i = 1; i < p->n_keys; i++) /* insertion sort by steady time, largest first */
        for (int j = i; j > 0 && med[order[j]] * (double)p->keys[order[j]].calls >
                                      med[order[j - 1]] * (double)p->keys[order[j - 1]].calls;
             j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    fprintf(stderr, "cuda profile: %.3f ms in timed operations, %.3f ms at their medians\n", total,
            steady);
    fprintf(stderr, "  %-50s %7s %10s %10s %9s %9s %6s %8s %8s\n", "operation", "calls", "total ms",
            "steady ms", "median us", "min us", "%", "TFLOP/s", "GB/s");
    for (int i = 0; i < p->n_keys; i++) {
        const struct prof_key *k = &p->keys[order[i]];
        double m = med[order[i]], st = m * (double)k->calls / 1e3;
        fprintf(stderr, "  %-50s %7ld %10.3f %10.3f %9.1f %9.1f %6.2f", k->name, k->calls, k->ms, st,
                m, k->calls ? (double)k->us[0] : 0.0, steady > 0 ? 100 * st / steady : 0);
        if (k->flops > 0 && m > 0) fprintf(stderr, " %8.1f %8.0f", k->flops / m / 1e6, k->bytes / m / 1e3);
        fprintf(stderr, "\n");
    }
    free(order);
    free(med);
}

static void print_all(void) {
    for (int i = 0; i < n_all; i++) print(all[i]);
}

static double wbytes(const struct backend_weight *w) { return (double)backend_weight_bytes(w); }

/* ---- wrappers ------------------------------------------------------------ */

static void w_destroy(void *ctx) {
    struct prof *p = P(ctx);
    void (*d)(void *) = p->orig.destroy;
    print(p);
    for (int i = 0; i < n_all; i++)
        if (all[i] == p) all[i] = all[--n_all];
    for (int i = 0; i < PROF_PENDING; i++) {
        cudaEventDestroy(p->ev[i][0]);
        cudaEventDestroy(p->ev[i][1]);
    }
    for (int i = 0; i < p->n_keys; i++) free(p->keys[i].us);
    ((struct cuda_ctx *)ctx)->prof = NULL;
    /* p->ops stays allocated: the caller may still hold the table pointer */
    d(ctx);
}

static void w_download(void *ctx, void *dst, const void *src, size_t bytes) {
    int s = begin(ctx, "download", 0, 0);
    P(ctx)->orig.download(ctx, dst, src, bytes);
    end(ctx, s);
    harvest(P(ctx));
}

static void w_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    int s = begin(ctx, "upload", 0, 0);
    P(ctx)->orig.upload(ctx, dst, src, bytes);
    end(ctx, s);
}

static void w_synchronize(void *ctx) {
    P(ctx)->orig.synchronize(ctx);
    harvest(P(ctx));
}

static void w_embed(void *ctx, float *y, const struct backend_weight *t, const int32_t *ids, long n) {
    int s = begin(ctx, "embed", 0, 0);
    P(ctx)->orig.embed(ctx, y, t, ids, n);
    end(ctx, s);
}

static void w_matmul(void *ctx, float *y, long ldy, const float *x, long ldx,
                     const struct backend_weight *w, const float *bias, long n) {
    char k[96];
    snprintf(k, sizeof k, "matmul n=%ld %ldx%ld%s", n, w->rows, w->cols, bias ? " +bias" : "");
    int s = begin(ctx, k, 2.0 * (double)n * (double)w->rows * (double)w->cols, wbytes(w));
    P(ctx)->orig.matmul(ctx, y, ldy, x, ldx, w, bias, n);
    end(ctx, s);
}

static void w_matmul_heads(void *ctx, float *y, long ldy, long hy, const float *x, long ldx,
                           long hx, const struct backend_weight *w, long w_stride, int n_heads,
                           long n) {
    char k[96];
    snprintf(k, sizeof k, "matmul_heads n=%ld %dx%ldx%ld", n, n_heads, w->rows, w->cols);
    int s = begin(ctx, k, 2.0 * (double)n * n_heads * (double)w->rows * (double)w->cols,
                  wbytes(w) * (double)n_heads);
    P(ctx)->orig.matmul_heads(ctx, y, ldy, hy, x, ldx, hx, w, w_stride, n_heads, n);
    end(ctx, s);
}

static void w_rmsnorm(void *ctx, float *y, long ldy, const float *x, long ldx, const float *w,
                      long n, long dim, float eps) {
    char k[96];
    snprintf(k, sizeof k, "rmsnorm n=%ld dim=%ld", n, dim);
    int s = begin(ctx, k, 0, 0);
    P(ctx)->orig.rmsnorm(ctx, y, ldy, x, ldx, w, n, dim, eps);
    end(ctx, s);
}

static void w_add_rmsnorm(void *ctx, float *h, const float *delta, float *y, const float *w, long n,
                          long dim, float eps) {
    char k[96];
    snprintf(k, sizeof k, "add_rmsnorm n=%ld", n);
    int s = begin(ctx, k, 0, 0);
    P(ctx)->orig.add_rmsnorm(ctx, h, delta, y, w, n, dim, eps);
    end(ctx, s);
}

static void w_reduce_add_rmsnorm(void *ctx, const struct backend_norm *nm, long n) {
    char k[96];
    snprintf(k, sizeof k, "reduce_add_rmsnorm n=%ld", n);
    int s = begin(ctx, k, 0, 0);
    P(ctx)->orig.reduce_add_rmsnorm(ctx, nm, n);
    end(ctx, s);
}

static void w_rope(void *ctx, float *x, long ldx, long n, int nh, long hs, int rot,
                   const int32_t *pos, const float *cs, int il) {
    int s = begin(ctx, "rope", 0, 0);
    P(ctx)->orig.rope(ctx, x, ldx, n, nh, hs, rot, pos, cs, il);
    end(ctx, s);
}

static void w_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u,
                       long ldu, long n, long dim) {
    char k[96];
    snprintf(k, sizeof k, "silu_mul n=%ld", n);
    int s = begin(ctx, k, 0, 0);
    P(ctx)->orig.silu_mul(ctx, y, ldy, g, ldg, u, ldu, n, dim);
    end(ctx, s);
}

static void w_add(void *ctx, float *y, const float *x, long count) {
    int s = begin(ctx, "add", 0, 0);
    P(ctx)->orig.add(ctx, y, x, count);
    end(ctx, s);
}

static void w_gated_add(void *ctx, float *y, const float *x, const float *g, long ldg, long n,
                        long dim) {
    int s = begin(ctx, "gated_add", 0, 0);
    P(ctx)->orig.gated_add(ctx, y, x, g, ldg, n, dim);
    end(ctx, s);
}

static void w_gather_rows(void *ctx, float *dst, const float *src, long width, const int32_t *rows,
                          long n) {
    int s = begin(ctx, "gather_rows", 0, 0);
    P(ctx)->orig.gather_rows(ctx, dst, src, width, rows, n);
    end(ctx, s);
}

static void w_copy_rows(void *ctx, float *dst, long ldd, const float *src, long lds, long n,
                        long width) {
    int s = begin(ctx, "copy_rows", 0, 0);
    P(ctx)->orig.copy_rows(ctx, dst, ldd, src, lds, n, width);
    end(ctx, s);
}

static void w_kv_store(void *ctx, void *cache, long stride, const float *src, long ld, long width,
                       const int32_t *slots, long n, float scale) {
    int s = begin(ctx, "kv_store", 0, 0);
    P(ctx)->orig.kv_store(ctx, cache, stride, src, ld, width, slots, n, scale);
    end(ctx, s);
}

static void w_attention(void *ctx, float *out, long ldo, const float *q, long ldq, const void *kc,
                        const void *vc, const struct attn_params *ap, const struct backend_batch *b) {
    char k[96];
    snprintf(k, sizeof k, "attention tokens=%d seqs=%d", b->n_tokens, b->n_seqs);
    int s = begin(ctx, k, 0, 0);
    P(ctx)->orig.attention(ctx, out, ldo, q, ldq, kc, vc, ap, b);
    end(ctx, s);
}

static void w_moe_route(void *ctx, int32_t *ids, float *w, const float *lg, const float *bias,
                        const struct moe_route_params *rp, long n) {
    int s = begin(ctx, "moe_route", 0, 0);
    P(ctx)->orig.moe_route(ctx, ids, w, lg, bias, rp, n);
    end(ctx, s);
}

static void w_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids, const float *w,
                      int top_k, const struct moe_experts *e, long n) {
    int s = begin(ctx, "moe_ffn", 0, 0);
    P(ctx)->orig.moe_ffn(ctx, y, x, ids, w, top_k, e, n);
    end(ctx, s);
}

static int w_graph_launch(void *ctx, void *g) {
    int s = begin(ctx, "graph_launch", 0, 0);
    int rc = P(ctx)->orig.graph_launch(ctx, g);
    end(ctx, s);
    return rc;
}

static void w_qk_rope_store(void *ctx, float *q, float *k, const float *v, long ld, long n,
                            const struct backend_rope_store *r) {
    char key[96];
    snprintf(key, sizeof key, "qk_rope_store n=%ld", n);
    int s = begin(ctx, key, 0, 0);
    P(ctx)->orig.qk_rope_store(ctx, q, k, v, ld, n, r);
    end(ctx, s);
}

static void w_norm_matmul(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                          const struct backend_weight *w, const float *bias, long n) {
    char k[96];
    snprintf(k, sizeof k, "norm_matmul n=%ld %ldx%ld%s", n, w->rows, w->cols, bias ? " +bias" : "");
    int s = begin(ctx, k, 2.0 * (double)n * (double)w->rows * (double)w->cols, wbytes(w));
    P(ctx)->orig.norm_matmul(ctx, nm, y, ldy, w, bias, n);
    end(ctx, s);
}

static void w_norm_matmul_rope(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                               const struct backend_stack *ws, const float *bias, long n,
                               const struct backend_rope_store *r) {
    const struct backend_weight *w = &ws->cat;
    char k[96];
    snprintf(k, sizeof k, "norm_matmul_rope n=%ld %ldx%ld%s", n, w->rows, w->cols,
             bias ? " +bias" : "");
    int s = begin(ctx, k, 2.0 * (double)n * (double)w->rows * (double)w->cols, wbytes(w));
    P(ctx)->orig.norm_matmul_rope(ctx, nm, y, ldy, ws, bias, n, r);
    end(ctx, s);
}

static void w_norm_swiglu_mlp(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                              const struct backend_stack *gu_s, const struct backend_weight *dw,
                              float *gu, long ldgu, long n) {
    const struct backend_weight *gu_w = &gu_s->cat;
    char k[96];
    snprintf(k, sizeof k, "norm_swiglu_mlp n=%ld %ldx%ld+%ldx%ld", n, gu_w->rows, gu_w->cols,
             dw->rows, dw->cols);
    double fl = 2.0 * (double)n * ((double)gu_w->rows * gu_w->cols + (double)dw->rows * dw->cols);
    int s = begin(ctx, k, fl, wbytes(gu_w) + wbytes(dw));
    P(ctx)->orig.norm_swiglu_mlp(ctx, nm, y, ldy, gu_s, dw, gu, ldgu, n);
    end(ctx, s);
}

static void w_attention_matmul(void *ctx, float *y, long ldy, float *att, long ldatt,
                               const float *q, long ldq, const void *kc, const void *vc,
                               const struct attn_params *ap, const struct backend_batch *b,
                               const struct backend_weight *wo, const float *bias, long n) {
    char k[96];
    snprintf(k, sizeof k, "attention_matmul tokens=%d seqs=%d %ldx%ld", b->n_tokens, b->n_seqs,
             wo->rows, wo->cols);
    int s = begin(ctx, k, 2.0 * (double)n * (double)wo->rows * (double)wo->cols, wbytes(wo));
    P(ctx)->orig.attention_matmul(ctx, y, ldy, att, ldatt, q, ldq, kc, vc, ap, b, wo, bias, n);
    end(ctx, s);
}

void cuda_profile_install(struct backend *be) {
    struct cuda_ctx *c = be->ctx;
    if (n_all == PROF_MAX) return;
    struct prof *p = calloc(1, sizeof *p);
    if (!p) return;
    p->c = c;
    p->orig = *be->ops;
    p->ops = *be->ops;
    for (int i = 0; i < PROF_PENDING; i++) {
        CUDA_CHECK(cudaEventCreate(&p->ev[i][0]));
        CUDA_CHECK(cudaEventCreate(&p->ev[i][1]));
    }
    struct backend_ops *o = &p->ops;
    o->destroy = w_destroy;
    o->download = w_download;
    o->upload = w_upload;
    o->synchronize = w_synchronize;
#define WRAP(f) if (o->f) o->f = w_##f
    WRAP(embed);
    WRAP(matmul);
    WRAP(matmul_heads);
    WRAP(rmsnorm);
    WRAP(add_rmsnorm);
    WRAP(reduce_add_rmsnorm);
    WRAP(rope);
    WRAP(silu_mul);
    WRAP(add);
    WRAP(gated_add);
    WRAP(gather_rows);
    WRAP(copy_rows);
    WRAP(kv_store);
    WRAP(attention);
    WRAP(moe_route);
    WRAP(moe_ffn);
    WRAP(graph_launch);
    WRAP(qk_rope_store);
    WRAP(norm_matmul);
    WRAP(norm_matmul_rope);
    WRAP(norm_swiglu_mlp);
    WRAP(attention_matmul);
#undef WRAP
    c->prof = p;
    be->ops = &p->ops;
    if (n_all == 0) atexit(print_all);
    all[n_all++] = p;
}
