/* http_error.h — the one shape of every error kiln's HTTP server sends:
 * OpenAI's {"error": {"message", "type", "param", "code"}}, which the
 * official clients turn into typed exceptions (BadRequestError, ...).
 * `type` follows from the status; `code` is a short machine-readable word;
 * `param` names the offending request field or is NULL. */
#ifndef KILN_SERVER_HTTP_ERROR_H
#define KILN_SERVER_HTTP_ERROR_H

#include <stddef.h>

struct http_request;

void http_error_respond(struct http_request *r, int status, const char *code, const char *param,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same with extra response headers ("Name: value\r\n" lines). */
void http_error_respond_headers(struct http_request *r, int status, const char *code, const char *param,
                                const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The JSON body alone (malloc'd), for errors inside an SSE stream. Bytes of
 * the message that are not UTF-8 become U+FFFD; callers cut messages with
 * utf8_cut (base/utf8.h) so that a limit never splits a character. */
char *http_error_json(int status, const char *code, const char *param, const char *message);

#endif
