/* test_wgmma_fp8.c — FP8 weights on the Hopper wgmma kernel
 * (src/backend/cuda/hopper/gemm_wgmma.cu and gemm_fp8.cu, cuda_wgmma_fp8:
 * e4m3 × e4m3 products with the block scales applied per 128-column step) against a
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
 *    again recorded into a CUDA graph and replayed: the same bits. The
 *    128- and 192-row tiles of gemm_fp8.cu the same way: forced on small
 *    shapes, by shape on ones that fill the GPU, up to 4,200 rows (more
 *    tiles than SMs: the persistent grid), partial row and weight tiles;
 *  - the q|k|v product with rope and the K/V stores in the epilogue of the
 *    large tiles (norm_matmul_rope at 400, 600 and 1,100 rows), bf16 and
 *    FP8 caches, against norm_matmul + qk_rope_store;
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
static struct backend gpu_kv8; /* the FP8 KV cache */
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
static void check_kernel_on(long m, long N, long K, long ldy, int bias, int tile_rows) {
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
    long calls = c->wgmma_fp8_calls, rows0 = c->wgmma_fp8_rows_calls;
    cuda_fp8_quant_act(c, dq, ds, dx, K, m, K);
    cuda_wgmma_fp8_run(c, dy, ldy, dq, ds, &bw, db, m, tile_rows);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
    assert_int_equal(c->wgmma_fp8_calls, calls + 1);
    const int on_rows = c->wgmma_fp8_rows_calls > rows0;
    if (tile_rows) assert_int_equal(on_rows, tile_rows > 64);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda_wgmma_fp8_run(c, dy2, ldy, dq, ds, &bw, db, m, tile_rows);
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
    printf("  kernel m=%-4ld N=%-5ld K=%-5ld ldy=%-5ld%s, %s: rel err %.2e\n", m, N, K, ldy,
           bias ? " bias" : "", !on_rows ? "64-row tiles" : tile_rows == 192 ? "192-row tiles" : tile_rows == 128 ? "128-row tiles" : "large tiles by shape", e);
    assert_true(e < TOL_SAME);
    assert_memory_equal(y, y2, (size_t)(m * ldy) * 4);
    cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree((void *)bw.data), cudaFree((void *)bw.scale);
    cudaFree(db);
    cudaFree(dy), cudaFree(dy2);
    free(w.q), free(w.s), free(x), free(b), free(y), free(y2), free(q), free(s), free(ref), free(xd);
}

static void check_kernel(long m, long N, long K, long ldy, int bias) {
    check_kernel_on(m, N, K, ldy, bias, 0);
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

/* gemm_fp8.cu's 128- and 192-row tiles: forced on small shapes (fewer
 * tiles than SMs), by shape where they fill the GPU (128 rows below 1,024
 * rows, 192 from there, 128 where only those fill it); partial row and weight tiles, bias, an output
 * stride past N, more tiles than SMs (the persistent walk and the ring
 * across tiles), and the 64-row tiles forced at a size the shape rule
 * gives to the large ones. */
static void test_kernel_rows(void **state) {
    (void)state;
    assert_true(have_gpu);
    for (int R = 128; R <= 192; R += 64) {
        check_kernel_on(1, 576, 128, 576, 1, R);
        check_kernel_on(500, 1024, 4096, 1024, 0, R);  /* row tiles of which the last is partial */
        check_kernel_on(130, 1000, 1024, 1002, 1, R);  /* the last weight tile 104 rows */
    }
    struct cuda_ctx *c = gpu.ctx;
    long r0 = c->wgmma_fp8_rows_calls, l0 = c->wgmma_fp8_rows192_calls;
    check_kernel_on(700, 4096, 512, 4100, 1, 0);    /* 192 tiles of 128 rows: by shape */
    assert_int_equal(c->wgmma_fp8_rows_calls - r0, 2); /* eager and graph */
    assert_int_equal(c->wgmma_fp8_rows192_calls - l0, 0);
    check_kernel_on(1100, 4096, 256, 4096, 1, 0);   /* 192 tiles of 192 rows: by shape */
    assert_int_equal(c->wgmma_fp8_rows192_calls - l0, 2);
    /* 1,024 rows on nt weight tiles, nt such that 6·nt tiles of 192 rows
     * leave a quarter of the SMs idle and 8·nt of 128 rows do not: the
     * 128-row tiles, by shape */
    const long nt = (75l * c->n_sm + 799) / 800;
    assert_true(6 * nt * 100 < 75l * c->n_sm);
    r0 = c->wgmma_fp8_rows_calls, l0 = c->wgmma_fp8_rows192_calls;
    check_kernel_on(1024, 128 * nt, 256, 128 * nt, 0, 0);
    assert_int_equal(c->wgmma_fp8_rows_calls - r0, 2);
    assert_int_equal(c->wgmma_fp8_rows192_calls - l0, 0);
    check_kernel_on(700, 4096, 512, 4096, 0, 64);
    check_kernel_on(4200, 1024, 256, 1024, 1, 192); /* 176 tiles */
    check_kernel_on(2000, 2944, 384, 2950, 0, 128); /* 368 tiles, N 23 tiles */
    assert_true(((struct cuda_ctx *)gpu.ctx)->wgmma_fp8_rows_calls > 0);
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

/* norm_matmul_rope with FP8 weights at a prefill size (the large tiles
 * with rope and the K/V stores in their epilogue) against norm_matmul +
 * qk_rope_store on the same backend, bf16 and FP8 caches: queries within
 * 1e-6 (the same sums, the rotation's roundings spelled out in both),
 * keys within one rounding of the cache type, values the same bytes;
 * slots not in the batch keep their poison. */
static void check_rope_rows(struct backend *be, long n, int H, int KH) {
    const struct backend_ops *ops = be->ops;
    struct cuda_ctx *c = be->ctx;
    const int fp8 = c->kv_fp8, es = fp8 ? 1 : 2, maxpos = 4096;
    const long d = 1024, hd = 128, N = (long)(H + 2 * KH) * hd, kw = KH * hd, slots = n + 64;
    const float ks = fp8 ? 0.25f : 1.0f, vs = fp8 ? 0.05f : 1.0f;
    struct w8 w = w8_rand(N, d, 128, 128);
    float *h = xmalloc((size_t)(n * d) * 4), *nw = xmalloc((size_t)d * 4), *b = xmalloc((size_t)N * 4),
          *cs = xmalloc((size_t)maxpos * 128 * 4);
    for (long i = 0; i < n * d; i++) h[i] = frand(2.0f);
    for (long i = 0; i < d; i++) nw[i] = 1.0f + frand(0.3f);
    for (long i = 0; i < N; i++) b[i] = frand(0.5f);
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
    const size_t cb = (size_t)(slots * kw) * (size_t)es;
    unsigned char *poison = xmalloc(cb);
    memset(poison, 0x7f, cb);
    struct backend_weight bw = {.data = ops->weight_upload(be->ctx, w.q, (size_t)(N * d)),
                                .dtype = DTYPE_F8_E4M3, .rows = N, .cols = d,
                                .scale = ops->weight_upload(be->ctx, w.s, (size_t)(w.nbr * w.nbc) * 4),
                                .block_rows = 128, .block_cols = 128};
    float *dh = ops->alloc(be->ctx, (size_t)(n * d) * 4), *dnw = ops->alloc(be->ctx, (size_t)d * 4),
          *db = ops->alloc(be->ctx, (size_t)N * 4), *dcs = ops->alloc(be->ctx, (size_t)maxpos * 128 * 4),
          *dx = ops->alloc(be->ctx, (size_t)(n * d) * 4);
    int32_t *dpos = ops->alloc(be->ctx, (size_t)n * 4), *dslot = ops->alloc(be->ctx, (size_t)n * 4);
    ops->upload(be->ctx, dh, h, (size_t)(n * d) * 4);
    ops->upload(be->ctx, dnw, nw, (size_t)d * 4);
    ops->upload(be->ctx, db, b, (size_t)N * 4);
    ops->upload(be->ctx, dcs, cs, (size_t)maxpos * 128 * 4);
    ops->upload(be->ctx, dpos, pos, (size_t)n * 4);
    ops->upload(be->ctx, dslot, slot, (size_t)n * 4);
    float *y[2];
    void *kc[2], *vc[2];
    for (int k = 0; k < 2; k++) {
        y[k] = ops->alloc(be->ctx, (size_t)(n * N) * 4);
        kc[k] = ops->alloc(be->ctx, cb), vc[k] = ops->alloc(be->ctx, cb);
        ops->upload(be->ctx, kc[k], poison, cb);
        ops->upload(be->ctx, vc[k], poison, cb);
    }
    struct backend_norm nm = {.h = dh, .delta = NULL, .x = dx, .w = dnw, .dim = d, .eps = 1e-5f};
    struct backend_rope_store r = {.n_heads = H, .n_kv_heads = KH, .head_dim = (int)hd, .eps = 1e-6f,
                                   .rot_dim = (int)hd, .pos = dpos, .cos_sin = dcs, .kv_stride = kw,
                                   .slots = dslot, .k_scale = ks, .v_scale = vs};
    long f0 = c->rope_fused, r0 = c->wgmma_fp8_rows_calls;
    r.k_cache = kc[0], r.v_cache = vc[0];
    ops->norm_matmul_rope(be->ctx, &nm, y[0], N, &(struct backend_stack){.cat = bw}, db, n, &r);
    const long fused = c->rope_fused - f0, rows = c->wgmma_fp8_rows_calls - r0;
    /* the norm again from the same h (no residual: h unchanged) */
    ops->norm_matmul(be->ctx, &nm, y[1], N, &bw, db, n);
    r.k_cache = kc[1], r.v_cache = vc[1];
    ops->qk_rope_store(be->ctx, y[1], y[1] + H * hd, y[1] + H * hd + kw, N, n, &r);
    float *yh[2];
    unsigned char *kh[2], *vh[2];
    for (int k = 0; k < 2; k++) {
        yh[k] = xmalloc((size_t)(n * N) * 4), kh[k] = xmalloc(cb), vh[k] = xmalloc(cb);
        ops->download(be->ctx, yh[k], y[k], (size_t)(n * N) * 4);
        ops->download(be->ctx, kh[k], kc[k], cb), ops->download(be->ctx, vh[k], vc[k], cb);
    }
    ops->synchronize(be->ctx);
    double num = 0, den = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < H * hd; j++) {
            double a = yh[0][i * N + j], e = yh[1][i * N + j];
            if (isnan(a)) fail_msg("q row %ld col %ld: NaN (unwritten?)", i, j);
            num += (a - e) * (a - e), den += e * e;
        }
    long kbad = 0, untouched = 0;
    for (long s2 = 0; s2 < slots; s2++) {
        int in = 0;
        for (long i = 0; i < n && !in; i++) in = slot[i] == s2;
        const size_t off = (size_t)(s2 * kw) * (size_t)es, len = (size_t)kw * (size_t)es;
        if (!in) {
            untouched += !memcmp(kh[0] + off, poison, len) && !memcmp(vh[0] + off, poison, len);
            continue;
        }
        if (memcmp(vh[0] + off, vh[1] + off, len)) fail_msg("v cache slot %ld: the epilogue's bytes differ", s2);
        for (long j = 0; j < kw; j++) {
            double a, e;
            if (fp8) a = fp8_e4m3_to_f32(kh[0][off + j]) * ks, e = fp8_e4m3_to_f32(kh[1][off + j]) * ks;
            else a = bf16_to_f32(((uint16_t *)(kh[0] + off))[j]), e = bf16_to_f32(((uint16_t *)(kh[1] + off))[j]);
            /* one rounding of the cache type apart (e4m3: 2^-3 relative, bf16 2^-7) */
            const double tol = fabs(e) * (fp8 ? 0.125 : 1.0 / 128.0) + (fp8 ? ks * 0x1p-9 : 1e-6);
            if (isnan(a) || fabs(a - e) > tol) kbad++;
        }
    }
    const double qe = sqrt(num / den);
    printf("  rope rows n=%ld H=%d KH=%d %s cache: %s%s, q rel diff %.2e, keys off by more than a rounding %ld\n",
           n, H, KH, fp8 ? "FP8" : "bf16", fused ? "epilogue" : "two ops", rows ? " on the large tiles" : "", qe, kbad);
    assert_int_equal(fused, 1);
    assert_int_equal(rows, 1);
    assert_true(qe < 1e-6);
    assert_int_equal(kbad, 0);
    assert_int_equal(untouched, slots - n);
    for (int k = 0; k < 2; k++) {
        ops->free(be->ctx, y[k]), ops->free(be->ctx, kc[k]), ops->free(be->ctx, vc[k]);
        free(yh[k]), free(kh[k]), free(vh[k]);
    }
    ops->weight_release(be->ctx, bw.data), ops->weight_release(be->ctx, bw.scale);
    void *ds[] = {dh, dnw, db, dcs, dx, dpos, dslot};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ops->free(be->ctx, ds[i]);
    free(w.q), free(w.s), free(h), free(nw), free(b), free(cs), free(pos), free(slot), free(poison);
}

static void test_rope_rows(void **state) {
    (void)state;
    assert_true(have_gpu);
    check_rope_rows(&gpu, 400, 32, 8);     /* 4 x 48 tiles of 128 rows, the last partial */
    check_rope_rows(&gpu_kv8, 600, 24, 4);  /* 5 x 32 tiles of 128 rows */
    check_rope_rows(&gpu, 1100, 32, 8);    /* 6 x 48 tiles of 192 rows */
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
        struct backend_options bd = {.deterministic = 1}, b8 = {.kv_fp8 = 1};
        if (rc || backend_create(&gpu_det, "cuda", &bd, &err) || backend_create(&gpu_kv8, "cuda", &b8, &err)) {
            fprintf(stderr, "cuda backend: %s\n", err.msg);
            return 1;
        }
        struct backend *all[4] = {&gpu, &gpu_off, &gpu_det, &gpu_kv8};
        for (int i = 0; i < 4; i++)
            if (all[i]->ops->reserve(all[i]->ctx, 2048, 1024, 16, &err)) {
                fprintf(stderr, "reserve: %s\n", err.msg);
                return 1;
            }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_kernel_rows),
        cmocka_unit_test(test_rope_rows),
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_handoffs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu)
        backend_destroy(&gpu), backend_destroy(&gpu_off), backend_destroy(&gpu_det), backend_destroy(&gpu_kv8);
    return rc;
}
