/* Incremental detokenization: for every oracle text of every real tokenizer
 * (and random id sequences that break UTF-8 on purpose), feeding ids one at
 * a time must only ever emit valid UTF-8 that is a prefix of decode(ids),
 * and stopping after any id then flushing must give exactly decode of the
 * ids so far. */
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

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!k || i + k > n || c > 0xF4) return 0;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Streams ids[0..n) checking prefixes; returns the number of failures. */
static int check_stream(const struct kiln_tokenizer *tok, struct kiln_detok_stream *st, const int32_t *ids, size_t n,
                        int skip, const char *label) {
    struct kiln_error err;
    char *full;
    size_t full_len;
    int fails = 0;
    if (kiln_tokenizer_decode(tok, ids, n, skip, &full, &full_len, &err)) return 1;
    char *acc = malloc(full_len * 4 + 64);
    size_t acc_len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t len;
        kiln_detok_stream_push(st, ids[i], &t, &len);
        if (!valid_utf8(t, len)) {
            fprintf(stderr, "FAIL %s: invalid UTF-8 emitted after id %zu\n", label, i);
            fails++;
        }
        if (acc_len + len > full_len || memcmp(full + acc_len, t, len)) {
            fprintf(stderr, "FAIL %s: emitted text after id %zu is not a prefix of decode()\n", label, i);
            fails++;
            break;
        }
        memcpy(acc + acc_len, t, len);
        acc_len += len;
    }
    const char *t;
    size_t len;
    kiln_detok_stream_flush(st, &t, &len);
    if (acc_len + len != full_len || memcmp(full + acc_len, t, len) || !valid_utf8(t, len)) {
        fprintf(stderr, "FAIL %s: stream + flush != decode() (%zu + %zu vs %zu bytes)\n", label, acc_len, len, full_len);
        fails++;
    }
    free(acc);
    free(full);
    return fails;
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

static void run(const char *name) {
    struct kiln_tokenizer *tok = load(name);
    struct kiln_detok_stream *st[2];
    kiln_detok_stream_init(&st[0], tok, 0);
    kiln_detok_stream_init(&st[1], tok, 1);
    json_t *cases = json_object_get(json_object_get(oracle, name), "cases");
    int fails = 0;
    size_t checks = 0;
    char label[256];
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        json_t *arr = json_object_get(c, "ids_with_special");
        size_t n = json_array_size(arr);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(arr, k));
        /* Every cut point: the first k ids, streamed then flushed. */
        for (size_t k = 0; k <= n; k++)
            for (int skip = 0; skip < 2; skip++) {
                snprintf(label, sizeof label, "%s case %zu first %zu ids skip=%d", name, ci, k, skip);
                fails += check_stream(tok, st[skip], ids, k, skip, label);
                checks++;
            }
        free(ids);
    }
    /* Random ids: byte tokens and pieces of characters in any order. */
    uint64_t seed = 0x1234567;
    int32_t limit = kiln_tokenizer_id_limit(tok);
    for (int r = 0; r < 300; r++) {
        int32_t ids[40];
        for (int k = 0; k < 40; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t x = (uint32_t)(seed >> 33);
            /* Bias towards low ids, where byte tokens live. */
            ids[k] = (int32_t)(x % 4 == 0 ? x % 300 : x % (uint32_t)limit);
        }
        snprintf(label, sizeof label, "%s random %d", name, r);
        fails += check_stream(tok, st[0], ids, 40, 0, label);
        fails += check_stream(tok, st[1], ids, 40, 1, label);
        checks += 2;
    }
    fprintf(stderr, "%s: %zu stream checks, %d failures\n", name, checks, fails);
    kiln_detok_stream_free(st[0]);
    kiln_detok_stream_free(st[1]);
    kiln_tokenizer_free(tok);
    assert_int_equal(fails, 0);
}

static void test_qwen3(void **s) { (void)s; run("qwen3"); }
static void test_llama3(void **s) { (void)s; run("llama3"); }
static void test_deepseek_v3(void **s) { (void)s; run("deepseek_v3"); }
static void test_gemma3(void **s) { (void)s; run("gemma3"); }
static void test_llama2(void **s) { (void)s; run("llama2"); }
static void test_gptoss(void **s) { (void)s; run("gptoss"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),  cmocka_unit_test(test_llama3), cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_gemma3), cmocka_unit_test(test_llama2), cmocka_unit_test(test_gptoss),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
