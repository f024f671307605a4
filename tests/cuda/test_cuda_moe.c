/* test_cuda_moe.c — the CUDA backend's mixture-of-experts operations
 * against the CPU backend, with the same random inputs (seed printed;
 * KILN_TEST_SEED repeats a run).
 *
 * moe_route: the chosen ids must match the CPU's exactly (random logits
 * make exact ties unlikely), the weights within 1e-5 (fp32 on both sides);
 * with a fused shared expert, every row ends with it at weight 1.
 *
 * moe_ffn has two paths (cuda_moe.cu):
 *   - the device path (KILN_CUDA_MOE=device, set here; up to 256 tokens, 16-bit
 *     experts whose sizes are multiples of 64): rows sorted by expert on
 *     the device, grouped tensor-core products, 16-bit activations and a
 *     16-bit SwiGLU output. Tolerance 1e-2 in ‖gpu − cpu‖ / ‖cpu‖: two
 *     bf16 roundings of the operands (2^-9 each) before fp32 products, the
 *     same budget as the bf16 products of test_cuda_ops; a row summed into
 *     the wrong token or through the wrong expert gives errors near 1.
 *     Covered: Qwen3-MoE's 128 experts / top 8 at 1..256 tokens (16-row
 *     tiles), few experts with many rows each (64-row tiles), every token
 *     choosing the same first expert (one expert with many tiles), the
 *     step recorded as a graph and replayed on new ids and inputs (no host
 *     round trip: a recorded host sync would fail), and
 *     moe_ffn_graphable's answer for each case.
 *   - the host path (larger batches, other shapes, fp32 experts): the ids
 *     come back to the host, cuBLAS / the GEMV per expert (1e-5 where the
 *     GEMV keeps fp32 activations, else 1e-2).
 * Both paths again with gpt-oss's experts (32 experts, top 4): gate, up and
 * down biases and the clamped SwiGLU (moe_experts.act, a limit that clamps
 * a good share of the values), on every product kind of the device path
 * (the GEMV with one-row and 8-row tiles, the mma.sync product with 16-
 * and 64-row tiles, the wgmma product on Hopper) with its graph replay,
 * and on the host path.
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
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

static void check_route(enum moe_route_scoring sc, enum moe_route_method me, int E, int K,
                        int n_group, int topk_group, int with_bias, int renorm, int n_fused) {
    long n = 77;
    int W = K + n_fused; /* a row's slots: the chosen experts, then the fused shared ones */
    struct pair lg = pair_rand((size_t)(n * E), 3.0f), bias = pair_rand((size_t)E, 0.6f);
    for (int e = 0; e < E; e++) bias.h[e] -= 0.4f; /* mostly negative: the 0.0 mask matters */
    gpu.ops->upload(gpu.ctx, bias.d, bias.h, (size_t)E * 4);
    struct pair w = pair_poison((size_t)(n * W));
    int32_t *ci = xmalloc((size_t)(n * W) * 4), *gi = xmalloc((size_t)(n * W) * 4);
    void *gid = gpu.ops->alloc(gpu.ctx, (size_t)(n * W) * 4);
    struct moe_route_params p = {.n_experts = E, .top_k = K, .scoring = sc, .method = me,
                                 .n_group = n_group, .topk_group = topk_group,
                                 .renormalize = renorm, .scaling = 2.5f,
                                 .scale_when_renormalized = 1, .n_fused = n_fused};
    cpu.ops->moe_route(cpu.ctx, ci, w.h, lg.h, with_bias ? bias.h : NULL, &p, n);
    gpu.ops->moe_route(gpu.ctx, gid, w.d, lg.d, with_bias ? bias.d : NULL, &p, n);
    gpu.ops->download(gpu.ctx, gi, gid, (size_t)(n * W) * 4);
    printf("  route scoring=%d method=%d E=%d K=%d groups=%d/%d fused=%d\n", sc, me, E, K, topk_group,
           n_group, n_fused);
    assert_memory_equal(ci, gi, (size_t)(n * W) * 4);
    for (long t = 0; t < n; t++)
        for (int j = 0; j < n_fused; j++) {
            assert_int_equal(ci[t * W + K + j], E + j);
            assert_true(w.h[t * W + K + j] == 1.0f);
        }
    expect_close(&w, n, W, W, 1e-5);
    gpu.ops->free(gpu.ctx, gid);
    free(ci), free(gi);
    pair_free(&lg), pair_free(&bias), pair_free(&w);
}

static void test_moe_route(void **state) {
    SKIP_WITHOUT_GPU();
    check_route(MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 60, 4, 1, 1, 0, 0, 0);   /* qwen2-moe */
    check_route(MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 128, 8, 1, 1, 0, 1, 0);  /* qwen3-moe */
    check_route(MOE_ROUTE_SOFTMAX, MOE_ROUTE_GROUP_LIMITED, 64, 6, 8, 3, 0, 0, 0); /* deepseek-v2 */
    check_route(MOE_ROUTE_SIGMOID, MOE_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 1, 0); /* deepseek-v3 */
    check_route(MOE_ROUTE_SIGMOID, MOE_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 1, 1); /* + the fused shared expert */
    check_route(MOE_ROUTE_SIGMOID, MOE_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 1, 0);
}

/* Experts on both backends: E of each of gate [F][H], up [F][H], down [H][F]. */
struct experts {
    struct wpair *w; /* [3 E] */
    struct backend_weight *bw; /* [6 E]: cpu gate, up, down, gpu gate, up, down */
    struct moe_experts c, g;
    int biased;
    struct pair gb, ub, db; /* biased: [E][F], [E][F], [E][H] */
};

/* biased: gpt-oss's experts (biases, the clamped SwiGLU) */
static void experts_init(struct experts *x, enum dtype dt, int E, int H, int F, int biased) {
    x->w = xmalloc((size_t)(3 * E) * sizeof *x->w);
    x->bw = xmalloc((size_t)(6 * E) * sizeof *x->bw);
    for (int e = 0; e < E; e++) {
        x->w[e] = weight_rand(dt, F, H, 0.125f);
        x->w[E + e] = weight_rand(dt, F, H, 0.125f);
        x->w[2 * E + e] = weight_rand(dt, H, F, 0.15f);
        for (int k = 0; k < 3; k++) x->bw[k * E + e] = x->w[k * E + e].c, x->bw[(3 + k) * E + e] = x->w[k * E + e].g;
    }
    x->c = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = x->bw, .up = x->bw + E, .down = x->bw + 2 * E, .first = 0};
    x->g = (struct moe_experts){.n_experts = E, .hidden = H, .inter = F, .gate = x->bw + 3 * E, .up = x->bw + 4 * E, .down = x->bw + 5 * E, .first = 0};
    x->biased = biased;
    if (!biased) return;
    x->gb = pair_rand((size_t)E * F, 0.5f), x->ub = pair_rand((size_t)E * F, 0.5f), x->db = pair_rand((size_t)E * H, 0.5f);
    x->c.gate_bias = x->gb.h, x->c.up_bias = x->ub.h, x->c.down_bias = x->db.h;
    x->g.gate_bias = x->gb.d, x->g.up_bias = x->ub.d, x->g.down_bias = x->db.d;
    x->c.act = x->g.act = MOE_ACT_SWIGLU_CLAMP;
    x->c.alpha = x->g.alpha = 1.702f;
    x->c.limit = x->g.limit = 0.6f; /* the products' spread is ~0.7 here: many values clamp */
}

static void experts_free(struct experts *x) {
    for (int i = 0; i < 3 * x->c.n_experts; i++) weight_free(&x->w[i]);
    free(x->w), free(x->bw);
    if (x->biased) pair_free(&x->gb), pair_free(&x->ub), pair_free(&x->db);
}

/* ids [n][K]: K distinct experts per token; skew: every token's first
 * choice is expert 3 */
static void make_ids(int32_t *ids, long n, int K, int E, int skew) {
    for (long t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = j == 0 && skew ? 3 : irand(E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * K + i] == e;
            } while (dup);
            ids[t * K + j] = e;
        }
}

/* y = moe_ffn(x) on both backends for n tokens; device: the device path
 * must serve it (and a recording of it replays on new ids and inputs);
 * biased: gpt-oss's experts. */
static void check_ffn(enum dtype dt, int E, int K, int H, int F, long n, int skew, double tol, int device,
                      int biased) {
    struct experts ex;
    experts_init(&ex, dt, E, H, F, biased);
    int32_t *ids = xmalloc((size_t)(n * K) * 4);
    make_ids(ids, n, K, E, skew);
    struct pair pid = pair_from(ids, (size_t)(n * K) * 4), w = pair_rand((size_t)(n * K), 1.0f),
                x = pair_rand((size_t)(n * H), 1.0f), y = pair_poison((size_t)(n * H));
    int graphable = gpu.ops->moe_ffn_graphable(gpu.ctx, &ex.g, K, n);
    printf("  moe_ffn %s E=%d K=%d H=%d F=%d n=%ld%s%s: %s path\n", dtype_name(dt), E, K, H, F, n,
           skew ? " (skewed)" : "", biased ? " (biases, clamped SwiGLU)" : "", graphable ? "device" : "host");
    assert_int_equal(graphable, device);
    cpu.ops->moe_ffn(cpu.ctx, y.h, x.h, (int32_t *)pid.h, w.h, K, &ex.c, n);
    gpu.ops->moe_ffn(gpu.ctx, y.d, x.d, pid.d, w.d, K, &ex.g, n);
    expect_close(&y, n, H, H, tol);
    if (device) {
        /* recorded with these buffers, replayed after new ids, weights and
         * inputs are uploaded into them */
        gpu.ops->graph_begin(gpu.ctx);
        gpu.ops->moe_ffn(gpu.ctx, y.d, x.d, pid.d, w.d, K, &ex.g, n);
        void *g = gpu.ops->graph_end(gpu.ctx);
        assert_non_null(g);
        make_ids(ids, n, K, E, !skew);
        memcpy(pid.h, ids, (size_t)(n * K) * 4);
        for (long i = 0; i < n * K; i++) w.h[i] = frand(1.0f);
        for (long i = 0; i < n * H; i++) x.h[i] = frand(1.0f);
        gpu.ops->upload(gpu.ctx, pid.d, pid.h, pid.bytes);
        gpu.ops->upload(gpu.ctx, w.d, w.h, w.bytes);
        gpu.ops->upload(gpu.ctx, x.d, x.h, x.bytes);
        assert_int_equal(gpu.ops->graph_launch(gpu.ctx, g), 0);
        gpu.ops->synchronize(gpu.ctx);
        gpu.ops->graph_destroy(gpu.ctx, g);
        cpu.ops->moe_ffn(cpu.ctx, y.h, x.h, (int32_t *)pid.h, w.h, K, &ex.c, n);
        printf("  (graph replay on new ids and inputs)\n");
        expect_close(&y, n, H, H, tol);
    }
    experts_free(&ex);
    free(ids);
    pair_free(&pid), pair_free(&w), pair_free(&x), pair_free(&y);
}

static void check_moe_ffn(enum dtype dt, int E, int K, int H, int F, long n, int skew, double tol, int device) {
    check_ffn(dt, E, K, H, F, n, skew, tol, device, 0);
}

static void test_moe_ffn_device(void **state) {
    SKIP_WITHOUT_GPU();
    /* Qwen3-MoE's routing (128 experts, top 8) at a smaller width */
    const long ns[] = {1, 7, 64, 256};
    for (int i = 0; i < 4; i++) check_moe_ffn(DTYPE_BF16, 128, 8, 256, 128, ns[i], 0, 1e-2, 1);
    /* few experts, many rows each: 64-row tiles, partial last tiles */
    check_moe_ffn(DTYPE_BF16, 8, 2, 128, 192, 200, 0, 1e-2, 1);
    /* one expert takes every token: many tiles of one expert (16 and 64 rows) */
    check_moe_ffn(DTYPE_BF16, 128, 8, 256, 128, 100, 1, 1e-2, 1);
    check_moe_ffn(DTYPE_BF16, 16, 4, 128, 64, 100, 1, 1e-2, 1);
    check_moe_ffn(DTYPE_F16, 60, 4, 192, 64, 33, 0, 3e-3, 1); /* qwen2-moe's 60 experts, f16 */
    /* a few rows per expert: the grouped GEMV (one-row tiles for one token,
     * 8-row tiles else; one expert taking every token: several tiles) */
    check_moe_ffn(DTYPE_F16, 60, 4, 192, 64, 1, 0, 3e-3, 1);
    check_moe_ffn(DTYPE_F16, 60, 4, 192, 64, 5, 0, 3e-3, 1);
    check_moe_ffn(DTYPE_BF16, 128, 8, 256, 128, 24, 1, 1e-2, 1);
    check_moe_ffn(DTYPE_BF16, 64, 6, 2048, 1408, 1, 0, 1e-2, 1); /* DeepSeek-V2-Lite's shapes */
    check_moe_ffn(DTYPE_BF16, 64, 6, 2048, 1408, 3, 0, 1e-2, 1);
    /* 32 rows an expert and more on Hopper: the wgmma products
     * (hopper/moe_wgmma.cu; the mma.sync kernel elsewhere) — 128-row
     * tiles, partial last tiles, rows of the next expert in a tile's box,
     * one expert with several tiles, N tails inside a 256- and a
     * 128-column tile, f16; the first call of each makes the maps, the
     * graph replay reuses them */
    check_moe_ffn(DTYPE_BF16, 8, 2, 2048, 1408, 256, 0, 1e-2, 1); /* DeepSeek-V2-Lite's widths */
    check_moe_ffn(DTYPE_BF16, 8, 2, 128, 192, 200, 1, 1e-2, 1); /* the skewed run first */
    check_moe_ffn(DTYPE_BF16, 16, 4, 256, 128, 256, 1, 1e-2, 1);
    check_moe_ffn(DTYPE_BF16, 8, 2, 192, 320, 150, 0, 1e-2, 1);
    check_moe_ffn(DTYPE_F16, 8, 2, 192, 64, 200, 0, 3e-3, 1);
}

static void test_moe_ffn_host(void **state) {
    SKIP_WITHOUT_GPU();
    check_moe_ffn(DTYPE_BF16, 8, 2, 64, 48, 1, 0, 1e-5, 0);    /* F % 64: the GEMV per expert */
    check_moe_ffn(DTYPE_BF16, 8, 2, 64, 48, 100, 0, 1e-2, 0);  /* ~25 rows per expert: cuBLAS */
    check_moe_ffn(DTYPE_BF16, 16, 4, 128, 64, 300, 0, 1e-2, 0); /* more than 256 tokens */
    check_moe_ffn(DTYPE_F32, 8, 2, 128, 64, 5, 0, 1e-5, 0);    /* fp32 experts */
}

/* gpt-oss's experts: biases and the clamped SwiGLU on every path */
static void test_moe_ffn_biased(void **state) {
    SKIP_WITHOUT_GPU();
    /* the device path: the GEMV (one-row tiles for one token, 8-row tiles:
     * 5 tokens give 20 rows <= 2 E), the mma.sync product (16-row tiles at
     * 64 tokens, 64-row tiles at 200), each with its graph replay */
    check_ffn(DTYPE_BF16, 32, 4, 256, 128, 1, 0, 1e-2, 1, 1);
    check_ffn(DTYPE_BF16, 32, 4, 256, 128, 5, 0, 1e-2, 1, 1);
    check_ffn(DTYPE_BF16, 32, 4, 256, 128, 64, 0, 1e-2, 1, 1);
    check_ffn(DTYPE_BF16, 32, 4, 256, 128, 200, 0, 1e-2, 1, 1);
    check_ffn(DTYPE_F16, 32, 4, 192, 64, 33, 0, 3e-3, 1, 1);
    check_ffn(DTYPE_F16, 32, 4, 192, 64, 1, 0, 3e-3, 1, 1);
    /* 32 rows an expert and more: the wgmma products on Hopper (N tails
     * in a 128-column gate|up tile and a 256-column down tile; one
     * expert with several tiles), the mma.sync product elsewhere */
    check_ffn(DTYPE_BF16, 8, 2, 320, 192, 256, 0, 1e-2, 1, 1);
    check_ffn(DTYPE_BF16, 8, 2, 128, 192, 200, 1, 1e-2, 1, 1);
    check_ffn(DTYPE_F16, 8, 2, 192, 64, 200, 0, 3e-3, 1, 1);
    /* the host path: the GEMV per expert (fp32 activations), cuBLAS past
     * the device path's 256 tokens, fp32 experts */
    check_ffn(DTYPE_BF16, 8, 2, 64, 48, 1, 0, 1e-5, 0, 1);
    check_ffn(DTYPE_BF16, 32, 4, 128, 64, 300, 0, 1e-2, 0, 1);
    check_ffn(DTYPE_F32, 8, 2, 128, 64, 5, 0, 1e-5, 0, 1);
}

int main(void) {
    rng_seed("test_cuda_moe");
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    setenv("KILN_CUDA_MOE", "device", 1); /* the default, whatever the environment says */
    setenv("KILN_CUDA_MOE_MAX", "256", 1); /* larger batches: the host path's cases below */
    knob_reload(NULL);
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) printf("test_cuda_moe: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_route), cmocka_unit_test(test_moe_ffn_device),
                                       cmocka_unit_test(test_moe_ffn_host),
                                       cmocka_unit_test(test_moe_ffn_biased)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gpu);
    backend_destroy(&cpu);
    return rc;
}
