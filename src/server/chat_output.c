/* chat_output.c — reasoning, content and tool calls in the OpenAI chat
 * format (see chat_output.h). */
#include "server/chat_output.h"

#include <string.h>

#include "scheduler/engine.h"
#include "server/json_req.h"
#include "server/server_internal.h"

/* ---- the request ------------------------------------------------------------ */

static int tool_named(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return 1;
    }
    return 0;
}

int chat_output_parse_request(const json_t *body, enum tool_format fmt, enum reasoning_format rfmt,
                              struct chat_output_opts *o, struct engine_request *r, struct req_error *e) {
    memset(o, 0, sizeof *o);
    json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    int have_tools = json_is_array(tools) && json_array_size(tools) > 0;
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return req_errorf(e, 400, "invalid_type", "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    if (have_tools) json_array_foreach(tools, i, t) {
            json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
                !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                return req_errorf(e, 400, "invalid_value", "tools",
                                  "'tools'[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        }
    const char *choice = "auto";
    if (tc && !json_is_null(tc)) {
        if (!have_tools)
            return req_errorf(e, 400, "invalid_value", "tool_choice",
                              "'tool_choice' is only allowed when 'tools' are specified");
        if (json_is_string(tc)) {
            choice = json_string_value(tc);
            if (strcmp(choice, "none") && strcmp(choice, "auto") && strcmp(choice, "required"))
                return req_errorf(e, 400, "invalid_value", "tool_choice",
                                  "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}, not \"%s\"",
                                  choice);
        } else {
            json_t *type = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string_value(type), "function") || !name)
                return req_errorf(e, 400, "invalid_value", "tool_choice",
                                  "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}");
            if (!tool_named(tools, name))
                return req_errorf(e, 400, "invalid_value", "tool_choice",
                                  "'tool_choice' names the function '%s', which is not among 'tools'", name);
            choice = "named";
        }
    }
    if (strcmp(choice, "auto") && strcmp(choice, "none") && fmt == TOOL_FORMAT_NONE)
        return req_errorf(e, 400, "unsupported", "tool_choice",
                          "'tool_choice' \"%s\" needs a tool-call parser: start the server with "
                          "--tool-call-parser",
                          choice);
    if (strcmp(choice, "auto") && strcmp(choice, "none") && fmt == TOOL_FORMAT_HARMONY)
        return req_errorf(e, 400, "unsupported", "tool_choice",
                          "'tool_choice' \"%s\" is not supported with the harmony tool-call format (gpt-oss) yet: "
                          "use \"auto\"",
                          choice);
    int parallel = 1, separate = 1;
    if (jr_bool(body, "parallel_tool_calls", &parallel, e) < 0 || jr_bool(body, "separate_reasoning", &separate, e) < 0)
        return -1;
    o->parallel_tool_calls = parallel;
    /* tool_choice "none": the tools are still rendered, calls not parsed */
    o->tools = have_tools && strcmp(choice, "none") ? fmt : TOOL_FORMAT_NONE;
    o->reasoning = separate ? rfmt : REASONING_NONE;
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    o->thinking_off = json_is_false(json_object_get(kw, "enable_thinking"));
    /* Mistral's [TOOL_CALLS] and every harmony marker are special tokens */
    int harmony = o->tools == TOOL_FORMAT_HARMONY || o->reasoning == REASONING_GPT_OSS;
    if ((o->tools == TOOL_FORMAT_MISTRAL || harmony) && !json_object_get(body, "skip_special_tokens"))
        r->skip_special_tokens = 0;
    return 0;
}

void chat_template_needs_read(const char *src, struct chat_template_needs *n) {
    memset(n, 0, sizeof *n);
    if (!src) return;
    static const char *const mapping[] = {"arguments|tojson", "arguments | tojson", "arguments|items",
                                          "arguments | items", "arguments.items()"};
    for (size_t i = 0; i < sizeof mapping / sizeof mapping[0]; i++)
        if (strstr(src, mapping[i])) n->object_arguments = 1;
    if (strstr(src, "arguments is string") || strstr(src, "arguments is not string")) n->object_arguments = 0;
    static const char *const nulls[] = {"message.content is none",         "message.content is not none",
                                        "message['content'] is none",      "message['content'] is not none",
                                        "message[\"content\"] is none",    "message[\"content\"] is not none"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++)
        if (strstr(src, nulls[i])) n->null_content = 1;
    n->reasoning_effort = strstr(src, "reasoning_effort") != NULL;
}

int chat_message_prepare(json_t *m, size_t i, const struct chat_template_needs *n, struct req_error *e) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!strcmp(role, "tool")) {
        if (!json_is_string(json_object_get(m, "tool_call_id")))
            return req_errorf(e, 400, "invalid_value", "messages",
                              "'messages'[%zu] (role \"tool\") needs 'tool_call_id', the id of the call it answers", i);
        return 0;
    }
    if (strcmp(role, "assistant")) return 0;
    json_t *calls = json_object_get(m, "tool_calls"), *content = json_object_get(m, "content");
    if (calls && !json_is_null(calls)) {
        if (!json_is_array(calls))
            return req_errorf(e, 400, "invalid_type", "messages", "'messages'[%zu].tool_calls must be an array", i);
        size_t k;
        json_t *c;
        json_array_foreach(calls, k, c) {
            json_t *fn = json_object_get(c, "function");
            json_t *args = json_object_get(fn, "arguments");
            if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                return req_errorf(e, 400, "invalid_value", "messages",
                                  "'messages'[%zu].tool_calls[%zu] must be {\"id\": ..., \"type\": \"function\", "
                                  "\"function\": {\"name\": ..., \"arguments\": ...}}",
                                  i, k);
            if (!json_is_string(args) || !n->object_arguments) continue;
            /* an empty string means no arguments (vLLM) */
            json_t *obj = json_string_length(args) ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL)
                                                   : json_object();
            if (!json_is_object(obj)) {
                json_decref(obj);
                return req_errorf(e, 400, "invalid_value", "messages",
                                  "'messages'[%zu].tool_calls[%zu].function.arguments is not a JSON object", i, k);
            }
            json_object_set_new(fn, "arguments", obj);
        }
    } else if (!content || json_is_null(content)) {
        return req_errorf(e, 400, "invalid_value", "messages",
                          "'messages'[%zu] (role \"assistant\") needs 'content' or 'tool_calls'", i);
    }
    if ((!content || json_is_null(content)) && !n->null_content) json_object_set_new(m, "content", json_string(""));
    return 0;
}

/* ---- the answer ------------------------------------------------------------- */

void chat_output_init(struct chat_output *c, const struct chat_output_opts *o, const char *prompt, size_t prompt_len,
                      uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->o = *o;
    tool_parser_init(&c->tp, o->tools, seed);
    c->in_think = o->reasoning && !o->thinking_off && prompt && reasoning_starts_in_think(o->reasoning, prompt, prompt_len);
    reasoning_parser_init_format(&c->rp, o->reasoning, c->in_think);
}

void chat_output_free(struct chat_output *c) {
    tool_parser_free(&c->tp);
    reasoning_parser_free(&c->rp);
    buf_free(&c->content);
    buf_free(&c->reasoning);
    json_decref(c->calls);
}

/* The last delta if it can take `key`, else a new one. */
static json_t *text_delta(json_t *deltas, const char *key) {
    size_t n = json_array_size(deltas);
    json_t *d = n ? json_array_get(deltas, n - 1) : NULL;
    if (!d || json_object_get(d, "tool_calls") || (!strcmp(key, "reasoning_content") && json_object_get(d, "content"))) {
        d = json_object();
        json_array_append_new(deltas, d);
    }
    return d;
}

static void add_text(json_t *deltas, const char *key, const char *s, size_t n) {
    if (!n) return;
    json_t *d = text_delta(deltas, key);
    const char *old = json_string_value(json_object_get(d, key));
    struct buf b = {0};
    if (old) buf_append(&b, old, json_string_length(json_object_get(d, key)));
    buf_append(&b, s, n);
    json_object_set_new(d, key, server_json_text(b.data, b.len));
    buf_free(&b);
}

static void add_events(struct chat_output *c, json_t *deltas, const struct tool_events *ev) {
    for (int i = 0; i < ev->n; i++) {
        const struct tool_event *v = &ev->v[i];
        if (v->kind == TOOL_EVENT_CONTENT) {
            buf_append(&c->content, v->text, v->len);
            add_text(deltas, "content", v->text, v->len);
            continue;
        }
        if (v->index > 0 && !c->o.parallel_tool_calls) continue;
        if (!c->calls) c->calls = json_array();
        json_array_append_new(c->calls,
                              json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", v->id, "type", "function", "function", "name",
                                        server_json_text(v->name, strlen(v->name)), "arguments",
                                        server_json_text(v->text, v->len)));
        json_array_append_new(deltas, json_pack("{s:[{s:i,s:s,s:s,s:{s:o,s:s}}]}", "tool_calls", "index", v->index,
                                                "id", v->id, "type", "function", "function", "name",
                                                server_json_text(v->name, strlen(v->name)), "arguments", ""));
        json_array_append_new(deltas, json_pack("{s:[{s:i,s:{s:o}}]}", "tool_calls", "index", v->index, "function",
                                                "arguments", server_json_text(v->text, v->len)));
    }
}

static void add_content(struct chat_output *c, json_t *deltas, const char *s, size_t n, int final) {
    if (c->o.tools == TOOL_FORMAT_NONE) {
        buf_append(&c->content, s, n);
        add_text(deltas, "content", s, n);
        return;
    }
    if (n) add_events(c, deltas, tool_parser_feed(&c->tp, s, n));
    if (final) add_events(c, deltas, tool_parser_finish(&c->tp));
}

json_t *chat_output_feed(struct chat_output *c, const char *text, size_t len, int final) {
    json_t *deltas = json_array();
    if (c->o.reasoning == REASONING_NONE) {
        add_content(c, deltas, text, len, final);
        return deltas;
    }
    struct buf r = {0}, t = {0};
    reasoning_parser_feed(&c->rp, text, len, &r, &t);
    if (final) reasoning_parser_finish(&c->rp, &r, &t);
    buf_append(&c->reasoning, r.data, r.len);
    add_text(deltas, "reasoning_content", r.data, r.len);
    add_content(c, deltas, t.data, t.len, final);
    buf_free(&r);
    buf_free(&t);
    return deltas;
}

json_t *chat_output_message(const struct chat_output *c) {
    json_t *m = json_pack("{s:s}", "role", "assistant");
    int only_calls = c->calls && !c->content.len;
    json_object_set_new(m, "content", only_calls ? json_null() : server_json_text(c->content.data, c->content.len));
    if (c->o.reasoning)
        json_object_set_new(m, "reasoning_content",
                            c->reasoning.len ? server_json_text(c->reasoning.data, c->reasoning.len) : json_null());
    if (c->calls) json_object_set(m, "tool_calls", c->calls);
    return m;
}

const char *chat_output_finish_reason(const struct chat_output *c, const char *engine_reason) {
    if (c->calls && engine_reason && !strcmp(engine_reason, "stop")) return "tool_calls";
    return engine_reason;
}
