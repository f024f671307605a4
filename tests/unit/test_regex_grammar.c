/* test_regex_grammar.c — the regular-expression translator
 * (src/grammar/regex.c): the errors, each with its byte offset and code
 * (malformed patterns are bad input, valid syntax kiln cannot express is
 * unsupported), and the EBNF it writes for the forms whose output is worth
 * reading. What patterns match is checked against JavaScript's RegExp by
 * tests/cli/grammar_regex.mjs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"

static void expect_error(const char *pattern, size_t len, enum kiln_error_code code, const char *want) {
    struct kiln_error err = {0};
    struct buf b = {0};
    if (grammar_ebnf_from_regex(pattern, len, &b, &err) == 0) fail_msg("/%s/ was accepted: %s", pattern, b.data);
    assert_int_equal(b.len, 0); /* nothing left behind */
    if (err.code != code || strcmp(err.msg, want))
        fail_msg("/%s/: got \"%s\" (code %d), want \"%s\" (code %d)", pattern, err.msg, err.code, want, code);
    buf_free(&b);
    assert_null(grammar_compile_regex(pattern, len, &err));
}

#define ERR(p, code, msg) expect_error(p, sizeof p - 1, code, msg)

static void test_errors(void **state) {
    ERR("a(?=b)", KILN_ERR_UNSUPPORTED, "regex: lookahead is not supported at offset 1");
    ERR("a(?!b)", KILN_ERR_UNSUPPORTED, "regex: lookahead is not supported at offset 1");
    ERR("(?<=a)b", KILN_ERR_UNSUPPORTED, "regex: lookbehind is not supported at offset 0");
    ERR("(?<!a)b", KILN_ERR_UNSUPPORTED, "regex: lookbehind is not supported at offset 0");
    ERR("(a)\\1", KILN_ERR_UNSUPPORTED, "regex: backreference is not supported at offset 3");
    ERR("(?<n>a)\\k<n>", KILN_ERR_UNSUPPORTED, "regex: backreference is not supported at offset 7");
    ERR("(?P<n>a)(?P=n)", KILN_ERR_UNSUPPORTED, "regex: backreference is not supported at offset 8");
    ERR("a\\bc", KILN_ERR_UNSUPPORTED, "regex: word boundary '\\b' is not supported at offset 1");
    ERR("a^b", KILN_ERR_UNSUPPORTED, "regex: '^' is supported only at the start at offset 1");
    ERR("a$b", KILN_ERR_UNSUPPORTED, "regex: '$' is supported only at the end at offset 1");
    ERR("(^a)", KILN_ERR_UNSUPPORTED, "regex: '^' is supported only at the start at offset 1");
    ERR("(?i)a", KILN_ERR_UNSUPPORTED, "regex: group flags and extensions '(?...)' are not supported at offset 0");
    ERR("\\p{L}", KILN_ERR_UNSUPPORTED, "regex: Unicode property escapes are not supported at offset 0");
    ERR("a*+", KILN_ERR_UNSUPPORTED, "regex: possessive quantifier is not supported at offset 2");
    ERR("[]a]", KILN_ERR_UNSUPPORTED,
        "regex: ']' first in a class (ECMAScript and Python read it differently) at offset 1");
    ERR("a**", KILN_ERR_BAD_INPUT, "regex: nothing to repeat at offset 2");
    ERR("*a", KILN_ERR_BAD_INPUT, "regex: nothing to repeat at offset 0");
    ERR("a|?", KILN_ERR_BAD_INPUT, "regex: nothing to repeat at offset 2");
    ERR("{2}", KILN_ERR_BAD_INPUT, "regex: nothing to repeat at offset 0");
    ERR("(ab", KILN_ERR_BAD_INPUT, "regex: unterminated '(' at offset 0");
    ERR("ab)", KILN_ERR_BAD_INPUT, "regex: unmatched ')' at offset 2");
    ERR("x[ab", KILN_ERR_BAD_INPUT, "regex: unterminated '[' at offset 1");
    ERR("x[z-a]", KILN_ERR_BAD_INPUT, "regex: range out of order in class at offset 2");
    ERR("[\\d-z]", KILN_ERR_BAD_INPUT, "regex: a class escape cannot start a range at offset 1");
    ERR("[a-\\d]", KILN_ERR_BAD_INPUT, "regex: a class escape cannot end a range at offset 3");
    ERR("a{3,2}", KILN_ERR_BAD_INPUT, "regex: numbers out of order in {m,n} at offset 1");
    ERR("a{1001}", KILN_ERR_TOO_LARGE, "regex: repetition count above 1000 at offset 1");
    ERR("ab\\", KILN_ERR_BAD_INPUT, "regex: '\\' at the end of the pattern at offset 2");
    ERR("\\q", KILN_ERR_BAD_INPUT, "regex: unknown escape at offset 0");
    ERR("\\x4", KILN_ERR_BAD_INPUT, "regex: '\\x' needs two hex digits at offset 0");
    ERR("\\u12G4", KILN_ERR_BAD_INPUT, "regex: '\\u' needs four hex digits at offset 0");
    ERR("\\u{110000}", KILN_ERR_BAD_INPUT, "regex: bad '\\u{...}' escape at offset 0");
    ERR("\\uD800", KILN_ERR_UNSUPPORTED, "regex: a lone surrogate escape is not supported at offset 0");
    ERR("ab\xC3(", KILN_ERR_BAD_INPUT, "regex: invalid UTF-8 at offset 2");
    ERR("\\01", KILN_ERR_UNSUPPORTED, "regex: octal escape is not supported at offset 0");
    ERR("(?<1a>x)", KILN_ERR_BAD_INPUT, "regex: bad group name at offset 0");
    ERR("a[^\\s\\S]+", KILN_ERR_BAD_INPUT, "regex: the pattern matches no text (an empty class) at offset 0");
    /* nesting is bounded: the parser is recursive */
    char deep[200];
    memset(deep, '(', 100);
    memset(deep + 100, ')', 100);
    expect_error(deep, sizeof deep, KILN_ERR_TOO_LARGE, "regex: groups nested too deeply at offset 64");
}

static void expect_ebnf(const char *pattern, const char *want) {
    struct kiln_error err = {0};
    struct buf b = {0};
    if (grammar_ebnf_from_regex(pattern, strlen(pattern), &b, &err)) fail_msg("/%s/: %s", pattern, err.msg);
    assert_string_equal(b.data, want);
    buf_free(&b);
}

static void test_ebnf(void **state) {
    /* literals merge; anchors at the ends change nothing for a whole match */
    expect_ebnf("^abc$", "root ::= \"abc\"\n");
    expect_ebnf("a|b|", "root ::= (\"a\" | \"b\" | \"\")\n");
    expect_ebnf("\\d{2,}x+?y{3}", "root ::= [0-9]{2,} \"x\"+ \"y\"{3}\n");
    /* negation over the code points, surrogates left out */
    expect_ebnf("[^a-z]", "root ::= [\\x00-`{-\\uD7FF\\uE000-\\U0010FFFF]\n");
    expect_ebnf(".", "root ::= [\\x00-\\x09\\x0B\\x0C\\x0E-\\u2027\\u202A-\\uD7FF\\uE000-\\U0010FFFF]\n");
    /* metacharacters of the EBNF are escaped */
    expect_ebnf("[\\]\\-\\\\^\"]", "root ::= [\\x22\\x2D\\x5C-\\x5E]\n");
    expect_ebnf("\"\\\\", "root ::= \"\\\"\\\\\"\n");
    /* Python's literal braces */
    expect_ebnf("a{,2}}", "root ::= \"a{,2}}\"\n");
    /* an empty class in one branch of several is no error */
    expect_ebnf("a|[^\\s\\S]", "root ::= (\"a\" | [^\\x00-\\U0010FFFF])\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_errors), cmocka_unit_test(test_ebnf)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
