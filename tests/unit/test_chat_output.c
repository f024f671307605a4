/* test_chat_output.c — server/chat_output against the shapes of the OpenAI
 * chat API reference (written out by hand here): the message of an answer
 * that called tools (content null, tool_calls with id, type "function",
 * function.name and function.arguments as a JSON string, finish_reason
 * "tool_calls"), the stream deltas of a call (the first with index, id,
 * type, name and empty arguments, then the arguments), reasoning_content,
 * parallel_tool_calls false, and the request checks of tool_choice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "scheduler/engine.h"
#include "server/chat_output.h"
#include "server/json_req.h"

/* a equals the JSON text want, except that "id" values must only look right */
static void json_like(json_t *a, const char *want) {
    json_t *w = json_loads(want, 0, NULL);
    assert_non_null(w);
    char *as = json_dumps(a, JSON_SORT_KEYS | JSON_COMPACT), *ws = json_dumps(w, JSON_SORT_KEYS | JSON_COMPACT);
    if (!json_equal(a, w)) fail_msg("got  %s\nwant %s", as, ws);
    free(as);
    free(ws);
    json_decref(w);
}

/* replaces every "id" with "ID" after checking it is call_ + 24 */
static void scrub_ids(json_t *v) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (!strcmp(k, "id") && json_is_string(x)) {
                assert_int_equal(json_string_length(x), 29);
                assert_memory_equal(json_string_value(x), "call_", 5);
                json_object_set_new(v, k, json_string("ID"));
            } else {
                scrub_ids(x);
            }
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) scrub_ids(x);
    }
}

static const char *CALLS = "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                           "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

static void test_message_with_calls(void **state) {
    (void)state;
    struct chat_output_opts o = {.tools = TOOL_FORMAT_HERMES, .parallel_tool_calls = 1};
    struct chat_output c;
    chat_output_init(&c, &o, NULL, 0, 1);
    json_decref(chat_output_feed(&c, CALLS, strlen(CALLS), 1));
    json_t *m = chat_output_message(&c);
    scrub_ids(m);
    json_like(m, "{\"role\":\"assistant\",\"content\":\"I'll check.\",\"tool_calls\":["
                 "{\"id\":\"ID\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},"
                 "{\"id\":\"ID\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]}");
    assert_string_equal(chat_output_finish_reason(&c, "stop"), "tool_calls");
    assert_string_equal(chat_output_finish_reason(&c, "length"), "length");
    json_decref(m);
    chat_output_free(&c);

    /* only a call: content is null; parallel_tool_calls false keeps one */
    o.parallel_tool_calls = 0;
    chat_output_init(&c, &o, NULL, 0, 1);
    const char *only = CALLS + strlen("I'll check.\n");
    json_decref(chat_output_feed(&c, only, strlen(only), 1));
    m = chat_output_message(&c);
    scrub_ids(m);
    json_like(m, "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"ID\",\"type\":\"function\","
                 "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}");
    json_decref(m);
    chat_output_free(&c);

    /* no tools: plain content, finish_reason untouched */
    o.tools = TOOL_FORMAT_NONE;
    chat_output_init(&c, &o, NULL, 0, 1);
    json_decref(chat_output_feed(&c, only, strlen(only), 1));
    m = chat_output_message(&c);
    json_t *want = json_pack("{s:s,s:s}", "role", "assistant", "content", only);
    assert_true(json_equal(m, want));
    assert_string_equal(chat_output_finish_reason(&c, "stop"), "stop");
    json_decref(want);
    json_decref(m);
    chat_output_free(&c);
}

static void test_stream_deltas(void **state) {
    (void)state;
    struct chat_output_opts o = {.tools = TOOL_FORMAT_HERMES, .parallel_tool_calls = 1, .reasoning = REASONING_QWEN3};
    struct chat_output c;
    const char *prompt = "<|im_start|>assistant\n";
    chat_output_init(&c, &o, prompt, strlen(prompt), 1);
    const char *text = "<think>\nhmm\n</think>\n\nI'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\"}}\n</tool_call>";
    json_t *all = json_array();
    size_t len = strlen(text);
    for (size_t at = 0; at < len; at += 5) {
        size_t n = len - at < 5 ? len - at : 5;
        json_t *d = chat_output_feed(&c, text + at, n, at + n == len);
        json_array_extend(all, d);
        json_decref(d);
    }
    /* merge consecutive text deltas of the same key: their split is free */
    json_t *merged = json_array();
    size_t i;
    json_t *d;
    json_array_foreach(all, i, d) {
        json_t *last = json_array_size(merged) ? json_array_get(merged, json_array_size(merged) - 1) : NULL;
        const char *key = json_object_get(d, "content") ? "content" : "reasoning_content";
        if (last && !json_object_get(d, "tool_calls") && json_object_size(d) == 1 && json_object_size(last) == 1 &&
            json_object_get(last, key)) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s%s", json_string_value(json_object_get(last, key)),
                     json_string_value(json_object_get(d, key)));
            json_object_set_new(last, key, json_string(buf));
        } else {
            json_array_append(merged, d);
        }
    }
    scrub_ids(merged);
    json_like(merged, "[{\"reasoning_content\":\"hmm\"},{\"content\":\"I'll check.\"},"
                      "{\"tool_calls\":[{\"index\":0,\"id\":\"ID\",\"type\":\"function\",\"function\":"
                      "{\"name\":\"get_weather\",\"arguments\":\"\"}}]},"
                      "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}]");
    json_t *m = chat_output_message(&c);
    assert_string_equal(json_string_value(json_object_get(m, "reasoning_content")), "hmm");
    json_decref(m);
    json_decref(merged);
    json_decref(all);
    chat_output_free(&c);
}

static int parse(const char *body, struct chat_output_opts *o, struct req_error *e) {
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    struct engine_request r = {.skip_special_tokens = 1};
    int rc = chat_output_parse_request(b, TOOL_FORMAT_HERMES, REASONING_QWEN3, o, &r, e);
    json_decref(b);
    return rc;
}

#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]"

static void test_request(void **state) {
    (void)state;
    struct chat_output_opts o;
    struct req_error e;
    assert_int_equal(parse("{" TOOLS "}", &o, &e), 0);
    assert_int_equal(o.tools, TOOL_FORMAT_HERMES);
    assert_int_equal(o.parallel_tool_calls, 1);
    assert_int_equal(o.reasoning, REASONING_QWEN3);
    assert_int_equal(parse("{" TOOLS ",\"tool_choice\":\"none\",\"separate_reasoning\":false}", &o, &e), 0);
    assert_int_equal(o.tools, TOOL_FORMAT_NONE);
    assert_int_equal(o.reasoning, REASONING_NONE);
    assert_int_equal(parse("{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                           "\"parallel_tool_calls\":false}",
                           &o, &e),
                     0);
    assert_int_equal(o.parallel_tool_calls, 0);
    const char *bad[] = {
        "{" TOOLS ",\"tool_choice\":\"sometimes\"}",
        "{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
        "{" TOOLS ",\"tool_choice\":{\"type\":\"function\"}}",
        "{\"tool_choice\":\"required\"}",
        "{\"tools\":[{\"type\":\"function\"}]}",
        "{" TOOLS ",\"parallel_tool_calls\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        assert_int_not_equal(parse(bad[i], &o, &e), 0);
        assert_int_equal(e.status, 400);
    }
    memset(&e, 0, sizeof e);
    parse("{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", &o, &e);
    assert_string_equal(e.param, "tool_choice");
    assert_non_null(strstr(e.msg, "'g'"));
}

/* gpt-oss: the harmony reasoning parser and the harmony tool parser
 * together (analysis -> reasoning_content, the call -> tool_calls); the
 * request keeps the special tokens unless it says otherwise; forced tool
 * choices are refused for harmony. */
static void test_harmony(void **state) {
    (void)state;
    struct chat_output_opts o = {.tools = TOOL_FORMAT_HARMONY, .parallel_tool_calls = 1,
                                 .reasoning = REASONING_GPT_OSS};
    struct chat_output c;
    const char *prompt = "<|start|>user<|message|>Weather?<|end|><|start|>assistant";
    chat_output_init(&c, &o, prompt, strlen(prompt), 1);
    const char *text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    size_t len = strlen(text);
    for (size_t at = 0; at < len; at += 7) {
        size_t n = len - at < 7 ? len - at : 7;
        json_decref(chat_output_feed(&c, text + at, n, at + n == len));
    }
    json_t *m = chat_output_message(&c);
    scrub_ids(m);
    json_like(m, "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Need the weather.\","
                 "\"tool_calls\":[{\"id\":\"ID\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}");
    assert_string_equal(chat_output_finish_reason(&c, "stop"), "tool_calls");
    json_decref(m);
    chat_output_free(&c);

    struct engine_request r = {.skip_special_tokens = 1};
    struct req_error e;
    json_t *b = json_loads("{" TOOLS "}", 0, NULL);
    assert_int_equal(chat_output_parse_request(b, TOOL_FORMAT_HARMONY, REASONING_GPT_OSS, &o, &r, &e), 0);
    assert_int_equal(r.skip_special_tokens, 0);
    json_decref(b);
    r.skip_special_tokens = 1;
    b = json_loads("{\"skip_special_tokens\":true}", 0, NULL);
    assert_int_equal(chat_output_parse_request(b, TOOL_FORMAT_NONE, REASONING_GPT_OSS, &o, &r, &e), 0);
    assert_int_equal(r.skip_special_tokens, 1);
    json_decref(b);
    b = json_loads("{" TOOLS ",\"tool_choice\":\"required\"}", 0, NULL);
    memset(&e, 0, sizeof e);
    assert_int_not_equal(chat_output_parse_request(b, TOOL_FORMAT_HARMONY, REASONING_GPT_OSS, &o, &r, &e), 0);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "harmony"));
    json_decref(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_with_calls),
        cmocka_unit_test(test_stream_deltas),
        cmocka_unit_test(test_request),
        cmocka_unit_test(test_harmony),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
