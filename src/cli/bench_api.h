/* bench_api.h — what the requests of each API look like and how their
 * responses turn into timings, following bench_serving's request functions.
 *
 * Streaming: the body is split into lines; every "data: {json}" line is one
 * chunk, stamped with the time its bytes were read. A chunk whose text is
 * not empty is a content chunk: the first sets TTFT (chunk time − request
 * start), each later one adds an inter-token latency (gap since the
 * previous content chunk). /generate chunks carry the cumulative token
 * count, so a gap covering k new tokens adds k ITLs of gap/k, as
 * bench_serving does. Latency is the time of the last chunk ("[DONE]"
 * included). `usage` (OpenAI, asked for with stream_options.include_usage)
 * and meta_info (/generate) give the server's own token counts.
 *
 * Non-streaming (--disable-stream, and always for /v1/score): TTFT equals
 * the latency of the whole response.
 *
 * A non-200 status, an "error" object, unparsable JSON or a response
 * without the expected fields fails the request with a message.
 */
#ifndef KILN_CLI_BENCH_API_H
#define KILN_CLI_BENCH_API_H

#include <stddef.h>

#include "base/buf.h"
#include "cli/bench.h"

/* Request body (JSON) for one prompt; malloc'd. NULL with err set when
 * --extra-request-body is not a JSON object. */
char *bench_api_payload(const struct bench_options *o, const char *model, const struct bench_prompt *p,
                        int output_len, size_t *len, struct kiln_error *err);
const char *bench_api_path(enum bench_api api);

/* Per-request response state. */
struct bench_api_stream {
    enum bench_api api;
    int stream;
    int n_items;          /* score: items expected */
    struct bench_result *res;
    struct buf body;      /* partial line (streaming) or the whole body */
    int have_first;       /* a content chunk arrived */
    double last_content;  /* absolute time of the last content chunk */
    double last_chunk;    /* absolute time of the last chunk of any kind */
    int failed;
};

void bench_api_stream_init(struct bench_api_stream *s, enum bench_api api, int stream, int n_items,
                           struct bench_result *res);
void bench_api_stream_free(struct bench_api_stream *s);
/* Body bytes as they arrive; `status` is the response's HTTP status. */
void bench_api_on_body(struct bench_api_stream *s, int status, const char *data, size_t n, double now);
/* The response ended normally at `now`: settles success or failure. */
void bench_api_finish(struct bench_api_stream *s, int status, double now);

#endif
