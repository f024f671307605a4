#include "cli/bench_http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/error.h"

enum chunk_phase { CHUNK_SIZE = 0, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER };

int http_url_parse(struct http_url *u, const char *url, struct kiln_error *err) {
    memset(u, 0, sizeof *u);
    if (strncmp(url, "http://", 7))
        return kiln_errorf(err, "--base-url '%s': expected http://host[:port][/path] (https is not supported)", url);
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hostport = slash ? (size_t)(slash - h) : strlen(h);
    const char *colon = memchr(h, ':', hostport);
    size_t host_len = colon ? (size_t)(colon - h) : hostport;
    if (h[0] == '[') return kiln_errorf(err, "--base-url '%s': IPv6 literals are not supported", url);
    if (host_len == 0 || host_len >= sizeof u->host) return kiln_errorf(err, "--base-url '%s': bad host", url);
    memcpy(u->host, h, host_len);
    if (colon) {
        size_t pl = hostport - host_len - 1;
        if (pl == 0 || pl >= sizeof u->port || strspn(colon + 1, "0123456789") < pl)
            return kiln_errorf(err, "--base-url '%s': bad port", url);
        memcpy(u->port, colon + 1, pl);
    } else {
        strcpy(u->port, "80");
    }
    if (slash) {
        size_t pl = strlen(slash);
        while (pl > 0 && slash[pl - 1] == '/') pl--;
        if (pl >= sizeof u->prefix) return kiln_errorf(err, "--base-url '%s': path too long", url);
        memcpy(u->prefix, slash, pl);
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc || !res) return kiln_errorf(err, "cannot resolve %s:%s: %s", u->host, u->port, gai_strerror(rc));
    memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
    u->addr_len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

char *http_build_request(const struct http_url *u, const char *method, const char *path, const char *body,
                         size_t body_len, size_t *len) {
    const char *key = getenv("OPENAI_API_KEY");
    char auth[512] = "";
    if (key && *key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    struct buf r = {0};
    buf_printf(&r,
               "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kiln-bench\r\nAccept: */*\r\n"
               "Connection: close\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
               method, u->prefix, path, u->host, u->port, auth, body_len);
    buf_append(&r, body, body_len);
    *len = r.len;
    return buf_take(&r);
}

static int fail(struct http_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct http_conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    c->phase = HTTP_FAILED;
    return -1;
}

int http_conn_start(struct http_conn *c, const struct http_url *u, char *request, size_t len, http_body_fn on_body,
                    void *user, struct kiln_error *err) {
    memset(c, 0, sizeof *c);
    c->out = request;
    c->out_len = len;
    c->on_body = on_body;
    c->user = user;
    c->content_length = -1;
    c->fd = socket(u->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        free(c->out);
        c->out = NULL;
        return kiln_errorf(err, "socket: %s (raise the open-file limit, ulimit -n)", strerror(errno));
    }
    if (connect(c->fd, (const struct sockaddr *)&u->addr, u->addr_len) == 0) {
        c->phase = HTTP_SENDING;
    } else if (errno == EINPROGRESS) {
        c->phase = HTTP_CONNECTING;
    } else {
        fail(c, "connect to %s:%s: %s", u->host, u->port, strerror(errno));
    }
    return 0;
}

short http_conn_events(const struct http_conn *c) {
    switch (c->phase) {
    case HTTP_CONNECTING:
    case HTTP_SENDING: return POLLOUT;
    case HTTP_HEAD:
    case HTTP_BODY: return POLLIN;
    default: return 0;
    }
}

static void deliver(struct http_conn *c, const char *p, size_t n, double now) {
    if (n == 0) return;
    c->body_seen += (long long)n;
    c->on_body(c->user, p, n, now);
}

/* Feeds chunked-encoded bytes; returns 1 once the last chunk ended. */
static int chunked_feed(struct http_conn *c, const char *p, size_t n, double now) {
    size_t i = 0;
    while (i < n) {
        if (c->chunk_phase == CHUNK_DATA) {
            size_t take = n - i < (size_t)c->chunk_left ? n - i : (size_t)c->chunk_left;
            deliver(c, p + i, take, now);
            i += take;
            c->chunk_left -= (long long)take;
            if (c->chunk_left == 0) c->chunk_phase = CHUNK_DATA_END;
            continue;
        }
        /* The other phases read CRLF-terminated lines. */
        char ch = p[i++];
        if (ch != '\n') {
            if (c->line_len + 1 >= sizeof c->line) return fail(c, "chunked body: chunk-size line too long");
            if (ch != '\r') c->line[c->line_len++] = ch;
            continue;
        }
        c->line[c->line_len] = 0;
        size_t line_len = c->line_len;
        c->line_len = 0;
        if (c->chunk_phase == CHUNK_DATA_END) {
            if (line_len) return fail(c, "chunked body: missing CRLF after a chunk");
            c->chunk_phase = CHUNK_SIZE;
        } else if (c->chunk_phase == CHUNK_SIZE) {
            char *end;
            errno = 0;
            long long size = strtoll(c->line, &end, 16);
            if (errno || end == c->line || size < 0 || (*end && *end != ';' && *end != ' '))
                return fail(c, "chunked body: bad chunk size '%s'", c->line);
            c->chunk_left = size;
            c->chunk_phase = size ? CHUNK_DATA : CHUNK_TRAILER;
        } else if (line_len == 0) { /* CHUNK_TRAILER: empty line ends the message */
            return 1;
        }
    }
    return 0;
}

/* Parses status line and headers once "\r\n\r\n" arrived. */
static int parse_head(struct http_conn *c, size_t head_end) {
    c->head.data[head_end] = 0;
    int major, minor, status;
    if (sscanf(c->head.data, "HTTP/%d.%d %d", &major, &minor, &status) != 3)
        return fail(c, "malformed HTTP status line: '%.80s'", c->head.data);
    c->status = status;
    for (char *line = strstr(c->head.data, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        char *h = line + 2, *colon = strchr(h, ':'), *eol = strstr(h, "\r\n");
        if (!colon || (eol && colon > eol)) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        size_t name_len = (size_t)(colon - h);
        if (name_len == 14 && !strncasecmp(h, "Content-Length", 14)) {
            c->content_length = strtoll(v, NULL, 10);
        } else if (name_len == 17 && !strncasecmp(h, "Transfer-Encoding", 17)) {
            if (!strncasecmp(v, "chunked", 7)) c->chunked = 1;
        }
    }
    /* Responses to which no body belongs. */
    if (status == 204 || status == 304 || (status >= 100 && status < 200)) c->content_length = 0;
    return 0;
}

static int body_complete(const struct http_conn *c) {
    return !c->chunked && c->content_length >= 0 && c->body_seen >= c->content_length;
}

/* Bytes of the response after the connection is set up. */
static int feed(struct http_conn *c, const char *p, size_t n, double now) {
    if (c->phase == HTTP_HEAD) {
        buf_append(&c->head, p, n);
        char *end = strstr(c->head.data, "\r\n\r\n");
        if (!end) {
            if (c->head.len > 64 * 1024) return fail(c, "HTTP headers longer than 64 KiB");
            return 0;
        }
        size_t head_end = (size_t)(end - c->head.data), rest = c->head.len - head_end - 4;
        if (parse_head(c, head_end)) return -1;
        c->phase = HTTP_BODY;
        char *body = c->head.data + head_end + 4;
        if (c->chunked) {
            int r = chunked_feed(c, body, rest, now);
            if (r) return r;
        } else {
            size_t take = rest;
            if (c->content_length >= 0 && (long long)take > c->content_length) take = (size_t)c->content_length;
            deliver(c, body, take, now);
        }
        return body_complete(c) ? 1 : 0;
    }
    if (c->chunked) return chunked_feed(c, p, n, now);
    if (c->content_length >= 0 && c->body_seen + (long long)n > c->content_length)
        n = (size_t)(c->content_length - c->body_seen);
    deliver(c, p, n, now);
    return body_complete(c) ? 1 : 0;
}

int http_conn_step(struct http_conn *c, short revents, double now) {
    if (c->phase == HTTP_FAILED) return -1;
    if (c->phase == HTTP_DONE) return 1;
    if (c->phase == HTTP_CONNECTING) {
        if (!(revents & (POLLOUT | POLLERR | POLLHUP))) return 0;
        int e = 0;
        socklen_t el = sizeof e;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el) || e)
            return fail(c, "connect: %s", strerror(e ? e : errno));
        c->phase = HTTP_SENDING;
    }
    if (c->phase == HTTP_SENDING) {
        while (c->out_off < c->out_len) {
            ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                if (errno == EINTR) continue;
                return fail(c, "send: %s", strerror(errno));
            }
            c->out_off += (size_t)w;
        }
        free(c->out);
        c->out = NULL;
        c->phase = HTTP_HEAD;
        return 0; /* wait for POLLIN */
    }
    if (!(revents & (POLLIN | POLLERR | POLLHUP))) return 0;
    char buf[16384];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EINTR) continue;
            return fail(c, "recv: %s", strerror(errno));
        }
        if (r == 0) {
            if (c->phase == HTTP_BODY && !c->chunked && c->content_length < 0) {
                c->phase = HTTP_DONE; /* the body ends with the connection */
                return 1;
            }
            return fail(c, "server closed the connection %s", c->phase == HTTP_HEAD
                                                                  ? (c->head.len ? "inside the headers"
                                                                                 : "before responding")
                                                                  : "before the response ended");
        }
        int st = feed(c, buf, (size_t)r, now);
        if (st < 0) return -1;
        if (st > 0) {
            c->phase = HTTP_DONE;
            return 1;
        }
    }
}

void http_conn_close(struct http_conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->out);
    buf_free(&c->head);
    c->out = NULL;
}
