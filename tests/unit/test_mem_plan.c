/* test_mem_plan.c — the memory plan (src/runner/mem_plan.h) and what it
 * counts, without a GPU.
 *
 *  - The plan for the shipped configs on an 80 GB H100 (79.18 GiB total,
 *    78.70 GiB free before loading, as the CUDA runtime reports it there)
 *    with kiln serve's defaults (chunks of 8192 tokens, 256 running
 *    requests, so batches of 8448 rows; device sampling; bf16 KV). The
 *    weights of Qwen3-30B-A3B come to the 56.87 GiB the server logged on
 *    that GPU; its activations stay a few GiB and its KV pool is at least
 *    10 GiB, with the backend's scratch counted at up to 2 GiB (the CUDA
 *    backend's own figure, logged by the server, is below that). The
 *    figures of all three are printed (docs/cuda.md quotes them).
 *  - model_config_weight_bytes (the plan's count) equals what model_load
 *    really loads for every tiny oracle model.
 *  - MoE chunking (tensor/backend.h, backend_moe_chunk_rows): a step of
 *    the largest batch the model reserves for, on the CPU backend with
 *    the tiny MoE oracle models, gives the same logits to the bit with
 *    chunks of a few rows (KILN_TEST_MOE_CHUNK_ROWS) as unchunked, and
 *    the backend's MoE scratch is one chunk's (cpu_moe_scratch_bytes), not
 *    the whole batch's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/knob.h"
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/model.h"
#include "runner/mem_plan.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

#define GIB(x) ((double)(x) / 1073741824.0)

static char *path_in(const char *env, const char *dflt, const char *rel) {
    const char *root = getenv(env);
    return path_join(root ? root : dflt, rel);
}

/* The plan of a shipped config with kiln serve's defaults on an H100. */
static struct mem_plan h100_plan(const char *name, struct mem_plan_in *in, size_t workspace) {
    char rel[128];
    snprintf(rel, sizeof rel, "configs/%s", name);
    char *path = path_in("KILN_MODELS", "models", rel);
    struct model_config c;
    struct kiln_error err = {0};
    if (model_config_load(&c, path, &err)) fail_msg("%s", err.msg);
    free(path);
    long T = 8192 + 256, S = 256, ctx = c.max_position_embeddings;
    size_t kv_token = 0;
    for (int l = 0; l < c.n_layers; l++) {
        /* bf16 cache: MLA one latent row (kv_lora + rope), MHA K and V */
        if (c.kv_lora_rank > 0) kv_token += (size_t)(c.kv_lora_rank + c.qk_rope_head_dim) * 2;
        else kv_token += (size_t)c.n_kv_heads * (size_t)c.head_dim * 2 * 2;
    }
    *in = (struct mem_plan_in){
        .device_total = (size_t)(79.18 * 1073741824.0), .device_free = (size_t)(78.70 * 1073741824.0),
        .mem_fraction_static = 0.88, .kv_token_bytes = kv_token, .max_context = ctx,
        .max_running_requests = (int)S, .chunked_prefill_size = 8192,
        .weights = model_config_weight_bytes(&c) + model_config_derived_bytes(&c),
        .activations = model_activation_bytes(&c, T, ctx),
        .runner = mem_plan_runner_bytes(T, S, ctx, 1, c.vocab_size, 1, 0),
        .workspace = workspace};
    struct mem_plan p;
    int rc = mem_plan_compute(in, &p, &err);
    printf("  %-22s weights %6.2f GiB, activations %5.2f GiB, runner %4.2f GiB, counted %5.2f GiB, "
           "kept back %5.2f GiB; KV %6.2f GiB (%ld tokens of %zu bytes)%s%s\n",
           name, GIB(p.weights), GIB(in->activations), GIB(in->runner), GIB(p.counted),
           GIB(p.reserve), GIB(p.kv_bytes), p.kv_tokens, kv_token, rc ? ": " : "", rc ? err.msg : "");
    return p;
}

static void test_plan_h100(void **state) {
    (void)state;
    struct mem_plan_in in;
    struct mem_plan q = h100_plan("qwen3-30b-a3b.json", &in, (size_t)2 << 30);
    /* the weights kiln logged for this config's dummy load on an H100 */
    assert_true(GIB(q.weights) > 56.865 && GIB(q.weights) < 56.875);
    assert_true(in.activations + in.runner < ((size_t)3 << 30));
    assert_true(q.kv_bytes >= ((size_t)10 << 30));
    /* the pool and the weights stay within the fraction; the rest is kept back */
    assert_true(q.weights + q.kv_bytes <= (size_t)(0.88 * (double)in.device_total) + 1);
    assert_true(q.reserve >= q.counted);

    /* MLA's activations include the MHA-form workspace: K/V of up to
     * 1 GiB plus 64 MiB of decompression buffers (deepseek_mha.c) */
    struct mem_plan v2 = h100_plan("deepseek-v2-lite.json", &in, (size_t)2 << 30);
    assert_true(in.activations + in.runner < ((size_t)4 << 30));
    assert_true(v2.kv_bytes >= ((size_t)20 << 30));

    /* DeepSeek-V3 does not fit one GPU: the plan refuses with the numbers */
    struct mem_plan_in in3;
    (void)h100_plan("deepseek-v3.json", &in3, (size_t)2 << 30);
    struct mem_plan p3;
    struct kiln_error err = {0};
    assert_int_equal(mem_plan_compute(&in3, &p3, &err), -1);
    assert_non_null(strstr(err.msg, "not enough device memory for the KV cache"));

    /* where the counted buffers exceed what the fraction keeps back, the
     * plan keeps back the count: a scratch of 12 GiB shrinks the pool */
    struct mem_plan big = h100_plan("qwen3-30b-a3b.json", &in, (size_t)12 << 30);
    assert_true(big.reserve == big.counted);
    assert_true(big.kv_bytes + ((size_t)3 << 30) < q.kv_bytes);

    /* without a device that reports memory: up to 2 GiB */
    in.device_total = 0;
    struct mem_plan cpu;
    assert_int_equal(mem_plan_compute(&in, &cpu, &err), 0);
    assert_true(cpu.kv_bytes <= ((size_t)2 << 30) && cpu.kv_bytes + in.kv_token_bytes > ((size_t)2 << 30));
}

/* Every layer sliding over a window: a running request keeps at most
 * mem_plan_window_tokens, so the pool's cap is that per request plus a
 * chunk; a window as long as the context changes nothing. */
static void test_plan_window(void **state) {
    (void)state;
    /* the CPU's plan (no device memory): 2 GiB of 1 KiB tokens, capped */
    struct mem_plan_in in = {.kv_token_bytes = 1 << 10, .max_context = 1024, .max_running_requests = 8,
                             .chunked_prefill_size = 512, .page_size = 16};
    struct mem_plan full, win, wide;
    struct kiln_error err = {0};
    assert_int_equal(mem_plan_compute(&in, &full, &err), 0);
    assert_int_equal(full.kv_tokens, 8 * 1024);
    in.window = 128;
    assert_int_equal(mem_plan_window_tokens(128, 16), 2 * 128 + 2 * 16);
    assert_int_equal(mem_plan_compute(&in, &win, &err), 0);
    assert_int_equal(win.kv_tokens, 8 * (2 * 128 + 2 * 16) + 512);
    in.window = 1024;
    assert_int_equal(mem_plan_compute(&in, &wide, &err), 0);
    assert_int_equal(wide.kv_tokens, full.kv_tokens);
}

static const char *const tiny[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
                                   "deepseek_v2", "deepseek_v3"};

static struct model *load_tiny(const char *arch, struct backend *be, int max_tokens) {
    char rel[128];
    snprintf(rel, sizeof rel, "oracle/tiny-models/%s", arch);
    char *dir = path_in("KILN_FIXTURES", "tests/fixtures", rel);
    struct model_options mo = {.max_batch_tokens = max_tokens, .max_seqs = 4, .max_context = 128};
    struct model *m;
    struct kiln_error err = {0};
    if (model_load(&m, dir, be, &mo, &err)) fail_msg("%s", err.msg);
    free(dir);
    return m;
}

/* A hybrid pool's sliding tokens: the ratio's share of the full layers'
 * (0.8 by default), never below one request's window (2W + 2 pages)
 * beside a whole batch, never above the full layers' tokens, whole pages. */
static void test_plan_swa(void **state) {
    (void)state;
    assert_true(mem_plan_swa_ratio(0) == 0.8 && mem_plan_swa_ratio(-1) == 0.8 && mem_plan_swa_ratio(0.25) == 0.25);
    assert_int_equal(mem_plan_swa_tokens(100000, 0, 1024, 1, 8448), 80000);
    assert_int_equal(mem_plan_swa_tokens(100000, 0.5, 1024, 16, 8448), 50000);
    assert_int_equal(mem_plan_swa_tokens(100003, 0.5, 1024, 16, 8448), 50016); /* whole pages */
    /* the least: 2 x 1024 + 2 x 16 + 8448 */
    assert_int_equal(mem_plan_swa_tokens(100000, 0.01, 1024, 16, 8448), 2 * 1024 + 2 * 16 + 8448);
    /* never more than the full layers' (a pool smaller than the least) */
    assert_int_equal(mem_plan_swa_tokens(5000, 0.01, 1024, 16, 8448), 5008);
    assert_int_equal(mem_plan_swa_tokens(5000, 1, 8, 1, 20), 5000);
}

static void test_weight_count_matches_load(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        struct backend be;
        struct backend_options bo = {.n_threads = 1};
        struct kiln_error err = {0};
        assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
        struct model *m = load_tiny(tiny[i], &be, 16);
        printf("  %-12s loaded %zu bytes, counted %zu\n", tiny[i], model_weight_bytes(m),
               model_config_weight_bytes(model_config(m)));
        assert_int_equal(model_weight_bytes(m), model_config_weight_bytes(model_config(m)));
        model_free(m);
        backend_destroy(&be);
    }
}

enum { PAGE = 4, N_SEQS = 3, T_MAX = 64, MAX_CTX = 128 };

/* Logits of a prefill step of exactly T_MAX rows (prompts of 21, 30, 13)
 * and one decode step; returns the CPU backend's MoE scratch bytes. */
static size_t run_steps(const char *arch, long chunk_rows, float *out, long *moe_rows_bound) {
    char v[32];
    snprintf(v, sizeof v, "%ld", chunk_rows);
    setenv("KILN_TEST_MOE_CHUNK_ROWS", v, 1);
    struct kiln_error err = {0};
    assert_int_equal(knob_reload(&err), 0);
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    struct model *m = load_tiny(arch, &be, T_MAX);
    const struct model_config *c = model_config(m);
    int V = c->vocab_size;
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = N_SEQS * MAX_CTX};
    struct runner *r;
    if (runner_create(&r, m, &ro, &err)) fail_msg("%s", err.msg);
    struct kv_pool *kv = runner_kv(r);
    static const int prompt[N_SEQS] = {21, 30, 13};
    int32_t pages[N_SEQS][MAX_CTX / PAGE], ids[N_SEQS][64];
    struct sb_seq seqs[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        for (int k = 0; k < 64; k++) ids[s][k] = (int32_t)((s * 131 + k * 17 + 5) % V);
        seqs[s] = (struct sb_seq){0, 0, pages[s], ids[s]};
    }
    struct step_batch sb;
    sb_init(&sb, PAGE, T_MAX, N_SEQS, N_SEQS * MAX_CTX / PAGE);
    for (int step = 0; step < 2; step++) {
        sb_begin(&sb);
        for (int s = 0; s < N_SEQS; s++) sb_add(&sb, kv, &seqs[s], step == 0 ? prompt[s] : 1);
        struct batch b = sb_batch(&sb);
        if (step == 0) assert_int_equal(b.n_tokens, T_MAX);
        if (runner_forward(r, &b, out + (size_t)step * N_SEQS * V, &err)) fail_msg("%s", err.msg);
    }
    /* one chunk's rows: the slots a token (a fused shared expert
     * included) times the tokens of the largest chunk */
    struct backend_step_shape shape;
    model_step_shape(c, T_MAX, MAX_CTX, model_fuses_shared(m), &shape);
    int slots = shape.moe_slots;
    long per = backend_moe_chunk_tokens(slots);
    long tok = T_MAX < per ? T_MAX : per;
    *moe_rows_bound = tok * slots;
    size_t bound = cpu_moe_scratch_bytes(tok * slots, c->hidden_size, c->moe_intermediate_size);
    const struct cpu_ctx *cc = be.ctx;
    size_t used = cc->moe_buf_floats * 4 + cc->moe_idx_count * 4;
    assert_true(used <= bound);
    for (int s = 0; s < N_SEQS; s++) kv_pool_release(kv, seqs[s].pages, seqs[s].n_pages);
    sb_free(&sb);
    runner_free(r);
    model_free(m);
    backend_destroy(&be);
    unsetenv("KILN_TEST_MOE_CHUNK_ROWS");
    assert_int_equal(knob_reload(&err), 0);
    return used;
}

static void test_moe_chunks_bitwise(void **state) {
    (void)state;
    static const char *const moe[] = {"qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        size_t n = (size_t)2 * N_SEQS * 4096;
        float *a = xcalloc(n, 4), *b = xcalloc(n, 4);
        long rows_a, rows_b;
        size_t used_a = run_steps(moe[i], 0, a, &rows_a);
        /* 7 rows: chunks of 1..3 tokens, uneven against the batch */
        size_t used_b = run_steps(moe[i], 7, b, &rows_b);
        size_t diff = 0;
        for (size_t k = 0; k < n; k++) diff += memcmp(&a[k], &b[k], 4) != 0;
        printf("  %-12s unchunked scratch %zu bytes (%ld rows), chunked %zu bytes (%ld rows); "
               "logits differing: %zu\n", moe[i], used_a, rows_a, used_b, rows_b, diff);
        assert_int_equal(diff, 0);
        assert_true(rows_b < rows_a && used_b < used_a);
        free(a), free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_plan_h100), cmocka_unit_test(test_plan_window),
                                       cmocka_unit_test(test_plan_swa),
                                       cmocka_unit_test(test_weight_count_matches_load),
                                       cmocka_unit_test(test_moe_chunks_bitwise)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
