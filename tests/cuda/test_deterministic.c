/* test_deterministic.c — --deterministic on the GPU: a request's logits are
 * bitwise identical whether it runs alone or among 31 other sequences of
 * other lengths, with prefill chunks and decode rows mixed in the same
 * steps (deterministic, batch-invariant inference).
 *
 * A small qwen3-shaped model with dummy weights (head_dim 64, GQA 8/4, so
 * the tensor-core prefill and the split-KV decode kernels both run) goes
 * through runner_forward on the CUDA backend created with
 * backend_options.deterministic. Request R: a 600-token prompt (several
 * query tiles, three 256-position decode chunks), then 4 decode steps.
 * Run 1: R alone. Run 2: the same steps of R inside batches of 32
 * sequences: other prompts arrive in the same steps as R's prefill and
 * decode rows, R sits at another row and on other (scrambled) pages. The
 * logits of R's rows must match to the bit. The same comparison without
 * --deterministic is printed for information (the GEMV / cuBLAS choice by
 * batch size makes it differ). Also asserted: the same with the FP8 KV cache
 * (--kv-cache-dtype fp8_e4m3: the e4m3 prefill and decode paths), and a
 * mistral-shaped twin with a sliding window of 200 positions (R's prompt
 * and decode rows run past it: the windowed kernels' skipped chunks and
 * tiles).
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
#include "cache/kv_pool.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

enum { N_OTHERS = 31, PAGE = 16, R_PROMPT = 600, R_DECODE = 4, MAX_CTX = 2048, VOCAB = 512 };

static const char CONFIG[] =
    "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 512,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 64,"
    " \"intermediate_size\": 1024, \"num_hidden_layers\": 3, \"vocab_size\": 512,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1,"
    " \"eos_token_id\": 2}";

/* the same shapes as a mistral with a sliding window R's prompt crosses */
static const char CONFIG_SWA[] =
    "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 512,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 64,"
    " \"intermediate_size\": 1024, \"num_hidden_layers\": 3, \"vocab_size\": 512,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000,"
    " \"sliding_window\": 200, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"bos_token_id\": 1, \"eos_token_id\": 2}";

static int have_gpu = -1;
static const char *device = "cuda"; /* KILN_TEST_DEVICE=cpu runs the same check on the CPU */

struct seq {
    int prompt_len, start_step, decode_steps; /* prefill in start_step, then decode */
    int32_t pages[MAX_CTX / PAGE];
    struct sb_seq kv;                          /* K/V so far; kv.ids: [prompt_len + decode_steps] */
    int32_t *ids;
};

struct rig {
    struct backend be;
    struct model *m;
    struct runner *run;
    struct kv_pool *kv;
};

static int rig_init(struct rig *r, int deterministic, int kv_fp8, const char *config,
                    struct kiln_error *err) {
    memset(r, 0, sizeof *r);
    struct backend_options bo = {.deterministic = deterministic, .kv_fp8 = kv_fp8};
    if (backend_create(&r->be, device, &bo, err)) return -1;
    struct model_config cfg;
    if (model_config_parse(&cfg, config, strlen(config), "test config", err)) return -1;
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = 4096, .max_seqs = 32,
                               .max_context = MAX_CTX, .seed = 7};
    if (model_load_dummy(&r->m, &cfg, &r->be, &mo, err)) return -1;
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = (long)(32 * (MAX_CTX / PAGE)) * PAGE};
    if (runner_create(&r->run, r->m, &ro, err)) return -1;
    r->kv = runner_kv(r->run);
    kv_pool_scramble(r->kv, deterministic ? 99 : 98);
    return 0;
}

static void rig_free(struct rig *r) {
    runner_free(r->run);
    model_free(r->m);
    backend_destroy(&r->be);
}

/* Runs the steps of seqs[0..n) (seqs[0] is R) and stores R's logits of
 * each of its steps (prefill's last row, then every decode row). */
static void run(struct rig *r, struct seq *seqs, int n, int steps, float *r_logits) {
    struct kiln_error err = {0};
    struct step_batch sb;
    sb_init(&sb, PAGE, 4096, 32, 32 * (MAX_CTX / PAGE));
    float *logits = xmalloc((size_t)32 * VOCAB * 4);
    for (int i = 0; i < n; i++) seqs[i].kv = (struct sb_seq){0, 0, seqs[i].pages, seqs[i].ids};
    for (int step = 0; step < steps; step++) {
        int r_row = -1;
        sb_begin(&sb);
        for (int i = 0; i < n; i++) {
            struct seq *s = &seqs[i];
            int first = s->start_step, last = s->start_step + s->decode_steps;
            if (step < first || step > last) continue;
            int row = sb_add(&sb, r->kv, &s->kv, step == first ? s->prompt_len : 1);
            if (i == 0) r_row = row;
        }
        struct batch b = sb_batch(&sb);
        if (runner_forward(r->run, &b, logits, &err)) fail_msg("forward: %s", err.msg);
        assert_true(r_row >= 0);
        memcpy(r_logits + (size_t)step * VOCAB, logits + (size_t)r_row * VOCAB, VOCAB * 4);
    }
    for (int i = 0; i < n; i++) kv_pool_release(r->kv, seqs[i].kv.pages, seqs[i].kv.n_pages);
    sb_free(&sb);
    free(logits);
}

static void make_seqs(struct seq *seqs) {
    uint64_t st = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i <= N_OTHERS; i++) {
        struct seq *s = &seqs[i];
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        if (i == 0) {
            s->prompt_len = R_PROMPT, s->start_step = 0, s->decode_steps = R_DECODE;
        } else {
            /* prompts of 2..400 tokens (a few single-token ones) arriving in
             * steps 0..3, so every step mixes prefill chunks and decode rows */
            s->prompt_len = i % 9 == 0 ? 1 : 2 + (int)(st % 399);
            s->start_step = i % 4;
            s->decode_steps = R_DECODE + 1 - s->start_step;
        }
        int total = s->prompt_len + s->decode_steps + 1;
        s->ids = xmalloc((size_t)total * 4);
        for (int k = 0; k < total; k++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            s->ids[k] = (int32_t)(3 + st % (VOCAB - 3));
        }
    }
}

static double compare(const float *a, const float *b, size_t n, size_t *n_diff) {
    double mx = 0;
    *n_diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], 4)) (*n_diff)++;
        double d = fabs((double)a[i] - b[i]);
        if (d > mx) mx = d;
    }
    return mx;
}

static void check_mode(int deterministic, int kv_fp8, const char *config, const char *what) {
    struct kiln_error err = {0};
    struct rig r;
    if (rig_init(&r, deterministic, kv_fp8, config, &err)) fail_msg("set-up: %s", err.msg);
    struct seq seqs[N_OTHERS + 1];
    make_seqs(seqs);
    int steps = R_DECODE + 1;
    size_t n = (size_t)steps * VOCAB;
    float *alone = xmalloc(n * 4), *crowd = xmalloc(n * 4);
    run(&r, seqs, 1, steps, alone);
    run(&r, seqs, N_OTHERS + 1, steps, crowd);
    size_t n_diff;
    double mx = compare(alone, crowd, n, &n_diff);
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(alone[i]);
    printf("  %s%s: R alone vs among %d others, %d steps (prefill %d + %d decode): %zu of %zu "
           "logits differ, max |diff| %.3g\n",
           deterministic ? "--deterministic" : "default        ", what, N_OTHERS, steps, R_PROMPT,
           R_DECODE, n_diff, n, mx);
    assert_true(finite);
    if (deterministic) assert_int_equal(n_diff, 0);
    for (int i = 0; i <= N_OTHERS; i++) free(seqs[i].ids);
    free(alone), free(crowd);
    rig_free(&r);
}

static void test_batch_invariance(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    check_mode(1, 0, CONFIG, "");
    check_mode(1, 1, CONFIG, " fp8 KV");
    check_mode(1, 0, CONFIG_SWA, " window 200");
    check_mode(0, 0, CONFIG, ""); /* for information: not asserted */
}

int main(void) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    if (getenv("KILN_TEST_DEVICE")) device = getenv("KILN_TEST_DEVICE");
    have_gpu = backend_create(&be, device, &bo, &err) == 0;
    if (have_gpu) backend_destroy(&be);
    else printf("test_deterministic: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_invariance)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
