/* test_grammar.c — grammar/: EBNF text compiled and matched over bytes.
 *
 * Each case is a grammar and strings whose membership was worked out by
 * hand from the grammar's meaning (the GBNF / W3C EBNF notation): nullable
 * rules, nested and bounded repetition, recursion, ambiguity, code point
 * classes (2-, 3- and 4-byte UTF-8, negation, ranges across the encoding
 * lengths), literals with every escape form, both quote styles, comments
 * and rules over several lines. Errors name the line and column. A token
 * may end inside a UTF-8 sequence, a refused step leaves the state as it
 * was, and deep nesting works.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "grammar/grammar.h"

static struct grammar *compile(const char *src) {
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_ebnf(src, strlen(src), NULL, &err);
    if (!g) fail_msg("compile failed: %s\n%s", err.msg, src);
    return g;
}

/* 1: the whole string is in the language; 0: it is not. */
static int matches(struct grammar *g, const char *s, size_t n) {
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, NULL);
    int ok = grammar_matcher_accept_bytes(m, s, n) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_free(m);
    return ok;
}

struct gcase {
    const char *grammar;
    const char *yes[10];
    const char *no[10];
};

static const struct gcase cases[] = {
    {"root ::= \"a\" b* \"c\"\nb ::= \"b\" | \"x\"", {"ac", "abc", "abxbc"}, {"", "ab", "abcc", "bc", "a c"}},
    /* nullable rules, empty alternatives, a nullable rule inside a star */
    {"root ::= x y x\nx ::= \"\" | \"x\"\ny ::= (z)* \"!\"\nz ::= \"z\"?", {"!", "x!", "!x", "x!x", "zz!", "xzzz!x"},
     {"", "xx!", "x!xx", "z", "!!"}},
    /* bounded repetition: {m}, {m,}, {m,n}, {,n}, and nested */
    {"root ::= \"a\"{2} \"b\"{1,} \"c\"{0,2} \"d\"{,1}", {"aab", "aabbb", "aabcc", "aabbccd", "aabd"},
     {"ab", "aaab", "aa", "aabccc", "aabdd"}},
    {"root ::= (\"x\" \"y\"{1,2}){2,3}", {"xyxy", "xyyxy", "xyxyyxyy"}, {"xy", "xyxyxyxy", "xxyy", "xyyyxy"}},
    /* ambiguity: several parses of the same prefix */
    {"root ::= (\"ab\" | \"a\" \"b\"? | \"\")* \"c\"", {"c", "ac", "abc", "aabac", "abab\x61\x63"}, {"bc", "", "abbc"}},
    /* recursion (balanced parentheses), right recursion */
    {"root ::= \"(\" root \")\" root | \"\"", {"", "()", "(())", "()()", "(()())"}, {"(", ")(", "(()", "())"}},
    {"root ::= [0-9] (\",\" root)?", {"1", "1,2", "1,2,3"}, {"", "1,", ",1", "12"}},
    /* classes: negation, ranges, escapes, '.' any code point */
    {"root ::= [^a-c\\]] [\\x41-\\x43\\-] .", {"dA-", "z-\xC3\xA9", "\xE2\x82\xAC" "Bx", "!C\xF0\x9F\x98\x80"},
     {"aA-", "]A-", "dD-", "dA", "dA--"}},
    /* 2-, 3- and 4-byte code points; a range across the encoding lengths */
    {"root ::= [\\u00e9-\\u20ac] [\\U0001F600-\\U0001F64F] [\\x7f-\\U00010000]",
     {"\xC3\xA9\xF0\x9F\x98\x80\x7F", "\xE2\x82\xAC\xF0\x9F\x99\x8F\xF0\x90\x80\x80", "\xDF\xBF\xF0\x9F\x98\x81\xC2\x80"},
     {"e\xF0\x9F\x98\x80\x7F", "\xC3\xA8\xF0\x9F\x98\x80\x7F", "\xC3\xA9\xF0\x9F\x99\x90\x7F",
      "\xC3\xA9\xF0\x9F\x98\x80\x7E", "\xC3\xA9\xF0\x9F\x98\x80\xF0\x90\x80\x81"}},
    /* a negated class takes any code point, not bytes: no lone continuation
     * bytes, no overlong or surrogate encodings */
    {"root ::= [^\"]+", {"abc", "\xC3\xA9", "\xED\x9F\xBF", "\xEE\x80\x80", "\xF4\x8F\xBF\xBF"},
     {"\"", "\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80"}},
    /* literal escapes and both quote styles; \x and \u are code points */
    {"root ::= \"\\n\\t\\r\\\\\\\"\" 'q\\'' \"\\xe9\\u20AC\\U0001F600\" '\"'",
     {"\n\t\r\\\"q'\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\""}, {"\n\t\r\\\"q'\xE9\xE2\x82\xAC\xF0\x9F\x98\x80\""}},
    /* comments, rules over several lines, ';' ends a rule, names with - and _ */
    {"# a comment\nroot ::= (\n  item-a # trailing\n  | item_b\n) ;\nitem-a ::= \"a\"\nitem_b ::=\n  \"b\"\n",
     {"a", "b"}, {"ab", ""}},
    /* no byte edges at all; an empty class (found by fuzz_ebnf: both once
     * did pointer arithmetic on NULL, which UBSan refuses) */
    {"root ::= \"\"", {""}, {"a"}},
    {"root ::= \"a\" | []", {"a"}, {"", "b"}},
    /* a rule that is used in several places and not recursive (inlined) */
    {"root ::= w \"=\" w\nw ::= [a-z]+", {"a=b", "abc=de"}, {"=b", "a=", "a==b"}},
};

static void test_languages(void **state) {
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct grammar *g = compile(cases[c].grammar);
        for (int k = 0; k < 10 && cases[c].yes[k]; k++)
            if (!matches(g, cases[c].yes[k], strlen(cases[c].yes[k])))
                fail_msg("case %zu: \"%s\" should match", c, cases[c].yes[k]);
        for (int k = 0; k < 10 && cases[c].no[k]; k++)
            if (matches(g, cases[c].no[k], strlen(cases[c].no[k])))
                fail_msg("case %zu: \"%s\" should not match", c, cases[c].no[k]);
        grammar_unref(g);
    }
}

static void test_empty_string_and_nul(void **state) {
    struct grammar *g = compile("root ::= \"a\" [\\x00] \"b\"");
    assert_true(matches(g, "a\0b", 3));
    assert_false(matches(g, "ab", 2));
    grammar_unref(g);
}

static void test_prefix_states(void **state) {
    struct grammar *g = compile("root ::= \"ab\" (\"c\" | \"\")");
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, NULL);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "a", 1), 0);
    assert_false(grammar_matcher_can_end(m));
    /* refused: the state stays where it was */
    assert_int_equal(grammar_matcher_accept_bytes(m, "bx", 2), -1);
    assert_int_equal(grammar_matcher_accept_bytes(m, "b", 1), 0);
    assert_true(grammar_matcher_can_end(m));
    assert_false(grammar_matcher_is_done(m)); /* "c" may follow */
    assert_int_equal(grammar_matcher_accept_bytes(m, "c", 1), 0);
    assert_true(grammar_matcher_is_done(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "c", 1), -1);
    grammar_matcher_reset(m);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "abc", 3), 0);
    assert_true(grammar_matcher_is_done(m));
    grammar_matcher_free(m);
    grammar_unref(g);
}

/* Tokens may split a code point: the matcher takes UTF-8 byte by byte. */
static void test_split_code_point(void **state) {
    struct grammar *g = compile("root ::= [\\U0001F600-\\U0001F64F]+");
    const char *toks[] = {"\xF0\x9F", "\x98", "\x80\xF0", "\x9F\x98\x81", "\x80"};
    size_t lens[] = {2, 1, 2, 3, 1};
    struct grammar_vocab *v = grammar_vocab_create(5, toks, lens, NULL);
    assert_int_equal(grammar_vocab_size(v), 5);
    assert_int_equal(grammar_mask_words(v), 1);
    struct grammar_matcher *m = grammar_matcher_create(g, v, NULL);
    assert_int_equal(grammar_matcher_accept_token(m, 4), -1); /* a continuation byte first */
    assert_int_equal(grammar_matcher_accept_token(m, 0), 0);
    assert_int_equal(grammar_matcher_accept_token(m, 1), 0);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_token(m, 2), 0);
    assert_int_equal(grammar_matcher_accept_token(m, 3), 0);
    assert_true(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_token(m, 5), -1); /* out of range */
    assert_int_equal(grammar_matcher_accept_token(m, -1), -1);
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    grammar_unref(g);
}

/* Nesting far deeper than any real document, and a long flat run. */
static void test_deep_nesting(void **state) {
    struct grammar *g = compile("root ::= \"[\" root? \"]\" | \"x\"");
    size_t depth = 20000;
    char *s = malloc(2 * depth + 1);
    for (size_t k = 0; k < depth; k++) s[k] = '[', s[2 * depth - k] = ']';
    s[depth] = 'x';
    assert_true(matches(g, s, 2 * depth + 1));
    assert_false(matches(g, s, 2 * depth));
    memset(s + depth, ']', depth); /* "[[...[]]...]": the innermost root? is empty */
    assert_true(matches(g, s, 2 * depth));
    assert_false(matches(g, s, 2 * depth - 1));
    free(s);
    grammar_unref(g);
    g = compile("root ::= ([a-z] | \" \")*");
    size_t n = 200000;
    s = malloc(n);
    for (size_t k = 0; k < n; k++) s[k] = (char)(k % 7 ? 'a' + k % 26 : ' ');
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, NULL);
    for (size_t k = 0; k < n; k += 100) assert_int_equal(grammar_matcher_accept_bytes(m, s + k, 100), 0);
    assert_true(grammar_matcher_can_end(m));
    grammar_matcher_free(m);
    free(s);
    grammar_unref(g);
}

static void test_root_name(void **state) {
    struct kiln_error err = {0};
    const char *src = "start ::= \"s\" | other\nother ::= \"o\"";
    struct grammar *g = grammar_compile_ebnf(src, strlen(src), "start", &err);
    assert_non_null(g);
    assert_true(matches(g, "s", 1));
    assert_true(matches(g, "o", 1));
    grammar_unref(g);
    g = grammar_compile_ebnf(src, strlen(src), NULL, &err);
    assert_null(g);
    assert_string_equal(err.msg, "grammar: the root rule 'root' is not defined");
    assert_int_equal(err.code, KILN_ERR_BAD_INPUT);
}

struct ecase {
    const char *grammar;
    const char *msg;
};

static const struct ecase errors[] = {
    {"root ::= \"a\"\nroot ::= \"b\"", "grammar:2:1: rule 'root' is defined twice"},
    {"root ::= a\na ::= b \"x\"\nb ::= \"y\"? a", "grammar:2:1: rule 'a' is left-recursive"},
    {"root ::= root \"x\" | \"y\"", "grammar:1:1: rule 'root' is left-recursive"},
    {"root ::= \"a\"\n  foo", "grammar:2:3: undefined rule 'foo'"},
    {"root ::= \"a\" (= \"b\")", "grammar:1:14: lookahead assertions '(= ...)' are not supported"},
    {"root := \"a\"", "grammar:1:6: expected '::='"},
    {"root ::= \"abc", "grammar:1:10: unterminated literal"},
    {"root ::= [a-", "grammar:1:10: unterminated character class"},
    {"root ::= [z-a]", "grammar:1:11: range out of order"},
    {"root ::= \"\\q\"", "grammar:1:11: unknown escape '\\q'"},
    {"root ::= \"\\u12\"", "grammar:1:11: '\\u' needs 4 hex digits"},
    {"root ::= \"\\uD800\"", "grammar:1:11: U+D800 is a surrogate"},
    {"root ::= \"\\U00110000\"", "grammar:1:11: code point U+110000 is past U+10FFFF"},
    {"root ::= (\"a\"", "grammar:1:14: expected ')'"},
    {"root ::= \"a\"{3,2}", "grammar:1:13: repetition {3,2}: the maximum is below the minimum"},
    {"root ::= \"a\"{2", "grammar:1:15: expected '}'"},
    {"root ::= \"a\" )", "grammar:1:14: unexpected ')'"},
    {"root ::= \"a\" @", "grammar:1:14: unexpected '@'"},
    {"\n\n  ::= \"a\"", "grammar:3:3: expected a rule name, found ':'"},
    {"", "grammar:1:1: no rules"},
    {"root ::= \"\xC3\"", "grammar:1:11: invalid UTF-8"},
    {"root ::= [^\\x00-\\U0010FFFF]", "grammar: the root rule 'root' matches no text at all"},
    {"root ::= \"a\"{1000000}", "grammar:1:14: repetition count is larger than"},
};

static void test_errors(void **state) {
    for (size_t c = 0; c < sizeof errors / sizeof *errors; c++) {
        struct kiln_error err = {0};
        struct grammar *g = grammar_compile_ebnf(errors[c].grammar, strlen(errors[c].grammar), NULL, &err);
        if (g) fail_msg("case %zu compiled: %s", c, errors[c].grammar);
        if (strncmp(err.msg, errors[c].msg, strlen(errors[c].msg)) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s...\"", c, err.msg, errors[c].msg);
    }
    /* the message's column counts code points, not bytes */
    struct kiln_error err = {0};
    const char *src = "root ::= \"\xC3\xA9\" bad";
    assert_null(grammar_compile_ebnf(src, strlen(src), NULL, &err));
    assert_string_equal(err.msg, "grammar:1:14: undefined rule 'bad'");
}

/* grammar_compile_ebnf_empty says when the root matches no text (a rule
 * that never ends, an empty class), and only then: a syntax error, an
 * undefined rule, a grammar past the limits and one that compiles do not. */
static void test_empty_root(void **state) {
    static const struct {
        const char *grammar;
        int empty, compiles;
    } roots[] = {
        {"root ::= \"x\" root", 1, 0},
        {"root ::= [^\\x00-\\U0010FFFF]", 1, 0},
        {"root ::= a | b\na ::= \"x\" a\nb ::= \"y\" b", 1, 0},
        {"root ::= \"x\" root | \"y\"", 0, 1},
        {"root ::= \"abc", 0, 0},
        {"root ::= bad", 0, 0},
        {"root ::= ((\"abcdefgh\"{100}){100}){100}", 0, 0},
    };
    for (size_t c = 0; c < sizeof roots / sizeof *roots; c++) {
        struct kiln_error err = {0};
        int empty = -1;
        struct grammar *g = grammar_compile_ebnf_empty(roots[c].grammar, strlen(roots[c].grammar), NULL, &empty, &err);
        if (empty != roots[c].empty) fail_msg("case %zu (%s): empty %d, want %d", c, roots[c].grammar, empty, roots[c].empty);
        if (roots[c].compiles) assert_non_null(g);
        else assert_null(g);
        grammar_unref(g);
    }
}

/* Expansion past the state limit is refused, not attempted forever. */
static void test_too_large(void **state) {
    struct kiln_error err = {0};
    const char *src = "root ::= ((\"abcdefgh\"{100}){100}){100}";
    assert_null(grammar_compile_ebnf(src, strlen(src), NULL, &err));
    assert_int_equal(err.code, KILN_ERR_TOO_LARGE);
    assert_non_null(strstr(err.msg, "automaton states"));
    /* few states, but every copy of a part that can be empty may skip to
     * every later one: the epsilon closures' work is bounded (fuzz_ebnf
     * found this one taking minutes and gigabytes) */
    const char *nested = "root ::= a{164}{1,34}{1,3} \"!\"\na ::= \"xy\" | \"\"";
    memset(&err, 0, sizeof err);
    assert_null(grammar_compile_ebnf(nested, strlen(nested), NULL, &err));
    assert_int_equal(err.code, KILN_ERR_TOO_LARGE);
    assert_non_null(strstr(err.msg, "empty steps"));
    /* the same shape with a part that cannot be empty builds */
    const char *plain = "root ::= a{16}{1,4}{1,3} \"!\"\na ::= \"xy\" | \"z\"";
    struct grammar *g = grammar_compile_ebnf(plain, strlen(plain), NULL, &err);
    assert_non_null(g);
    grammar_unref(g);
}

/* Ambiguity: the parses of n bytes are exponentially many, but equal
 * stacks are one node, so the set grows by one stack per byte here; past
 * the bound a step is refused cleanly and the state stays usable. */
static void test_ambiguity_bounded(void **state) {
    struct grammar *g = compile("root ::= x root | \"\"\nx ::= \"a\" | \"a\" \"a\" | \"a\"+");
    static char s[20000];
    memset(s, 'a', sizeof s);
    assert_true(matches(g, s, 200));
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, NULL);
    size_t k = 0;
    while (k < sizeof s && grammar_matcher_accept_bytes(m, s + k, 1) == 0) k++;
    assert_true(k > 200 && k < sizeof s); /* refused once past the bound */
    assert_true(grammar_matcher_can_end(m)); /* the last accepted state is intact */
    grammar_matcher_free(m);
    grammar_unref(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_languages),  cmocka_unit_test(test_empty_string_and_nul),
        cmocka_unit_test(test_prefix_states), cmocka_unit_test(test_split_code_point),
        cmocka_unit_test(test_deep_nesting), cmocka_unit_test(test_root_name),
        cmocka_unit_test(test_errors),     cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_ambiguity_bounded), cmocka_unit_test(test_empty_root),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
