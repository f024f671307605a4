/* gen.c — engine events to the loop thread (see gen.h). */
#include "server/gen.h"
#include "server/trace.h"

#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"
#include "sample/sampling.h"
#include "server/http.h"
#include "server/metrics.h"

struct gen_msg {
    struct gen_slot *slot;
    struct gen_event ev;
    struct gen_msg *next;
};

static void msg_free(struct gen_msg *m) {
    free(m->ev.tokens);
    free(m->ev.samples);
    free(m->ev.text);
    free(m->ev.error);
    free(m->ev.matched_stop);
    free(m->ev.scores);
    free(m->ev.prompt_logprobs);
    free(m);
}

static void *dup_bytes(const void *p, size_t n) {
    if (!p || !n) return NULL;
    void *q = xmalloc(n);
    memcpy(q, p, n);
    return q;
}

/* ON THE ENGINE THREAD: copy and post, nothing else. */
static void engine_cb(void *user, const struct engine_event *ev) {
    struct gen_slot *slot = user;
    struct gen_hub *h = slot->gen->hub;
    struct gen_msg *m = xcalloc(1, sizeof *m);
    m->slot = slot;
    struct gen_event *e = &m->ev;
    e->n_tokens = ev->n_tokens;
    e->tokens = dup_bytes(ev->tokens, (size_t)ev->n_tokens * sizeof *ev->tokens);
    if (slot->want_samples && ev->samples)
        e->samples = dup_bytes(ev->samples, (size_t)ev->n_tokens * sizeof *ev->samples);
    e->text = xstrndup(ev->text ? ev->text : "", ev->text ? ev->text_len : 0);
    e->text_len = ev->text ? ev->text_len : 0;
    e->finish = ev->finish;
    e->error = ev->error ? xstrdup(ev->error) : NULL;
    e->error_code = ev->error_code;
    e->n_prompt_logprobs = ev->n_prompt_logprobs;
    e->prompt_logprob_pos = ev->prompt_logprob_pos;
    e->prompt_logprobs = dup_bytes(ev->prompt_logprobs, (size_t)ev->n_prompt_logprobs * sizeof *ev->prompt_logprobs);
    e->matched_stop = ev->matched_stop ? xstrdup(ev->matched_stop) : NULL;
    e->matched_stop_id = ev->matched_stop_id;
    e->prompt_tokens = ev->prompt_tokens;
    e->timing = ev->timing;
    e->completion_tokens = ev->completion_tokens;
    e->cached_tokens = ev->cached_tokens;
    e->n_scores = ev->n_scores;
    e->scores = dup_bytes(ev->scores, (size_t)ev->n_scores * sizeof *ev->scores);
    pthread_mutex_lock(&h->mu);
    int was_empty = h->head == NULL;
    if (h->tail) h->tail->next = m;
    else h->head = m;
    h->tail = m;
    pthread_mutex_unlock(&h->mu);
    /* the hub outlives the engine, so h->ev is valid here; one wake-up per batch of messages */
    if (was_empty) event_active(h->ev, EV_READ, 0);
}

static void gen_free(struct gen *g) {
    struct gen_hub *h = g->hub;
    if (g->ops->on_free) g->ops->on_free(g);
    if (g->prev) g->prev->next = g->next;
    else h->gens = g->next;
    if (g->next) g->next->prev = g->prev;
    h->n_gens--;
    free(g->slots);
    free(g);
    if (!h->gens && h->on_idle) h->on_idle(h->idle_arg);
}

static void abort_live(struct gen *g) {
    for (int i = 0; i < g->n; i++)
        if (g->slots[i].id && !g->slots[i].final) engine_abort(g->hub->engine, g->slots[i].id);
}

static void on_client_gone(void *arg) {
    struct gen *g = arg;
    g->req = NULL;
    if (g->n_live && g->hub->metrics) g->hub->metrics->aborted_by_client++;
    abort_live(g);
    if (g->n_live == 0) gen_free(g);
}

static void deliver(struct gen_hub *h, struct gen_msg *m) {
    struct gen_slot *s = m->slot;
    struct gen *g = s->gen;
    double now = time_now();
    if (m->ev.n_tokens > 0 && h->metrics) {
        if (s->n_token_events == 0) metrics_observe_ttft(h->metrics, now - g->t_start);
        else metrics_observe_itl(h->metrics, (now - s->t_last) / m->ev.n_tokens);
        s->n_token_events++;
        s->t_last = now;
    }
    int final = m->ev.finish != ENGINE_FINISH_NONE;
    if (final && h->metrics) metrics_observe_e2e(h->metrics, now - g->t_start);
    if (final && g->req && !g->failed) trace_req_engine(g->req->trace, s->index, &m->ev, now);
    /* a cut stream (its client stopped reading) is closed at the next turn
     * of the loop: building its chunks meanwhile would be wasted work */
    if (g->req && !g->failed && !http_request_cut(g->req)) g->ops->on_event(g, s->index, &m->ev);
    if (final) {
        s->final = 1;
        g->n_live--;
        if (g->n_live == 0) {
            /* on_done answers, which also drops our close callback */
            if (g->req && !g->failed) g->ops->on_done(g);
            g->req = NULL;
            gen_free(g);
        }
    }
}

static void on_mail(evutil_socket_t fd, short what, void *arg) {
    struct gen_hub *h = arg;
    (void)fd, (void)what;
    pthread_mutex_lock(&h->mu);
    struct gen_msg *m = h->head;
    h->head = h->tail = NULL;
    pthread_mutex_unlock(&h->mu);
    while (m) {
        struct gen_msg *next = m->next;
        deliver(h, m);
        msg_free(m);
        m = next;
    }
}

int gen_hub_init(struct gen_hub *h, struct event_base *base, struct engine *e, struct metrics *m,
                 struct kiln_error *err) {
    memset(h, 0, sizeof *h);
    h->engine = e;
    h->metrics = m;
    pthread_mutex_init(&h->mu, NULL);
    h->ev = event_new(base, -1, 0, on_mail, h);
    if (!h->ev) return kiln_errorf(err, "cannot create the engine event");
    return 0;
}

void gen_hub_free(struct gen_hub *h) {
    /* messages still queued belong to gens that are freed with them */
    struct gen_msg *m = h->head;
    while (m) {
        struct gen_msg *next = m->next;
        msg_free(m);
        m = next;
    }
    h->head = h->tail = NULL;
    h->on_idle = NULL;
    while (h->gens) {
        h->gens->req = NULL;
        gen_free(h->gens);
    }
    if (h->ev) event_free(h->ev);
    h->ev = NULL;
    pthread_mutex_destroy(&h->mu);
}

void gen_hub_abort_all(struct gen_hub *h) {
    for (struct gen *g = h->gens; g; g = g->next) abort_live(g);
}

struct gen *gen_create(struct gen_hub *h, struct http_request *req, int n, const struct gen_ops *ops,
                       void *state) {
    struct gen *g = xcalloc(1, sizeof *g);
    g->hub = h;
    g->req = req;
    g->ops = ops;
    g->state = state;
    g->n = n;
    g->slots = xcalloc((size_t)(n > 0 ? n : 1), sizeof *g->slots);
    for (int i = 0; i < n; i++) {
        g->slots[i].gen = g;
        g->slots[i].index = i;
    }
    g->t_start = req ? req->t_start : time_now();
    g->next = h->gens;
    if (h->gens) h->gens->prev = g;
    h->gens = g;
    h->n_gens++;
    if (req) http_request_on_close(req, on_client_gone, g);
    return g;
}

uint64_t gen_submit(struct gen *g, int i, struct engine_request *r, int want_samples, struct kiln_error *err) {
    KILN_ASSERT(i >= 0 && i < g->n && !g->slots[i].id);
    r->callback = engine_cb;
    r->user = &g->slots[i];
    g->slots[i].want_samples = want_samples;
    /* counted before submitting: the final event may be drained before we return */
    g->n_live++;
    uint64_t id = engine_submit(g->hub->engine, r, err);
    if (!id) {
        g->n_live--;
        return 0;
    }
    g->slots[i].id = id;
    return id;
}

void gen_fail(struct gen *g) {
    /* the caller answered, and answering dropped our close callback */
    g->failed = 1;
    g->req = NULL;
    abort_live(g);
    if (g->n_live == 0) gen_free(g);
}

/* ---- gathering outputs ---------------------------------------------------- */

void gen_output_init(struct gen_output *o) {
    memset(o, 0, sizeof *o);
    o->matched_stop_id = -1;
}

void gen_output_add(struct gen_output *o, const struct gen_event *ev) {
    if (ev->text_len) buf_append(&o->text, ev->text, ev->text_len);
    if (ev->n_tokens) {
        if (o->n_tokens + ev->n_tokens > o->cap_tokens) {
            o->cap_tokens = (o->n_tokens + ev->n_tokens) * 2;
            o->tokens = xrealloc(o->tokens, (size_t)o->cap_tokens * sizeof *o->tokens);
            if (ev->samples || o->samples)
                o->samples = xrealloc(o->samples, (size_t)o->cap_tokens * sizeof *o->samples);
        }
        memcpy(o->tokens + o->n_tokens, ev->tokens, (size_t)ev->n_tokens * sizeof *ev->tokens);
        if (ev->samples && o->samples && o->n_samples == o->n_tokens) {
            memcpy(o->samples + o->n_samples, ev->samples, (size_t)ev->n_tokens * sizeof *ev->samples);
            o->n_samples += ev->n_tokens;
        }
        o->n_tokens += ev->n_tokens;
    }
    if (ev->n_prompt_logprobs && ev->prompt_logprobs) {
        if (!o->n_prompt_lp) o->prompt_lp_pos = ev->prompt_logprob_pos;
        if (o->n_prompt_lp + ev->n_prompt_logprobs > o->cap_prompt_lp) {
            o->cap_prompt_lp = (o->n_prompt_lp + ev->n_prompt_logprobs) * 2;
            o->prompt_lp = xrealloc(o->prompt_lp, (size_t)o->cap_prompt_lp * sizeof *o->prompt_lp);
        }
        memcpy(o->prompt_lp + o->n_prompt_lp, ev->prompt_logprobs,
               (size_t)ev->n_prompt_logprobs * sizeof *ev->prompt_logprobs);
        o->n_prompt_lp += ev->n_prompt_logprobs;
    }
    o->prompt_tokens = ev->prompt_tokens;
    o->completion_tokens = ev->completion_tokens;
    o->cached_tokens = ev->cached_tokens;
    if (ev->finish != ENGINE_FINISH_NONE) {
        o->finish = ev->finish;
        o->matched_stop = ev->matched_stop ? xstrdup(ev->matched_stop) : NULL;
        o->matched_stop_id = ev->matched_stop_id;
        o->error = ev->error ? xstrdup(ev->error) : NULL;
        o->error_code = ev->error_code;
        if (ev->n_scores) {
            o->scores = dup_bytes(ev->scores, (size_t)ev->n_scores * sizeof *ev->scores);
            o->n_scores = ev->n_scores;
        }
    }
}

void gen_output_free(struct gen_output *o) {
    buf_free(&o->text);
    free(o->tokens);
    free(o->samples);
    free(o->matched_stop);
    free(o->error);
    free(o->scores);
    free(o->prompt_lp);
    gen_output_init(o);
}
