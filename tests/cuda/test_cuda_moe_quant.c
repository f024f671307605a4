/* test_cuda_moe_quant.c — the CUDA backend's moe_ffn with quantized
 * experts (cuda_moe_quant.cu) against the CPU backend (seed printed;
 * KILN_TEST_SEED repeats a run): FP8 (e4m3 codes with fp32 block scales,
 * the CPU on the same codes and scales), then MXFP4 (e2m1 codes with an
 * exponent per 32 columns, encoded by tensor/mxfp4.h from random values
 * times a random power of two per block, so that exponents differ; the
 * CPU on the bf16 values the codes decode to, exactly, as the CPU loads
 * an MXFP4 checkpoint).
 *
 * moe_ffn: the CPU dequantizes each weight to fp32 (code × scale, one
 * rounding) and keeps fp32 activations; the GPU uses the same codes and
 * scales with the scale's rounding elsewhere (the GEMV multiplies the sum
 * of each 8 exact code × activation products by the scale, the mma
 * product each K block's sum of exact code × bf16 products: fp32 sums,
 * relative differences ~1e-7) and rounds the activations to bf16 where a
 * tensor core or the down product reads them: the token rows (mma path)
 * and the SwiGLU rows (both paths), 2^-9 relative each. Tolerance 1e-2 in
 * ‖gpu − cpu‖ / ‖cpu‖, the budget test_cuda_moe gives the bf16 device
 * path for the same two roundings; a wrong scale (another block's) or a
 * row summed into the wrong token gives errors of tens of percent to ~1.
 * Covered: 1, 2, 7 tokens (the GEMV with one-row and 8-row tiles), 64
 * (mma, 16-row tiles), 300 and 2048 (64-row tiles); top-k 2, 6, 8; a fused
 * shared expert (every token's last slot, weight 1: one expert with many
 * tiles) and none; partial edge blocks (hidden 320 and inter 192 against
 * 128x128 blocks: the last row block of gate/up and the last column block
 * of down, the last row block of down and column block of gate/up); 32x32
 * blocks (several in one k-step); the tiny oracle models' shapes (inter
 * 32: the GEMV at every batch size); DeepSeek-V2-Lite's shapes (the
 * GEMV's gate|up split in 2 parts of K); a graph recording replayed on new
 * ids and inputs; --deterministic, where the FP8 experts stay on the
 * device path and a token's output does not depend on its batch (bitwise,
 * on the mma product and on the GEMV: one-row tiles against full 8-row
 * ones, with and without a K split); and the fp32-grade mode
 * (KILN_CUDA_MATMUL=bf16x2: the GEMV with fp32 SwiGLU rows) within 1e-5,
 * fp32 sums in another order and the scale's rounding elsewhere. The
 * GEMV's variants: one-row and 8-row tiles (partial and full), K split 1,
 * 2 and 4 parts with a short last part (hidden 4112, inter 2064: 514 and
 * 258 pieces of 8), widths of 16 but not 64 columns (272, 208: the GEMV at
 * every batch, a last 32-piece step of 2 or 26 pieces), and scale blocks of
 * 48 columns (6 pieces a block, not a power of two), 16, and wider than a
 * row (1 x 512). The same cases again with gpt-oss's
 * experts (32 experts, top 4: gate, up and down biases and the clamped
 * SwiGLU, a limit that clamps a good share of the values) on the GEMV
 * (one-row and 8-row tiles) and the mma product (16- and 64-row tiles),
 * with a graph replay.
 *
 * MXFP4 (the same tolerances: the GPU's weight values are the CPU's
 * exactly, every e2m1 value times its power of two, each 8 columns' sum
 * times the scale): the one-row and 8-row GEMV, the mma product (16- and
 * 64-row tiles), a fused shared expert, graph replays, the GEMV's K split
 * (hidden 8224, inter 4128: 514 and 258 pieces of 16 codes), widths of 32
 * but not 64 (the GEMV at every batch), gpt-oss-20b's rows (2880 columns),
 * gpt-oss's biases and clamped SwiGLU, --deterministic, and the
 * fp32-grade mode.
 *
 * Label gpu; fails without a GPU (run it with ctest -L gpu on the GPU machine). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "model/model_internal.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "tensor/mxfp4.h"
#include "cuda_test_pairs.h"

/* CUDA backends besides `gpu`: --deterministic, and the fp32-grade mode
 * (KILN_CUDA_MATMUL=bf16x2) */
static struct backend det, x2;

/* the weights' block size: 128x128 as in the real checkpoints unless a
 * case sets another (the tiny oracle models' 32x32) */
static int BR = 128, BC = 128;

/* gpt-oss's experts (biases, the clamped SwiGLU) where a case sets it */
static int BIASED = 0;

/* MXFP4 experts where a case sets it, else FP8 */
static int MX = 0;

/* A quantized weight on both backends. FP8: random values in ±amp
 * quantized per block with a scale of amax / 448 times a random factor in
 * [1, 2) (so codes do not all reach 448 and scales differ between
 * blocks). MXFP4: codes and exponents on the GPUs (q, ex), the decoded
 * values as bf16 on the CPU (bf). */
struct qw {
    struct backend_weight c, g, d, x; /* CPU, GPU, deterministic GPU, fp32-grade GPU */
    uint8_t *q;
    float *s;
    uint8_t *ex;
    uint16_t *bf;
};

/* An MXFP4 weight: random values in ±amp times 2^j per block of 32, j in
 * 0..3, encoded. */
static struct qw qw_rand_mx(long rows, long cols, float amp) {
    struct qw w = {0};
    size_t n = (size_t)(rows * cols), nb = n / 32;
    w.q = xaligned_alloc(n / 2 + 64);
    w.ex = xaligned_alloc(nb + 64);
    w.bf = xaligned_alloc(n * 2 + 64);
    float x[32], v[32];
    for (size_t b = 0; b < nb; b++) {
        float f = (float)(1 << irand(4));
        for (int i = 0; i < 32; i++) x[i] = frand(amp) * f / 4.0f;
        mxfp4_encode32(x, w.q + b * 16, w.ex + b);
        assert_int_equal(mxfp4_decode(w.q + b * 16, w.ex + b, 1, v), -1);
        for (int i = 0; i < 32; i++) {
            w.bf[b * 32 + (size_t)i] = f32_to_bf16(v[i]);
            assert_true(bf16_to_f32(w.bf[b * 32 + (size_t)i]) == v[i]); /* exact in bf16 */
        }
    }
    w.c = (struct backend_weight){.dtype = DTYPE_BF16, .rows = rows, .cols = cols};
    w.c.data = cpu.ops->weight_upload(cpu.ctx, w.bf, n * 2);
    struct backend_weight base = {.dtype = DTYPE_MXFP4, .rows = rows, .cols = cols, .block_rows = 1, .block_cols = 32};
    struct backend *bs[3] = {&gpu, &det, &x2};
    struct backend_weight *ws[3] = {&w.g, &w.d, &w.x};
    for (int i = 0; i < 3; i++) {
        *ws[i] = base;
        ws[i]->data = bs[i]->ops->weight_upload(bs[i]->ctx, w.q, n / 2);
        ws[i]->e8m0 = bs[i]->ops->weight_upload(bs[i]->ctx, w.ex, nb);
        assert_non_null(ws[i]->data);
        assert_non_null(ws[i]->e8m0);
    }
    return w;
}

static struct qw qw_rand(long rows, long cols, float amp) {
    if (MX) return qw_rand_mx(rows, cols, amp);
    long nbr = (rows + BR - 1) / BR, nbc = (cols + BC - 1) / BC;
    struct qw w = {0};
    w.q = xaligned_alloc((size_t)(rows * cols) + 64);
    w.s = xaligned_alloc((size_t)(nbr * nbc) * 4 + 64);
    for (long b = 0; b < nbr * nbc; b++) w.s[b] = amp / 448.0f * (1.5f + frand(0.5f));
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++)
            w.q[r * cols + c] = f32_to_fp8_e4m3(frand(amp) / w.s[(r / BR) * nbc + c / BC]);
    struct backend_weight base = {.dtype = DTYPE_F8_E4M3, .rows = rows, .cols = cols, .block_rows = BR,
                                  .block_cols = BC};
    size_t qb = (size_t)(rows * cols), sb = (size_t)(nbr * nbc) * 4;
    w.c = base, w.g = base, w.d = base, w.x = base;
    w.c.data = cpu.ops->weight_upload(cpu.ctx, w.q, qb);
    w.c.scale = cpu.ops->weight_upload(cpu.ctx, w.s, sb);
    w.g.data = gpu.ops->weight_upload(gpu.ctx, w.q, qb);
    w.g.scale = gpu.ops->weight_upload(gpu.ctx, w.s, sb);
    w.d.data = det.ops->weight_upload(det.ctx, w.q, qb);
    w.d.scale = det.ops->weight_upload(det.ctx, w.s, sb);
    w.x.data = x2.ops->weight_upload(x2.ctx, w.q, qb);
    w.x.scale = x2.ops->weight_upload(x2.ctx, w.s, sb);
    assert_non_null(w.x.data);
    assert_non_null(w.x.scale);
    assert_non_null(w.g.data);
    assert_non_null(w.g.scale);
    assert_non_null(w.d.data);
    assert_non_null(w.d.scale);
    return w;
}

static void qw_free(struct qw *w) {
    gpu.ops->weight_release(gpu.ctx, w->g.data);
    det.ops->weight_release(det.ctx, w->d.data);
    x2.ops->weight_release(x2.ctx, w->x.data);
    if (w->ex) {
        gpu.ops->weight_release(gpu.ctx, w->g.e8m0);
        det.ops->weight_release(det.ctx, w->d.e8m0);
        x2.ops->weight_release(x2.ctx, w->x.e8m0);
    } else {
        gpu.ops->weight_release(gpu.ctx, w->g.scale);
        det.ops->weight_release(det.ctx, w->d.scale);
        x2.ops->weight_release(x2.ctx, w->x.scale);
    }
    free(w->q), free(w->s), free(w->ex), free(w->bf);
}

struct experts {
    struct qw *w;            /* [3 E] gate, up, down */
    struct backend_weight *bw; /* [12 E]: cpu, gpu, det, x2 × gate, up, down */
    struct moe_experts c, g, d, x;
    float *bh;   /* BIASED: the biases [E][F] gate, [E][F] up, [E][H] down; NULL: none */
    void *bd[3]; /* their copies on gpu, det, x2 */
};

static void experts_init(struct experts *x, int E, int H, int F) {
    x->w = xmalloc((size_t)(3 * E) * sizeof *x->w);
    x->bw = xmalloc((size_t)(12 * E) * sizeof *x->bw);
    for (int e = 0; e < E; e++) {
        x->w[e] = qw_rand(F, H, 0.125f);
        x->w[E + e] = qw_rand(F, H, 0.125f);
        x->w[2 * E + e] = qw_rand(H, F, 0.15f);
        for (int k = 0; k < 3; k++) {
            x->bw[k * E + e] = x->w[k * E + e].c;
            x->bw[(3 + k) * E + e] = x->w[k * E + e].g;
            x->bw[(6 + k) * E + e] = x->w[k * E + e].d;
            x->bw[(9 + k) * E + e] = x->w[k * E + e].x;
        }
    }
    struct backend_weight *b = x->bw;
    x->c = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = b, .up = b + E, .down = b + 2 * E, .first = 0};
    x->g = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = b + 3 * E, .up = b + 4 * E, .down = b + 5 * E, .first = 0};
    x->d = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = b + 6 * E, .up = b + 7 * E, .down = b + 8 * E, .first = 0};
    x->x = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = b + 9 * E, .up = b + 10 * E, .down = b + 11 * E, .first = 0};
    x->bh = NULL;
    if (!BIASED) return;
    size_t nb = (size_t)E * (size_t)(2 * F + H);
    x->bh = rand_floats(nb, 0.5f);
    struct backend *bs[3] = {&gpu, &det, &x2};
    struct moe_experts *ms[4] = {&x->c, &x->g, &x->d, &x->x};
    for (int i = 0; i < 4; i++) {
        const float *base = x->bh;
        if (i) {
            struct backend *be = bs[i - 1];
            x->bd[i - 1] = be->ops->alloc(be->ctx, nb * 4);
            assert_non_null(x->bd[i - 1]);
            be->ops->upload(be->ctx, x->bd[i - 1], x->bh, nb * 4);
            be->ops->synchronize(be->ctx);
            base = x->bd[i - 1];
        }
        ms[i]->gate_bias = base, ms[i]->up_bias = base + (size_t)E * F, ms[i]->down_bias = base + (size_t)2 * E * F;
        ms[i]->act = MOE_ACT_SWIGLU_CLAMP;
        ms[i]->alpha = 1.702f;
        ms[i]->limit = 0.6f; /* the products' spread is ~0.7 here: many values clamp */
    }
}

static void experts_free(struct experts *x) {
    for (int i = 0; i < 3 * x->c.n_experts; i++) qw_free(&x->w[i]);
    free(x->w), free(x->bw);
    if (!x->bh) return;
    gpu.ops->free(gpu.ctx, x->bd[0]), det.ops->free(det.ctx, x->bd[1]), x2.ops->free(x2.ctx, x->bd[2]);
    free(x->bh);
}

/* ids [n][K + fused]: K distinct routed experts of [0, E_routed) per
 * token, then (fused) expert E_routed, the shared one, as moe_route
 * writes them with n_fused = 1 */
static void make_ids(int32_t *ids, float *w, long n, int K, int E_routed, int fused) {
    int W = K + fused;
    for (long t = 0; t < n; t++) {
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = irand(E_routed);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * W + i] == e;
            } while (dup);
            ids[t * W + j] = e;
            w[t * W + j] = frand(1.0f);
        }
        if (fused) ids[t * W + K] = E_routed, w[t * W + K] = 1.0f;
    }
}

/* moe_ffn on both backends for n tokens with E_routed routed experts (+1
 * fused shared expert when fused), top K; graph: also record the call and
 * replay it on new ids and inputs. */
static void check(int E_routed, int K, int fused, int H, int F, long n, int graph) {
    int E = E_routed + fused, W = K + fused;
    struct experts ex;
    experts_init(&ex, E, H, F);
    int32_t *ids = xmalloc((size_t)(n * W) * 4);
    float *wts = xmalloc((size_t)(n * W) * 4);
    make_ids(ids, wts, n, K, E_routed, fused);
    struct pair pid = pair_from(ids, (size_t)(n * W) * 4), w = pair_from(wts, (size_t)(n * W) * 4),
                x = pair_rand((size_t)(n * H), 1.0f), y = pair_poison((size_t)(n * H));
    int graphable = gpu.ops->moe_ffn_graphable(gpu.ctx, &ex.g, W, n);
    if (MX)
        printf("  moe_ffn mxfp4 E=%d%s K=%d H=%d F=%d n=%ld%s\n", E_routed, fused ? "+1 fused" : "", K, H, F, n,
               BIASED ? " (biases, clamped SwiGLU)" : "");
    else
        printf("  moe_ffn fp8 E=%d%s K=%d H=%d F=%d n=%ld blocks %dx%d%s\n", E_routed, fused ? "+1 fused" : "", K, H,
               F, n, BR, BC, BIASED ? " (biases, clamped SwiGLU)" : "");
    assert_int_equal(graphable, 1); /* quantized experts run on the device path only */
    cpu.ops->moe_ffn(cpu.ctx, y.h, x.h, (int32_t *)pid.h, w.h, W, &ex.c, n);
    gpu.ops->moe_ffn(gpu.ctx, y.d, x.d, pid.d, w.d, W, &ex.g, n);
    expect_close(&y, n, H, H, 1e-2);
    /* the fp32-grade mode: fp32 activations, the CPU's weight values: only
     * the order of the fp32 sums differs */
    assert_int_equal(x2.ops->moe_ffn_graphable(x2.ctx, &ex.x, W, n), 1);
    {
        float *yx = xmalloc((size_t)(n * H) * 4);
        void *idd = x2.ops->alloc(x2.ctx, pid.bytes), *wd = x2.ops->alloc(x2.ctx, w.bytes);
        void *xd = x2.ops->alloc(x2.ctx, x.bytes), *yd = x2.ops->alloc(x2.ctx, y.bytes);
        x2.ops->upload(x2.ctx, idd, pid.h, pid.bytes);
        x2.ops->upload(x2.ctx, wd, w.h, w.bytes);
        x2.ops->upload(x2.ctx, xd, x.h, x.bytes);
        x2.ops->moe_ffn(x2.ctx, yd, xd, idd, wd, W, &ex.x, n);
        x2.ops->download(x2.ctx, yx, yd, y.bytes);
        double num = 0, den = 0;
        for (long i = 0; i < n * H; i++) {
            assert_false(isnan(yx[i]));
            num += ((double)yx[i] - y.h[i]) * ((double)yx[i] - y.h[i]), den += (double)y.h[i] * y.h[i];
        }
        double e = sqrt(num / den);
        printf("  fp32-grade mode (bf16x2)                 rel err %.3g (tol 1e-05)\n", e);
        assert_true(e <= 1e-5);
        x2.ops->free(x2.ctx, idd), x2.ops->free(x2.ctx, wd), x2.ops->free(x2.ctx, xd), x2.ops->free(x2.ctx, yd);
        free(yx);
    }
    if (graph) {
        gpu.ops->graph_begin(gpu.ctx);
        gpu.ops->moe_ffn(gpu.ctx, y.d, x.d, pid.d, w.d, W, &ex.g, n);
        void *g = gpu.ops->graph_end(gpu.ctx);
        assert_non_null(g);
        make_ids(ids, wts, n, K, E_routed, fused);
        memcpy(pid.h, ids, (size_t)(n * W) * 4);
        memcpy(w.h, wts, (size_t)(n * W) * 4);
        for (long i = 0; i < n * H; i++) x.h[i] = frand(1.0f);
        gpu.ops->upload(gpu.ctx, pid.d, pid.h, pid.bytes);
        gpu.ops->upload(gpu.ctx, w.d, w.h, w.bytes);
        gpu.ops->upload(gpu.ctx, x.d, x.h, x.bytes);
        assert_int_equal(gpu.ops->graph_launch(gpu.ctx, g), 0);
        gpu.ops->synchronize(gpu.ctx);
        gpu.ops->graph_destroy(gpu.ctx, g);
        cpu.ops->moe_ffn(cpu.ctx, y.h, x.h, (int32_t *)pid.h, w.h, W, &ex.c, n);
        printf("  (graph replay on new ids and inputs)\n");
        expect_close(&y, n, H, H, 1e-2);
    }
    experts_free(&ex);
    free(ids), free(wts);
    pair_free(&pid), pair_free(&w), pair_free(&x), pair_free(&y);
}

static void test_moe_fp8_small_m(void **state) {
    SKIP_WITHOUT_GPU();
    /* Qwen3-MoE's routing (128 experts, top 8), partial edge blocks */
    check(128, 8, 0, 320, 192, 1, 1);
    check(128, 8, 0, 320, 192, 2, 0);
    check(128, 8, 0, 320, 192, 7, 1);
    check(128, 8, 1, 320, 192, 7, 0); /* + a fused shared expert: 8 rows of one expert */
    /* DeepSeek-V2-Lite's shapes, top 6, fused and not */
    check(64, 6, 0, 2048, 1408, 1, 0);
    check(64, 6, 1, 2048, 1408, 2, 0);
}

static void test_moe_fp8_mma(void **state) {
    SKIP_WITHOUT_GPU();
    check(128, 8, 0, 320, 192, 64, 1);  /* 16-row tiles */
    check(128, 8, 1, 320, 192, 64, 0);
    check(128, 8, 0, 320, 192, 300, 0); /* 64-row tiles */
    check(128, 8, 1, 256, 128, 2048, 0);
    check(8, 2, 0, 128, 192, 300, 0);   /* top 2: many rows per expert */
    check(8, 2, 1, 128, 192, 2048, 0);
    check(64, 6, 1, 2048, 1408, 64, 0); /* DeepSeek-V2-Lite's shapes */
    /* 32x32 blocks: several K blocks in one 64-column k-step */
    BR = BC = 32;
    check(16, 4, 1, 128, 64, 300, 0);
    BR = BC = 128;
}

/* The tiny oracle models' shapes (hidden 64, inter 32, 32x32 blocks): the
 * mma product cannot take inter 32, the GEMV serves every batch. */
static void test_moe_fp8_gemv_only(void **state) {
    SKIP_WITHOUT_GPU();
    BR = BC = 32;
    check(16, 4, 1, 64, 32, 1, 0);
    check(16, 4, 1, 64, 32, 300, 1);
    check(8, 2, 0, 64, 32, 2048, 0);
    BR = BC = 128;
}

/* Widths of 16 but not 64 columns: the GEMV at every batch (one-row
 * tiles, partial and full 8-row tiles), the last step of 32 pieces short;
 * scale blocks of 48 columns, of 16, and wider than the rows. */
static void test_moe_fp8_gemv_odd(void **state) {
    SKIP_WITHOUT_GPU();
    check(16, 4, 1, 272, 208, 1, 1);
    check(16, 4, 0, 272, 208, 7, 0);
    check(16, 4, 1, 272, 208, 300, 0);
    BR = BC = 48;
    check(16, 4, 0, 272, 208, 1, 0);
    check(16, 4, 1, 272, 208, 5, 0);
    BR = BC = 16;
    check(8, 2, 1, 208, 272, 3, 0);
    BR = 1, BC = 512;
    check(8, 2, 0, 272, 208, 2, 0);
    BR = BC = 128;
}

/* The GEMV's K split: gate|up rows of 4112 columns (514 pieces: 4 parts of
 * 160, 160, 160 and 34), down rows of 2064 (258: 160 and 98). */
static void test_moe_fp8_gemv_ksplit(void **state) {
    SKIP_WITHOUT_GPU();
    check(3, 2, 0, 4112, 2064, 1, 1);
    check(3, 2, 0, 4112, 2064, 5, 0);
}

/* --deterministic: the FP8 experts run on the device path (graphable) and
 * a token's output is the same bits alone as in a batch of n (every
 * 97th token checked). */
static void det_check(int E, int K, int H, int F, long n) {
    struct experts ex;
    experts_init(&ex, E, H, F);
    int32_t *ids = xmalloc((size_t)(n * K) * 4);
    float *wts = xmalloc((size_t)(n * K) * 4);
    make_ids(ids, wts, n, K, E, 0);
    float *xh = rand_floats((size_t)(n * H), 1.0f), *ya = xmalloc((size_t)(n * H) * 4), *y1 = xmalloc((size_t)H * 4);
    void *idd = det.ops->alloc(det.ctx, (size_t)(n * K) * 4), *wd = det.ops->alloc(det.ctx, (size_t)(n * K) * 4);
    void *xd = det.ops->alloc(det.ctx, (size_t)(n * H) * 4), *yd = det.ops->alloc(det.ctx, (size_t)(n * H) * 4);
    det.ops->upload(det.ctx, idd, ids, (size_t)(n * K) * 4);
    det.ops->upload(det.ctx, wd, wts, (size_t)(n * K) * 4);
    det.ops->upload(det.ctx, xd, xh, (size_t)(n * H) * 4);
    assert_int_equal(det.ops->moe_ffn_graphable(det.ctx, &ex.d, K, n), 1);
    det.ops->moe_ffn(det.ctx, yd, xd, idd, wd, K, &ex.d, n);
    det.ops->download(det.ctx, ya, yd, (size_t)(n * H) * 4);
    for (long t = 0; t < n; t += 97) {
        det.ops->moe_ffn(det.ctx, yd, (const float *)xd + t * H, (const int32_t *)idd + t * K,
                         (const float *)wd + t * K, K, &ex.d, 1);
        det.ops->download(det.ctx, y1, yd, (size_t)H * 4);
        printf("  deterministic H=%d F=%d: token %ld alone == in the batch of %ld\n", H, F, t, n);
        assert_memory_equal(y1, ya + t * H, (size_t)H * 4);
    }
    det.ops->free(det.ctx, idd), det.ops->free(det.ctx, wd), det.ops->free(det.ctx, xd), det.ops->free(det.ctx, yd);
    free(ids), free(wts), free(xh), free(ya), free(y1);
    experts_free(&ex);
}

static void test_moe_fp8_deterministic(void **state) {
    SKIP_WITHOUT_GPU();
    det_check(64, 6, 256, 192, 300);  /* the mma product */
    det_check(16, 4, 272, 208, 300);  /* the GEMV: one-row tiles against full 8-row ones */
    det_check(3, 2, 4112, 2064, 200); /* the GEMV with its K split */
}

/* gpt-oss's experts: biases and the clamped SwiGLU on the GEMV and the
 * mma product, each with the fp32-grade mode's check */
static void test_moe_fp8_biased(void **state) {
    SKIP_WITHOUT_GPU();
    BIASED = 1;
    check(32, 4, 0, 320, 192, 1, 1);   /* GEMV, one-row tiles */
    check(32, 4, 0, 320, 192, 5, 0);   /* GEMV, 8-row tiles (20 rows <= 2 E) */
    check(32, 4, 0, 320, 192, 64, 1);  /* mma, 16-row tiles */
    check(32, 4, 0, 320, 192, 300, 0); /* mma, 64-row tiles */
    BR = BC = 32;
    check(16, 4, 0, 64, 32, 300, 0); /* inter 32: the GEMV at every batch */
    BR = BC = 128;
    check(16, 4, 0, 272, 208, 1, 0); /* GEMV-only widths, one-row and 8-row tiles */
    check(16, 4, 0, 272, 208, 7, 0);
    BIASED = 0;
}

/* MXFP4 experts: the GEMV (one-row and 8-row tiles), the mma product
 * (16- and 64-row tiles), a fused shared expert, graph replays; the GEMV's
 * K split; widths of 32 but not 64 (the GEMV at every batch);
 * gpt-oss-20b's rows; gpt-oss's biases and clamped SwiGLU; and
 * --deterministic. */
static void test_moe_mxfp4(void **state) {
    SKIP_WITHOUT_GPU();
    MX = 1;
    check(128, 8, 0, 320, 192, 1, 1);
    check(128, 8, 1, 320, 192, 7, 0);
    check(128, 8, 0, 320, 192, 64, 1); /* mma, 16-row tiles */
    check(8, 2, 1, 128, 192, 300, 0);  /* mma, 64-row tiles */
    check(3, 2, 0, 8224, 4128, 1, 1);  /* K split: 4 parts of gate|up, 2 of down */
    check(3, 2, 0, 8224, 4128, 5, 0);
    check(16, 4, 1, 288, 224, 1, 0); /* widths of 32, not 64: the GEMV at every batch */
    check(16, 4, 0, 288, 224, 300, 0);
    check(4, 2, 0, 2880, 2880, 1, 0); /* gpt-oss-20b's rows */
    check(4, 2, 0, 2880, 2880, 64, 0);
    BIASED = 1;
    check(32, 4, 0, 320, 192, 1, 1);
    check(32, 4, 0, 320, 192, 5, 0);
    check(32, 4, 0, 320, 192, 300, 1);
    check(16, 4, 0, 64, 32, 300, 0); /* the tiny oracle model's shapes: the GEMV at every batch */
    BIASED = 0;
    det_check(64, 6, 256, 192, 300); /* the mma product */
    det_check(16, 4, 288, 224, 300); /* the GEMV */
    MX = 0;
}

int main(void) {
    rng_seed("test_cuda_moe_quant");
    (void)weight_rand, (void)weight_free; /* cuda_test_pairs.h's 16-bit weights: not used here */
    struct kiln_error err = {0};
    struct backend_options bo = {0}, bd = {.deterministic = 1};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    setenv("KILN_CUDA_MOE", "device", 1); /* the default, whatever the environment says */
    knob_reload(NULL);
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0 && backend_create(&det, "cuda", &bd, &err) == 0;
    setenv("KILN_CUDA_MATMUL", "bf16x2", 1); /* read when the backend is made */
    knob_reload(NULL);
    have_gpu = have_gpu && backend_create(&x2, "cuda", &bo, &err) == 0;
    unsetenv("KILN_CUDA_MATMUL");
    knob_reload(NULL);
    if (!have_gpu) printf("test_cuda_moe_quant: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_fp8_small_m), cmocka_unit_test(test_moe_fp8_mma),
                                       cmocka_unit_test(test_moe_fp8_gemv_only),
                                       cmocka_unit_test(test_moe_fp8_gemv_odd),
                                       cmocka_unit_test(test_moe_fp8_gemv_ksplit),
                                       cmocka_unit_test(test_moe_fp8_deterministic),
                                       cmocka_unit_test(test_moe_fp8_biased), cmocka_unit_test(test_moe_mxfp4)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&x2), backend_destroy(&det), backend_destroy(&gpu);
    backend_destroy(&cpu);
    return rc;
}
