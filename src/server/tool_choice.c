/* tool_choice.c — the grammar of a forced tool call (tool_choice.h). */
#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"
#include "server/json_req.h"
#include "server/structured.h"
#include "server/tool_choice.h"

/* text as an EBNF literal: "..." with quotes, backslashes and control
 * bytes escaped (other bytes, UTF-8 included, as they are) */
static void put_literal(struct buf *g, const char *text, size_t n) {
    buf_push(g, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') buf_push(g, '\\'), buf_push(g, (char)c);
        else if (c == '\n') buf_puts(g, "\\n");
        else if (c == '\r') buf_puts(g, "\\r");
        else if (c == '\t') buf_puts(g, "\\t");
        else if (c < 0x20 || c == 0x7f) buf_printf(g, "\\x%02X", c);
        else buf_push(g, (char)c);
    }
    buf_push(g, '"');
}

/* The formats that write the name inside a JSON string. */
static int name_in_json(enum tool_format f) { return f == TOOL_FORMAT_HERMES || f == TOOL_FORMAT_LLAMA3_JSON; }

/* c<i> ::= before NAME after <prefix>root end, with the tool's schema
 * rules under prefix t<i>_. */
static int put_call(struct buf *g, int i, const json_t *fn, enum tool_format fmt, const struct tool_call_frame *fr,
                    struct req_error *e) {
    const char *name = json_string_value(json_object_get(fn, "name"));
    const json_t *params = json_object_get(fn, "parameters");
    json_t *any = NULL;
    if (!params || json_is_null(params)) params = any = json_pack("{s:s}", "type", "object");
    struct grammar_json_opts o = {.any_whitespace = 0, .strict = json_is_true(json_object_get(fn, "strict"))};
    struct buf schema = {0}, head = {0};
    struct kiln_error err = {0};
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t%d_", i);
    int rc = grammar_ebnf_from_json_schema(params, &o, &schema, &err);
    if (!rc) rc = grammar_ebnf_prefix_rules(schema.data, schema.len, prefix, g, &err);
    json_decref(any);
    buf_free(&schema);
    if (rc) return req_errorf(e, 400, "invalid_value", "tools", "'tools' (function '%s'): %s", name, err.msg);
    buf_puts(&head, fr->before_name);
    if (name_in_json(fmt)) {
        json_t *js = json_string(name);
        char *q = json_dumps(js, JSON_ENCODE_ANY);
        buf_append(&head, q + 1, strlen(q) - 2); /* without its quotes */
        free(q);
        json_decref(js);
    } else {
        buf_puts(&head, name);
    }
    buf_puts(&head, fr->after_name);
    buf_printf(g, "c%d ::= ", i);
    put_literal(g, head.data, head.len);
    buf_printf(g, " %sroot ", prefix);
    put_literal(g, fr->end, strlen(fr->end));
    buf_push(g, '\n');
    buf_free(&head);
    return 0;
}

int tool_choice_grammar(const json_t *body, enum tool_format fmt, int parallel, struct so_spec *sp,
                        struct req_error *e) {
    const json_t *tc = json_object_get(body, "tool_choice"), *tools = json_object_get(body, "tools");
    const char *named = NULL;
    if (json_is_object(tc)) named = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    else if (!json_is_string(tc) || strcmp(json_string_value(tc), "required")) return 0;
    if (sp->kind != SO_NONE)
        return req_errorf(e, 400, "invalid_value", "tool_choice",
                          "'tool_choice' %s forces a tool call; it cannot be combined with '%s'",
                          named ? "naming a function" : "\"required\"", sp->param);
    struct tool_call_frame fr;
    if (tool_format_frame(fmt, &fr)) return req_errorf(e, 400, "unsupported", "tool_choice", "no tool-call format");
    struct buf g = {0}, alts = {0};
    size_t i;
    const json_t *t;
    int n = 0;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        if (named && strcmp(json_string_value(json_object_get(fn, "name")), named)) continue;
        if (put_call(&g, (int)i, fn, fmt, &fr, e)) {
            buf_free(&g), buf_free(&alts);
            return -1;
        }
        buf_printf(&alts, "%sc%zu", n++ ? " | " : "", i);
    }
    buf_printf(&g, "call ::= %s\n", alts.data);
    if (parallel && !named && *fr.separator) {
        buf_puts(&g, "root ::= call (");
        put_literal(&g, fr.separator, strlen(fr.separator));
        buf_puts(&g, " call)*\n");
    } else if (parallel && !named) {
        buf_puts(&g, "root ::= call+\n");
    } else {
        buf_puts(&g, "root ::= call\n");
    }
    buf_free(&alts);
    sp->kind = SO_EBNF;
    sp->len = g.len;
    sp->text = buf_take(&g);
    snprintf(sp->param, sizeof sp->param, "tool_choice");
    return 0;
}
