/* fuzz_http.c — arbitrary bytes from a client on one connection of the HTTP
 * layer (src/server/http.c), over a socketpair: request lines, headers,
 * Content-Length and chunked bodies, pipelining, truncation. Every request
 * that parses is answered (plain, streamed or as an error, chosen by its
 * path) so the keep-alive path runs too. Paths under /auth are refused by
 * the head check (before their body); the output bound is small, so long
 * streams are cut and pipelined answers pause reading. Chunk-size lines are
 * also checked against a plain reading of RFC 9112. The server must neither
 * crash nor leak, and must close the connection once the client is done. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

#include "base/error.h"
#include "server/http.h"
#include "server/http_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int refuse_head(void *ctx, struct http_request *r) {
    (void)ctx;
    if (strncmp(r->path, "/auth", 5)) return 0;
    http_error_respond(r, 401, "invalid_api_key", NULL, "no key");
    return 1;
}

static int hexval(int ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* An accepted chunk-size line is 1..16 hex digits, then nothing or
 * optional blanks and ';' (no sign, prefix or space first). */
static void check_chunk_size(const char *line, size_t n) {
    unsigned long long v = 0, want = 0;
    if (http_parse_chunk_size(line, n, &v)) return;
    size_t i = 0;
    while (i < n && hexval((unsigned char)line[i]) >= 0) want = want << 4 | (unsigned)hexval((unsigned char)line[i++]);
    KILN_ASSERT(i >= 1 && i <= 16 && v == want);
    while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
    KILN_ASSERT(i == n ? (n > 0 && hexval((unsigned char)line[n - 1]) >= 0) : line[i] == ';');
    for (size_t k = 0; k < n; k++) KILN_ASSERT(line[k] != 0);
}

static void handler(void *ctx, struct http_request *r) {
    (void)ctx;
    KILN_ASSERT(r->path && r->path[0] == '/' && r->query);
    KILN_ASSERT(r->body.data && r->body.data[r->body.len] == 0);
    if (!strncmp(r->path, "/stream", 7)) {
        http_stream_begin(r, 200, "text/event-stream", NULL);
        /* a stream longer than the output bound: cut unless the client reads */
        for (int k = 0; k < 8; k++) http_stream_write(r, r->body.data, r->body.len);
        http_stream_write(r, "data: [DONE]\n\n", 14);
        http_stream_end(r);
    } else if (!strncmp(r->path, "/err", 4)) {
        http_error_respond(r, 400, "bad", "p", "body of %zu bytes", r->body.len);
    } else {
        const char *h = http_header_get(r, "x-echo");
        http_respond(r, 200, "text/plain", h ? h : r->body.data, h ? strlen(h) : r->body.len, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0;
    const uint8_t *eol = memchr(data, '\n', size);
    check_chunk_size((const char *)data, eol ? (size_t)(eol - data) : size);
    struct event_base *base = event_base_new();
    struct http_server *s = NULL;
    struct kiln_error err;
    struct http_server_options o = {.port = -1, .max_body_bytes = 4096, .max_header_bytes = 2048, .idle_timeout_s = 5,
                                    .max_output_bytes = 2048, .on_head = refuse_head};
    KILN_ASSERT(http_server_create(&s, base, &o, handler, NULL, &err) == 0);
    int sv[2];
    KILN_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    evutil_make_socket_nonblocking(sv[1]);
    KILN_ASSERT(http_server_adopt(s, sv[0], size > 0 && data[0] == 0xff) == 0);
    size_t off = 0;
    char sink[16384];
    for (int round = 0; round < 10000; round++) {
        if (off < size) {
            ssize_t n = write(sv[1], data + off, size - off);
            if (n > 0) off += (size_t)n;
            if (off == size) shutdown(sv[1], SHUT_WR);
        } else if (size == 0 && round == 0) {
            shutdown(sv[1], SHUT_WR);
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        while (read(sv[1], sink, sizeof sink) > 0) {
        }
        if (off == size && http_server_connections(s) == 0) break;
    }
    /* half-closed clients are dropped at EOF, so the connection must be gone */
    KILN_ASSERT(http_server_connections(s) == 0);
    http_server_free(s);
    close(sv[1]);
    event_base_free(base);
    return 0;
}
