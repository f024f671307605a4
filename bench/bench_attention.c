/* bench_attention.c — one layer's prefill attention at Llama-3.1-8B's shape
 * (32 query heads, 8 KV heads, head size 128, bf16 paged cache, page size
 * 16) for one prompt of T tokens from position 0, through the backend's
 * attention operation: the kernels picked by KILN_CUDA_FA (each variant its
 * own backend, created with the variable set), as TFLOP/s of the causal
 * work 4·d·H·T(T+1)/2, beside a bf16 product (cuBLAS through the matmul
 * operation, 8192 × 4096 × 4096) timed in the same run. Each figure is the
 * median of 5 timed loops. Also prints ‖new − fa2‖ / ‖fa2‖ at each T.
 *
 *   bench_attention [--tokens 512,4096,8192] [--heads 32 --kv-heads 8]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "bench_util.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

enum { ROUNDS = 5, D = 128, PAGE = 16 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct variant {
    const char *name, *fa; /* KILN_CUDA_FA value */
    struct backend be;
    int ok;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

/* median seconds of one call of fn over ROUNDS loops of reps calls */
#define TIME_MEDIAN(result, be, reps, call)                                  \
    do {                                                                     \
        double t_[ROUNDS];                                                   \
        for (int r_ = 0; r_ < ROUNDS; r_++) {                                \
            double t0_ = time_now();                                         \
            for (int i_ = 0; i_ < (reps); i_++) call;                        \
            (be)->ops->synchronize((be)->ctx);                               \
            t_[r_] = (time_now() - t0_) / (reps);                            \
        }                                                                    \
        qsort(t_, ROUNDS, sizeof(double), cmp_double);                       \
        result = t_[ROUNDS / 2];                                             \
    } while (0)

int main(int argc, char **argv) {
    long tokens[8] = {512, 4096, 8192};
    int n_t = 3, H = 32, KVH = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--tokens")) {
            n_t = 0;
            for (char *s = (char *)v; *s && n_t < 8; s += *s == ',') tokens[n_t++] = strtol(s, &s, 10);
            i++;
        } else if (!strcmp(a, "--heads")) H = atoi(v), i++;
        else if (!strcmp(a, "--kv-heads")) KVH = atoi(v), i++;
        else {
            fprintf(stderr, "usage: bench_attention [--tokens 512,4096,8192] [--heads N --kv-heads N]\n");
            return 2;
        }
    }
    long T_max = 0;
    for (int i = 0; i < n_t; i++) T_max = tokens[i] > T_max ? tokens[i] : T_max;
    struct variant vs[] = {{"fa2 (mma.sync)", "fa2", {0}, 0}, {"fa3 (wgmma)", "fa3", {0}, 0}};
    int n_v = 2;
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    for (int v = 0; v < n_v; v++) {
        setenv("KILN_CUDA_FA", vs[v].fa, 1);
        knob_reload(NULL); /* knobs are read once; each variant is its own setting */
        vs[v].ok = backend_create(&vs[v].be, "cuda", &bo, &err) == 0 &&
                   vs[v].be.ops->reserve(vs[v].be.ctx, T_max, T_max, H, &err) == 0;
        if (!vs[v].ok) printf("%s: not available (%s)\n", vs[v].name, err.msg);
    }
    unsetenv("KILN_CUDA_FA");
    knob_reload(NULL);
    if (!vs[0].ok) return 1;
    struct backend *be = &vs[0].be;
    const struct backend_ops *ops = be->ops;

    /* the bf16 product ceiling, measured here */
    {
        long n = 8192, k = 4096, m = 4096;
        uint16_t *wh = xmalloc((size_t)m * k * 2);
        for (long i = 0; i < m * k; i++) wh[i] = f32_to_bf16(frand() * 0.05f);
        struct backend_weight w = {.data = ops->weight_upload(be->ctx, wh, (size_t)m * k * 2), .dtype = DTYPE_BF16,
                                   .rows = m, .cols = k};
        float *xh = xmalloc((size_t)n * k * 4);
        for (long i = 0; i < n * k; i++) xh[i] = frand();
        float *x = ops->alloc(be->ctx, (size_t)n * k * 4), *y = ops->alloc(be->ctx, (size_t)n * m * 4);
        if (!x || !y) return 1;
        ops->upload(be->ctx, x, xh, (size_t)n * k * 4);
        for (int i = 0; i < 3; i++) ops->matmul(be->ctx, y, m, x, k, &w, NULL, n);
        ops->synchronize(be->ctx);
        double t;
        TIME_MEDIAN(t, be, 20, ops->matmul(be->ctx, y, m, x, k, &w, NULL, n));
        printf("bf16 product %ld x %ld x %ld (matmul op: cuBLASLt + the bf16 rounding of x): "
               "%.3f ms, %.1f TFLOP/s\n", n, m, k, t * 1e3, 2.0 * n * m * k / t / 1e12);
        ops->free(be->ctx, x), ops->free(be->ctx, y);
        ops->weight_release(be->ctx, w.data);
        free(wh), free(xh);
    }

    /* cache: T_max positions of KVH heads, pages in order */
    long stride = (long)KVH * D, slots = (T_max + PAGE - 1) / PAGE * PAGE;
    size_t nkv = (size_t)(slots * stride);
    uint16_t *kvh = xmalloc(nkv * 2);
    for (size_t i = 0; i < nkv; i++) kvh[i] = f32_to_bf16(frand());
    void *kc = ops->alloc(be->ctx, nkv * 2), *vc = ops->alloc(be->ctx, nkv * 2);
    ops->upload(be->ctx, kc, kvh, nkv * 2);
    for (size_t i = 0; i < nkv; i++) kvh[i] = f32_to_bf16(frand());
    ops->upload(be->ctx, vc, kvh, nkv * 2);
    long ldq = (long)H * D;
    size_t nq = (size_t)T_max * (size_t)ldq;
    float *qh = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) qh[i] = frand() * 2.0f;
    float *q = ops->alloc(be->ctx, nq * 4), *out[2];
    ops->upload(be->ctx, q, qh, nq * 4);
    for (int v = 0; v < n_v; v++) out[v] = ops->alloc(be->ctx, nq * 4);
    int32_t *meta = xmalloc((size_t)(T_max + slots / PAGE + 8) * 4);
    int32_t *dpos = ops->alloc(be->ctx, (size_t)T_max * 4), *dqs = ops->alloc(be->ctx, 8),
            *dps = ops->alloc(be->ctx, 8), *dpg = ops->alloc(be->ctx, (size_t)(slots / PAGE) * 4);
    for (long i = 0; i < T_max; i++) meta[i] = (int32_t)i;
    ops->upload(be->ctx, dpos, meta, (size_t)T_max * 4);
    ops->upload(be->ctx, dpg, meta, (size_t)(slots / PAGE) * 4);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = D, .dv = D, .k_stride = stride,
                            .v_stride = stride, .scale = 1.0f / sqrtf((float)D)};
    float *o0 = xmalloc(nq * 4), *o1 = xmalloc(nq * 4);

    printf("prefill attention, one layer: H=%d KVH=%d d=%d page=%d, one prompt from position 0\n", H, KVH, D,
           PAGE);
    for (int ti = 0; ti < n_t; ti++) {
        long T = tokens[ti];
        int32_t qs[2] = {0, (int32_t)T}, ps[2] = {0, (int32_t)((T + PAGE - 1) / PAGE)};
        ops->upload(be->ctx, dqs, qs, 8);
        ops->upload(be->ctx, dps, ps, 8);
        ops->synchronize(be->ctx);
        struct backend_batch b = {(int)T, 1, PAGE, dpos, dqs, dps, dpg};
        double flops = 4.0 * D * H * (double)T * (double)(T + 1) / 2.0, base = 0;
        for (int v = 0; v < n_v; v++) {
            if (!vs[v].ok) continue;
            struct backend *bv = &vs[v].be;
            for (int i = 0; i < 3; i++) bv->ops->attention(bv->ctx, out[v], ldq, q, ldq, kc, vc, &p, &b);
            bv->ops->synchronize(bv->ctx);
            int reps = T <= 1024 ? 200 : T <= 4096 ? 20 : 8;
            double t;
            TIME_MEDIAN(t, bv, reps, bv->ops->attention(bv->ctx, out[v], ldq, q, ldq, kc, vc, &p, &b));
            if (v == 0) base = t;
            double diff = 0;
            if (v > 0) {
                ops->download(be->ctx, o0, out[0], (size_t)T * ldq * 4);
                ops->download(be->ctx, o1, out[v], (size_t)T * ldq * 4);
                double num = 0, den = 0;
                for (size_t i = 0; i < (size_t)T * (size_t)ldq; i++) {
                    double d = (double)o1[i] - o0[i];
                    num += d * d, den += (double)o0[i] * o0[i];
                }
                diff = sqrt(num / den);
            }
            printf("T=%-5ld %-26s %8.3f ms %7.1f TFLOP/s  x%.2f vs fa2", T, vs[v].name, t * 1e3,
                   flops / t / 1e12, base / t);
            if (v > 0) printf("  rel diff vs fa2 %.2e", diff);
            printf("\n");
        }
    }
    for (int v = 0; v < n_v; v++)
        if (vs[v].ok) backend_destroy(&vs[v].be);
    free(kvh), free(qh), free(meta), free(o0), free(o1);
    return 0;
}
