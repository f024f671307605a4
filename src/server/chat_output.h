/* chat_output.h — what a chat completion says, in the OpenAI format: the
 * model's text split into reasoning_content, content and tool_calls (by
 * the parsers of chat/reasoning.h and chat/tool_parser.h), as a message or
 * as stream deltas; and the request side of tools: tool_choice,
 * parallel_tool_calls, separate_reasoning, and the history messages that
 * carry tool calls and their results.
 *
 * One chat_output per choice. Text passes first through the reasoning
 * parser (when --reasoning-parser is set and the request keeps
 * separate_reasoning), then what is content through the tool parser (when
 * --tool-call-parser is set, the request has tools and tool_choice is not
 * "none"). A stream sends one chunk per delta chat_output_feed returns: a
 * call's first delta is {"tool_calls": [{index, id, type: "function",
 * function: {name, arguments: ""}}]}, the next carries its arguments
 * (index and function.arguments). The message has content null when the
 * answer was only calls, tool_calls when there were any, and
 * reasoning_content when reasoning is split; finish_reason "stop" becomes
 * "tool_calls" when calls were made. parallel_tool_calls false keeps the
 * first call only.
 */
#ifndef KILN_SERVER_CHAT_OUTPUT_H
#define KILN_SERVER_CHAT_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/buf.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"

struct req_error;
struct engine_request;

struct chat_output_opts {
    enum tool_format tools;          /* TOOL_FORMAT_NONE: calls are not parsed */
    int parallel_tool_calls;         /* 0: the first call only */
    enum reasoning_format reasoning; /* REASONING_NONE: no reasoning_content */
    int thinking_off;                /* chat_template_kwargs.enable_thinking is false */
};

struct chat_output {
    struct chat_output_opts o;
    int in_think;
    struct tool_parser tp;
    struct reasoning_parser rp;
    struct buf content, reasoning; /* the whole message so far */
    json_t *calls;                 /* the tool_calls array (NULL: none yet) */
};

/* The request's tools, tool_choice, parallel_tool_calls and
 * separate_reasoning against the server's parsers (fmt, rfmt): fills o, or
 * a 400 naming the field. It may clear r->skip_special_tokens (Mistral's
 * [TOOL_CALLS] and the harmony markers of gpt-oss are special tokens)
 * unless the body sets it. */
int chat_output_parse_request(const json_t *body, enum tool_format fmt, enum reasoning_format rfmt,
                              struct chat_output_opts *o, struct engine_request *r, struct req_error *e);

/* What a chat template needs, read from its text once: whether it uses
 * tool-call arguments as a mapping without handling a JSON string itself
 * (they are then parsed into an object, as vLLM does), and whether it tells
 * a null content apart (else null becomes "", as vLLM does), and whether
 * it reads `reasoning_effort` (gpt-oss's harmony template). */
struct chat_template_needs {
    int object_arguments;
    int null_content;
    int reasoning_effort;
};
void chat_template_needs_read(const char *source, struct chat_template_needs *n);

/* Message i of a request (a copy, changed in place) made ready for the
 * template: assistant tool_calls checked (and arguments parsed when the
 * template needs objects), a tool message's tool_call_id required. */
int chat_message_prepare(json_t *m, size_t i, const struct chat_template_needs *n, struct req_error *e);

/* prompt: the rendered prompt, to know whether output starts inside a
 * think block. */
void chat_output_init(struct chat_output *c, const struct chat_output_opts *o, const char *prompt, size_t prompt_len,
                      uint64_t seed);
void chat_output_free(struct chat_output *c);
/* Reads a text delta (final: the last one, maybe empty); returns a new
 * array of the delta objects it decided, each one chunk's "delta". */
json_t *chat_output_feed(struct chat_output *c, const char *text, size_t len, int final);
/* The message of a whole answer (after the final feed). */
json_t *chat_output_message(const struct chat_output *c);
/* The finish reason the client sees for the engine's. */
const char *chat_output_finish_reason(const struct chat_output *c, const char *engine_reason);

#endif
