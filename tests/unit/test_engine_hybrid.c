/* test_engine_hybrid.c — models with both sliding and full layers (the
 * oracle's tiny Gemma-3 and gpt-oss: two layers slide over 8 positions,
 * one attends to everything) through the engine on the CPU, with the
 * hybrid KV pool (cache/kv_pool.h "Hybrid"): the sliding layers' pages in
 * a pool of their own, given back as a request's window leaves them.
 *
 *  - prompt logprobs of the oracle's sequences (longer than the window),
 *    prefilled in chunks of 3 at page sizes 1 and 16, with the prefix cache
 *    on and off and with as few sliding pages as the engine allows: within
 *    1e-3 of Hugging Face's logits;
 *  - a long generation with that least sliding pool: the sliding pages in
 *    use stay bounded by the window and a chunk while the full layers keep
 *    a page per token; the ids are what one pool for every layer
 *    (--disable-hybrid-swa-memory) generates and what a single-chunk
 *    prefill of prompt + output picks greedily at each position;
 *  - the prefix cache: a conversation's next turn (its prompt the last
 *    turn's prompt and answer, and more) finds the last turn cached, and a
 *    new conversation the start all share (the tree keeps the sliding
 *    pages of what it caches while there are some to spare); with as few
 *    sliding pages as allowed the tree sheds them, and every run gives the
 *    ids of a run without the cache;
 *  - many requests at once in a pool that holds a few: the same ids as
 *    each alone, the pools whole at the end;
 *  - random traffic over shared starts in a small pool with the fewest
 *    sliding pages (speculative drafts on in one run): the ids of one
 *    roomy pool. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/mem.h"
#include "scheduler/engine.h"

#include "../engine_sink.h"
#include "oracle_ref.h"

enum { WINDOW = 8 };

static char dirs[2][4096]; /* gemma3, gpt_oss */

struct opts {
    int page_size, pool_tokens, radix, chunk;
    double ratio; /* 0: the default */
    int one_pool;
};

/* With speculative drafts of `draft` tokens (0: off), max_running requests. */
static struct engine *start_with(const char *dir, const struct opts *x, int draft, int max_running) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = dir;
    o.page_size = x->page_size;
    o.max_total_tokens = x->pool_tokens;
    o.disable_radix_cache = !x->radix;
    o.chunked_prefill_size = x->chunk;
    o.swa_full_tokens_ratio = x->ratio;
    o.disable_hybrid_swa = x->one_pool;
    o.spec_draft_tokens = draft;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    o.max_running_requests = max_running;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    struct engine_stats st;
    engine_stats(e, &st);
    if (x->one_pool) assert_int_equal(st.kv_swa_pages_total, 0);
    else assert_true(st.kv_swa_pages_total > 0);
    return e;
}

static struct engine *start(const char *dir, const struct opts *x) { return start_with(dir, x, 0, 16); }

/* Once idle: every full page free or cached, and every sliding page free
 * or behind a cached page. */
static void assert_pools_whole(struct engine *e) {
    struct engine_stats st;
    for (int tries = 0; tries < 400; tries++) {
        engine_stats(e, &st);
        if (st.running == 0 && st.waiting == 0 && st.kv_pages_free + st.kv_pages_cached == st.kv_pages_total) break;
        usleep(5000);
    }
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    assert_true(st.kv_swa_pages_total - st.kv_swa_pages_free <= st.kv_pages_cached);
    if (st.kv_pages_cached == 0) assert_int_equal(st.kv_swa_pages_free, st.kv_swa_pages_total);
}

static void test_prompt_logprobs_oracle(void **state) {
    (void)state;
    for (int m = 0; m < 2; m++) {
        struct ref ref;
        ref_open(&ref, dirs[m]);
        for (int i = 0; i < ref.n; i++) assert_true(ref.len[i] > 2 * WINDOW);
        /* page size, prefix cache, ratio (0.01: the least the engine allows) */
        const struct opts cases[] = {{1, 0, 0, 3, 0, 0}, {16, 0, 1, 3, 0, 0}, {1, 0, 1, 3, 0.01, 0}, {4, 0, 0, 3, 0.01, 0}};
        for (int k = 0; k < 4; k++) {
            struct engine *e = start(dirs[m], &cases[k]);
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
                if (worst > 1e-3)
                    fail_msg("%s, case %d, sequence %d: prompt logprob off by %g", dirs[m], k, i, worst);
                sink_free(s);
            }
            assert_pools_whole(e);
            engine_destroy(e);
        }
        st_close(&ref.st);
    }
}

/* A sink that also follows the sliding pages in use. */
struct wsink {
    struct sink *s;
    struct engine *e;
    long max_swa_used, max_used;
};

static void wsink_on_event(void *user, const struct engine_event *ev) {
    struct wsink *w = user;
    struct engine_stats st;
    engine_stats(w->e, &st);
    long swa = st.kv_swa_pages_total - st.kv_swa_pages_free, used = st.kv_pages_total - st.kv_pages_free;
    if (swa > w->max_swa_used) w->max_swa_used = swa;
    if (used > w->max_used) w->max_used = used;
    sink_on_event(w->s, ev);
}

static void test_long_generation(void **state) {
    (void)state;
    enum { NEW = 160, CHUNK = 4 };
    for (int m = 0; m < 2; m++) {
        struct ref ref;
        ref_open(&ref, dirs[m]);
        const int32_t *prompt = ref.ids[0];
        int n_prompt = ref.len[0], n = n_prompt + NEW - 1;
        assert_true(n <= SINK_MAX_PROMPT);

        struct opts hyb = {1, 0, 0, CHUNK, 0.01, 0};
        struct engine *e = start(dirs[m], &hyb);
        struct wsink w = {.s = sink_new(), .e = e};
        struct engine_request r = sink_request(prompt, n_prompt, NEW, w.s);
        r.callback = wsink_on_event;
        r.user = &w;
        sink_submit(e, &r);
        sink_wait(w.s);
        assert_int_equal(w.s->n_ids, NEW);
        /* the window, the chunk in flight and the page being written */
        if (w.max_swa_used > WINDOW + CHUNK + 1)
            fail_msg("%s: %ld sliding pages in use with a window of %d", dirs[m], w.max_swa_used, WINDOW);
        assert_true(w.max_used >= n_prompt + NEW - 2); /* the full layers keep every position */
        printf("  %s: %d positions, at most %ld full and %ld sliding pages in use\n", dirs[m], n_prompt + NEW,
               w.max_used, w.max_swa_used);
        assert_pools_whole(e);
        engine_destroy(e);

        struct opts one = {1, 0, 0, CHUNK, 0, 1};
        e = start(dirs[m], &one);
        struct sink *s2 = sink_new();
        struct engine_request r2 = sink_request(prompt, n_prompt, NEW, s2);
        sink_submit(e, &r2);
        sink_wait(s2);
        if (memcmp(s2->ids, w.s->ids, NEW * sizeof(int32_t))) fail_msg("%s: other ids with one pool", dirs[m]);
        engine_destroy(e);
        sink_free(s2);

        /* one chunk over prompt + output: every position's greedy pick */
        int32_t *all = xmalloc((size_t)n * sizeof *all);
        memcpy(all, prompt, (size_t)n_prompt * sizeof *all);
        memcpy(all + n_prompt, w.s->ids, (size_t)(NEW - 1) * sizeof *all);
        struct opts big = {1, 0, 0, 512, 0, 0};
        e = start(dirs[m], &big);
        struct sink *s3 = sink_new();
        struct engine_request r3 = sink_request(all, n, 1, s3);
        r3.prompt_logprobs = 1;
        r3.prompt_logprob_start = n_prompt;
        r3.sampling.top_logprobs = 1;
        sink_submit(e, &r3);
        sink_wait(s3);
        for (int q = n_prompt; q < n; q++) {
            assert_int_equal(s3->lp_seen[q], 1);
            if (s3->lp[q].top_ids[0] != all[q])
                fail_msg("%s: output %d: generated %d, the full prefill picks %d", dirs[m], q - n_prompt, all[q],
                         s3->lp[q].top_ids[0]);
        }
        assert_int_equal(s3->ids[0], w.s->ids[NEW - 1]);
        engine_destroy(e);
        free(all);
        sink_free(s3), sink_free(w.s);
        st_close(&ref.st);
    }
}

/* Turn t of conversation c: a shared start of 20 ids (longer than the
 * window), the conversation's own 4, then each earlier turn's 5 ids and
 * answer (answers[c][0 .. t * NEW)). */
enum { TURNS = 3, CONVS = 4, TNEW = 12 };
static int turn_prompt(int c, int t, const int32_t *answers, int32_t *out) {
    int n = 0;
    for (int k = 0; k < 20; k++) out[n++] = 100 + (k * 13) % 700;
    for (int k = 0; k < 4; k++) out[n++] = 300 + (c * 41 + k * 7) % 500;
    for (int u = 0; u <= t; u++) {
        for (int k = 0; k < 5; k++) out[n++] = 50 + (c * 19 + u * 23 + k * 3) % 600;
        if (u < t)
            for (int k = 0; k < TNEW; k++) out[n++] = answers[u * TNEW + k];
    }
    return n;
}

/* ans[CONVS]: a last request, a new conversation's first turn, which
 * shares only the start with the others; *last: what it found cached. */
static void run_conversations(const char *dir, const struct opts *x, int32_t ans[CONVS + 1][TURNS * TNEW],
                              int *cached, int *last, long *shed) {
    struct engine *e = start(dir, x);
    int32_t p[256];
    *cached = 0;
    for (int t = 0; t < TURNS; t++) {
        struct sink *s[CONVS];
        for (int c = 0; c < CONVS; c++) { /* the conversations' turns at once */
            s[c] = sink_new();
            struct engine_request r = sink_request(p, turn_prompt(c, t, ans[c], p), TNEW, s[c]);
            sink_submit(e, &r);
        }
        for (int c = 0; c < CONVS; c++) {
            sink_wait(s[c]);
            assert_int_equal(s[c]->n_ids, TNEW);
            memcpy(ans[c] + t * TNEW, s[c]->ids, TNEW * sizeof(int32_t));
            if (t > 0) *cached += s[c]->cached_tokens;
            sink_free(s[c]);
        }
    }
    struct sink *s = sink_new();
    struct engine_request r = sink_request(p, turn_prompt(CONVS, 0, ans[CONVS], p), TNEW, s);
    sink_submit(e, &r);
    sink_wait(s);
    assert_int_equal(s->n_ids, TNEW);
    memcpy(ans[CONVS], s->ids, TNEW * sizeof(int32_t));
    *last = s->cached_tokens;
    sink_free(s);
    assert_pools_whole(e);
    struct engine_stats st;
    engine_stats(e, &st);
    *shed = st.kv_swa_pages_shed_total;
    engine_destroy(e);
}

static void test_prefix_cache(void **state) {
    (void)state;
    const int page_sizes[] = {1, 4};
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            static int32_t plain[CONVS + 1][TURNS * TNEW], cache[CONVS + 1][TURNS * TNEW];
            int cached_plain, cached, last;
            long shed;
            int ps = page_sizes[k];
            struct opts off = {ps, 0, 0, 5, 0, 0}, on = {ps, 0, 1, 5, 0, 0}, tight = {ps, 0, 1, 5, 0.01, 0};
            run_conversations(dirs[m], &off, plain, &cached_plain, &last, &shed);
            assert_int_equal(cached_plain + last, 0);
            /* sliding pages to spare: the tree keeps them all */
            run_conversations(dirs[m], &on, cache, &cached, &last, &shed);
            assert_int_equal(shed, 0);
            if (memcmp(plain, cache, sizeof plain))
                fail_msg("%s, page size %d: other ids with the prefix cache", dirs[m], ps);
            printf("  %s, page size %d: %d prompt tokens of later turns cached, %d of the new one's\n", dirs[m], ps,
                   cached, last);
            /* every later turn finds most of the turn before cached, the
             * new conversation the shared start */
            if (cached < (TURNS - 1) * CONVS * 24)
                fail_msg("%s, page size %d: only %d tokens cached", dirs[m], ps, cached);
            assert_int_equal(last, 20 / ps * ps);
            /* as few sliding pages as allowed: the tree sheds them, its
             * prefixes usable only as far as their last window still has
             * them */
            memset(cache, 0, sizeof cache);
            run_conversations(dirs[m], &tight, cache, &cached, &last, &shed);
            if (memcmp(plain, cache, sizeof plain))
                fail_msg("%s, page size %d: other ids with the prefix cache and few sliding pages", dirs[m], ps);
            printf("  %s, page size %d, few sliding pages: %d and %d cached, %ld sliding pages shed\n", dirs[m],
                   ps, cached, last, shed);
            assert_true(shed > 0);
        }
}

/* Many short prompts growing past the window in a pool that holds a few:
 * the same ids as each alone. */
static void test_tight_pool(void **state) {
    (void)state;
    enum { N = 16, NEW = 12 };
    for (int m = 0; m < 2; m++) {
        struct sink *alone[N], *tight[N];
        int32_t p[8];
        struct opts roomy = {1, 0, 0, 8, 0, 0}, small = {1, 60, 1, 8, 0.01, 0};
        struct engine *e = start(dirs[m], &roomy);
        for (int i = 0; i < N; i++) {
            for (int k = 0; k < 4; k++) p[k] = 100 + (i * 31 + k * 17) % 600;
            alone[i] = sink_new();
            struct engine_request r = sink_request(p, 4, NEW, alone[i]);
            sink_submit(e, &r);
            sink_wait(alone[i]);
        }
        engine_destroy(e);
        e = start(dirs[m], &small);
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
                fail_msg("%s, request %d: other ids in the tight pool", dirs[m], i);
        }
        assert_pools_whole(e);
        engine_destroy(e);
        for (int i = 0; i < N; i++) sink_free(alone[i]), sink_free(tight[i]);
    }
}

/* Random traffic: prompts from a few shared starts (shorter and longer
 * than the window) with tails of their own, random lengths, some requests
 * sent while others run and some after them, so that prefixes are cached,
 * matched, cut back, shed and evicted; with as few sliding pages as
 * allowed in a small pool (page sizes 1 and 4, speculative drafts on in one
 * of them), and in one small pool for every layer with drafts (requests
 * retracted with draft pages ahead of them), the ids are those of one
 * roomy pool, and the pools are whole. */
static uint64_t rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

enum { RN = 40 };

static void run_random(const char *dir, const struct opts *x, int draft, uint64_t seed, int32_t ids[RN][48],
                       int n_ids[RN]) {
    struct engine *e = start_with(dir, x, draft, 8);
    static int32_t prompts[RN][96];
    struct sink *s[RN];
    uint64_t st = seed;
    for (int i = 0; i < RN; i++) {
        int start = (int)(rnd(&st) % 3), n = 0;
        static const int start_len[3] = {5, 18, 40};
        for (int k = 0; k < start_len[start]; k++) prompts[i][n++] = 100 + (start * 97 + k * 13) % 800;
        int tail = 1 + (int)(rnd(&st) % 30);
        for (int k = 0; k < tail; k++) prompts[i][n++] = 10 + (int)(rnd(&st) % 1000);
        s[i] = sink_new();
        struct engine_request r = sink_request(prompts[i], n, 4 + (int)(rnd(&st) % 40), s[i]);
        sink_submit(e, &r);
        if (rnd(&st) % 4 == 0) sink_wait(s[i]); /* now and then the ones before finish first */
    }
    for (int i = 0; i < RN; i++) {
        sink_wait(s[i]);
        n_ids[i] = s[i]->n_ids;
        memcpy(ids[i], s[i]->ids, (size_t)s[i]->n_ids * sizeof(int32_t));
        sink_free(s[i]);
    }
    assert_pools_whole(e);
    struct engine_stats es;
    engine_stats(e, &es);
    printf("  %s, page size %d, pool %d, drafts %d: %ld retractions, %ld of %ld draft tokens accepted\n", dir,
           x->page_size, x->pool_tokens, draft, es.retractions_total, es.spec_accepted_tokens_total,
           es.spec_draft_tokens_total);
    engine_destroy(e);
}

static void test_random_traffic(void **state) {
    (void)state;
    static int32_t want[RN][48], got[RN][48];
    int n_want[RN], n_got[RN];
    for (int m = 0; m < 2; m++)
        for (uint64_t seed = 1; seed <= 2; seed++) {
            struct opts roomy = {1, 0, 1, 8, 0, 1};
            run_random(dirs[m], &roomy, 0, seed, want, n_want);
            /* the fewest sliding pages; with drafts; one small pool with drafts */
            const struct opts tight[3] = {{1, 300, 1, 8, 0.01, 0}, {4, 320, 1, 8, 0.01, 0}, {1, 160, 1, 8, 0, 1}};
            const int draft[3] = {0, 3, 4};
            for (int k = 0; k < 3; k++) {
                run_random(dirs[m], &tight[k], draft[k], seed, got, n_got);
                for (int i = 0; i < RN; i++)
                    if (n_got[i] != n_want[i] || memcmp(got[i], want[i], (size_t)n_want[i] * sizeof(int32_t)))
                        fail_msg("%s, seed %llu, page size %d: request %d: other ids", dirs[m],
                                 (unsigned long long)seed, tight[k].page_size, i);
            }
        }
}

int main(void) {
    const char *fx = getenv("KILN_FIXTURES");
    snprintf(dirs[0], sizeof dirs[0], "%s/oracle/tiny-models-more/gemma3", fx);
    snprintf(dirs[1], sizeof dirs[1], "%s/oracle/tiny-models-more/gpt_oss", fx);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_logprobs_oracle),
        cmocka_unit_test(test_long_generation),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_tight_pool),
        cmocka_unit_test(test_random_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
