/* gen.h — engine requests on behalf of one HTTP request, and the way their
 * events travel from the engine thread to the event loop thread.
 *
 * A `struct gen` groups the engine requests one HTTP request needs (n
 * choices, several prompts, score items). The engine calls back on its own
 * thread; the callback only copies the event into the hub's mailbox (one
 * mutex, one list) and activates a libevent event, so the engine never waits
 * on the loop or a socket. The loop thread drains the mailbox and hands each
 * event to the route through `gen_ops`, in order per request.
 *
 * Lifetime: a gen lives until every submitted request has had its final
 * event, even when the client is gone — only then can the engine no longer
 * call back into it. When the client disconnects, every live request is
 * aborted at once (engine_abort) so its KV pages are freed at the next step;
 * `req` becomes NULL and the route callbacks are no longer called.
 *
 *     g = gen_create(hub, req, n, &ops, state);
 *     for i: if (!gen_submit(g, i, &r, &err)) { answer the error; gen_fail(g); return; }
 *     ... ops.on_event(g, i, ev) for each event, ops.on_done(g) at the end,
 *     ops.on_free(g) when the gen is freed.
 */
#ifndef KILN_SERVER_GEN_H
#define KILN_SERVER_GEN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "scheduler/engine.h"

struct event;
struct event_base;
struct http_request;
struct kiln_error;
struct metrics;
struct gen;
struct gen_msg;

/* An engine event copied for the loop thread. */
struct gen_event {
    int n_tokens;
    int32_t *tokens;
    struct sample_result *samples; /* NULL unless the request wants logprobs */
    char *text;
    size_t text_len;
    enum engine_finish finish;
    char *error;
    enum kiln_error_code error_code;
    char *matched_stop;
    int32_t matched_stop_id;
    int prompt_tokens, completion_tokens, cached_tokens;
    int n_prompt_logprobs, prompt_logprob_pos;
    struct sample_result *prompt_logprobs;
    int n_scores;
    float *scores;
    struct engine_timing timing;
};

struct gen_ops {
    /* every event of request i, final ones included (client still there) */
    void (*on_event)(struct gen *g, int i, const struct gen_event *ev);
    /* all requests are final and the client is still there: answer */
    void (*on_done)(struct gen *g);
    /* frees the route's state */
    void (*on_free)(struct gen *g);
};

struct gen_slot {
    struct gen *gen;
    int index;
    uint64_t id;      /* 0 until submitted */
    int final;
    int want_samples;
    double t_last;    /* time of the previous token event */
    int n_token_events;
};

struct gen {
    struct gen_hub *hub;
    struct http_request *req; /* NULL once the client is gone or was answered early */
    const struct gen_ops *ops;
    void *state;
    int n;
    struct gen_slot *slots;
    int n_live;   /* submitted and not yet final */
    int failed;   /* answered early (submit error); the rest is aborted */
    double t_start;
    struct gen *prev, *next; /* the hub's list of gens */
};

struct gen_hub {
    struct engine *engine;
    struct metrics *metrics;
    struct event *ev;
    pthread_mutex_t mu;
    struct gen_msg *head, *tail; /* guarded by mu */
    struct gen *gens;            /* loop thread only */
    int n_gens;
    void (*on_idle)(void *arg);  /* called when the last gen is freed */
    void *idle_arg;
};

/* Everything one engine request produced, gathered from its events (for
 * answers that are sent once complete). */
struct gen_output {
    struct buf text;
    int32_t *tokens;
    struct sample_result *samples; /* parallel to tokens when logprobs were asked for */
    int n_tokens, cap_tokens, n_samples;
    enum engine_finish finish;
    char *matched_stop;
    int32_t matched_stop_id;
    char *error;
    enum kiln_error_code error_code;
    int prompt_tokens, completion_tokens, cached_tokens;
    /* prompt logprobs of positions [prompt_lp_pos, + n_prompt_lp) */
    struct sample_result *prompt_lp;
    int n_prompt_lp, cap_prompt_lp, prompt_lp_pos;
    float *scores;
    int n_scores;
};
void gen_output_init(struct gen_output *o);
void gen_output_add(struct gen_output *o, const struct gen_event *ev);
void gen_output_free(struct gen_output *o);

int gen_hub_init(struct gen_hub *h, struct event_base *base, struct engine *e, struct metrics *m,
                 struct kiln_error *err);
/* Call after the engine is destroyed (no callback can come any more). */
void gen_hub_free(struct gen_hub *h);
/* Aborts every live engine request (shutdown). */
void gen_hub_abort_all(struct gen_hub *h);

struct gen *gen_create(struct gen_hub *h, struct http_request *req, int n, const struct gen_ops *ops,
                       void *state);
/* Submits request i (its callback and user are set here). Returns the
 * engine id, or 0 with the engine's message in err. */
uint64_t gen_submit(struct gen *g, int i, struct engine_request *r, int want_samples, struct kiln_error *err);
/* After answering the client early: aborts what was submitted; the gen frees
 * itself once those requests are final. */
void gen_fail(struct gen *g);

#endif
