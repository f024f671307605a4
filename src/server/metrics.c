/* metrics.c — histograms and the Prometheus text format (see metrics.h). */
#include "server/metrics.h"
#include "server/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "scheduler/engine.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                    0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5};
static const double e2e_bounds[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   2.5,   5.0,  10.0,
                                    15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};

static const double tok_batch_bounds[] = {1, 2, 4, 8, 16, 32, 64};

static void hist_init(struct histogram *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_buckets = n;
}

static void hist_observe(struct histogram *h, double v) {
    if (v < 0) v = 0;
    int i = 0;
    while (i < h->n_buckets && v > h->bounds[i]) i++;
    if (i < h->n_buckets) h->counts[i]++;
    h->count++;
    h->sum += v;
}

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof *ttft_bounds));
    hist_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof *itl_bounds));
    hist_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof *e2e_bounds));
    hist_init(&m->tok_batch, tok_batch_bounds, (int)(sizeof tok_batch_bounds / sizeof *tok_batch_bounds));
}

void metrics_observe_ttft(struct metrics *m, double s) { hist_observe(&m->ttft, s); }
void metrics_observe_itl(struct metrics *m, double s) { hist_observe(&m->itl, s); }
void metrics_observe_e2e(struct metrics *m, double s) { hist_observe(&m->e2e, s); }
void metrics_observe_tok_batch(struct metrics *m, int jobs) { hist_observe(&m->tok_batch, jobs); }

static void metric(struct buf *o, const char *name, const char *type, const char *help, const char *labels,
                   double v) {
    buf_printf(o, "# HELP kiln:%s %s\n# TYPE kiln:%s %s\nkiln:%s{%s} %.17g\n", name, help, name, type, name, labels, v);
}

static void hist(struct buf *o, const char *name, const char *help, const char *labels,
                 const struct histogram *h) {
    buf_printf(o, "# HELP kiln:%s %s\n# TYPE kiln:%s histogram\n", name, help, name);
    long cum = 0;
    for (int i = 0; i < h->n_buckets; i++) {
        cum += h->counts[i];
        buf_printf(o, "kiln:%s_bucket{%s,le=\"%g\"} %ld\n", name, labels, h->bounds[i], cum);
    }
    buf_printf(o, "kiln:%s_bucket{%s,le=\"+Inf\"} %ld\n", name, labels, h->count);
    buf_printf(o, "kiln:%s_sum{%s} %.17g\nkiln:%s_count{%s} %ld\n", name, labels, h->sum, name, labels, h->count);
}

char *metrics_render(const struct metrics *m, struct engine *e, const char *model_name, size_t *len) {
    struct engine_stats s;
    engine_stats(e, &s);
    struct buf o = {0};
    buf_reserve(&o, 8192);
    char lb[512];
    /* model names come from the command line; keep the label value plain */
    char name[256];
    size_t k = 0;
    for (const char *p = model_name; *p && k < sizeof name - 1; p++)
        name[k++] = (*p == '"' || *p == '\\' || *p == '\n') ? '_' : *p;
    name[k] = 0;
    snprintf(lb, sizeof lb, "model_name=\"%s\"", name);

    metric(&o, "num_requests_running", "gauge", "Requests in the running batch.", lb, s.running);
    metric(&o, "num_requests_waiting", "gauge", "Requests waiting to be scheduled.", lb, s.waiting);
    buf_printf(&o, "# HELP kiln:request_success_total Finished engine requests by finish reason.\n"
             "# TYPE kiln:request_success_total counter\n");
    for (int f = ENGINE_FINISH_STOP; f <= ENGINE_FINISH_ERROR; f++)
        buf_printf(&o, "kiln:request_success_total{%s,finished_reason=\"%s\"} %ld\n", lb,
             engine_finish_name((enum engine_finish)f), s.requests_finished[f]);
    metric(&o, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.", lb,
           (double)s.prompt_tokens_total);
    metric(&o, "generation_tokens_total", "counter", "Generated tokens of finished requests.", lb,
           (double)s.generation_tokens_total);
    metric(&o, "cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.", lb,
           (double)s.cached_tokens_total);
    metric(&o, "prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens, since start.", lb,
           s.prompt_tokens_total ? (double)s.cached_tokens_total / (double)s.prompt_tokens_total : 0.0);
    metric(&o, "num_retractions_total", "counter", "Running requests sent back to the queue for KV memory.",
           lb, (double)s.retractions_total);
    metric(&o, "kv_pages_total", "gauge", "Pages in the KV pool.", lb, (double)s.kv_pages_total);
    metric(&o, "kv_pages_free", "gauge", "Pages on the KV pool's free list.", lb, (double)s.kv_pages_free);
    metric(&o, "kv_pages_cached", "gauge", "Pages held by the radix prefix cache.", lb,
           (double)s.kv_pages_cached);
    long used = s.kv_pages_total - s.kv_pages_free;
    metric(&o, "kv_pages_used", "gauge", "Pages not on the free list (requests and prefix cache).", lb,
           (double)used);
    metric(&o, "kv_pages_used_by_requests", "gauge", "Pages held by requests outside the prefix cache.", lb,
           (double)(used - s.kv_pages_cached));
    if (s.kv_swa_pages_total > 0) {
        metric(&o, "swa_kv_pages_total", "gauge", "Pages of the sliding-window layers' own KV pool (hybrid models).",
               lb, (double)s.kv_swa_pages_total);
        metric(&o, "swa_kv_pages_free", "gauge", "Free pages of the sliding-window layers' KV pool.", lb,
               (double)s.kv_swa_pages_free);
        metric(&o, "swa_kv_pages_shed_total", "counter",
               "Sliding pages of cached prefixes given back when the sliding pool ran short (the prefixes "
               "stay usable as far as their last window still has its pages).",
               lb, (double)s.kv_swa_pages_shed_total);
    }
    if (s.hicache_pages_total > 0) {
        metric(&o, "hicache_pages_total", "gauge", "Pages the prefix cache's host tier holds room for.", lb,
               (double)s.hicache_pages_total);
        metric(&o, "hicache_pages", "gauge", "Pages the prefix cache's host tier holds.", lb, (double)s.hicache_pages);
        metric(&o, "hicache_saved_pages_total", "counter",
               "Pages copied to host memory as the prefix cache evicted them from the device.", lb,
               (double)s.hicache_saved_pages_total);
        metric(&o, "hicache_loaded_tokens_total", "counter",
               "Prompt tokens whose KV came back from host memory instead of being computed.", lb,
               (double)s.hicache_loaded_tokens_total);
    }
    metric(&o, "spec_draft_tokens_total", "counter", "Draft tokens speculative decoding proposed.", lb,
           (double)s.spec_draft_tokens_total);
    metric(&o, "spec_accepted_tokens_total", "counter", "Draft tokens the model's own picks confirmed.", lb,
           (double)s.spec_accepted_tokens_total);
    metric(&o, "page_size", "gauge", "Tokens per KV page.", lb, s.page_size);
    metric(&o, "kv_tokens_total", "gauge", "KV pool capacity in tokens.", lb,
           (double)s.kv_pages_total * s.page_size);
    metric(&o, "kv_tokens_used", "gauge", "KV slots not free, in tokens.", lb, (double)used * s.page_size);
    metric(&o, "token_usage", "gauge", "Fraction of the KV pool in use.", lb,
           s.kv_pages_total ? (double)used / (double)s.kv_pages_total : 0.0);
    hist(&o, "time_to_first_token_seconds", "Time from request arrival to the first token.", lb, &m->ttft);
    hist(&o, "inter_token_latency_seconds", "Time between tokens of one request.", lb, &m->itl);
    hist(&o, "e2e_request_latency_seconds", "Time from request arrival to its final token.", lb, &m->e2e);
    hist(&o, "tokenizer_batch_size", "Jobs the tokenizer pool ran in one batch (prompts tokenized off the loop thread).",
         lb, &m->tok_batch);
    buf_printf(&o, "# HELP kiln:http_responses_total HTTP responses by status class.\n"
             "# TYPE kiln:http_responses_total counter\n");
    for (int c = 2; c <= 5; c++)
        buf_printf(&o, "kiln:http_responses_total{%s,code=\"%dxx\"} %ld\n", lb, c, m->http_requests[c]);
    metric(&o, "client_disconnects_total", "counter", "Requests aborted because the client went away.", lb,
           (double)m->aborted_by_client);
    metric(&o, "slow_client_aborts_total", "counter",
           "Streams cut and their generation aborted because the client stopped reading.", lb,
           (double)m->slow_clients);
    if (m->tracer) {
        metric(&o, "trace_spans_exported_total", "counter", "Spans the OTLP collector accepted.", lb,
               (double)tracer_exported(m->tracer));
        metric(&o, "trace_spans_dropped_total", "counter",
               "Spans dropped: export queue full or the collector unreachable or refusing.", lb,
               (double)tracer_dropped(m->tracer));
    }
    *len = o.len;
    return buf_take(&o);
}
