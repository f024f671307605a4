/* test_cuda_fp8.c — the CUDA products with block-quantized FP8 (e4m3)
 * weights (src/backend/cuda/cuda_fp8.cu and its dispatch in cuda_matmul.cu)
 * against the CPU backend on the same codes and scales (random e4m3 codes,
 * NaN codes excluded; random positive block scales), fresh inputs every run
 * (KILN_TEST_SEED repeats one).
 *
 * Paths and shapes:
 *  - matmul for n = 1, 2, 3 (the FP8 GEMV), 17, 64 (the tile kernel), 300,
 *    2048 (bf16 dequantized chunks + cuBLASLt), with and without bias; with
 *    128 x 128 blocks and K a multiple of 128, every n past the GEMV's on
 *    the e4m3 wgmma products on Hopper (test_wgmma_fp8 checks them
 *    closely),
 *    and with KILN_CUDA_WGMMA_FP8=0 the tile kernel, cuBLASLt's
 *    block-scaled FP8 where it has a plan (K a multiple of 512), and the
 *    chunks again with KILN_CUDA_FP8_LT=0;
 *    weights of 576 rows (a partial last block row) and 1040 columns (a
 *    partial last block column), 128 × 128 and 64 × 48 blocks, and a
 *    weight with 200 columns (not a multiple of 16: the scalar kernel);
 *  - --deterministic: the tile kernel for every n, checked against the CPU
 *    and bit for bit row by row against the same rows computed alone;
 *  - the FP8 GEMV itself (cuda_fp8_gemv, test_gemv_fp8): each K split (1,
 *    2, 4, with parts ending short of a whole step), each count of units
 *    per warp (few and many units against the SM count), n = 1..4, bias,
 *    SwiGLU, 64 × 48 blocks, activations without 16-byte loads, and every
 *    row of a batch bit for bit against the same row computed alone;
 *  - norm_matmul and norm_swiglu_mlp (gate|up stacked with its scale rows)
 *    at n = 1, 3 (the GEMV with the SwiGLU epilogue), 17 and 300.
 *
 * Tolerance, ‖gpu − cpu‖ / ‖cpu‖: the GEMV keeps fp32 activations and sums
 * a piece of 8 products before scaling it (the CPU scales each weight
 * first): fp32 reassociation only, 1e-5. The tile and cuBLASLt paths round
 * the activations to bf16 and each dequantized weight e4m3·scale to bf16:
 * two roundings of at most 2^-9 relative per product, typically ~2e-3 over
 * a whole output; 1e-2 as for the bf16 products (test_cuda_ops), far under
 * an indexing or scale-block error (order 1). cuBLASLt's FP8 and the e4m3
 * wgmma product round the activations to e4m3 in 128-column groups: up to 2^-4 relative per
 * element (about 2.5e-2 RMS over a binade), so ~2.5e-2 over an output;
 * 6e-2, still far under a layout error of the scales (order 1). */
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
#include "model/model_internal.h"
#include "tensor/backend.h"
#include "tensor/dummy_fill.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

enum { MAX_TOKENS = 2048, MAX_CONTEXT = 1024, MAX_HEADS = 16 };

static struct backend gpu_det;  /* backend_options.deterministic */
static struct backend gpu_lt;   /* KILN_CUDA_WGMMA_FP8=0: cuBLASLt's block-scaled FP8 past 64 rows */
static struct backend gpu_nolt; /* and KILN_CUDA_FP8_LT=0: the bf16 dequantized chunks */

static long lt_calls(const struct backend *be) { return ((const struct cuda_ctx *)be->ctx)->fp8_lt_calls; }
/* products with e4m3 activations: cuBLASLt's FP8 and the e4m3 wgmma kernel */
static long e4m3_calls(const struct backend *be) {
    const struct cuda_ctx *c = be->ctx;
    return c->fp8_lt_calls + c->wgmma_fp8_calls;
}

/* An FP8 weight on both backends: random codes and scales. */
struct w8 {
    struct backend_weight c, g;
    uint8_t *q;
    float *s;
};

static struct w8 w8_rand(long rows, long cols, int br, int bc, float scale) {
    size_t n = (size_t)rows * (size_t)cols;
    long nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    size_t nb = (size_t)nbr * (size_t)nbc;
    struct w8 w;
    w.q = xaligned_alloc(n + 64);
    w.s = xaligned_alloc(nb * 4 + 64);
    for (size_t i = 0; i < n; i++) {
        uint8_t v;
        do v = (uint8_t)rng_next(); while ((v & 0x7f) == 0x7f);
        w.q[i] = v;
    }
    /* e4m3 values reach 448: scales put the weights near ±scale */
    for (size_t i = 0; i < nb; i++) w.s[i] = scale / 448.0f * (0.5f + 0.5f * (frand(1.0f) + 1.0f));
    w.c = (struct backend_weight){.data = w.q, .dtype = DTYPE_F8_E4M3, .rows = rows, .cols = cols,
                                  .scale = w.s, .block_rows = br, .block_cols = bc};
    w.g = w.c;
    w.g.data = gpu.ops->weight_upload(gpu.ctx, w.q, n);
    w.g.scale = gpu.ops->weight_upload(gpu.ctx, w.s, nb * 4);
    assert_non_null(w.g.data);
    assert_non_null(w.g.scale);
    return w;
}

static void w8_free(struct w8 *w) {
    gpu.ops->weight_release(gpu.ctx, w->g.data);
    gpu.ops->weight_release(gpu.ctx, w->g.scale);
    free(w->q), free(w->s);
}

/* e4m3: the product rounded its activations to e4m3 (cuBLASLt's FP8, the
 * wgmma kernel) */
static double tol_for(const struct backend *be, long n, long cols, int e4m3) {
    if (e4m3) return 6e-2;
    return be != &gpu_det && n <= 4 && cols % 16 == 0 ? 1e-5 : 1e-2;
}

static void check_matmul(struct backend *be, long rows, long cols, int br, int bc, long n, int bias) {
    printf("  matmul %ldx%ld blocks %dx%d n=%ld bias=%d%s\n", rows, cols, br, bc, n, bias,
           be == &gpu_det    ? " deterministic"
           : be == &gpu_lt   ? " KILN_CUDA_WGMMA_FP8=0"
           : be == &gpu_nolt ? " KILN_CUDA_WGMMA_FP8=0 KILN_CUDA_FP8_LT=0"
                             : "");
    const struct cuda_ctx *ctx = be->ctx;
    long lt0 = lt_calls(be), wg0 = ctx->wgmma_fp8_calls;
    struct w8 w = w8_rand(rows, cols, br, bc, 1.0f / sqrtf((float)cols));
    /* odd output strides, except where cuBLASLt's FP8 could apply (it
     * needs 16-byte aligned output rows) */
    long ldx = cols + 4, ldy = rows + (cols % 128 ? 3 : 4);
    struct pair x = pair_rand((size_t)(n * ldx), 1.0f), b = pair_rand((size_t)rows, 0.5f),
                y = pair_poison((size_t)(n * ldy));
    cpu.ops->matmul(cpu.ctx, y.h, ldy, x.h, ldx, &w.c, bias ? b.h : NULL, n);
    be->ops->matmul(be->ctx, y.d, ldy, x.d, ldx, &w.g, bias ? (const float *)b.d : NULL, n);
    be->ops->synchronize(be->ctx);
    int lt = lt_calls(be) > lt0, wg = ctx->wgmma_fp8_calls > wg0;
    /* cuBLASLt's FP8: past 64 rows with 128 x 128 blocks and K a multiple
     * of 512, with the wgmma kernels off */
    int lt_applies = be == &gpu_lt && n > 64 && br == 128 && bc == 128 && cols % 512 == 0;
    if (lt && !lt_applies) fail_msg("cuBLASLt's block-scaled FP8 ran where it does not apply");
    /* the e4m3 wgmma kernels: every product past 4 rows with 128 x 128
     * blocks and whole 128-column groups, on Hopper, unless turned off */
    int wg_applies = be == &gpu && n > 4 && br == 128 && bc == 128 && cols % 128 == 0;
    if (wg && !wg_applies) fail_msg("the e4m3 wgmma product ran where it does not apply");
    if (wg_applies && !wg && ((struct cuda_ctx *)gpu.ctx)->wgmma)
        fail_msg("the e4m3 wgmma product did not run where it applies");
    if (lt_applies) printf("    cuBLASLt block-scaled FP8: %s\n", lt ? "ran" : "no plan on this GPU / cuBLAS (bf16 chunks ran)");
    if (wg) printf("    e4m3 wgmma product\n");
    expect_close(&y, n, rows, ldy, tol_for(be, n, cols, lt || wg));
    if (be == &gpu_det) { /* every row's bits as when computed alone */
        float *all = xmalloc(y.bytes + 4), *one = xmalloc((size_t)ldy * 4 + 4);
        be->ops->download(be->ctx, all, y.d, y.bytes);
        long rows_to_check[3] = {0, n / 2, n - 1};
        for (int k = 0; k < 3; k++) {
            long i = rows_to_check[k];
            struct pair y1 = pair_poison((size_t)ldy);
            be->ops->matmul(be->ctx, y1.d, ldy, (const float *)x.d + i * ldx, ldx, &w.g,
                            bias ? (const float *)b.d : NULL, 1);
            be->ops->download(be->ctx, one, y1.d, (size_t)ldy * 4);
            if (memcmp(one, all + i * ldy, (size_t)rows * 4))
                fail_msg("deterministic: row %ld of %ld differs from the row alone", i, n);
            pair_free(&y1);
        }
        free(all), free(one);
    }
    pair_free(&x), pair_free(&b), pair_free(&y);
    w8_free(&w);
}

static void test_matmul_fp8(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const long ns[] = {1, 2, 3, 17, 64, 300, 2048};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        check_matmul(&gpu, 576, 1040, 128, 128, ns[i], (int)(i & 1));
        if (ns[i] <= 300) check_matmul(&gpu, 576, 1040, 64, 48, ns[i], (int)!(i & 1));
        if (ns[i] <= 300) check_matmul(&gpu, 130, 200, 128, 128, ns[i], 1);
    }
    check_matmul(&gpu, 4096, 2048, 128, 128, 1, 0);
    /* the e4m3 wgmma product (128 x 128 blocks, K a multiple of 128) */
    check_matmul(&gpu, 4096, 2048, 128, 128, 300, 1);
    check_matmul(&gpu, 1536, 1024, 128, 128, 2048, 0);
    check_matmul(&gpu, 576, 1024, 128, 128, 65, 1);
    check_matmul(&gpu, 576, 1152, 128, 128, 17, 0);
    /* with it off: the tile kernel, cuBLASLt's block-scaled FP8 (K a
     * multiple of 512), and the same products on the bf16 chunks */
    check_matmul(&gpu_lt, 576, 1024, 128, 128, 17, 1);
    check_matmul(&gpu_lt, 4096, 2048, 128, 128, 300, 1);
    check_matmul(&gpu_lt, 1536, 1024, 128, 128, 2048, 0);
    check_matmul(&gpu_lt, 576, 1024, 128, 128, 65, 1);
    check_matmul(&gpu_nolt, 4096, 2048, 128, 128, 300, 1);
    check_matmul(&gpu_nolt, 1536, 1024, 128, 128, 2048, 0);
}

static void test_matmul_fp8_det(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const long ns[] = {1, 3, 17, 300};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        check_matmul(&gpu_det, 576, 1040, 128, 128, ns[i], 1);
        check_matmul(&gpu_det, 130, 200, 128, 128, ns[i], 0);
    }
}

/* The FP8 GEMV's K split as cuda_common.cuh chooses it (gemv_k_parts) for a
 * weight of rows × cols: 4 parts from 1024 pieces of 8 columns, and from
 * 512 below 4096 rows; 2 from 256, else 1. Only picks the shapes below and
 * names the split; the results are checked whatever the kernel chose. */
static int gemv_ks_for(long rows, long cols) {
    long np = cols / 8;
    return np >= 1024 || (np >= 512 && rows < 4096) ? 4 : np >= 256 ? 2 : 1;
}

/* cuda_fp8_gemv called directly on w, a stacked gate|up of 2·units rows:
 * the plain product over its first units rows (with or without bias), or
 * SwiGLU over all of it, against the CPU's matmul (+ silu_mul); then, for
 * n > 1, each row's bits against the same row computed alone (batch
 * invariance). xoff: x starts xoff floats past a 16-byte boundary and ldx
 * = cols + 1 (no 16-byte activation loads, while rows taken alone may have
 * them: the same bits either way). */
static void check_gemv(const struct w8 *w, long units, long n, int swiglu, int bias, int xoff) {
    struct cuda_ctx *c = gpu.ctx;
    long cols = w->c.cols, rows = swiglu ? 2 * units : units;
    printf("  gemv %ld units x %ld blocks %dx%d n=%ld swiglu=%d bias=%d x+%d (KS %d)\n", units, cols,
           w->c.block_rows, w->c.block_cols, n, swiglu, bias, xoff, gemv_ks_for(rows, cols));
    struct backend_weight wc = w->c, wg = w->g;
    wc.rows = wg.rows = rows;
    assert_true(cuda_fp8_gemv_ok(c, &wg, n));
    long ldx = xoff ? cols + 1 : cols + 4, ldy = units + 3;
    struct pair x = pair_rand((size_t)(n * ldx + xoff), 1.0f), b = pair_rand((size_t)units, 0.5f),
                y = pair_poison((size_t)(n * ldy));
    float *yc = xmalloc((size_t)(n * rows) * 4 + 4);
    cpu.ops->matmul(cpu.ctx, yc, rows, x.h + xoff, ldx, &wc, bias ? b.h : NULL, n);
    if (swiglu)
        cpu.ops->silu_mul(cpu.ctx, y.h, ldy, yc, rows, yc + units, rows, n, units);
    else
        for (long i = 0; i < n; i++) memcpy(y.h + i * ldy, yc + i * rows, (size_t)units * 4);
    free(yc);
    const float *xd = (const float *)x.d + xoff, *bd = bias ? (const float *)b.d : NULL;
    cuda_fp8_gemv(c, y.d, ldy, xd, ldx, &wg, bd, n, swiglu);
    gpu.ops->synchronize(gpu.ctx);
    expect_close(&y, n, units, ldy, 1e-5);
    if (n > 1) {
        float *all = xmalloc(y.bytes + 4), *one = xmalloc((size_t)ldy * 4 + 4);
        gpu.ops->download(gpu.ctx, all, y.d, y.bytes);
        struct pair y1 = pair_poison((size_t)ldy);
        for (long i = 0; i < n; i++) {
            cuda_fp8_gemv(c, y1.d, ldy, xd + i * ldx, ldx, &wg, bd, 1, swiglu);
            gpu.ops->download(gpu.ctx, one, y1.d, (size_t)ldy * 4);
            if (memcmp(one, all + i * ldy, (size_t)units * 4))
                fail_msg("gemv: row %ld of %ld differs from the row alone", i, n);
        }
        pair_free(&y1);
        free(all), free(one);
    }
    pair_free(&x), pair_free(&b), pair_free(&y);
}

/* The GEMV's paths: K split 1 (256 columns), 2 (2064: the last part ends
 * in a partial step) and 4 (4096, and 4144: the same; 2 where the weight
 * has 4096 rows or more: the largest SwiGLU weights here, 32·n_sm rows);
 * per split, 64 units
 * (R = 1), then 6·n_sm and 16·n_sm times the row groups of a block (R = 2,
 * then the most: R·G = 4 weight rows a warp from n = 3 on, 2 below); n =
 * 1..4, the plain product with and without bias and SwiGLU; 64 × 48 blocks
 * (a scale column every 6 pieces) beside 128 × 128; activations without
 * 16-byte loads. */
static void test_gemv_fp8(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const struct cuda_ctx *c = gpu.ctx;
    const long colss[] = {256, 2064, 4096, 4144};
    for (size_t i = 0; i < sizeof colss / sizeof colss[0]; i++) {
        long cols = colss[i], groups = 4 / gemv_ks_for(64, cols);
        const long unitss[] = {64, 6 * c->n_sm * groups, 16 * c->n_sm * groups};
        for (size_t k = 0; k < 3; k++) {
            int b64 = (int)((i + k) % 2);
            struct w8 w =
                w8_rand(2 * unitss[k], cols, b64 ? 64 : 128, b64 ? 48 : 128, 1.0f / sqrtf((float)cols));
            for (long n = 1; n <= CUDA_FP8_GEMV_ROWS; n++) {
                check_gemv(&w, unitss[k], n, 0, (int)(n & 1), 0);
                check_gemv(&w, unitss[k], n, 1, 0, 0);
            }
            w8_free(&w);
        }
    }
    /* unaligned activations: the batch without 16-byte loads (R = 1); row
     * 3 alone starts on a 16-byte boundary (R = 2 at 3000 units) */
    struct w8 w = w8_rand(6000, 2064, 128, 128, 1.0f / sqrtf(2064.0f));
    check_gemv(&w, 3000, 4, 0, 1, 1);
    check_gemv(&w, 3000, 3, 1, 0, 1);
    w8_free(&w);
    w = w8_rand(2000, 4144, 64, 48, 1.0f / sqrtf(4144.0f));
    check_gemv(&w, 1000, 4, 1, 0, 1);
    check_gemv(&w, 1000, 2, 0, 0, 1);
    w8_free(&w);
}

/* norm_matmul and norm_swiglu_mlp with FP8 weights against the CPU's
 * add_rmsnorm + matmul (+ silu_mul + matmul) on the same weights. */
static void check_fused(long n, long d, long inter) {
    const float eps = 1e-5f;
    printf("  fused fp8 n=%ld d=%ld inter=%ld\n", n, d, inter);
    struct w8 wq = w8_rand(3 * d / 2, d, 128, 128, 1.0f / sqrtf((float)d)),
              wgu = w8_rand(2 * inter, d, 128, 128, 1.0f / sqrtf((float)d)),
              wd = w8_rand(d, inter, 128, 128, 1.0f / sqrtf((float)inter));
    long qrows = wq.c.rows;
    float *h0 = rand_floats((size_t)(n * d), 3.0f);
    struct pair h = pair_from(h0, (size_t)(n * d) * 4), dl = pair_rand((size_t)(n * d), 1.0f),
                lw = pair_rand((size_t)d, 1.0f), qb = pair_rand((size_t)qrows, 0.5f),
                xn = pair_poison((size_t)(n * d)), y = pair_poison((size_t)(n * qrows)),
                gu = pair_poison((size_t)(n * 2 * inter)), o = pair_poison((size_t)(n * d));
    free(h0);
    /* e4m3 activations (the wgmma kernel, cuBLASLt's FP8) where they ran:
     * 6e-2 a product, 1e-1 for the MLP's two products in a row (its h
     * carries gate|up's error into down's) */
    double tol = n <= 4 ? 1e-5 : 1e-2;
    long lt0 = e4m3_calls(&gpu);
    cpu.ops->add_rmsnorm(cpu.ctx, h.h, dl.h, xn.h, lw.h, n, d, eps);
    cpu.ops->matmul(cpu.ctx, y.h, qrows, xn.h, d, &wq.c, qb.h, n);
    struct backend_norm nm = {.h = h.d, .delta = dl.d, .x = xn.d, .w = lw.d, .dim = d, .eps = eps};
    gpu.ops->norm_matmul(gpu.ctx, &nm, y.d, qrows, &wq.g, qb.d, n);
    gpu.ops->synchronize(gpu.ctx);
    expect_close(&h, n, d, d, 1e-6);
    expect_close(&y, n, qrows, qrows, e4m3_calls(&gpu) > lt0 ? 6e-2 : tol);
    lt0 = e4m3_calls(&gpu);
    cpu.ops->add_rmsnorm(cpu.ctx, h.h, dl.h, xn.h, lw.h, n, d, eps);
    cpu.ops->matmul(cpu.ctx, gu.h, 2 * inter, xn.h, d, &wgu.c, NULL, n);
    cpu.ops->silu_mul(cpu.ctx, gu.h, 2 * inter, gu.h, 2 * inter, gu.h + inter, 2 * inter, n, inter);
    cpu.ops->matmul(cpu.ctx, o.h, d, gu.h, 2 * inter, &wd.c, NULL, n);
    struct backend_weight parts[2] = {wgu.g, wgu.g};
    parts[0].rows = parts[1].rows = inter;
    parts[1].data = (const uint8_t *)wgu.g.data + (size_t)inter * (size_t)d;
    parts[1].scale = wgu.g.scale + inter / 128 * ((d + 127) / 128);
    gpu.ops->norm_swiglu_mlp(gpu.ctx, &nm, o.d, d,
                             &(struct backend_stack){.cat = wgu.g, .parts = parts, .count = 2}, &wd.g,
                             gu.d, 2 * inter, n);
    gpu.ops->synchronize(gpu.ctx);
    expect_close(&h, n, d, d, 1e-6);
    expect_close(&o, n, d, d, e4m3_calls(&gpu) > lt0 ? 1e-1 : tol);
    pair_free(&h), pair_free(&dl), pair_free(&lw), pair_free(&qb), pair_free(&xn), pair_free(&y),
        pair_free(&gu), pair_free(&o);
    w8_free(&wq), w8_free(&wgu), w8_free(&wd);
}

/* An MLP whose down projection stayed bf16 (modules_to_not_convert): the
 * fused op takes its plain sequence with the two kinds of product. */
static void check_mixed_mlp(long n, long d, long inter) {
    const float eps = 1e-5f;
    printf("  mixed MLP (FP8 gate|up, bf16 down) n=%ld\n", n);
    long lt0 = e4m3_calls(&gpu);
    struct w8 wgu = w8_rand(2 * inter, d, 128, 128, 1.0f / sqrtf((float)d));
    struct wpair wd = weight_rand(DTYPE_BF16, d, inter, 1.0f / sqrtf((float)inter));
    struct pair h = pair_rand((size_t)(n * d), 3.0f), lw = pair_rand((size_t)d, 1.0f),
                xn = pair_poison((size_t)(n * d)), gu = pair_poison((size_t)(n * 2 * inter)),
                o = pair_poison((size_t)(n * d));
    cpu.ops->add_rmsnorm(cpu.ctx, h.h, NULL, xn.h, lw.h, n, d, eps);
    cpu.ops->matmul(cpu.ctx, gu.h, 2 * inter, xn.h, d, &wgu.c, NULL, n);
    cpu.ops->silu_mul(cpu.ctx, gu.h, 2 * inter, gu.h, 2 * inter, gu.h + inter, 2 * inter, n, inter);
    cpu.ops->matmul(cpu.ctx, o.h, d, gu.h, 2 * inter, &wd.c, NULL, n);
    struct backend_norm nm = {.h = h.d, .delta = NULL, .x = xn.d, .w = lw.d, .dim = d, .eps = eps};
    gpu.ops->norm_swiglu_mlp(gpu.ctx, &nm, o.d, d, &(struct backend_stack){.cat = wgu.g, .count = 2}, &wd.g,
                             gu.d, 2 * inter, n);
    gpu.ops->synchronize(gpu.ctx);
    expect_close(&o, n, d, d, e4m3_calls(&gpu) > lt0 ? 6e-2 : 1e-2);
    pair_free(&h), pair_free(&lw), pair_free(&xn), pair_free(&gu), pair_free(&o);
    w8_free(&wgu);
    weight_free(&wd);
}

static void test_fused_fp8(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    check_fused(1, 1024, 1536);
    check_fused(3, 1024, 1536);
    check_fused(17, 1024, 1536);
    check_fused(300, 1024, 1536);
    check_mixed_mlp(1 + irand(4), 1024, 1536);
    check_mixed_mlp(17 + irand(300), 1024, 1536);
}

/* FP8 dummy weights made on the device (backend_ops.weight_dummy, F8_E4M3
 * parts) against the host: the dummy values (tensor/dummy_fill.h) in the
 * part's source dtype, quantized by fp8_quantize_blocks, the same codes
 * and scales to the bit. Parts with partial last blocks (576 rows, 1040
 * columns), 64 x 48 blocks, BF16 and F32 sources, two parts at once. */
static void check_dummy(const struct dummy_part *parts, int count) {
    const void *dev = gpu.ops->weight_dummy(gpu.ctx, parts, count);
    assert_non_null(dev);
    size_t codes = 0, nscale = 0;
    for (int i = 0; i < count; i++) {
        codes += parts[i].n;
        nscale += (size_t)((parts[i].rows + parts[i].block_rows - 1) / parts[i].block_rows) *
                  (size_t)((parts[i].cols + parts[i].block_cols - 1) / parts[i].block_cols);
    }
    size_t sat = (codes + 15) & ~(size_t)15;
    unsigned char *got = xmalloc(sat + nscale * 4);
    gpu.ops->download(gpu.ctx, got, dev, sat + nscale * 4);
    size_t at = 0, sc = 0;
    for (int i = 0; i < count; i++) {
        const struct dummy_part *p = &parts[i];
        size_t es = dtype_size(p->src);
        unsigned char *src = xmalloc(p->n * es + 4);
        uint64_t off = dummy_offset(p->seed, p->tensor);
        for (size_t k = 0; k < p->n; k++) {
            float v = dummy_value(p, off, k);
            if (p->src == DTYPE_BF16) ((uint16_t *)src)[k] = dummy_bf16(v);
            else ((float *)src)[k] = v;
        }
        size_t nb = (size_t)((p->rows + p->block_rows - 1) / p->block_rows) *
                    (size_t)((p->cols + p->block_cols - 1) / p->block_cols);
        uint8_t *q = xmalloc(p->n + 4);
        float *s = xmalloc(nb * 4 + 4);
        fp8_quantize_blocks(src, p->src, p->rows, p->cols, p->block_rows, p->block_cols, q, s);
        printf("  dummy FP8 part %d: %ldx%ld blocks %dx%d from %s\n", i, p->rows, p->cols, p->block_rows,
               p->block_cols, dtype_name(p->src));
        if (memcmp(got + at, q, p->n)) fail_msg("dummy FP8 part %d: codes differ from the host's", i);
        if (memcmp(got + sat + sc * 4, s, nb * 4)) fail_msg("dummy FP8 part %d: scales differ from the host's", i);
        at += p->n;
        sc += nb;
        free(src), free(q), free(s);
    }
    free(got);
    gpu.ops->weight_release(gpu.ctx, dev);
}

static void test_dummy_fp8(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    struct dummy_part a = {.seed = 7, .tensor = 3, .n = 576 * 1040, .scale = 0.03f, .dtype = DTYPE_F8_E4M3,
                           .src = DTYPE_BF16, .rows = 576, .cols = 1040, .block_rows = 128, .block_cols = 128};
    struct dummy_part b = a;
    b.tensor = 4, b.rows = 640, b.n = 640 * 1040, b.src = DTYPE_F32, b.block_rows = 64, b.block_cols = 48;
    check_dummy(&a, 1);
    struct dummy_part two[2] = {b, a};
    check_dummy(two, 2);
}

int main(void) {
    rng_seed("test_cuda_fp8");
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_cuda_fp8: %s; the tests below fail\n", err.msg);
    } else {
        setenv("KILN_CUDA_WGMMA_FP8", "0", 1);
        knob_reload(NULL);
        int rc = backend_create(&gpu_lt, "cuda", &bo, &err);
        setenv("KILN_CUDA_FP8_LT", "0", 1);
        knob_reload(NULL);
        rc = rc || backend_create(&gpu_nolt, "cuda", &bo, &err);
        unsetenv("KILN_CUDA_FP8_LT");
        unsetenv("KILN_CUDA_WGMMA_FP8");
        knob_reload(NULL);
        if (rc) {
            fprintf(stderr, "cuda backend (KILN_CUDA_WGMMA_FP8=0): %s\n", err.msg);
            return 1;
        }
        struct backend_options bd = {.deterministic = 1};
        if (backend_create(&gpu_det, "cuda", &bd, &err)) {
            fprintf(stderr, "cuda backend (deterministic): %s\n", err.msg);
            return 1;
        }
        if (!gpu.ops->fp8_weights) fail_msg("the cuda backend does not take FP8 weights");
        if (cpu.ops->reserve(cpu.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu.ops->reserve(gpu.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_det.ops->reserve(gpu_det.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_lt.ops->reserve(gpu_lt.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_nolt.ops->reserve(gpu_nolt.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err)) {
            fprintf(stderr, "reserve: %s\n", err.msg);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_fp8),
        cmocka_unit_test(test_matmul_fp8_det),
        cmocka_unit_test(test_gemv_fp8),
        cmocka_unit_test(test_fused_fp8),
        cmocka_unit_test(test_dummy_fp8),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu)
        backend_destroy(&gpu), backend_destroy(&gpu_det), backend_destroy(&gpu_lt), backend_destroy(&gpu_nolt);
    backend_destroy(&cpu);
    return rc;
}
