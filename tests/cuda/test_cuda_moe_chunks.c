/* test_cuda_moe_chunks.c — what the memory plan's fixes rest on, on the
 * GPU against the CPU backend (seed printed; KILN_TEST_SEED repeats).
 *
 *  - MoE chunks (tensor/backend.h, backend_moe_chunk_rows): moe_ffn with
 *    chunks of a few (token, slot) rows (KILN_TEST_MOE_CHUNK_ROWS) gives
 *    the unchunked result to the bit, on the device path (grouped products
 *    with no K split: every row's sums run in the same order whatever the
 *    tiling) and on the host path in deterministic mode (row-invariant
 *    products); both also match the CPU within the bf16 budget of
 *    test_cuda_moe (1e-2). The scratch after a chunked call is no larger
 *    than what workspace_bytes counts for one chunk.
 *  - Dummy weights made on the device (backend_ops.weight_dummy): a tiny
 *    MoE model (the qwen3_moe oracle config) loaded with --load-format
 *    dummy on the GPU has the same bytes in every weight as on the CPU,
 *    whose host fill makes them (tensor/dummy_fill.h).
 *  - Weight slabs (cuda_upload.c): a thousand 3 MiB weights take about
 *    3 GiB of device memory, not the 4 GiB that one allocation each takes
 *    under the driver's 2 MiB rounding.
 *
 * Label gpu; fails without a GPU (run it with ctest -L gpu on the GPU machine). */
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
#include "base/file.h"
#include "base/knob.h"
#include "base/mem.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

static struct backend gdet; /* deterministic: the host path, row-invariant products */

static void set_chunk(long rows) {
    char v[32];
    snprintf(v, sizeof v, "%ld", rows);
    setenv("KILN_TEST_MOE_CHUNK_ROWS", v, 1);
    assert_int_equal(knob_reload(NULL), 0);
}

/* y of moe_ffn on backend b for n tokens with chunks of chunk_rows rows
 * (0: the default, one chunk here), downloaded into out[n][H]. */
static void run_ffn(struct backend *b, long chunk_rows, const struct moe_experts *e, const struct pair *x,
                    const struct pair *ids, const struct pair *w, int K, long n, float *out) {
    set_chunk(chunk_rows);
    long H = e->hidden;
    void *y = b->ops->alloc(b->ctx, (size_t)(n * H) * 4);
    b->ops->moe_ffn(b->ctx, y, x->d, ids->d, w->d, K, e, n);
    struct kiln_error err = {0};
    assert_int_equal(b->ops->step_status(b->ctx, &err), 0);
    b->ops->download(b->ctx, out, y, (size_t)(n * H) * 4);
    b->ops->free(b->ctx, y);
}

static void check_chunks(struct backend *b, int E, int K, int H, int F, long n, long chunk, int device) {
    struct wpair *wp = xmalloc((size_t)(3 * E) * sizeof *wp);
    struct backend_weight *bw = xmalloc((size_t)(6 * E) * sizeof *bw);
    for (int e = 0; e < E; e++) {
        wp[e] = weight_rand(DTYPE_BF16, F, H, 0.125f);
        wp[E + e] = weight_rand(DTYPE_BF16, F, H, 0.125f);
        wp[2 * E + e] = weight_rand(DTYPE_BF16, H, F, 0.15f);
        for (int k = 0; k < 3; k++) bw[k * E + e] = wp[k * E + e].c, bw[(3 + k) * E + e] = wp[k * E + e].g;
    }
    struct moe_experts ec = {.n_experts = E, .hidden = H, .inter = F, .gate = bw, .up = bw + E, .down = bw + 2 * E, .first = 0}, eg = {.n_experts = E, .hidden = H, .inter = F, .gate = bw + 3 * E, .up = bw + 4 * E, .down = bw + 5 * E, .first = 0};
    int32_t *ids = xmalloc((size_t)(n * K) * 4);
    for (long t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = irand(E), dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * K + i] == e;
            } while (dup);
            ids[t * K + j] = e;
        }
    struct pair pid = pair_from(ids, (size_t)(n * K) * 4), w = pair_rand((size_t)(n * K), 1.0f),
                x = pair_rand((size_t)(n * H), 1.0f), y = pair_poison((size_t)(n * H));
    assert_int_equal(b->ops->moe_ffn_graphable(b->ctx, &eg, K, n), device);
    float *whole = xmalloc((size_t)(n * H) * 4), *parts = xmalloc((size_t)(n * H) * 4);
    run_ffn(b, 0, &eg, &x, &pid, &w, K, n, whole);
    run_ffn(b, chunk, &eg, &x, &pid, &w, K, n, parts);
    size_t diff = 0;
    for (long i = 0; i < n * H; i++) diff += memcmp(&whole[i], &parts[i], 4) != 0;
    struct backend_step_shape s = {.max_tokens = n, .moe_layers = 1, .moe_experts = E,
                                   .moe_hidden = H, .moe_inter = F, .moe_slots = K};
    set_chunk(chunk);
    size_t counted = cuda_moe_scratch_bytes(b->ctx, &s), held = ((struct cuda_ctx *)b->ctx)->moe_dev.bytes;
    printf("  %s path E=%d K=%d H=%d F=%d n=%ld, chunks of %ld rows: %zu of %ld values differ from "
           "one chunk; scratch %zu bytes (counted up to %zu)\n",
           device ? "device" : "host", E, K, H, F, n, chunk, diff, n * H, held, counted);
    assert_int_equal(diff, 0);
    set_chunk(0);
    cpu.ops->moe_ffn(cpu.ctx, y.h, x.h, ids, w.h, K, &ec, n);
    memcpy(parts, y.h, (size_t)(n * H) * 4); /* the CPU's */
    b->ops->upload(b->ctx, y.d, whole, (size_t)(n * H) * 4);
    memcpy(y.h, parts, (size_t)(n * H) * 4);
    expect_close(&y, n, H, H, 1e-2);
    for (int i = 0; i < 3 * E; i++) weight_free(&wp[i]);
    free(wp), free(bw), free(ids), free(whole), free(parts);
    pair_free(&pid), pair_free(&w), pair_free(&x), pair_free(&y);
}

static void test_moe_chunks_device(void **state) {
    SKIP_WITHOUT_GPU();
    /* Chunks change no bits within a product tier; the tier depends on
     * the rows per expert of the chunk (cuda_moe.cu: the grouped GEMV
     * computes from the fp32 rows, the tensor-core kernel from 16-bit
     * copies), so each case keeps its chunks in one tier.
     * Top-8 of 16 experts: 255 tokens in 51 chunks of 5 tokens (40 rows,
     * more than two per expert: the tensor-core kernel) */
    check_chunks(&gpu, 16, 8, 256, 128, 255, 40, 1);
    /* Qwen3-MoE's routing at a smaller width, a few rows per expert: the
     * GEMV, 8-row tiles unchunked against one-row tiles in chunks of one
     * token */
    check_chunks(&gpu, 128, 8, 256, 128, 24, 8, 1);
    /* few experts, 64-row tiles unchunked against 16-row tiles in 13
     * chunks of 15 tokens */
    check_chunks(&gpu, 8, 2, 128, 192, 195, 30, 1);
}

static void test_moe_chunks_host(void **state) {
    SKIP_WITHOUT_GPU();
    check_chunks(&gdet, 16, 4, 128, 64, 300, 100, 0);
    check_chunks(&gdet, 128, 8, 256, 128, 700, 1000, 0);
}

/* Every weight of the tiny qwen3_moe model, dummy on both backends. */
static void expect_same_weight(const struct backend_weight *c, const struct backend_weight *g,
                               const char *what, size_t *n_bytes) {
    size_t bytes = (size_t)c->rows * (size_t)c->cols * dtype_size(c->dtype);
    assert_int_equal(c->dtype, g->dtype);
    unsigned char *h = xmalloc(bytes);
    gpu.ops->download(gpu.ctx, h, g->data, bytes);
    if (memcmp(h, c->data, bytes)) fail_msg("dummy weight %s differs between the GPU and the CPU", what);
    *n_bytes += bytes;
    free(h);
}

static void test_dummy_weights_same_bytes(void **state) {
    SKIP_WITHOUT_GPU();
    const char *fx = getenv("KILN_FIXTURES");
    char *cfg = path_join(fx ? fx : "tests/fixtures", "oracle/tiny-models/qwen3_moe/config.json");
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = 16, .max_seqs = 2,
                               .max_context = 64, .seed = 12345};
    struct model *mc, *mg;
    struct kiln_error err = {0};
    if (model_load(&mc, cfg, &cpu, &mo, &err)) fail_msg("%s", err.msg);
    if (model_load(&mg, cfg, &gpu, &mo, &err)) fail_msg("%s", err.msg);
    size_t n = 0;
    expect_same_weight(&mc->embed, &mg->embed, "embed", &n);
    expect_same_weight(&mc->lm_head, &mg->lm_head, "lm_head", &n);
    for (int l = 0; l < mc->cfg.n_layers; l++) {
        const struct layer *a = &mc->layers[l], *b = &mg->layers[l];
        expect_same_weight(&a->mha.wq, &b->mha.wq, "wq", &n);
        expect_same_weight(&a->mha.wk, &b->mha.wk, "wk", &n);
        expect_same_weight(&a->mha.wv, &b->mha.wv, "wv", &n);
        expect_same_weight(&a->mha.wo, &b->mha.wo, "wo", &n);
        expect_same_weight(&a->moe.router, &b->moe.router, "router", &n);
        for (int e = 0; e < a->moe.experts.n_experts; e++) {
            expect_same_weight(&a->moe.gate[e], &b->moe.gate[e], "gate", &n);
            expect_same_weight(&a->moe.up[e], &b->moe.up[e], "up", &n);
            expect_same_weight(&a->moe.down[e], &b->moe.down[e], "down", &n);
        }
    }
    printf("  %zu bytes of dummy weights equal on both backends (%zu counted for the model)\n", n,
           model_weight_bytes(mc));
    assert_int_equal(model_weight_bytes(mc), model_weight_bytes(mg));
    model_free(mg);
    model_free(mc);
    free(cfg);
}

static void test_weight_slabs(void **state) {
    SKIP_WITHOUT_GPU();
    enum { N = 1000 };
    size_t piece = (size_t)3 << 20, before, after, total;
    unsigned char *h = xcalloc(1, piece);
    const void **w = xmalloc(N * sizeof *w);
    gpu.ops->mem_info(gpu.ctx, &before, &total);
    for (int i = 0; i < N; i++) assert_non_null(w[i] = gpu.ops->weight_upload(gpu.ctx, h, piece));
    gpu.ops->mem_info(gpu.ctx, &after, &total);
    double used = (double)(before - after) / (1 << 30);
    printf("  %d weights of 3 MiB took %.2f GiB of device memory\n", N, used);
    assert_true(used < 3.2);
    for (int i = 0; i < N; i++) gpu.ops->weight_release(gpu.ctx, w[i]);
    gpu.ops->mem_info(gpu.ctx, &after, &total);
    assert_true(after + ((size_t)64 << 20) >= before); /* the slabs went back */
    free(w), free(h);
}

int main(void) {
    rng_seed("test_cuda_moe_chunks");
    struct kiln_error err = {0};
    struct backend_options bo = {0}, det = {.deterministic = 1};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    setenv("KILN_CUDA_MOE", "device", 1); /* opt-in (cuda_backend.c) */
    knob_reload(NULL);
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0 && backend_create(&gdet, "cuda", &det, &err) == 0;
    if (!have_gpu) printf("test_cuda_moe_chunks: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_chunks_device),
                                       cmocka_unit_test(test_moe_chunks_host),
                                       cmocka_unit_test(test_dummy_weights_same_bytes),
                                       cmocka_unit_test(test_weight_slabs)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gdet), backend_destroy(&gpu);
    backend_destroy(&cpu);
    return rc;
}
