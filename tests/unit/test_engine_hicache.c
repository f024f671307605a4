/* test_engine_hicache.c — the prefix cache's host tier (cache/host_cache.h,
 * --enable-hierarchical-cache) through the engine on the CPU, with the
 * stories260K model:
 *
 *  - a prompt, then other prompts that push its pages out of a small device
 *    pool, then the prompt again: with the host tier its pages come back
 *    from host memory (cached_tokens and the counters say how many) and the
 *    answer is the first one's; without it nothing is cached and the answer
 *    is the same; page sizes 1 and 4;
 *  - another cache_salt never gets those pages;
 *  - a host tier of a few pages (least recently used out): answers unchanged;
 *  - random traffic over shared starts in a small pool: the answers of a
 *    roomy pool, and starts loaded back;
 *  - what it cannot serve is refused at start-up, saying what: without
 *    the radix cache, a model with sliding windows. */
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
#include "scheduler/engine.h"

#include "../engine_sink.h"

static char model_dir[4096];

enum { PROMPT = 96, NEW = 8, POOL = 256 };

static struct engine *start(int page_size, int hicache, double size_gb) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = model_dir;
    o.page_size = page_size;
    o.max_total_tokens = POOL;
    o.enable_hicache = hicache;
    o.hicache_size_gb = size_gb;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

/* Prompt k: PROMPT ids of its own from the first (stories260K's
 * vocabulary is 512). */
static void make_prompt(int k, int32_t *out) {
    for (int i = 0; i < PROMPT; i++) out[i] = 3 + (k * 131 + i * 17 + i * i * (k + 1)) % 500;
}

struct answer {
    int32_t ids[NEW];
    int n, cached;
};

static struct answer ask(struct engine *e, int k, const char *salt) {
    int32_t p[PROMPT];
    make_prompt(k, p);
    struct sink *s = sink_new();
    struct engine_request r = sink_request(p, PROMPT, NEW, s);
    r.cache_salt = salt;
    sink_submit(e, &r);
    sink_wait(s);
    assert_int_equal(s->n_final, 1);
    struct answer a = {.n = s->n_ids, .cached = s->cached_tokens};
    assert_int_equal(a.n, NEW);
    memcpy(a.ids, s->ids, sizeof a.ids);
    sink_free(s);
    return a;
}

static struct engine_stats stats(struct engine *e) {
    struct engine_stats st;
    engine_stats(e, &st);
    return st;
}

/* Prompt 0, then prompts 1..3 (each nearly half the pool: prompt 0's pages
 * are evicted from the device), then prompt 0 again. */
static void sequence(struct engine *e, struct answer *first, struct answer *again, const char *salt2) {
    *first = ask(e, 0, NULL);
    for (int k = 1; k <= 3; k++) ask(e, k, NULL);
    *again = ask(e, 0, salt2);
}

static void test_reload(void **state) {
    (void)state;
    for (int ps = 1; ps <= 4; ps += 3) {
        struct answer f0, a0, f1, a1;
        struct engine *e = start(ps, 0, 0);
        sequence(e, &f0, &a0, NULL);
        engine_destroy(e);
        assert_int_equal(a0.cached, 0); /* evicted, and no host tier */

        e = start(ps, 1, 0);
        assert_true(stats(e).hicache_pages_total >= 2 * (POOL / ps) - 2);
        sequence(e, &f1, &a1, NULL);
        struct engine_stats st = stats(e);
        engine_destroy(e);
        int want = (PROMPT - 1) / ps * ps; /* whole pages of the prompt but its last token */
        printf("    page %d: %d of %d prompt tokens back from host memory; %ld pages saved, %ld tokens loaded\n", ps,
               a1.cached, PROMPT, st.hicache_saved_pages_total, st.hicache_loaded_tokens_total);
        assert_int_equal(a1.cached, want);
        assert_true(st.hicache_saved_pages_total >= want / ps);
        assert_int_equal(st.hicache_loaded_tokens_total, want);
        assert_true(st.hicache_pages > 0 && st.hicache_pages <= st.hicache_pages_total);
        assert_memory_equal(f0.ids, a0.ids, sizeof f0.ids);
        assert_memory_equal(f0.ids, f1.ids, sizeof f0.ids);
        assert_memory_equal(f0.ids, a1.ids, sizeof f0.ids);
    }
}

static void test_salt(void **state) {
    (void)state;
    struct answer f, a;
    struct engine *e = start(4, 1, 0);
    sequence(e, &f, &a, "tenant-b");
    struct engine_stats st = stats(e);
    engine_destroy(e);
    assert_int_equal(a.cached, 0);
    assert_int_equal(st.hicache_loaded_tokens_total, 0);
    assert_memory_equal(f.ids, a.ids, sizeof f.ids);
}

/* A host tier of 3 pages of 4 tokens: it keeps the last pages evicted, the
 * start of prompt 0 is gone, so nothing comes back (a match must start at
 * the root); the answers stay right. */
static void test_small_tier(void **state) {
    (void)state;
    struct answer f, a;
    struct engine *ref = start(4, 0, 0), *e;
    struct answer want = ask(ref, 0, NULL);
    engine_destroy(ref);
    /* stories260K: 5 layers x (K + V) x 4 KV heads x 8 dims, fp32, 4 tokens a page */
    double page_gb = 5.0 * 2 * 32 * 4 * 4 / 1073741824.0;
    e = start(4, 1, 3.5 * page_gb);
    assert_int_equal(stats(e).hicache_pages_total, 3);
    sequence(e, &f, &a, NULL);
    struct engine_stats st = stats(e);
    engine_destroy(e);
    assert_int_equal(st.hicache_pages, 3);
    assert_true(st.hicache_saved_pages_total > 3);
    assert_memory_equal(want.ids, f.ids, sizeof f.ids);
    assert_memory_equal(want.ids, a.ids, sizeof f.ids);
}

/* Random traffic: 48 prompts over 4 shared starts of 40 tokens, each with
 * its own tail, 4 at a time, in a pool of 160 tokens with a host tier of
 * twice that: every answer is the one a roomy pool without the tier gives,
 * and starts came back from host memory. */
static void test_random_traffic(void **state) {
    (void)state;
    enum { N = 48, START = 40, MAXP = 90, WAVE = 4 };
    static int32_t prompts[N][MAXP];
    int len[N];
    uint64_t rng = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N; i++) {
        int base = i % 4;
        for (int t = 0; t < START; t++) prompts[i][t] = 3 + (base * 97 + t * 31) % 500;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        len[i] = START + 8 + (int)(rng % 40);
        for (int t = START; t < len[i]; t++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            prompts[i][t] = 3 + (int)(rng % 500);
        }
    }
    int32_t want[N][NEW], got[N][NEW];
    for (int pass = 0; pass < 2; pass++) {
        struct engine_options o;
        engine_options_default(&o);
        o.model_dir = model_dir;
        o.page_size = 4;
        o.max_total_tokens = pass ? 160 : 4096;
        o.enable_hicache = pass;
        o.skip_sampler_warmup = 1;
        o.threads = 2;
        struct engine *e;
        struct kiln_error err;
        if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
        for (int w = 0; w < N; w += WAVE) {
            struct sink *s[WAVE];
            for (int i = 0; i < WAVE; i++) {
                s[i] = sink_new();
                struct engine_request r = sink_request(prompts[w + i], len[w + i], NEW, s[i]);
                sink_submit(e, &r);
            }
            for (int i = 0; i < WAVE; i++) {
                sink_wait(s[i]);
                assert_int_equal(s[i]->n_ids, NEW);
                memcpy(pass ? got[w + i] : want[w + i], s[i]->ids, sizeof want[0]);
                sink_free(s[i]);
            }
        }
        struct engine_stats st = stats(e);
        engine_destroy(e);
        if (pass) {
            printf("    random traffic: %ld pages saved, %ld prompt tokens loaded back\n", st.hicache_saved_pages_total,
                   st.hicache_loaded_tokens_total);
            assert_true(st.hicache_loaded_tokens_total > 0);
        }
    }
    for (int i = 0; i < N; i++)
        if (memcmp(want[i], got[i], sizeof want[i])) fail_msg("request %d: the answer differs from the roomy pool's", i);
}

static void test_refused(void **state) {
    (void)state;
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = model_dir;
    o.enable_hicache = 1;
    o.disable_radix_cache = 1;
    o.skip_sampler_warmup = 1;
    struct engine *e = NULL;
    struct kiln_error err;
    assert_int_not_equal(engine_create(&e, &o, &err), 0);
    assert_non_null(strstr(err.msg, "--disable-radix-cache"));
    /* a model whose layers slide over a window (the oracle's tiny Mistral) */
    char mistral[4096];
    snprintf(mistral, sizeof mistral, "%s/oracle/tiny-models-more/mistral", getenv("KILN_FIXTURES"));
    o.model_dir = mistral;
    o.disable_radix_cache = 0;
    assert_int_not_equal(engine_create(&e, &o, &err), 0);
    assert_non_null(strstr(err.msg, "sliding-window"));
}

int main(void) {
    snprintf(model_dir, sizeof model_dir, "%s/stories260K", getenv("KILN_MODELS"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_salt),
        cmocka_unit_test(test_small_tier),
        cmocka_unit_test(test_random_traffic),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
