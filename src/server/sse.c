/* sse.c — SSE framing (see sse.h). */
#include "server/sse.h"

#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "server/http.h"

void sse_begin(struct http_request *r) {
    /* X-Accel-Buffering: proxies such as nginx would otherwise hold tokens back */
    http_stream_begin(r, 200, "text/event-stream; charset=utf-8",
                      "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
}

void sse_send_raw(struct http_request *r, const char *json) {
    /* compact JSON has no raw newlines, so one data: line is one event */
    size_t n = strlen(json);
    char *buf = xmalloc(n + 9);
    memcpy(buf, "data: ", 6);
    memcpy(buf + 6, json, n);
    memcpy(buf + 6 + n, "\n\n", 2);
    http_stream_write(r, buf, n + 8);
    free(buf);
}

void sse_send_json(struct http_request *r, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (s) sse_send_raw(r, s);
    free(s);
}

void sse_end(struct http_request *r) {
    static const char done[] = "data: [DONE]\n\n";
    http_stream_write(r, done, sizeof done - 1);
    http_stream_end(r);
}
