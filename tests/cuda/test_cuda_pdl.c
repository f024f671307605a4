/* test_cuda_pdl.c — programmatic dependent launch changes timing, never
 * results: whole decode steps give the same bits with every kernel of the
 * step launched programmatically (the default on Hopper) and with no
 * programmatic launch at all (KILN_CUDA_PDL=0).
 *
 * A kernel that read an input before pdl_wait, or wrote before it, would
 * race with the kernel before it and give other bits now and then: the
 * comparison is bitwise. Two rigs (backend, qwen3-shaped model with the
 * same dummy weights, KV pool) run the same steps: a prefill of N
 * sequences, then decode steps — eager, recorded, replayed from graphs —
 * alternating logits downloads (runner_forward: the layers' graph) and
 * device greedy sampling (runner_forward_sample: the graph with the lm_head
 * and the sampling kernels), then one mixed step (a new prompt beside
 * decode rows: the prefill attention kernel launched before the decode
 * one). Head size 128, GQA 16/8, so decode rows take cuda_attn_decode.cu:
 * N = 1 and 4 with contexts of 130-900 positions split their chunks over
 * several CTAs (the last-CTA fold and its arrival counters), N = 40 fills
 * the GPU and runs unsplit. Every logit and token must match across the
 * two rigs; the logits must be finite and not constant.
 *
 * Label gpu; fails without a GPU. */
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
#include "cache/kv_pool.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"

enum { PAGE = 16, MAX_CTX = 1024, MAX_SEQS = 48, VOCAB = 4096, DECODE = 6, MAX_N = 40 };

static const char CONFIG[] =
    "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 1024,"
    " \"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 128,"
    " \"intermediate_size\": 3072, \"num_hidden_layers\": 4, \"vocab_size\": 4096,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1,"
    " \"eos_token_id\": 2}";

static int have_gpu;

struct rig {
    struct backend be;
    struct model *m;
    struct runner *run;
    struct kv_pool *kv;
};

/* env: the variable that picks the launch mode (NULL: default) */
static int rig_init(struct rig *r, const char *env, struct kiln_error *err) {
    memset(r, 0, sizeof *r);
    struct backend_options bo = {0};
    if (env) setenv(env, "0", 1);
    knob_reload(NULL); /* knobs are read once; this test compares settings */
    int rc = backend_create(&r->be, "cuda", &bo, err);
    if (env) unsetenv(env);
    knob_reload(NULL);
    if (rc) return -1;
    struct model_config cfg;
    if (model_config_parse(&cfg, CONFIG, strlen(CONFIG), "test config", err)) return -1;
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = 8192,
                               .max_seqs = MAX_SEQS, .max_context = MAX_CTX,
                               .seed = 11};
    if (model_load_dummy(&r->m, &cfg, &r->be, &mo, err)) return -1;
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = (long)((MAX_N + 1) * (MAX_CTX / PAGE) + 4) * PAGE};
    if (runner_create(&r->run, r->m, &ro, err)) return -1;
    r->kv = runner_kv(r->run);
    kv_pool_scramble(r->kv, 5); /* same seed in every rig: the same pages */
    return 0;
}

static void rig_free(struct rig *r) {
    runner_free(r->run);
    model_free(r->m);
    backend_destroy(&r->be);
}

static int prompt_len(int n, int s) {
    return n <= 4 ? 130 + (s * 257 + 640) % 771 : 1 + (s * 53) % 200;
}
static int32_t token(int s, int p) { return (int32_t)(3 + ((unsigned)s * 7919u + (unsigned)p * 104729u) % (VOCAB - 3)); }

/* Runs the steps for n sequences (plus, in the mixed step, sequence n);
 * out gets every step's logits (or tokens, as floats) in order, *count
 * their number. */
static void run(struct rig *r, int n, float *out, size_t *count) {
    struct kiln_error err = {0};
    int32_t *ids = xmalloc(8192 * 4), *pos = xmalloc(8192 * 4), *slot = xmalloc(8192 * 4);
    int32_t q_start[MAX_N + 2], kv_len[MAX_N + 1], page_start[MAX_N + 2], rows[MAX_N + 1],
        tok[MAX_N + 1];
    int32_t *pages = xmalloc((size_t)(MAX_N + 1) * (MAX_CTX / PAGE) * 4);
    int32_t seq_pages[MAX_N + 1][MAX_CTX / PAGE];
    int len[MAX_N + 1], npg[MAX_N + 1];
    float *logits = xmalloc((size_t)(MAX_N + 1) * VOCAB * 4);
    struct backend_sample_row srow[MAX_N + 1];
    memset(srow, 0, sizeof srow); /* temperature 0: greedy */
    struct runner_sampling smp = {.rows = srow};
    size_t at = 0;
    for (int s = 0; s <= n; s++) len[s] = 0, npg[s] = 0;
    for (int step = 0; step < DECODE + 2; step++) {
        /* step 0: prefill of 0..n-1; 1..DECODE: decode; last: decode rows
         * of 0..n-1 and the prompt of sequence n */
        int mixed = step == DECODE + 1, nt = 0, ns = 0, np = 0;
        int last = mixed ? n : n - 1;
        for (int s = 0; s <= last; s++) {
            int add = step == 0 || (mixed && s == n) ? prompt_len(n, s) : 1;
            int need = (len[s] + add + PAGE - 1) / PAGE;
            if (need > npg[s]) {
                assert_int_equal(kv_pool_alloc(r->kv, need - npg[s], seq_pages[s] + npg[s]), 0);
                npg[s] = need;
            }
            q_start[ns] = nt;
            page_start[ns] = np;
            memcpy(pages + np, seq_pages[s], (size_t)npg[s] * 4);
            np += npg[s];
            for (int k = 0; k < add; k++) {
                int p = len[s] + k;
                ids[nt] = token(s, p);
                pos[nt] = p;
                slot[nt] = seq_pages[s][p / PAGE] * PAGE + p % PAGE;
                nt++;
            }
            len[s] += add;
            kv_len[ns] = len[s];
            rows[ns] = nt - 1;
            ns++;
        }
        q_start[ns] = nt;
        page_start[ns] = np;
        int decode = step > 0 && !mixed;
        struct batch b = {.mode = decode ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = nt,
                          .input_ids = ids, .positions = pos, .out_slot = slot, .n_seqs = ns,
                          .q_start = q_start, .kv_len = kv_len, .kv_page_start = page_start,
                          .kv_pages = pages, .page_size = PAGE, .n_logit_rows = ns,
                          .logit_rows = rows};
        if (decode && step % 2 == 0 && runner_can_sample(r->run)) {
            if (runner_forward_sample(r->run, &b, &smp, tok, NULL, &err))
                fail_msg("forward_sample: %s", err.msg);
            for (int j = 0; j < ns; j++) out[at++] = (float)tok[j];
        } else {
            for (long i = 0; i < (long)ns * VOCAB; i++) logits[i] = NAN;
            if (runner_forward(r->run, &b, logits, &err)) fail_msg("forward: %s", err.msg);
            memcpy(out + at, logits, (size_t)ns * VOCAB * 4);
            at += (size_t)ns * VOCAB;
        }
    }
    for (int s = 0; s <= n; s++) kv_pool_release(r->kv, seq_pages[s], npg[s]);
    *count = at;
    free(ids), free(pos), free(slot), free(pages), free(logits);
}

static void test_launch_modes(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    static const char *const envs[2] = {NULL, "KILN_CUDA_PDL"};
    static const char *const names[2] = {"all programmatic", "KILN_CUDA_PDL=0"};
    struct rig rigs[2];
    struct kiln_error err = {0};
    for (int k = 0; k < 2; k++)
        if (rig_init(&rigs[k], envs[k], &err)) fail_msg("set-up (%s): %s", names[k], err.msg);
    const int sizes[] = {1, 4, MAX_N};
    size_t cap = (size_t)(DECODE + 2) * (MAX_N + 1) * VOCAB;
    float *res[2];
    for (int k = 0; k < 2; k++) res[k] = xmalloc(cap * 4);
    for (int si = 0; si < 3; si++) {
        int n = sizes[si];
        size_t cnt[2];
        for (int k = 0; k < 2; k++) run(&rigs[k], n, res[k], &cnt[k]);
        assert_int_equal(cnt[0], cnt[1]);
        size_t bad = 0;
        float lo = INFINITY, hi = -INFINITY;
        for (size_t i = 0; i < cnt[0]; i++) {
            if (!isfinite(res[0][i])) bad++;
            lo = fminf(lo, res[0][i]), hi = fmaxf(hi, res[0][i]);
        }
        for (int k = 1; k < 2; k++) {
            size_t diff = 0;
            for (size_t i = 0; i < cnt[0]; i++) diff += memcmp(&res[0][i], &res[k][i], 4) != 0;
            printf("  N=%d (prefill, %d decode steps, mixed step): %s vs %s: %zu of %zu values "
                   "differ\n", n, DECODE, names[0], names[k], diff, cnt[0]);
            if (diff) fail_msg("N=%d: results depend on the launch mode (%s)", n, names[k]);
        }
        printf("  N=%d: %zu non-finite, values in [%g, %g]\n", n, bad, lo, hi);
        assert_int_equal(bad, 0);
        assert_true(hi > lo);
    }
    for (int k = 0; k < 2; k++) free(res[k]), rig_free(&rigs[k]);
}

int main(void) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    have_gpu = backend_create(&be, "cuda", &bo, &err) == 0;
    if (have_gpu) backend_destroy(&be);
    else printf("test_cuda_pdl: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_launch_modes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
