/* test_json_util.c — json_load_checkpoint reads integers beyond int64 (as
 * Python writes them into checkpoint files) as reals with the value Python's
 * float() gives, leaves everything else as jansson reads it, and reports
 * errors at the position of the text as given; every checkpoint reader
 * (config, generation config, tokenizer, chat template, safetensors) goes
 * through it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/json_util.h"
#include "base/mem.h"
#include "test_tmp.h"
#include "chat/chat_template.h"
#include "kiln/tokenizer.h"
#include "model/config.h"
#include "model/safetensors.h"

/* int(1e30): Llama-2, Llama-3 and gpt-oss tokenizer_config.json. */
#define HF_BIG "1000000000000000019884624838656"
/* a real of the same length */
#define R31 "1.00000000000000001988462483866"

static json_t *load(const char *s, json_error_t *je) { return json_load_checkpoint(s, strlen(s), 0, je); }

static void test_big_integers_are_reals(void **state) {
    (void)state;
    json_error_t je;
    /* jansson alone refuses it */
    assert_null(json_loads("{\"model_max_length\": " HF_BIG "}", 0, &je));
    json_t *j = load("{\"model_max_length\": " HF_BIG ", \"n\": 131072, \"neg\": -" HF_BIG
                     ", \"max\": 9223372036854775807, \"min\": -9223372036854775808,"
                     " \"over\": 9223372036854775808, \"under\": -9223372036854775809,"
                     " \"r\": 1.5e3, \"s\": \"" HF_BIG "\", \"e\": \"\\\"12345678901234567890123\"}",
                     &je);
    assert_non_null(j);
    json_t *v = json_object_get(j, "model_max_length");
    assert_true(json_is_real(v));
    assert_true(json_real_value(v) == 1e30); /* Python: float(int(1e30)) == 1e30 */
    assert_true(json_real_value(json_object_get(j, "neg")) == -1e30);
    assert_true(json_is_integer(json_object_get(j, "n")));
    assert_int_equal(json_integer_value(json_object_get(j, "n")), 131072);
    assert_true(json_is_integer(json_object_get(j, "max")));
    assert_true(json_integer_value(json_object_get(j, "max")) == INT64_MAX);
    assert_true(json_is_integer(json_object_get(j, "min")));
    assert_true(json_integer_value(json_object_get(j, "min")) == INT64_MIN);
    assert_true(json_is_real(json_object_get(j, "over")));
    assert_true(json_real_value(json_object_get(j, "over")) == 9223372036854775808.0);
    assert_true(json_real_value(json_object_get(j, "under")) == -9223372036854775809.0);
    assert_true(json_real_value(json_object_get(j, "r")) == 1500.0);
    /* digits inside strings (also after an escaped quote) stay as written */
    assert_string_equal(json_string_value(json_object_get(j, "s")), HF_BIG);
    assert_string_equal(json_string_value(json_object_get(j, "e")), "\"12345678901234567890123");
    json_decref(j);
}

static void test_errors_point_into_the_text(void **state) {
    (void)state;
    json_error_t je, want;
    /* A syntax error after big integers on the same line and the line
     * before: jansson's own report for the same text with reals of the
     * same length in their place is the truth (the ".0" marks added for the
     * big integers must not shift it). */
    const char *bad = "{\"a\": [" HF_BIG ",\n " HF_BIG ", " HF_BIG ", ]}";
    const char *same = "{\"a\": [" R31 ",\n " R31 ", " R31 ", ]}";
    assert_int_equal(strlen(R31), strlen(HF_BIG));
    assert_null(load(bad, &je));
    assert_null(json_loads(same, 0, &want));
    assert_int_equal(je.line, 2);
    assert_int_equal(je.line, want.line);
    assert_int_equal(je.column, want.column);
    assert_int_equal(je.position, want.position);
    assert_string_equal(je.text, want.text);
    /* a real beyond double stays an error; flags still apply */
    assert_null(load("{\"a\": " HF_BIG ", \"b\": 1e400}", &je));
    assert_int_equal(json_error_code(&je), json_error_numeric_overflow);
    const char *dup = "{\"a\": " HF_BIG ", \"a\": 1}";
    assert_null(json_load_checkpoint(dup, strlen(dup), JSON_REJECT_DUPLICATES, &je));
    assert_int_equal(json_error_code(&je), json_error_duplicate_key);
    assert_null(json_load_checkpoint_file("/nonexistent/tokenizer_config.json", 0, &je));
    assert_non_null(strstr(je.text, "/nonexistent/tokenizer_config.json"));
    assert_int_equal(je.line, -1);
}

static char *tmpdir_with(const char *name, const char *text) {
    char *dir = test_tmp_dir("json_util");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return dir;
}

static void rm_dir(char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* tokenizer_config.json as Meta-Llama-3-8B-Instruct ships it (the fields
 * the readers look at, with its real model_max_length). */
static const char llama3_config[] =
    "{\n  \"added_tokens_decoder\": {\n    \"128000\": {\"content\": \"<|begin_of_text|>\", \"lstrip\": false,"
    " \"normalized\": false, \"rstrip\": false, \"single_word\": false, \"special\": true}\n  },\n"
    "  \"bos_token\": \"<|begin_of_text|>\",\n"
    "  \"chat_template\": \"{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\\n\\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\\n\\n{% endif %}\",\n"
    "  \"clean_up_tokenization_spaces\": true,\n  \"eos_token\": \"<|eot_id|>\",\n"
    "  \"model_input_names\": [\"input_ids\", \"attention_mask\"],\n"
    "  \"model_max_length\": " HF_BIG ",\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n";

static void test_chat_template_reads_real_config(void **state) {
    (void)state;
    char *dir = tmpdir_with("tokenizer_config.json", llama3_config);
    struct chat_template ct;
    struct kiln_error err = {0};
    if (chat_template_load(&ct, dir, &err)) fail_msg("%s", err.msg);
    json_error_t je;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi \"}]", 0, &je);
    struct chat_template_args a = {.messages = msgs, .add_generation_prompt = 1};
    char *out;
    size_t len;
    assert_int_equal(chat_template_render(&ct, &a, &out, &len, &err), 0);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    json_decref(msgs);
    chat_template_free(&ct);
    rm_dir(dir, "tokenizer_config.json");
}

/* config.json and generation_config.json with a big integer in a field kiln
 * does not read still load. */
static void test_config_with_big_integer(void **state) {
    (void)state;
    const char *cfg_text =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
        " \"intermediate_size\": 128, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
        " \"num_hidden_layers\": 1, \"vocab_size\": 32, \"max_position_embeddings\": 128,"
        " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"torch_dtype\": \"float32\","
        " \"tie_word_embeddings\": false, \"max_sequence_length\": " HF_BIG "}";
    struct model_config c;
    struct kiln_error err = {0};
    if (model_config_parse(&c, cfg_text, strlen(cfg_text), "config.json", &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.hidden_size, 64);
    struct generation_config g;
    const char *gen = "{\"eos_token_id\": 2, \"max_length\": " HF_BIG "}";
    if (generation_config_parse(&g, gen, strlen(gen), "generation_config.json", &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(g.n_eos, 1);
    assert_int_equal(g.eos_token_ids[0], 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_big_integers_are_reals),
        cmocka_unit_test(test_errors_point_into_the_text),
        cmocka_unit_test(test_chat_template_reads_real_config),
        cmocka_unit_test(test_config_with_big_integer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
