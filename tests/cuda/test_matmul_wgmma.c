/* test_matmul_wgmma.c — the small-M wgmma + TMA product
 * (src/backend/cuda/hopper/gemm_wgmma.cu) against a double-precision
 * reference, with fresh random inputs every run (seed from the clock unless
 * KILN_TEST_SEED is set; printed).
 *
 * Two levels:
 *  - the kernel itself (cuda_wgmma_run on 16-bit x and w): M = 1..64, N not
 *    a multiple of the 128/256-row tile, K of 1..224 k-steps and a K that is
 *    not a multiple of 64, bias, strided x and y, bf16 and f16, both tile
 *    widths and every K split 1..8 (cluster reductions); each case run twice,
 *    the second time recorded into a CUDA graph and replayed, and the two
 *    outputs compared bit for bit (fixed reduction order, capturable).
 *  - the routing (ops->matmul on fp32 activations, which the backend rounds
 *    to the weight's type first): the product runs the kernel for 1..64 rows
 *    (counted by cuda_ctx.wgmma_calls) and falls back to cuBLAS for 65 rows,
 *    K not a multiple of 8, KILN_CUDA_WGMMA=0, --deterministic and weights
 *    under the size threshold (KILN_CUDA_WGMMA_MIN_MB, default 40), each
 *    result checked the same way.
 *  - SwiGLU in the epilogue (cuda_wgmma_glu_run, gate|up of the decode
 *    MLP): against silu(g)·u in double, bit for bit against the unfused
 *    product + SwiGLU kernel, and the fused MLP op with it on and off.
 *  - rope and the K/V stores in the q|k|v product's epilogue
 *    (norm_matmul_rope): against the same backend's norm_matmul +
 *    qk_rope_store on the same inputs (queries within 1e-6, keys within
 *    one bf16 rounding, values bit for bit, every other cache row
 *    untouched), with and without a bias, scattered slots, graph replay,
 *    and the cases that take the two ops instead (65 rows, q/k norms,
 *    KILN_CUDA_WGMMA_ROPE=0).
 * Outputs are poisoned (NaN) first and the columns between N and the row
 * stride hold a sentinel that must survive: every element written, nothing
 * outside.
 *
 * Tolerance, ‖gpu − ref‖ / ‖ref‖: the reference uses the same 16-bit inputs
 * (x rounded exactly as the GPU does), so only the fp32 accumulation
 * differs: the products of 16-bit values are exact in fp32, and the sum over
 * K terms has a worst-case relative error near K·2^-24 (8.5e-4 at K =
 * 14336) and a typical one near √K·2^-24 (< 1e-5). 5e-4 is far under any
 * indexing, swizzle or layout error (those give 0.1..1.4) and under the
 * 2e-3 of an activation left unrounded; measured values are printed.
 *
 * The kernel exists on builds for Hopper (KILN_CUDA_HOPPER) and runs on
 * compute capability 9.0: elsewhere the test says so and fails rather than
 * pass without having run. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_dense.h"
#include "cuda_test_rng.h"

#define TOL 5e-4

/* all with KILN_CUDA_GEMV_MAX_ROWS=0 (every row count reaches product16) */
static struct backend gpu;     /* KILN_CUDA_WGMMA=1, KILN_CUDA_WGMMA_MIN_MB=0: any weight size */
static struct backend gpu_off; /* KILN_CUDA_WGMMA=0 */
static struct backend gpu_det; /* --deterministic */
static struct backend gpu_thr; /* KILN_CUDA_WGMMA=1, default weight-size threshold (40 MiB) */
static struct backend gpu_noglu; /* as gpu, KILN_CUDA_WGMMA_GLU=0 */
static struct backend gpu_norope; /* as gpu, KILN_CUDA_WGMMA_ROPE=0 */
static int have_gpu;

static uint16_t to16(float v, enum dtype dt) {
    return dt == DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
static double from16(uint16_t h, enum dtype dt) {
    return dt == DTYPE_BF16 ? (double)bf16_to_f32(h) : (double)f16_to_f32(h);
}

/* ref[m][N] = x16 · w16ᵀ + bias in double */
static double *reference(const uint16_t *x, long ldx, const uint16_t *w, const float *bias, long m,
                         long N, long K, enum dtype dt) {
    double *ref = xmalloc((size_t)(m * N) * sizeof *ref);
    double *xd = xmalloc((size_t)K * sizeof *xd);
    for (long i = 0; i < m; i++) {
        for (long k = 0; k < K; k++) xd[k] = from16(x[i * ldx + k], dt);
        for (long j = 0; j < N; j++) {
            const uint16_t *wr = w + j * K;
            double s = 0;
            for (long k = 0; k < K; k++) s += xd[k] * from16(wr[k], dt);
            ref[i * N + j] = s + (bias ? bias[j] : 0.0);
        }
    }
    free(xd);
    return ref;
}

struct kcase {
    long m, N, K, ldx, ldy; /* ldx, ldy: 0 = K, N */
    enum dtype dt;
    int bias, bn, splits;   /* bn, splits: 0 = chosen by shape */
};

/* The kernel directly: y = x16 · wᵀ (+ bias), twice, bit-identical. */
static void check_kernel(const struct kcase *t) {
    struct cuda_ctx *c = gpu.ctx;
    long m = t->m, N = t->N, K = t->K, ldx = t->ldx ? t->ldx : K, ldy = t->ldy ? t->ldy : N;
    uint16_t *x = xmalloc((size_t)(m * ldx) * 2), *w = xmalloc((size_t)(N * K) * 2);
    for (long i = 0; i < m * ldx; i++) x[i] = to16(frand(1.0f), t->dt);
    for (long i = 0; i < N * K; i++) w[i] = to16(frand(0.05f), t->dt);
    float *bias = NULL;
    if (t->bias) {
        bias = xmalloc((size_t)N * 4);
        for (long j = 0; j < N; j++) bias[j] = frand(1.0f);
    }
    float *y = xmalloc((size_t)(m * ldy) * 4), *y2 = xmalloc((size_t)(m * ldy) * 4);
    for (long i = 0; i < m; i++)
        for (long j = 0; j < ldy; j++) y[i * ldy + j] = j < N ? NAN : SENTINEL;
    void *dx = dev_from(x, (size_t)(m * ldx) * 2), *dw = dev_from(w, (size_t)(N * K) * 2);
    float *db = bias ? dev_from(bias, (size_t)N * 4) : NULL;
    float *dy = dev_from(y, (size_t)(m * ldy) * 4);
    struct backend_weight bw = {.data = dw, .dtype = t->dt, .rows = N, .cols = K};
    assert_true(cuda_wgmma_ok(c, &bw, dx, ldx, m));
    long calls = c->wgmma_calls;
    cuda_wgmma_run(c, dy, ldy, dx, ldx, &bw, db, m, t->bn, t->splits);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(c->wgmma_calls, calls + 1);
    assert_int_equal(cudaMemcpy(y, dy, (size_t)(m * ldy) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    /* the second run recorded into a graph and replayed (as decode steps
     * run it) into a freshly poisoned y */
    float *dy2 = dev_from(y, (size_t)(m * ldy) * 4);
    {
        float *poison = xmalloc((size_t)(m * ldy) * 4);
        for (long i = 0; i < m; i++)
            for (long j = 0; j < ldy; j++) poison[i * ldy + j] = j < N ? NAN : SENTINEL;
        assert_int_equal(cudaMemcpy(dy2, poison, (size_t)(m * ldy) * 4, cudaMemcpyHostToDevice),
                         cudaSuccess);
        free(poison);
    }
    cudaGraph_t g;
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda_wgmma_run(c, dy2, ldy, dx, ldx, &bw, db, m, t->bn, t->splits);
    assert_int_equal(cudaStreamEndCapture(c->stream, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(ge, c->stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(cudaMemcpy(y2, dy2, (size_t)(m * ldy) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaFree(dy2);
    double *ref = reference(x, ldx, w, bias, m, N, K, t->dt);
    double e = rel_err(y, ref, m, N, ldy);
    printf("  kernel m=%-2ld N=%-5ld K=%-5ld ldx=%-5ld ldy=%-5ld %s%s bn=%d S=%d: rel err %.2e\n", m,
           N, K, ldx, ldy, t->dt == DTYPE_BF16 ? "bf16" : "f16", bias ? " bias" : "", t->bn,
           t->splits, e);
    assert_true(e < TOL);
    assert_memory_equal(y, y2, (size_t)(m * ldy) * 4); /* graph replay: the same bits */
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dy);
    free(x), free(w), free(bias), free(y), free(y2), free(ref);
}

static void test_kernel(void **state) {
    (void)state;
    assert_true(have_gpu);
    const enum dtype B = DTYPE_BF16, H = DTYPE_F16;
    const struct kcase cases[] = {
        /* m, N, K, ldx, ldy, dtype, bias, bn, splits */
        {1, 200, 64, 0, 0, B, 1, 128, 1},
        {7, 1000, 192, 0, 0, B, 0, 0, 0},
        {16, 384, 1024, 0, 0, B, 1, 128, 3},
        {33, 4168, 4096, 4160, 4173, B, 1, 0, 0},
        {64, 6144, 4096, 0, 0, B, 0, 0, 0},  /* Llama-3.1-8B q|k|v */
        {64, 1024, 14336, 0, 0, B, 0, 0, 0}, /* down_proj's K */
        {64, 520, 4096, 0, 0, B, 1, 256, 8},
        {48, 296, 512, 520, 300, H, 1, 256, 2},
        {20, 777, 4096, 0, 0, H, 0, 0, 0},
        {64, 128, 64, 0, 0, B, 0, 256, 1},   /* N under one 256-row tile */
        {5, 3, 128, 0, 0, B, 1, 128, 2},     /* 3 weight rows */
        {64, 130, 136, 0, 0, B, 1, 128, 1},  /* K tail: 2 k-steps + 8 columns */
        {9, 300, 200, 208, 0, H, 0, 256, 3}, /* K tail with a split */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_kernel(&cases[i]);
    /* every split on one shape, both tile widths */
    for (int s = 1; s <= 8; s++) {
        struct kcase t = {64, 1000, 1024, 0, 0, B, s & 1, s & 1 ? 128 : 256, s};
        check_kernel(&t);
    }
}

/* SwiGLU in the epilogue (cuda_wgmma_glu_run): y16[m][inter] (row stride
 * ldy, sentinel columns past inter) = silu(x·gateᵀ)·(x·upᵀ) rounded to dt,
 * for w = [gate; up]. Checked three ways: against silu(g)·u computed in
 * double from the same 16-bit inputs (tolerance: the output's own rounding,
 * 2^-9 relative for bf16 and 2^-12 for f16 per element, so 4e-3 / 6e-4 on
 * the norm, plus the accumulation's 5e-4), bit for bit against the
 * unfused path it replaces (cuda_wgmma_run's fp32 product with the same
 * tile width and split, then cuda_silu16), and a graph replay bit for bit
 * against the eager run. */
struct gcase {
    long m, inter, K, ldy; /* ldy: 0 = inter */
    enum dtype dt;
    int bn, splits;
};

static void check_glu(const struct gcase *t) {
    struct cuda_ctx *c = gpu.ctx;
    long m = t->m, I = t->inter, N = 2 * I, K = t->K, ldy = t->ldy ? t->ldy : I;
    uint16_t *x = xmalloc((size_t)(m * K) * 2), *w = xmalloc((size_t)(N * K) * 2);
    for (long i = 0; i < m * K; i++) x[i] = to16(frand(1.0f), t->dt);
    for (long i = 0; i < N * K; i++) w[i] = to16(frand(0.05f), t->dt);
    uint16_t *init = xmalloc((size_t)(m * ldy) * 2), *y = xmalloc((size_t)(m * ldy) * 2),
             *y2 = xmalloc((size_t)(m * ldy) * 2), *yu = xmalloc((size_t)(m * ldy) * 2);
    const uint16_t nan16 = t->dt == DTYPE_BF16 ? 0x7fc1 : 0x7e01, sent = to16(SENTINEL, t->dt);
    for (long i = 0; i < m; i++)
        for (long j = 0; j < ldy; j++) init[i * ldy + j] = j < I ? nan16 : sent;
    void *dx = dev_from(x, (size_t)(m * K) * 2), *dw = dev_from(w, (size_t)(N * K) * 2);
    void *dy = dev_from(init, (size_t)(m * ldy) * 2), *dy2 = dev_from(init, (size_t)(m * ldy) * 2);
    void *dyu = dev_from(init, (size_t)(m * I) * 2); /* cuda_silu16 writes [m][inter] */
    float *dgu = NULL;
    assert_int_equal(cudaMalloc((void **)&dgu, (size_t)(m * N) * 4), cudaSuccess);
    struct backend_weight bw = {.data = dw, .dtype = t->dt, .rows = N, .cols = K};
    assert_true(cuda_wgmma_glu_ok(c, &bw, dx, K, dy, ldy, m));
    cuda_wgmma_glu_run(c, dy, ldy, dx, K, &bw, m, t->bn, t->splits);
    /* the unfused path: the fp32 product, then the SwiGLU kernel */
    cuda_wgmma_run(c, dgu, N, dx, K, &bw, NULL, m, t->bn, t->splits);
    cuda_silu16(c, dyu, t->dt, dgu, N, m, I);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda_wgmma_glu_run(c, dy2, ldy, dx, K, &bw, m, t->bn, t->splits);
    assert_int_equal(cudaStreamEndCapture(c->stream, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(ge, c->stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    assert_int_equal(cudaMemcpy(y, dy, (size_t)(m * ldy) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(y2, dy2, (size_t)(m * ldy) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(yu, dyu, (size_t)(m * I) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    double *ref = reference(x, K, w, NULL, m, N, K, t->dt); /* [m][gate | up] */
    double num = 0, den = 0;
    for (long i = 0; i < m; i++) {
        for (long j = 0; j < I; j++) {
            double gg = ref[i * N + j], u = ref[i * N + I + j], r = gg / (1 + exp(-gg)) * u;
            double v = from16(y[i * ldy + j], t->dt);
            if (isnan(v)) fail_msg("NaN at row %ld col %ld (unwritten?)", i, j);
            num += (v - r) * (v - r), den += r * r;
        }
        for (long j = I; j < ldy; j++)
            if (y[i * ldy + j] != sent) fail_msg("row %ld col %ld (padding) overwritten", i, j);
    }
    double e = sqrt(num / (den > 0 ? den : 1)), tol = (t->dt == DTYPE_BF16 ? 4e-3 : 6e-4) + TOL;
    printf("  glu m=%-2ld inter=%-5ld K=%-5ld ldy=%-5ld %s bn=%d S=%d: rel err %.2e (tol %.1e)\n",
           m, I, K, ldy, t->dt == DTYPE_BF16 ? "bf16" : "f16", t->bn, t->splits, e, tol);
    assert_true(e < tol);
    for (long i = 0; i < m; i++) /* the unfused path's bits */
        assert_memory_equal(y + i * ldy, yu + i * I, (size_t)I * 2);
    assert_memory_equal(y, y2, (size_t)(m * ldy) * 2); /* graph replay */
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dy2), cudaFree(dyu), cudaFree(dgu);
    free(x), free(w), free(init), free(y), free(y2), free(yu), free(ref);
}

static void test_glu(void **state) {
    (void)state;
    assert_true(have_gpu);
    const enum dtype B = DTYPE_BF16, H = DTYPE_F16;
    const struct gcase cases[] = {
        /* m, inter, K, ldy, dtype, bn, splits */
        {64, 1792, 4096, 0, B, 0, 0},    /* Llama-3.1-8B's shape, an eighth of its inter */
        {1, 128, 64, 0, B, 128, 1},
        {37, 384, 1000, 392, B, 128, 3}, /* K tail, padded rows */
        {16, 512, 2048, 0, H, 256, 2},
        {64, 256, 4096, 260, B, 256, 8},
        {5, 640, 512, 0, H, 128, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_glu(&cases[i]);
}

/* The fused MLP op (norm, gate|up, SwiGLU, down) with the SwiGLU in the
 * product's epilogue gives the bits of the same op with it off
 * (KILN_CUDA_WGMMA_GLU=0: the SwiGLU kernel), and runs it there. */
static void test_glu_mlp(void **state) {
    (void)state;
    assert_true(have_gpu);
    const long d = 1024, inter = 2816;
    const long ns[] = {1, 13, 64};
    struct backend *bes[2] = {&gpu, &gpu_noglu};
    uint16_t *wgu = xmalloc((size_t)(2 * inter * d) * 2), *wd = xmalloc((size_t)(d * inter) * 2);
    for (long i = 0; i < 2 * inter * d; i++) wgu[i] = to16(frand(0.05f), DTYPE_BF16);
    for (long i = 0; i < d * inter; i++) wd[i] = to16(frand(0.03f), DTYPE_BF16);
    float *nw = xmalloc((size_t)d * 4);
    for (long i = 0; i < d; i++) nw[i] = 1.0f + frand(0.2f);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        long n = ns[k];
        float *h = xmalloc((size_t)(n * d) * 4), *dl = xmalloc((size_t)(n * d) * 4);
        for (long i = 0; i < n * d; i++) h[i] = frand(1.0f), dl[i] = frand(1.0f);
        float *out[2];
        long glu_calls[2];
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            const struct backend_ops *ops = be->ops;
            struct cuda_ctx *c = be->ctx;
            struct backend_weight gu = {.data = ops->weight_upload(be->ctx, wgu, (size_t)(2 * inter * d) * 2),
                                        .dtype = DTYPE_BF16, .rows = 2 * inter, .cols = d};
            struct backend_weight dw = {.data = ops->weight_upload(be->ctx, wd, (size_t)(d * inter) * 2),
                                        .dtype = DTYPE_BF16, .rows = d, .cols = inter};
            float *dh = ops->alloc(be->ctx, (size_t)(n * d) * 4), *ddl = ops->alloc(be->ctx, (size_t)(n * d) * 4);
            float *dx = ops->alloc(be->ctx, (size_t)(n * d) * 4), *dy = ops->alloc(be->ctx, (size_t)(n * d) * 4);
            float *dgu = ops->alloc(be->ctx, (size_t)(n * 2 * inter) * 4), *dnw = ops->alloc(be->ctx, (size_t)d * 4);
            ops->upload(be->ctx, dh, h, (size_t)(n * d) * 4);
            ops->upload(be->ctx, ddl, dl, (size_t)(n * d) * 4);
            ops->upload(be->ctx, dnw, nw, (size_t)d * 4);
            struct backend_norm nm = {.h = dh, .delta = ddl, .x = dx, .w = dnw, .dim = d, .eps = 1e-5f};
            long calls = c->wgmma_calls;
            ops->norm_swiglu_mlp(be->ctx, &nm, dy, d, &(struct backend_stack){.cat = gu}, &dw, dgu,
                                 2 * inter, n);
            out[b] = xmalloc((size_t)(n * d) * 4);
            ops->download(be->ctx, out[b], dy, (size_t)(n * d) * 4);
            ops->synchronize(be->ctx);
            glu_calls[b] = c->wgmma_calls - calls;
            ops->weight_release(be->ctx, gu.data), ops->weight_release(be->ctx, dw.data);
            ops->free(be->ctx, dh), ops->free(be->ctx, ddl), ops->free(be->ctx, dx);
            ops->free(be->ctx, dy), ops->free(be->ctx, dgu), ops->free(be->ctx, dnw);
        }
        printf("  mlp n=%-2ld d=%ld inter=%ld: wgmma calls %ld (glu) / %ld (off)\n", n, d, inter,
               glu_calls[0], glu_calls[1]);
        assert_int_equal(glu_calls[0], 2); /* gate|up with its SwiGLU, then down */
        assert_int_equal(glu_calls[1], 2);
        assert_memory_equal(out[0], out[1], (size_t)(n * d) * 4);
        free(out[0]), free(out[1]), free(h), free(dl);
    }
    free(wgu), free(wd), free(nw);
}

/* norm_matmul_rope (H query and KH key/value heads of 128, d = 1024)
 * against norm_matmul + qk_rope_store on the same backend and inputs.
 * `fused`: whether the epilogue path must run (cuda_ctx.rope_fused). */
static void check_rope(struct backend *be, long n, int H, int KH, int bias, int qk_norm,
                       int fused) {
    const struct backend_ops *ops = be->ops;
    struct cuda_ctx *c = be->ctx;
    const long d = 1024, hd = 128, N = (long)(H + 2 * KH) * hd, kw = KH * hd, slots = 1024;
    const int maxpos = 512;
    uint16_t *w = xmalloc((size_t)(N * d) * 2);
    for (long i = 0; i < N * d; i++) w[i] = to16(frand(1.0f / sqrtf((float)d)), DTYPE_BF16);
    float *h = xmalloc((size_t)(n * d) * 4), *nw = xmalloc((size_t)d * 4), *b = xmalloc((size_t)N * 4),
          *qn = xmalloc((size_t)hd * 4), *cs = xmalloc((size_t)maxpos * 64 * 2 * 4);
    for (long i = 0; i < n * d; i++) h[i] = frand(2.0f);
    for (long i = 0; i < d; i++) nw[i] = 1.0f + frand(0.3f);
    for (long i = 0; i < N; i++) b[i] = frand(0.5f);
    for (long i = 0; i < hd; i++) qn[i] = 1.0f + frand(0.3f);
    for (int p = 0; p < maxpos; p++)
        for (int i = 0; i < 64; i++) {
            double th = p * pow(500000.0, -2.0 * i / 128.0);
            cs[(p * 64 + i) * 2] = (float)cos(th), cs[(p * 64 + i) * 2 + 1] = (float)sin(th);
        }
    int32_t *pos = xmalloc((size_t)n * 4), *slot = xmalloc((size_t)n * 4);
    for (long i = 0; i < n; i++) { /* distinct slots, out of order */
        pos[i] = (int32_t)(rng_next() % maxpos);
        slot[i] = (int32_t)((i * 389 + 17) % slots);
    }
    size_t cache_bytes = (size_t)(slots * kw) * 2;
    uint16_t *poison = xmalloc(cache_bytes);
    for (size_t i = 0; i < cache_bytes / 2; i++) poison[i] = 0x7fc1; /* a NaN pattern */
    struct backend_weight bw = {.data = ops->weight_upload(be->ctx, w, (size_t)(N * d) * 2), .dtype = DTYPE_BF16,
                                .rows = N, .cols = d};
    float *dh = ops->alloc(be->ctx, (size_t)(n * d) * 4), *dnw = ops->alloc(be->ctx, (size_t)d * 4),
          *db = ops->alloc(be->ctx, (size_t)N * 4), *dqn = ops->alloc(be->ctx, (size_t)hd * 4),
          *dcs = ops->alloc(be->ctx, (size_t)maxpos * 64 * 2 * 4), *dx = ops->alloc(be->ctx, (size_t)(n * d) * 4);
    int32_t *dpos = ops->alloc(be->ctx, (size_t)n * 4), *dslot = ops->alloc(be->ctx, (size_t)n * 4);
    ops->upload(be->ctx, dh, h, (size_t)(n * d) * 4);
    ops->upload(be->ctx, dnw, nw, (size_t)d * 4);
    ops->upload(be->ctx, db, b, (size_t)N * 4);
    ops->upload(be->ctx, dqn, qn, (size_t)hd * 4);
    ops->upload(be->ctx, dcs, cs, (size_t)maxpos * 64 * 2 * 4);
    ops->upload(be->ctx, dpos, pos, (size_t)n * 4);
    ops->upload(be->ctx, dslot, slot, (size_t)n * 4);
    float *y[3];
    void *kc[3], *vc[3];
    for (int k = 0; k < 3; k++) {
        y[k] = ops->alloc(be->ctx, (size_t)(n * N) * 4);
        kc[k] = ops->alloc(be->ctx, cache_bytes), vc[k] = ops->alloc(be->ctx, cache_bytes);
        ops->upload(be->ctx, kc[k], poison, cache_bytes);
        ops->upload(be->ctx, vc[k], poison, cache_bytes);
    }
    struct backend_norm nm = {.h = dh, .delta = NULL, .x = dx, .w = dnw, .dim = d, .eps = 1e-5f};
    struct backend_rope_store r = {.n_heads = H, .n_kv_heads = KH, .head_dim = (int)hd,
                                   .q_norm = qk_norm ? dqn : NULL, .k_norm = qk_norm ? dqn : NULL,
                                   .eps = 1e-6f, .rot_dim = (int)hd, .pos = dpos, .cos_sin = dcs,
                                   .interleaved = 0, .kv_stride = kw, .slots = dslot};
    const float *bb = bias ? db : NULL;
    /* 0: the fused op; 1: the two ops; 2: the fused op recorded and replayed */
    long f0 = c->rope_fused;
    r.k_cache = kc[0], r.v_cache = vc[0];
    ops->norm_matmul_rope(be->ctx, &nm, y[0], N, &(struct backend_stack){.cat = bw}, bb, n, &r);
    long ran = c->rope_fused - f0;
    ops->norm_matmul(be->ctx, &nm, y[1], N, &bw, bb, n);
    struct backend_rope_store r1 = r;
    r1.k_cache = kc[1], r1.v_cache = vc[1];
    ops->qk_rope_store(be->ctx, y[1], y[1] + H * hd, y[1] + H * hd + kw, N, n, &r1);
    r.k_cache = kc[2], r.v_cache = vc[2];
    ops->graph_begin(be->ctx);
    ops->norm_matmul_rope(be->ctx, &nm, y[2], N, &(struct backend_stack){.cat = bw}, bb, n, &r);
    void *g = ops->graph_end(be->ctx);
    assert_non_null(g);
    assert_int_equal(ops->graph_launch(be->ctx, g), 0);
    float *yh[3];
    uint16_t *kh[3], *vh[3];
    for (int k = 0; k < 3; k++) {
        yh[k] = xmalloc((size_t)(n * N) * 4), kh[k] = xmalloc(cache_bytes), vh[k] = xmalloc(cache_bytes);
        ops->download(be->ctx, yh[k], y[k], (size_t)(n * N) * 4);
        ops->download(be->ctx, kh[k], kc[k], cache_bytes);
        ops->download(be->ctx, vh[k], vc[k], cache_bytes);
    }
    ops->synchronize(be->ctx);
    double num = 0, den = 0;
    long kbad = 0, untouched = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < H * hd; j++) {
            double a = yh[0][i * N + j], e = yh[1][i * N + j];
            if (isnan(a)) fail_msg("q row %ld col %ld: NaN (unwritten?)", i, j);
            num += (a - e) * (a - e), den += e * e;
        }
    for (long s2 = 0; s2 < slots; s2++) {
        long row = -1;
        for (long i = 0; i < n; i++)
            if (slot[i] == s2) row = i;
        for (long j = 0; j < kw; j++) {
            uint16_t k0 = kh[0][s2 * kw + j], k1 = kh[1][s2 * kw + j];
            uint16_t v0 = vh[0][s2 * kw + j], v1 = vh[1][s2 * kw + j];
            if (row < 0) { /* not this batch's slot: the poison stays */
                untouched += k0 == 0x7fc1 && v0 == 0x7fc1;
                continue;
            }
            float a = bf16_to_f32(k0), e = bf16_to_f32(k1);
            /* one bf16 rounding apart (+ 1e-6 for values near 0 that
             * the rotation's cancellation left with fp32 noise) */
            if (isnan(a) || fabsf(a - e) > fabsf(e) * (1.0f / 128.0f) + 1e-6f) kbad++;
            if (v0 != v1) fail_msg("v cache slot %ld col %ld: %04x, the two ops %04x", s2, j, v0, v1);
        }
    }
    double qe = sqrt(num / den);
    printf("  rope n=%-2ld H=%d KH=%d bias=%d qk_norm=%d%s: %s, q rel diff %.2e, keys off by > 1 "
           "bf16 ulp %ld\n", n, H, KH, bias, qk_norm, be == &gpu_norope ? " (KILN_CUDA_WGMMA_ROPE=0)" : "",
           ran ? "epilogue" : "two ops", qe, kbad);
    assert_int_equal(ran, fused);
    assert_true(qe < 1e-6);
    assert_int_equal(kbad, 0);
    assert_int_equal(untouched, (slots - n) * kw);
    assert_memory_equal(yh[0], yh[2], (size_t)(n * N) * 4); /* the graph: the same bits */
    for (long i = 0; i < n; i++) {
        assert_memory_equal(kh[0] + slot[i] * kw, kh[2] + slot[i] * kw, (size_t)kw * 2);
        assert_memory_equal(vh[0] + slot[i] * kw, vh[2] + slot[i] * kw, (size_t)kw * 2);
    }
    ops->graph_destroy(be->ctx, g);
    for (int k = 0; k < 3; k++) {
        ops->free(be->ctx, y[k]), ops->free(be->ctx, kc[k]), ops->free(be->ctx, vc[k]);
        free(yh[k]), free(kh[k]), free(vh[k]);
    }
    ops->weight_release(be->ctx, bw.data);
    void *ds[] = {dh, dnw, db, dqn, dcs, dx, dpos, dslot};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ops->free(be->ctx, ds[i]);
    free(w), free(h), free(nw), free(b), free(qn), free(cs), free(pos), free(slot), free(poison);
}

static void test_rope(void **state) {
    (void)state;
    assert_true(have_gpu);
    check_rope(&gpu, 1, 8, 2, 0, 0, 1);
    check_rope(&gpu, 13, 8, 2, 1, 0, 1);
    check_rope(&gpu, 64, 32, 8, 0, 0, 1); /* Llama-3.1-8B's heads */
    check_rope(&gpu, 64, 28, 4, 1, 0, 1); /* Qwen2-7B's, with its q|k|v bias */
    check_rope(&gpu, 65, 8, 2, 1, 0, 0);  /* past 64 rows: cuBLAS, then qk_rope_store */
    check_rope(&gpu, 16, 8, 2, 0, 1, 0);  /* q/k norms (Qwen3): the two ops */
    check_rope(&gpu_norope, 16, 8, 2, 1, 0, 0);
}

/* The output projection after the decode attention (cuda_wgmma_attn_out):
 * runs from 16 MiB of weight (under cuda_wgmma's 40), planned on fewer
 * clusters, against the double reference; returns 0 (and writes nothing)
 * under 16 MiB. */
static void test_attn_out(void **state) {
    (void)state;
    assert_true(have_gpu);
    struct cuda_ctx *c = gpu_thr.ctx; /* the default thresholds */
    const long shapes[][3] = {{64, 4096, 2048}, {29, 2048, 4096}, {64, 1024, 1024}}; /* m, N, K */
    for (int t = 0; t < 3; t++) {
        long m = shapes[t][0], N = shapes[t][1], K = shapes[t][2];
        int runs = N * K * 2 >= (16l << 20);
        uint16_t *x = xmalloc((size_t)(m * K) * 2), *w = xmalloc((size_t)(N * K) * 2);
        for (long i = 0; i < m * K; i++) x[i] = to16(frand(1.0f), DTYPE_BF16);
        for (long i = 0; i < N * K; i++) w[i] = to16(frand(0.05f), DTYPE_BF16);
        float *y = xmalloc((size_t)(m * N) * 4);
        for (long i = 0; i < m * N; i++) y[i] = NAN;
        void *dx = dev_from(x, (size_t)(m * K) * 2), *dw = dev_from(w, (size_t)(N * K) * 2);
        float *dy = dev_from(y, (size_t)(m * N) * 4);
        struct backend_weight bw = {.data = dw, .dtype = DTYPE_BF16, .rows = N, .cols = K};
        long calls = c->wgmma_calls;
        int ran = cuda_wgmma_attn_out(c, dy, N, dx, K, &bw, NULL, m);
        assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
        assert_int_equal(ran, runs);
        assert_int_equal(c->wgmma_calls, calls + runs);
        assert_int_equal(cudaMemcpy(y, dy, (size_t)(m * N) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        if (runs) {
            double *ref = reference(x, K, w, NULL, m, N, K, DTYPE_BF16);
            double e = rel_err(y, ref, m, N, N);
            printf("  attn_out m=%-2ld N=%-4ld K=%-4ld: rel err %.2e\n", m, N, K, e);
            assert_true(e < TOL);
            free(ref);
        } else {
            for (long i = 0; i < m * N; i++)
                if (!isnan(y[i])) fail_msg("attn_out under 16 MiB wrote y[%ld]", i);
            printf("  attn_out m=%-2ld N=%-4ld K=%-4ld: under 16 MiB, not run\n", m, N, K);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(dy);
        free(x), free(w), free(y);
    }
}

/* Through ops->matmul (fp32 x, rounded to dt by the backend): whether the
 * kernel ran (`routed`) and the result against the rounded reference. */
static void check_matmul(struct backend *be, long n, long N, long K, enum dtype dt, int routed) {
    const struct backend_ops *ops = be->ops;
    struct cuda_ctx *c = be->ctx;
    float *x = xmalloc((size_t)(n * K) * 4);
    uint16_t *xr = xmalloc((size_t)(n * K) * 2), *w = xmalloc((size_t)(N * K) * 2);
    for (long i = 0; i < n * K; i++) x[i] = frand(1.0f), xr[i] = to16(x[i], dt);
    for (long i = 0; i < N * K; i++) w[i] = to16(frand(0.05f), dt);
    float *y = xmalloc((size_t)(n * N) * 4);
    for (long i = 0; i < n * N; i++) y[i] = NAN;
    float *dx = ops->alloc(be->ctx, (size_t)(n * K) * 4), *dy = ops->alloc(be->ctx, (size_t)(n * N) * 4);
    ops->upload(be->ctx, dx, x, (size_t)(n * K) * 4);
    ops->upload(be->ctx, dy, y, (size_t)(n * N) * 4);
    struct backend_weight bw = {.data = ops->weight_upload(be->ctx, w, (size_t)(N * K) * 2), .dtype = dt, .rows = N,
                                .cols = K};
    assert_non_null(bw.data);
    long calls = c->wgmma_calls;
    ops->matmul(be->ctx, dy, N, dx, K, &bw, NULL, n);
    ops->download(be->ctx, y, dy, (size_t)(n * N) * 4);
    ops->synchronize(be->ctx);
    double *ref = reference(xr, K, w, NULL, n, N, K, dt);
    double e = rel_err(y, ref, n, N, N);
    printf("  matmul n=%-2ld N=%-4ld K=%-4ld %s: %s, rel err %.2e\n", n, N, K,
           dt == DTYPE_BF16 ? "bf16" : "f16", c->wgmma_calls > calls ? "wgmma" : "other path", e);
    assert_int_equal(c->wgmma_calls, calls + (routed ? 1 : 0));
    assert_true(e < TOL);
    ops->weight_release(be->ctx, bw.data);
    ops->free(be->ctx, dx), ops->free(be->ctx, dy);
    free(x), free(xr), free(w), free(y), free(ref);
}

static void test_routing(void **state) {
    (void)state;
    assert_true(have_gpu);
    const long ns[] = {1, 2, 3, 16, 31, 64};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        check_matmul(&gpu, ns[i], 640, 1024, DTYPE_BF16, 1);
    check_matmul(&gpu, 24, 384, 512, DTYPE_F16, 1);
    check_matmul(&gpu, 65, 640, 1024, DTYPE_BF16, 0);  /* past 64 rows: cuBLAS */
    check_matmul(&gpu, 16, 640, 100, DTYPE_BF16, 0);   /* K % 8 != 0: cuBLAS */
    check_matmul(&gpu_off, 16, 640, 1024, DTYPE_BF16, 0);
    check_matmul(&gpu_det, 16, 640, 1024, DTYPE_BF16, 0);
    check_matmul(&gpu_thr, 16, 640, 1024, DTYPE_BF16, 0);  /* 1.3 MB weight: cuBLAS */
    check_matmul(&gpu_thr, 16, 4096, 4096, DTYPE_BF16, 0);  /* 32 MiB: cuBLAS */
    check_matmul(&gpu_thr, 16, 13312, 4096, DTYPE_BF16, 1); /* 104 MiB: the kernel */
}

int main(void) {
    rng_seed("test_matmul_wgmma");
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    setenv("KILN_CUDA_GEMV_MAX_ROWS", "0", 1);
    setenv("KILN_CUDA_WGMMA", "1", 1);
    setenv("KILN_CUDA_WGMMA_MIN_MB", "0", 1);
    knob_reload(NULL); /* knobs are read once; this test compares settings */
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_matmul_wgmma: %s; the tests below fail\n", err.msg);
    } else {
        struct cuda_ctx *c = gpu.ctx;
        if (!c->wgmma) {
            int major = 0, minor = 0;
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device);
#ifdef KILN_CUDA_HOPPER
            printf("test_matmul_wgmma: the kernel is off on this device (compute capability "
                   "%d.%d; it needs 9.0); the tests below fail\n", major, minor);
#else
            printf("test_matmul_wgmma: built without the Hopper kernels (device %d.%d); the "
                   "tests below fail\n", major, minor);
#endif
            have_gpu = 0;
        }
    }
    if (have_gpu) {
        setenv("KILN_CUDA_WGMMA", "0", 1);
        knob_reload(NULL);
        int rc = backend_create(&gpu_off, "cuda", &bo, &err);
        setenv("KILN_CUDA_WGMMA", "1", 1);
        knob_reload(NULL);
        struct backend_options bd = {.deterministic = 1};
        rc = rc || backend_create(&gpu_det, "cuda", &bd, &err);
        setenv("KILN_CUDA_WGMMA_GLU", "0", 1);
        knob_reload(NULL);
        rc = rc || backend_create(&gpu_noglu, "cuda", &bo, &err);
        unsetenv("KILN_CUDA_WGMMA_GLU");
        setenv("KILN_CUDA_WGMMA_ROPE", "0", 1);
        knob_reload(NULL);
        rc = rc || backend_create(&gpu_norope, "cuda", &bo, &err);
        unsetenv("KILN_CUDA_WGMMA_ROPE");
        unsetenv("KILN_CUDA_WGMMA_MIN_MB");
        knob_reload(NULL);
        if (rc || backend_create(&gpu_thr, "cuda", &bo, &err)) {
            fprintf(stderr, "cuda backend: %s\n", err.msg);
            return 1;
        }
        struct backend *all[6] = {&gpu, &gpu_off, &gpu_det, &gpu_thr, &gpu_noglu, &gpu_norope};
        for (int i = 0; i < 6; i++)
            if (all[i]->ops->reserve(all[i]->ctx, 128, 1024, 16, &err)) {
                fprintf(stderr, "reserve: %s\n", err.msg);
                return 1;
            }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_glu),
        cmocka_unit_test(test_glu_mlp),
        cmocka_unit_test(test_attn_out),
        cmocka_unit_test(test_rope),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu)
        backend_destroy(&gpu), backend_destroy(&gpu_off), backend_destroy(&gpu_det),
            backend_destroy(&gpu_thr), backend_destroy(&gpu_noglu), backend_destroy(&gpu_norope);
    return rc;
}
