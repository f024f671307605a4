/* test_tool_parser.c — chat/tool_parser against the exact text each model
 * family writes for a tool call: the Qwen3 and DeepSeek-V3 strings are
 * rendered by the real chat templates (an assistant turn with tool_calls,
 * which is what the models are trained to emit), the Llama-3.1 and Mistral
 * ones come from their public prompt-format docs. Every text is parsed
 * whole, fed split at every byte position, and fed one byte at a time: the
 * content and the calls must be the same each time, content must never end
 * inside a UTF-8 character, and malformed calls must come back as content. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/utf8.h"
#include "chat/chat_template.h"
#include "chat/tool_parser.h"

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

struct result {
    struct buf content;
    int n;
    char names[8][64];
    char args[8][256];
    char ids[8][32];
    int index[8];
};

static void collect(struct result *r, const struct tool_events *ev) {
    for (int i = 0; i < ev->n; i++) {
        const struct tool_event *v = &ev->v[i];
        if (v->kind == TOOL_EVENT_CONTENT) {
            assert_int_equal(utf8_cut(v->text, v->len), v->len); /* never inside a character */
            buf_append(&r->content, v->text, v->len);
            continue;
        }
        assert_true(r->n < 8);
        snprintf(r->names[r->n], 64, "%s", v->name);
        snprintf(r->args[r->n], 256, "%s", v->text);
        snprintf(r->ids[r->n], 32, "%s", v->id);
        r->index[r->n] = v->index;
        r->n++;
    }
}

/* Feeds text in pieces cut at cuts[0..ncut). */
static void feed_cuts(enum tool_format f, const char *text, size_t len, const size_t *cuts, int ncut,
                      struct result *r) {
    struct tool_parser p;
    memset(r, 0, sizeof *r);
    tool_parser_init(&p, f, 42);
    size_t at = 0;
    for (int i = 0; i <= ncut; i++) {
        size_t end = i < ncut ? cuts[i] : len;
        collect(r, tool_parser_feed(&p, text + at, end - at));
        at = end;
    }
    collect(r, tool_parser_finish(&p));
    tool_parser_free(&p);
}

static void same(const struct result *a, const struct result *b, const char *what, size_t at) {
    if (a->content.len != b->content.len ||
        (a->content.len && memcmp(a->content.data, b->content.data, a->content.len)))
        fail_msg("%s at %zu: content \"%s\" vs \"%s\"", what, at, a->content.data ? a->content.data : "",
                 b->content.data ? b->content.data : "");
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_string_equal(a->names[i], b->names[i]);
        assert_string_equal(a->args[i], b->args[i]);
        assert_string_equal(a->ids[i], b->ids[i]);
        assert_int_equal(a->index[i], i);
    }
}

/* Parses text every way and checks the result against the expected
 * content and calls (names[i], args[i]; n calls). */
static void check(enum tool_format f, const char *text, const char *content, int n, const char *const *names,
                  const char *const *args) {
    size_t len = strlen(text);
    struct result whole, r;
    memset(&whole, 0, sizeof whole);
    struct tool_events ev = {0};
    tool_parse_whole(f, 42, text, len, &ev);
    collect(&whole, &ev);
    tool_events_free(&ev);
    const char *got = whole.content.data ? whole.content.data : "";
    if (strcmp(got, content)) fail_msg("content: \"%s\", want \"%s\"", got, content);
    assert_int_equal(whole.n, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(whole.names[i], names[i]);
        assert_string_equal(whole.args[i], args[i]);
        const char *id = whole.ids[i];
        if (f == TOOL_FORMAT_MISTRAL) assert_int_equal(strlen(id), 9);
        else assert_true(strlen(id) == 29 && !strncmp(id, "call_", 5));
    }
    for (size_t cut = 0; cut <= len; cut++) {
        feed_cuts(f, text, len, &cut, 1, &r);
        same(&r, &whole, "split", cut);
        buf_free(&r.content);
    }
    size_t *cuts = malloc(len * sizeof *cuts);
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    feed_cuts(f, text, len, cuts, (int)len, &r);
    same(&r, &whole, "bytewise", 0);
    buf_free(&r.content);
    free(cuts);
    buf_free(&whole.content);
}

/* The assistant turn a real chat template renders for tool calls. */
static char *render_turn(const char *model, const char *messages, const char *begin, const char *end) {
    const char *root = getenv("KILN_TOKENIZERS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root ? root : ".cache/tokenizers", model);
    struct chat_template ct;
    struct kiln_error err;
    if (chat_template_load(&ct, dir, &err)) fail_msg("%s: %s", dir, err.msg);
    json_t *msgs = json_loads(messages, 0, NULL);
    assert_non_null(msgs);
    struct chat_template_args a = {.messages = msgs};
    char *out;
    size_t len;
    if (chat_template_render(&ct, &a, &out, &len, &err)) fail_msg("render: %s", err.msg);
    json_decref(msgs);
    chat_template_free(&ct);
    const char *b = strstr(out, begin);
    assert_non_null(b);
    b += strlen(begin);
    const char *e = strstr(b, end);
    assert_non_null(e);
    char *turn = strndup(b, (size_t)(e - b));
    free(out);
    return turn;
}

static const char *const NAMES2[] = {"get_weather", "get_time"};
static const char *const ARGS2[] = {"{\"city\": \"Paris\", \"unit\": \"c\"}", "{\"tz\": \"Europe/Paris\"}"};

static void test_hermes_qwen3_template(void **state) {
    (void)state;
    /* arguments as objects: the template writes them with tojson */
    char *turn = render_turn("qwen3",
                             "[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":\"\","
                             "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                             "\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}},{\"type\":\"function\",\"function\":"
                             "{\"name\":\"get_time\",\"arguments\":{\"tz\":\"Europe/Paris\"}}}]}]",
                             "<|im_start|>assistant\n", "<|im_end|>");
    assert_string_equal(turn, "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
                              "\"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>");
    const char *calls = turn + strlen("<think>\n\n</think>\n\n");
    check(TOOL_FORMAT_HERMES, calls, "", 2, NAMES2, ARGS2);
    /* text before the calls: whitespace before a call is not content */
    char with[1024];
    snprintf(with, sizeof with, "Let me check. 😀\n\n%s\n", calls);
    check(TOOL_FORMAT_HERMES, with, "Let me check. 😀", 2, NAMES2, ARGS2);
    free(turn);
    /* a call the model did not close before stopping still counts (vLLM) */
    check(TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n",
          "", 1, NAMES2 + 1, ARGS2 + 1);
}

static void test_hermes_malformed(void **state) {
    (void)state;
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\nnot json\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\"} trailing\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
        "a <tool_call and </tool_call> <tool_",
        "plain answer with no call\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) check(TOOL_FORMAT_HERMES, bad[i], bad[i], 0, NULL, NULL);
    /* a bad call then a good one: the good one is a call */
    const char *name[] = {"f"}, *args[] = {"{}"};
    check(TOOL_FORMAT_HERMES, "<tool_call>x</tool_call>\n<tool_call>{\"name\": \"f\"}</tool_call>",
          "<tool_call>x</tool_call>", 1, name, args);
    /* escapes in the name, big numbers kept as written */
    const char *n2[] = {"f\"q"}, *a2[] = {"{\"n\": 123456789012345678901234567890, \"x\": 0.1}"};
    check(TOOL_FORMAT_HERMES,
          "<tool_call>\n{\"name\": \"f\\\"q\", \"arguments\": {\"n\": 123456789012345678901234567890, \"x\": 0.1}}\n"
          "</tool_call>",
          "", 1, n2, a2);
}

static void test_deepseek_v3_template(void **state) {
    (void)state;
    /* DeepSeek-V3's template concatenates arguments: they are strings */
    char *turn = render_turn(
        "deepseek_v3",
        "[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", "
        "\\\"unit\\\": \\\"c\\\"}\"}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":"
        "\"{\\\"tz\\\": \\\"Europe/Paris\\\"}\"}}]}]",
        "<｜Assistant｜>", "<｜end▁of▁sentence｜>");
    assert_string_equal(turn, DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "get_weather\n```json\n{\"city\": "
                              "\"Paris\", \"unit\": \"c\"}\n```" DS_CALL_END "\n" DS_CALL_BEGIN "function" DS_SEP
                              "get_time\n```json\n{\"tz\": \"Europe/Paris\"}\n```" DS_CALL_END DS_CALLS_END);
    check(TOOL_FORMAT_DEEPSEEK_V3, turn, "", 2, NAMES2, ARGS2);
    char with[1024];
    snprintf(with, sizeof with, "Sure.%s", turn);
    check(TOOL_FORMAT_DEEPSEEK_V3, with, "Sure.", 2, NAMES2, ARGS2);
    free(turn);
    /* V3.1: the name before the separator, the arguments bare */
    check(TOOL_FORMAT_DEEPSEEK_V31,
          DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP "{\"city\": \"Paris\", \"unit\": \"c\"}" DS_CALL_END
              DS_CALL_BEGIN "get_time" DS_SEP "{\"tz\": \"Europe/Paris\"}" DS_CALL_END DS_CALLS_END,
          "", 2, NAMES2, ARGS2);
    /* a dropped marker does not join the text around it into a new one */
    check(TOOL_FORMAT_DEEPSEEK_V3, "<｜tool▁calls▁beg" DS_CALL_END "in｜>x", "<｜tool▁calls▁begin｜>x", 0, NULL, NULL);
    /* a malformed call is content; the section and call-end markers go */
    check(TOOL_FORMAT_DEEPSEEK_V3, DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "f\n```json\n{oops}\n```" DS_CALL_END,
          DS_CALL_BEGIN "function" DS_SEP "f\n```json\n{oops}\n```", 0, NULL, NULL);
}

static void test_llama3_json(void **state) {
    (void)state;
    /* Llama-3.1's template writes {"name": ..., "parameters": tojson} */
    const char *one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}";
    check(TOOL_FORMAT_LLAMA3_JSON, one, "", 1, NAMES2, ARGS2);
    char buf[512];
    snprintf(buf, sizeof buf, "<|python_tag|>%s; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"Europe/Paris\"}}",
             one);
    check(TOOL_FORMAT_LLAMA3_JSON, buf, "", 2, NAMES2, ARGS2);
    /* Llama-3.2 adds "type"; "arguments" is accepted too */
    check(TOOL_FORMAT_LLAMA3_JSON,
          "\n{\"type\": \"function\", \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}",
          "", 1, NAMES2, ARGS2);
    /* not at the start: an answer that shows JSON is content */
    const char *txt[] = {"Here: {\"name\": \"f\", \"parameters\": {}}", "{\"name\": 3}", "{not json}",
                         "<|python_tag|>brave_search.call(query=\"x\")", "{\"name\": \"f\""};
    for (size_t i = 0; i < 5; i++) check(TOOL_FORMAT_LLAMA3_JSON, txt[i], txt[i], 0, NULL, NULL);
    /* text after a call ends the calls */
    check(TOOL_FORMAT_LLAMA3_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}} ok",
          " ok", 1, NAMES2, ARGS2);
    /* a ";" after a call with no call behind it: the text from the
     * whitespace before it on is content, byte for byte */
    check(TOOL_FORMAT_LLAMA3_JSON,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}\r\n ;\r done",
          "\r\n ;\r done", 1, NAMES2, ARGS2);
}

static void test_mistral(void **state) {
    (void)state;
    /* Mistral-7B-Instruct-v0.3 (tokenizer v3): one marker, a JSON array */
    check(TOOL_FORMAT_MISTRAL,
          "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}, "
          "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}]",
          "", 2, NAMES2, ARGS2);
    check(TOOL_FORMAT_MISTRAL, "Hello[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}]",
          "Hello", 1, NAMES2 + 1, ARGS2 + 1);
    /* tokenizer v11+: a marker per call; [ARGS] kept or skipped; [CALL_ID] */
    check(TOOL_FORMAT_MISTRAL,
          "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"c\"}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e"
          "[ARGS]{\"tz\": \"Europe/Paris\"}",
          "", 2, NAMES2, ARGS2);
    check(TOOL_FORMAT_MISTRAL,
          "[TOOL_CALLS]get_weather{\"city\": \"Paris\", \"unit\": \"c\"}[TOOL_CALLS]get_time{\"tz\": \"Europe/Paris\"}",
          "", 2, NAMES2, ARGS2);
    const char *bad[] = {"[TOOL_CALLS] not json at all", "[TOOL_CALLS][{\"name\": \"f\"}, 3]", "[TOOL_CALLS]f[ARGS]{",
                         "[TOOL_CALLS]"};
    for (size_t i = 0; i < 4; i++) check(TOOL_FORMAT_MISTRAL, bad[i], bad[i], 0, NULL, NULL);
}

/* The frames the grammar layer will build calls from read back as calls. */
/* gpt-oss (harmony): calls as the model writes them (the recipient after
 * the channel, <|constrain|>json) and as its chat template renders past
 * ones (the recipient before it); thoughts are content without a
 * reasoning parser; a call whose arguments are no JSON object is content
 * in the template's form. */
static void test_harmony(void **state) {
    (void)state;
    const enum tool_format H = TOOL_FORMAT_HARMONY;
    check(H, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
             "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>",
          "Need weather.", 1, NAMES2, ARGS2);
    check(H, "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", "
             "\"unit\": \"c\"}<|call|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>"
             "{\"tz\": \"Europe/Paris\"}<|call|>",
          "", 2, NAMES2, ARGS2);
    /* the output opens inside the prompt's header: a recipient may lead */
    check(H, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>",
          "", 1, NAMES2, ARGS2);
    check(H, "<|channel|>final<|message|>It is sunny. ☀", "It is sunny. ☀", 0, NULL, NULL);
    check(H, "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>not json",
          "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>not json<|call|>", 0, NULL, NULL);
    enum tool_format f;
    assert_int_equal(tool_format_from_name("openai", &f), 0);
    assert_int_equal(f, H);
    assert_string_equal(tool_format_name(H), "harmony");
    assert_int_equal(tool_format_detect("{{- \"<|start|>assistant to=\" }}{{- \"<|channel|>commentary \" }}"), H);
    struct tool_call_frame fr;
    assert_int_equal(tool_format_frame(H, &fr), -1);
}

static void test_frames(void **state) {
    (void)state;
    enum tool_format fs[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_LLAMA3_JSON, TOOL_FORMAT_DEEPSEEK_V3,
                             TOOL_FORMAT_DEEPSEEK_V31, TOOL_FORMAT_MISTRAL};
    for (size_t i = 0; i < 5; i++) {
        struct tool_call_frame fr;
        assert_int_equal(tool_format_frame(fs[i], &fr), 0);
        char text[1024];
        /* a second call in a deepseek section opens no second section */
        int ds = fs[i] == TOOL_FORMAT_DEEPSEEK_V3 || fs[i] == TOOL_FORMAT_DEEPSEEK_V31;
        snprintf(text, sizeof text, "%s%s%s%s%s%s%s%s", fr.before_name, "get_weather", fr.after_name, ARGS2[0],
                 fr.end, fr.separator, fr.before_name + (ds ? strlen(DS_CALLS_BEGIN) : 0), "get_time");
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s%s", fr.after_name, ARGS2[1], fr.end);
        assert_non_null(strstr(text, fr.trigger));
        check(fs[i], text, "", 2, NAMES2, ARGS2);
    }
    struct tool_call_frame fr;
    assert_int_equal(tool_format_frame(TOOL_FORMAT_NONE, &fr), -1);
}

static void test_names_and_detect(void **state) {
    (void)state;
    enum tool_format f;
    assert_int_equal(tool_format_from_name("hermes", &f), 0);
    assert_int_equal(f, TOOL_FORMAT_HERMES);
    assert_int_equal(tool_format_from_name("qwen25", &f), 0);
    assert_int_equal(f, TOOL_FORMAT_HERMES);
    assert_int_equal(tool_format_from_name("deepseekv3", &f), 0);
    assert_int_equal(f, TOOL_FORMAT_DEEPSEEK_V3);
    assert_int_equal(tool_format_from_name("llama3_json", &f), 0);
    assert_int_equal(f, TOOL_FORMAT_LLAMA3_JSON);
    assert_int_equal(tool_format_from_name("pythonic", &f), -1);
    const char *models[] = {"qwen3", "deepseek_v3", "llama3"};
    enum tool_format want[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_DEEPSEEK_V3, TOOL_FORMAT_NONE};
    for (int i = 0; i < 3; i++) {
        const char *root = getenv("KILN_TOKENIZERS");
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", root ? root : ".cache/tokenizers", models[i]);
        struct chat_template ct;
        struct kiln_error err;
        if (chat_template_load(&ct, dir, &err)) fail_msg("%s: %s", dir, err.msg);
        assert_int_equal(tool_format_detect(ct.source), want[i]);
        chat_template_free(&ct);
    }
    assert_int_equal(tool_format_detect("{{- '<|python_tag|>' }}"), TOOL_FORMAT_LLAMA3_JSON);
    assert_int_equal(tool_format_detect("[TOOL_CALLS]"), TOOL_FORMAT_MISTRAL);
    assert_int_equal(tool_format_detect(DS_CALL_BEGIN "{{name}}" DS_SEP), TOOL_FORMAT_DEEPSEEK_V31);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes_qwen3_template), cmocka_unit_test(test_hermes_malformed),
        cmocka_unit_test(test_deepseek_v3_template),  cmocka_unit_test(test_llama3_json),
        cmocka_unit_test(test_mistral),               cmocka_unit_test(test_frames),
        cmocka_unit_test(test_names_and_detect), cmocka_unit_test(test_harmony),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
