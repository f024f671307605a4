/* test_chat_template_oracle.c — every case of the oracle's
 * chat_templates.json (rendered by transformers' apply_chat_template for
 * real checkpoints) must come out byte for byte, and cases where
 * transformers raised must fail here too. Also covers loading templates
 * and special tokens from model folders in their several layouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "chat/chat_template.h"
#include "test_tmp.h"

static char *fixture(const char *rel) {
    const char *root = getenv("KILN_FIXTURES");
    assert_non_null(root);
    return path_join(root, rel);
}

static const char *token_text(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void test_oracle(void **state) {
    (void)state;
    char *path = fixture("oracle/chat_templates.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    free(path);
    assert_non_null(root);
    const char *name;
    json_t *entry;
    int total = 0, passed = 0;
    json_object_foreach(root, name, entry) {
        struct chat_template ct;
        struct kiln_error err;
        int rc = chat_template_init(&ct, json_string_value(json_object_get(entry, "template")),
                                    token_text(json_object_get(entry, "bos_token")),
                                    token_text(json_object_get(entry, "eos_token")), &err);
        if (rc) fprintf(stderr, "%s: %s\n", name, err.msg);
        assert_int_equal(rc, 0);
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(entry, "cases"), i, c) {
            struct chat_template_args args = {
                .messages = json_object_get(c, "messages"),
                .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            };
            char *out = NULL;
            size_t len = 0;
            rc = chat_template_render(&ct, &args, &out, &len, &err);
            const json_t *want = json_object_get(c, "rendered");
            int ok = want ? rc == 0 && len == json_string_length(want) && !memcmp(out, json_string_value(want), len)
                          : rc != 0;
            if (!ok)
                fprintf(stderr, "%s/%s gen=%d: expected %s\n  got %s\n", name, json_string_value(json_object_get(c, "name")),
                        args.add_generation_prompt, want ? json_string_value(want) : "(error)", rc ? err.msg : out);
            total++;
            passed += ok;
            free(out);
        }
        chat_template_free(&ct);
    }
    fprintf(stderr, "oracle chat templates: %d/%d cases match\n", passed, total);
    assert_true(total >= 32);
    assert_int_equal(passed, total);
    json_decref(root);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(p);
}

static char *render_dir(const char *dir, const char *messages_json, struct kiln_error *err) {
    struct chat_template ct;
    if (chat_template_load(&ct, dir, err)) return NULL;
    json_error_t je;
    json_t *msgs = json_loads(messages_json, 0, &je);
    struct chat_template_args args = {.messages = msgs, .add_generation_prompt = 1};
    char *out = NULL;
    size_t len;
    if (chat_template_render(&ct, &args, &out, &len, err)) out = NULL;
    json_decref(msgs);
    chat_template_free(&ct);
    return out;
}

static void test_load_layouts(void **state) {
    (void)state;
    struct kiln_error err;
    const char *msgs = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    /* a real tiny checkpoint from the oracle */
    char *dir = fixture("oracle/tiny-models/qwen3");
    char *out = render_dir(dir, msgs, &err);
    free(dir);
    assert_non_null(out);
    assert_string_equal(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(out);

    char *tmp = test_tmp_dir("chat");
    /* list of named templates, AddedToken-style special tokens */
    write_file(tmp, "tokenizer_config.json",
               "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": \"</s>\","
               " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"TOOLS\"},"
               " {\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}]}");
    out = render_dir(tmp, msgs, &err);
    assert_non_null(out);
    assert_string_equal(out, "<s>hi</s>");
    free(out);
    /* chat_template.jinja takes precedence (newer checkpoints) */
    write_file(tmp, "chat_template.jinja", "J:{{ messages|length }}{{ eos_token }}\n");
    out = render_dir(tmp, msgs, &err);
    assert_non_null(out);
    assert_string_equal(out, "J:1</s>");
    free(out);
    /* syntax errors name the file and position */
    write_file(tmp, "chat_template.jinja", "ok\n{% if x %}");
    assert_null(render_dir(tmp, msgs, &err));
    assert_non_null(strstr(err.msg, "chat_template.jinja: template:2:11: expected"));
    char *p = path_join(tmp, "chat_template.jinja");
    unlink(p);
    free(p);
    /* no template at all */
    write_file(tmp, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    assert_null(render_dir(tmp, msgs, &err));
    assert_non_null(strstr(err.msg, "no chat template"));
    p = path_join(tmp, "tokenizer_config.json");
    unlink(p);
    free(p);
    rmdir(tmp);
    free(tmp);
}

static void test_context(void **state) {
    (void)state;
    struct chat_template ct;
    struct kiln_error err;
    assert_int_equal(chat_template_init(&ct,
                                        "{{ tools is none }} {{ documents is none }} {{ bos_token is defined }} "
                                        "{{ add_generation_prompt }} {{ enable_thinking }}",
                                        NULL, "</s>", &err),
                     0);
    json_error_t je;
    json_t *msgs = json_loads("[]", 0, &je), *kw = json_loads("{\"enable_thinking\": false}", 0, &je);
    struct chat_template_args args = {.messages = msgs, .kwargs = kw};
    char *out;
    size_t len;
    assert_int_equal(chat_template_render(&ct, &args, &out, &len, &err), 0);
    assert_string_equal(out, "True True False False False");
    free(out);
    json_t *bad = json_loads("{\"messages\": []}", 0, &je);
    args.kwargs = bad;
    assert_int_not_equal(chat_template_render(&ct, &args, &out, &len, &err), 0);
    json_decref(bad);
    json_decref(msgs);
    json_decref(kw);
    chat_template_free(&ct);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle),
        cmocka_unit_test(test_load_layouts),
        cmocka_unit_test(test_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
