/* engine.c — the engine thread: queues in, continuous batching steps, events
 * out. See engine.h for the contract and scheduler.c for how a step's
 * batch is chosen. */
#include "scheduler/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/radix.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine_internal.h"

const char *engine_finish_name(enum engine_finish f) {
    static const char *names[] = {"none", "stop", "length", "abort", "error"};
    return f >= 0 && f <= ENGINE_FINISH_ERROR ? names[f] : "?";
}

void engine_options_default(struct engine_options *o) {
    memset(o, 0, sizeof *o);
    o->device = backend_default_name();
    o->load_format = "auto";
    o->page_size = 1;
    o->max_running_requests = 256;
    o->chunked_prefill_size = 0; /* per device, in engine_create */
    o->policy = SCHEDULE_FCFS;
    o->decode_log_interval = 40;
}

/* ---- queues (any thread) ------------------------------------------------ */

uint64_t engine_submit(struct engine *e, const struct engine_request *in, struct kiln_error *err) {
    if (in->n_prompt < 1) return kiln_errorf(err, "the prompt is empty"), 0;
    for (int i = 0; i < in->n_prompt; i++)
        if (in->prompt[i] < 0 || in->prompt[i] >= e->vocab)
            return kiln_errorf(err, "prompt token id %d is outside the vocabulary of %d",
                               in->prompt[i], e->vocab), 0;
    for (int i = 0; i < in->n_label_ids; i++)
        if (in->label_ids[i] < 0 || in->label_ids[i] >= e->vocab)
            return kiln_errorf(err, "label token id %d is outside the vocabulary of %d",
                               in->label_ids[i], e->vocab), 0;
    /* with a window (every layer slides) a request keeps at most
     * window_tokens of KV beside a prefill chunk, whatever its length */
    long most = e->window ? (long)e->window_tokens + e->opt.chunked_prefill_size : e->pool_tokens;
    long room = e->context_length < e->pool_tokens ? e->context_length : e->pool_tokens;
    if (e->window && most < e->pool_tokens) room = e->context_length;
    struct engine_request r = *in;
    if (r.score) r.max_new_tokens = 0;
    if (r.max_new_tokens < 0) r.max_new_tokens = (int)(room - r.n_prompt);
    if (r.n_prompt >= e->context_length && !(r.score && r.n_prompt == e->context_length))
        return kiln_errorc(err, KILN_ERR_TOO_LARGE, "the prompt has %d tokens, the model's context length is %d",
                           r.n_prompt, e->context_length), 0;
    if ((long)r.n_prompt + r.max_new_tokens > e->context_length)
        return kiln_errorc(err, KILN_ERR_TOO_LARGE, "the prompt (%d tokens) plus max_tokens (%d) exceed the context "
                                "length of %d", r.n_prompt, r.max_new_tokens, e->context_length), 0;
    long keeps = (long)r.n_prompt + r.max_new_tokens + e->page_size;
    if (e->window && keeps > most + e->page_size) keeps = most + e->page_size;
    if (keeps > e->pool_tokens)
        return kiln_errorc(err, KILN_ERR_TOO_LARGE, "the prompt (%d tokens) plus max_tokens (%d) can never fit the KV "
                                "cache of %ld tokens", r.n_prompt, r.max_new_tokens, e->pool_tokens), 0;
    if (!r.score && e->opt.sampling_defaults == ENGINE_SAMPLING_DEFAULTS_MODEL)
        sampling_params_take(&r.sampling, &e->sampling_defaults, r.sampling_unset & e->sampling_defaults_mask);
    if (!r.score && sampling_params_validate(&r.sampling, e->vocab, err)) return 0;
    if (r.prompt_logprobs && r.prompt_logprob_start < 0)
        return kiln_errorf(err, "the prompt logprobs' start position must be >= 0, got %d",
                           r.prompt_logprob_start), 0;
    for (int i = 0; i < r.n_stop_ids; i++)
        if (r.stop_ids[i] < 0 || r.stop_ids[i] >= e->vocab)
            return kiln_errorf(err, "stop token id %d is outside the vocabulary of %d",
                               r.stop_ids[i], e->vocab), 0;
    if (r.grammar && r.score) return kiln_errorf(err, "a score request cannot have a grammar"), 0;
    if (r.grammar && !e->gvocab)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED, "structured outputs need the model's tokenizer"), 0;

    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return kiln_errorc(err, KILN_ERR_UNAVAILABLE, "shutting down"), 0;
    }
    if (e->opt.max_queued_requests > 0 && e->n_inbox + e->stats.waiting >= e->opt.max_queued_requests) {
        pthread_mutex_unlock(&e->mu);
        return kiln_errorc(err, KILN_ERR_OVERLOADED, "queue full: %d requests are waiting", e->opt.max_queued_requests), 0;
    }
    uint64_t id = ++e->next_id;
    if (!r.sampling.has_seed) {
        e->seed_state = e->seed_state * 6364136223846793005ull + 1442695040888963407ull;
        r.sampling.seed = e->seed_state ^ (id * 0x9e3779b97f4a7c15ull);
    }
    pthread_mutex_unlock(&e->mu);

    struct req *q = req_create(id, &r, e->vocab, e->tok);
    if (sg_request_init(e, q, err)) {
        req_free(q);
        return 0;
    }
    q->t_arrival = time_now();
    pthread_mutex_lock(&e->mu);
    q->next = NULL;
    if (e->inbox_tail) e->inbox_tail->next = q;
    else e->inbox = q;
    e->inbox_tail = q;
    e->n_inbox++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return id;
}

void engine_abort(struct engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    if (e->n_aborts == e->cap_aborts) {
        e->cap_aborts = e->cap_aborts ? 2 * e->cap_aborts : 64;
        e->aborts = xrealloc(e->aborts, (size_t)e->cap_aborts * sizeof *e->aborts);
    }
    e->aborts[e->n_aborts++] = id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int engine_moe_counts(struct engine *e, struct model_moe_layer *out, int max, int reset) {
    if (!e->opt.moe_count || !model_moe_layers(e->model)) return -1;
    pthread_mutex_lock(&e->mu);
    while (e->moe_ask.pending && !e->stopping) pthread_cond_wait(&e->done_cv, &e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    e->moe_ask = (struct moe_counts_ask){.pending = 1, .reset = reset, .max = max, .out = out};
    pthread_cond_signal(&e->cv);
    while (e->moe_ask.pending && !e->stopping) pthread_cond_wait(&e->done_cv, &e->mu);
    int n = e->moe_ask.pending ? -1 : e->moe_ask.n;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_stats(struct engine *e, struct engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}

const struct kiln_tokenizer *engine_tokenizer(const struct engine *e) { return e->tok; }
const char *engine_model_name(const struct engine *e) { return e->model_name; }
int engine_context_length(const struct engine *e) { return e->context_length; }
int engine_vocab_size(const struct engine *e) { return e->vocab; }
const struct engine_options *engine_options(const struct engine *e) { return &e->opt; }

unsigned engine_sampling_defaults(const struct engine *e, struct sampling_params *out) {
    *out = e->sampling_defaults;
    return e->sampling_defaults_mask;
}

/* The defaults generation_config.json gives (vLLM's and SGLang's set:
 * temperature, top_p, top_k, min_p, repetition_penalty; do_sample is
 * ignored as they ignore it). */
static void load_sampling_defaults(struct engine *e) {
    struct sampling_params *d = &e->sampling_defaults;
    sampling_params_default(d);
    e->sampling_defaults_mask = 0;
    if (e->opt.sampling_defaults != ENGINE_SAMPLING_DEFAULTS_MODEL) return;
    const struct generation_config *g = model_generation_config(e->model);
    unsigned m = 0;
    if (g->has_temperature) d->temperature = (float)g->temperature, m |= SAMPLING_FIELD_TEMPERATURE;
    if (g->has_top_p) d->top_p = (float)g->top_p, m |= SAMPLING_FIELD_TOP_P;
    if (g->has_top_k) d->top_k = g->top_k > 0 ? g->top_k : 0, m |= SAMPLING_FIELD_TOP_K;
    if (g->has_min_p) d->min_p = (float)g->min_p, m |= SAMPLING_FIELD_MIN_P;
    if (g->has_repetition_penalty)
        d->repetition_penalty = (float)g->repetition_penalty, m |= SAMPLING_FIELD_REPETITION_PENALTY;
    e->sampling_defaults_mask = m;
    if (m)
        log_info("sampling defaults from generation_config.json for requests that do not set them: "
                 "temperature %g, top_p %g, top_k %d, min_p %g, repetition_penalty %g "
                 "(--sampling-defaults openai ignores them)",
                 (double)d->temperature, (double)d->top_p, d->top_k, (double)d->min_p,
                 (double)d->repetition_penalty);
}

/* ---- the engine thread ------------------------------------------------- */

/* SGLang's periodic lines, in its words (log scrapers and people used to
 * it read them): one per step that ran prompt tokens, one every
 * --decode-log-interval decode steps (#running-req: the requests that
 * decoded in it). #token and token usage count the KV
 * held by requests (the prefix cache's evictable pages count as free). */
static void log_step(struct engine *e) {
    const struct sched_step_info *si = &e->step_info;
    long total = 0, avail = 0; /* every DP attention group's pool */
    for (int g = 0; g < e->dp_size; g++) {
        total += kv_pool_usable(e->gkv[g]);
        avail += e->gkv[g]->n_free + (e->grx[g] ? radix_evictable_pages(e->grx[g]) : 0);
    }
    long used = total - avail;
    double usage = total > 0 ? (double)used / (double)total : 0;
    /* a hybrid pool: the sliding layers' pages in use, as SGLang's "swa token usage" */
    char swa[64] = "";
    if (e->swa_window) {
        long st = e->kv->n_swa_pages - 2;
        snprintf(swa, sizeof swa, ", swa token usage: %.2f",
                 st > 0 ? (double)(st - kv_pool_swa_available(e->kv)) / (double)st : 0.0);
    }
    if (si->prefill_seqs > 0)
        log_info("Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f%s, "
                 "#running-req: %d, #queue-req: %d",
                 si->prefill_seqs, si->prefill_tokens, si->cached_tokens, usage, swa,
                 e->n_running - si->prefill_seqs > 0 ? e->n_running - si->prefill_seqs : 0, e->n_waiting);
    if (si->decode_rows == 0 || e->opt.decode_log_interval <= 0) return;
    if (++e->decode_steps % e->opt.decode_log_interval) return;
    double now = time_now(), dt = now - e->log_t;
    if (e->opt.spec_draft_tokens > 0) { /* SGLang's "accept len": tokens a speculative row gave */
        long d = e->counters.spec_draft_tokens_total - e->log_spec_drafts,
             a = e->counters.spec_accepted_tokens_total - e->log_spec_accepted;
        log_info("Speculative decoding. #draft-token: %ld, #accepted-token: %ld, accept rate: %.2f", d, a,
                 d > 0 ? (double)a / (double)d : 0.0);
        e->log_spec_drafts = e->counters.spec_draft_tokens_total;
        e->log_spec_accepted = e->counters.spec_accepted_tokens_total;
    }
    log_info("Decode batch. #running-req: %d, #token: %ld, token usage: %.2f%s, gen throughput (token/s): %.2f, "
             "#queue-req: %d",
             si->decode_rows, used * e->page_size, usage, swa, dt > 0 ? (double)e->log_tokens / dt : 0.0,
             e->n_waiting);
    if (e->g_fill_rows) /* structured outputs: what the masks cost the host (overlapped on a GPU) */
        log_info("Grammar masks. #rows: %ld, %.1f us a row", e->g_fill_rows, e->g_fill_us / (double)e->g_fill_rows);
    e->g_fill_rows = 0;
    e->g_fill_us = 0;
    e->log_tokens = 0;
    e->log_t = now;
}

static void *engine_main(void *arg) {
    struct engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->inbox && !e->n_aborts && !e->stopping && !e->moe_ask.pending && !sched_has_work(e))
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->moe_ask.pending) { /* between steps: nothing of ours is in flight */
            struct moe_counts_ask *a = &e->moe_ask;
            pthread_mutex_unlock(&e->mu);
            int n = a->out ? model_moe_counts(e->model, a->out, a->max) : model_moe_layers(e->model);
            if (a->reset) model_moe_count_set(e->model, 1, 1);
            pthread_mutex_lock(&e->mu);
            a->n = n;
            a->pending = 0;
            pthread_cond_broadcast(&e->done_cv);
        }
        struct req *in = e->inbox;
        e->inbox = e->inbox_tail = NULL;
        e->n_inbox = 0;
        int n_ab = e->n_aborts;
        uint64_t *ab = NULL;
        if (n_ab) {
            ab = xmalloc((size_t)n_ab * sizeof *ab);
            memcpy(ab, e->aborts, (size_t)n_ab * sizeof *ab);
            e->n_aborts = 0;
        }
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);

        while (in) {
            struct req *next = in->next;
            sched_enqueue(e, in);
            in = next;
        }
        for (int i = 0; i < n_ab; i++) sched_abort(e, ab[i], "aborted");
        free(ab);
        if (stopping) {
            sched_abort_all(e);
            sched_publish_stats(e);
            return NULL;
        }
        if (sched_has_work(e)) {
            sched_step(e);
            log_step(e);
        }
        sched_publish_stats(e);
    }
}

static void load_tokenizer(struct engine *e, const char *dir) {
    char *p = path_join(dir, "tokenizer.json");
    int have = file_exists(p);
    free(p);
    if (!have) {
        log_warn("%s has no tokenizer.json: events carry token ids only", dir);
        return;
    }
    struct kiln_error err;
    if (kiln_tokenizer_load(&e->tok, dir, &err)) {
        log_warn("tokenizer: %s (events carry token ids only)", err.msg);
        e->tok = NULL;
    }
}

int engine_create(struct engine **out, const struct engine_options *opt, struct kiln_error *err) {
    struct engine *e = xcalloc(1, sizeof *e);
    *out = NULL;
    e->opt = *opt;
    if (e->opt.page_size < 1) e->opt.page_size = 1;
    if (e->opt.max_running_requests < 1) e->opt.max_running_requests = 256;
    e->page_size = e->opt.page_size;
    int smin = opt->spec_min_window > 0 ? opt->spec_min_window : 1, smax = opt->spec_max_window > 0 ? opt->spec_max_window : 12;
    if (opt->spec_draft_tokens < 0 || opt->spec_draft_tokens > SPEC_MAX_DRAFT || smin > smax) {
        kiln_errorc(err, KILN_ERR_BAD_INPUT,
                    "speculative decoding: %d draft tokens (0 to %d) and match windows %d to %d (the least first)",
                    opt->spec_draft_tokens, SPEC_MAX_DRAFT, smin, smax);
        free(e);
        return -1;
    }
    if (!(opt->swa_full_tokens_ratio >= 0 && opt->swa_full_tokens_ratio <= 1)) {
        kiln_errorc(err, KILN_ERR_BAD_INPUT, "swa_full_tokens_ratio %g is outside 0..1 (0: the default, 0.8)",
                    opt->swa_full_tokens_ratio);
        free(e);
        return -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->seed_state = 0x243f6a8885a308d3ull;
    struct backend_options bo = {.n_threads = opt->threads, .device = opt->device_index,
                                 .deterministic = opt->deterministic, .kv_fp8 = opt->kv_fp8};
    if (backend_create(&e->be, opt->device ? opt->device : backend_default_name(), &bo, err)) goto fail;
    /* SGLang's default for large GPUs: one 8k prompt per step; the CPU
     * keeps steps short */
    if (e->opt.chunked_prefill_size < 1)
        e->opt.chunked_prefill_size = e->be.ops->mem_info ? 8192 : 512;
    if (sched_init(e, err)) goto fail;
    /* engine_stats must show the pool before the first request arrives */
    sched_publish_stats(e);
    load_sampling_defaults(e);
    e->log_t = time_now();
    const char *md = opt->model_dir;
    size_t ml = strlen(md);
    while (ml > 1 && md[ml - 1] == '/') ml--;
    const char *base = md + ml;
    while (base > md && base[-1] != '/') base--;
    e->model_name = xstrndup(base, (size_t)(md + ml - base));
    if (!(ml > 5 && !strncmp(md + ml - 5, ".json", 5))) load_tokenizer(e, md);
    if (sg_init(e, err)) goto fail;
    if (!opt->skip_sampler_warmup) {
        int sizes[] = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
        double s = sampler_warmup(e->vocab, sizes, (int)(sizeof sizes / sizeof sizes[0]));
        log_info("sampler warm-up: batch sizes 0..256, greedy + 5 random configurations, %.3f s", s);
        if (e->gpu_sample)
            log_info("device sampler warm-up: the same configurations on the device, %.3f s",
                     runner_sample_warmup(e->runner));
    }
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        kiln_errorc(err, KILN_ERR_IO, "cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    *out = e;
    return 0;
fail:
    engine_destroy(e);
    return -1;
}

void engine_destroy(struct engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_signal(&e->cv);
        pthread_cond_broadcast(&e->done_cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    /* requests that arrived after the thread ended still get their final event */
    struct req *in = e->inbox;
    while (in) {
        struct req *next = in->next;
        sched_enqueue(e, in);
        in = next;
    }
    if (e->model) sched_abort_all(e);
    sg_free(e);
    sched_free(e);
    kiln_tokenizer_free(e->tok);
    backend_destroy(&e->be);
    free(e->aborts);
    free(e->model_name);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}
