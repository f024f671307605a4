/* test_utf8.c — base/utf8 against the Unicode Standard, chapter 3: the
 * well-formed byte sequences of table 3-7 (checked exhaustively for every
 * 1-, 2- and 3-byte sequence and every 4-byte lead/second-byte pair against
 * an independent arithmetic reading of definition D92), the U+FFFD
 * substitution example of table 3-8 (maximal subparts), overlong forms,
 * surrogates, values above U+10FFFF and sequences cut short, and where text
 * cut at a byte limit must end (never inside a character). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/utf8.h"

/* D92 by arithmetic: decode the bit pattern, then reject what the standard
 * excludes (overlong, surrogate, > U+10FFFF, bad continuation). Returns
 * the length of the one well-formed sequence at s[0..n) or 0. */
static size_t ref_valid_len(const unsigned char *s, size_t n) {
    size_t len;
    uint32_t cp;
    if (s[0] < 0x80) return 1;
    if ((s[0] & 0xE0) == 0xC0) len = 2, cp = s[0] & 0x1Fu;
    else if ((s[0] & 0xF0) == 0xE0) len = 3, cp = s[0] & 0x0Fu;
    else if ((s[0] & 0xF8) == 0xF0) len = 4, cp = s[0] & 0x07u;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static size_t next_len(const unsigned char *s, size_t n) {
    size_t el = 99;
    int inc = -1;
    size_t k = utf8_next(s, n, &el, &inc);
    if (k) assert_int_equal(inc, 0);
    else assert_true(el >= 1 && el <= 3 && el <= n);
    return k;
}

static void test_exhaustive_short(void **state) {
    unsigned char s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        assert_int_equal(next_len(s, 1), ref_valid_len(s, 1));
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            assert_int_equal(next_len(s, 2), ref_valid_len(s, 2));
            if (a < 0xE0 || a > 0xEF) continue; /* 3-byte leads: every third byte too */
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                size_t want = ref_valid_len(s, 3);
                assert_int_equal(next_len(s, 3), want);
                assert_int_equal(utf8_validate((const char *)s, 3), want == 3 ? 3 : 0);
            }
        }
    }
}

static void test_exhaustive_four(void **state) {
    static const unsigned char tails[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xFF};
    unsigned char s[4];
    for (unsigned a = 0xF0; a < 0x100; a++)
        for (unsigned b = 0; b < 256; b++)
            for (size_t i = 0; i < sizeof tails; i++)
                for (size_t j = 0; j < sizeof tails; j++) {
                    s[0] = (unsigned char)a, s[1] = (unsigned char)b, s[2] = tails[i], s[3] = tails[j];
                    assert_int_equal(next_len(s, 4), ref_valid_len(s, 4));
                }
}

/* Every scalar value encodes to the sequence D92 gives, which decodes back. */
static void test_encode_decode_all(void **state) {
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char b[4];
        size_t n = utf8_encode(cp, b);
        assert_int_equal(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
        assert_int_equal(utf8_seq_len((unsigned char)b[0]), n);
        assert_int_equal(ref_valid_len((const unsigned char *)b, n), n);
        uint32_t got = 0;
        assert_int_equal(utf8_decode(b, &got), n);
        assert_int_equal(got, cp);
        got = 0;
        assert_int_equal(utf8_decode_lossy(b, n, &got), n);
        assert_int_equal(got, cp);
    }
}

/* Boundaries of table 3-7, one by one. */
static void test_boundaries(void **state) {
    static const struct {
        const char *s;
        size_t n;
        uint32_t cp; /* 0xFFFFFFFF: ill-formed */
    } cases[] = {
        {"\x7F", 1, 0x7F},
        {"\xC2\x80", 2, 0x80},
        {"\xDF\xBF", 2, 0x7FF},
        {"\xE0\xA0\x80", 3, 0x800},
        {"\xED\x9F\xBF", 3, 0xD7FF},
        {"\xEE\x80\x80", 3, 0xE000},
        {"\xEF\xBF\xBF", 3, 0xFFFF},
        {"\xF0\x90\x80\x80", 4, 0x10000},
        {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF},
        /* overlong forms of '/' (U+002F) and of the last 2- and 3-byte values */
        {"\xC0\xAF", 2, 0xFFFFFFFF},
        {"\xC1\xBF", 2, 0xFFFFFFFF},
        {"\xE0\x80\xAF", 3, 0xFFFFFFFF},
        {"\xE0\x9F\xBF", 3, 0xFFFFFFFF},
        {"\xF0\x80\x80\xAF", 4, 0xFFFFFFFF},
        {"\xF0\x8F\xBF\xBF", 4, 0xFFFFFFFF},
        /* surrogates, alone and as a CESU-8 pair */
        {"\xED\xA0\x80", 3, 0xFFFFFFFF},
        {"\xED\xBF\xBF", 3, 0xFFFFFFFF},
        {"\xED\xA0\xBD\xED\xB8\x80", 6, 0xFFFFFFFF},
        /* above U+10FFFF, and leads that never start a sequence */
        {"\xF4\x90\x80\x80", 4, 0xFFFFFFFF},
        {"\xF5\x80\x80\x80", 4, 0xFFFFFFFF},
        {"\xF8\x88\x80\x80\x80", 5, 0xFFFFFFFF},
        {"\xFF", 1, 0xFFFFFFFF},
        {"\x80", 1, 0xFFFFFFFF},
        {"\xBF", 1, 0xFFFFFFFF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *s = cases[i].s;
        size_t n = cases[i].n;
        int ok = cases[i].cp != 0xFFFFFFFF;
        assert_int_equal(utf8_validate(s, n), ok ? n : 0);
        uint32_t cp = 0;
        size_t k = utf8_decode_lossy(s, n, &cp);
        assert_int_equal(cp, ok ? cases[i].cp : 0xFFFD);
        if (ok) assert_int_equal(k, n);
        if (ok) assert_int_equal(utf8_count(s, n), 1);
    }
}

/* Table 3-8: "U+FFFD for maximal subparts":
 * 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d */
static void test_table_3_8(void **state) {
    static const char s[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    static const uint32_t want[] = {0x61, 0xFFFD, 0xFFFD, 0xFFFD, 0x62, 0xFFFD, 0x63, 0xFFFD, 0xFFFD, 0x64};
    static const size_t want_len[] = {1, 3, 2, 1, 1, 1, 1, 1, 1, 1};
    size_t n = sizeof s - 1, i = 0, j = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = utf8_decode_lossy(s + i, n - i, &cp);
        assert_true(j < 10);
        assert_int_equal(cp, want[j]);
        assert_int_equal(k, want_len[j]);
        assert_int_equal(utf8_offset(s, n, j), i);
        i += k, j++;
    }
    assert_int_equal(j, 10);
    assert_int_equal(utf8_count(s, n), 10);
    assert_int_equal(utf8_offset(s, n, 10), n);
    assert_int_equal(utf8_offset(s, n, 99), n);
    assert_int_equal(utf8_validate(s, n), 1);
}

/* A sequence cut by the end of the input is a valid prefix ("incomplete"),
 * unlike one cut by a wrong byte. */
static void test_truncated(void **state) {
    size_t el;
    int inc;
    const unsigned char *euro = (const unsigned char *)"\xE2\x82\xAC";
    assert_int_equal(utf8_next(euro, 3, &el, &inc), 3);
    for (size_t n = 1; n < 3; n++) {
        assert_int_equal(utf8_next(euro, n, &el, &inc), 0);
        assert_int_equal(inc, 1);
        assert_int_equal(el, n);
    }
    const unsigned char *emoji = (const unsigned char *)"\xF0\x9F\x98\x80";
    for (size_t n = 1; n < 4; n++) {
        assert_int_equal(utf8_next(emoji, n, &el, &inc), 0);
        assert_int_equal(inc, 1);
        assert_int_equal(el, n);
    }
    /* a wrong byte after a good prefix: not incomplete, the prefix is one subpart */
    assert_int_equal(utf8_next((const unsigned char *)"\xF0\x9F\x41", 3, &el, &inc), 0);
    assert_int_equal(inc, 0);
    assert_int_equal(el, 2);
    /* a prefix that can never complete (E0 80) is not incomplete either */
    assert_int_equal(utf8_next((const unsigned char *)"\xE0\x80", 2, &el, &inc), 0);
    assert_int_equal(inc, 0);
    assert_int_equal(el, 1);
    /* validation stops at the cut sequence, after the good text */
    assert_int_equal(utf8_validate("ab\xE2\x82", 4), 2);
    assert_int_equal(utf8_validate("0123456789abcdef\xC3", 17), 16);
    assert_int_equal(utf8_validate("0123456789abcdef\xC3\xA9", 18), 18);
}

static void test_counts(void **state) {
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z"; /* a é € 😀 z */
    size_t n = strlen(s);
    assert_int_equal(utf8_count(s, n), 5);
    assert_int_equal(utf8_offset(s, n, 0), 0);
    assert_int_equal(utf8_offset(s, n, 1), 1);
    assert_int_equal(utf8_offset(s, n, 2), 3);
    assert_int_equal(utf8_offset(s, n, 3), 6);
    assert_int_equal(utf8_offset(s, n, 4), 10);
    assert_int_equal(utf8_offset(s, n, 5), 11);
    assert_int_equal(utf8_count("", 0), 0);
    /* the count never reads past n: the 3-byte lead at the end is one subpart */
    assert_int_equal(utf8_count(s, 4), 3);
}

/* A cut at every byte of every sequence length: the text keeps whole
 * characters only; bytes invalid before the cut are not the cut's doing. */
static void test_cut(void **state) {
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z"; /* a é € 😀 z */
    static const size_t want[] = {0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10, 11}; /* for n = 0..11 */
    for (size_t n = 0; n <= 11; n++) assert_int_equal(utf8_cut(s, n), want[n]);
    assert_int_equal(utf8_cut("\xC3", 1), 0);
    assert_int_equal(utf8_cut("\x80\x80", 2), 2);           /* stray continuations: no sequence was cut */
    assert_int_equal(utf8_cut("\x80\x80\x80\x80", 4), 4);
    assert_int_equal(utf8_cut("a\xE0\x80", 3), 3);          /* E0 80 is invalid, not a prefix */
    assert_int_equal(utf8_cut("a\xED\xA0", 3), 3);          /* a surrogate's start */
    assert_int_equal(utf8_cut("a\xF4\x90", 3), 3);          /* above U+10FFFF */
    assert_int_equal(utf8_cut("a\xF5", 2), 2);
    assert_int_equal(utf8_cut("a\xC3\xA9\xA9", 4), 4);      /* a valid é, then a stray byte */
    assert_int_equal(utf8_cut("ab\xF4\x8F\xBF", 5), 2);     /* U+10FFFF cut before its last byte */
}

/* Stepping back one character, over every sequence length, bounded. */
static void test_prev(void **state) {
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
    assert_int_equal(utf8_prev(s, 0, 11), 10);
    assert_int_equal(utf8_prev(s, 0, 10), 6);
    assert_int_equal(utf8_prev(s, 0, 6), 3);
    assert_int_equal(utf8_prev(s, 0, 3), 1);
    assert_int_equal(utf8_prev(s, 0, 1), 0);
    assert_int_equal(utf8_prev(s, 8, 10), 8); /* never before start */
    assert_true(utf8_is_cont(0x80) && utf8_is_cont(0xBF));
    assert_false(utf8_is_cont(0x7F) || utf8_is_cont(0xC0) || utf8_is_cont(0xF4));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exhaustive_short), cmocka_unit_test(test_exhaustive_four),
        cmocka_unit_test(test_encode_decode_all), cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_table_3_8),        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_counts),           cmocka_unit_test(test_cut),
        cmocka_unit_test(test_prev),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
