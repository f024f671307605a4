/* bench_gemm_fp8.c — matrix products at prefill sizes with FP8 weights
 * (128 × 128 blocks) beside the same product with bf16 weights, on
 * Llama-3.1-8B's shapes, in TFLOP/s. Each figure is the median of 3 timed
 * loops of ≥ 0.25 s of work (CUDA events on the backend's stream).
 *
 * Rows, per shape and row count n:
 *   bf16 matmul     ops->matmul with bf16 weights (fp32 activations: the
 *                   conversion pass and cuBLAS), the peer
 *   fp8 matmul      ops->matmul with FP8 weights (the activations'
 *                   quantization pass and the product kiln picks)
 *   fp8 no-wgmma    the same with KILN_CUDA_WGMMA_FP8=0 (cuBLASLt's
 *                   block-scaled FP8 where it has a plan, else the weight
 *                   rows dequantized to bf16 for cuBLAS)
 *   e4m3 64-row     the e4m3 kernels alone on quantized activations
 *   e4m3 128-row    (cuda_wgmma_fp8_run: hopper/gemm_wgmma.cu's row tiles
 *   e4m3 192-row    of 64, hopper/gemm_fp8.cu's of 128 and 192)
 *
 *   bench_gemm_fp8 [--n N[,N...]] [--shape ROWSxCOLS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_CUDA_HOPPER
int main(void) {
    fprintf(stderr, "bench_gemm_fp8: needs a CUDA build for Hopper (KILN_CUDA=ON, architecture 90)\n");
    return 1;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

enum { MAX_NS = 16 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum kind { MATMUL, KERNEL64, KERNEL128, KERNEL192 };

struct run {
    struct backend *be;
    enum kind kind;
    float *y;
    const float *x;
    const void *xq;
    const float *xs;
    const struct backend_weight *w;
    long n;
};

static void once(const struct run *r) {
    const long N = r->w->rows, K = r->w->cols;
    if (r->kind == MATMUL) r->be->ops->matmul(r->be->ctx, r->y, N, r->x, K, r->w, NULL, r->n);
    else cuda_wgmma_fp8_run(r->be->ctx, r->y, N, r->xq, r->xs, r->w, NULL, r->n, r->kind == KERNEL64 ? 64 : r->kind == KERNEL128 ? 128 : 192);
}

/* seconds per product: the median of 3 loops */
static double time_run(const struct run *r) {
    struct cuda_ctx *c = r->be->ctx;
    const double flop = 2.0 * (double)r->n * (double)r->w->rows * (double)r->w->cols;
    int reps = (int)(2.5e14 / flop) + 1; /* ~0.25 s at 1 PFLOP/s */
    if (reps > 200) reps = 200;
    once(r);
    KILN_ASSERT(cudaStreamSynchronize(c->stream) == cudaSuccess);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double t[3];
    for (int k = 0; k < 3; k++) {
        cudaEventRecord(e0, c->stream);
        for (int i = 0; i < reps; i++) once(r);
        cudaEventRecord(e1, c->stream);
        KILN_ASSERT(cudaEventSynchronize(e1) == cudaSuccess);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[k] = ms / 1e3 / reps;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(t, 3, sizeof t[0], cmp_double);
    return t[1];
}

static void run_shape(struct backend *be, struct backend *off, long N, long K, const long *ns, int n_ns) {
    const struct backend_ops *ops = be->ops;
    long nmax = 0;
    for (int i = 0; i < n_ns; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    /* weights: bf16 near ±1/64, e4m3 codes of the same size with scale 1/448 */
    uint16_t *h16 = xmalloc((size_t)(N * K) * 2);
    uint8_t *h8 = xmalloc((size_t)(N * K));
    for (long i = 0; i < N * K; i++) {
        uint64_t r = next();
        h16[i] = (uint16_t)(0x3c00 | (r & 0x3ff)) ^ (uint16_t)((r >> 20) & 0x8000);
        uint8_t v = (uint8_t)(r >> 32);
        h8[i] = (v & 0x7f) == 0x7f ? 0x7e : v;
    }
    const long nbr = (N + 127) / 128, nbc = K / 128;
    float *sc = xmalloc((size_t)(nbr * nbc) * 4);
    for (long i = 0; i < nbr * nbc; i++) sc[i] = 1.0f / 448.0f;
    struct backend_weight wb = {.data = ops->weight_upload(be->ctx, h16, (size_t)(N * K) * 2),
                                .dtype = DTYPE_BF16, .rows = N, .cols = K};
    struct backend_weight w8 = {.data = ops->weight_upload(be->ctx, h8, (size_t)(N * K)),
                                .dtype = DTYPE_F8_E4M3, .rows = N, .cols = K,
                                .scale = ops->weight_upload(be->ctx, sc, (size_t)(nbr * nbc) * 4),
                                .block_rows = 128, .block_cols = 128};
    struct backend_weight w8o = w8; /* the same bytes on the other backend */
    w8o.data = off->ops->weight_upload(off->ctx, h8, (size_t)(N * K));
    w8o.scale = off->ops->weight_upload(off->ctx, sc, (size_t)(nbr * nbc) * 4);
    free(h16), free(h8), free(sc);
    KILN_ASSERT(wb.data && w8.data && w8.scale && w8o.data && w8o.scale);
    float *xh = xmalloc((size_t)(nmax * K) * 4);
    for (long i = 0; i < nmax * K; i++) xh[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    float *x = ops->alloc(be->ctx, (size_t)(nmax * K) * 4), *y = ops->alloc(be->ctx, (size_t)(nmax * N) * 4);
    float *xo = off->ops->alloc(off->ctx, (size_t)(nmax * K) * 4),
          *yo = off->ops->alloc(off->ctx, (size_t)(nmax * N) * 4);
    void *xq = ops->alloc(be->ctx, q8_bytes(nmax, K));
    KILN_ASSERT(x && y && xo && yo && xq);
    ops->upload(be->ctx, x, xh, (size_t)(nmax * K) * 4);
    off->ops->upload(off->ctx, xo, xh, (size_t)(nmax * K) * 4);
    free(xh);
    for (int i = 0; i < n_ns; i++) {
        const long n = ns[i];
        struct cuda_ctx *c = be->ctx;
        float *xs = q8_scales(xq, n, K);
        cuda_fp8_quant_act(c, xq, xs, x, K, n, K);
        struct run runs[6] = {
            {be, MATMUL, y, x, NULL, NULL, &wb, n},
            {be, MATMUL, y, x, NULL, NULL, &w8, n},
            {off, MATMUL, yo, xo, NULL, NULL, &w8o, n},
            {be, KERNEL64, y, NULL, xq, xs, &w8, n},
            {be, KERNEL128, y, NULL, xq, xs, &w8, n},
            {be, KERNEL192, y, NULL, xq, xs, &w8, n},
        };
        const char *names[6] = {"bf16 matmul", "fp8 matmul", "fp8 no-wgmma", "e4m3 64-row", "e4m3 128-row",
                                "e4m3 192-row"};
        double tf[6] = {0};
        for (int k = 0; k < 6; k++) {
            if (runs[k].kind != MATMUL && !c->wgmma) continue;
            const double t = time_run(&runs[k]);
            tf[k] = 2.0 * (double)n * (double)N * (double)K / t / 1e12;
            printf("  %6ld x %-6ld n=%-5ld %-13s %9.1f us %7.1f TFLOP/s %5.2fx bf16\n", N, K, n, names[k],
                   t * 1e6, tf[k], tf[0] > 0 ? tf[k] / tf[0] : 0.0);
        }
    }
    ops->weight_release(be->ctx, wb.data), ops->weight_release(be->ctx, w8.data);
    ops->weight_release(be->ctx, w8.scale);
    off->ops->weight_release(off->ctx, w8o.data), off->ops->weight_release(off->ctx, w8o.scale);
    ops->free(be->ctx, x), ops->free(be->ctx, y), ops->free(be->ctx, xq);
    off->ops->free(off->ctx, xo), off->ops->free(off->ctx, yo);
}

int main(int argc, char **argv) {
    long ns[MAX_NS] = {256, 512, 1024, 2048, 4096, 8192}, rows = 0, cols = 0;
    int n_ns = 6, shape = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--n")) {
            n_ns = 0;
            for (char *p = (char *)v; *p && n_ns < MAX_NS;) {
                ns[n_ns++] = strtol(p, &p, 10);
                if (*p == ',') p++;
                else break;
            }
            i++;
        } else if (!strcmp(a, "--shape") && sscanf(v, "%ldx%ld", &rows, &cols) == 2) {
            shape = 1, i++;
        } else {
            fprintf(stderr, "usage: bench_gemm_fp8 [--n N[,N...]] [--shape ROWSxCOLS]\n");
            return 2;
        }
    }
    if (shape && (rows < 1 || cols < 128 || cols % 128 || rows > 65536 || cols > 65536)) {
        fprintf(stderr, "bench_gemm_fp8: --shape ROWSxCOLS takes 1..65536 rows and columns a multiple of 128 "
                        "(the FP8 weights' 128-column blocks)\n");
        return 2;
    }
    for (int i = 0; i < n_ns; i++)
        if (ns[i] < 1 || ns[i] > 16384) {
            fprintf(stderr, "bench_gemm_fp8: --n takes row counts of 1..16384\n");
            return 2;
        }
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    struct backend be, off;
    if (backend_create(&be, "cuda", &bo, &err) || be.ops->reserve(be.ctx, 16384, 16384, 64, &err)) {
        fprintf(stderr, "bench_gemm_fp8: %s\n", err.msg);
        return 1;
    }
    setenv("KILN_CUDA_WGMMA_FP8", "0", 1);
    knob_reload(NULL);
    int rc = backend_create(&off, "cuda", &bo, &err) || off.ops->reserve(off.ctx, 16384, 16384, 64, &err);
    unsetenv("KILN_CUDA_WGMMA_FP8");
    knob_reload(NULL);
    if (rc) {
        fprintf(stderr, "bench_gemm_fp8 (KILN_CUDA_WGMMA_FP8=0): %s\n", err.msg);
        return 1;
    }
    /* Llama-3.1-8B: q|k|v, o, gate|up, down */
    const long shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    if (shape) run_shape(&be, &off, rows, cols, ns, n_ns);
    else
        for (int s = 0; s < 4; s++) run_shape(&be, &off, shapes[s][0], shapes[s][1], ns, n_ns);
    backend_destroy(&off), backend_destroy(&be);
    return 0;
}
#endif
