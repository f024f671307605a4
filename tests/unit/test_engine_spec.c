/* test_engine_spec.c — speculative decoding (NGRAM, scheduler/spec.c)
 * through the engine on the CPU, with the bundled stories260K model: the
 * truth is the same engine without drafts, since a greedy pick depends on
 * the position's logits alone and the CPU's do not depend on the batch.
 *
 *  - many requests at once, lengths that end inside drafts, end tokens
 *    honoured, page sizes 1 and 16, the prefix cache on: the same ids,
 *    finish reasons and output logprobs, and drafts proposed and accepted
 *    (this model's stories repeat themselves); greedy and sampled (kiln
 *    keys a request's draws by its seed and output step), with
 *    repetition, frequency and presence penalties, a logit bias,
 *    min_tokens, logprobs with top alternatives;
 *  - a stop string met inside a draft: the same text and finish;
 *  - the spec_draft_tokens_total / spec_accepted_tokens_total counters,
 *    and a bad configuration refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "scheduler/engine.h"

#include "../engine_sink.h"

static char model_dir[4096];

static struct engine *start(int page_size, int draft) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = model_dir;
    o.page_size = page_size;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    o.max_running_requests = 32;
    o.spec_draft_tokens = draft;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

enum { N = 24 };

/* Each request's output logprobs (chosen and best alternative) beside
 * what its sink keeps. */
enum { MAX_OUT = 128 };
struct rec {
    struct sink *s;
    float lp[MAX_OUT][2];
};
static void record(void *user, const struct engine_event *ev) {
    struct rec *c = user;
    for (int k = 0; k < ev->n_tokens && ev->samples && c->s->n_ids + k < MAX_OUT; k++) {
        c->lp[c->s->n_ids + k][0] = ev->samples[k].logprob;
        c->lp[c->s->n_ids + k][1] = ev->samples[k].n_top ? ev->samples[k].top_logprobs[0] : 0;
    }
    sink_on_event(c->s, ev);
}

/* Request i: a story start, greedy (every third sampled), its own length. */
static void request_of(int i, int32_t *prompt, struct engine_request *r, struct sink *s, const char *const *stop) {
    int n = 0;
    prompt[n++] = 1;
    for (int k = 0; k < 4 + i % 5; k++) prompt[n++] = 260 + (i * 37 + k * 11) % 240;
    memset(r, 0, sizeof *r);
    r->prompt = prompt;
    r->n_prompt = n;
    sampling_params_default(&r->sampling);
    r->sampling.temperature = i % 3 == 2 ? 0.8f : 0;
    r->sampling.has_seed = 1;
    r->sampling.seed = 1000 + (uint64_t)i;
    r->max_new_tokens = 7 + (i * 13) % 90;
    r->ignore_eos = i % 4 == 0;
    if (i % 5 == 1) r->sampling.repetition_penalty = 1.3f;
    if (i % 5 == 3) r->sampling.frequency_penalty = 0.5f, r->sampling.presence_penalty = 0.4f;
    if (i % 7 == 4) {
        static const struct logit_bias_entry bias[2] = {{.id = 300, .bias = 4}, {.id = 2, .bias = -100}};
        r->sampling.n_logit_bias = 2;
        r->sampling.logit_bias = bias;
    }
    if (i % 6 == 5) r->min_new_tokens = 6;
    if (i % 4 == 1) r->sampling.logprobs = 1, r->sampling.top_logprobs = 3;
    if (stop[0]) {
        r->n_stop = 1;
        r->stop = stop;
    }
    r->callback = sink_on_event;
    r->user = s;
}

static void run(int page_size, int draft, struct sink *out[N], struct rec recs[N], const char *stop, long *drafts,
                long *accepted) {
    struct engine *e = start(page_size, draft);
    int32_t prompts[N][16];
    const char *stops[1] = {stop};
    for (int i = 0; i < N; i++) {
        out[i] = sink_new();
        struct engine_request r;
        request_of(i, prompts[i], &r, out[i], stops);
        memset(&recs[i], 0, sizeof recs[i]);
        recs[i].s = out[i];
        r.callback = record;
        r.user = &recs[i];
        struct kiln_error err;
        if (!engine_submit(e, &r, &err)) fail_msg("engine_submit: %s", err.msg);
    }
    for (int i = 0; i < N; i++) sink_wait(out[i]);
    struct engine_stats st;
    engine_stats(e, &st);
    *drafts = st.spec_draft_tokens_total;
    *accepted = st.spec_accepted_tokens_total;
    assert_true(*accepted <= *drafts);
    engine_destroy(e);
}

static void expect_same(struct sink *a[N], struct sink *b[N], const struct rec ra[N], const struct rec rb[N],
                        const char *what) {
    for (int i = 0; i < N; i++) {
        if (a[i]->n_ids != b[i]->n_ids || memcmp(a[i]->ids, b[i]->ids, (size_t)a[i]->n_ids * sizeof(int32_t)))
            fail_msg("%s: request %d: other ids with drafts (%d against %d)", what, i, b[i]->n_ids, a[i]->n_ids);
        assert_int_equal(a[i]->finish, b[i]->finish);
        assert_string_equal(a[i]->text.data ? a[i]->text.data : "", b[i]->text.data ? b[i]->text.data : "");
        if (memcmp(ra[i].lp, rb[i].lp, sizeof ra[i].lp)) fail_msg("%s: request %d: other logprobs with drafts", what, i);
    }
}

static void test_same_outputs(void **state) {
    (void)state;
    const int page_sizes[] = {1, 16};
    for (int k = 0; k < 2; k++) {
        struct sink *plain[N], *spec[N];
        static struct rec rp[N], rs[N];
        long d0, a0, d, a;
        run(page_sizes[k], 0, plain, rp, NULL, &d0, &a0);
        run(page_sizes[k], 4, spec, rs, NULL, &d, &a);
        assert_int_equal(d0, 0);
        expect_same(plain, spec, rp, rs, page_sizes[k] == 1 ? "page size 1" : "page size 16");
        int with_lp = 0;
        for (int i = 0; i < N; i++) with_lp += rp[i].lp[0][0] != 0;
        assert_true(with_lp > 0);
        printf("  page size %d: %ld draft tokens, %ld accepted\n", page_sizes[k], d, a);
        assert_true(d > 0 && a > 0);
        for (int i = 0; i < N; i++) sink_free(plain[i]), sink_free(spec[i]);
    }
}

/* A stop string taken from the middle of a plain run's text. */
static void test_stop_string(void **state) {
    (void)state;
    struct sink *plain[N], *spec[N];
    static struct rec rp[N], rs[N];
    long d, a;
    run(1, 0, plain, rp, NULL, &d, &a);
    const char *t = NULL;
    for (int i = 0; i < N && !t; i++)
        if (plain[i]->text.len > 40) t = plain[i]->text.data + 30;
    assert_non_null(t);
    char stop[6];
    memcpy(stop, t, 5);
    stop[5] = 0;
    for (int i = 0; i < N; i++) sink_free(plain[i]);
    run(1, 0, plain, rp, stop, &d, &a);
    run(1, 3, spec, rs, stop, &d, &a);
    expect_same(plain, spec, rp, rs, "stop string");
    int stopped = 0;
    for (int i = 0; i < N; i++) stopped += plain[i]->finish == ENGINE_FINISH_STOP;
    assert_true(stopped > 0);
    for (int i = 0; i < N; i++) sink_free(plain[i]), sink_free(spec[i]);
}

static void test_refused(void **state) {
    (void)state;
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = model_dir;
    o.skip_sampler_warmup = 1;
    o.spec_draft_tokens = ENGINE_SPEC_MAX_DRAFT + 1;
    struct engine *e;
    struct kiln_error err = {0};
    assert_int_equal(engine_create(&e, &o, &err), -1);
    assert_non_null(strstr(err.msg, "draft tokens"));
    o.spec_draft_tokens = 2;
    o.spec_min_window = 5;
    o.spec_max_window = 3;
    assert_int_equal(engine_create(&e, &o, &err), -1);
    assert_non_null(strstr(err.msg, "match windows 5 to 3"));
    o.spec_min_window = o.spec_max_window = 0;
    o.swa_full_tokens_ratio = 1.5; /* the hybrid pool's ratio, checked beside */
    assert_int_equal(engine_create(&e, &o, &err), -1);
    assert_non_null(strstr(err.msg, "swa_full_tokens_ratio 1.5"));
}

int main(void) {
    snprintf(model_dir, sizeof model_dir, "%s/stories260K", getenv("KILN_MODELS"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_outputs),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
