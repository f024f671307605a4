/* fuzz_tool_parser.c — arbitrary bytes as model output through every
 * tool-call parser, both reasoning starts and gpt-oss's harmony: the first byte picks where
 * the text is split (and a second split), and the split feed must decide
 * exactly the content and calls the whole-text parse decides; content
 * never ends inside a UTF-8 character mid-stream, and every call's
 * arguments are a JSON object. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/error.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct agg {
    struct buf content, calls;
};

static int same(const struct buf *a, const struct buf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len));
}

static void add(struct agg *a, const struct tool_events *ev) {
    for (int i = 0; i < ev->n; i++) {
        const struct tool_event *v = &ev->v[i];
        if (v->kind == TOOL_EVENT_CONTENT) {
            buf_append(&a->content, v->text, v->len);
            continue;
        }
        json_t *args = json_loadb(v->text, v->len, 0, NULL);
        /* jansson refuses huge integers the strict scanner accepts */
        if (!args) {
            json_error_t e;
            json_t *again = json_loadb(v->text, v->len, JSON_DECODE_INT_AS_REAL, &e);
            KILN_ASSERT(again == NULL || json_is_object(again));
            json_decref(again);
        } else {
            KILN_ASSERT(json_is_object(args));
        }
        json_decref(args);
        buf_printf(&a->calls, "%d|%s|%s|", v->index, v->id, v->name);
        buf_append(&a->calls, v->text, v->len);
        buf_push(&a->calls, '\n');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t c1 = data[0] % (size - 1), c2 = c1 + data[1] % (size - 1 - c1 + 1);
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    if (c1 > len) c1 = len;
    if (c2 > len) c2 = len;
    enum tool_format fs[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_LLAMA3_JSON, TOOL_FORMAT_DEEPSEEK_V3,
                             TOOL_FORMAT_DEEPSEEK_V31, TOOL_FORMAT_MISTRAL, TOOL_FORMAT_HARMONY,
                             TOOL_FORMAT_NONE};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        struct agg whole = {0}, split = {0};
        struct tool_events ev = {0};
        tool_parse_whole(fs[k], 7, text, len, &ev);
        add(&whole, &ev);
        tool_events_free(&ev);
        struct tool_parser p;
        tool_parser_init(&p, fs[k], 7);
        add(&split, tool_parser_feed(&p, text, c1));
        add(&split, tool_parser_feed(&p, text + c1, c2 - c1));
        add(&split, tool_parser_feed(&p, text + c2, len - c2));
        add(&split, tool_parser_finish(&p));
        tool_parser_free(&p);
        KILN_ASSERT(same(&whole.content, &split.content));
        KILN_ASSERT(same(&whole.calls, &split.calls));
        if (fs[k] == TOOL_FORMAT_NONE) KILN_ASSERT(whole.content.len == len && !whole.calls.len);
        buf_free(&whole.content), buf_free(&whole.calls), buf_free(&split.content), buf_free(&split.calls);
    }
    for (int v = 0; v < 3; v++) { /* qwen3 outside and inside the think block, gpt_oss */
        enum reasoning_format rf = v < 2 ? REASONING_QWEN3 : REASONING_GPT_OSS;
        int in_think = v == 1;
        struct buf r1 = {0}, t1 = {0}, r2 = {0}, t2 = {0};
        struct reasoning_parser r;
        reasoning_parser_init_format(&r, rf, in_think);
        reasoning_parser_feed(&r, text, len, &r1, &t1);
        reasoning_parser_finish(&r, &r1, &t1);
        reasoning_parser_free(&r);
        reasoning_parser_init_format(&r, rf, in_think);
        reasoning_parser_feed(&r, text, c1, &r2, &t2);
        reasoning_parser_feed(&r, text + c1, c2 - c1, &r2, &t2);
        reasoning_parser_feed(&r, text + c2, len - c2, &r2, &t2);
        reasoning_parser_finish(&r, &r2, &t2);
        reasoning_parser_free(&r);
        KILN_ASSERT(same(&r1, &r2));
        KILN_ASSERT(same(&t1, &t2));
        buf_free(&r1), buf_free(&t1), buf_free(&r2), buf_free(&t2);
    }
    return 0;
}
