/* test_wgmma_fp8.c — FP8 weights on the Hopper wgmma kernel
 * (src/backend/cuda/hopper/gemm_wgmma.cu, cuda_wgmma_fp8: e4m3 × e4m3
 * products with the block scales applied per 128-column step) against a
 * double-precision reference, fresh random inputs every run (KILN_TEST_SEED
 * repeats one).
 *
 *  - the kernel directly: the activations quantized on the GPU
 *    (cuda_fp8_quant_act: e4m3 per row and 128 columns), downloaded, and
 *    the reference summed in double from exactly those codes and scales and
 *    the weight's codes and block scales; row counts 1..300 (one and
 *    several row tiles of 64, a partial last one), weights whose rows end
 *    inside a block row and a 128-row tile (576, 1000), K from one
 *    128-column step to 4096 (K splits over clusters), bias, an output row
 *    stride past N whose sentinel must survive; each case run eagerly and
 *    again recorded into a CUDA graph and replayed: the same bits.
 *  - the kernels that write the e4m3 operand themselves (the norm before
 *    a product, the SwiGLU before down): byte for byte the plain op
 *    followed by the quantization pass;
 *  - the routing of ops->matmul (fp32 activations): 5..300 rows with 128 ×
 *    128 blocks take the kernel (counted by cuda_ctx.wgmma_fp8_calls); 1..4 rows
 *    (the FP8 GEMV), other block shapes, K not a multiple of 128,
 *    KILN_CUDA_WGMMA_FP8=0 and --deterministic do not; each result against
 *    the product of the unquantized activations.
 *
 * Tolerances, ‖gpu − ref‖ / ‖ref‖: against the reference of the same
 * codes, only the summation differs: each e4m3 × e4m3 product is exact,
 * the tensor cores add a 128-column step's products with a narrower than
 * fp32 accumulator (about 2^-14 relative to the step's sum), then fp32
 * adds the scaled steps: ~1e-4 at most; 1e-3 is far under a layout, scale
 * or row-tile error (order 1). Against the unquantized activations, the
 * rounding of each activation to e4m3 adds up to 2^-4 relative per element
 * (about 2.5e-2 RMS over an output): 6e-2, the bound test_cuda_fp8 uses
 * for cuBLASLt's block-scaled FP8. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define TOL_SAME 1e-3
#define TOL_UNQUANT 6e-2

static struct backend gpu;     /* defaults */
static struct backend gpu_off; /* KILN_CUDA_WGMMA_FP8=0 */
static struct backend gpu_det; /* --deterministic */
static int have_gpu;

/* An FP8 weight [N][K] of 128 × 128 blocks (bw = 128 × 128 unless given):
 * random finite codes, positive scales that put the weights near ±1/√K. */
struct w8 {
    uint8_t *q;
    float *s;
    long N, K, nbr, nbc;
};

static struct w8 w8_rand(long N, long K, int br, int bc) {
    struct w8 w = {.N = N, .K = K, .nbr = (N + br - 1) / br, .nbc = (K + bc - 1) / bc};
    w.q = xmalloc((size_t)(N * K));
    w.s = xmalloc((size_t)(w.nbr * w.nbc) * 4);
    for (long i = 0; i < N * K; i++) {
        uint8_t v;
        do v = (uint8_t)rng_next(); while ((v & 0x7f) == 0x7f);
        w.q[i] = v;
    }
    for (long i = 0; i < w.nbr * w.nbc; i++)
        w.s[i] = 1.0f / sqrtf((float)K) / 448.0f * (1.0f + 0.5f * frand(1.0f));
    return w;
}

static double w8_at(const struct w8 *w, long j, long k, int br, int bc) {
    return (double)fp8_e4m3_to_f32(w->q[j * w->K + k]) * w->s[(j / br) * w->nbc + k / bc];
}

/* The kernel on the GPU's own quantization of x, eager and from a graph. */
static void check_kernel(long m, long N, long K, long ldy, int bias) {
    struct cuda_ctx *c = gpu.ctx;
    struct w8 w = w8_rand(N, K, 128, 128);
    float *x = xmalloc((size_t)(m * K) * 4), *b = xmalloc((size_t)N * 4);
    for (long i = 0; i < m * K; i++) x[i] = frand(1.0f) * (1.0f + 8.0f * (float)((i / 128) % 3 == 0));
    for (long j = 0; j < N; j++) b[j] = frand(1.0f);
    void *dx = dev_from(x, (size_t)(m * K) * 4), *dq = NULL, *ds = NULL;
    assert_int_equal(cudaMalloc(&dq, (size_t)(m * K)), cudaSuccess);
    assert_int_equal(cudaMalloc(&ds, (size_t)(m * (K / 128)) * 4), cudaSuccess);
    struct backend_weight bw = {.data = dev_from(w.q, (size_t)(N * K)), .dtype = DTYPE_F8_E4M3,
                                .rows = N, .cols = K, .scale = dev_from(w.s, (size_t)(w.nbr * w.nbc) * 4),
                                .block_rows = 128, .block_cols = 128};
    float *db = bias ? dev_from(b, (size_t)N * 4) : NULL;
    float *y = poisoned(m, N, ldy), *y2 = xmalloc((size_t)(m * ldy) * 4);
    float *dy = dev_from(y, (size_t)(m * ldy) * 4), *dy2 = dev_from(y, (size_t)(m * ldy) * 4);
    assert_true(cuda_wgmma_fp8_ok(c, &bw, m));
    long calls = c->wgmma_fp8_calls;
    cuda_fp8_quant_act(c, dq, ds, dx, K, m, K);
    cuda_wgmma_fp8(c, dy, ldy, dq, ds, &bw, db, m);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(c->wgmma_fp8_calls, calls + 1);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda_wgmma_fp8(c, dy2, ldy, dq, ds, &bw, db, m);
    assert_int_equal(cudaStreamEndCapture(c->stream, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(ge, c->stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    assert_int_equal(cudaMemcpy(y, dy, (size_t)(m * ldy) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(y2, dy2, (size_t)(m * ldy) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    uint8_t *q = xmalloc((size_t)(m * K));
    float *s = xmalloc((size_t)(m * (K / 128)) * 4);
    assert_int_equal(cudaMemcpy(q, dq, (size_t)(m * K), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(s, ds, (size_t)(m * (K / 128)) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double *ref = xmalloc((size_t)(m * N) * sizeof *ref), *xd = xmalloc((size_t)K * sizeof *xd);
    for (long i = 0; i < m; i++) {
        for (long k = 0; k < K; k++) xd[k] = (double)fp8_e4m3_to_f32(q[i * K + k]) * s[(k / 128) * m + i];
        for (long j = 0; j < N; j++) {
            double acc = bias ? b[j] : 0.0;
            for (long k = 0; k < K; k++) acc += xd[k] * w8_at(&w, j, k, 128, 128);
            ref[i * N + j] = acc;
        }
    }
    double e = rel_err(y, ref, m, N, ldy);
    printf("  kernel m=%-3ld N=%-5ld K=%-5ld ldy=%-5ld%s: rel err %.2e\n", m, N, K, ldy,
           bias ? " bias" : "", e);
    assert_true(e < TOL_SAME);
    assert_memory_equal(y, y2, (size_t)(m * ldy) * 4);
    cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree((void *)bw.data), cudaFree((void *)bw.scale);
    cudaFree(db);
    cudaFree(dy), cudaFree(dy2);
    free(w.q), free(w.s), free(x), free(b), free(y), free(y2), free(q), free(s), free(ref), free(xd);
}

static void test_kernel(void **state) {
    (void)state;
    assert_true(have_gpu);
    check_kernel(1, 576, 128, 576, 1);
    check_kernel(5, 1000, 1024, 1003, 0);
    check_kernel(17, 4096, 4096, 4096, 1);
    check_kernel(64, 576, 2048, 580, 1);
    check_kernel(65, 1000, 512, 1000, 0);   /* a second row tile of one row */
    check_kernel(130, 384, 1536, 389, 1);
    check_kernel(300, 1024, 4096, 1024, 0); /* five row tiles, the last partial */
    check_kernel(64, 128, 14336, 128, 0);   /* one weight tile, the longest K: every split */
}

/* Through ops->matmul: whether the kernel ran, and the result against the
 * product of the fp32 activations. */
static void check_matmul(struct backend *be, long n, long N, long K, int br, int bc, int routed) {
    const struct backend_ops *ops = be->ops;
    struct cuda_ctx *c = be->ctx;
    struct w8 w = w8_rand(N, K, br, bc);
    float *x = xmalloc((size_t)(n * K) * 4), *y = poisoned(n, N, N);
    for (long i = 0; i < n * K; i++) x[i] = frand(1.0f);
    float *dx = ops->alloc(be->ctx, (size_t)(n * K) * 4), *dy = ops->alloc(be->ctx, (size_t)(n * N) * 4);
    ops->upload(be->ctx, dx, x, (size_t)(n * K) * 4);
    ops->upload(be->ctx, dy, y, (size_t)(n * N) * 4);
    struct backend_weight bw = {.data = ops->weight_upload(be->ctx, w.q, (size_t)(N * K)),
                                .dtype = DTYPE_F8_E4M3, .rows = N, .cols = K,
                                .scale = ops->weight_upload(be->ctx, w.s, (size_t)(w.nbr * w.nbc) * 4),
                                .block_rows = br, .block_cols = bc};
    assert_non_null(bw.data);
    long calls = c->wgmma_fp8_calls;
    ops->matmul(be->ctx, dy, N, dx, K, &bw, NULL, n);
    ops->download(be->ctx, y, dy, (size_t)(n * N) * 4);
    ops->synchronize(be->ctx);
    double *ref = xmalloc((size_t)(n * N) * sizeof *ref);
    for (long i = 0; i < n; i++)
        for (long j = 0; j < N; j++) {
            double acc = 0;
            for (long k = 0; k < K; k++) acc += (double)x[i * K + k] * w8_at(&w, j, k, br, bc);
            ref[i * N + j] = acc;
        }
    double e = rel_err(y, ref, n, N, N);
    int ran = c->wgmma_fp8_calls > calls;
    printf("  matmul n=%-3ld N=%-4ld K=%-4ld blocks %dx%d%s: %s, rel err %.2e\n", n, N, K, br, bc,
           be == &gpu_off ? " KILN_CUDA_WGMMA_FP8=0" : be == &gpu_det ? " deterministic" : "",
           ran ? "wgmma" : "other path", e);
    assert_int_equal(ran, routed);
    assert_true(e < TOL_UNQUANT);
    ops->weight_release(be->ctx, bw.data), ops->weight_release(be->ctx, bw.scale);
    ops->free(be->ctx, dx), ops->free(be->ctx, dy);
    free(w.q), free(w.s), free(x), free(y), free(ref);
}

static void test_routing(void **state) {
    (void)state;
    assert_true(have_gpu);
    const long ns[] = {5, 17, 64, 65, 300};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) check_matmul(&gpu, ns[i], 640, 1024, 128, 128, 1);
    check_matmul(&gpu, 1, 640, 1024, 128, 128, 0);  /* the FP8 GEMV */
    check_matmul(&gpu, 4, 640, 1024, 128, 128, 0);
    check_matmul(&gpu, 17, 640, 1024, 64, 128, 0);  /* blocks other than 128 x 128 */
    check_matmul(&gpu, 17, 640, 1040, 128, 128, 0); /* K not a multiple of 128 */
    check_matmul(&gpu_off, 17, 640, 1024, 128, 128, 0);
    check_matmul(&gpu_det, 17, 640, 1024, 128, 128, 0);
}

/* The kernels that write the e4m3 operand as they produce it: the residual
 * add + RMSNorm (cuda_add_rmsnorm8) and the SwiGLU (cuda_fp8_silu_quant),
 * byte for byte against the plain op followed by cuda_fp8_quant_act, codes
 * and scales; the norm's residual (h + delta) as the plain op's. */
static void check_handoffs(long n, long d, int delta) {
    struct cuda_ctx *c = gpu.ctx;
    const struct backend_ops *ops = gpu.ops;
    const size_t hb = (size_t)(n * d) * 4, q = q8_bytes(n, d);
    float *h = xmalloc(hb), *dl = xmalloc(hb), *w = xmalloc((size_t)d * 4);
    for (long i = 0; i < n * d; i++) h[i] = frand(3.0f), dl[i] = frand(1.0f);
    for (long k = 0; k < d; k++) w[k] = frand(1.0f);
    float *dh1 = dev_from(h, hb), *dh2 = dev_from(h, hb), *ddl = dev_from(dl, hb), *dw = dev_from(w, (size_t)d * 4);
    float *dx = dev_from(h, hb);
    unsigned char *q1 = NULL, *q2 = NULL, *h1 = xmalloc(q), *h2 = xmalloc(q);
    assert_int_equal(cudaMalloc((void **)&q1, q), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&q2, q), cudaSuccess);
    assert_int_equal(cudaMemset(q1, 0, q), cudaSuccess);
    assert_int_equal(cudaMemset(q2, 0, q), cudaSuccess);
    struct backend_norm nm = {.h = dh1, .delta = delta ? ddl : NULL, .x = dx, .w = dw, .dim = d, .eps = 1e-6f};
    assert_true(cuda_add_rmsnorm8_ok(&nm));
    cuda_add_rmsnorm8(c, &nm, n, q1);
    ops->add_rmsnorm(gpu.ctx, dh2, delta ? ddl : NULL, dx, dw, n, d, 1e-6f);
    cuda_fp8_quant_act(c, q2, q8_scales(q2, n, d), dx, d, n, d);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(cudaMemcpy(h1, q1, q, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(h2, q2, q, cudaMemcpyDeviceToHost), cudaSuccess);
    if (memcmp(h1, h2, q)) fail_msg("norm n=%ld d=%ld: the e4m3 operand differs from norm + quantization", n, d);
    float *r1 = xmalloc(hb), *r2 = xmalloc(hb);
    assert_int_equal(cudaMemcpy(r1, dh1, hb, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(r2, dh2, hb, cudaMemcpyDeviceToHost), cudaSuccess);
    if (memcmp(r1, r2, hb)) fail_msg("norm n=%ld d=%ld: the residual differs from the plain op's", n, d);
    /* SwiGLU: gu = [gate | up] of inter = d / 2 columns each, row stride d + 4 */
    long inter = d / 2, ldgu = d + 4, rows = n;
    float *guh = xmalloc((size_t)(rows * ldgu) * 4);
    for (long i = 0; i < rows * ldgu; i++) guh[i] = frand(4.0f);
    float *gu = dev_from(guh, (size_t)(rows * ldgu) * 4), *g1 = NULL;
    free(guh);
    assert_int_equal(cudaMalloc((void **)&g1, (size_t)(rows * inter) * 4), cudaSuccess);
    const size_t qi = q8_bytes(rows, inter);
    assert_int_equal(cudaMemset(q1, 0, q), cudaSuccess);
    assert_int_equal(cudaMemset(q2, 0, q), cudaSuccess);
    cuda_fp8_silu_quant(c, q1, gu, ldgu, rows, inter);
    ops->silu_mul(gpu.ctx, g1, inter, gu, ldgu, gu + inter, ldgu, rows, inter);
    cuda_fp8_quant_act(c, q2, q8_scales(q2, rows, inter), g1, inter, rows, inter);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(cudaMemcpy(h1, q1, qi, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(h2, q2, qi, cudaMemcpyDeviceToHost), cudaSuccess);
    if (memcmp(h1, h2, qi)) fail_msg("SwiGLU rows=%ld inter=%ld: the e4m3 operand differs", rows, inter);
    printf("  e4m3 handoffs n=%ld d=%ld%s: norm and SwiGLU byte for byte\n", n, d, delta ? " delta" : "");
    cudaFree(dh1), cudaFree(dh2), cudaFree(ddl), cudaFree(dw), cudaFree(dx), cudaFree(q1), cudaFree(q2);
    cudaFree(gu), cudaFree(g1);
    free(h), free(dl), free(w), free(h1), free(h2), free(r1), free(r2);
}

static void test_handoffs(void **state) {
    (void)state;
    assert_true(have_gpu);
    check_handoffs(1, 256, 1);
    check_handoffs(17, 4096, 1);
    check_handoffs(64, 2048, 0);
    check_handoffs(300, 5120, 1);
}

int main(void) {
    rng_seed("test_wgmma_fp8");
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_wgmma_fp8: %s; the tests below fail\n", err.msg);
    } else if (!((struct cuda_ctx *)gpu.ctx)->wgmma) {
        printf("test_wgmma_fp8: the wgmma kernel is off here (it needs a Hopper build on compute "
               "capability 9.0); the tests below fail\n");
        have_gpu = 0;
    }
    if (have_gpu) {
        setenv("KILN_CUDA_WGMMA_FP8", "0", 1);
        knob_reload(NULL);
        int rc = backend_create(&gpu_off, "cuda", &bo, &err);
        unsetenv("KILN_CUDA_WGMMA_FP8");
        knob_reload(NULL);
        struct backend_options bd = {.deterministic = 1};
        if (rc || backend_create(&gpu_det, "cuda", &bd, &err)) {
            fprintf(stderr, "cuda backend: %s\n", err.msg);
            return 1;
        }
        struct backend *all[3] = {&gpu, &gpu_off, &gpu_det};
        for (int i = 0; i < 3; i++)
            if (all[i]->ops->reserve(all[i]->ctx, 512, 1024, 16, &err)) {
                fprintf(stderr, "reserve: %s\n", err.msg);
                return 1;
            }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_handoffs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gpu), backend_destroy(&gpu_off), backend_destroy(&gpu_det);
    return rc;
}
