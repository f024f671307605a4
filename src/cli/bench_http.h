/* bench_http.h — one HTTP/1.1 exchange over a non-blocking socket, driven
 * by the caller's poll() loop.
 *
 * A `struct http_conn` connects, sends one request (with
 * "Connection: close", as bench_serving's per-request aiohttp session does),
 * parses the status line and headers, and decodes the body (Content-Length,
 * chunked, or until the peer closes), handing body bytes to `on_body` with
 * the time they were read — the timestamps that TTFT and ITL are made of.
 * Only plain http:// is supported (benchmarks run next to the server).
 *
 *     http_conn_start(&c, &url, request, len, on_body, user, now, &err);
 *     loop: pfd.fd = c.fd; pfd.events = http_conn_events(&c); poll(...);
 *           r = http_conn_step(&c, pfd.revents, now);  // 1 done, -1 failed
 *     http_conn_close(&c);
 */
#ifndef KILN_CLI_BENCH_HTTP_H
#define KILN_CLI_BENCH_HTTP_H

#include <stddef.h>
#include <sys/socket.h>

#include "base/buf.h"

struct kiln_error;

struct http_url {
    char host[256];
    char port[16];
    char prefix[512]; /* path before the API path, without a trailing '/' */
    struct sockaddr_storage addr;
    socklen_t addr_len;
};

/* Parses http://host[:port][/prefix] and resolves the host (blocking, once). */
int http_url_parse(struct http_url *u, const char *url, struct kiln_error *err);

/* A complete request: method, prefix + path, Host, JSON body. The
 * OPENAI_API_KEY environment variable, when set, becomes a Bearer token as
 * in bench_serving. malloc'd; *len receives its size. */
char *http_build_request(const struct http_url *u, const char *method, const char *path, const char *body,
                         size_t body_len, size_t *len);

enum http_phase {
    HTTP_CONNECTING = 0,
    HTTP_SENDING,
    HTTP_HEAD,
    HTTP_BODY,
    HTTP_DONE,
    HTTP_FAILED,
};

typedef void (*http_body_fn)(void *user, const char *data, size_t n, double now);

struct http_conn {
    int fd;
    enum http_phase phase;
    char *out;            /* the request */
    size_t out_len, out_off;
    struct buf head;      /* status line + headers while in HTTP_HEAD */
    int status;           /* HTTP status code */
    long long content_length; /* -1 when not given */
    int chunked;
    int chunk_phase;      /* chunked decoder state (bench_http.c) */
    long long chunk_left;
    char line[64];        /* partial chunk-size line */
    size_t line_len;
    long long body_seen;
    http_body_fn on_body;
    void *user;
    char error[256];
};

/* Begins connecting; takes ownership of `request` (malloc'd), also on
 * failure. Returns -1 (message in err, c->fd == -1) only when no socket
 * could be made; a refused connection shows up as phase HTTP_FAILED, now or
 * at a later step. */
int http_conn_start(struct http_conn *c, const struct http_url *u, char *request, size_t len, http_body_fn on_body,
                    void *user, struct kiln_error *err);
/* poll() events the connection waits for. */
short http_conn_events(const struct http_conn *c);
/* Advances on poll() results: 0 in progress, 1 the response is complete,
 * -1 failed (c->error says why). */
int http_conn_step(struct http_conn *c, short revents, double now);
void http_conn_close(struct http_conn *c);

#endif
