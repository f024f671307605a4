/* test_cuda_nccl.c — the CUDA backend's communicator (NCCL, cuda_nccl.c)
 * on two or more GPUs of one machine, one rank per GPU as threads of this
 * process: the TCP rendezvous hands rank 0's NCCL unique id to the others
 * (backend_ops.comm_id / comm_init), then every collective of dist/comm.h
 * runs on device buffers and is checked against values computed on the
 * host: all_reduce (sum and max, sizes from one float to 4 Mi, in place),
 * all_gather (in place too), reduce_scatter, all_to_all, all_to_allv with
 * uneven and empty blocks, broadcast from a non-zero root, barrier, and an
 * all_reduce recorded in a graph and replayed on new data. Every rank must
 * see the same bits.
 *
 * All of it twice: with NCCL alone (KILN_CUDA_ONE_SHOT=0), then with the
 * one-shot all-reduce over CUDA IPC (cuda_allreduce.cu) for messages of
 * up to 1 MiB, where the sizes above that are multiples of 4 floats take
 * it. The second run also checks the all-reduce fused with the residual
 * add + RMSNorm (backend_ops.reduce_add_rmsnorm, norm_matmul with
 * backend_norm.reduce): against the host, bit for bit against all_reduce
 * + the plain op, the same bits on every rank, over a run of calls of
 * changing sizes (the kernel's buffers take turns and are cleared behind
 * it), and recorded in a graph and replayed.
 *
 * Then it measures all_reduce of the hidden states of decode and prefill
 * steps (fp32 rows of 4096: 1, 64 and 256 rows, 8192 rows) — latency and
 * bus bandwidth (2 (n-1)/n of the bytes per rank per second, NCCL's
 * convention) — and all_reduce + add_rmsnorm against the fused kernel at
 * 1 to 64 rows, printed, not asserted.
 *
 * Label gpu_multi (ctest -L gpu_multi on a machine with several GPUs; it
 * fails, saying so, with fewer than two). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "dist/net.h"
#include "dist/rendezvous.h"
#include "tensor/backend.h"

enum { MAX_RANKS = 8 };

struct rank {
    int r, size;
    char addr[64];
    int lfd;
    struct backend be;
    struct dist_group g;
    struct dist_comm c;
    int failed;
    char msg[512];
    int one_shot;  /* this run has the one-shot all-reduce */
    double *times; /* [BENCH_SIZES] mean seconds of an all_reduce */
    double *norm_times; /* [NORM_SIZES] mean seconds of all_reduce + norm, or the fused op */
    uint64_t *hashes;   /* [NORM_CALLS] the bits of each fused call's output */
};

static void rank_fail(struct rank *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rank_fail(struct rank *k, const char *fmt, ...) {
    if (k->failed++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->msg, sizeof k->msg, fmt, ap);
    va_end(ap);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define OPS (k->be.ops)
#define CTX (k->be.ctx)
/* a device buffer of n floats filled from host values */
static float *dev_floats(struct rank *k, const float *h, size_t n) {
    float *d = OPS->alloc(CTX, n * 4 + 16);
    if (d && h) OPS->upload(CTX, d, h, n * 4);
    return d;
}

static void get(struct rank *k, void *h, const void *d, size_t bytes) {
    OPS->synchronize(CTX);
    OPS->download(CTX, h, d, bytes);
}

/* the value rank r contributes at element i */
static float val(int r, size_t i) { return (float)((int)(i % 1000) - 500) * 0.25f + (float)(r + 1) * 0.5f; }

static void check_all_reduce(struct rank *k, size_t n, enum dist_reduce op) {
    struct kiln_error err = {0};
    float *h = xmalloc(n * 4), *out = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = val(k->r, i);
    float *d = dev_floats(k, h, n);
    if (dist_comm_all_reduce(&k->c, d, n, op, &err)) rank_fail(k, "all_reduce: %s", err.msg);
    get(k, out, d, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++) {
        /* exact: the values are multiples of 0.25 well inside float's range */
        float want = op == DIST_SUM ? 0.0f : -INFINITY;
        for (int r = 0; r < k->size; r++) want = op == DIST_SUM ? want + val(r, i) : fmaxf(want, val(r, i));
        if (out[i] != want) rank_fail(k, "all_reduce %s n=%zu: [%zu] = %g, want %g", op == DIST_SUM ? "sum" : "max", n,
                                      i, out[i], want);
    }
    OPS->free(CTX, d);
    free(h), free(out);
}

/* The norm checks' inputs: h the same on every rank, delta rank r's part,
 * all multiples of 2^-7 (sums exact). */
static float hval(size_t i, int c) { return (float)((int)((i + (size_t)c * 5) % 97) - 48) * 0.03125f; }
static float dval(int r, size_t i, int c) {
    return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)c * 3) % 101) - 50) * 0.0078125f;
}
static float wval(size_t i) { return 0.5f + (float)(i % 13) * 0.0625f; }

static uint64_t bits_hash(const void *p, size_t bytes) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

enum { NORM_DIM = 4096, NORM_CALLS = 24, NORM_OUT = 512 };
static const long norm_rows[] = {1, 3, 64, 17, 1, 64, 2, 5};

/* One fused call (call number c, n rows of dim) on fresh inputs, checked. */
static void check_norm_call(struct rank *k, int c, long n, long dim, float *dh, float *dd, float *dx, const float *dw,
                            float *dh2, float *dd2, float *dx2, float *hb, float *hx, float *hx2) {
    struct kiln_error err = {0};
    size_t e = (size_t)n * dim;
    for (size_t i = 0; i < e; i++) hb[i] = hval(i, c);
    OPS->upload(CTX, dh, hb, e * 4), OPS->upload(CTX, dh2, hb, e * 4);
    for (size_t i = 0; i < e; i++) hb[i] = dval(k->r, i, c);
    OPS->upload(CTX, dd, hb, e * 4), OPS->upload(CTX, dd2, hb, e * 4);
    if (!OPS->norm_reduce_ok(CTX, &k->c, n, dim)) {
        rank_fail(k, "norm_reduce_ok says no for %ld rows of %ld", n, dim);
        return;
    }
    struct backend_norm nm = {.h = dh, .delta = dd, .x = dx, .w = dw, .dim = dim, .eps = 1e-5f,
                              .reduce = &k->c};
    OPS->reduce_add_rmsnorm(CTX, &nm, n);
    /* the unfused sequence on copies */
    if (dist_comm_all_reduce(&k->c, dd2, e, DIST_SUM, &err)) rank_fail(k, "all_reduce: %s", err.msg);
    OPS->add_rmsnorm(CTX, dh2, dd2, dx2, dw, n, dim, 1e-5f);
    get(k, hx, dx, e * 4);
    get(k, hx2, dx2, e * 4);
    get(k, hb, dh, e * 4);
    if (memcmp(hx, hx2, e * 4)) rank_fail(k, "call %d (%ld rows): the fused op's x differs from all_reduce + add_rmsnorm",
                                          c, n);
    if (c < NORM_CALLS) k->hashes[c] = bits_hash(hx, e * 4);
    for (long i = 0; i < n && !k->failed; i++) {
        double ss = 0;
        for (int j = 0; j < dim; j++) {
            size_t q = (size_t)i * dim + (size_t)j;
            float sum = 0.0f;
            for (int r = 0; r < k->size; r++) sum += dval(r, q, c);
            float hh = hval(q, c) + sum;
            if (hb[q] != hh) {
                rank_fail(k, "call %d (%ld rows of %ld): h[%ld][%d] = %g, want %g", c, n, dim, i, j, hb[q], hh);
                return;
            }
            ss += (double)hh * hh;
        }
        double inv = 1.0 / sqrt(ss / (double)dim + 1e-5);
        for (int j = 0; j < dim; j++) {
            size_t q = (size_t)i * dim + (size_t)j;
            double want = wval((size_t)j) * (hb[q] * inv);
            if (fabs(hx[q] - want) > 1e-5 * (1 + fabs(want))) {
                rank_fail(k, "call %d (%ld rows): x[%ld][%d] = %g, want %g", c, n, i, j, hx[q], want);
                return;
            }
        }
    }
}

/* The fused all-reduce + add + norm (one-shot runs). */
static void check_norm_reduce(struct rank *k) {
    size_t e = (size_t)64 * NORM_DIM;
    float *hb = xmalloc(e * 4), *hx = xmalloc(e * 4), *hx2 = xmalloc(e * 4);
    for (int j = 0; j < NORM_DIM; j++) hb[j] = wval((size_t)j);
    float *dw = dev_floats(k, hb, NORM_DIM);
    float *dh = dev_floats(k, NULL, e), *dd = dev_floats(k, NULL, e), *dx = dev_floats(k, NULL, e);
    float *dh2 = dev_floats(k, NULL, e), *dd2 = dev_floats(k, NULL, e), *dx2 = dev_floats(k, NULL, e);
    int nr = (int)(sizeof norm_rows / sizeof norm_rows[0]);
    for (int c = 0; c < NORM_CALLS && !k->failed; c++)
        check_norm_call(k, c, norm_rows[c % nr], NORM_DIM, dh, dd, dx, dw, dh2, dd2, dx2, hb, hx, hx2);
    /* narrow rows (the tiny models' 64): the scalar kernel's layout */
    for (int c = 0; c < 2 * nr && !k->failed; c++)
        check_norm_call(k, 100 + c, norm_rows[c % nr], 64, dh, dd, dx, dw, dh2, dd2, dx2, hb, hx, hx2);
    /* the 16-bit handoff: norm_matmul (3 rows: past the GEMV) with the
     * sum in its norm, against all_reduce + norm_matmul */
    if (!k->failed) {
        struct kiln_error err = {0};
        long n = 3;
        uint16_t *wb = xmalloc((size_t)NORM_OUT * NORM_DIM * 2);
        for (size_t i = 0; i < (size_t)NORM_OUT * NORM_DIM; i++) {
            float f = (float)((int)(i % 61) - 30) * 0.001953125f;
            uint32_t u;
            memcpy(&u, &f, 4);
            wb[i] = (uint16_t)(u >> 16); /* exact in bf16 */
        }
        struct backend_weight w = {.data = OPS->weight_upload(CTX, wb, (size_t)NORM_OUT * NORM_DIM * 2),
                                   .dtype = DTYPE_BF16, .rows = NORM_OUT, .cols = NORM_DIM};
        float *dy = dev_floats(k, NULL, (size_t)n * NORM_OUT), *dy2 = dev_floats(k, NULL, (size_t)n * NORM_OUT);
        size_t ne = (size_t)n * NORM_DIM;
        for (size_t i = 0; i < ne; i++) hb[i] = hval(i, 99);
        OPS->upload(CTX, dh, hb, ne * 4), OPS->upload(CTX, dh2, hb, ne * 4);
        for (size_t i = 0; i < ne; i++) hb[i] = dval(k->r, i, 99);
        OPS->upload(CTX, dd, hb, ne * 4), OPS->upload(CTX, dd2, hb, ne * 4);
        struct backend_norm nm = {.h = dh, .delta = dd, .x = dx, .w = dw, .dim = NORM_DIM, .eps = 1e-5f,
                                  .reduce = &k->c};
        OPS->norm_matmul(CTX, &nm, dy, NORM_OUT, &w, NULL, n);
        if (dist_comm_all_reduce(&k->c, dd2, ne, DIST_SUM, &err)) rank_fail(k, "all_reduce: %s", err.msg);
        struct backend_norm nm2 = {.h = dh2, .delta = dd2, .x = dx2, .w = dw, .dim = NORM_DIM, .eps = 1e-5f};
        OPS->norm_matmul(CTX, &nm2, dy2, NORM_OUT, &w, NULL, n);
        get(k, hx, dy, (size_t)n * NORM_OUT * 4);
        get(k, hx2, dy2, (size_t)n * NORM_OUT * 4);
        if (memcmp(hx, hx2, (size_t)n * NORM_OUT * 4))
            rank_fail(k, "norm_matmul with the sum in its norm differs from all_reduce + norm_matmul");
        OPS->free(CTX, dy), OPS->free(CTX, dy2);
        OPS->weight_release(CTX, w.data);
        free(wb);
    }
    /* recorded once, replayed on new data */
    if (!k->failed) {
        long n = 2;
        struct backend_norm nm = {.h = dh, .delta = dd, .x = dx, .w = dw, .dim = NORM_DIM, .eps = 1e-5f,
                                  .reduce = &k->c};
        OPS->graph_begin(CTX);
        OPS->reduce_add_rmsnorm(CTX, &nm, n);
        void *g = OPS->graph_end(CTX);
        if (!g) rank_fail(k, "the fused op could not be recorded in a graph");
        size_t ne = (size_t)n * NORM_DIM;
        for (int rep = 0; rep < 4 && g && !k->failed; rep++) {
            int c = 200 + rep;
            for (size_t i = 0; i < ne; i++) hb[i] = hval(i, c);
            OPS->upload(CTX, dh, hb, ne * 4);
            for (size_t i = 0; i < ne; i++) hb[i] = dval(k->r, i, c);
            OPS->upload(CTX, dd, hb, ne * 4);
            if (OPS->graph_launch(CTX, g)) rank_fail(k, "graph replay failed");
            get(k, hb, dh, ne * 4);
            for (size_t i = 0; i < ne; i++) {
                float sum = 0.0f;
                for (int r = 0; r < k->size; r++) sum += dval(r, i, c);
                if (hb[i] != hval(i, c) + sum) {
                    rank_fail(k, "replay %d: h[%zu] = %g, want %g", rep, i, hb[i], hval(i, c) + sum);
                    break;
                }
            }
        }
        if (g) OPS->graph_destroy(CTX, g);
    }
    float *bufs[] = {dw, dh, dd, dx, dh2, dd2, dx2};
    for (int i = 0; i < 7; i++) OPS->free(CTX, bufs[i]);
    free(hb), free(hx), free(hx2);
}

static void check_gather_scatter(struct rank *k) {
    struct kiln_error err = {0};
    int S = k->size;
    size_t n = 1000;
    /* all_gather, in place: rank r's block r */
    float *h = xmalloc(n * S * 4), *out = xmalloc(n * S * 4);
    for (size_t i = 0; i < n * S; i++) h[i] = -1.0f;
    for (size_t i = 0; i < n; i++) h[k->r * n + i] = val(k->r, i);
    float *d = dev_floats(k, h, n * S);
    if (dist_comm_all_gather(&k->c, d + k->r * n, d, n * 4, &err)) rank_fail(k, "all_gather: %s", err.msg);
    get(k, out, d, n * S * 4);
    for (int r = 0; r < S; r++)
        for (size_t i = 0; i < n; i++)
            if (out[r * n + i] != val(r, i)) {
                rank_fail(k, "all_gather: block %d [%zu] = %g", r, i, out[r * n + i]);
                r = S;
                break;
            }
    /* reduce_scatter: block p of every rank summed into rank p */
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < n; i++) h[p * n + i] = val(k->r, i + 7 * p);
    OPS->upload(CTX, d, h, n * S * 4);
    float *rs = dev_floats(k, NULL, n);
    if (dist_comm_reduce_scatter(&k->c, d, rs, n, DIST_SUM, &err)) rank_fail(k, "reduce_scatter: %s", err.msg);
    get(k, out, rs, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++) {
        float want = 0.0f;
        for (int r = 0; r < S; r++) want += val(r, i + 7 * k->r);
        if (out[i] != want) rank_fail(k, "reduce_scatter: [%zu] = %g, want %g", i, out[i], want);
    }
    OPS->free(CTX, rs);
    OPS->free(CTX, d);
    free(h), free(out);
}

static void check_all_to_all(struct rank *k) {
    struct kiln_error err = {0};
    int S = k->size;
    size_t n = 333;
    float *h = xmalloc(n * S * 4), *out = xmalloc(n * S * 4);
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < n; i++) h[p * n + i] = (float)(k->r * 100 + p) + (float)i * 1e-3f;
    float *d = dev_floats(k, h, n * S), *rd = dev_floats(k, NULL, n * S);
    if (dist_comm_all_to_all(&k->c, d, rd, n * 4, &err)) rank_fail(k, "all_to_all: %s", err.msg);
    get(k, out, rd, n * S * 4);
    for (int p = 0; p < S && !k->failed; p++)
        for (size_t i = 0; i < n; i++)
            if (out[p * n + i] != (float)(p * 100 + k->r) + (float)i * 1e-3f) {
                rank_fail(k, "all_to_all: from %d [%zu] = %g", p, i, out[p * n + i]);
                break;
            }
    /* all_to_allv: rank r sends (r + p) % 3 * 17 floats to rank p (some empty) */
    size_t sb[MAX_RANKS], so[MAX_RANKS], rb[MAX_RANKS], ro[MAX_RANKS], s_off = 0, r_off = 0;
    for (int p = 0; p < S; p++) {
        sb[p] = (size_t)((k->r + p) % 3) * 17 * 4, so[p] = s_off, s_off += sb[p];
        rb[p] = (size_t)((p + k->r) % 3) * 17 * 4, ro[p] = r_off, r_off += rb[p];
    }
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < sb[p] / 4; i++) h[so[p] / 4 + i] = (float)(k->r * 1000 + p * 10) + (float)i;
    OPS->upload(CTX, d, h, s_off ? s_off : 4);
    if (dist_comm_all_to_allv(&k->c, d, sb, so, rd, rb, ro, &err)) rank_fail(k, "all_to_allv: %s", err.msg);
    get(k, out, rd, r_off ? r_off : 4);
    for (int p = 0; p < S && !k->failed; p++)
        for (size_t i = 0; i < rb[p] / 4; i++)
            if (out[ro[p] / 4 + i] != (float)(p * 1000 + k->r * 10) + (float)i) {
                rank_fail(k, "all_to_allv: from %d [%zu] = %g", p, i, out[ro[p] / 4 + i]);
                break;
            }
    OPS->free(CTX, d), OPS->free(CTX, rd);
    free(h), free(out);
}

static void check_broadcast_graph(struct rank *k) {
    struct kiln_error err = {0};
    size_t n = 4096;
    int root = k->size - 1;
    float *h = xmalloc(n * 4), *out = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = k->r == root ? val(root, i) : 0.0f;
    float *d = dev_floats(k, h, n);
    if (dist_comm_broadcast(&k->c, d, n * 4, root, &err)) rank_fail(k, "broadcast: %s", err.msg);
    get(k, out, d, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++)
        if (out[i] != val(root, i)) rank_fail(k, "broadcast: [%zu] = %g", i, out[i]);
    if (dist_comm_barrier(&k->c, &err)) rank_fail(k, "barrier: %s", err.msg);
    /* an all_reduce recorded once, replayed on new data */
    OPS->graph_begin(CTX);
    if (dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err)) rank_fail(k, "all_reduce (recording): %s", err.msg);
    void *g = OPS->graph_end(CTX);
    if (!g) {
        rank_fail(k, "an all_reduce could not be recorded in a graph");
    } else {
        for (int rep = 1; rep <= 3 && !k->failed; rep++) {
            for (size_t i = 0; i < n; i++) h[i] = val(k->r, i + rep);
            OPS->upload(CTX, d, h, n * 4);
            if (OPS->graph_launch(CTX, g)) rank_fail(k, "graph replay failed");
            get(k, out, d, n * 4);
            for (size_t i = 0; i < n; i++) {
                float want = 0.0f;
                for (int r = 0; r < k->size; r++) want += val(r, i + rep);
                if (out[i] != want) {
                    rank_fail(k, "replay %d: [%zu] = %g, want %g", rep, i, out[i], want);
                    break;
                }
            }
        }
        OPS->graph_destroy(CTX, g);
    }
    OPS->free(CTX, d);
    free(h), free(out);
}

static const size_t bench_rows[] = {1, 64, 256, 8192};
enum { BENCH_SIZES = 4, HIDDEN = 4096 };
static const long norm_bench_rows[] = {1, 8, 32, 64};
enum { NORM_SIZES = 4 };

/* all_reduce + add_rmsnorm (NCCL runs), or the fused op (one-shot runs),
 * on rows of HIDDEN: mean seconds a call */
static void bench_norm(struct rank *k) {
    struct kiln_error err = {0};
    size_t e = (size_t)64 * HIDDEN;
    float *zero = xcalloc(e, 4);
    float *h = dev_floats(k, zero, e), *d = dev_floats(k, zero, e), *x = dev_floats(k, zero, e);
    float *w = dev_floats(k, zero, HIDDEN);
    free(zero);
    for (int s = 0; s < NORM_SIZES; s++) {
        long n = norm_bench_rows[s];
        struct backend_norm nm = {.h = h, .delta = d, .x = x, .w = w, .dim = HIDDEN, .eps = 1e-5f, .reduce = &k->c};
        for (int rep = -5; rep < 200; rep++) {
            if (rep == 0) {
                dist_comm_barrier(&k->c, &err);
                k->norm_times[s] = now();
            }
            if (k->one_shot) {
                OPS->reduce_add_rmsnorm(CTX, &nm, n);
            } else {
                dist_comm_all_reduce(&k->c, d, (size_t)n * HIDDEN, DIST_SUM, &err);
                OPS->add_rmsnorm(CTX, h, d, x, w, n, HIDDEN, 1e-5f);
            }
        }
        OPS->synchronize(CTX);
        k->norm_times[s] = (now() - k->norm_times[s]) / 200;
        dist_comm_barrier(&k->c, &err);
    }
    OPS->free(CTX, h), OPS->free(CTX, d), OPS->free(CTX, x), OPS->free(CTX, w);
}

static void bench(struct rank *k) {
    struct kiln_error err = {0};
    float *zero = xcalloc((size_t)8192 * HIDDEN, 4);
    float *d = dev_floats(k, zero, (size_t)8192 * HIDDEN);
    free(zero);
    for (int s = 0; s < BENCH_SIZES; s++) {
        size_t n = bench_rows[s] * HIDDEN;
        int reps = bench_rows[s] >= 8192 ? 20 : 200;
        for (int i = 0; i < 5; i++) dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err); /* warm */
        dist_comm_barrier(&k->c, &err);
        double t0 = now();
        for (int i = 0; i < reps; i++) dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err);
        OPS->synchronize(CTX);
        double t = (now() - t0) / reps;
        dist_comm_barrier(&k->c, &err);
        k->times[s] = t;
    }
    OPS->free(CTX, d);
}

static void *rank_main(void *a) {
    struct rank *k = a;
    struct kiln_error err = {0};
    struct backend_options bo = {.device = k->r};
    if (backend_create(&k->be, "cuda", &bo, &err)) {
        rank_fail(k, "rank %d: %s", k->r, err.msg);
        if (k->r == 0 && k->lfd >= 0) close(k->lfd);
        return NULL;
    }
    unsigned char blob[DIST_BLOB_MAX];
    size_t blen = sizeof blob;
    if (k->r == 0 && k->be.ops->comm_id(k->be.ctx, blob, &blen, &err)) {
        rank_fail(k, "comm_id: %s", err.msg);
        blen = 0;
    }
    struct dist_rdv_config cfg = {.init_addr = k->addr, .rank = k->r, .world_size = k->size, .timeout_s = 60,
                                  .listen_fd = k->r == 0 ? k->lfd : -1, .blob = blob, .blob_len = k->r == 0 ? blen : 0};
    if (dist_rendezvous(&cfg, &k->g, &err)) {
        rank_fail(k, "rendezvous: %s", err.msg);
    } else if (k->be.ops->comm_init(k->be.ctx, &k->c, k->r, k->size, k->g.blob, k->g.blob_len, &err)) {
        rank_fail(k, "comm_init: %s", err.msg);
    } else {
        /* the one-shot kernel's sizes (multiples of 4 floats up to 1 MiB:
         * one block, several, its largest) and NCCL's (odd, large) */
        const size_t sizes[] = {1, 5, 4096, 100000, 262144, 100003, (size_t)4 << 20};
        for (int i = 0; i < 7 && !k->failed; i++) check_all_reduce(k, sizes[i], DIST_SUM);
        check_all_reduce(k, 100003, DIST_MAX);
        int fused = OPS->norm_reduce_ok && OPS->norm_reduce_ok(CTX, &k->c, 1, NORM_DIM);
        if (fused != k->one_shot)
            rank_fail(k, "norm_reduce_ok says %d with KILN_CUDA_ONE_SHOT %s", fused, k->one_shot ? "on" : "0");
        if (!k->failed && k->one_shot) check_norm_reduce(k);
        if (!k->failed) check_gather_scatter(k);
        if (!k->failed) check_all_to_all(k);
        if (!k->failed) check_broadcast_graph(k);
        if (!k->failed) bench(k);
        if (!k->failed) bench_norm(k);
        dist_comm_free(&k->c);
    }
    dist_group_free(&k->g);
    backend_destroy(&k->be);
    return NULL;
}

/* One run of every check and measurement, one thread per GPU; the slowest
 * rank's times into t and nt. */
static void run_ranks(int size, int one_shot, double t[BENCH_SIZES], double nt[NORM_SIZES]) {
    struct kiln_error err = {0};
    if (setenv("KILN_CUDA_ONE_SHOT", one_shot ? "1048576" : "0", 1) || knob_reload(&err))
        fail_msg("KILN_CUDA_ONE_SHOT: %s", err.msg);
    int port;
    int lfd = dist_listen("127.0.0.1:0", &port, &err);
    if (lfd < 0) fail_msg("listen: %s", err.msg);
    struct rank rk[MAX_RANKS];
    double times[MAX_RANKS][BENCH_SIZES], norm_times[MAX_RANKS][NORM_SIZES];
    uint64_t hashes[MAX_RANKS][NORM_CALLS];
    memset(hashes, 0, sizeof hashes);
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        memset(&rk[r], 0, sizeof rk[r]);
        rk[r].r = r, rk[r].size = size, rk[r].lfd = r == 0 ? lfd : -1, rk[r].one_shot = one_shot;
        rk[r].times = times[r], rk[r].norm_times = norm_times[r], rk[r].hashes = hashes[r];
        snprintf(rk[r].addr, sizeof rk[r].addr, "127.0.0.1:%d", port);
        pthread_create(&th[r], NULL, rank_main, &rk[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (rk[r].failed) fail_msg("rank %d of %d (one-shot %s): %s", r, size, one_shot ? "on" : "off", rk[r].msg);
    for (int r = 1; r < size; r++)
        for (int c = 0; c < NORM_CALLS; c++)
            if (hashes[r][c] != hashes[0][c]) fail_msg("fused call %d: rank %d's x differs from rank 0's", c, r);
    for (int s = 0; s < BENCH_SIZES; s++) {
        t[s] = 0;
        for (int r = 0; r < size; r++) t[s] = times[r][s] > t[s] ? times[r][s] : t[s];
    }
    for (int s = 0; s < NORM_SIZES; s++) {
        nt[s] = 0;
        for (int r = 0; r < size; r++) nt[s] = norm_times[r][s] > nt[s] ? norm_times[r][s] : nt[s];
    }
}

static void test_nccl(void **state) {
    (void)state;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    if (n_dev < 2) fail_msg("test_cuda_nccl needs two or more GPUs (found %d): run it with ctest -L gpu_multi "
                            "on a machine with several", n_dev);
    int size = n_dev < MAX_RANKS ? n_dev : MAX_RANKS;
    double t[2][BENCH_SIZES], nt[2][NORM_SIZES];
    run_ranks(size, 0, t[0], nt[0]);
    run_ranks(size, 1, t[1], nt[1]);
    printf("all_reduce on %d GPUs, fp32 rows of %d (the slowest rank's mean; one-shot: the IPC kernel up to "
           "1 MiB, NCCL beyond):\n", size, HIDDEN);
    printf("%8s %12s %12s %14s %14s\n", "rows", "bytes", "NCCL us", "bus GB/s", "one-shot us");
    for (int s = 0; s < BENCH_SIZES; s++) {
        double bytes = (double)bench_rows[s] * HIDDEN * 4;
        printf("%8zu %12.0f %12.1f %14.1f %14.1f\n", bench_rows[s], bytes, t[0][s] * 1e6,
               bytes * 2.0 * (size - 1) / size / t[0][s] / 1e9, t[1][s] * 1e6);
    }
    printf("all_reduce + add_rmsnorm (NCCL) against the fused one-shot kernel, rows of %d:\n", HIDDEN);
    printf("%8s %14s %12s\n", "rows", "NCCL + norm", "fused");
    for (int s = 0; s < NORM_SIZES; s++)
        printf("%8ld %14.1f %12.1f\n", norm_bench_rows[s], nt[0][s] * 1e6, nt[1][s] * 1e6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
