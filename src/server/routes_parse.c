/* routes_parse.c — SGLang's native parser endpoints: a model's text split
 * by the same parsers chat completions use (chat/tool_parser.h,
 * chat/reasoning.h), with the parser named in the request.
 *
 *   POST /separate_reasoning  {"text", "reasoning_parser"}
 *     -> {"reasoning_text", "text"}
 *   POST /parse_function_call {"text", "tool_call_parser", "tools"}
 *     -> {"normal_text", "calls": [{"tool_index", "name", "parameters"}]}
 *
 * As SGLang does, a call of a function that is not among `tools` is left
 * out (its text is not content either), tool_index is the function's
 * place in `tools`, and parameters the arguments' JSON text. Loop thread. */
#include <string.h>

#include "base/buf.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"
#include "server/server_internal.h"

/* A required string field (its length too, NULs included, when len is set). */
static int body_str(const json_t *body, const char *key, const char **out, size_t *len, struct req_error *e) {
    *out = NULL;
    if (jr_str(body, key, out, e) < 0) return -1;
    if (!*out) return req_errorf(e, 400, "missing_field", key, "'%s' is required", key);
    if (len) *len = json_string_length(json_object_get(body, key));
    return 0;
}

void route_separate_reasoning(struct server *s, struct http_request *r) {
    (void)s;
    struct req_error e = {0};
    json_t *body = jr_parse_body(r->body.data, r->body.len, &e);
    const char *text = NULL, *name = NULL;
    size_t len = 0;
    enum reasoning_format f;
    if (!body || body_str(body, "text", &text, &len, &e) || body_str(body, "reasoning_parser", &name, NULL, &e)) goto bad;
    if (reasoning_format_from_name(name, &f)) {
        req_errorf(&e, 400, "invalid_value", "reasoning_parser", "unknown reasoning parser '%s' (expected one of %s)",
                   name, reasoning_format_choices());
        goto bad;
    }
    struct reasoning_parser rp;
    struct buf reasoning = {0}, content = {0};
    reasoning_parser_init_format(&rp, f, reasoning_starts_in_think(f, "", 0));
    reasoning_parser_feed(&rp, text, len, &reasoning, &content);
    reasoning_parser_finish(&rp, &reasoning, &content);
    reasoning_parser_free(&rp);
    server_reply_json(r, 200,
                      json_pack("{s:o,s:o}", "reasoning_text", server_json_text(reasoning.data, reasoning.len), "text",
                                server_json_text(content.data, content.len)));
    buf_free(&reasoning);
    buf_free(&content);
    json_decref(body);
    return;
bad:
    json_decref(body);
    server_reply_error(r, &e);
}

/* The function names of `tools` ([{"type": "function", "function": {"name": ...}}]). */
static int tool_names(const json_t *tools, struct req_error *e) {
    if (!tools || json_is_null(tools)) return req_errorf(e, 400, "missing_field", "tools", "'tools' is required");
    if (!json_is_array(tools)) return req_errorf(e, 400, "invalid_type", "tools", "'tools' must be an array");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return req_errorf(e, 400, "invalid_value", "tools", "tools[%zu] needs function.name (a string)", i);
    }
    return 0;
}

static long tool_index(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name)) return (long)i;
    }
    return -1;
}

void route_parse_function_call(struct server *s, struct http_request *r) {
    (void)s;
    struct req_error e = {0};
    json_t *body = jr_parse_body(r->body.data, r->body.len, &e);
    const char *text = NULL, *name = NULL;
    size_t len = 0;
    enum tool_format f;
    const json_t *tools = body ? json_object_get(body, "tools") : NULL;
    if (!body || body_str(body, "text", &text, &len, &e) || body_str(body, "tool_call_parser", &name, NULL, &e) ||
        tool_names(tools, &e))
        goto bad;
    if (tool_format_from_name(name, &f)) {
        req_errorf(&e, 400, "invalid_value", "tool_call_parser", "unknown tool-call parser '%s' (expected one of %s)",
                   name, tool_format_choices());
        goto bad;
    }
    struct tool_events ev = {0};
    tool_parse_whole(f, 0, text, len, &ev);
    struct buf normal = {0};
    json_t *calls = json_array();
    for (int i = 0; i < ev.n; i++) {
        const struct tool_event *t = &ev.v[i];
        if (t->kind == TOOL_EVENT_CONTENT) {
            buf_append(&normal, t->text, t->len);
            continue;
        }
        long k = tool_index(tools, t->name);
        if (k < 0) continue; /* not among the tools: dropped, as SGLang does */
        json_array_append_new(calls, json_pack("{s:I,s:s,s:o}", "tool_index", (json_int_t)k, "name", t->name,
                                               "parameters", server_json_text(t->text, t->len)));
    }
    tool_events_free(&ev);
    server_reply_json(r, 200,
                      json_pack("{s:o,s:o}", "normal_text", server_json_text(normal.data, normal.len), "calls", calls));
    buf_free(&normal);
    json_decref(body);
    return;
bad:
    json_decref(body);
    server_reply_error(r, &e);
}
