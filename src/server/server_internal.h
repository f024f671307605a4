/* server_internal.h — what the route files share: the server context of
 * one server_run (no globals: everything a route needs hangs off it) and
 * the helpers every route uses to read bodies and answer. Loop thread only. */
#ifndef KILN_SERVER_SERVER_INTERNAL_H
#define KILN_SERVER_SERVER_INTERNAL_H

#include <stdint.h>

#include <jansson.h>

#include "base/error.h"
#include "chat/chat_template.h"
#include "server/chat_output.h"
#include "server/gen.h"
#include "server/http.h"
#include "server/json_req.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/tokenize_pool.h"

struct event;
struct event_base;

struct server {
    const struct server_options *opt;
    struct engine *engine;
    const struct kiln_tokenizer *tok; /* NULL when the model has none */
    struct chat_template chat;
    int have_chat;
    char chat_error[KILN_ERROR_MAX + 32]; /* why there is no chat template */
    struct chat_template_needs chat_needs;
    enum tool_format tool_format;           /* --tool-call-parser, "auto" resolved */
    enum reasoning_format reasoning_format; /* --reasoning-parser */
    const char *model_name;
    int vocab, context_length;
    long created;         /* start time, for /v1/models */
    struct event_base *base;
    struct http_server *http;
    struct gen_hub hub;
    struct tok_pool *tokpool; /* NULL: tokenize on the loop thread */
    struct metrics metrics;
    struct tracer *tracer; /* NULL: tracing off */
    struct so_cache *so_cache; /* compiled structured-output grammars (structured.h) */
    int shutting_down;
    int aborting; /* shutdown's grace is over: what is left is aborted */
    struct event *sigint, *sigterm, *grace, *shutdown_tick;
    int finishing; /* the last responses are being flushed before exit */
    uint64_t id_counter;
    int flush_checks;
};

/* Reads the body as a JSON object, or answers 400 and returns NULL. */
json_t *server_body(struct server *s, struct http_request *r);
void server_reply_error(struct http_request *r, const struct req_error *e);
/* Answers with v (consumed). */
void server_reply_json(struct http_request *r, int status, json_t *v);
/* The HTTP status and OpenAI error code for an error's kind: 429 for a
 * full queue, 503 while shutting down or out of memory, 404 for what does
 * not exist, 500 for internal faults, else 400 ("context_length_exceeded"
 * for a prompt that does not fit). */
int server_error_status(enum kiln_error_code code, const char **oai_code);
/* Answers an engine_submit failure (server_error_status of its code). */
void server_reply_submit_error(struct http_request *r, const struct kiln_error *err);
/* The sampling fields (SAMPLING_FIELD_* bits) that `o` (the body, or
 * /generate's sampling_params) leaves absent or null: they take the
 * model's defaults (engine_request.sampling_unset). */
unsigned server_sampling_unset(const json_t *o);
/* One HTTP request that needs `total` engine requests at once: answers 400
 * and returns 1 when that many can never be queued (over 4096, or over
 * --max-queued-requests, which a retry would not change). */
int server_refuse_fanout(struct server *s, struct http_request *r, int total, const char *param);
/* 'model' must be absent or name this server's model. */
int server_check_model(struct server *s, const json_t *body, struct req_error *e);
/* A response id: prefix + 24 hex digits. */
void server_new_id(struct server *s, const char *prefix, char *buf, size_t n);
/* A string value from bytes that should be UTF-8 (invalid bytes become U+FFFD). */
json_t *server_json_text(const char *s, size_t n);
/* The text of one token as clients see it in logprobs (special tokens
 * kept), decoded after `prev` (-1 for none). */
json_t *server_token_text(struct server *s, int32_t prev, int32_t id);

/* A job finished after shutdown's grace: answers 503 and returns 1. */
int server_refuse_late(struct server *s, struct http_request *r);
/* Runs work(arg) — tokenization, chat rendering, grammar compilation — then
 * done(arg, r) on the loop thread, then release(arg). Inline when the body
 * is small (--tokenizer-inline-bytes) and the job is not `heavy`, or there
 * is no pool; otherwise on the tokenizer pool, and `done` is skipped if the
 * client disconnects meanwhile. heavy: the job compiles a grammar (a new
 * JSON Schema meets the vocabulary in up to seconds: never on the loop).
 * work must touch only arg and read-only server state (tokenizer, chat
 * template, the grammar cache). */
void server_offload(struct server *s, struct http_request *r, int heavy, tok_work_fn work, tok_done_fn done,
                    tok_release_fn release, void *arg);

/* The token ids of a chat body (messages, tools, chat_template_kwargs,
 * add_generation_prompt) through the chat template. */
int server_chat_prompt(struct server *s, const json_t *body, struct prompt_list *out, struct req_error *e);

void route_completions(struct server *s, struct http_request *r);
void route_chat_completions(struct server *s, struct http_request *r);
void route_generate(struct server *s, struct http_request *r);
void route_tokenize(struct server *s, struct http_request *r);
void route_detokenize(struct server *s, struct http_request *r);
void route_score(struct server *s, struct http_request *r);
/* routes_parse.c: SGLang's /separate_reasoning and /parse_function_call */
void route_separate_reasoning(struct server *s, struct http_request *r);
void route_parse_function_call(struct server *s, struct http_request *r);

#endif
