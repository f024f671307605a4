/* test_tool_choice.c — the grammar of a forced tool call (server/
 * tool_choice.h) in every tool-call format: texts of well-formed calls are
 * accepted whole and the format's own parser (chat/tool_parser.h, the
 * independent reader of model output) reads them back as the calls they
 * spell; calls of an unknown function, arguments off the tool's schema,
 * a second call when parallel calls are off, and free text are refused;
 * a named choice allows that function only; the refusals of the request
 * (another constraint beside it, a schema kiln cannot enforce) say why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/error.h"
#include "chat/tool_parser.h"
#include "grammar/grammar.h"
#include "server/json_req.h"
#include "server/structured.h"
#include "server/tool_choice.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"],"
    "\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"],"
    "\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

/* the grammar for tool_choice `choice` (JSON text) */
static struct grammar *forced(enum tool_format f, const char *choice, int parallel) {
    char body[4096];
    snprintf(body, sizeof body, "{\"tools\":%s,\"tool_choice\":%s}", TOOLS, choice);
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    struct so_spec sp = {0};
    struct req_error e = {0};
    if (tool_choice_grammar(b, f, parallel, &sp, &e)) fail_msg("tool_choice_grammar: %s", e.msg);
    assert_int_equal(sp.kind, SO_EBNF);
    assert_string_equal(sp.param, "tool_choice");
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_ebnf(sp.text, sp.len, NULL, &err);
    if (!g) fail_msg("compile: %s\n%s", err.msg, sp.text);
    so_spec_free(&sp);
    json_decref(b);
    return g;
}

static int accepts(struct grammar *g, const char *text) {
    struct kiln_error err = {0};
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, &err);
    assert_non_null(m);
    int ok = grammar_matcher_accept_bytes(m, text, strlen(text)) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_free(m);
    return ok;
}

/* the calls the format's parser reads in text: "name args;..." */
static void parsed(enum tool_format f, const char *text, char *out, size_t cap) {
    struct tool_parser p;
    tool_parser_init(&p, f, 1);
    struct buf s = {0};
    const struct tool_events *ev[2] = {tool_parser_feed(&p, text, strlen(text)), NULL};
    for (int k = 0; k < 2; k++) {
        if (k == 1) ev[1] = tool_parser_finish(&p);
        for (int i = 0; i < ev[k]->n; i++) {
            const struct tool_event *t = &ev[k]->v[i];
            if (t->kind == TOOL_EVENT_CALL) buf_printf(&s, "%s %s;", t->name, t->text);
            else buf_printf(&s, "content[%s];", t->text);
        }
    }
    snprintf(out, cap, "%s", s.data ? s.data : "");
    buf_free(&s);
    tool_parser_free(&p);
}

/* DeepSeek-V3's markers */
#define DSB "<｜tool▁calls▁begin｜>"
#define DSF "<｜tool▁calls▁end｜>"
#define DSC "<｜tool▁call▁begin｜>"
#define DSE "<｜tool▁call▁end｜>"
#define DSS "<｜tool▁sep｜>"

struct fmt_case {
    enum tool_format f;
    const char *one, *two; /* a call of get_weather; two calls (get_weather, add) */
};

static const struct fmt_case CASES[] = {
    {TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":-2}}\n</tool_call>"},
    {TOOL_FORMAT_LLAMA3_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\"}}",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\",\"unit\":\"c\"}}; "
     "{\"name\": \"add\", \"parameters\": {\"a\":1,\"b\":-2}}"},
    {TOOL_FORMAT_DEEPSEEK_V3,
     DSB DSC "function" DSS "get_weather\n```json\n{\"city\":\"Paris\"}\n```" DSE DSF,
     DSB DSC "function" DSS "get_weather\n```json\n{\"city\":\"Paris\",\"unit\":\"c\"}\n```" DSE DSF
     DSB DSC "function" DSS "add\n```json\n{\"a\":1,\"b\":-2}\n```" DSE DSF},
    {TOOL_FORMAT_MISTRAL, "[TOOL_CALLS]get_weather[ARGS]{\"city\":\"Paris\"}",
     "[TOOL_CALLS]get_weather[ARGS]{\"city\":\"Paris\",\"unit\":\"c\"}[TOOL_CALLS]add[ARGS]{\"a\":1,\"b\":-2}"},
};

static void test_formats(void **state) {
    (void)state;
    char got[1024];
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const struct fmt_case *c = &CASES[i];
        struct grammar *req = forced(c->f, "\"required\"", 1), *one = forced(c->f, "\"required\"", 0);
        struct grammar *named = forced(c->f, "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", 1);
        if (!accepts(req, c->one)) fail_msg("%s: refused %s", tool_format_name(c->f), c->one);
        if (!accepts(req, c->two)) fail_msg("%s: refused %s", tool_format_name(c->f), c->two);
        assert_true(accepts(one, c->one));
        assert_false(accepts(one, c->two)); /* parallel_tool_calls false: one call */
        assert_false(accepts(named, c->one)); /* only add */
        parsed(c->f, c->one, got, sizeof got);
        assert_string_equal(got, "get_weather {\"city\":\"Paris\"};");
        parsed(c->f, c->two, got, sizeof got);
        assert_string_equal(got, "get_weather {\"city\":\"Paris\",\"unit\":\"c\"};add {\"a\":1,\"b\":-2};");
        /* off the schema: a missing required property, a wrong type, an
         * unknown property, an unknown function, free text */
        const char *bad[] = {"{}", "{\"city\":3}", "{\"city\":\"x\",\"zip\":1}"};
        for (int k = 0; k < 3; k++) {
            char text[512];
            const char *at = strstr(c->one, "{\"city\"");
            snprintf(text, sizeof text, "%.*s%s%s", (int)(at - c->one), c->one, bad[k],
                     at + strlen("{\"city\":\"Paris\"}"));
            if (accepts(req, text)) fail_msg("%s: accepted %s", tool_format_name(c->f), text);
        }
        char text[512];
        const char *name = strstr(c->one, "get_weather");
        snprintf(text, sizeof text, "%.*sget_time%s", (int)(name - c->one), c->one, name + strlen("get_weather"));
        assert_false(accepts(req, text));
        assert_false(accepts(req, "Sure, let me check."));
        assert_false(accepts(req, ""));
        grammar_unref(req), grammar_unref(one), grammar_unref(named);
    }
}

/* a function without parameters takes any object */
static void test_no_parameters(void **state) {
    (void)state;
    struct grammar *g = forced(TOOL_FORMAT_HERMES, "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}", 1);
    assert_true(accepts(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    assert_true(accepts(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>"));
    assert_false(accepts(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": []}\n</tool_call>"));
    grammar_unref(g);
}

static void test_refusals(void **state) {
    (void)state;
    struct req_error e = {0};
    /* another constraint beside a forced call */
    json_t *b = json_pack("{s:o,s:s}", "tools", json_loads(TOOLS, 0, NULL), "tool_choice", "required");
    struct so_spec sp = {.kind = SO_JSON_OBJECT};
    snprintf(sp.param, sizeof sp.param, "response_format");
    assert_int_equal(tool_choice_grammar(b, TOOL_FORMAT_HERMES, 1, &sp, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "response_format"));
    json_decref(b);
    /* auto and none constrain nothing */
    b = json_pack("{s:o,s:s}", "tools", json_loads(TOOLS, 0, NULL), "tool_choice", "auto");
    struct so_spec none = {0};
    assert_int_equal(tool_choice_grammar(b, TOOL_FORMAT_HERMES, 1, &none, &e), 0);
    assert_int_equal(none.kind, SO_NONE);
    json_decref(b);
    /* parameters kiln cannot enforce: the tool is named */
    b = json_loads("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"not\":{}}}}],"
                   "\"tool_choice\":\"required\"}",
                   0, NULL);
    memset(&e, 0, sizeof e);
    assert_int_equal(tool_choice_grammar(b, TOOL_FORMAT_HERMES, 1, &none, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "'f'"));
    assert_non_null(strstr(e.msg, "not"));
    json_decref(b);
}

/* rule names of two translations live side by side */
static void test_prefix(void **state) {
    (void)state;
    const char src[] = "root ::= value \"a-b\" [a-z]{2,3} # value\nvalue ::= 'x' r1\nr1 ::= \"\\\"root\\\"\"\n";
    struct buf out = {0};
    struct kiln_error err = {0};
    assert_int_equal(grammar_ebnf_prefix_rules(src, sizeof src - 1, "p_", &out, &err), 0);
    assert_string_equal(out.data,
                        "p_root ::= p_value \"a-b\" [a-z]{2,3} # value\np_value ::= 'x' p_r1\np_r1 ::= \"\\\"root\\\"\"\n");
    buf_free(&out);
    assert_int_equal(grammar_ebnf_prefix_rules("a ::= \"x", 8, "p_", &out, &err), -1);
    buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_formats), cmocka_unit_test(test_no_parameters),
                                       cmocka_unit_test(test_refusals), cmocka_unit_test(test_prefix)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
