/* http_error.c — OpenAI-shaped error bodies (see http_error.h). */
#include "server/http_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/mem.h"
#include "base/utf8.h"
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

/* Valid UTF-8 kept, each maximal invalid subpart one U+FFFD. */
static json_t *lossy_string(const char *s) {
    struct buf b = {0};
    utf8_lossy_append(&b, s, strlen(s), 1);
    json_t *v = json_stringn(b.data, b.len);
    buf_free(&b);
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
    if (n > 0) message[utf8_cut(message, (size_t)n)] = 0; /* a cut here or upstream */
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
