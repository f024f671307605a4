/* test_engine_window.c — a model whose every layer slides (the oracle's
 * tiny Mistral, sliding_window 8) through the engine, on the CPU:
 *
 *  - prompt logprobs of the oracle's sequences (longer than the window),
 *    prefilled in chunks smaller than the window at page sizes 1 and 16,
 *    so pages are returned between the chunks: within 1e-3 of Hugging
 *    Face's logits;
 *  - a long generation in a pool far smaller than its context (but larger
 *    than the window and a chunk) completes, the pages in use staying
 *    bounded by the window (the pool's free count), while the same model
 *    without its window cannot take the request, and a request it can take
 *    keeps a page per token; the generated ids are what a single-chunk
 *    prefill of prompt + output (every page present) picks greedily at
 *    each position;
 *  - the prefix cache with the window: many requests sharing prefixes
 *    longer than the window give the same ids as each alone without the
 *    cache, and some found their prefix cached;
 *  - short prompts growing past the window, many at once in a pool that
 *    holds two or three of them: the same ids as alone (retractions, where
 *    the timing of the submissions leads to them, release the window's
 *    pages too). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"
#include "model/safetensors.h"
#include "scheduler/engine.h"
#include "tensor/dtype.h"

#include "../engine_sink.h"
#include "oracle_ref.h"

enum { WINDOW = 8 };

static char model_dir[4096];   /* the oracle's mistral: every layer slides over 8 */
static char nowin_dir[4096];   /* the same weights, sliding_window null */

static struct engine *start(const char *dir, int page_size, int pool_tokens, int radix, int chunk) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = dir;
    o.page_size = page_size;
    o.max_total_tokens = pool_tokens;
    o.disable_radix_cache = !radix;
    o.chunked_prefill_size = chunk;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    o.max_running_requests = 16;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

/* The oracle's sequences, each longer than twice the window (so the
 * window is exercised), at least two. */
static void window_ref_open(struct ref *r) {
    ref_open(r, model_dir);
    for (int i = 0; i < r->n; i++) assert_true(r->len[i] > 2 * WINDOW);
    assert_true(r->n >= 2);
}

/* Prompt logprobs across the window's edge, chunks of 3 < 8, against the
 * oracle; then the pool is whole again. */
static void test_prompt_logprobs_oracle(void **state) {
    (void)state;
    struct ref ref;
    window_ref_open(&ref);
    const int page_sizes[] = {1, 16};
    for (int k = 0; k < 2; k++) {
        struct engine *e = start(model_dir, page_sizes[k], 0, k == 1, 3);
        for (int i = 0; i < ref.n; i++) {
            struct sink *s = sink_new();
            struct engine_request r = sink_request(ref.ids[i], ref.len[i], 1, s);
            r.prompt_logprobs = 1;
            sink_submit(e, &r);
            sink_wait(s);
            double worst = 0;
            for (int q = 1; q < ref.len[i]; q++) {
                const float *lg = ref.logits[i] + (size_t)(q - 1) * (size_t)ref.V;
                double mx = -INFINITY, sum = 0;
                for (int v = 0; v < ref.V; v++) mx = fmax(mx, lg[v]);
                for (int v = 0; v < ref.V; v++) sum += exp(lg[v] - mx);
                double want = lg[ref.ids[i][q]] - mx - log(sum);
                assert_int_equal(s->lp_seen[q], 1);
                worst = fmax(worst, fabs(want - s->lp[q].logprob));
            }
            if (worst > 1e-3) fail_msg("page size %d, sequence %d: prompt logprob off by %g", page_sizes[k], i, worst);
            sink_free(s);
        }
        engine_destroy(e);
    }
    st_close(&ref.st);
}

/* Once the engine is idle, every page is free or held by the prefix cache
 * (stats are published after the step that sent the final events). */
static void assert_pool_whole(struct engine *e) {
    struct engine_stats st;
    for (int tries = 0; tries < 400; tries++) {
        engine_stats(e, &st);
        if (st.running == 0 && st.waiting == 0 && st.kv_pages_free + st.kv_pages_cached == st.kv_pages_total) break;
        usleep(5000);
    }
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
}

/* A sink that also follows the pool's pages in use. */
struct wsink {
    struct sink *s;
    struct engine *e;
    long max_used;
};

static void wsink_on_event(void *user, const struct engine_event *ev) {
    struct wsink *w = user;
    struct engine_stats st;
    engine_stats(w->e, &st);
    long used = st.kv_pages_total - st.kv_pages_free - st.kv_pages_cached;
    if (used > w->max_used) w->max_used = used;
    sink_on_event(w->s, ev);
}

/* writes the mistral fixture's copy with sliding_window null */
static void make_nowindow_copy(void) {
    snprintf(nowin_dir, sizeof nowin_dir, "/tmp/kiln_test_nowin_%d", (int)getpid());
    mkdir(nowin_dir, 0755);
    const char *files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 4; i++) {
        char src[4200], dst[4200];
        snprintf(src, sizeof src, "%s/%s", model_dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", nowin_dir, files[i]);
        unlink(dst);
        assert_int_equal(symlink(src, dst), 0);
    }
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/config.json", model_dir);
    snprintf(dst, sizeof dst, "%s/config.json", nowin_dir);
    struct kiln_error err = {0};
    size_t n;
    char *cfg = NULL;
    if (file_read_all(src, &cfg, &n, &err)) fail_msg("%s", err.msg);
    char *at = strstr(cfg, "\"sliding_window\": 8");
    assert_non_null(at);
    FILE *f = fopen(dst, "w");
    assert_non_null(f);
    fwrite(cfg, 1, (size_t)(at - cfg), f);
    fputs("\"sliding_window\": null", f);
    fputs(at + strlen("\"sliding_window\": 8"), f);
    fclose(f);
    free(cfg);
}

static void remove_nowindow_copy(void) {
    const char *files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json", "config.json"};
    for (int i = 0; i < 5; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", nowin_dir, files[i]);
        unlink(p);
    }
    rmdir(nowin_dir);
}

static void test_long_generation_small_pool(void **state) {
    (void)state;
    enum { NEW = 200, POOL = 48, CHUNK = 4 };
    struct ref ref;
    window_ref_open(&ref);
    const int32_t *prompt = ref.ids[0];
    int n_prompt = ref.len[0];
    assert_true(n_prompt + NEW > 4 * POOL);

    /* the windowed model: done in a pool of 48 tokens, at most the window
     * (and the pages its first and next positions are in) in use */
    struct engine *e = start(model_dir, 1, POOL, 0, CHUNK);
    struct wsink w = {.s = sink_new(), .e = e};
    struct engine_request r = sink_request(prompt, n_prompt, NEW, w.s);
    r.callback = wsink_on_event;
    r.user = &w;
    sink_submit(e, &r);
    sink_wait(w.s);
    assert_int_equal(w.s->finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(w.s->n_ids, NEW);
    assert_true(w.max_used > 0);
    if (w.max_used > WINDOW + CHUNK + 1) fail_msg("%ld pages in use with a window of %d", w.max_used, WINDOW);
    assert_pool_whole(e);
    engine_destroy(e);

    /* the same weights without the window: the request can never fit, and
     * one that fits keeps a page per token */
    make_nowindow_copy();
    e = start(nowin_dir, 1, POOL, 0, CHUNK);
    struct sink *s2 = sink_new();
    struct engine_request r2 = sink_request(prompt, n_prompt, NEW, s2);
    struct kiln_error err;
    assert_int_equal(engine_submit(e, &r2, &err), 0);
    assert_int_equal(err.code, KILN_ERR_TOO_LARGE);
    struct wsink w3 = {.s = sink_new(), .e = e};
    struct engine_request r3 = sink_request(prompt, 20, 20, w3.s);
    r3.callback = wsink_on_event;
    r3.user = &w3;
    sink_submit(e, &r3);
    sink_wait(w3.s);
    assert_int_equal(w3.s->n_ids, 20);
    assert_true(w3.max_used >= 20 + 20 - 2);
    engine_destroy(e);
    remove_nowindow_copy();
    sink_free(s2), sink_free(w3.s);

    /* the truth: one chunk over prompt + output (every page present while
     * it runs) picks each output id greedily */
    int n = n_prompt + NEW - 1;
    assert_true(n <= SINK_MAX_PROMPT);
    int32_t *all = xmalloc((size_t)n * sizeof *all);
    memcpy(all, prompt, (size_t)n_prompt * sizeof *all);
    memcpy(all + n_prompt, w.s->ids, (size_t)(NEW - 1) * sizeof *all);
    e = start(model_dir, 1, 0, 0, 512);
    struct sink *s4 = sink_new();
    struct engine_request r4 = sink_request(all, n, 1, s4);
    r4.prompt_logprobs = 1;
    r4.prompt_logprob_start = n_prompt;
    r4.sampling.top_logprobs = 1;
    sink_submit(e, &r4);
    sink_wait(s4);
    for (int q = n_prompt; q < n; q++) {
        assert_int_equal(s4->lp_seen[q], 1);
        if (s4->lp[q].top_ids[0] != all[q])
            fail_msg("output %d: generated %d, the full prefill picks %d", q - n_prompt, all[q], s4->lp[q].top_ids[0]);
    }
    assert_int_equal(s4->ids[0], w.s->ids[NEW - 1]);
    engine_destroy(e);
    free(all);
    sink_free(s4), sink_free(w.s);
    st_close(&ref.st);
}

/* Prompt i: a shared start of 20 ids (longer than the window), then 3..9
 * ids of its own; every third one shares a longer start of 30. */
static int make_prompt(int i, int32_t *out) {
    int n = 0;
    for (int k = 0; k < 20; k++) out[n++] = 100 + (k * 13) % 700;
    if (i % 3 == 0)
        for (int k = 0; k < 10; k++) out[n++] = 50 + k * 7;
    int extra = 3 + i % 7;
    for (int k = 0; k < extra; k++) out[n++] = 260 + (i * 37 + k * 11) % 240;
    return n;
}

static void test_radix_with_window(void **state) {
    (void)state;
    enum { N = 12, NEW = 30 };
    const int page_sizes[] = {1, 4};
    for (int k = 0; k < 2; k++) {
        int ps = page_sizes[k];
        struct sink *alone[N], *cached[N];
        int32_t p[64];
        struct engine *e = start(model_dir, ps, 0, 0, 5);
        for (int i = 0; i < N; i++) {
            alone[i] = sink_new();
            struct engine_request r = sink_request(p, make_prompt(i, p), NEW, alone[i]);
            sink_submit(e, &r);
            sink_wait(alone[i]);
        }
        engine_destroy(e);
        /* the cache on, all at once in a pool of one request's most
         * (mem_plan_window_tokens), a chunk and a few pages: the cached
         * prefixes get evicted and shared as requests come and go */
        e = start(model_dir, ps, 2 * WINDOW + 2 * ps + 5 + 8 * ps, 1, 5);
        int cached_total = 0;
        for (int i = 0; i < N; i++) {
            cached[i] = sink_new();
            struct engine_request r = sink_request(p, make_prompt(i, p), NEW, cached[i]);
            sink_submit(e, &r);
            if (i == 0) sink_wait(cached[0]); /* its prefix is in the cache for the others */
        }
        for (int i = 0; i < N; i++) {
            sink_wait(cached[i]);
            assert_int_equal(cached[i]->n_ids, NEW);
            if (memcmp(alone[i]->ids, cached[i]->ids, NEW * sizeof(int32_t)))
                fail_msg("page size %d, request %d: other ids with the prefix cache", ps, i);
            cached_total += cached[i]->cached_tokens;
        }
        assert_true(cached_total > 0);
        assert_pool_whole(e);
        engine_destroy(e);
        for (int i = 0; i < N; i++) sink_free(alone[i]), sink_free(cached[i]);
    }
}

/* Short prompts (under the window) growing past it, many at once in a
 * pool of 40 positions that holds two or three of them: the same ids as
 * each alone, and the pool whole at the end. Whether the scheduler's
 * optimistic admission leads to retractions here depends on the timing of
 * the submissions (its reservation is bounded by the window); where it
 * does, the retracted requests' window pages go back too. */
static void test_retraction_with_window(void **state) {
    (void)state;
    enum { N = 16, NEW = 12 };
    struct sink *alone[N], *tight[N];
    int32_t p[8];
    struct engine *e = start(model_dir, 1, 0, 0, 8);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 4; k++) p[k] = 100 + (i * 31 + k * 17) % 600;
        alone[i] = sink_new();
        struct engine_request r = sink_request(p, 4, NEW, alone[i]);
        sink_submit(e, &r);
        sink_wait(alone[i]);
    }
    engine_destroy(e);
    e = start(model_dir, 1, 40, 1, 8);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 4; k++) p[k] = 100 + (i * 31 + k * 17) % 600;
        tight[i] = sink_new();
        struct engine_request r = sink_request(p, 4, NEW, tight[i]);
        sink_submit(e, &r);
    }
    for (int i = 0; i < N; i++) {
        sink_wait(tight[i]);
        assert_int_equal(tight[i]->n_ids, NEW);
        if (memcmp(alone[i]->ids, tight[i]->ids, NEW * sizeof(int32_t)))
            fail_msg("request %d: other ids in the tight pool", i);
    }
    assert_pool_whole(e);
    struct engine_stats st;
    engine_stats(e, &st);
    printf("  tight pool: %ld retractions\n", st.retractions_total);
    engine_destroy(e);
    for (int i = 0; i < N; i++) sink_free(alone[i]), sink_free(tight[i]);
}

int main(void) {
    snprintf(model_dir, sizeof model_dir, "%s/oracle/tiny-models-more/mistral", getenv("KILN_FIXTURES"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_logprobs_oracle),
        cmocka_unit_test(test_long_generation_small_pool),
        cmocka_unit_test(test_radix_with_window),
        cmocka_unit_test(test_retraction_with_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
