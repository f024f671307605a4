/* sse.h — Server-Sent Events framing for streamed completions, as OpenAI
 * sends them: `data: <json>\n\n` per event and `data: [DONE]\n\n` at the end,
 * over a chunked text/event-stream response. */
#ifndef KILN_SERVER_SSE_H
#define KILN_SERVER_SSE_H

#include <jansson.h>

struct http_request;

void sse_begin(struct http_request *r);
/* Sends v (consumed) as one event. */
void sse_send_json(struct http_request *r, json_t *v);
/* Sends an already encoded JSON text as one event. */
void sse_send_raw(struct http_request *r, const char *json);
/* `data: [DONE]` and the end of the response. */
void sse_end(struct http_request *r);

#endif
