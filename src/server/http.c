/* http.c — HTTP/1.1 connections: accept, parse, respond, stream, close.
 * See http.h for the contract. The parser is strict where leniency invites
 * request smuggling (Content-Length together with Transfer-Encoding,
 * conflicting lengths, folded headers) and answers every malformed request
 * with a JSON error before closing the connection. */
#include "server/http.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "server/http_error.h"

enum {
    MAX_HEADERS = 100,
    CHUNK_LINE_MAX = 1024,
    /* a client that pipelines this much while we answer is not a client */
    PIPELINE_MAX = 1 << 20,
    CHUNK_DIGITS_MAX = 16, /* hex digits of a chunk size, leading zeros included */
    WRITE_TIMEOUT_S = 120,
    HEAD_TIMEOUT_S = 30,
    BODY_TIMEOUT_S = 300,
};
#define OUTPUT_MAX_DEFAULT ((size_t)8 << 20)

enum conn_state { CONN_HEADERS, CONN_BODY, CONN_HANDLING, CONN_STREAMING, CONN_CLOSING };
enum chunk_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_CRLF, CHUNK_TRAILER };

struct http_conn {
    struct http_server *srv;
    struct bufferevent *bev;
    enum conn_state state;
    struct http_request req;
    int have_request_line;
    size_t header_bytes;
    int chunked;
    enum chunk_state chunk_state;
    size_t content_length, chunk_left;
    int keep_alive;    /* for the response being written */
    int stream_chunked; /* chunked framing of the current streamed response */
    int rejecting;     /* over the connection limit: answer 503 and close */
    int force_close;   /* the byte stream can no longer be trusted */
    int in_process;    /* inside conn_process (re-entrancy guard) */
    int started_before_stop; /* the current request's bytes had arrived when listening stopped */
    int head_started;  /* bytes of the next request have arrived: its head deadline runs */
    int read_paused;   /* too much unsent output: the next request waits unread */
    int cut;           /* a stream whose client stopped reading: closing at the next turn */
    struct event *timer; /* the idle / head / body deadline, and the deferred close of a cut stream */
    void (*on_close)(void *);
    void *close_arg;
    void (*on_finish)(void *, int); /* http_request_on_finish */
    void *finish_arg;
    int status;         /* of the response being written */
    struct buf extra_head; /* http_request_add_header lines, CRLF-terminated */
    struct http_conn *prev, *next;
};

struct http_server {
    struct event_base *base;
    struct evconnlistener *listener;
    struct http_server_options opt;
    http_handler handler;
    void *ctx;
    struct http_conn *conns;
    int n_conns, n_rejecting;
    int port;
    long responses[6]; /* by status class */
    long slow_clients; /* streams cut */
    struct event *accept_retry;
    int stopped; /* no longer listening */
};

static void conn_process(struct http_conn *c);

static const char *http_status_text(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Server Error";
    }
}

int http_secure_equal(const char *a, size_t alen, const char *b, size_t blen) {
    /* every byte of b is looked at whatever a holds, so timing reveals only b's length */
    unsigned char diff = (unsigned char)(alen != blen);
    for (size_t i = 0; i < blen; i++) diff |= (unsigned char)((i < alen ? a[i] : 0) ^ b[i]);
    return diff == 0;
}

const char *http_header_get(const struct http_request *r, const char *name) {
    for (int i = 0; i < r->n_headers; i++)
        if (!strcasecmp(r->headers[i].name, name)) return r->headers[i].value;
    return NULL;
}

/* ---- connection life --------------------------------------------------- */

/* The request is over: tell whoever asked (status 0: no response went out). */
static void finish_request(struct http_conn *c, int status) {
    if (!c->on_finish) return;
    void (*cb)(void *, int) = c->on_finish;
    c->on_finish = NULL;
    cb(c->finish_arg, status);
}

static void request_reset(struct http_conn *c) {
    struct http_request *r = &c->req;
    finish_request(c, 0);
    buf_free(&c->extra_head);
    for (int i = 0; i < r->n_headers; i++) free(r->headers[i].name), free(r->headers[i].value);
    free(r->headers);
    free(r->path);
    free(r->query);
    buf_free(&r->body);
    memset(r, 0, sizeof *r);
    r->conn = c;
    c->have_request_line = 0;
    c->header_bytes = 0;
    c->chunked = 0;
    c->content_length = c->chunk_left = 0;
    c->chunk_state = CHUNK_SIZE;
    c->on_close = NULL;
    c->close_arg = NULL;
    c->stream_chunked = 0;
    c->started_before_stop = 0;
}

static void conn_free(struct http_conn *c) {
    struct http_server *s = c->srv;
    if (c->on_close) {
        void (*cb)(void *) = c->on_close;
        c->on_close = NULL;
        cb(c->close_arg);
    }
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->rejecting) s->n_rejecting--;
    else s->n_conns--;
    bufferevent_free(c->bev);
    if (c->timer) event_free(c->timer);
    request_reset(c);
    free(c);
}

/* Deadlines are overall, not per read: bufferevent's read timeout restarts
 * on every byte, so one byte every few seconds would hold a connection (and
 * a --max-connections slot) forever. */
static void arm_deadline(struct http_conn *c, int seconds) {
    if (c->cut) return;
    if (seconds <= 0) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {seconds, 0};
    evtimer_add(c->timer, &tv);
}

/* Waiting for the next request: the idle deadline, or the head's when
 * its bytes are already here. */
static void await_request(struct http_conn *c) {
    c->head_started = evbuffer_get_length(bufferevent_get_input(c->bev)) > 0;
    arm_deadline(c, c->head_started ? c->srv->opt.head_timeout_s : c->srv->opt.idle_timeout_s);
}

/* ---- writing ------------------------------------------------------------- */

/* Whether a Connection header's token list (RFC 9110 §7.6.1: "a, b",
 * any case, optional whitespace) holds `token`. */
static int has_token(const char *h, const char *token) {
    size_t tn = strlen(token);
    while (h && *h) {
        while (*h == ' ' || *h == '\t' || *h == ',') h++;
        const char *start = h;
        while (*h && *h != ',') h++;
        const char *end = h;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if ((size_t)(end - start) == tn && !strncasecmp(start, token, tn)) return 1;
    }
    return 0;
}

static int want_keep_alive(const struct http_conn *c) {
    /* every Connection header counts (a list may be split across lines) */
    int close = 0, keep = 0;
    for (int i = 0; i < c->req.n_headers; i++) {
        if (strcmp(c->req.headers[i].name, "connection")) continue;
        close |= has_token(c->req.headers[i].value, "close");
        keep |= has_token(c->req.headers[i].value, "keep-alive");
    }
    if (close) return 0;
    return c->req.minor_version == 0 ? keep : 1;
}

static void write_head(struct http_conn *c, int status, const char *ctype, long content_length,
                       const char *extra) {
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (status >= 100 && status < 600) c->srv->responses[status / 100]++;
    evbuffer_add_printf(out, "HTTP/1.%d %d %s\r\nServer: kiln\r\n", c->req.minor_version == 0 ? 0 : 1,
                        status, http_status_text(status));
    if (ctype) evbuffer_add_printf(out, "Content-Type: %s\r\n", ctype);
    if (content_length >= 0) evbuffer_add_printf(out, "Content-Length: %ld\r\n", content_length);
    else if (c->stream_chunked) evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
    evbuffer_add_printf(out, "Connection: %s\r\n", c->keep_alive ? "keep-alive" : "close");
    if (c->extra_head.len) evbuffer_add(out, c->extra_head.data, c->extra_head.len);
    if (extra) evbuffer_add(out, extra, strlen(extra));
    c->status = status;
    evbuffer_add(out, "\r\n", 2);
}

/* After a complete response: next request, or close once written. */
static void response_done(struct http_conn *c) {
    finish_request(c, c->status);
    if (!c->keep_alive) {
        c->state = CONN_CLOSING;
        c->on_close = NULL;
        bufferevent_disable(c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            /* nothing left to write: close at the next turn of the loop via the write callback */
            bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
        }
        return;
    }
    request_reset(c);
    c->state = CONN_HEADERS;
    await_request(c);
    bufferevent_enable(c->bev, EV_READ);
    if (!c->in_process && evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) conn_process(c);
}

static int response_allowed(const struct http_request *r) {
    struct http_conn *c = r->conn;
    return c->state == CONN_HANDLING || c->state == CONN_HEADERS || c->state == CONN_BODY;
}

void http_respond(struct http_request *r, int status, const char *ctype, const char *body, size_t len,
                  const char *extra) {
    struct http_conn *c = r->conn;
    KILN_ASSERT(response_allowed(r));
    /* a request we did not finish reading leaves the stream out of sync */
    c->keep_alive = !c->force_close && c->state == CONN_HANDLING && status != 413 && want_keep_alive(c);
    c->on_close = NULL;
    write_head(c, status, ctype, (long)len, extra);
    if (len) bufferevent_write(c->bev, body, len);
    response_done(c);
}

void http_stream_begin(struct http_request *r, int status, const char *ctype, const char *extra) {
    struct http_conn *c = r->conn;
    KILN_ASSERT(c->state == CONN_HANDLING);
    c->stream_chunked = c->req.minor_version >= 1;
    c->keep_alive = c->stream_chunked && !c->force_close && want_keep_alive(c);
    c->state = CONN_STREAMING;
    write_head(c, status, ctype, -1, extra);
}

void http_stream_write(struct http_request *r, const char *data, size_t len) {
    struct http_conn *c = r->conn;
    KILN_ASSERT(c->state == CONN_STREAMING);
    if (!len || c->cut) return;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) + len > c->srv->opt.max_output_bytes) {
        /* The client stopped reading: holding the rest of the stream would
         * grow without bound. Cut it at the next turn of the loop (the
         * caller may be in the middle of its own bookkeeping); the close
         * callback then aborts the generation. */
        c->cut = 1;
        c->srv->slow_clients++;
        log_warn("%s %s: the client stopped reading (%zu bytes unsent); closing the stream", c->req.method,
                 c->req.path, evbuffer_get_length(out));
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
        struct timeval now = {0, 0};
        evtimer_add(c->timer, &now);
        return;
    }
    if (c->stream_chunked) evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    if (c->stream_chunked) evbuffer_add(out, "\r\n", 2);
}

void http_stream_end(struct http_request *r) {
    struct http_conn *c = r->conn;
    KILN_ASSERT(c->state == CONN_STREAMING);
    if (c->cut) { /* the close is already on its way */
        c->on_close = NULL;
        finish_request(c, 0);
        return;
    }
    if (c->stream_chunked) evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
    c->on_close = NULL;
    response_done(c);
}

void http_request_close_after(struct http_request *r) { r->conn->force_close = 1; }

int http_request_cut(const struct http_request *r) { return r->conn->cut; }

void http_request_on_finish(struct http_request *r, void (*cb)(void *, int), void *arg) {
    r->conn->on_finish = cb;
    r->conn->finish_arg = arg;
}

void http_request_add_header(struct http_request *r, const char *line) {
    buf_puts(&r->conn->extra_head, line);
    buf_puts(&r->conn->extra_head, "\r\n");
}

void http_request_on_close(struct http_request *r, void (*cb)(void *), void *arg) {
    r->conn->on_close = cb;
    r->conn->close_arg = arg;
}

/* Protocol errors: answer and close, the byte stream can no longer be trusted. */
static void protocol_error(struct http_conn *c, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void protocol_error(struct http_conn *c, int status, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->force_close = 1;
    http_error_respond(&c->req, status, code, NULL, "%s", msg);
}

/* ---- parsing ------------------------------------------------------------- */

static int is_tchar(int ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int parse_request_line(struct http_conn *c, char *line) {
    struct http_request *r = &c->req;
    char *sp1 = strchr(line, ' ');
    if (!sp1 || sp1 == line || (size_t)(sp1 - line) >= sizeof r->method) goto bad;
    for (char *p = line; p < sp1; p++)
        if (!is_tchar((unsigned char)*p)) goto bad;
    char *target = sp1 + 1, *sp2 = strchr(target, ' ');
    if (!sp2 || sp2 == target || strchr(sp2 + 1, ' ')) goto bad;
    memcpy(r->method, line, (size_t)(sp1 - line));
    r->method[sp1 - line] = 0;
    const char *ver = sp2 + 1;
    if (!strcmp(ver, "HTTP/1.1")) r->minor_version = 1;
    else if (!strcmp(ver, "HTTP/1.0")) r->minor_version = 0;
    else if (!strncmp(ver, "HTTP/", 5)) {
        r->minor_version = 1;
        protocol_error(c, 505, "http_version_not_supported", "HTTP version '%s' is not supported", ver);
        return -1;
    } else goto bad;
    *sp2 = 0;
    for (char *p = target; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) goto bad;
    if (target[0] != '/') goto bad;
    char *q = strchr(target, '?');
    r->path = xstrndup(target, q ? (size_t)(q - target) : strlen(target));
    r->query = xstrdup(q ? q + 1 : "");
    r->t_start = time_now();
    c->have_request_line = 1;
    return 0;
bad:
    r->minor_version = 1;
    protocol_error(c, 400, "bad_request", "malformed HTTP request line");
    return -1;
}

static int parse_header(struct http_conn *c, char *line) {
    struct http_request *r = &c->req;
    if (line[0] == ' ' || line[0] == '\t') {
        protocol_error(c, 400, "bad_request", "folded header lines are not allowed");
        return -1;
    }
    char *colon = strchr(line, ':');
    if (!colon || colon == line) goto bad;
    for (char *p = line; p < colon; p++)
        if (!is_tchar((unsigned char)*p)) goto bad;
    if (r->n_headers >= MAX_HEADERS) {
        protocol_error(c, 431, "headers_too_large", "more than %d header fields", MAX_HEADERS);
        return -1;
    }
    char *v = colon + 1, *end = v + strlen(v);
    while (*v == ' ' || *v == '\t') v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    for (char *p = v; p < end; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t') goto bad;
    r->headers = xrealloc(r->headers, (size_t)(r->n_headers + 1) * sizeof *r->headers);
    struct http_header *h = &r->headers[r->n_headers++];
    h->name = xstrndup(line, (size_t)(colon - line));
    for (char *p = h->name; *p; p++)
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    h->value = xstrndup(v, (size_t)(end - v));
    return 0;
bad:
    protocol_error(c, 400, "bad_request", "malformed HTTP header line");
    return -1;
}

/* Decides how the body is framed once the headers are in. */
static int begin_body(struct http_conn *c) {
    struct http_request *r = &c->req;
    const char *te = NULL, *cl = NULL;
    for (int i = 0; i < r->n_headers; i++) {
        const struct http_header *h = &r->headers[i];
        if (!strcmp(h->name, "transfer-encoding")) {
            if (te) {
                protocol_error(c, 400, "bad_request", "repeated Transfer-Encoding header");
                return -1;
            }
            te = h->value;
        } else if (!strcmp(h->name, "content-length")) {
            if (cl && strcmp(cl, h->value)) {
                protocol_error(c, 400, "bad_request", "conflicting Content-Length headers");
                return -1;
            }
            cl = h->value;
        }
    }
    if (te && cl) {
        protocol_error(c, 400, "bad_request", "both Content-Length and Transfer-Encoding were given");
        return -1;
    }
    size_t max = c->srv->opt.max_body_bytes;
    if (te) {
        if (strcasecmp(te, "chunked")) {
            protocol_error(c, 501, "not_implemented", "Transfer-Encoding '%s' is not supported", te);
            return -1;
        }
        c->chunked = 1;
        c->chunk_state = CHUNK_SIZE;
    } else if (cl) {
        uint64_t v = 0;
        if (!*cl || strlen(cl) > 18) goto bad_cl;
        for (const char *p = cl; *p; p++) {
            if (*p < '0' || *p > '9') goto bad_cl;
            v = v * 10 + (uint64_t)(*p - '0');
        }
        if (v > max) {
            protocol_error(c, 413, "payload_too_large",
                           "the request body of %llu bytes exceeds the limit of %zu bytes (--max-body-bytes)",
                           (unsigned long long)v, max);
            return -1;
        }
        c->content_length = (size_t)v;
    }
    if ((c->chunked || c->content_length) && !c->rejecting && c->srv->opt.on_head &&
        c->srv->opt.on_head(c->srv->ctx, r))
        return -1; /* answered before the body: the connection closes */
    const char *expect = http_header_get(r, "expect");
    if (expect && !strcasecmp(expect, "100-continue") && r->minor_version >= 1 &&
        (c->chunked || c->content_length) && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0)
        evbuffer_add_printf(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n");
    buf_reserve(&r->body, c->content_length); /* chunked bodies grow as they come */
    c->state = CONN_BODY;
    arm_deadline(c, c->srv->opt.body_timeout_s);
    return 0;
bad_cl:
    protocol_error(c, 400, "bad_request", "invalid Content-Length '%s'", cl);
    return -1;
}

static void body_append(struct http_conn *c, struct evbuffer *in, size_t n) {
    evbuffer_remove(in, buf_grow(&c->req.body, n), n);
}

int http_parse_chunk_size(const char *line, size_t n, unsigned long long *out) {
    /* RFC 9112 §7.1: chunk-size = 1*HEXDIG, then nothing or BWS ";" chunk-ext.
     * No sign, no "0x", no leading space: strtoull's leniency is a
     * request-smuggling risk when a proxy in front reads the size otherwise. */
    size_t i = 0;
    unsigned long long v = 0;
    for (; i < n; i++) {
        int ch = (unsigned char)line[i], d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
        else break;
        if (i >= CHUNK_DIGITS_MAX) return -1;
        v = v << 4 | (unsigned)d;
    }
    if (i == 0) return -1;
    size_t j = i;
    while (j < n && (line[j] == ' ' || line[j] == '\t')) j++;
    if (j < n && line[j] != ';') return -1;
    if (j == n && j != i) return -1; /* whitespace only before an extension */
    for (; j < n; j++)
        if (((unsigned char)line[j] < 0x20 && line[j] != '\t') || line[j] == 0x7f) return -1;
    *out = v;
    return 0;
}

/* Returns 1 when the body is complete, 0 when more is needed, -1 after an error reply. */
static int read_chunked(struct http_conn *c, struct evbuffer *in) {
    size_t max = c->srv->opt.max_body_bytes;
    for (;;) {
        size_t n;
        char *line;
        switch (c->chunk_state) {
        case CHUNK_SIZE:
        case CHUNK_DATA_CRLF:
        case CHUNK_TRAILER:
            line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
            if (!line) {
                if (evbuffer_get_length(in) > CHUNK_LINE_MAX) {
                    protocol_error(c, 400, "bad_request", "malformed chunked body");
                    return -1;
                }
                return 0;
            }
            c->header_bytes += n;
            if (c->chunk_state == CHUNK_SIZE) {
                unsigned long long sz;
                int ok = http_parse_chunk_size(line, n, &sz) == 0;
                free(line);
                if (!ok) {
                    protocol_error(c, 400, "bad_request", "malformed chunk size in chunked body");
                    return -1;
                }
                if (sz > max || c->req.body.len + sz > max) {
                    protocol_error(c, 413, "payload_too_large",
                                   "the request body exceeds the limit of %zu bytes (--max-body-bytes)", max);
                    return -1;
                }
                c->chunk_left = (size_t)sz;
                c->chunk_state = sz ? CHUNK_DATA : CHUNK_TRAILER;
            } else if (c->chunk_state == CHUNK_DATA_CRLF) {
                int ok = n == 0;
                free(line);
                if (!ok) {
                    protocol_error(c, 400, "bad_request", "malformed chunked body");
                    return -1;
                }
                c->chunk_state = CHUNK_SIZE;
            } else {
                free(line);
                if (n == 0) return 1;
                if (c->header_bytes > c->srv->opt.max_header_bytes) {
                    protocol_error(c, 431, "headers_too_large", "chunked trailer too large");
                    return -1;
                }
            }
            break;
        case CHUNK_DATA: {
            size_t have = evbuffer_get_length(in);
            if (!have) return 0;
            size_t take = have < c->chunk_left ? have : c->chunk_left;
            body_append(c, in, take);
            c->chunk_left -= take;
            if (c->chunk_left) return 0;
            c->chunk_state = CHUNK_DATA_CRLF;
            break;
        }
        }
    }
}

static void dispatch(struct http_conn *c) {
    c->state = CONN_HANDLING;
    /* no deadline while we work, but reading stays on to see the client leave */
    arm_deadline(c, 0);
    if (c->rejecting) {
        c->force_close = 1;
        http_error_respond(&c->req, 503, "too_many_connections", NULL,
                           "too many open connections (--max-connections %d)", c->srv->opt.max_connections);
        return;
    }
    c->srv->handler(c->srv->ctx, &c->req);
}

static void conn_process(struct http_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t max_head = c->srv->opt.max_header_bytes;
    c->in_process = 1;
    for (;;) {
        if (c->state == CONN_HEADERS) {
            if (!c->have_request_line && !c->header_bytes &&
                evbuffer_get_length(bufferevent_get_output(c->bev)) > c->srv->opt.max_output_bytes) {
                /* answers pile up unread (pipelining without reading): leave
                 * the next request in the socket until they drain; the write
                 * timeout ends a client that never reads */
                c->read_paused = 1;
                bufferevent_disable(c->bev, EV_READ);
                arm_deadline(c, 0);
                break;
            }
            if (!c->head_started && evbuffer_get_length(in)) {
                c->head_started = 1;
                arm_deadline(c, c->srv->opt.head_timeout_s);
            }
            size_t n;
            char *line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
            if (!line) {
                if (c->header_bytes + evbuffer_get_length(in) > max_head) {
                    if (!c->have_request_line) c->req.minor_version = 1;
                    protocol_error(c, 431, "headers_too_large",
                                   "the request head exceeds %zu bytes", max_head);
                }
                break;
            }
            c->header_bytes += n + 2;
            int rc = 0;
            if (memchr(line, 0, n)) {
                /* C strings would end at it: "Bearer key\0junk" would read as "Bearer key" */
                if (!c->have_request_line) c->req.minor_version = 1;
                protocol_error(c, 400, "bad_request", "a NUL byte in the request head");
                rc = -1;
            } else if (c->header_bytes > max_head) {
                if (!c->have_request_line) c->req.minor_version = 1;
                protocol_error(c, 431, "headers_too_large", "the request head exceeds %zu bytes", max_head);
                rc = -1;
            } else if (!c->have_request_line) {
                if (n > 0) rc = parse_request_line(c, line);
            } else if (n == 0) {
                rc = begin_body(c);
            } else {
                rc = parse_header(c, line);
            }
            free(line);
            if (rc) break;
        } else if (c->state == CONN_BODY) {
            int done;
            if (c->chunked) {
                done = read_chunked(c, in);
                if (done < 0) break;
            } else {
                size_t want = c->content_length - c->req.body.len, have = evbuffer_get_length(in);
                body_append(c, in, have < want ? have : want);
                done = c->req.body.len == c->content_length;
            }
            if (!done) break;
            dispatch(c);
        } else {
            if (evbuffer_get_length(in) > PIPELINE_MAX) {
                /* stop reading; the connection ends once the answer is out */
                bufferevent_disable(c->bev, EV_READ);
            }
            break;
        }
    }
    c->in_process = 0;
}

static void on_read(struct bufferevent *bev, void *arg) {
    (void)bev;
    conn_process(arg);
}

static void on_write(struct bufferevent *bev, void *arg) {
    struct http_conn *c = arg;
    size_t left = evbuffer_get_length(bufferevent_get_output(bev));
    if (c->state == CONN_CLOSING && left == 0) {
        conn_free(c);
    } else if (c->read_paused && left <= c->srv->opt.max_output_bytes / 2) {
        c->read_paused = 0;
        bufferevent_enable(c->bev, EV_READ);
        await_request(c);
        if (!c->in_process) conn_process(c);
    }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    (void)fd, (void)what;
    if (c->cut || (c->state == CONN_HEADERS && !c->head_started)) {
        conn_free(c); /* a cut stream, or a keep-alive connection left idle */
        return;
    }
    if (c->state == CONN_HEADERS) {
        if (!c->have_request_line) c->req.minor_version = 1;
        protocol_error(c, 408, "request_timeout", "the request head did not arrive within %d s",
                       c->srv->opt.head_timeout_s);
    } else if (c->state == CONN_BODY) {
        protocol_error(c, 408, "request_timeout", "the request body did not arrive within %d s (%zu bytes came)",
                       c->srv->opt.body_timeout_s, c->req.body.len);
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg) {
    struct http_conn *c = arg;
    (void)bev;
    if ((what & BEV_EVENT_EOF) && (what & BEV_EVENT_READING) && c->state == CONN_BODY) {
        /* a half-closed client can still read why we gave up */
        size_t got = c->req.body.len;
        if (c->chunked)
            protocol_error(c, 400, "truncated_body", "the chunked request body ended before its last chunk");
        else
            protocol_error(c, 400, "truncated_body",
                           "the request body ended after %zu of the %zu bytes announced by Content-Length",
                           got, c->content_length);
        return;
    }
    if (c->state == CONN_CLOSING && !(what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
        return; /* EOF while our last answer is still going out */
    conn_free(c);
}

/* ---- listening ------------------------------------------------------------ */

int http_server_adopt(struct http_server *s, int fd, int rejecting) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on non-TCP sockets */
    evutil_make_socket_nonblocking(fd);
    struct http_conn *c = xcalloc(1, sizeof *c);
    c->srv = s;
    c->rejecting = rejecting;
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (!c->bev) {
        evutil_closesocket(fd);
        free(c);
        return -1;
    }
    c->timer = evtimer_new(s->base, on_deadline, c);
    if (!c->timer) {
        bufferevent_free(c->bev);
        free(c);
        return -1;
    }
    request_reset(c);
    c->state = CONN_HEADERS;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    if (rejecting) s->n_rejecting++;
    else s->n_conns++;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    struct timeval wt = {WRITE_TIMEOUT_S, 0};
    bufferevent_set_timeouts(c->bev, NULL, &wt);
    /* on_write also runs when the output drains to half the bound (paused reading resumes) */
    bufferevent_setwatermark(c->bev, EV_WRITE, s->opt.max_output_bytes / 2, 0);
    await_request(c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return 0;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg) {
    struct http_server *s = arg;
    (void)l, (void)sa, (void)salen;
    int rejecting = s->opt.max_connections > 0 && s->n_conns >= s->opt.max_connections;
    if (rejecting && s->n_rejecting >= 64) {
        evutil_closesocket(fd); /* even the polite 503 has a bound */
        return;
    }
    http_server_adopt(s, fd, rejecting);
}

static void on_accept_retry(evutil_socket_t fd, short what, void *arg) {
    struct http_server *s = arg;
    (void)fd, (void)what;
    if (s->listener) evconnlistener_enable(s->listener);
}

/* Out of file descriptors (or another accept failure): the listening socket
 * stays readable, so accepting again at once would spin. Pause a little. */
static void on_accept_error(struct evconnlistener *l, void *arg) {
    struct http_server *s = arg;
    int e = EVUTIL_SOCKET_ERROR();
    log_warn("accept: %s; pausing new connections for 100 ms", evutil_socket_error_to_string(e));
    evconnlistener_disable(l);
    struct timeval tv = {0, 100000};
    if (!s->accept_retry) s->accept_retry = evtimer_new(s->base, on_accept_retry, s);
    if (s->accept_retry) evtimer_add(s->accept_retry, &tv);
}

int http_server_create(struct http_server **out, struct event_base *base, const struct http_server_options *o,
                       http_handler handler, void *ctx, struct kiln_error *err) {
    struct http_server *s = xcalloc(1, sizeof *s);
    *out = NULL;
    s->base = base;
    s->opt = *o;
    if (!s->opt.max_header_bytes) s->opt.max_header_bytes = 64 << 10;
    if (!s->opt.head_timeout_s) s->opt.head_timeout_s = HEAD_TIMEOUT_S;
    if (!s->opt.body_timeout_s) s->opt.body_timeout_s = BODY_TIMEOUT_S;
    if (!s->opt.max_output_bytes) s->opt.max_output_bytes = OUTPUT_MAX_DEFAULT;
    s->handler = handler;
    s->ctx = ctx;
    if (o->port < 0) { /* no listener: connections come through http_server_adopt */
        *out = s;
        return 0;
    }
    if (o->listen_fd > 0) { /* bound and listening already: backlog 0 */
        evutil_make_socket_nonblocking(o->listen_fd);
        s->listener = evconnlistener_new(base, on_accept, s, LEV_OPT_CLOSE_ON_FREE, 0, o->listen_fd);
        if (!s->listener) {
            kiln_errorf(err, "cannot serve the listening socket: %s", strerror(errno));
            evutil_closesocket(o->listen_fd);
            goto fail;
        }
        goto listening;
    }
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char spec[300];
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    snprintf(spec, sizeof spec, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);
    /* the host alone: libevent refuses port 0 in "host:port" */
    if (evutil_parse_sockaddr_port(host, (struct sockaddr *)&ss, &sl)) {
        kiln_errorf(err, "--host: '%s' is not a numeric IPv4 or IPv6 address", host);
        goto fail;
    }
    if (ss.ss_family == AF_INET6) ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)o->port);
    else ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)o->port);
    s->listener = evconnlistener_new_bind(base, on_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                          (struct sockaddr *)&ss, sl);
    if (!s->listener) {
        kiln_errorf(err, "cannot listen on %s: %s", spec, strerror(errno));
        goto fail;
    }
listening:
    evconnlistener_set_error_cb(s->listener, on_accept_error);
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&bound, &bl);
    s->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = s;
    return 0;
fail:
    http_server_free(s);
    return -1;
}

/* Bytes of a request have reached us: parsed, buffered, or still in the
 * kernel's receive queue. */
static int request_begun(const struct http_conn *c) {
    if (c->state == CONN_BODY) return 1;
    if (c->state != CONN_HEADERS) return 0;
    if (c->header_bytes || evbuffer_get_length(bufferevent_get_input(c->bev))) return 1;
    int queued = 0;
    return ioctl(bufferevent_getfd(c->bev), FIONREAD, &queued) == 0 && queued > 0;
}

void http_server_stop_listening(struct http_server *s) {
    if (!s) return;
    if (s->listener) {
        /* the connections the kernel completed but we had not accepted yet
         * are clients that sent in time: take them in before closing */
        evutil_socket_t lfd = evconnlistener_get_fd(s->listener);
        for (int i = 0; i < 4096; i++) {
            evutil_socket_t fd = accept(lfd, NULL, NULL);
            if (fd < 0) break;
            int rejecting = s->opt.max_connections > 0 && s->n_conns >= s->opt.max_connections;
            if (rejecting && s->n_rejecting >= 64) evutil_closesocket(fd);
            else http_server_adopt(s, fd, rejecting);
        }
        evconnlistener_free(s->listener);
        s->listener = NULL;
    }
    if (s->stopped) return;
    s->stopped = 1;
    for (struct http_conn *c = s->conns; c; c = c->next)
        if (!c->rejecting && request_begun(c)) c->started_before_stop = 1;
}

int http_request_started_before_stop(const struct http_request *r) {
    return !r->conn->srv->stopped || r->conn->started_before_stop;
}

int http_server_requests_arriving(const struct http_server *s) {
    int n = 0;
    for (const struct http_conn *c = s->conns; c; c = c->next)
        if (c->started_before_stop && (c->state == CONN_HEADERS || c->state == CONN_BODY)) n++;
    return n;
}

void http_server_refuse_arriving(struct http_server *s) {
    for (struct http_conn *c = s->conns, *next; c; c = next) {
        next = c->next; /* answering may free nothing now, but stay safe */
        if (!c->started_before_stop || (c->state != CONN_HEADERS && c->state != CONN_BODY)) continue;
        c->started_before_stop = 0;
        if (!c->have_request_line) c->req.minor_version = 1;
        protocol_error(c, 503, "shutting_down", "the server is shutting down");
    }
}

void http_server_free(struct http_server *s) {
    if (!s) return;
    if (s->listener) evconnlistener_free(s->listener);
    while (s->conns) conn_free(s->conns);
    if (s->accept_retry) event_free(s->accept_retry);
    free(s);
}

int http_server_port(const struct http_server *s) { return s->port; }
long http_server_slow_clients(const struct http_server *s) { return s->slow_clients; }
int http_server_connections(const struct http_server *s) { return s->n_conns + s->n_rejecting; }

void http_server_responses(const struct http_server *s, long out[6]) {
    memcpy(out, s->responses, sizeof s->responses);
}

int http_server_pending_output(const struct http_server *s) {
    int n = 0;
    for (const struct http_conn *c = s->conns; c; c = c->next)
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) n++;
    return n;
}
