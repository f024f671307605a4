/* The small tokenizers in the repository: the byte-level BPE of the tiny
 * test models (ids the reference checkpoints were run with) and the
 * SentencePiece-style BPE of stories260K (llama2.c's encode of its prompts,
 * and its generated text as decode of the ids). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "kiln/tokenizer.h"

static struct kiln_tokenizer *load_dir(const char *dir) {
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    if (kiln_tokenizer_load(&tok, dir, &err)) fail_msg("load %s: %s", dir, err.msg);
    return tok;
}

/* Reads tensor `name` (I32) of a safetensors file. */
static int32_t *read_ids(const char *path, const char *name, size_t *n) {
    char *buf;
    size_t len;
    struct kiln_error err;
    if (file_read_all(path, &buf, &len, &err)) fail_msg("%s", err.msg);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    json_error_t je;
    json_t *h = json_loadb(buf + 8, hlen, 0, &je);
    assert_non_null(h);
    json_t *t = json_object_get(h, name);
    assert_non_null(t);
    size_t a = (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    size_t b = (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1));
    *n = (b - a) / 4;
    int32_t *ids = malloc(b - a + 4);
    memcpy(ids, buf + 8 + hlen + a, b - a);
    json_decref(h);
    free(buf);
    return ids;
}

static void test_tiny_models(void **state) {
    (void)state;
    const char *fx = getenv("KILN_FIXTURES");
    const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"};
    char dir[4096], path[4200];
    struct kiln_error err;
    struct kiln_token_ids ids = {0};
    int checked = 0;
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        snprintf(dir, sizeof dir, "%s/oracle/tiny-models/%s", fx, archs[a]);
        struct kiln_tokenizer *tok = load_dir(dir);
        snprintf(path, sizeof path, "%s/reference.json", dir);
        json_error_t je;
        json_t *ref = json_load_file(path, 0, &je);
        assert_non_null(ref);
        json_t *prompts = json_object_get(ref, "prompts");
        snprintf(path, sizeof path, "%s/reference.safetensors", dir);
        for (size_t i = 0; i < json_array_size(prompts); i++) {
            json_t *p = json_array_get(prompts, i);
            const char *text = json_string_value(json_object_get(p, "prompt"));
            size_t plen = (size_t)json_integer_value(json_object_get(p, "prompt_len")), n;
            char name[32];
            snprintf(name, sizeof name, "p%zu.ids", i);
            int32_t *want = read_ids(path, name, &n);
            assert_int_equal(kiln_tokenizer_encode(tok, text, strlen(text), 1, &ids, &err), 0);
            if (ids.n != plen || memcmp(ids.ids, want, plen * sizeof *want))
                fail_msg("%s prompt %zu: ids differ (got %zu ids, want %zu)", archs[a], i, ids.n, plen);
            /* The whole reference sequence round-trips through decode. */
            char *dec;
            size_t dec_len;
            assert_int_equal(kiln_tokenizer_decode(tok, want, plen, 0, &dec, &dec_len, &err), 0);
            assert_string_equal(dec, text);
            free(dec);
            free(want);
            checked++;
        }
        assert_int_equal(kiln_tokenizer_eos_id(tok), kiln_tokenizer_token_to_id(tok, "<|im_end|>", 10));
        assert_int_equal(kiln_tokenizer_bos_id(tok), -1);
        json_decref(ref);
        kiln_tokenizer_free(tok);
    }
    fprintf(stderr, "tiny models: %d prompts match\n", checked);
    kiln_token_ids_free(&ids);
}

static void test_stories260k(void **state) {
    (void)state;
    const char *models = getenv("KILN_MODELS");
    char dir[4096], path[4200];
    struct kiln_error err;
    struct kiln_token_ids ids = {0};
    snprintf(dir, sizeof dir, "%s/stories260K", models ? models : "models");
    struct kiln_tokenizer *tok = load_dir(dir);
    assert_int_equal(kiln_tokenizer_bos_id(tok), 1);
    assert_int_equal(kiln_tokenizer_eos_id(tok), 2);
    assert_int_equal(kiln_tokenizer_add_bos_token(tok), 1);
    snprintf(path, sizeof path, "%s/reference_llama2c.json", dir);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    assert_non_null(ref);
    json_t *prompts = json_object_get(ref, "prompts");
    assert_true(json_array_size(prompts) > 0);
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_array_get(prompts, i);
        const char *text = json_string_value(json_object_get(p, "prompt"));
        json_t *want = json_object_get(p, "prompt_ids");
        assert_int_equal(kiln_tokenizer_encode(tok, text, strlen(text), 1, &ids, &err), 0);
        assert_int_equal(ids.n, json_array_size(want));
        for (size_t k = 0; k < ids.n; k++) assert_int_equal(ids.ids[k], json_integer_value(json_array_get(want, k)));

        /* run.c prints the pieces of prompt_ids[1:] + generated_ids with the
         * space after BOS dropped: decode without BOS gives the same. */
        json_t *gen = json_object_get(p, "generated_ids");
        size_t n = json_array_size(want) - 1 + json_array_size(gen), m = 0;
        int32_t *all = malloc((n + 1) * sizeof *all);
        for (size_t k = 1; k < json_array_size(want); k++) all[m++] = (int32_t)json_integer_value(json_array_get(want, k));
        for (size_t k = 0; k < json_array_size(gen); k++) all[m++] = (int32_t)json_integer_value(json_array_get(gen, k));
        char *dec;
        size_t dec_len;
        assert_int_equal(kiln_tokenizer_decode(tok, all, m, 1, &dec, &dec_len, &err), 0);
        const char *want_text = json_string_value(json_object_get(p, "text"));
        if (strcmp(dec, want_text))
            fail_msg("stories260K prompt %zu: decode differs:\n got:  %.200s\n want: %.200s", i, dec, want_text);
        free(dec);
        free(all);
    }
    json_decref(ref);
    kiln_token_ids_free(&ids);
    kiln_tokenizer_free(tok);
}

/* Several threads encoding with one tokenizer get the single-thread ids
 * (threads share the tokenizer's few contexts and caches, or build their
 * own when all are busy). */
struct worker {
    struct kiln_tokenizer *tok;
    const struct kiln_token_ids *want;
    const char *text;
    int bad;
};

static void *encode_many(void *arg) {
    struct worker *w = arg;
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    for (int i = 0; i < 200; i++) {
        if (kiln_tokenizer_encode(w->tok, w->text, strlen(w->text), 1, &ids, &err) || ids.n != w->want->n ||
            memcmp(ids.ids, w->want->ids, ids.n * sizeof *ids.ids))
            w->bad++;
    }
    kiln_token_ids_free(&ids);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    const char *models = getenv("KILN_MODELS");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/stories260K", models ? models : "models");
    struct kiln_tokenizer *tok = load_dir(dir);
    const char *text = "Once upon a time, Lily and Tim went to the park. They had 2 red toys {and} a hat! \u00e9\u00e8";
    struct kiln_token_ids want = {0};
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_encode(tok, text, strlen(text), 1, &want, &err), 0);
    pthread_t th[6];
    struct worker w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (struct worker){tok, &want, text, 0};
        pthread_create(&th[i], NULL, encode_many, &w[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].bad, 0);
    }
    kiln_token_ids_free(&want);
    kiln_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_models),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
