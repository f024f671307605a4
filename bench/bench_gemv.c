/* bench_gemv.c — matrix products at decode and small-batch sizes on
 * Llama-3.1-8B's shapes, as weight bytes read per second (and TFLOP/s)
 * beside the device copy bandwidth measured in the same run. Each shape
 * rotates over enough copies of its weight (≥ 512 MB) that the L2 cache
 * cannot hold them; each figure is the median of 5 timed loops.
 *
 * Variants (CUDA; each is its own backend, created with the environment
 * switch set, all reading the same weight copies):
 *   n = 1, 2 (the GEMV): default | KILN_CUDA_PDL=0 | KILN_CUDA_GEMV_KS=1, 2, 4
 *   n ≥ 4 (bf16 activations): cuBLASLt default heuristic (the default) |
 *     cublasGemmEx (KILN_CUDA_LT=0) | the wgmma kernel (hopper/gemm_wgmma.cu;
 *     the default takes it for weights of 40 MiB or more, this variant for
 *     every size: KILN_CUDA_WGMMA_MIN_MB=0); the cuBLAS variants set
 *     KILN_CUDA_WGMMA=0
 *
 *   bench_gemv [--device cuda] [--rows N --cols N] [--n N] [--quick] [--wgmma]
 * --quick: the default variant only. Other devices: the default only.
 * --wgmma: n = 8, 16, 32, 64 (or --n), the five shapes (lm_head too),
 *   cuBLASLt against the wgmma kernel, shorter loops (3 rounds of ≥ 0.5
 *   GB); then the kernel alone ("kernel*": by shape, else BN and the K
 *   split forced), without the conversion pass, timed over graph replays
 *   (time_wgmma_kernel).
 */
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
#ifdef KILN_CUDA_HOPPER
#include "backend/cuda/cuda_backend.h"
#endif

enum { ROUNDS = 5, MAX_VARIANTS = 16 };

static double round_bytes = 6e9; /* --wgmma: 5e8, 3 rounds, ≥ 3 reps */
static int min_reps = 50, rounds = ROUNDS, only; /* only: 2 --wgmma */

struct variant {
    const char *name;
    const char *env[3][2]; /* variable, value */
    int gemv;              /* 1: for n ≤ 2, 0: for n ≥ 4, 2: both */
    struct backend be;
    int sets;              /* bit 1: one of --wgmma's variants */
    int ok;
};

static struct variant variants[] = {
    {"default", {{NULL, NULL}}, 2, {0}, 3, 0},
    {"no PDL", {{"KILN_CUDA_PDL", "0"}}, 1, {0}, 0, 0},
    {"KS=1", {{"KILN_CUDA_GEMV_KS", "1"}}, 1, {0}, 0, 0},
    {"KS=2", {{"KILN_CUDA_GEMV_KS", "2"}}, 1, {0}, 0, 0},
    {"KS=4", {{"KILN_CUDA_GEMV_KS", "4"}}, 1, {0}, 0, 0},
    {"old (no PDL, KS=1)", {{"KILN_CUDA_PDL", "0"}, {"KILN_CUDA_GEMV_KS", "1"}}, 1, {0}, 0, 0},
    {"GemmEx", {{"KILN_CUDA_LT", "0"}, {"KILN_CUDA_WGMMA", "0"}}, 0, {0}, 0, 0},
    {"cuBLASLt", {{"KILN_CUDA_WGMMA", "0"}}, 0, {0}, 3, 0},
    /* any weight size: the default threshold (40 MiB) would hand o_proj to cuBLAS */
    {"wgmma", {{"KILN_CUDA_WGMMA", "1"}, {"KILN_CUDA_WGMMA_MIN_MB", "0"}}, 0, {0}, 2, 0},
};
static const int n_variants = sizeof variants / sizeof variants[0];

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per product of be over the weight copies. */
static double time_product(struct backend *be, const struct backend_weight *w, int copies,
                           float *y, const float *x, long n) {
    const struct backend_ops *ops = be->ops;
    long rows = w[0].rows, cols = w[0].cols;
    for (int c = 0; c < copies; c++) ops->matmul(be->ctx, y, rows, x, cols, &w[c], NULL, n);
    ops->synchronize(be->ctx);
    double wbytes = (double)rows * (double)cols * 2;
    int reps = (int)(round_bytes / wbytes);
    if (reps < min_reps) reps = min_reps;
    double t[ROUNDS];
    for (int r = 0; r < rounds; r++) {
        double t0 = time_now();
        for (int i = 0; i < reps; i++) ops->matmul(be->ctx, y, rows, x, cols, &w[i % copies], NULL, n);
        ops->synchronize(be->ctx);
        t[r] = (time_now() - t0) / reps;
    }
    qsort(t, (size_t)rounds, sizeof t[0], cmp_double);
    return t[rounds / 2];
}

#ifdef KILN_CUDA_HOPPER
/* --wgmma: the wgmma kernel alone (no conversion pass: bf16 x made here),
 * REPS launches over the weight copies captured in one graph (as a decode
 * step runs them, programmatic launches overlapping), median of 3 replays;
 * seconds per product. bn, splits: 0 = by shape. */
static double time_wgmma_kernel(struct backend *be, const struct backend_weight *w, int copies,
                                float *y, const void *x16, long n, int bn, int splits) {
    struct cuda_ctx *c = be->ctx;
    long rows = w[0].rows, cols = w[0].cols;
    int reps = copies > 20 ? copies : 20;
    for (int i = 0; i < copies; i++) cuda_wgmma_run(c, y, rows, x16, cols, &w[i], NULL, n, bn, splits);
    KILN_ASSERT(cudaStreamSynchronize(c->stream) == cudaSuccess);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    KILN_ASSERT(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    for (int i = 0; i < reps; i++)
        cuda_wgmma_run(c, y, rows, x16, cols, &w[i % copies], NULL, n, bn, splits);
    KILN_ASSERT(cudaStreamEndCapture(c->stream, &g) == cudaSuccess);
    KILN_ASSERT(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double t[3];
    KILN_ASSERT(cudaGraphLaunch(ge, c->stream) == cudaSuccess);
    for (int r = 0; r < 3; r++) {
        cudaEventRecord(e0, c->stream);
        KILN_ASSERT(cudaGraphLaunch(ge, c->stream) == cudaSuccess);
        cudaEventRecord(e1, c->stream);
        KILN_ASSERT(cudaEventSynchronize(e1) == cudaSuccess);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[r] = ms / 1e3 / reps;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    qsort(t, 3, sizeof t[0], cmp_double);
    return t[1];
}

static void wgmma_kernel_rows(struct backend *be, const struct backend_weight *w, int copies,
                              float *y, const float *xh, long n, double bw) {
    struct cuda_ctx *c = be->ctx;
    if (!c->wgmma) return;
    long rows = w[0].rows, cols = w[0].cols;
    uint16_t *xb = xmalloc((size_t)(n * cols) * 2);
    for (long i = 0; i < n * cols; i++) xb[i] = f32_to_bf16(xh[i]);
    void *x16 = be->ops->alloc(be->ctx, (size_t)(n * cols) * 2);
    be->ops->upload(be->ctx, x16, xb, (size_t)(n * cols) * 2);
    be->ops->synchronize(be->ctx);
    static const int cfgs[][2] = {{0, 0}, {128, 1}, {128, 2}, {128, 4}, {128, 8}, {256, 0}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        int bn = cfgs[i][0], sp = cfgs[i][1];
        cuda_wgmma_plan(c, rows, cols, &bn, &sp);
        if (cfgs[i][1] && sp != cfgs[i][1]) continue; /* more splits than k-steps */
        double t = time_wgmma_kernel(be, w, copies, y, x16, n, cfgs[i][0], cfgs[i][1]);
        double gbs = (double)rows * cols * 2 / t;
        char name[32];
        snprintf(name, sizeof name, "kernel%s BN=%d S=%d", cfgs[i][1] ? "" : "*", bn, sp);
        printf("  %6ld x %-6ld n=%-4ld %-20s %9.2f us %8.1f GB/s %6.1f%% of copy\n", rows, cols, n,
               name, t * 1e6, gbs / 1e9, 100.0 * gbs / bw);
    }
    be->ops->free(be->ctx, x16);
    free(xb);
}
#endif

/* All variants for one shape; returns the default variant's n = 1 GB/s. */
static double run_shape(struct backend *base, long rows, long cols, const long *ns, int n_ns,
                        double bw, int quick) {
    const struct backend_ops *ops = base->ops;
    size_t wbytes = (size_t)rows * (size_t)cols * 2;
    int copies = (int)(((size_t)512 << 20) / wbytes) + 1;
    if (copies < 2) copies = 2;
    uint16_t *h = xmalloc(wbytes);
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)rows;
    for (size_t i = 0; i < wbytes / 2; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        h[i] = (uint16_t)(0x3c00 | (r & 0x3ff)) ^ (uint16_t)((r >> 20) & 0x8000); /* ±[0.0078, 0.0156) */
    }
    struct backend_weight *w = xmalloc((size_t)copies * sizeof *w);
    for (int c = 0; c < copies; c++) {
        w[c] = (struct backend_weight){.data = ops->weight_upload(base->ctx, h, wbytes), .dtype = DTYPE_BF16,
                                       .rows = rows, .cols = cols};
        if (!w[c].data) {
            fprintf(stderr, "out of device memory\n");
            exit(1);
        }
    }
    free(h);
    long nmax = 1;
    for (int j = 0; j < n_ns; j++) nmax = ns[j] > nmax ? ns[j] : nmax;
    float *x = ops->alloc(base->ctx, (size_t)nmax * cols * 4),
          *y = ops->alloc(base->ctx, (size_t)nmax * rows * 4);
    float *xh = xmalloc((size_t)nmax * cols * 4);
    for (long i = 0; i < nmax * cols; i++) xh[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    ops->upload(base->ctx, x, xh, (size_t)nmax * cols * 4);
    ops->synchronize(base->ctx);
    double g1 = 0;
    for (int j = 0; j < n_ns; j++) {
        long n = ns[j];
        for (int v = 0; v < n_variants; v++) {
            struct variant *va = &variants[v];
            if (!va->ok || (quick && v) || (va->gemv == 1 && n > 2) || (va->gemv == 0 && n <= 2) ||
                (only && !(va->sets & only)))
                continue;
            double t = time_product(&va->be, w, copies, y, x, n);
            double gbs = (double)wbytes / t, tf = 2.0 * (double)n * rows * cols / t / 1e12;
            printf("  %6ld x %-6ld n=%-4ld %-20s %9.2f us %8.1f GB/s %6.1f%% of copy %7.1f TFLOP/s\n",
                   rows, cols, n, va->name, t * 1e6, gbs / 1e9, 100.0 * gbs / bw, tf);
            if (v == 0 && n == 1) g1 = gbs;
        }
#ifdef KILN_CUDA_HOPPER
        for (int v = 0; only == 2 && v < n_variants; v++)
            if (variants[v].ok && !strcmp(variants[v].name, "wgmma"))
                wgmma_kernel_rows(&variants[v].be, w, copies, y, xh, n, bw);
#endif
    }
    for (int c = 0; c < copies; c++) ops->weight_release(base->ctx, w[c].data);
    ops->free(base->ctx, x), ops->free(base->ctx, y);
    free(w), free(xh);
    return g1;
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    long rows = 0, cols = 0, n = 0;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--rows")) rows = atol(v), i++;
        else if (!strcmp(a, "--cols")) cols = atol(v), i++;
        else if (!strcmp(a, "--n")) n = atol(v), i++;
        else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--wgmma")) only = 2, round_bytes = 5e8, min_reps = 3, rounds = 3;
        else {
            fprintf(stderr, "usage: bench_gemv [--device cuda] [--rows N --cols N] [--n N] [--quick] [--wgmma]\n");
            return 2;
        }
    }
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    if (strcmp(device, "cuda")) quick = 1;
    for (int v = 0; v < n_variants; v++) {
        struct variant *va = &variants[v];
        if ((quick && v) || (only && !(va->sets & only))) continue;
        for (int e = 0; e < 3 && va->env[e][0]; e++) setenv(va->env[e][0], va->env[e][1], 1);
        knob_reload(NULL); /* knobs are read once; each variant is its own setting */
        int rc = backend_create(&va->be, device, &bo, &err) ||
                 va->be.ops->reserve(va->be.ctx, 512, 4096, 64, &err);
        for (int e = 0; e < 3 && va->env[e][0]; e++) unsetenv(va->env[e][0]);
        knob_reload(NULL);
        if (rc) {
            fprintf(stderr, "bench_gemv (%s): %s\n", va->name, err.msg);
            if (v == 0) return 1;
            continue;
        }
        va->ok = 1;
    }
    struct backend *base = &variants[0].be;
    double bw = copy_bandwidth(base);
    printf("device %s: copy bandwidth %.1f GB/s (read + write); median of %d loops\n", device,
           bw / 1e9, ROUNDS);
    /* Llama-3.1-8B: q|k|v, o, gate|up, down, lm_head */
    const long shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336},
                              {128256, 4096}};
    long ns[] = {1, 2, 4, 8, 16, 32, 64, 128, 512};
    int n_ns = (int)(sizeof ns / sizeof ns[0]);
    if (only) ns[0] = 8, ns[1] = 16, ns[2] = 32, ns[3] = 64, n_ns = 4;
    if (n) ns[0] = n, n_ns = 1;
    double sum = 0, bytes = 0;
    for (int s = 0; s < 5; s++) {
        if (rows && (rows != shapes[s][0] || cols != shapes[s][1])) continue;
        double g = run_shape(base, shapes[s][0], shapes[s][1], ns, n_ns, bw, quick);
        double b = (double)shapes[s][0] * shapes[s][1] * 2;
        if (g > 0) sum += b / g, bytes += b;
    }
    if (rows && cols && bytes == 0) run_shape(base, rows, cols, ns, n_ns, bw, quick);
    if (sum > 0)
        printf("n=1 over the five shapes (default): %.1f GB/s, %.1f%% of copy bandwidth\n",
               bytes / sum / 1e9, 100.0 * bytes / sum / bw);
    for (int v = 0; v < n_variants; v++)
        if (variants[v].ok) backend_destroy(&variants[v].be);
    return 0;
}
