/* test_engine.c — the engine end to end, without HTTP: batch invariance,
 * the prefix cache (on, off, salted), retraction under a tiny KV pool,
 * aborts, stop conditions and scores. The independent truths are greedy
 * decoding of one request alone (kiln's own verified forward, itself
 * checked against Hugging Face and llama2.c elsewhere) and the oracle's
 * reference logits for scores. */
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

#include "base/error.h"
#include "base/mem.h"
#include "model/safetensors.h"
#include "scheduler/engine.h"

#include "../engine_sink.h"

static char model_dir[4096];

static struct engine *start(int page_size, int pool_tokens, int radix, int max_running) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = model_dir;
    o.page_size = page_size;
    o.max_total_tokens = pool_tokens;
    o.disable_radix_cache = !radix;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    if (max_running) o.max_running_requests = max_running;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

/* Prompt i of a fixed family: a shared 10-token start, then i-specific ids. */
static int make_prompt(int i, int32_t *out) {
    int n = 0;
    out[n++] = 1;
    for (int k = 0; k < 9; k++) out[n++] = 300 + k;
    int extra = 3 + i % 7;
    for (int k = 0; k < extra; k++) out[n++] = 260 + (i * 37 + k * 11) % 240;
    return n;
}

static uint64_t submit(struct engine *e, struct sink *s, const int32_t *p, int n, int max_new,
                       const char *salt) {
    struct engine_request r = sink_request(p, n, max_new, s);
    r.skip_special_tokens = 1;
    r.cache_salt = salt;
    struct kiln_error err;
    uint64_t id = engine_submit(e, &r, &err);
    if (!id) fail_msg("engine_submit: %s", err.msg);
    return id;
}

static void run_batch(struct engine *e, int n, int max_new, struct sink **sinks) {
    int32_t p[64];
    for (int i = 0; i < n; i++) {
        sinks[i] = sink_new();
        int len = make_prompt(i, p);
        submit(e, sinks[i], p, len, max_new, NULL);
    }
    for (int i = 0; i < n; i++) {
        sink_wait(sinks[i]);
        assert_int_equal(sinks[i]->n_final, 1);
    }
}

static void assert_pool_clean(struct engine *e) {
    struct engine_stats st;
    for (int tries = 0; tries < 200; tries++) { /* stats are published after the step */
        engine_stats(e, &st);
        if (st.running == 0 && st.kv_pages_free + st.kv_pages_cached == st.kv_pages_total) break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
}

/* Alone vs 32 at once vs radix off vs a tiny pool with retraction: the same
 * greedy ids, exactly. */
static void test_invariance_and_retraction(void **state) {
    enum { N = 32, NEW = 40 };
    struct sink *alone[N], *batch[N], *noradix[N], *tiny[N];
    struct engine *e = start(1, 0, 1, 0);
    for (int i = 0; i < N; i++) { /* one at a time */
        int32_t p[64];
        alone[i] = sink_new();
        int len = make_prompt(i, p);
        submit(e, alone[i], p, len, NEW, "alone"); /* salted: no sharing with what follows */
        sink_wait(alone[i]);
        assert_int_equal(alone[i]->finish, ENGINE_FINISH_LENGTH);
        assert_int_equal(alone[i]->n_ids, NEW);
    }
    run_batch(e, N, NEW, batch);
    assert_pool_clean(e);
    engine_destroy(e);

    e = start(16, 0, 0, 0);
    run_batch(e, N, NEW, noradix);
    assert_pool_clean(e);
    engine_destroy(e);

    /* 32 requests of ~60 tokens each need ~1900 slots; give 320 */
    e = start(16, 320, 1, 0);
    run_batch(e, N, NEW, tiny);
    struct engine_stats st;
    engine_stats(e, &st);
    assert_true(st.retractions_total > 0);
    assert_pool_clean(e);
    engine_destroy(e);

    for (int i = 0; i < N; i++) {
        assert_int_equal(batch[i]->n_ids, NEW);
        assert_memory_equal(alone[i]->ids, batch[i]->ids, NEW * sizeof(int32_t));
        assert_memory_equal(alone[i]->ids, noradix[i]->ids, NEW * sizeof(int32_t));
        assert_memory_equal(alone[i]->ids, tiny[i]->ids, NEW * sizeof(int32_t));
        assert_string_equal(alone[i]->text.data, tiny[i]->text.data);
        sink_free(alone[i]), sink_free(batch[i]), sink_free(noradix[i]), sink_free(tiny[i]);
    }
}

static void test_prefix_cache_salt(void **state) {
    struct engine *e = start(4, 0, 1, 0);
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = 260 + (i * 13) % 200;
    const char *salts[] = {NULL, NULL, "tenant-b", "tenant-b", NULL};
    int want_cached[] = {0, 36, 0, 36, 36}; /* 39 matchable tokens, page-aligned: 36 */
    for (int k = 0; k < 5; k++) {
        struct sink *s = sink_new();
        submit(e, s, p, 40, 4, salts[k]);
        sink_wait(s);
        assert_int_equal(s->prompt_tokens, 40);
        assert_int_equal(s->cached_tokens, want_cached[k]);
        sink_free(s);
    }
    assert_pool_clean(e);
    engine_destroy(e);
}

static void test_stop_and_abort(void **state) {
    struct engine *e = start(1, 0, 1, 0);
    int32_t p[] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    struct sink *s = sink_new();
    submit(e, s, p, 5, 100, NULL);
    sink_wait(s);
    /* stop strings: rerun with a stop string taken from the middle of the text */
    assert_true(s->text.len > 20);
    char stop[8];
    memcpy(stop, s->text.data + 10, 5);
    stop[5] = 0;
    const char *stops[] = {stop};
    struct sink *t = sink_new();
    struct engine_request r = {0};
    r.prompt = p;
    r.n_prompt = 5;
    sampling_params_default(&r.sampling);
    r.sampling.temperature = 0;
    r.max_new_tokens = 100;
    r.ignore_eos = 1;
    r.skip_special_tokens = 1;
    r.n_stop = 1;
    r.stop = stops;
    r.callback = sink_on_event;
    r.user = t;
    struct kiln_error err;
    assert_true(engine_submit(e, &r, &err) > 0);
    sink_wait(t);
    assert_int_equal(t->finish, ENGINE_FINISH_STOP);
    assert_non_null(t->matched_stop);
    const char *first = strstr(s->text.data, stop);
    assert_non_null(first);
    assert_int_equal(t->text.len, (size_t)(first - s->text.data)); /* text up to the stop, excluded */
    assert_memory_equal(t->text.data, s->text.data, t->text.len);

    /* abort: a long request is cut short with its reason */
    struct sink *a = sink_new();
    uint64_t id = submit(e, a, p, 5, 400, NULL);
    engine_abort(e, id);
    sink_wait(a);
    assert_int_equal(a->finish, ENGINE_FINISH_ABORT);
    assert_true(a->n_ids < 400);
    assert_pool_clean(e);
    /* requests that can never fit are refused up front */
    int32_t big[600];
    for (int i = 0; i < 600; i++) big[i] = 5;
    r.prompt = big;
    r.n_prompt = 600;
    assert_int_equal(engine_submit(e, &r, &err), 0);
    assert_non_null(strstr(err.msg, "context"));
    engine_destroy(e);
    sink_free(s), sink_free(t), sink_free(a);
}

/* Scores equal softmax over the oracle's reference logits. */
static void test_scores(void **state) {
    char dir[4096], ref_path[4096 + 64];
    snprintf(dir, sizeof dir, "%s/oracle/tiny-models/qwen3", getenv("KILN_FIXTURES"));
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);
    struct st_set ref = {0};
    struct kiln_error err;
    if (st_open_file(&ref, ref_path, &err)) fail_msg("%s", err.msg);
    snprintf(model_dir, sizeof model_dir, "%s", dir);
    struct engine *e = start(1, 0, 1, 0);
    const struct st_tensor *ids = st_find(&ref, "p1.ids"), *lg = st_find(&ref, "p1.logits");
    int32_t labels[] = {5, 17, 300, 1000};
    for (int apply = 0; apply < 2; apply++)
        for (int len = 8; len <= 40; len += 16) {
            struct sink *s = sink_new();
            struct engine_request r = {0};
            r.prompt = ids->data;
            r.n_prompt = len;
            sampling_params_default(&r.sampling);
            r.score = 1;
            r.n_label_ids = 4;
            r.label_ids = labels;
            r.apply_softmax = apply;
            r.callback = sink_on_event;
            r.user = s;
            assert_true(engine_submit(e, &r, &err) > 0);
            sink_wait(s);
            assert_int_equal(s->n_scores, 4);
            const float *row = (const float *)lg->data + (size_t)(len - 1) * 1024;
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < 1024; i++) mx = fmax(mx, row[i]);
            for (int i = 0; i < 1024; i++) sum += exp(row[i] - mx);
            double lsum = 0;
            for (int i = 0; i < 4; i++) lsum += exp(row[labels[i]] - mx);
            for (int i = 0; i < 4; i++) {
                double want = exp(row[labels[i]] - mx) / (apply ? lsum : sum);
                assert_true(fabs(want - s->scores[i]) < 1e-4);
            }
            sink_free(s);
        }
    engine_destroy(e);
    st_close(&ref);
}

/* `--skip GLOB` leaves out the tests whose names match (the ThreadSanitizer
 * build skips the long batch-invariance sweep, which adds no threads). */
int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--skip")) cmocka_set_skip_filter(argv[2]);
    snprintf(model_dir, sizeof model_dir, "%s/stories260K", getenv("KILN_MODELS"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariance_and_retraction),
        cmocka_unit_test(test_prefix_cache_salt),
        cmocka_unit_test(test_stop_and_abort),
        cmocka_unit_test(test_scores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
