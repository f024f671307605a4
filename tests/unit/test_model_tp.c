/* test_model_tp.c — tensor and expert parallel inside the model
 * (docs/distributed.md): every oracle model of tests/fixtures/oracle
 * split over 2 and 4 ranks (and its experts whole over 2 ranks, MoE
 * models), the ranks as threads over a loopback TCP mesh (dist_world.h),
 * each with its own CPU backend of one thread, runs the same steps as one
 * whole model: a prefill of four sequences, a mixed step (a chunk of one
 * sequence beside decode rows of the others) and decode steps, page size
 * 16, logits of every row. Every rank's logits must match the whole
 * model's within 1e-4, and Hugging Face's (reference.safetensors) within
 * kiln verify's 1e-3. The FP8 checkpoints run where their 32x32 blocks
 * allow the split and are refused, naming the tensor, where they do not.
 * Refusals of sizes that do not divide name config.json's field. A split
 * model's weight bytes are what model_config_weight_bytes counts for its
 * config (the memory plan's count). */
#include <math.h>
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
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "dist_world.h"
#include "model_par_test.h"
#include "model_ref_steps.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runner/runner.h"
#include "tensor/backend.h"

enum { PAGE = 16 };

/* One rank (or the whole model: par NULL) loads dir and runs the steps
 * into out[rows][V]. No cmocka asserts: it runs on the ranks' threads. */
static int run_model(const char *dir, const struct ref *r, const struct model_parallel *par, float *out,
                     size_t *weight_bytes, struct kiln_error *err) {
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1}; /* ranks share two cores */
    struct model *m = NULL;
    struct runner *run = NULL;
    int rc = -1;
    int32_t pages[MAX_SEQS][MAX_CTX];
    int n_pages[MAX_SEQS] = {0};
    if (backend_create(&be, "cpu", &bo, err)) return -1;
    if (((struct cpu_ctx *)be.ctx)->n_threads != 1) {
        kiln_errorf(err, "the CPU backend of a rank runs %d threads, expected 1",
                    ((struct cpu_ctx *)be.ctx)->n_threads);
        goto out;
    }
    struct model_options mo = {.max_batch_tokens = MAX_TOKENS, .max_seqs = MAX_SEQS, .max_context = MAX_CTX};
    if (par) mo.par = *par;
    if (model_load(&m, dir, &be, &mo, err)) goto out;
    if (weight_bytes) {
        weight_bytes[0] = model_weight_bytes(m);
        weight_bytes[1] = model_config_weight_bytes(model_config(m));
    }
    if (model_config(m)->vocab_size != r->V) {
        kiln_errorf(err, "model_config reports a vocabulary of %d, expected %d", model_config(m)->vocab_size, r->V);
        goto out;
    }
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = MAX_SEQS * MAX_CTX};
    if (runner_create(&run, m, &ro, err)) goto out;
    if (ref_run_steps(run, r, PAGE, NULL, pages, n_pages, out, err)) goto out;
    rc = 0;
out:
    for (int s = 0; s < MAX_SEQS; s++)
        if (n_pages[s]) kv_pool_release(runner_kv(run), pages[s], n_pages[s]);
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
    return rc;
}

/* ---- ranks as threads ----------------------------------------------------- */

struct job {
    const char *dir;
    const struct ref *ref;
    int tp, ep;
    float *out[8];
    size_t bytes[8][2]; /* model_weight_bytes, model_config_weight_bytes */
    char err[8][KILN_ERROR_MAX];
};
struct tp_world {
    struct world w; /* first: the ranks' k->w */
    struct job *job;
};

static void rank_body(struct rank *k) {
    struct job *j = ((struct tp_world *)k->w)->job;
    struct model_parallel par = {.tp_size = j->tp, .tp_rank = k->r, .ep_size = j->ep, .comm = &k->c};
    struct kiln_error err = {0};
    if (run_model(j->dir, j->ref, &par, j->out[k->r], j->bytes[k->r], &err)) {
        snprintf(j->err[k->r], sizeof j->err[k->r], "%s", err.msg);
        rank_fail(k, "rank %d: %s", k->r, err.msg);
    }
}

/* Runs job j on j->tp ranks; returns how many failed (their messages in
 * j->err). */
static int run_ranks(struct job *j) {
    struct tp_world tw = {.job = j};
    const char *first;
    tw.w.timeout_s = 60;
    return world_run(&tw.w, j->tp, rank_body, &first);
}

/* The whole model against Hugging Face, then every split in `splits`
 * ({tp, ep} pairs) against the whole model. */
static void check_model(const char *rel, const int (*splits)[2], int n_splits) {
    char *dir = fixture(rel);
    struct ref r;
    ref_open_steps(&r, dir);
    const float *want[MAX_ROWS];
    int rows = want_rows(&r, want);
    assert_true(rows <= MAX_ROWS);
    size_t n = (size_t)rows * (size_t)r.V;
    float *whole = xcalloc(n, 4);
    struct kiln_error err = {0};
    if (run_model(dir, &r, NULL, whole, NULL, &err)) fail_msg("%s: %s", rel, err.msg);
    double ref_err = 0;
    for (int i = 0; i < rows; i++) {
        double e = max_diff(whole + (size_t)i * (size_t)r.V, want[i], (size_t)r.V);
        if (!(e <= ref_err)) ref_err = e;
    }
    printf("  %s: whole model, %d rows: max |logit - Hugging Face| %.3g\n", rel, rows, ref_err);
    assert_true(ref_err <= 1e-3);
    for (int t = 0; t < n_splits; t++) {
        struct job j = {.dir = dir, .ref = &r, .tp = splits[t][0], .ep = splits[t][1]};
        for (int k = 0; k < j.tp; k++) j.out[k] = xcalloc(n, 4);
        int bad = run_ranks(&j);
        for (int k = 0; k < j.tp && bad; k++)
            if (j.err[k][0]) fail_msg("%s tp %d ep %d: rank %d: %s", rel, j.tp, j.ep, k, j.err[k]);
        assert_int_equal(bad, 0);
        double e_whole = 0, e_ref = 0;
        for (int k = 0; k < j.tp; k++) {
            double e = max_diff(j.out[k], whole, n);
            if (!(e <= e_whole)) e_whole = e;
            for (int i = 0; i < rows; i++) {
                e = max_diff(j.out[k] + (size_t)i * (size_t)r.V, want[i], (size_t)r.V);
                if (!(e <= e_ref)) e_ref = e;
            }
            /* every rank delivers the same logits (deterministic collectives) */
            assert_memory_equal(j.out[k], j.out[0], n * 4);
        }
        printf("  %s tp %d ep %d: max |logit - whole| %.3g, |logit - Hugging Face| %.3g\n", rel, j.tp,
               j.ep, e_whole, e_ref);
        assert_true(e_whole <= 1e-4);
        assert_true(e_ref <= 1e-3);
        for (int k = 0; k < j.tp; k++) free(j.out[k]);
    }
    free(whole);
    st_close(&r.st);
    free(dir);
}

static const int DENSE[][2] = {{2, 0}, {4, 0}};
static const int MOE[][2] = {{2, 0}, {4, 0}, {2, 2}, {4, 4}};

static void test_llama(void **state) {
    (void)state;
    check_model("oracle/tiny-models/llama", DENSE, 2);
}
static void test_qwen2(void **state) {
    (void)state;
    check_model("oracle/tiny-models/qwen2", DENSE, 2);
}
static void test_qwen3(void **state) {
    (void)state;
    check_model("oracle/tiny-models/qwen3", DENSE, 2);
}
static void test_qwen2_moe(void **state) {
    (void)state;
    check_model("oracle/tiny-models/qwen2_moe", MOE, 4);
}
static void test_qwen3_moe(void **state) {
    (void)state;
    check_model("oracle/tiny-models/qwen3_moe", MOE, 4);
}
static void test_deepseek_v2(void **state) {
    (void)state;
    check_model("oracle/tiny-models/deepseek_v2", MOE, 4);
}
static void test_deepseek_v3(void **state) {
    (void)state;
    check_model("oracle/tiny-models/deepseek_v3", MOE, 4);
}
/* qwen3's head_dim of 32 and intermediate size of 128 fall on the 32x32
 * blocks at tp 2 and 4 (tp 4 replicates each of the 2 KV heads) */
static void test_qwen3_fp8(void **state) {
    (void)state;
    check_model("oracle/tiny-models-fp8/qwen3_fp8", DENSE, 2);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_refusals(void **state) {
    (void)state;
    struct model_config *c = xcalloc(1, sizeof *c);
    load_config("oracle/tiny-models/llama/config.json", c);
    struct model_parallel p = {.tp_size = 3};
    expect_refusal(c, &p, "config.json: num_attention_heads (4) is not divisible by the tensor parallel size 3");
    p = (struct model_parallel){.tp_size = 2, .ep_size = 4};
    expect_refusal(c, &p, "the expert parallel size (4) must equal the tensor parallel size (2)");
    p = (struct model_parallel){.tp_size = 2, .tp_rank = 2};
    expect_refusal(c, &p, "rank 2 is outside the group of 2");
    /* no communicator */
    p = (struct model_parallel){.tp_size = 2};
    expect_refusal(c, &p, "needs a communicator");
    /* 12 heads, 4 KV heads, 6 ranks: neither whole KV heads nor one per rank */
    c->n_heads = 12, c->n_kv_heads = 4;
    p = (struct model_parallel){.tp_size = 6};
    expect_refusal(c, &p, "the tensor parallel size 6 is neither a divisor nor a multiple of num_key_value_heads (4)");
    c->n_heads = 4, c->n_kv_heads = 2, c->intermediate_size = 102;
    p = (struct model_parallel){.tp_size = 4};
    expect_refusal(c, &p, "intermediate_size (102) is not divisible by the tensor parallel size 4");

    load_config("oracle/tiny-models/qwen2_moe/config.json", c);
    c->n_experts = 6;
    p = (struct model_parallel){.tp_size = 4, .ep_size = 4};
    expect_refusal(c, &p, "num_experts (or num_local_experts) (6) is not divisible by the expert parallel size 4");
    c->n_experts = 8, c->moe_intermediate_size = 30;
    p = (struct model_parallel){.tp_size = 4};
    expect_refusal(c, &p, "moe_intermediate_size (30) is not divisible by the tensor parallel size 4");
    load_config("oracle/tiny-models/deepseek_v3/config.json", c);
    c->n_experts = 10;
    p = (struct model_parallel){.tp_size = 4, .ep_size = 4};
    expect_refusal(c, &p, "n_routed_experts (10) is not divisible by the expert parallel size 4");
    free(c);
}

/* FP8 checkpoints whose blocks the split would cut: the tensor named. */
static void expect_fp8_refusal(const char *rel, int tp, int ep, const char *want) {
    char *dir = fixture(rel);
    struct ref r;
    ref_open_steps(&r, dir);
    struct job j = {.dir = dir, .ref = &r, .tp = tp, .ep = ep};
    for (int k = 0; k < tp; k++) j.out[k] = xcalloc((size_t)MAX_ROWS * (size_t)r.V, 4);
    int bad = run_ranks(&j);
    printf("  %s tp %d ep %d refused: %s\n", rel, tp, ep, j.err[0]);
    assert_int_equal(bad, tp);
    for (int k = 0; k < tp; k++) {
        if (!strstr(j.err[k], want)) fail_msg("rank %d: expected '%s' in: %s", k, want, j.err[k]);
        free(j.out[k]);
    }
    st_close(&r.st);
    free(dir);
}

static void test_fp8_refusals(void **state) {
    (void)state;
    /* head_dim 16: a KV head is half a block */
    expect_fp8_refusal("oracle/tiny-models-fp8/llama_fp8", 2, 0,
                       "tensor 'model.layers.0.self_attn.k_proj.weight' is FP8 in 32x32 blocks");
    expect_fp8_refusal("oracle/tiny-models-fp8/qwen3_moe_fp8", 2, 2,
                       "tensor 'model.layers.0.self_attn.k_proj.weight' is FP8 in 32x32 blocks");
    /* 4 heads of 24 query columns: 48 rows a rank */
    expect_fp8_refusal("oracle/tiny-models-fp8/deepseek_v3_fp8", 2, 2,
                       "tensor 'model.layers.0.self_attn.q_b_proj.weight' is FP8 in 32x32 blocks");
}

/* A rank of a dummy model (j->dir: its config.json): its weight bytes and
 * one forward of a 5-token prompt. */
static void dummy_body(struct rank *k) {
    struct job *j = ((struct tp_world *)k->w)->job;
    struct kiln_error err = {0};
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1};
    struct model *m = NULL;
    struct runner *run = NULL;
    if (backend_create(&be, "cpu", &bo, &err)) goto fail;
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = 16, .max_seqs = 1, .max_context = 64,
                               .par = {.tp_size = j->tp, .tp_rank = k->r, .ep_size = j->ep, .comm = &k->c}};
    if (model_load(&m, j->dir, &be, &mo, &err)) goto fail;
    j->bytes[k->r][0] = model_weight_bytes(m);
    j->bytes[k->r][1] = model_config_weight_bytes(model_config(m));
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = 64};
    if (runner_create(&run, m, &ro, &err)) goto fail;
    int32_t page = 0, ids[5] = {1, 2, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, q_start[2] = {0, 5},
            kv_len[1] = {5}, page_start[2] = {0, 1}, row[1] = {4};
    if (kv_pool_alloc(runner_kv(run), 1, &page)) {
        kiln_errorf(&err, "KV pool exhausted");
        goto fail;
    }
    int32_t slot[5];
    for (int i = 0; i < 5; i++) slot[i] = page * PAGE + i;
    struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = 5, .input_ids = ids, .positions = pos,
                      .out_slot = slot, .n_seqs = 1, .q_start = q_start, .kv_len = kv_len,
                      .kv_page_start = page_start, .kv_pages = &page, .page_size = PAGE,
                      .n_logit_rows = 1, .logit_rows = row};
    float *logits = xmalloc((size_t)model_config(m)->vocab_size * 4);
    int rc = runner_forward(run, &b, logits, &err);
    for (int v = 0; rc == 0 && v < model_config(m)->vocab_size; v++)
        if (!isfinite(logits[v])) rc = kiln_errorf(&err, "logit %d is not finite", v);
    free(logits);
    kv_pool_release(runner_kv(run), &page, 1);
    if (rc) goto fail;
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
    return;
fail:
    rank_fail(k, "rank %d: %s", k->r, err.msg);
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
}

/* Dummy weights: the local shapes; what the rank loads is what the memory
 * plan counts for its config. */
static void test_dummy_weight_bytes(void **state) {
    (void)state;
    static const char *const models[] = {"qwen2", "qwen2_moe", "deepseek_v2", "deepseek_v3"};
    for (int i = 0; i < 4; i++) {
        char rel[96];
        snprintf(rel, sizeof rel, "oracle/tiny-models/%s/config.json", models[i]);
        char *cfg = fixture(rel);
        for (int ep = 0; ep <= 2; ep += 2) {
            struct job j = {.dir = cfg, .tp = 2, .ep = ep};
            struct tp_world tw = {.job = &j};
            const char *first;
            tw.w.timeout_s = 60;
            int bad = world_run(&tw.w, 2, dummy_body, &first);
            if (bad) fail_msg("%s ep %d: %s", models[i], ep, first);
            for (int k = 0; k < 2; k++) {
                printf("  %s tp 2 ep %d rank %d: %zu weight bytes, %zu counted\n", models[i], ep, k, j.bytes[k][0],
                       j.bytes[k][1]);
                assert_int_equal(j.bytes[k][0], j.bytes[k][1]);
            }
        }
        free(cfg);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),          cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),          cmocka_unit_test(test_qwen2_moe),
        cmocka_unit_test(test_qwen3_moe),      cmocka_unit_test(test_deepseek_v2),
        cmocka_unit_test(test_deepseek_v3),    cmocka_unit_test(test_qwen3_fp8),
        cmocka_unit_test(test_refusals),       cmocka_unit_test(test_fp8_refusals),
        cmocka_unit_test(test_dummy_weight_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
