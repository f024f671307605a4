/* engine_sink.h — the engine tests' way of collecting one request's events:
 * a sink is the request's callback user (r.callback = sink_on_event,
 * r.user = sink_new()); it gathers the output ids and text, the finish,
 * usage counts, scores and prompt logprobs the engine thread delivers, and
 * sink_wait blocks the test until the final event. Included by one test
 * file each (static definitions), after <cmocka.h>. */
#ifndef KILN_TESTS_ENGINE_SINK_H
#define KILN_TESTS_ENGINE_SINK_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/mem.h"
#include "scheduler/engine.h"

#define SINK_MAX_SCORES 16
#define SINK_MAX_PROMPT 256 /* prompt positions whose logprobs are kept */

struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int32_t *ids; /* [n_ids] output token ids */
    int n_ids, cap_ids;
    struct buf text; /* the output text; "" before any arrives */
    enum engine_finish finish;
    int n_final; /* final events seen (exactly one is right) */
    int prompt_tokens, completion_tokens, cached_tokens;
    float scores[SINK_MAX_SCORES];
    int n_scores;
    const char *matched_stop;
    /* prompt logprobs by position; lp_seen counts deliveries per position */
    struct sample_result lp[SINK_MAX_PROMPT];
    int lp_seen[SINK_MAX_PROMPT];
    int lp_events_after_token; /* prompt logprobs that came after an output token */
};

/* The engine's callback (on the engine thread). */
static void sink_on_event(void *user, const struct engine_event *ev) {
    struct sink *s = user;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ev->n_prompt_logprobs; i++) {
        int pos = ev->prompt_logprob_pos + i;
        if (pos >= 0 && pos < SINK_MAX_PROMPT) s->lp[pos] = ev->prompt_logprobs[i], s->lp_seen[pos]++;
    }
    if (ev->n_prompt_logprobs && s->n_ids) s->lp_events_after_token++;
    if (s->n_ids + ev->n_tokens > s->cap_ids) {
        s->cap_ids = (s->n_ids + ev->n_tokens) * 2;
        s->ids = xrealloc(s->ids, (size_t)s->cap_ids * sizeof *s->ids);
    }
    if (ev->n_tokens) memcpy(s->ids + s->n_ids, ev->tokens, (size_t)ev->n_tokens * sizeof *ev->tokens);
    s->n_ids += ev->n_tokens;
    buf_append(&s->text, ev->text, ev->text_len);
    s->prompt_tokens = ev->prompt_tokens;
    s->completion_tokens = ev->completion_tokens;
    s->cached_tokens = ev->cached_tokens;
    if (ev->finish != ENGINE_FINISH_NONE) {
        s->finish = ev->finish;
        s->n_final++;
        s->done = 1;
        s->matched_stop = ev->matched_stop;
        s->n_scores = ev->n_scores < SINK_MAX_SCORES ? ev->n_scores : SINK_MAX_SCORES;
        for (int i = 0; i < s->n_scores; i++) s->scores[i] = ev->scores[i];
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static struct sink *sink_new(void) {
    struct sink *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    buf_reserve(&s->text, 0);
    return s;
}

static void sink_wait(struct sink *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* A greedy request for max_new tokens (end tokens ignored) of prompt
 * p[0 .. n), its events to s. */
static inline struct engine_request sink_request(const int32_t *p, int n, int max_new, struct sink *s) {
    struct engine_request r = {0};
    r.prompt = p;
    r.n_prompt = n;
    sampling_params_default(&r.sampling);
    r.sampling.temperature = 0;
    r.max_new_tokens = max_new;
    r.ignore_eos = 1;
    r.callback = sink_on_event;
    r.user = s;
    return r;
}

/* engine_submit, failing the test when it refuses. */
static inline void sink_submit(struct engine *e, const struct engine_request *r) {
    struct kiln_error err;
    if (!engine_submit(e, r, &err)) fail_msg("engine_submit: %s", err.msg);
}

static void sink_free(struct sink *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->ids);
    buf_free(&s->text);
    free(s);
}

#endif
