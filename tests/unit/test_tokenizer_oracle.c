/* Oracle test: the six real tokenizers against Hugging Face `tokenizers`
 * (tests/fixtures/oracle/tokenizers.json): for every corpus text, ids
 * without and with special tokens, and decode(ids). The tokenizer files come
 * from scripts/fetch-tokenizers.sh; a missing one fails the test. */
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
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

static json_t *oracle;

static int setup(void **state) {
    (void)state;
    const char *fx = getenv("KILN_FIXTURES");
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/oracle/tokenizers.json", fx ? fx : "tests/fixtures");
    oracle = json_load_file(path, 0, &je);
    if (!oracle) {
        fprintf(stderr, "cannot load %s: %s\n", path, je.text);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    json_decref(oracle);
    return 0;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fprintf(stderr, "\\n");
        else if (c < 0x20) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    if (n > 120) fprintf(stderr, "...");
}

static int compare_ids(const char *name, size_t ci, const char *text, const char *what, const struct kiln_token_ids *got,
                       json_t *want) {
    size_t n = json_array_size(want), i;
    for (i = 0; i < n && i < got->n; i++)
        if (got->ids[i] != json_integer_value(json_array_get(want, i))) break;
    if (i == n && n == got->n) return 0;
    fprintf(stderr, "FAIL %s case %zu %s: \"", name, ci, what);
    print_escaped(text, strlen(text));
    fprintf(stderr, "\"\n  first difference at index %zu (got %zu ids, want %zu)\n  got: ", i, got->n, n);
    for (size_t k = i >= 3 ? i - 3 : 0; k < got->n && k < i + 5; k++) fprintf(stderr, "%d ", got->ids[k]);
    fprintf(stderr, "\n  want:");
    for (size_t k = i >= 3 ? i - 3 : 0; k < n && k < i + 5; k++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, k)));
    fprintf(stderr, "\n");
    return 1;
}

static void run_tokenizer(const char *name) {
    const char *dir = getenv("KILN_TOKENIZERS");
    char path[4096];
    struct kiln_error err = {0};
    struct kiln_tokenizer *tok;
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir ? dir : ".cache/tokenizers", name);
    if (!file_exists(path)) {
        fprintf(stderr, "MISSING %s: run scripts/fetch-tokenizers.sh (KILN_TOKENIZERS=%s)\n", path, dir ? dir : "");
        fail_msg("tokenizer files for %s are missing", name);
    }
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ".cache/tokenizers", name);
    if (kiln_tokenizer_load(&tok, path, &err)) fail_msg("load %s: %s", name, err.msg);

    json_t *entry = json_object_get(oracle, name);
    assert_non_null(entry);
    json_t *cases = json_object_get(entry, "cases");
    size_t ok = 0, total = json_array_size(cases);
    struct kiln_token_ids ids = {0};
    for (size_t ci = 0; ci < total; ci++) {
        json_t *c = json_array_get(cases, ci);
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        int bad = 0;
        if (kiln_tokenizer_encode(tok, text, len, 0, &ids, &err)) fail_msg("encode %s case %zu: %s", name, ci, err.msg);
        bad |= compare_ids(name, ci, text, "ids", &ids, json_object_get(c, "ids"));
        if (kiln_tokenizer_encode(tok, text, len, 1, &ids, &err)) fail_msg("encode %s case %zu: %s", name, ci, err.msg);
        bad |= compare_ids(name, ci, text, "ids_with_special", &ids, json_object_get(c, "ids_with_special"));

        json_t *want_ids = json_object_get(c, "ids");
        size_t n = json_array_size(want_ids);
        int32_t *v = malloc((n + 1) * sizeof *v);
        for (size_t k = 0; k < n; k++) v[k] = (int32_t)json_integer_value(json_array_get(want_ids, k));
        char *dec;
        size_t dec_len;
        if (kiln_tokenizer_decode(tok, v, n, 0, &dec, &dec_len, &err)) fail_msg("decode: %s", err.msg);
        const char *want = json_string_value(json_object_get(c, "decoded"));
        size_t want_len = json_string_length(json_object_get(c, "decoded"));
        if (dec_len != want_len || memcmp(dec, want, want_len)) {
            size_t i = 0;
            while (i < dec_len && i < want_len && dec[i] == want[i]) i++;
            fprintf(stderr, "FAIL %s case %zu decoded: first difference at byte %zu\n  got:  \"", name, ci, i);
            print_escaped(dec, dec_len);
            fprintf(stderr, "\"\n  want: \"");
            print_escaped(want, want_len);
            fprintf(stderr, "\"\n");
            bad = 1;
        }
        free(dec);
        free(v);
        ok += !bad;
    }
    size_t vs = (size_t)json_integer_value(json_object_get(entry, "vocab_size"));
    fprintf(stderr, "%s: %zu/%zu cases match; vocab size %zu (oracle %zu)\n", name, ok, total,
            kiln_tokenizer_vocab_size(tok), vs);
    kiln_token_ids_free(&ids);
    assert_int_equal(kiln_tokenizer_vocab_size(tok), vs);
    kiln_tokenizer_free(tok);
    assert_int_equal(ok, total);
}

/* Cutting SentencePiece words before "\xE2\x96\x81" (bpe.h) must not change
 * any result: random mixes of corpus fragments, with and without it. */
static void check_split_exact(const char *name, int must_split) {
    const char *dir = getenv("KILN_TOKENIZERS");
    char path[4096];
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ".cache/tokenizers", name);
    if (kiln_tokenizer_load(&tok, path, &err)) fail_msg("load %s: %s", name, err.msg);
    if (must_split) assert_true(tok->model.split_metaspace);
    json_t *cases = json_object_get(json_object_get(oracle, name), "cases");
    size_t nc = json_array_size(cases);
    struct kiln_token_ids a = {0}, b = {0};
    uint64_t seed = 7;
    char text[8192];
    for (int r = 0; r < 300; r++) {
        size_t len = 0;
        for (int k = 0; k < 6; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            json_t *t = json_object_get(json_array_get(cases, (size_t)(seed >> 33) % nc), "text");
            size_t tl = json_string_length(t), off = (size_t)(seed >> 20) % (tl + 1), take = tl - off;
            const char *ts = json_string_value(t);
            while (off < tl && ((unsigned char)ts[off] & 0xC0) == 0x80) off++, take--;
            if (take > 900) take = 900;
            while (take > 0 && off + take < tl && ((unsigned char)ts[off + take] & 0xC0) == 0x80) take--;
            memcpy(text + len, ts + off, take);
            len += take;
            for (int sp = 0; sp < (int)((seed >> 40) % 4); sp++) text[len++] = ' ';
        }
        tok->model.split_metaspace = 1;
        assert_int_equal(kiln_tokenizer_encode(tok, text, len, 0, &a, &err), 0);
        tok->model.split_metaspace = 0;
        assert_int_equal(kiln_tokenizer_encode(tok, text, len, 0, &b, &err), 0);
        if (a.n != b.n || memcmp(a.ids, b.ids, a.n * sizeof *a.ids)) fail_msg("%s: split changes mix %d", name, r);
    }
    kiln_token_ids_free(&a);
    kiln_token_ids_free(&b);
    kiln_tokenizer_free(tok);
}

static void test_split_metaspace_exact(void **s) {
    (void)s;
    check_split_exact("llama2", 1);
}

static void test_qwen3(void **s) { (void)s; run_tokenizer("qwen3"); }
static void test_llama3(void **s) { (void)s; run_tokenizer("llama3"); }
static void test_deepseek_v3(void **s) { (void)s; run_tokenizer("deepseek_v3"); }
static void test_gemma3(void **s) { (void)s; run_tokenizer("gemma3"); }
static void test_llama2(void **s) { (void)s; run_tokenizer("llama2"); }
static void test_gptoss(void **s) { (void)s; run_tokenizer("gptoss"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),  cmocka_unit_test(test_llama3), cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_gemma3), cmocka_unit_test(test_llama2), cmocka_unit_test(test_gptoss),
        cmocka_unit_test(test_split_metaspace_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
