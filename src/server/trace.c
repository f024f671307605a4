/* trace.c — OpenTelemetry spans of requests, exported as OTLP/HTTP JSON.
 * See trace.h. The JSON follows the OTLP protobuf's JSON mapping as the
 * OTLP/HTTP specification gives it: trace and span ids as hex strings,
 * times as decimal strings of Unix nanoseconds, enums as integers,
 * attributes as {key, value: {stringValue | intValue | boolValue}}. */
#include "server/trace.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "server/gen.h"
#include "server/http.h"

enum { SPAN_KIND_INTERNAL = 1, SPAN_KIND_SERVER = 2 };
enum { STATUS_UNSET = 0, STATUS_ERROR = 2 };
enum { IO_TIMEOUT_S = 5, BATCH_MAX = 512 };

struct tracer {
    char host[300], port[16], path[512], service[128], model[256];
    double interval_s;
    int max_queue;
    /* time_now() → Unix time */
    double mono_to_unix;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    json_t **queue; /* spans */
    int n_queue;
    int stop;
    long exported, dropped;
    double last_warn;
};

struct trace_req {
    struct tracer *t;
    struct trace_ctx ctx;
    uint8_t span_id[8];
    double t0;
    char method[16];
    char name[96];
    char path[128];
    json_t *children; /* spans */
    long input_tokens, output_tokens;
    int n_engine;
};

/* ---- ids and times ------------------------------------------------------ */

static void random_bytes(uint8_t *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(b + got, n - got, 0);
        if (k > 0) got += (size_t)k;
        else if (k < 0 && errno != EINTR) break;
    }
    if (got < n) { /* no entropy source: the clock still tells requests apart */
        uint64_t x = (uint64_t)(time_now() * 1e9) ^ (uint64_t)(uintptr_t)b;
        for (size_t i = got; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (uint8_t)x;
        }
    }
}

static int all_zero(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void new_id(uint8_t *b, size_t n) {
    do random_bytes(b, n);
    while (all_zero(b, n));
}

static void hex(char *out, const uint8_t *b, size_t n) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = d[b[i] >> 4], out[2 * i + 1] = d[b[i] & 15];
    out[2 * n] = 0;
}

static int unhex(uint8_t *b, const char *s, size_t n) {
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) return -1;
        if (i % 2 == 0) b[i / 2] = (uint8_t)(v << 4);
        else b[i / 2] |= (uint8_t)v;
    }
    return 0;
}

int trace_ctx_parse(struct trace_ctx *c, const char *v) {
    /* version-trace_id-parent_id-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 */
    memset(c, 0, sizeof *c);
    if (!v) return -1;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    uint8_t ver;
    if (n < 55 || unhex(&ver, v, 1) || ver == 0xff || v[2] != '-' || v[35] != '-' || v[52] != '-') return -1;
    /* version 00 is exactly 55 characters; later versions may append "-..." */
    if (ver == 0 ? n != 55 : n > 55 && v[55] != '-') return -1;
    if (unhex(c->trace_id, v + 3, 16) || unhex(c->parent_id, v + 36, 8) || unhex(&c->flags, v + 53, 1))
        return -1;
    if (all_zero(c->trace_id, 16) || all_zero(c->parent_id, 8)) return -1;
    c->has_parent = 1;
    return 0;
}

/* Unix nanoseconds of a time_now() value, as a decimal string. */
static json_t *unix_nanos(const struct tracer *t, double mono) {
    double s = mono + t->mono_to_unix;
    long long sec = (long long)s;
    long long ns = (long long)((s - (double)sec) * 1e9 + 0.5);
    if (ns >= 1000000000LL) sec++, ns -= 1000000000LL;
    char buf[32];
    snprintf(buf, sizeof buf, "%lld%09lld", sec, ns);
    return json_string(buf);
}

/* ---- attributes and spans ------------------------------------------------ */

static void attr_str(json_t *a, const char *k, const char *v) {
    json_array_append_new(a, json_pack("{s:s,s:{s:s}}", "key", k, "value", "stringValue", v));
}

static void attr_int(json_t *a, const char *k, long long v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", v); /* int64 is a string in the JSON mapping */
    json_array_append_new(a, json_pack("{s:s,s:{s:s}}", "key", k, "value", "intValue", buf));
}

static void attr_bool(json_t *a, const char *k, int v) {
    json_array_append_new(a, json_pack("{s:s,s:{s:b}}", "key", k, "value", "boolValue", v));
}

static json_t *span_new(const struct trace_req *q, const uint8_t *span_id, const uint8_t *parent, const char *name,
                        int kind, double t0, double t1, json_t *attrs) {
    char tid[33], sid[17], pid[17];
    hex(tid, q->ctx.trace_id, 16);
    hex(sid, span_id, 8);
    json_t *s = json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:o}", "traceId", tid, "spanId", sid, "name", name, "kind",
                          kind, "startTimeUnixNano", unix_nanos(q->t, t0), "endTimeUnixNano",
                          unix_nanos(q->t, t1 > t0 ? t1 : t0), "attributes", attrs ? attrs : json_array());
    if (parent) {
        hex(pid, parent, 8);
        json_object_set_new(s, "parentSpanId", json_string(pid));
    }
    /* the W3C trace flags; bit 8: whether the parent is remote is known,
     * bit 9: it is (the caller's span, from traceparent) */
    int remote = parent && parent == q->ctx.parent_id;
    json_object_set_new(s, "flags", json_integer(0x100 | (remote ? 0x200 : 0) | q->ctx.flags));
    json_object_set_new(s, "status", json_pack("{s:i}", "code", STATUS_UNSET));
    return s;
}

static void child(struct trace_req *q, const char *name, double t0, double t1, json_t *attrs) {
    uint8_t id[8];
    new_id(id, 8);
    json_array_append_new(q->children, span_new(q, id, q->span_id, name, SPAN_KIND_INTERNAL, t0, t1, attrs));
}

/* ---- per request ---------------------------------------------------------- */

struct trace_req *trace_req_begin(struct tracer *t, struct http_request *r) {
    if (!t) return NULL;
    struct trace_req *q = xcalloc(1, sizeof *q);
    q->t = t;
    const char *tp = http_header_get(r, "traceparent");
    if (!tp || trace_ctx_parse(&q->ctx, tp)) {
        memset(&q->ctx, 0, sizeof q->ctx);
        new_id(q->ctx.trace_id, 16);
        q->ctx.flags = 1;
    }
    new_id(q->span_id, 8);
    q->t0 = r->t_start;
    snprintf(q->method, sizeof q->method, "%s", r->method);
    snprintf(q->name, sizeof q->name, "%s %s", r->method, r->path);
    snprintf(q->path, sizeof q->path, "%s", r->path);
    q->children = json_array();
    return q;
}

void trace_req_traceparent(const struct trace_req *q, char out[56]) {
    char tid[33], sid[17];
    hex(tid, q->ctx.trace_id, 16);
    hex(sid, q->span_id, 8);
    snprintf(out, 56, "00-%s-%s-%02x", tid, sid, q->ctx.flags);
}

void trace_req_tokenize(struct trace_req *q, double t0, double t1, int on_pool, size_t body_bytes) {
    if (!q) return;
    json_t *a = json_array();
    attr_str(a, "kiln.tokenize.thread", on_pool ? "pool" : "loop");
    attr_int(a, "kiln.request.body_bytes", (long long)body_bytes);
    child(q, "tokenize", t0, t1, a);
}

static const char *finish_name(enum engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_ABORT: return "abort";
    case ENGINE_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void trace_req_engine(struct trace_req *q, int index, const struct gen_event *ev, double t_end) {
    if (!q) return;
    const struct engine_timing *tm = &ev->timing;
    q->input_tokens += ev->prompt_tokens;
    q->output_tokens += ev->completion_tokens;
    q->n_engine++;
    double arrival = tm->arrival > 0 ? tm->arrival : t_end;
    json_t *a = json_array();
    attr_int(a, "kiln.index", index);
    attr_bool(a, "kiln.admitted", tm->admitted > 0);
    child(q, "queue", arrival, tm->admitted > 0 ? tm->admitted : t_end, a);
    if (tm->admitted <= 0) return;
    double prefill_end = tm->first_token > 0 ? tm->first_token : t_end;
    a = json_array();
    attr_int(a, "kiln.index", index);
    attr_int(a, "gen_ai.usage.input_tokens", ev->prompt_tokens);
    attr_int(a, "kiln.cached_tokens", ev->cached_tokens);
    attr_int(a, "kiln.prefill_chunks", tm->prefill_chunks);
    child(q, "prefill", tm->admitted, prefill_end, a);
    if (tm->first_token <= 0) return;
    a = json_array();
    attr_int(a, "kiln.index", index);
    attr_int(a, "gen_ai.usage.output_tokens", ev->completion_tokens);
    attr_int(a, "kiln.retractions", tm->retractions);
    attr_str(a, "gen_ai.response.finish_reasons", finish_name(ev->finish));
    child(q, "decode", tm->first_token, t_end, a);
}

static void enqueue(struct tracer *t, json_t *span);

void trace_req_end(struct trace_req *q, int status) {
    if (!q) return;
    struct tracer *t = q->t;
    json_t *a = json_array();
    attr_str(a, "http.request.method", q->method);
    attr_str(a, "url.path", q->path);
    if (status) attr_int(a, "http.response.status_code", status);
    else attr_bool(a, "kiln.client_disconnected", 1);
    if (t->model[0]) attr_str(a, "gen_ai.request.model", t->model);
    if (q->n_engine) {
        attr_int(a, "gen_ai.usage.input_tokens", q->input_tokens);
        attr_int(a, "gen_ai.usage.output_tokens", q->output_tokens);
    }
    json_t *root = span_new(q, q->span_id, q->ctx.has_parent ? q->ctx.parent_id : NULL, q->name, SPAN_KIND_SERVER,
                            q->t0, time_now(), a);
    /* server spans: 5xx is an error, 4xx is the client's (semantic conventions) */
    if (status >= 500) json_object_set_new(root, "status", json_pack("{s:i}", "code", STATUS_ERROR));
    enqueue(t, root);
    size_t i;
    json_t *c;
    json_array_foreach(q->children, i, c) enqueue(t, json_incref(c));
    json_decref(q->children);
    free(q);
}

/* ---- export ---------------------------------------------------------------- */

static void enqueue(struct tracer *t, json_t *span) {
    pthread_mutex_lock(&t->mu);
    if (t->n_queue >= t->max_queue) {
        t->dropped++;
        json_decref(span);
    } else {
        t->queue[t->n_queue++] = span;
        if (t->n_queue >= BATCH_MAX) pthread_cond_signal(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* POSTs body; the HTTP status, or -1 with *why set. */
static int post(const struct tracer *t, const char *body, size_t len, const char **why) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(t->host, t->port, &hints, &res) || !res) {
        *why = "cannot resolve the host";
        return -1;
    }
    int fd = -1, status = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {IO_TIMEOUT_S, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen)) close(fd), fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        *why = "cannot connect";
        return -1;
    }
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\nUser-Agent: kiln\r\n\r\n",
                      t->path, t->host, t->port, len);
    if (write_all(fd, head, (size_t)hn) || write_all(fd, body, len)) {
        *why = "the connection broke while sending";
        close(fd);
        return -1;
    }
    char resp[256];
    size_t got = 0;
    while (got < sizeof resp - 1) {
        ssize_t k = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
        resp[got] = 0;
        if (strstr(resp, "\r\n")) break;
    }
    resp[got] = 0;
    close(fd);
    if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1) {
        *why = "no HTTP answer";
        return -1;
    }
    return status;
}

/* Returns 0 when the collector took the batch. */
static int export_batch(struct tracer *t, json_t **spans, int n) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, spans[i]);
    json_t *res_attrs = json_array();
    attr_str(res_attrs, "service.name", t->service);
    attr_str(res_attrs, "telemetry.sdk.name", "kiln");
    attr_str(res_attrs, "telemetry.sdk.language", "c");
    json_t *doc = json_pack("{s:[{s:{s:o},s:[{s:{s:s},s:o}]}]}", "resourceSpans", "resource", "attributes",
                            res_attrs, "scopeSpans", "scope", "name", "kiln.server", "spans", arr);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    const char *why = "cannot encode the spans";
    int status = body ? post(t, body, strlen(body), &why) : -1;
    free(body);
    pthread_mutex_lock(&t->mu);
    if (status >= 200 && status < 300) t->exported += n;
    else t->dropped += n;
    double now = time_now();
    int warn = (status < 200 || status >= 300) && now - t->last_warn > 60;
    if (warn) t->last_warn = now;
    pthread_mutex_unlock(&t->mu);
    if (warn) {
        if (status < 0) log_warn("tracing: %d spans dropped: %s (http://%s:%s%s)", n, why, t->host, t->port, t->path);
        else log_warn("tracing: %d spans dropped: the collector answered %d", n, status);
    }
    return status >= 200 && status < 300 ? 0 : -1;
}

static void *exporter(void *arg) {
    struct tracer *t = arg;
    json_t **batch = xmalloc(sizeof *batch * BATCH_MAX);
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (!t->stop && t->n_queue < BATCH_MAX) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double d = t->interval_s;
            ts.tv_sec += (time_t)d;
            ts.tv_nsec += (long)((d - (double)(time_t)d) * 1e9);
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
        int n = t->n_queue < BATCH_MAX ? t->n_queue : BATCH_MAX;
        if (!n && t->stop) break;
        memcpy(batch, t->queue, sizeof *batch * (size_t)n);
        memmove(t->queue, t->queue + n, sizeof *t->queue * (size_t)(t->n_queue - n));
        t->n_queue -= n;
        pthread_mutex_unlock(&t->mu);
        int failed = n && export_batch(t, batch, n);
        pthread_mutex_lock(&t->mu);
        if (failed && t->stop) {
            /* shutting down and the collector is failing: do not make the
             * exit wait for a timeout per remaining batch */
            for (int i = 0; i < t->n_queue; i++) json_decref(t->queue[i]);
            t->dropped += t->n_queue;
            t->n_queue = 0;
        }
    }
    pthread_mutex_unlock(&t->mu);
    free(batch);
    return NULL;
}

/* ---- life -------------------------------------------------------------------- */

static int parse_endpoint(struct tracer *t, const char *url, struct kiln_error *err) {
    const char *p = url;
    if (!strncasecmp(p, "https://", 8))
        return kiln_errorf(err, "--otlp-traces-endpoint '%s': https is not supported; use an http:// collector "
                                "(OTLP/HTTP, usually port 4318)", url);
    if (!strncasecmp(p, "http://", 7)) p += 7;
    const char *slash = strchr(p, '/');
    size_t hp = slash ? (size_t)(slash - p) : strlen(p);
    char hostport[300];
    if (hp == 0 || hp >= sizeof hostport)
        return kiln_errorf(err, "--otlp-traces-endpoint '%s': expected http://HOST[:PORT][/PATH]", url);
    memcpy(hostport, p, hp);
    hostport[hp] = 0;
    snprintf(t->path, sizeof t->path, "%s", slash && slash[1] ? slash : "/v1/traces");
    char *colon = hostport[0] == '[' ? strstr(hostport, "]:") : strrchr(hostport, ':');
    const char *port = "4318";
    if (colon) {
        if (hostport[0] == '[') *colon++ = 0;
        *colon = 0;
        port = colon + 1;
        char *end;
        long pn = strtol(port, &end, 10);
        if (*end || pn < 1 || pn > 65535)
            return kiln_errorf(err, "--otlp-traces-endpoint '%s': '%s' is not a port number", url, port);
    }
    const char *host = hostport[0] == '[' ? hostport + 1 : hostport;
    if (!*host) return kiln_errorf(err, "--otlp-traces-endpoint '%s': no host", url);
    snprintf(t->host, sizeof t->host, "%s", host);
    snprintf(t->port, sizeof t->port, "%s", port);
    return 0;
}

int tracer_endpoint_check(const char *endpoint, struct kiln_error *err) {
    struct tracer *t = xcalloc(1, sizeof *t);
    int rc = parse_endpoint(t, endpoint, err);
    free(t);
    return rc;
}

int tracer_create(struct tracer **out, const struct tracer_options *o, struct kiln_error *err) {
    *out = NULL;
    struct tracer *t = xcalloc(1, sizeof *t);
    if (parse_endpoint(t, o->endpoint ? o->endpoint : "http://127.0.0.1:4318/v1/traces", err)) {
        free(t);
        return -1;
    }
    snprintf(t->service, sizeof t->service, "%s", o->service_name ? o->service_name : "kiln");
    snprintf(t->model, sizeof t->model, "%s", o->model_name ? o->model_name : "");
    t->interval_s = o->export_interval_s > 0 ? o->export_interval_s : 0.5;
    t->max_queue = o->max_queue > 0 ? o->max_queue : 8192;
    t->queue = xmalloc(sizeof *t->queue * (size_t)t->max_queue);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    t->mono_to_unix = (double)rt.tv_sec + (double)rt.tv_nsec * 1e-9 - time_now();
    t->last_warn = -1e9;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (pthread_create(&t->thread, NULL, exporter, t)) {
        tracer_free(t);
        return kiln_errorf(err, "tracing: cannot start the exporter thread");
    }
    t->thread_started = 1;
    log_info("tracing: OTLP/HTTP JSON spans to http://%s:%s%s every %.2f s", t->host, t->port, t->path,
             t->interval_s);
    *out = t;
    return 0;
}

void tracer_free(struct tracer *t) {
    if (!t) return;
    if (t->thread_started) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
    for (int i = 0; i < t->n_queue; i++) json_decref(t->queue[i]);
    free(t->queue);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

long tracer_exported(const struct tracer *t) {
    pthread_mutex_lock((pthread_mutex_t *)&t->mu);
    long v = t->exported;
    pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
    return v;
}

long tracer_dropped(const struct tracer *t) {
    pthread_mutex_lock((pthread_mutex_t *)&t->mu);
    long v = t->dropped;
    pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
    return v;
}
