/* kiln_tokenizer_token_bytes over the real tokenizers: a token's raw bytes
 * are what it stands for inside a text, so decoding a sequence of ids must
 * give the concatenation of their bytes wherever that concatenation is
 * valid UTF-8 (decode replaces broken sequences). Two truths: the
 * tokenizer's own decode over the oracle cases and random id sequences
 * (behind a first token "x", so no decoder rule for the start of a text
 * applies), and the oracle's Hugging Face `decoded` strings, which may
 * differ from the concatenation only by the one leading space a
 * SentencePiece decoder strips. Special tokens must be flagged as
 * Hugging Face's skip_special_tokens sees them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "base/utf8.h"
#include "kiln/tokenizer.h"

static json_t *oracle;

static int setup(void **state) {
    (void)state;
    const char *fx = getenv("KILN_FIXTURES");
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/oracle/tokenizers.json", fx ? fx : "tests/fixtures");
    oracle = json_load_file(path, 0, &je);
    return oracle ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    json_decref(oracle);
    return 0;
}

static struct kiln_tokenizer *load(const char *name) {
    const char *dir = getenv("KILN_TOKENIZERS");
    char path[4096];
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir ? dir : ".cache/tokenizers", name);
    if (!file_exists(path)) fail_msg("MISSING %s: run scripts/fetch-tokenizers.sh", path);
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ".cache/tokenizers", name);
    if (kiln_tokenizer_load(&tok, path, &err)) fail_msg("load %s: %s", name, err.msg);
    return tok;
}

/* The bytes of ids[0..n) concatenated into a malloc'd string. */
static char *concat(const struct kiln_token_bytes *tb, const int32_t *ids, size_t n, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < tb->n && tb->bytes[ids[i]]) total += tb->lens[ids[i]];
    char *s = malloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < tb->n && tb->bytes[ids[i]]) {
            memcpy(s + k, tb->bytes[ids[i]], tb->lens[ids[i]]);
            k += tb->lens[ids[i]];
        }
    s[k] = 0;
    *len = k;
    return s;
}

/* decode(ids) == concatenation when the latter is valid UTF-8; returns
 * 1 on a mismatch, 0 otherwise; *checked counts real comparisons. */
static int check_decode(const struct kiln_tokenizer *tok, const struct kiln_token_bytes *tb, const int32_t *ids,
                        size_t n, const char *label, int *checked) {
    size_t cl, dl;
    char *c = concat(tb, ids, n, &cl), *d;
    struct kiln_error err;
    int bad = 0;
    if (utf8_validate(c, cl) == cl) {
        assert_int_equal(kiln_tokenizer_decode(tok, ids, n, 0, &d, &dl, &err), 0);
        if (dl != cl || memcmp(c, d, cl)) {
            fprintf(stderr, "FAIL %s: decode \"%s\" != bytes \"%s\"\n", label, d, c);
            bad = 1;
        }
        free(d);
        (*checked)++;
    }
    free(c);
    return bad;
}

static void run(const char *name) {
    struct kiln_tokenizer *tok = load(name);
    struct kiln_token_bytes tb;
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_token_bytes(tok, &tb, &err), 0);
    assert_int_equal(tb.n, kiln_tokenizer_id_limit(tok));
    int32_t x = kiln_tokenizer_token_to_id(tok, "x", 1);
    assert_true(x >= 0);
    assert_int_equal(tb.lens[x], 1);
    int fails = 0, checked = 0, hf = 0;
    char label[256];
    json_t *cases = json_object_get(json_object_get(oracle, name), "cases");
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        json_t *arr = json_object_get(c, "ids_with_special");
        size_t n = json_array_size(arr);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        ids[0] = x;
        for (size_t k = 0; k < n; k++) ids[k + 1] = (int32_t)json_integer_value(json_array_get(arr, k));
        snprintf(label, sizeof label, "%s case %zu", name, ci);
        fails += check_decode(tok, &tb, ids, n + 1, label, &checked);
        /* Hugging Face's decode of the ids alone: the concatenation, but
         * for a leading space a SentencePiece decoder drops */
        json_t *dec = json_object_get(c, "decoded"), *plain = json_object_get(c, "ids");
        size_t cl, np = json_array_size(plain);
        int32_t *pids = malloc((np + 1) * sizeof *pids);
        for (size_t k = 0; k < np; k++) pids[k] = (int32_t)json_integer_value(json_array_get(plain, k));
        char *cat = concat(&tb, pids, np, &cl);
        free(pids);
        if (json_is_string(dec) && utf8_validate(cat, cl) == cl) {
            const char *d = json_string_value(dec);
            size_t dl = json_string_length(dec);
            int ok = (dl == cl && !memcmp(d, cat, cl)) || (dl + 1 == cl && cat[0] == ' ' && !memcmp(d, cat + 1, dl));
            if (!ok) {
                fprintf(stderr, "FAIL %s: HF decoded \"%s\" vs bytes \"%s\"\n", label, d, cat);
                fails++;
            }
            hf++;
        }
        free(cat);
        free(ids);
    }
    /* Random ids, biased towards the low ids where byte tokens live. */
    uint64_t seed = 0x9e3779b9;
    for (int r = 0; r < 2000; r++) {
        int32_t ids[9];
        ids[0] = x;
        for (int k = 1; k < 9; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t v = (uint32_t)(seed >> 33);
            ids[k] = (int32_t)(v % 4 == 0 ? v % 300 : v % (uint32_t)tb.n);
        }
        snprintf(label, sizeof label, "%s random %d", name, r);
        fails += check_decode(tok, &tb, ids, 9, label, &checked);
    }
    /* Every id once (behind "x"), and the special flags. */
    for (int32_t id = 0; id < tb.n; id++) {
        int32_t ids[2] = {x, id};
        snprintf(label, sizeof label, "%s id %d", name, (int)id);
        fails += check_decode(tok, &tb, ids, 2, label, &checked);
        if (tb.special[id] != (kiln_tokenizer_is_special(tok, id) ? 1 : 0)) {
            fprintf(stderr, "FAIL %s: special flag\n", label);
            fails++;
        }
    }
    fprintf(stderr, "%s: %d decode comparisons, %d against HF, %d failures\n", name, checked, hf, fails);
    assert_true(hf > 5 && checked > 1000);
    kiln_token_bytes_free(&tb);
    kiln_tokenizer_free(tok);
    assert_int_equal(fails, 0);
}

/* Hand-written: the exact bytes of a few tokens of each scheme. */
static void test_known_tokens(void **s) {
    (void)s;
    struct kiln_error err;
    struct kiln_token_bytes tb;
    struct kiln_tokenizer *q = load("qwen3");
    assert_int_equal(kiln_tokenizer_token_bytes(q, &tb, &err), 0);
    int32_t id = kiln_tokenizer_token_to_id(q, "\xC4\xA0world", 7); /* "Ġworld" */
    assert_true(id >= 0);
    assert_int_equal(tb.lens[id], 6);
    assert_memory_equal(tb.bytes[id], " world", 6);
    id = kiln_tokenizer_token_to_id(q, "\xC3\xA4", 2); /* "ä": the byte 0xE4, a lead byte alone */
    assert_true(id >= 0);
    assert_int_equal(tb.lens[id], 1);
    assert_int_equal((unsigned char)tb.bytes[id][0], 0xE4);
    id = kiln_tokenizer_token_to_id(q, "<|im_end|>", 10);
    assert_true(id >= 0 && tb.special[id]);
    assert_memory_equal(tb.bytes[id], "<|im_end|>", 10);
    kiln_token_bytes_free(&tb);
    kiln_tokenizer_free(q);

    struct kiln_tokenizer *l = load("llama2");
    assert_int_equal(kiln_tokenizer_token_bytes(l, &tb, &err), 0);
    id = kiln_tokenizer_token_to_id(l, "\xE2\x96\x81world", 8); /* "▁world" */
    assert_true(id >= 0);
    assert_int_equal(tb.lens[id], 6);
    assert_memory_equal(tb.bytes[id], " world", 6);
    id = kiln_tokenizer_token_to_id(l, "<0x0A>", 6);
    assert_true(id >= 0);
    assert_int_equal(tb.lens[id], 1);
    assert_int_equal(tb.bytes[id][0], '\n');
    id = kiln_tokenizer_token_to_id(l, "<0xF0>", 6);
    assert_int_equal((unsigned char)tb.bytes[id][0], 0xF0);
    assert_true(tb.special[kiln_tokenizer_eos_id(l)]);
    kiln_token_bytes_free(&tb);
    kiln_tokenizer_free(l);
}

static void test_qwen3(void **s) { (void)s; run("qwen3"); }
static void test_llama3(void **s) { (void)s; run("llama3"); }
static void test_deepseek_v3(void **s) { (void)s; run("deepseek_v3"); }
static void test_gemma3(void **s) { (void)s; run("gemma3"); }
static void test_llama2(void **s) { (void)s; run("llama2"); }
static void test_gptoss(void **s) { (void)s; run("gptoss"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_tokens), cmocka_unit_test(test_qwen3),  cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_deepseek_v3),  cmocka_unit_test(test_gemma3), cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_gptoss),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
