/* bench_offline.c — the in-process runner: the same workload submitted to
 * an engine in this process, no HTTP, for the engine's own ceiling.
 *
 * Events arrive on the engine thread; the callback stamps them at once
 * (an event with k new tokens is one "chunk", its gap split into k ITLs,
 * as for /generate) and signals the dispatching thread, which starts
 * requests at their arrival times under the concurrency cap and aborts
 * those past --timeout (they end with their abort event, as failures).
 * Score requests are one engine request per item (query + item); the
 * request ends when its last item does. --moe-counts reads the engine's
 * touched-expert counts after the run (bench_offline_moe_report).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/mem.h"
#include "cli/bench.h"
#include "model/model.h"
#include "scheduler/engine.h"

struct offline_loop;

/* One engine request (one prompt, or one item of a score prompt). */
struct offline_sub {
    struct offline_loop *L;
    int index;
    uint64_t id;
};

struct offline_loop {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct bench_run *run;
    struct offline_sub *subs; /* [n][max(1, n_items)] */
    int *parts_left;          /* [n] engine requests still running */
    int *timed_out;           /* [n] */
    double *deadline;         /* [n] */
    double *last_chunk;       /* [n] */
    int stride, active, done;
    double last_done;
};

static void on_event(void *user, const struct engine_event *ev) {
    struct offline_sub *s = user;
    struct offline_loop *L = s->L;
    double now = time_now();
    pthread_mutex_lock(&L->mu);
    struct bench_result *r = &L->run->results[s->index];
    if (ev->n_tokens > 0) {
        if (L->last_chunk[s->index] == 0) {
            r->ttft = now - r->start;
        } else {
            double gap = now - L->last_chunk[s->index];
            for (int k = 0; k < ev->n_tokens; k++) bench_result_add_itl(r, gap / ev->n_tokens);
        }
        L->last_chunk[s->index] = now;
    }
    if (ev->text_len) buf_append(&r->text, ev->text, ev->text_len);
    if (ev->finish != ENGINE_FINISH_NONE) {
        r->latency = now - r->start;
        r->usage_output_len = (r->usage_output_len > 0 ? r->usage_output_len : 0) + ev->completion_tokens;
        r->usage_prompt_len = (r->usage_prompt_len > 0 ? r->usage_prompt_len : 0) + ev->prompt_tokens;
        if (ev->finish == ENGINE_FINISH_ERROR) {
            bench_result_fail(r, "engine error: %s", ev->error ? ev->error : "?");
        } else if (ev->finish == ENGINE_FINISH_ABORT) {
            if (L->timed_out[s->index]) bench_result_fail(r, "timed out after %g s (--timeout)", L->run->opt->timeout_s);
            else bench_result_fail(r, "aborted by the engine");
        } else if (L->run->prompts[s->index].n_items && ev->n_scores <= 0) {
            bench_result_fail(r, "score request ended without scores");
        }
        if (--L->parts_left[s->index] == 0) {
            if (!r->error) r->success = 1;
            if (!L->last_chunk[s->index]) r->ttft = r->latency; /* nothing streamed: score, or no tokens */
            L->active--;
            L->done++;
            L->last_done = now;
            pthread_cond_signal(&L->cv);
        }
    }
    pthread_mutex_unlock(&L->mu);
}

/* Called with L->mu held; engine_submit only enqueues, and the engine
 * thread's callbacks wait for the lock, so holding it here is safe. */
static void start(struct offline_loop *L, struct engine *e, int i, double now) {
    struct bench_run *run = L->run;
    const struct bench_options *o = run->opt;
    const struct bench_prompt *p = &run->prompts[i];
    struct bench_result *r = &run->results[i];
    r->start = now;
    r->prompt_len = p->prompt_len;
    r->usage_output_len = r->usage_prompt_len = -1;
    L->deadline[i] = now + o->timeout_s;
    int parts = p->n_items ? p->n_items : 1;
    L->parts_left[i] = parts;
    L->active++;
    for (int k = 0; k < parts; k++) {
        struct offline_sub *s = &L->subs[(size_t)i * (size_t)L->stride + (size_t)k];
        s->L = L;
        s->index = i;
        struct engine_request q = {0};
        sampling_params_default(&q.sampling);
        q.sampling.temperature = 0;
        q.prompt = p->n_items ? p->item_ids[k] : p->ids;
        q.n_prompt = p->n_items ? p->item_lens[k] : p->n_ids;
        q.max_new_tokens = p->n_items ? 0 : run->output_lens[i];
        q.ignore_eos = !o->disable_ignore_eos;
        q.skip_special_tokens = 1;
        if (p->n_items) {
            q.score = 1;
            q.n_label_ids = o->n_score_label_ids;
            q.label_ids = o->score_label_ids;
            q.apply_softmax = 1;
        }
        q.callback = on_event;
        q.user = s;
        struct kiln_error err = {0};
        s->id = engine_submit(e, &q, &err);
        if (!s->id) {
            /* No event will come for this part: settle it here. */
            bench_result_fail(r, "engine_submit: %s", err.msg);
            if (--L->parts_left[i] == 0) {
                L->active--;
                L->done++;
                L->last_done = now;
            }
        }
    }
}

static void abort_request(struct offline_loop *L, struct engine *e, int i) {
    L->timed_out[i] = 1;
    for (int k = 0; k < L->stride; k++) {
        uint64_t id = L->subs[(size_t)i * (size_t)L->stride + (size_t)k].id;
        if (id) engine_abort(e, id);
    }
}

int bench_offline_run(struct bench_run *run, struct engine *e, struct kiln_error *err) {
    struct offline_loop L = {0};
    int n = run->n, next = 0;
    L.run = run;
    L.stride = 1;
    for (int i = 0; i < n; i++)
        if (run->prompts[i].n_items > L.stride) L.stride = run->prompts[i].n_items;
    L.subs = xcalloc((size_t)n * (size_t)L.stride, sizeof *L.subs);
    L.parts_left = xcalloc((size_t)n, sizeof *L.parts_left);
    L.timed_out = xcalloc((size_t)n, sizeof *L.timed_out);
    L.deadline = xcalloc((size_t)n, sizeof *L.deadline);
    L.last_chunk = xcalloc((size_t)n, sizeof *L.last_chunk);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the clock of time_now() */
    pthread_cond_init(&L.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&L.mu, NULL);
    int cap = run->max_concurrency > 0 ? run->max_concurrency : n;
    struct bench_progress prog;
    bench_progress_init(&prog, n, run->show_progress);
    pthread_mutex_lock(&L.mu);
    double t0 = time_now();
    L.last_done = t0;
    while (L.done < n) {
        double now = time_now();
        while (next < n && t0 + run->arrivals[next] <= now && L.active < cap) start(&L, e, next++, now);
        double wake = now + (prog.enabled ? 0.1 : 1.0);
        if (next < n && L.active < cap && t0 + run->arrivals[next] < wake) wake = t0 + run->arrivals[next];
        for (int i = 0; i < next; i++) {
            if (L.parts_left[i] <= 0 || L.timed_out[i]) continue;
            if (now >= L.deadline[i]) abort_request(&L, e, i);
            else if (L.deadline[i] < wake) wake = L.deadline[i];
        }
        if (L.done >= n) break;
        struct timespec ts = {.tv_sec = (time_t)wake, .tv_nsec = (long)((wake - (double)(time_t)wake) * 1e9)};
        pthread_cond_timedwait(&L.cv, &L.mu, &ts);
        int done = L.done;
        pthread_mutex_unlock(&L.mu);
        bench_progress_update(&prog, done, 0);
        pthread_mutex_lock(&L.mu);
    }
    run->duration = L.last_done - t0;
    pthread_mutex_unlock(&L.mu);
    bench_progress_end(&prog);
    pthread_cond_destroy(&L.cv);
    pthread_mutex_destroy(&L.mu);
    free(L.subs);
    free(L.parts_left);
    free(L.timed_out);
    free(L.deadline);
    free(L.last_chunk);
    (void)err;
    return 0;
}

void bench_offline_moe_report(struct engine *e, FILE *out) {
    fprintf(out, "%s\n", "=============== MoE experts touched (--moe-counts) ===============");
    int n = engine_moe_counts(e, NULL, 0, 0);
    if (n <= 0) {
        fprintf(out, "the model has no mixture-of-experts layers\n");
        return;
    }
    struct model_moe_layer *c = xcalloc((size_t)n, sizeof *c);
    n = engine_moe_counts(e, c, n, 0);
    if (n > 0) model_moe_report(out, c, n);
    free(c);
}
