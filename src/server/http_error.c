/* http_error.c — OpenAI-shaped error bodies (see http_error.h). */
#include "server/http_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/mem.h"
#include "server/http.h"

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status < 500 ? "invalid_request_error" : "internal_server_error";
    }
}

size_t http_error_utf8_cut(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = n, back = 0;
    while (i > 0 && back < 3 && (u[i - 1] & 0xc0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned lead = u[i - 1];
    size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    /* a lead byte whose sequence runs past the end: drop it and its tail */
    return want > 1 && (i - 1) + want > n ? i - 1 : n;
}

/* Valid UTF-8 kept, anything else one U+FFFD per byte. */
static json_t *lossy_string(const char *s) {
    size_t n = strlen(s), o = 0;
    char *buf = xmalloc(n * 3 + 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        json_t *probe = len > 1 && i + len <= n ? json_stringn(s + i, len) : NULL;
        if (len == 1 || probe) {
            memcpy(buf + o, s + i, len);
            o += len, i += len;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3, i++;
        }
        json_decref(probe);
    }
    json_t *v = json_stringn(buf, o);
    free(buf);
    return v;
}

char *http_error_json(int status, const char *code, const char *param, const char *message) {
    /* messages may quote client input: jansson escapes it, and invalid UTF-8
     * (which jansson refuses) is replaced so the error itself never fails */
    json_t *msg = json_string(message);
    if (!msg) msg = lossy_string(message);
    if (!msg) msg = json_string("the request contains invalid UTF-8");
    json_t *err = json_pack("{s:o,s:s,s:o,s:o}", "message", msg, "type", error_type(status), "param",
                            param ? json_string(param) : json_null(), "code",
                            code ? json_string(code) : json_null());
    json_t *root = json_pack("{s:o}", "error", err);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s ? s : xstrdup("{\"error\":{\"message\":\"error\",\"type\":\"internal_server_error\","
                           "\"param\":null,\"code\":null}}");
}

static void send_error(struct http_request *r, int status, const char *code, const char *param,
                       const char *extra, const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));
static void send_error(struct http_request *r, int status, const char *code, const char *param,
                       const char *extra, const char *fmt, va_list ap) {
    char message[1024];
    int n = vsnprintf(message, sizeof message, fmt, ap);
    if (n >= (int)sizeof message) n = (int)sizeof message - 1;
    if (n > 0) message[http_error_utf8_cut(message, (size_t)n)] = 0; /* a cut here or upstream */
    char *body = http_error_json(status, code, param, message);
    http_respond(r, status, "application/json", body, strlen(body), extra);
    free(body);
}

void http_error_respond(struct http_request *r, int status, const char *code, const char *param,
                        const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    send_error(r, status, code, param, NULL, fmt, ap);
    va_end(ap);
}

void http_error_respond_headers(struct http_request *r, int status, const char *code, const char *param,
                                const char *extra, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    send_error(r, status, code, param, extra, fmt, ap);
    va_end(ap);
}
