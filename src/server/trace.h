/* trace.h — OpenTelemetry tracing of requests: every HTTP
 * request becomes a trace of spans — the request itself (SERVER span), its
 * tokenization (on the loop thread or a tokenizer worker), and for each
 * engine request its time in the queue, its prefill and its decode (stages
 * timed on the engine thread) — exported as OTLP/HTTP JSON to a collector
 * (`--otlp-traces-endpoint`, e.g. http://127.0.0.1:4318/v1/traces).
 *
 * Across processes: a W3C `traceparent` header on the request makes its
 * spans children of the caller's span in the caller's trace; the response
 * carries a `traceparent` naming the request's span.
 *
 * Threads: spans are built on the loop thread and queued (bounded: when the
 * collector is slow or down, new spans are dropped and counted); one
 * exporter thread sends them in batches with a blocking HTTP/1.1 POST.
 * Nothing on the loop thread waits on the collector. */
#ifndef KILN_SERVER_TRACE_H
#define KILN_SERVER_TRACE_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct gen_event;
struct http_request;
struct tracer;
struct trace_req;

struct tracer_options {
    const char *endpoint;     /* http://host[:port][/path]; host:port alone means /v1/traces */
    const char *service_name; /* resource attribute service.name (default "kiln") */
    const char *model_name;   /* gen_ai.request.model on the request spans */
    double export_interval_s; /* default 0.5: the longest a span waits in the queue */
    int max_queue;            /* default 8192 spans */
};

int tracer_create(struct tracer **out, const struct tracer_options *o, struct kiln_error *err);
/* Whether tracer_create would take this endpoint (the CLI checks it before
 * loading the model). */
int tracer_endpoint_check(const char *endpoint, struct kiln_error *err);
/* Sends what is queued (waits for the exporter; bounded by its timeouts). */
void tracer_free(struct tracer *t);
/* Spans the collector accepted, and spans dropped (queue full or export failed). */
long tracer_exported(const struct tracer *t);
long tracer_dropped(const struct tracer *t);

/* W3C trace context: version 00, 32 + 16 lowercase hex digits, not all zero. */
struct trace_ctx {
    uint8_t trace_id[16];
    uint8_t parent_id[8]; /* the caller's span */
    int has_parent;
    uint8_t flags;        /* sampled = 1 */
};
/* Parses a traceparent header value; 0 when valid. */
int trace_ctx_parse(struct trace_ctx *c, const char *traceparent);

/* The spans of one HTTP request (loop thread). begin returns NULL when the
 * tracer is NULL; every other call accepts NULL and does nothing. */
struct trace_req *trace_req_begin(struct tracer *t, struct http_request *r);
/* A child span of the request, times in time_now() seconds. */
void trace_req_tokenize(struct trace_req *q, double t0, double t1, int on_pool, size_t body_bytes);
/* The final event of engine request `index`: its queue, prefill and decode spans. */
void trace_req_engine(struct trace_req *q, int index, const struct gen_event *ev, double t_end);
/* The response is complete (status 0: the client left first): the request
 * span ends and every span of the request is queued for export; frees q. */
void trace_req_end(struct trace_req *q, int status);
/* "00-<trace>-<span>-<flags>" of the request's span (56 bytes + NUL), for
 * the response header. */
void trace_req_traceparent(const struct trace_req *q, char out[56]);

#endif
