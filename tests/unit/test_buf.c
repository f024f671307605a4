/* test_buf.c — base/buf: appends of every size keep the text and its NUL,
 * printf output longer than the stack scratch, code points as UTF-8
 * (encodings from the Unicode Standard, table 3-4 examples), clear and take,
 * reserves of a known size, and filling and draining it in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/utf8.h"

static void test_append_grow(void **state) {
    struct buf b = {0};
    char want[10000];
    size_t n = 0;
    for (int i = 0; n + 100 < sizeof want; i++) { /* sizes 0..99, crossing every doubling */
        char piece[100];
        size_t k = (size_t)(i * 37 % 100);
        for (size_t j = 0; j < k; j++) piece[j] = (char)('a' + (i + j) % 26);
        buf_append(&b, piece, k);
        memcpy(want + n, piece, k);
        n += k;
        assert_int_equal(b.len, n);
        assert_true(b.cap > b.len);
        assert_int_equal(b.data[b.len], 0);
    }
    assert_memory_equal(b.data, want, n);
    buf_push(&b, 'Z');
    assert_int_equal(b.data[n], 'Z');
    assert_int_equal(b.data[n + 1], 0);
    buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len + b.cap, 0);
}

static void test_printf(void **state) {
    struct buf b = {0};
    buf_puts(&b, "x=");
    buf_printf(&b, "%d,%s", 42, "ok");
    assert_string_equal(b.data, "x=42,ok");
    char big[1000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    buf_printf(&b, "[%s]", big); /* longer than the 256-byte scratch */
    assert_int_equal(b.len, 7 + 2 + 999);
    assert_int_equal(b.data[7], '[');
    assert_int_equal(b.data[b.len - 1], ']');
    assert_int_equal(b.data[b.len], 0);
    assert_int_equal(strlen(b.data), b.len);
    buf_free(&b);
}

static void test_code_points(void **state) {
    struct buf b = {0};
    buf_push_cp(&b, 0x41);    /* A */
    buf_push_cp(&b, 0x3A9);   /* Ω: CE A9 */
    buf_push_cp(&b, 0x8A9E);  /* 語: E8 AA 9E */
    buf_push_cp(&b, 0x10384); /* 𐎄: F0 90 8E 84 */
    assert_int_equal(b.len, 10);
    assert_memory_equal(b.data, "\x41\xCE\xA9\xE8\xAA\x9E\xF0\x90\x8E\x84", 10);
    buf_free(&b);
}

static void test_clear_take(void **state) {
    struct buf b = {0};
    char *s = buf_take(&b); /* empty: a real, freeable "" */
    assert_string_equal(s, "");
    free(s);
    buf_append(&b, "hello", 5);
    size_t cap = b.cap;
    char *keep = b.data;
    buf_clear(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_ptr_equal(b.data, keep); /* memory kept */
    assert_int_equal(b.cap, cap);
    buf_append(&b, "hi", 2);
    s = buf_take(&b);
    assert_string_equal(s, "hi");
    assert_null(b.data);
    assert_int_equal(b.len + b.cap, 0);
    free(s);
}

/* A reserve of a known size (an HTTP body's Content-Length) takes that
 * size, not the next power of two; even an empty reserve leaves a string. */
static void test_reserve(void **state) {
    struct buf b = {0};
    buf_reserve(&b, 0);
    assert_non_null(b.data);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    buf_reserve(&b, 100000);
    assert_int_equal(b.cap, 100001);
    char *keep = b.data;
    buf_append(&b, "x", 1);
    buf_reserve(&b, 99999); /* fits: no move */
    assert_ptr_equal(b.data, keep);
    buf_free(&b);
    for (int i = 0; i < 1000; i++) buf_push(&b, 'a'); /* small appends still double */
    assert_true(b.cap >= 1001 && b.cap <= 2048);
    buf_free(&b);
}

/* A reader filling the buffer: grow, fill, give back what it did not fill;
 * a queue draining from the front. */
static void test_grow_truncate_consume(void **state) {
    struct buf b = {0};
    buf_puts(&b, "head:");
    char *p = buf_grow(&b, 10);
    assert_ptr_equal(p, b.data + 5);
    assert_int_equal(b.len, 15);
    assert_int_equal(b.data[15], 0);
    memcpy(p, "abc", 3); /* the reader got 3 of 10 */
    buf_truncate(&b, b.len - 10 + 3);
    assert_string_equal(b.data, "head:abc");
    buf_consume(&b, 5);
    assert_string_equal(b.data, "abc");
    assert_int_equal(b.len, 3);
    buf_consume(&b, 0);
    assert_string_equal(b.data, "abc");
    buf_append(&b, "def", 3);
    buf_consume(&b, 2);
    assert_string_equal(b.data, "cdef");
    buf_consume(&b, 4);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    buf_free(&b);
    buf_truncate(&b, 0); /* empty and never allocated */
    assert_null(b.data);
    assert_non_null(buf_grow(&b, 0));
    assert_string_equal(b.data, "");
    buf_free(&b);
}

/* utf8_lossy_append against the Unicode Standard's table 3-8 example, whole
 * and fed in pieces (a cut sequence waits for the next piece). */
static void test_lossy(void **state) {
    static const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    static const char want[] = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                               "b\xEF\xBF\xBD"
                               "c\xEF\xBF\xBD\xEF\xBF\xBD"
                               "d";
    struct buf b = {0};
    assert_int_equal(utf8_lossy_append(&b, in, sizeof in - 1, 1), sizeof in - 1);
    assert_int_equal(b.len, sizeof want - 1);
    assert_memory_equal(b.data, want, sizeof want - 1);
    buf_free(&b);
    /* "€" split after its second byte: held back until final */
    assert_int_equal(utf8_lossy_append(&b, "x\xE2\x82", 3, 0), 1);
    assert_string_equal(b.data, "x");
    assert_int_equal(utf8_lossy_append(&b, "\xE2\x82\xAC", 3, 0), 3);
    assert_string_equal(b.data, "x\xE2\x82\xAC");
    assert_int_equal(utf8_lossy_append(&b, "\xE2\x82", 2, 1), 2); /* final: replaced */
    assert_string_equal(b.data, "x\xE2\x82\xAC\xEF\xBF\xBD");
    buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_grow), cmocka_unit_test(test_printf),
        cmocka_unit_test(test_code_points), cmocka_unit_test(test_clear_take),
        cmocka_unit_test(test_lossy),       cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_grow_truncate_consume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
