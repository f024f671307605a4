/* test_cuda_moe_uniform.c — the benchmark side of the CUDA moe_route
 * (moe_route_params.uniform and .count) against the CPU backend.
 *
 * Uniform routing: for random row keys (slots, positions) and layers, the
 * device must choose the CPU's experts to the bit (both draw with
 * tensor/route_uniform.h and choose on exact floats), whatever logits it is
 * given; weights within 1e-5 (fp32 on both sides, expf may differ).
 * Counting: a device record counts eager calls and the replays of a
 * recorded graph whose keys change between replays (the draw follows the
 * keys' contents, not what was recorded); after each call the ids are read
 * back and counted here, and the record's calls, sum, min, max and rows
 * must match, its flags be zero between calls, and a disabled record must
 * stay as it was through replays. Row counts span one to several hundred
 * blocks (one warp per row: the last block to finish adds up).
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
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

/* Keys of n rows on both sides: random slots and positions. */
struct keys {
    int32_t *h;    /* [2][n]: slots, then positions */
    void *d;
    long n;
};

static void keys_fill(struct keys *k) {
    for (long i = 0; i < k->n; i++) k->h[i] = irand(1 << 20), k->h[k->n + i] = irand(1 << 17);
    gpu.ops->upload(gpu.ctx, k->d, k->h, (size_t)k->n * 8);
}

static struct keys keys_new(long n) {
    struct keys k = {xmalloc((size_t)n * 8), gpu.ops->alloc(gpu.ctx, (size_t)n * 8), n};
    assert_non_null(k.d);
    keys_fill(&k);
    return k;
}

static void keys_free(struct keys *k) {
    free(k->h);
    gpu.ops->free(gpu.ctx, k->d);
}

static void check_uniform(int E, int K, enum moe_route_scoring sc, enum moe_route_method me, int renorm,
                          int n_fused, long n) {
    int W = K + n_fused, layer = irand(64);
    struct keys k = keys_new(n);
    struct pair lg = pair_rand((size_t)(n * E), 3.0f), bias = pair_rand((size_t)E, 0.5f);
    struct pair w = pair_poison((size_t)(n * W));
    int32_t *ci = xmalloc((size_t)(n * W) * 4), *gi = xmalloc((size_t)(n * W) * 4);
    void *gid = gpu.ops->alloc(gpu.ctx, (size_t)(n * W) * 4);
    struct moe_route_params p = {.n_experts = E, .top_k = K, .scoring = sc, .method = me,
                                 .n_group = me == MOE_ROUTE_GREEDY ? 1 : 8, .topk_group = me == MOE_ROUTE_GREEDY ? 1 : 4,
                                 .renormalize = renorm, .scaling = 2.5f, .scale_when_renormalized = 1,
                                 .n_fused = n_fused, .uniform = 1, .layer = layer};
    p.key_slot = k.h, p.key_pos = k.h + n;
    cpu.ops->moe_route(cpu.ctx, ci, w.h, lg.h, bias.h, &p, n);
    p.key_slot = k.d, p.key_pos = (const int32_t *)k.d + n;
    gpu.ops->moe_route(gpu.ctx, gid, w.d, lg.d, bias.d, &p, n);
    gpu.ops->download(gpu.ctx, gi, gid, (size_t)(n * W) * 4);
    printf("  uniform E=%d K=%d scoring=%d method=%d fused=%d rows=%ld layer=%d\n", E, K, sc, me, n_fused, n, layer);
    assert_memory_equal(ci, gi, (size_t)(n * W) * 4);
    for (long t = 0; t < n; t++) /* distinct, and not what the logits would choose everywhere */
        for (int j = 0; j < K; j++)
            for (int q = 0; q < j; q++) assert_int_not_equal(ci[t * W + j], ci[t * W + q]);
    expect_close(&w, n, W, W, 1e-5);
    gpu.ops->free(gpu.ctx, gid);
    free(ci), free(gi);
    pair_free(&lg), pair_free(&bias), pair_free(&w);
    keys_free(&k);
}

static void test_uniform_route(void **state) {
    SKIP_WITHOUT_GPU();
    check_uniform(64, 6, MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 0, 0, 300);   /* deepseek-v2-lite */
    check_uniform(128, 8, MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 1, 0, 1);    /* qwen3-moe, batch 1 */
    check_uniform(128, 8, MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 1, 0, 1000);
    check_uniform(256, 8, MOE_ROUTE_SIGMOID, MOE_ROUTE_NOAUX_TC, 1, 1, 77); /* deepseek-v3: no group limit */
    check_uniform(60, 4, MOE_ROUTE_SOFTMAX, MOE_ROUTE_GREEDY, 0, 0, 33);    /* qwen2-moe */
}

static int host_distinct(const int32_t *ids, long n, int W, int K, int E) {
    char seen[1024] = {0};
    int d = 0;
    for (long i = 0; i < n; i++)
        for (int j = 0; j < K; j++) {
            int e = ids[i * W + j];
            assert_true(e >= 0 && e < E);
            if (!seen[e]) seen[e] = 1, d++;
        }
    return d;
}

struct tally {
    long calls, sum, rows;
    int min, max;
};

static void tally_add(struct tally *t, int d, long n) {
    if (!t->calls || d < t->min) t->min = d;
    if (!t->calls || d > t->max) t->max = d;
    t->calls++, t->sum += d, t->rows += n;
}

static void record_check(void *rec_d, int E, const struct tally *t) {
    size_t bytes = sizeof(struct moe_route_count) + (size_t)E * 4;
    struct moe_route_count *r = xmalloc(bytes);
    gpu.ops->download(gpu.ctx, r, rec_d, bytes);
    assert_int_equal(r->calls, t->calls);
    assert_int_equal(r->sum, t->sum);
    assert_int_equal(r->rows, t->rows);
    assert_int_equal(r->min, t->min);
    assert_int_equal(r->max, t->max);
    assert_int_equal(r->pending, 0);
    const int32_t *flags = (const int32_t *)(r + 1);
    for (int e = 0; e < E; e++) assert_int_equal(flags[e], 0);
    free(r);
}

static void set_enabled(void *rec_d, int32_t on) { gpu.ops->upload(gpu.ctx, rec_d, &on, 4); }

static void check_count(int uniform, long n) {
    int E = 128, K = 8, n_fused = 1, W = K + n_fused;
    size_t rec_bytes = sizeof(struct moe_route_count) + (size_t)E * 4;
    void *rec = gpu.ops->alloc(gpu.ctx, rec_bytes); /* zeroed */
    assert_non_null(rec);
    set_enabled(rec, 1);
    struct keys k = keys_new(n);
    struct pair lg = pair_rand((size_t)(n * E), 3.0f), w = pair_poison((size_t)(n * W));
    void *gid = gpu.ops->alloc(gpu.ctx, (size_t)(n * W) * 4);
    int32_t *ids = xmalloc((size_t)(n * W) * 4);
    struct moe_route_params p = {.n_experts = E, .top_k = K, .scoring = MOE_ROUTE_SOFTMAX, .n_group = 1,
                                 .topk_group = 1, .renormalize = 1, .scaling = 1.0f, .n_fused = n_fused,
                                 .uniform = uniform, .layer = 5, .key_slot = k.d,
                                 .key_pos = (const int32_t *)k.d + n, .count = rec};
    struct tally t = {0};
    /* eager */
    gpu.ops->moe_route(gpu.ctx, gid, w.d, lg.d, NULL, &p, n);
    gpu.ops->download(gpu.ctx, ids, gid, (size_t)(n * W) * 4);
    tally_add(&t, host_distinct(ids, n, W, K, E), n);
    record_check(rec, E, &t);
    /* recorded once, replayed on new keys (uniform) or new logits (model routing) */
    gpu.ops->graph_begin(gpu.ctx);
    gpu.ops->moe_route(gpu.ctx, gid, w.d, lg.d, NULL, &p, n);
    void *g = gpu.ops->graph_end(gpu.ctx);
    assert_non_null(g);
    int32_t *prev = xmalloc((size_t)(n * W) * 4);
    for (int rep = 0; rep < 5; rep++) {
        memcpy(prev, ids, (size_t)(n * W) * 4);
        if (uniform) {
            keys_fill(&k);
        } else {
            float *v = rand_floats((size_t)(n * E), 3.0f);
            gpu.ops->upload(gpu.ctx, lg.d, v, (size_t)(n * E) * 4);
            free(v);
        }
        assert_int_equal(gpu.ops->graph_launch(gpu.ctx, g), 0);
        gpu.ops->download(gpu.ctx, ids, gid, (size_t)(n * W) * 4);
        /* new keys, new experts: a replay does not repeat the recorded draw */
        assert_true(memcmp(prev, ids, (size_t)(n * W) * 4) != 0);
        tally_add(&t, host_distinct(ids, n, W, K, E), n);
        record_check(rec, E, &t);
    }
    printf("  count uniform=%d rows=%ld: %ld calls, %ld experts, min %d max %d\n", uniform, n, t.calls, t.sum, t.min,
           t.max);
    /* disabled: replays leave the record as it was */
    set_enabled(rec, 0);
    for (int rep = 0; rep < 2; rep++) assert_int_equal(gpu.ops->graph_launch(gpu.ctx, g), 0);
    gpu.ops->synchronize(gpu.ctx);
    record_check(rec, E, &t);
    gpu.ops->graph_destroy(gpu.ctx, g);
    gpu.ops->free(gpu.ctx, gid);
    gpu.ops->free(gpu.ctx, rec);
    free(ids), free(prev);
    pair_free(&lg), pair_free(&w);
    keys_free(&k);
}

static void test_count_graph(void **state) {
    SKIP_WITHOUT_GPU();
    check_count(1, 1);
    check_count(1, 64);
    check_count(1, 700);
    check_count(0, 3);
    check_count(0, 256);
}

int main(void) {
    (void)weight_rand, (void)weight_free; /* helpers of cuda_test_pairs.h this test needs not */
    rng_seed("test_cuda_moe_uniform");
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) printf("test_cuda_moe_uniform: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_uniform_route), cmocka_unit_test(test_count_graph)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gpu);
    backend_destroy(&cpu);
    return rc;
}
