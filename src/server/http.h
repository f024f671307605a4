/* http.h — a small HTTP/1.1 server on libevent bufferevents, for the API.
 *
 * It owns the listening socket, the connections and the parsing of requests
 * (request line, headers, Content-Length or chunked bodies), and enforces the
 * limits a public endpoint needs: header size, body size (413 before the body
 * is read), connection count (503 at accept), deadlines for a request's head
 * and body as a whole (a byte now and then does not extend them: 408), and
 * the output each connection may hold unsent (reading pauses behind it; a
 * stream to a client that stopped reading is cut). Everything runs on one
 * event loop thread; no call here blocks.
 *
 * evhttp is not used because it answers limits and truncated bodies with its
 * own HTML pages, cannot bound connections in libevent 2.1, and reports a
 * client that goes away only through per-connection callbacks that fire after
 * the request object is freed.
 *
 * A handler gets a `struct http_request` and must eventually answer it with
 * http_respond, or with http_stream_begin / _write / _end; it may do so later
 * (after engine events), from the loop thread. If the client disconnects first,
 * the close callback (http_request_on_close) runs and the request is freed
 * right after: the handler must forget it then. Requests on one connection
 * are handled one at a time (pipelined requests wait in the input buffer).
 */
#ifndef KILN_SERVER_HTTP_H
#define KILN_SERVER_HTTP_H

#include <stddef.h>

#include "base/buf.h"

struct event_base;
struct kiln_error;
struct http_server;
struct http_conn;

struct http_header {
    char *name; /* lower case */
    char *value;
};

struct http_request {
    struct http_conn *conn;
    char method[16];
    char *path;  /* without the query string */
    char *query; /* after '?', or "" */
    int minor_version;
    struct http_header *headers;
    int n_headers;
    struct buf body; /* data is NUL-terminated for convenience; may contain NULs */
    double t_start; /* monotonic seconds when the request line arrived */
    void *trace;    /* the handler's per-request state for tracing (http.c never reads it) */
};

typedef void (*http_handler)(void *ctx, struct http_request *req);

struct http_server_options {
    const char *host;
    int port;              /* 0 picks a free port (see http_server_port); < 0: no listener */
    int listen_fd;         /* > 0: a bound, listening socket to serve instead (taken over) */
    size_t max_body_bytes; /* larger bodies get 413 */
    size_t max_header_bytes;
    int max_connections; /* more get 503 at accept; 0 = unbounded */
    int idle_timeout_s;  /* keep-alive: the wait for a request's first byte (0: none) */
    int head_timeout_s;  /* the whole head, from its first byte (0: 30 s) */
    int body_timeout_s;  /* the whole body, from the end of the head (0: 300 s) */
    /* Unsent response bytes a connection may hold: over it, pipelined
     * requests wait unread, and a stream is cut (the close callback runs, as
     * when the client goes). A single complete response may exceed it.
     * 0: 8 MiB. */
    size_t max_output_bytes;
    /* Called once the head of a request that announces a body is complete,
     * before the body is read and before `100 Continue`: to refuse the
     * request early (the API key), answer it and return nonzero; the
     * connection then closes. NULL: no check. */
    int (*on_head)(void *ctx, struct http_request *req);
};

int http_server_create(struct http_server **out, struct event_base *base,
                       const struct http_server_options *o, http_handler handler, void *ctx,
                       struct kiln_error *err);
/* Serves a connected socket (tests, fuzzing, inherited sockets); it counts
 * towards the limit like an accepted one, `rejecting` answers it 503. */
int http_server_adopt(struct http_server *s, int fd, int rejecting);
/* cb(arg, status) once the request's response is complete (status: the
 * HTTP status sent), or with status 0 when the connection goes first. */
void http_request_on_finish(struct http_request *r, void (*cb)(void *arg, int status), void *arg);
/* A header line ("Name: value", no CRLF) for the request's response. */
void http_request_add_header(struct http_request *r, const char *line);
/* Closes the listening socket; open connections go on. Connections the
 * kernel had completed are accepted first. A request whose first bytes had
 * arrived by then (buffered here or in the kernel) counts as started before
 * the stop; later requests on open connections do not. */
void http_server_stop_listening(struct http_server *s);
/* 1 unless listening stopped before the request's first byte arrived. */
int http_request_started_before_stop(const struct http_request *r);
/* Requests started before the stop whose head or body is still arriving. */
int http_server_requests_arriving(const struct http_server *s);
/* Answers those 503 and closes their connections (the shutdown's grace is over). */
void http_server_refuse_arriving(struct http_server *s);
/* Closes every connection (close callbacks run) and frees the server. */
void http_server_free(struct http_server *s);
int http_server_port(const struct http_server *s);
int http_server_connections(const struct http_server *s);
/* Connections with response bytes not yet written. */
int http_server_pending_output(const struct http_server *s);
/* Streams cut because their client stopped reading (see max_output_bytes). */
long http_server_slow_clients(const struct http_server *s);
/* Responses sent so far by status class: out[2] = 2xx ... out[5] = 5xx. */
void http_server_responses(const struct http_server *s, long out[6]);

/* Case-insensitive lookup; NULL when absent. */
const char *http_header_get(const struct http_request *r, const char *name);

/* A complete response. `extra_headers` is NULL or "Name: value\r\n" lines. */
void http_respond(struct http_request *r, int status, const char *content_type, const char *body,
                  size_t len, const char *extra_headers);
/* A response of unknown length (chunked; on HTTP/1.0 ended by closing). */
void http_stream_begin(struct http_request *r, int status, const char *content_type,
                       const char *extra_headers);
void http_stream_write(struct http_request *r, const char *data, size_t len);
void http_stream_end(struct http_request *r);

/* 1 once a stream was cut because its client stopped reading: writes are
 * dropped and the close callback follows at the next turn of the loop, so
 * a producer should stop building output for it now. */
int http_request_cut(const struct http_request *r);

/* The connection closes once this request's response is out. */
void http_request_close_after(struct http_request *r);

/* Called once if the connection ends before the response is complete. */
void http_request_on_close(struct http_request *r, void (*cb)(void *arg), void *arg);

/* A chunked body's size line (without CRLF): hex digits (at most 16) and an
 * optional extension after ';'. 0 and the size, or -1 when malformed. */
int http_parse_chunk_size(const char *line, size_t n, unsigned long long *out);

/* Compares in time independent of where the strings differ. */
int http_secure_equal(const char *a, size_t alen, const char *b, size_t blen);

#endif
