/* server.c — server_run: the event loop, routing, authentication, CORS,
 * graceful shutdown, and the helpers routes share (see server_internal.h).
 *
 * Routes:
 *   GET  /health, /health_generate        open even with --api-key
 *   GET  /v1/models, /v1/models/{id}, /get_model_info, /get_server_info, /metrics
 *   POST /v1/completions, /v1/chat/completions      routes_openai.c
 *   POST /generate, /tokenize, /detokenize, /v1/score  routes_native.c
 *   OPTIONS (any path)                     CORS preflight
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

#include "base/buf.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/utf8.h"
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
    o->head_timeout_s = 30;
    o->body_timeout_s = 300;
    o->shutdown_timeout_s = 5;
    o->tokenizer_workers = 1;
    o->tokenizer_inline_bytes = 4096;
    o->allowed_origins = "*";
}

/* ---- helpers for routes ------------------------------------------------------ */

void server_reply_error(struct http_request *r, const struct req_error *e) {
    http_error_respond(r, e->status ? e->status : 400, e->code ? e->code : "invalid_value",
                       e->param[0] ? e->param : NULL, "%s", e->msg);
}

json_t *server_body(struct server *s, struct http_request *r) {
    struct req_error e = {0};
    json_t *v = jr_parse_body(r->body.data, r->body.len, &e);
    if (!v) server_reply_error(r, &e);
    else if (s->opt->log_requests)
        log_info("request %s %s: %.*s", r->method, r->path, (int)(r->body.len > 4096 ? 4096 : r->body.len), r->body.data);
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

int server_error_status(enum kiln_error_code code, const char **oai_code) {
    const char *c;
    int status;
    switch (code) {
    case KILN_ERR_NOT_FOUND: status = 404, c = "not_found"; break;
    case KILN_ERR_UNSUPPORTED: status = 400, c = "unsupported"; break;
    /* OpenAI's code for a prompt that does not fit */
    case KILN_ERR_TOO_LARGE: status = 400, c = "context_length_exceeded"; break;
    case KILN_ERR_OVERLOADED: status = 429, c = "queue_full"; break;
    case KILN_ERR_UNAVAILABLE: status = 503, c = "shutting_down"; break;
    case KILN_ERR_OUT_OF_MEMORY: status = 503, c = "out_of_memory"; break;
    case KILN_ERR_IO:
    case KILN_ERR_INTERNAL: status = 500, c = "internal_error"; break;
    default: status = 400, c = "invalid_value"; break;
    }
    if (oai_code) *oai_code = c;
    return status;
}

void server_reply_submit_error(struct http_request *r, const struct kiln_error *err) {
    const char *code;
    int status = server_error_status(err->code, &code);
    if (err->code == KILN_ERR_OVERLOADED)
        http_error_respond(r, status, code, NULL, "%s; retry later", err->msg);
    else if (err->code == KILN_ERR_UNAVAILABLE)
        http_error_respond(r, status, code, NULL, "the server is shutting down");
    else
        http_error_respond(r, status, code, NULL, "%s", err->msg);
}

unsigned server_sampling_unset(const json_t *o) {
    static const struct {
        const char *key;
        unsigned bit;
    } f[] = {{"temperature", SAMPLING_FIELD_TEMPERATURE}, {"top_p", SAMPLING_FIELD_TOP_P},
             {"top_k", SAMPLING_FIELD_TOP_K}, {"min_p", SAMPLING_FIELD_MIN_P},
             {"repetition_penalty", SAMPLING_FIELD_REPETITION_PENALTY}};
    unsigned m = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        json_t *v = o ? json_object_get(o, f[i].key) : NULL;
        if (!v || json_is_null(v)) m |= f[i].bit;
    }
    return m;
}

int server_refuse_fanout(struct server *s, struct http_request *r, int total, const char *param) {
    int maxq = s->opt->max_queued_requests;
    if (total > 4096) {
        http_error_respond(r, 400, "invalid_value", param, "%d requests (prompts x n) in one call is more than 4096",
                           total);
        return 1;
    }
    if (maxq > 0 && total > maxq) {
        http_error_respond(r, 400, "invalid_value", param,
                           "%d requests (prompts x n) in one call can never fit the queue of %d "
                           "(--max-queued-requests)",
                           total, maxq);
        return 1;
    }
    return 0;
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

json_t *server_json_text(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", n);
    if (v) return v;
    /* invalid UTF-8: each maximal invalid subpart becomes U+FFFD, as decoders do */
    struct buf b = {0};
    utf8_lossy_append(&b, s, n, 1);
    v = json_stringn(b.data, b.len);
    buf_free(&b);
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
    trace_req_tokenize(r->trace, o->t0, o->t1, o->on_pool, r->body.len);
    o->done(o->arg, r);
}

static void offload_release(void *a) {
    struct offload *o = a;
    o->release(o->arg);
    free(o);
}

void server_offload(struct server *s, struct http_request *r, int heavy, tok_work_fn work, tok_done_fn done,
                    tok_release_fn release, void *arg) {
    int on_pool = s->tokpool && (heavy || r->body.len >= s->opt->tokenizer_inline_bytes);
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
    tok_pool_submit(s->tokpool, r, r->body.len, work, done, release, arg);
}

int server_refuse_late(struct server *s, struct http_request *r) {
    if (!s->aborting) return 0;
    http_error_respond(r, 503, "shutting_down", NULL, "the server is shutting down");
    return 1;
}

/* ---- small routes ------------------------------------------------------------ */

static void route_health(struct server *s, struct http_request *r) {
    (void)s;
    http_respond(r, 200, "application/json", "{}", 2, NULL);
}

/* /health_generate: one greedy token through the engine (SGLang's check
 * that the scheduler and the model still make progress, not only the HTTP
 * loop). 200 once it is out; 503 when it fails or takes longer than
 * HEALTH_TIMEOUT_S. */
enum { HEALTH_TIMEOUT_S = 20 };

struct health {
    struct server *s;
    struct gen *g;
    struct event *timer;
    struct gen_output out;
};

static void health_on_event(struct gen *g, int i, const struct gen_event *ev) {
    struct health *h = g->state;
    (void)i;
    gen_output_add(&h->out, ev);
}

static void health_on_done(struct gen *g) {
    struct health *h = g->state;
    if (h->out.finish == ENGINE_FINISH_STOP || h->out.finish == ENGINE_FINISH_LENGTH)
        http_respond(g->req, 200, "application/json", "{}", 2, NULL);
    else
        http_error_respond(g->req, 503, "unhealthy", NULL, "the health check generation ended with '%s'%s%s",
                           engine_finish_name(h->out.finish), h->out.error ? ": " : "",
                           h->out.error ? h->out.error : "");
}

static void health_on_free(struct gen *g) {
    struct health *h = g->state;
    if (h->timer) event_free(h->timer);
    gen_output_free(&h->out);
    free(h);
}

static const struct gen_ops health_ops = {health_on_event, health_on_done, health_on_free};

static void health_timeout(evutil_socket_t fd, short what, void *arg) {
    struct health *h = arg;
    (void)fd, (void)what;
    if (!h->g->req) return;
    http_error_respond(h->g->req, 503, "unhealthy", NULL, "the health check generation took more than %d s",
                       HEALTH_TIMEOUT_S);
    gen_fail(h->g);
}

static void route_health_generate(struct server *s, struct http_request *r) {
    struct health *h = xcalloc(1, sizeof *h);
    h->s = s;
    gen_output_init(&h->out);
    int32_t bos = s->tok ? kiln_tokenizer_bos_id(s->tok) : -1;
    int32_t prompt[1] = {bos >= 0 && bos < s->vocab ? bos : 0};
    struct engine_request er = {.prompt = prompt, .n_prompt = 1, .max_new_tokens = 1, .ignore_eos = 1,
                                .skip_special_tokens = 1};
    sampling_params_default(&er.sampling);
    er.sampling.temperature = 0;
    h->g = gen_create(&s->hub, r, 1, &health_ops, h);
    h->timer = evtimer_new(s->base, health_timeout, h);
    struct timeval tv = {HEALTH_TIMEOUT_S, 0};
    if (h->timer) evtimer_add(h->timer, &tv);
    struct kiln_error err;
    if (!gen_submit(h->g, 0, &er, 0, &err)) {
        const char *code;
        int status = server_error_status(err.code, &code);
        http_error_respond(r, status >= 500 || status == 429 ? 503 : status, "unhealthy", NULL,
                           "the health check generation was refused: %s", err.msg);
        gen_fail(h->g);
    }
}

static json_t *model_json(struct server *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "kiln", "root",
                     s->opt->model_dir ? s->opt->model_dir : s->model_name, "max_model_len", s->context_length);
}

static void route_models(struct server *s, struct http_request *r) {
    server_reply_json(r, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}

/* GET /v1/models/{id}: ids may hold '/' (ORG/NAME), so the rest of the path
 * is the id. */
static void route_model_get(struct server *s, struct http_request *r) {
    const char *id = r->path + strlen("/v1/models/");
    if (!strcmp(id, s->model_name)) {
        server_reply_json(r, 200, model_json(s));
        return;
    }
    http_error_respond(r, 404, "model_not_found", "model", "The model '%s' does not exist; this server serves '%s'",
                       id, s->model_name);
}

static const char *policy_name(enum schedule_policy p) {
    return p == SCHEDULE_LPM ? "lpm" : p == SCHEDULE_PRIORITY ? "priority" : "fcfs";
}

/* SGLang's /get_server_info: the effective configuration, with the names of
 * the serve options (never the API key itself). */
static void route_server_info(struct server *s, struct http_request *r) {
    const struct server_options *o = s->opt;
    const struct engine_options *eo = engine_options(s->engine);
    struct engine_stats st;
    engine_stats(s->engine, &st);
    struct sampling_params d;
    unsigned from_model = engine_sampling_defaults(s->engine, &d);
    json_t *defaults = json_object();
    static const struct {
        unsigned bit;
        const char *name;
    } fields[] = {{SAMPLING_FIELD_TEMPERATURE, "temperature"}, {SAMPLING_FIELD_TOP_P, "top_p"},
                  {SAMPLING_FIELD_TOP_K, "top_k"}, {SAMPLING_FIELD_MIN_P, "min_p"},
                  {SAMPLING_FIELD_REPETITION_PENALTY, "repetition_penalty"}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (!(from_model & fields[i].bit)) continue;
        double v = fields[i].bit == SAMPLING_FIELD_TEMPERATURE ? d.temperature
                   : fields[i].bit == SAMPLING_FIELD_TOP_P     ? d.top_p
                   : fields[i].bit == SAMPLING_FIELD_TOP_K     ? d.top_k
                   : fields[i].bit == SAMPLING_FIELD_MIN_P     ? d.min_p
                                                               : d.repetition_penalty;
        json_object_set_new(defaults, fields[i].name,
                            fields[i].bit == SAMPLING_FIELD_TOP_K ? json_integer(d.top_k) : json_real(v));
    }
    json_t *v = json_object();
    json_object_set_new(v, "model_path", json_string(o->model_dir ? o->model_dir : s->model_name));
    json_object_set_new(v, "tokenizer_path", json_string(o->model_dir ? o->model_dir : s->model_name));
    json_object_set_new(v, "served_model_name", json_string(s->model_name));
    json_object_set_new(v, "host", json_string(o->host ? o->host : ""));
    json_object_set_new(v, "port", json_integer(http_server_port(s->http)));
    json_object_set_new(v, "api_key", o->api_key && *o->api_key ? json_string("<set>") : json_null());
    json_object_set_new(v, "chat_template", o->chat_template ? json_string(o->chat_template) : json_null());
    json_object_set_new(v, "context_length", json_integer(s->context_length));
    json_object_set_new(v, "vocab_size", json_integer(s->vocab));
    json_object_set_new(v, "device", json_string(eo->device ? eo->device : ""));
    json_object_set_new(v, "load_format", json_string(eo->load_format ? eo->load_format : "auto"));
    json_object_set_new(v, "quantization", eo->quantization ? json_string(eo->quantization) : json_null());
    json_object_set_new(v, "page_size", json_integer(st.page_size));
    json_object_set_new(v, "max_total_tokens", json_integer((json_int_t)st.kv_pages_total * st.page_size));
    json_object_set_new(v, "max_running_requests", json_integer(eo->max_running_requests));
    json_object_set_new(v, "max_queued_requests", json_integer(eo->max_queued_requests));
    json_object_set_new(v, "chunked_prefill_size", json_integer(eo->chunked_prefill_size));
    json_object_set_new(v, "mem_fraction_static",
                        eo->mem_fraction_static > 0 ? json_real(eo->mem_fraction_static) : json_null());
    json_object_set_new(v, "swa_full_tokens_ratio",
                        json_real(eo->swa_full_tokens_ratio > 0 ? eo->swa_full_tokens_ratio : 0.8));
    json_object_set_new(v, "disable_hybrid_swa_memory", json_boolean(eo->disable_hybrid_swa));
    json_object_set_new(v, "speculative_algorithm", eo->spec_draft_tokens > 0 ? json_string("NGRAM") : json_null());
    json_object_set_new(v, "speculative_num_draft_tokens", json_integer(eo->spec_draft_tokens));
    json_object_set_new(v, "schedule_policy", json_string(policy_name(eo->policy)));
    json_object_set_new(v, "disable_radix_cache", json_boolean(eo->disable_radix_cache));
    json_object_set_new(v, "enable_hierarchical_cache", json_boolean(eo->enable_hicache));
    json_object_set_new(v, "deterministic", json_boolean(eo->deterministic));
    json_object_set_new(v, "threads", json_integer(eo->threads));
    json_object_set_new(v, "sampling_defaults",
                        json_string(eo->sampling_defaults == ENGINE_SAMPLING_DEFAULTS_OPENAI ? "openai" : "model"));
    json_object_set_new(v, "default_sampling_params", defaults);
    json_object_set_new(v, "decode_log_interval", json_integer(eo->decode_log_interval));
    json_object_set_new(v, "allowed_origins", json_string(o->allowed_origins ? o->allowed_origins : ""));
    json_object_set_new(v, "max_body_bytes", json_integer((json_int_t)o->max_body_bytes));
    json_object_set_new(v, "max_connections", json_integer(o->max_connections));
    json_object_set_new(v, "idle_timeout", json_integer(o->idle_timeout_s));
    json_object_set_new(v, "shutdown_timeout", json_real(o->shutdown_timeout_s));
    json_object_set_new(v, "tokenizer_workers", json_integer(o->tokenizer_workers));
    json_object_set_new(v, "tokenizer_inline_bytes", json_integer((json_int_t)o->tokenizer_inline_bytes));
    json_object_set_new(v, "log_requests", json_boolean(o->log_requests));
    json_object_set_new(v, "otlp_traces_endpoint",
                        o->otlp_traces_endpoint ? json_string(o->otlp_traces_endpoint) : json_null());
    json_object_set_new(v, "has_tokenizer", json_boolean(s->tok != NULL));
    json_object_set_new(v, "has_chat_template", json_boolean(s->have_chat));
    server_reply_json(r, 200, v);
}

static void route_model_info(struct server *s, struct http_request *r) {
    server_reply_json(r, 200, json_pack("{s:s,s:s,s:b,s:i}", "model_path",
                                        s->opt->model_dir ? s->opt->model_dir : s->model_name, "served_model_name",
                                        s->model_name, "is_generation", 1, "context_length", s->context_length));
}

static void route_metrics(struct server *s, struct http_request *r) {
    http_server_responses(s->http, s->metrics.http_requests);
    s->metrics.slow_clients = http_server_slow_clients(s->http);
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
    {"/health_generate", "GET", route_health_generate, 1},
    {"/get_server_info", "GET", route_server_info, 0},
    {"/v1/models", "GET", route_models, 0},
    {"/get_model_info", "GET", route_model_info, 0},
    {"/metrics", "GET", route_metrics, 0},
    {"/v1/completions", "POST", route_completions, 0},
    {"/v1/chat/completions", "POST", route_chat_completions, 0},
    {"/generate", "POST", route_generate, 0},
    {"/tokenize", "POST", route_tokenize, 0},
    {"/detokenize", "POST", route_detokenize, 0},
    {"/v1/score", "POST", route_score, 0},
    {"/separate_reasoning", "POST", route_separate_reasoning, 0},
    {"/parse_function_call", "POST", route_parse_function_call, 0},
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

/* The API key, checked once the head is in: a client without it must not
 * get to send (or make us read) a body of up to --max-body-bytes. */
static int check_head(void *ctx, struct http_request *r) {
    struct server *s = ctx;
    size_t plen = strlen(r->path);
    while (plen > 1 && r->path[plen - 1] == '/') plen--;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strlen(routes[i].path) == plen && !strncmp(routes[i].path, r->path, plen) &&
            !strcmp(routes[i].method, r->method) && routes[i].open)
            return 0;
    if (authorized(s, r)) return 0;
    http_error_respond_headers(r, 401, "invalid_api_key", NULL, "WWW-Authenticate: Bearer\r\n",
                               "missing or invalid API key: send 'Authorization: Bearer <key>'");
    return 1;
}

static void on_trace_finish(void *arg, int status) { trace_req_end(arg, status); }

/* ---- CORS ------------------------------------------------------------------------ */

/* A header value we may echo: printable ASCII, bounded. */
static int echo_safe(const char *v, size_t max) {
    size_t n = 0;
    for (; v[n]; n++)
        if (n >= max || v[n] < 0x20 || v[n] > 0x7e) return 0;
    return n > 0;
}

/* --allowed-origins: a comma-separated list of origins, "*" for any, ""
 * for none (no CORS headers at all). */
static int origin_allowed(const struct server *s, const char *origin) {
    const char *list = s->opt->allowed_origins;
    if (!list || !echo_safe(origin, 512)) return 0;
    size_t olen = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *end = p;
        while (*end && *end != ',') end++;
        const char *e = end;
        while (e > p && e[-1] == ' ') e--;
        if ((e - p == 1 && *p == '*') || ((size_t)(e - p) == olen && !memcmp(p, origin, olen))) return 1;
        p = end;
    }
    return 0;
}

/* Like SGLang's CORS middleware (Starlette's, allowing credentials, every
 * method and header): the origin is echoed, never "*". Returns 1 when the
 * request was a preflight and has been answered. Preflights are answered
 * before authentication: browsers send no credentials on them. */
static int handle_cors(struct server *s, struct http_request *r) {
    const char *origin = http_header_get(r, "origin");
    int preflight = !strcmp(r->method, "OPTIONS") && origin && http_header_get(r, "access-control-request-method");
    if (!origin) return 0;
    if (!origin_allowed(s, origin)) {
        if (!preflight) return 0;
        http_error_respond(r, 400, "cors_origin_not_allowed", NULL,
                           "the origin is not allowed (--allowed-origins)");
        return 1;
    }
    char line[640];
    snprintf(line, sizeof line, "Access-Control-Allow-Origin: %s", origin);
    http_request_add_header(r, line);
    http_request_add_header(r, "Access-Control-Allow-Credentials: true");
    http_request_add_header(r, "Vary: Origin");
    if (!preflight) return 0;
    http_request_add_header(r, "Access-Control-Allow-Methods: DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
    const char *req_headers = http_header_get(r, "access-control-request-headers");
    if (req_headers && echo_safe(req_headers, 512)) {
        snprintf(line, sizeof line, "Access-Control-Allow-Headers: %s", req_headers);
        http_request_add_header(r, line);
    }
    http_request_add_header(r, "Access-Control-Max-Age: 600");
    http_respond(r, 200, "text/plain; charset=utf-8", "OK", 2, NULL);
    return 1;
}

static void handle(void *ctx, struct http_request *r) {
    struct server *s = ctx;
    size_t plen = strlen(r->path);
    while (plen > 1 && r->path[plen - 1] == '/') r->path[--plen] = 0; /* "/v1/models/" is "/v1/models" */
    const struct route *match = NULL;
    char allow[64] = "";
    static const struct route model_get = {"/v1/models/", "GET", route_model_get, 0};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(routes[i].path, r->path)) continue;
        if (!strcmp(routes[i].method, r->method))
            match = &routes[i];
        else
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "",
                     routes[i].method);
    }
    if (!strncmp(r->path, model_get.path, strlen(model_get.path))) {
        if (!strcmp(r->method, "GET")) match = &model_get;
        else snprintf(allow, sizeof allow, "GET");
    }
    if (log_enabled(LOG_LEVEL_DEBUG)) log_debug("%s %s (%zu bytes)", r->method, r->path, r->body.len);
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
    if (handle_cors(s, r)) return;
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
    if (s->have_chat) chat_template_needs_read(s->chat.source, &s->chat_needs);
    /* the names were checked by the command line */
    const char *tcp = s->opt->tool_call_parser;
    if (tcp && !strcmp(tcp, "auto")) {
        s->tool_format = s->have_chat ? tool_format_detect(s->chat.source) : TOOL_FORMAT_NONE;
        if (s->tool_format)
            log_info("tool calls: the %s format (from the chat template)", tool_format_name(s->tool_format));
        else log_warn("--tool-call-parser auto: the chat template writes no tool-call format kiln knows; "
                      "tool calls are not parsed");
    } else if (tcp && tool_format_from_name(tcp, &s->tool_format)) {
        s->tool_format = TOOL_FORMAT_NONE;
    }
    if (s->opt->reasoning_parser && reasoning_format_from_name(s->opt->reasoning_parser, &s->reasoning_format))
        s->reasoning_format = REASONING_NONE;
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
    s->so_cache = so_cache_create(64);
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
    struct http_server_options ho = {.host = o->host, .port = o->port, .listen_fd = o->listen_fd,
                                     .max_body_bytes = o->max_body_bytes, .max_connections = max_conns,
                                     .idle_timeout_s = o->idle_timeout_s, .head_timeout_s = o->head_timeout_s,
                                     .body_timeout_s = o->body_timeout_s, .on_head = check_head};
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
    so_cache_free(s->so_cache);
    if (s->base) event_base_free(s->base);
    free(s);
    return rc;
}
