/* server.c — server_run: the event loop, routing, authentication, graceful
 * shutdown, and the helpers routes share (see server_internal.h).
 *
 * Routes:
 *   GET  /health, /health_generate        open even with --api-key
 *   GET  /v1/models, /get_model_info, /metrics
 *   POST /v1/completions, /v1/chat/completions      routes_openai.c
 *   POST /generate, /tokenize, /detokenize, /v1/score  routes_native.c
 */
#include "server/server.h"

#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine.h"
#include "server/http_error.h"
#include "server/server_internal.h"
#include "server/trace.h"
#include "server/tokenize_pool.h"

void server_options_default(struct server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 30000;
    o->max_body_bytes = 32u << 20;
    o->max_connections = 4096;
    o->idle_timeout_s = 60;
    o->shutdown_timeout_s = 5;
    o->tokenizer_workers = 1;
    o->tokenizer_inline_bytes = 4096;
}

/* ---- helpers for routes ------------------------------------------------------ */

void server_reply_error(struct http_request *r, const struct req_error *e) {
    http_error_respond(r, e->status ? e->status : 400, e->code ? e->code : "invalid_value",
                       e->param[0] ? e->param : NULL, "%s", e->msg);
}

json_t *server_body(struct server *s, struct http_request *r) {
    struct req_error e = {0};
    json_t *v = jr_parse_body(r->body, r->body_len, &e);
    if (!v) server_reply_error(r, &e);
    else if (s->opt->log_requests)
        log_info("request %s %s: %.*s", r->method, r->path, (int)(r->body_len > 4096 ? 4096 : r->body_len), r->body);
    return v;
}

void server_reply_json(struct http_request *r, int status, json_t *v) {
    char *body = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!body) {
        http_error_respond(r, 500, "internal_error", NULL, "cannot encode the response");
        return;
    }
    http_respond(r, status, "application/json", body, strlen(body), NULL);
    free(body);
}

void server_reply_submit_error(struct http_request *r, const struct kiln_error *err) {
    if (!strncmp(err->msg, "queue full", 10))
        http_error_respond(r, 429, "queue_full", NULL, "%s; retry later", err->msg);
    else if (!strncmp(err->msg, "shutting down", 13))
        http_error_respond(r, 503, "shutting_down", NULL, "the server is shutting down");
    else
        http_error_respond(r, 400, "invalid_value", NULL, "%s", err->msg);
}

int server_check_model(struct server *s, const json_t *body, struct req_error *e) {
    const char *m = NULL;
    if (jr_str(body, "model", &m, e) < 0) return -1;
    if (!m || !*m || !strcmp(m, s->model_name) || !strcmp(m, engine_model_name(s->engine)) ||
        (s->opt->model_dir && !strcmp(m, s->opt->model_dir)) || !strcmp(m, "default"))
        return 0;
    return req_errorf(e, 400, "model_not_found", "model", "the model '%s' does not exist; this server serves '%s'",
                      m, s->model_name);
}

void server_new_id(struct server *s, const char *prefix, char *buf, size_t n) {
    uint64_t x = ++s->id_counter * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    snprintf(buf, n, "%s%08lx%016llx", prefix, (unsigned long)s->created & 0xffffffffu, (unsigned long long)x);
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

json_t *server_json_text(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    /* invalid UTF-8 (or NUL): replace the bad bytes, as decoders do */
    char *buf = xmalloc(n * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = s[i] ? utf8_seq((const unsigned char *)s + i, n - i) : 0;
        if (k) {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    v = json_stringn(buf, o);
    free(buf);
    return v ? v : json_string("");
}

json_t *server_token_text(struct server *s, int32_t prev, int32_t id) {
    if (!s->tok) return json_string("");
    char *t = NULL, *p = NULL;
    size_t n = 0, pn = 0;
    json_t *v = NULL;
    /* decoded after the token before it, so that SentencePiece's leading
     * space survives and the tokens of a text join up to that text */
    int32_t pair[2] = {prev, id};
    if (prev >= 0 && !kiln_tokenizer_decode(s->tok, pair, 1, 0, &p, &pn, NULL) &&
        !kiln_tokenizer_decode(s->tok, pair, 2, 0, &t, &n, NULL) && n >= pn && !memcmp(t, p, pn))
        v = server_json_text(t + pn, n - pn);
    free(t), free(p);
    if (v) return v;
    t = NULL;
    if (kiln_tokenizer_decode(s->tok, &id, 1, 0, &t, &n, NULL)) return json_string("");
    v = server_json_text(t, n);
    free(t);
    return v;
}

/* A traced offload: the work's start and end (on whichever thread runs
 * it) become the request's tokenize span. */
struct offload {
    tok_work_fn work;
    tok_done_fn done;
    tok_release_fn release;
    void *arg;
    double t0, t1;
    int on_pool;
};

static void offload_work(void *a) {
    struct offload *o = a;
    o->t0 = time_now();
    o->work(o->arg);
    o->t1 = time_now();
}

static void offload_done(void *a, struct http_request *r) {
    struct offload *o = a;
    trace_req_tokenize(r->trace, o->t0, o->t1, o->on_pool, r->body_len);
    o->done(o->arg, r);
}

static void offload_release(void *a) {
    struct offload *o = a;
    o->release(o->arg);
    free(o);
}

void server_offload(struct server *s, struct http_request *r, tok_work_fn work, tok_done_fn done,
                    tok_release_fn release, void *arg) {
    int on_pool = s->tokpool && r->body_len >= s->opt->tokenizer_inline_bytes;
    if (r->trace) {
        struct offload *o = xmalloc(sizeof *o);
        *o = (struct offload){work, done, release, arg, 0, 0, on_pool};
        work = offload_work, done = offload_done, release = offload_release, arg = o;
    }
    if (!on_pool) {
        work(arg);
        done(arg, r);
        release(arg);
        return;
    }
    tok_pool_submit(s->tokpool, r, r->body_len, work, done, release, arg);
}

int server_refuse_late(struct server *s, struct http_request *r) {
    if (!s->aborting) return 0;
    http_error_respond(r, 503, "shutting_down", NULL, "the server is shutting down");
    return 1;
}

/* ---- small routes ------------------------------------------------------------ */

void route_health(struct server *s, struct http_request *r) {
    (void)s;
    http_respond(r, 200, "application/json", "{}", 2, NULL);
}

void route_models(struct server *s, struct http_request *r) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:i}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "kiln", "root",
                          s->opt->model_dir ? s->opt->model_dir : s->model_name, "max_model_len",
                          s->context_length);
    server_reply_json(r, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

void route_model_info(struct server *s, struct http_request *r) {
    server_reply_json(r, 200, json_pack("{s:s,s:s,s:b,s:i}", "model_path",
                                        s->opt->model_dir ? s->opt->model_dir : s->model_name, "served_model_name",
                                        s->model_name, "is_generation", 1, "context_length", s->context_length));
}

static void route_metrics(struct server *s, struct http_request *r) {
    http_server_responses(s->http, s->metrics.http_requests);
    size_t n;
    char *text = metrics_render(&s->metrics, s->engine, s->model_name, &n);
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, n, NULL);
    free(text);
}

/* ---- routing ------------------------------------------------------------------- */

struct route {
    const char *path;
    const char *method;
    void (*fn)(struct server *, struct http_request *);
    int open; /* no API key needed */
};

static const struct route routes[] = {
    {"/health", "GET", route_health, 1},
    {"/health_generate", "GET", route_health, 1},
    {"/v1/models", "GET", route_models, 0},
    {"/get_model_info", "GET", route_model_info, 0},
    {"/metrics", "GET", route_metrics, 0},
    {"/v1/completions", "POST", route_completions, 0},
    {"/v1/chat/completions", "POST", route_chat_completions, 0},
    {"/generate", "POST", route_generate, 0},
    {"/tokenize", "POST", route_tokenize, 0},
    {"/detokenize", "POST", route_detokenize, 0},
    {"/v1/score", "POST", route_score, 0},
};

static int authorized(const struct server *s, const struct http_request *r) {
    const char *key = s->opt->api_key;
    if (!key || !*key) return 1;
    const char *h = http_header_get(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return http_secure_equal(h, strlen(h), key, strlen(key));
}

static void on_trace_finish(void *arg, int status) { trace_req_end(arg, status); }

static void handle(void *ctx, struct http_request *r) {
    struct server *s = ctx;
    size_t plen = strlen(r->path);
    while (plen > 1 && r->path[plen - 1] == '/') r->path[--plen] = 0; /* "/v1/models/" is "/v1/models" */
    const struct route *match = NULL;
    char allow[64] = "";
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(routes[i].path, r->path)) continue;
        if (!strcmp(routes[i].method, r->method))
            match = &routes[i];
        else
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "",
                     routes[i].method);
    }
    if (log_enabled(LOG_LEVEL_DEBUG)) log_debug("%s %s (%zu bytes)", r->method, r->path, r->body_len);
    /* every request but the probes (health, metrics) is traced */
    if (s->tracer && !(match && (match->fn == route_health || match->fn == route_metrics))) {
        struct trace_req *tq = trace_req_begin(s->tracer, r);
        r->trace = tq;
        http_request_on_finish(r, on_trace_finish, tq);
        char tp[56], line[72];
        trace_req_traceparent(tq, tp);
        snprintf(line, sizeof line, "traceparent: %s", tp);
        http_request_add_header(r, line);
    }
    if (s->shutting_down && !http_request_started_before_stop(r)) {
        http_request_close_after(r);
        http_error_respond(r, 503, "shutting_down", NULL, "the server is shutting down");
        return;
    }
    if (!(match && match->open) && !authorized(s, r)) {
        http_error_respond_headers(r, 401, "invalid_api_key", NULL, "WWW-Authenticate: Bearer\r\n",
                                   "missing or invalid API key: send 'Authorization: Bearer <key>'");
        return;
    }
    if (!match && allow[0]) {
        char hdr[96];
        snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
        http_error_respond_headers(r, 405, "method_not_allowed", NULL, hdr, "%s %s is not allowed; use %s",
                                   r->method, r->path, allow);
        return;
    }
    if (!match) {
        http_error_respond(r, 404, "not_found", NULL, "no route for %s %s", r->method, r->path);
        return;
    }
    match->fn(s, r);
}

/* ---- shutdown -------------------------------------------------------------------- */

static void on_flushed_check(evutil_socket_t fd, short what, void *arg);

static void finish_when_flushed(struct server *s) {
    /* every gen is done: exit once the last responses have left (bounded) */
    struct timeval tv = {0, 20000};
    event_base_once(s->base, -1, EV_TIMEOUT, on_flushed_check, s, &tv);
}

static void on_flushed_check(evutil_socket_t fd, short what, void *arg) {
    struct server *s = arg;
    (void)fd, (void)what;
    static const int max_checks = 100;
    int pending = http_server_pending_output(s->http);
    if (!pending || ++s->flush_checks >= max_checks) event_base_loopexit(s->base, NULL);
    else finish_when_flushed(s);
}

/* requests in flight: engine requests, prompts being tokenized, and
 * requests whose bytes were arriving when the signal came */
static int in_flight(const struct server *s) {
    return s->hub.n_gens + tok_pool_jobs(s->tokpool) + http_server_requests_arriving(s->http);
}

static void maybe_finish(struct server *s) {
    if (!s->shutting_down || s->finishing || in_flight(s)) return;
    s->finishing = 1;
    finish_when_flushed(s);
}

static void on_idle(void *arg) { maybe_finish(arg); }

/* Requests still arriving or answered on the spot end without telling the
 * hub or the pool: look again while shutting down. */
static void on_shutdown_tick(evutil_socket_t fd, short what, void *arg) {
    struct server *s = arg;
    (void)fd, (void)what;
    maybe_finish(s);
}

static void on_grace_over(evutil_socket_t fd, short what, void *arg) {
    struct server *s = arg;
    (void)fd, (void)what;
    if (in_flight(s)) log_info("shutdown: aborting %d requests still in flight", in_flight(s));
    s->aborting = 1;
    http_server_refuse_arriving(s->http);
    gen_hub_abort_all(&s->hub);
    maybe_finish(s);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    struct server *s = arg;
    (void)what;
    if (s->shutting_down) {
        log_info("second signal: aborting everything in flight");
        s->aborting = 1;
        http_server_refuse_arriving(s->http);
        gen_hub_abort_all(&s->hub);
        maybe_finish(s);
        return;
    }
    s->shutting_down = 1;
    http_server_stop_listening(s->http);
    log_info("%s: no longer accepting requests; %d in flight (up to %.1f s to finish)",
             sig == SIGINT ? "SIGINT" : "SIGTERM", in_flight(s), s->opt->shutdown_timeout_s);
    if (!in_flight(s)) {
        maybe_finish(s);
        return;
    }
    struct timeval tick = {0, 20000};
    s->shutdown_tick = event_new(s->base, -1, EV_PERSIST, on_shutdown_tick, s);
    if (s->shutdown_tick) event_add(s->shutdown_tick, &tick);
    struct timeval tv = {(time_t)s->opt->shutdown_timeout_s,
                         (suseconds_t)((s->opt->shutdown_timeout_s - (double)(time_t)s->opt->shutdown_timeout_s) * 1e6)};
    s->grace = evtimer_new(s->base, on_grace_over, s);
    if (s->grace) evtimer_add(s->grace, &tv);
}

/* ---- run ------------------------------------------------------------------------- */

static void load_chat_template(struct server *s) {
    struct kiln_error err;
    if (s->opt->chat_template) {
        char *src = NULL;
        size_t n;
        if (file_read_all(s->opt->chat_template, &src, &n, &err) == 0) {
            const char *bos = NULL, *eos = NULL;
            if (s->tok) {
                int32_t b = kiln_tokenizer_bos_id(s->tok), e = kiln_tokenizer_eos_id(s->tok);
                bos = b >= 0 ? kiln_tokenizer_id_to_token(s->tok, b, NULL) : NULL;
                eos = e >= 0 ? kiln_tokenizer_id_to_token(s->tok, e, NULL) : NULL;
            }
            if (chat_template_init(&s->chat, src, bos, eos, &err) == 0) s->have_chat = 1;
        }
        free(src);
        if (!s->have_chat) snprintf(s->chat_error, sizeof s->chat_error, "--chat-template: %s", err.msg);
    } else if (s->opt->model_dir) {
        if (chat_template_load(&s->chat, s->opt->model_dir, &err) == 0) s->have_chat = 1;
        else snprintf(s->chat_error, sizeof s->chat_error, "%s", err.msg);
    } else {
        snprintf(s->chat_error, sizeof s->chat_error, "no model folder to read a chat template from");
    }
    if (s->have_chat) log_info("chat template loaded%s", s->opt->chat_template ? " from --chat-template" : "");
    else log_info("no chat template (/v1/chat/completions will answer 400): %s", s->chat_error);
}

int server_run(struct engine *e, const struct server_options *o, struct kiln_error *err) {
    struct server *s = xcalloc(1, sizeof *s);
    int rc = -1;
    s->opt = o;
    s->engine = e;
    s->tok = engine_tokenizer(e);
    s->model_name = o->served_model_name && *o->served_model_name ? o->served_model_name : engine_model_name(e);
    s->vocab = engine_vocab_size(e);
    s->context_length = engine_context_length(e);
    s->created = (long)time(NULL);
    metrics_init(&s->metrics);
    signal(SIGPIPE, SIG_IGN);
    /* the engine thread activates our event: libevent must lock */
    if (evthread_use_pthreads()) {
        kiln_errorf(err, "libevent has no pthreads support");
        goto out;
    }
    s->base = event_base_new();
    if (!s->base) {
        kiln_errorf(err, "cannot create the event loop");
        goto out;
    }
    load_chat_template(s);
    if (o->otlp_traces_endpoint) {
        struct tracer_options to = {.endpoint = o->otlp_traces_endpoint, .model_name = s->model_name,
                                    .export_interval_s = o->otlp_export_interval_s};
        if (tracer_create(&s->tracer, &to, err)) goto out;
        s->metrics.tracer = s->tracer;
    }
    if (gen_hub_init(&s->hub, s->base, e, &s->metrics, err)) goto out;
    s->hub.on_idle = on_idle;
    s->hub.idle_arg = s;
    if (o->tokenizer_workers > 0 && s->tok) {
        if (tok_pool_create(&s->tokpool, s->base, o->tokenizer_workers, &s->metrics, err)) goto out;
        tok_pool_on_idle(s->tokpool, on_idle, s);
    }
    /* every connection is a descriptor: take what the hard limit allows */
    int max_conns = o->max_connections;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)max_conns + 64 > rl.rlim_cur) {
            max_conns = rl.rlim_cur > 128 ? (int)(rl.rlim_cur - 64) : 64;
            log_warn("--max-connections lowered to %d: the descriptor limit is %llu", max_conns,
                     (unsigned long long)rl.rlim_cur);
        }
    }
    struct http_server_options ho = {.host = o->host, .port = o->port, .listen_fd = o->listen_fd, .max_body_bytes = o->max_body_bytes,
                                     .max_connections = max_conns, .idle_timeout_s = o->idle_timeout_s};
    if (http_server_create(&s->http, s->base, &ho, handle, s, err)) goto out;
    s->sigint = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sigterm = evsignal_new(s->base, SIGTERM, on_signal, s);
    if (!s->sigint || !s->sigterm || event_add(s->sigint, NULL) || event_add(s->sigterm, NULL)) {
        kiln_errorf(err, "cannot install signal handlers");
        goto out;
    }
    if (o->on_listening) o->on_listening(o->on_listening_arg, o->host, http_server_port(s->http));
    event_base_dispatch(s->base);
    log_info("shutdown complete");
    rc = 0;
out:
    /* order matters: connections first (their close callbacks abort), then
     * the engine (its last events land in the hub), then the hub */
    http_server_free(s->http);
    /* after the connections: their close callbacks cancel queued jobs */
    tok_pool_free(s->tokpool);
    engine_destroy(e);
    if (s->base) gen_hub_free(&s->hub);
    /* after the connections: their last spans are queued; this sends them */
    tracer_free(s->tracer);
    if (s->sigint) event_free(s->sigint);
    if (s->sigterm) event_free(s->sigterm);
    if (s->grace) event_free(s->grace);
    if (s->shutdown_tick) event_free(s->shutdown_tick);
    if (s->have_chat) chat_template_free(&s->chat);
    if (s->base) event_base_free(s->base);
    free(s);
    return rc;
}
