/* test_cuda_sample_model.c — sampling on the GPU inside the model and the
 * engine (test_cuda_sample.c checks the sampler's kernels row by row):
 *  - the model: runner_forward_sample (greedy, graphs with the sampling
 *    tail, eager, mixed with want_logits rows) against runner_forward + the
 *    host argmax on a tiny oracle model, bitwise on a --deterministic
 *    backend;
 *  - the engine: penalties, logit_bias, min_new_tokens masks and a logprobs
 *    row give the same ids with device sampling as with KILN_GPU_SAMPLE=0
 *    (deterministic mode, so both see the same logits), and a seeded
 *    request repeats itself;
 *  - the engine under a grammar: greedy ids equal with device and host
 *    sampling, every output a word of the grammar.
 * Without a GPU every test fails (gpu-labelled tests run on the GPU machine). */
#include <math.h>
#include <pthread.h>
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
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "model/model.h"
#include "runner/runner.h"
#include "sample/sampling.h"
#include "scheduler/engine.h"
#include "tensor/backend.h"

#include "cuda_test_gpu.h"

/* ---- the model -------------------------------------------------------------------- */

enum { M_SEQS = 16, M_CTX = 64, M_PROMPT = 5, M_STEPS = 4 };

/* Greedy decode steps through runner_forward_sample on model mb against
 * runner_forward on ma (same weights, both on backend be); rows j % 4 == 3
 * of the mixed sizes want logits. exact: tokens and logits bitwise. */
static void run_model(struct backend *be, const char *arch, int exact) {
    const char *fx = getenv("KILN_FIXTURES");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/oracle/tiny-models/%s", fx ? fx : "tests/fixtures", arch);
    struct kiln_error err = {0};
    struct model *ma, *mb;
    struct model_options o = {.max_batch_tokens = M_SEQS * M_PROMPT, .max_seqs = M_SEQS,
                              .max_context = M_CTX};
    if (model_load(&ma, dir, be, &o, &err) || model_load(&mb, dir, be, &o, &err))
        fail_msg("%s: %s", dir, err.msg);
    long V = model_config(ma)->vocab_size;
    const int sizes[] = {1, 3, 8, 13};
    for (int si = 0; si < 4; si++) {
        int N = sizes[si];
        for (int mixed = 0; mixed < 2; mixed++) {
            struct runner *ra, *rb;
            struct runner_options ro = {.page_size = 1, .kv_tokens = N * M_CTX + 1};
            if (runner_create(&ra, ma, &ro, &err) || runner_create(&rb, mb, &ro, &err))
                fail_msg("runner: %s", err.msg);
            assert_true(runner_can_sample(rb));
            struct kv_pool *ka = runner_kv(ra), *kb = runner_kv(rb);
            int32_t pa[M_SEQS * M_CTX], pb[M_SEQS * M_CTX], ps[M_SEQS + 1];
            for (int s = 0; s < N; s++) {
                assert_int_equal(kv_pool_alloc(ka, M_CTX, pa + s * M_CTX), 0);
                assert_int_equal(kv_pool_alloc(kb, M_CTX, pb + s * M_CTX), 0);
                ps[s] = s * M_CTX;
            }
            ps[N] = N * M_CTX;
            float *la = xmalloc((size_t)N * V * 4), *lb = xmalloc((size_t)N * V * 4);
            int32_t ids[M_SEQS * M_PROMPT], pos[M_SEQS * M_PROMPT], sa[M_SEQS * M_PROMPT],
                sb[M_SEQS * M_PROMPT], qs[M_SEQS + 1], kl[M_SEQS], rows[M_SEQS], tok[M_SEQS];
            struct backend_sample_row sr[M_SEQS];
            unsigned char want[M_SEQS];
            memset(sr, 0, sizeof sr);
            for (int s = 0; s < N; s++) want[s] = mixed && s % 4 == 3;
            struct runner_sampling smp = {.want_logits = want, .rows = sr};
            int T = N * M_PROMPT;
            for (int s = 0; s < N; s++) {
                qs[s] = s * M_PROMPT, kl[s] = M_PROMPT, rows[s] = s * M_PROMPT + M_PROMPT - 1;
                for (int p = 0; p < M_PROMPT; p++) {
                    int t = s * M_PROMPT + p;
                    ids[t] = (int32_t)((t * 131 + 7) % V), pos[t] = p;
                    sa[t] = pa[s * M_CTX + p], sb[t] = pb[s * M_CTX + p];
                }
            }
            qs[N] = T;
            int32_t cur[M_SEQS];
            for (int step = -1; step < M_STEPS; step++) {
                struct batch b;
                if (step < 0) { /* prefill: extend rows, eager tail */
                    b = (struct batch){.mode = BATCH_MODE_EXTEND, .n_tokens = T, .input_ids = ids,
                                       .positions = pos, .out_slot = sa, .n_seqs = N, .q_start = qs,
                                       .kv_len = kl, .kv_page_start = ps, .kv_pages = pa,
                                       .page_size = 1, .n_logit_rows = N, .logit_rows = rows};
                } else {
                    int p = M_PROMPT + step;
                    for (int s = 0; s < N; s++) {
                        ids[s] = cur[s], pos[s] = p, sa[s] = pa[s * M_CTX + p], sb[s] = pb[s * M_CTX + p];
                        qs[s] = s, kl[s] = p + 1, rows[s] = s;
                    }
                    qs[N] = N;
                    b = (struct batch){.mode = BATCH_MODE_DECODE, .n_tokens = N, .input_ids = ids,
                                       .positions = pos, .out_slot = sa, .n_seqs = N, .q_start = qs,
                                       .kv_len = kl, .kv_page_start = ps, .kv_pages = pa,
                                       .page_size = 1, .n_logit_rows = N, .logit_rows = rows};
                }
                for (long i = 0; i < N * V; i++) la[i] = lb[i] = NAN;
                assert_int_equal(runner_forward(ra, &b, la, &err), 0);
                b.out_slot = sb, b.kv_pages = pb;
                if (runner_forward_sample(rb, &b, &smp, tok, lb, &err)) fail_msg("%s", err.msg);
                int k = 0, flips = 0;
                for (int s = 0; s < N; s++) {
                    const float *ref = la + (long)s * V;
                    int am = argmax_first(ref, V);
                    if (want[s]) {
                        const float *got = lb + (long)k++ * V;
                        double md = 0, mx = 0;
                        for (long i = 0; i < V; i++) {
                            md = fmax(md, fabs((double)got[i] - ref[i]));
                            mx = fmax(mx, fabs((double)ref[i]));
                        }
                        if (exact ? md != 0 : md > 1e-5 * mx)
                            fail_msg("%s N=%d step %d: want_logits row %d differs by %g", arch, N, step, s, md);
                        tok[s] = am;
                    } else if (tok[s] != am) {
                        /* non-deterministic mode: a near tie may flip with the row count */
                        if (exact || !(ref[tok[s]] >= ref[am] - 1e-5f * fabsf(ref[am])))
                            fail_msg("%s N=%d step %d row %d: device token %d (logit %g), argmax %d (%g)",
                                     arch, N, step, s, tok[s], (double)ref[tok[s]], am, (double)ref[am]);
                        flips++;
                    }
                    cur[s] = tok[s];
                }
                printf("  model %s%s N=%d%s step %d: %d rows sampled on the device agree%s\n", arch,
                       exact ? " (deterministic)" : "", N, mixed ? " (every 4th wants logits)" : "", step,
                       N - k, flips ? " (near ties accepted)" : "");
            }
            runner_free(ra), runner_free(rb);
            free(la), free(lb);
        }
    }
    model_free(ma), model_free(mb);
}

static void test_model(void **state) {
    (void)state;
    NEED_GPU();
    run_model(&gpu_det, "llama", 1);
    run_model(&gpu_det, "qwen3", 1);
    run_model(&gpu, "qwen2", 0);
}

/* ---- the engine -------------------------------------------------------------------- */

struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t ids[512];
    int n, done;
};

static void on_event(void *user, const struct engine_event *ev) {
    struct sink *s = user;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ev->n_tokens && s->n < 512; i++) s->ids[s->n++] = ev->tokens[i];
    if (ev->finish != ENGINE_FINISH_NONE) {
        s->done = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* A deterministic engine on stories260K, sampling on the device or (0) on
 * the host; engine_close undoes the setting. */
static struct engine *engine_open(int device_sampling) {
    setenv("KILN_GPU_SAMPLE", device_sampling ? "1" : "0", 1);
    knob_reload(NULL); /* knobs are read once; these tests compare settings */
    struct engine_options o;
    engine_options_default(&o);
    const char *mdir = getenv("KILN_MODELS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/stories260K", mdir ? mdir : "models");
    o.model_dir = dir, o.device = "cuda", o.deterministic = 1, o.max_running_requests = 8;
    struct kiln_error err = {0};
    struct engine *e;
    if (engine_create(&e, &o, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

static void engine_close(struct engine *e) {
    engine_destroy(e);
    unsetenv("KILN_GPU_SAMPLE");
    knob_reload(NULL);
}

/* Submits r with its tokens going to s (emptied first). */
static void sink_submit(struct engine *e, struct engine_request *r, struct sink *s) {
    struct kiln_error err = {0};
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    r->callback = on_event, r->user = s;
    if (!engine_submit(e, r, &err)) fail_msg("submit: %s", err.msg);
}

static void sink_wait(struct sink *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

enum { E_REQS = 6 };

/* Runs the request set on an engine; ids per request into out. */
static void run_engine(int device_sampling, struct sink *out) {
    struct engine *e = engine_open(device_sampling);
    int32_t prompt[6] = {1, 403, 407, 261, 9, 27};
    struct logit_bias_entry bias[3] = {{378, -100.0f}, {5, 4.0f}, {300, 2.5f}};
    int32_t stop_ids[2] = {432, 383};
    for (int q = 0; q < E_REQS; q++) {
        struct engine_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompt + (q < 4 ? q % 3 : 0), r.n_prompt = 6 - (q < 4 ? q % 3 : 0);
        sampling_params_default(&r.sampling);
        r.sampling.temperature = 0;
        r.max_new_tokens = 24, r.skip_special_tokens = 1, r.ignore_eos = 1;
        switch (q) {
        case 0: r.sampling.repetition_penalty = 1.3f, r.sampling.frequency_penalty = 0.5f,
                r.sampling.presence_penalty = 0.3f; break;
        case 1: r.sampling.n_logit_bias = 3, r.sampling.logit_bias = bias; break;
        case 2: r.min_new_tokens = 8, r.n_stop_ids = 2, r.stop_ids = stop_ids, r.ignore_eos = 0; break;
        case 3: r.sampling.logprobs = 1, r.sampling.top_logprobs = 3, r.sampling.repetition_penalty = 1.1f; break;
        default: /* seeded sampling, twice: must repeat itself */
            r.sampling.temperature = 0.9f, r.sampling.top_p = 0.9f, r.sampling.top_k = 40;
            r.sampling.has_seed = 1, r.sampling.seed = 42;
            break;
        }
        sink_submit(e, &r, &out[q]);
    }
    for (int q = 0; q < E_REQS; q++) sink_wait(&out[q]);
    engine_close(e);
}

static void test_engine(void **state) {
    (void)state;
    NEED_GPU();
    static struct sink dev[E_REQS], host[E_REQS];
    run_engine(1, dev);
    run_engine(0, host);
    for (int q = 0; q < E_REQS; q++) {
        printf("  engine request %d: %d ids on the device, %d with host sampling\n", q, dev[q].n, host[q].n);
        assert_true(dev[q].n > 0);
        if (q < 4) {
            assert_int_equal(dev[q].n, host[q].n);
            for (int i = 0; i < dev[q].n; i++)
                if (dev[q].ids[i] != host[q].ids[i])
                    fail_msg("request %d id %d: device %d, host %d", q, i, dev[q].ids[i], host[q].ids[i]);
        }
    }
    assert_int_equal(dev[4].n, dev[5].n);
    assert_memory_equal(dev[4].ids, dev[5].ids, (size_t)dev[4].n * 4);
    /* min_new_tokens: no stop id among the first 8 */
    for (int i = 0; i < 8 && i < dev[2].n; i++) assert_true(dev[2].ids[i] != 432 && dev[2].ids[i] != 383);
    for (int i = 0; i < dev[1].n; i++) assert_true(dev[1].ids[i] != 378);
}

/* Grammar-constrained requests on the engine (runner_sampling.fill_masks:
 * masks made while the layers run, uploaded before the sampler; a
 * logprobs row sampled on the host from the same masks): greedy ids equal
 * with device and host sampling, and every output, sampled ones included,
 * spells a word of the grammar. */
enum { G_REQS = 6 };
static void run_engine_grammar(int device_sampling, struct sink *out, char texts[G_REQS][256]) {
    struct engine *e = engine_open(device_sampling);
    struct kiln_error err = {0};
    const char *ebnf = "root ::= \"The \" (\"cat\" | \"dog\") \" ate \" [1-9] [0-9]? \" apples.\"";
    struct grammar *g = grammar_compile_ebnf(ebnf, strlen(ebnf), NULL, &err);
    if (!g) fail_msg("grammar: %s", err.msg);
    int32_t prompt[6] = {1, 403, 407, 261, 9, 27};
    for (int q = 0; q < G_REQS; q++) {
        struct engine_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompt, r.n_prompt = 6;
        sampling_params_default(&r.sampling);
        r.sampling.temperature = q < 3 ? 0.0f : 1.2f;
        if (q >= 3) r.sampling.has_seed = 1, r.sampling.seed = (uint64_t)q;
        if (q == 2) r.sampling.logprobs = 1; /* sampled on the host */
        r.max_new_tokens = q == 1 ? 24 : 64, r.skip_special_tokens = 1;
        r.grammar = q == 1 ? NULL : g; /* one free request in the batch */
        r.ignore_eos = q == 1;
        sink_submit(e, &r, &out[q]);
    }
    for (int q = 0; q < G_REQS; q++) {
        sink_wait(&out[q]);
        char *t;
        size_t n;
        kiln_tokenizer_decode(engine_tokenizer(e), out[q].ids, (size_t)out[q].n, 1, &t, &n, &err);
        snprintf(texts[q], 256, "%s", t);
        free(t);
    }
    grammar_unref(g);
    engine_close(e);
}

static int is_sentence(const char *s) {
    char a[4], w[64];
    int k, n = -1;
    if (sscanf(s, "The %3[a-z] ate %2d apples.%n", a, &k, &n) != 2 || n < 0 || s[n]) return 0;
    snprintf(w, sizeof w, "The %s ate %d apples.", a, k);
    return (!strcmp(a, "cat") || !strcmp(a, "dog")) && k >= 1 && !strcmp(s, w);
}

static void test_engine_grammar(void **state) {
    (void)state;
    NEED_GPU();
    static struct sink dev[G_REQS], host[G_REQS];
    static char tdev[G_REQS][256], thost[G_REQS][256];
    run_engine_grammar(1, dev, tdev);
    run_engine_grammar(0, host, thost);
    for (int q = 0; q < G_REQS; q++) {
        printf("  grammar request %d: device \"%s\", host \"%s\"\n", q, tdev[q], thost[q]);
        if (q < 3) {
            assert_int_equal(dev[q].n, host[q].n);
            assert_memory_equal(dev[q].ids, host[q].ids, (size_t)dev[q].n * 4);
        }
        if (q != 1) assert_true(is_sentence(tdev[q]) && is_sentence(thost[q]));
    }
}

int main(void) {
    gpu_open("test_cuda_sample_model");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_engine),
        cmocka_unit_test(test_engine_grammar),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_close();
    return rc;
}
