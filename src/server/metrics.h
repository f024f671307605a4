/* metrics.h — Prometheus text exposition for GET /metrics.
 *
 * Latencies are measured on the server side, from the arrival of the HTTP
 * request line: time to first token, inter-token latency (per token) and
 * end-to-end time of each engine request. They are recorded on the event loop
 * thread only, so there is no locking. Counters of tokens, finished requests,
 * queue sizes, KV pool and prefix-cache figures come from engine_stats at
 * scrape time. Names follow vLLM/SGLang with the `kiln:` prefix.
 */
#ifndef KILN_SERVER_METRICS_H
#define KILN_SERVER_METRICS_H

#include <stddef.h>

struct engine;
struct tracer;

enum { METRICS_MAX_BUCKETS = 24 };

struct histogram {
    int n_buckets;
    const double *bounds;               /* upper bounds, ascending */
    long counts[METRICS_MAX_BUCKETS];   /* per bucket (not cumulative) */
    long count;
    double sum;
};

struct metrics {
    struct histogram ttft, itl, e2e;
    struct histogram tok_batch; /* jobs per tokenizer-pool batch */
    long http_requests[6]; /* by status class: [2] = 2xx ... [5] = 5xx */
    long aborted_by_client;
    long slow_clients; /* streams cut: the client stopped reading */
    const struct tracer *tracer; /* NULL: tracing off */
};

void metrics_init(struct metrics *m);
void metrics_observe_ttft(struct metrics *m, double seconds);
void metrics_observe_itl(struct metrics *m, double seconds);
void metrics_observe_e2e(struct metrics *m, double seconds);
void metrics_observe_tok_batch(struct metrics *m, int jobs);
/* The full exposition (malloc'd, NUL-terminated). */
char *metrics_render(const struct metrics *m, struct engine *e, const char *model_name, size_t *len);

#endif
