/* test_grammar_mask.c — grammar/ token masks against brute force.
 *
 * The truth for "may token t come next" is the byte matcher itself: a fresh
 * matcher fed the text so far and then t's bytes (accept_bytes, which the
 * hand-worked cases of test_grammar.c pin down). At every step of seeded
 * random walks over several grammars (JSON, nullable and recursive rules,
 * ambiguous repetition, UTF-8 classes with tokens that split code points)
 * the mask from the per-state cache and the mask from the plain trie walk
 * must both equal that truth, special and empty tokens never set. A grammar
 * prepared from several threads at once gives the same masks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

static const char *json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,4}\n";

static const char *grammars[] = {
    NULL, /* json_gbnf */
    "root ::= (\"ab\" | \"a\" \"b\"? | \"\")* \"c\"{1,3}",
    "root ::= x y \"!\"\nx ::= \"\" | \"a\" x\ny ::= (\"b\" | z)*\nz ::= \"(\" root? \")\"",
    "root ::= ([^a-z\\u00e9] | \"\\u00e9\")+ \".\" | [\\U0001F600-\\U0001F64F]{2} ",
    "root ::= list\nlist ::= \"[\" (elem (\",\" elem)*)? \"]\"\nelem ::= list | [0-9]+ | \"\\\"\" [a-z\"]* \"\\\"\"",
    "root ::= \"{\" ( \"\\\"a\\\":\" v | \"\\\"ab\\\":\" v ) \"}\"\nv ::= \"1\" | \"{\" \"}\" | \"[\" v? \"]\"",
    /* bounded repetitions longer than any token (their positions share
     * cache entries), one of them through a nullable call */
    "root ::= \"\\\"\" [a-z0-9 ]{0,40} \"\\\"\" (\",\" \"\\\"\" [abc\"]{2,30} \"\\\"\")* \"!\"",
    "root ::= (n [ab]){0,24} \"c\"{1,3} \"!\"\nn ::= \"\" | \"x\" n",
};

/* A deterministic generator (xorshift). */
static uint32_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

struct tvocab {
    int n;
    char *tok[600];
    size_t len[600];
    uint8_t special[600];
    struct grammar_vocab *v;
};

static void make_vocab(struct tvocab *tv) {
    static const char *pieces[] = {
        "{\"", "\":", "\",", "\"}", "},", "}]", "[{", "true", "null", "false", "ab", "abc", "a\"", "\"a",
        "\xC3\xA9", "\xC3", "\xA9x", "\xF0\x9F\x98\x80", "\xF0\x9F", "\x98\x80", "\x98\x81.", "12", "1.5",
        "e+", "\\u", "00e9", "((", "))", "()", "b!", "bb", ", ", "\n ", "\n", "  ", "[]", "[[", "]]", "0,",
        "\"\"", "\": ", "\": {", "c!", "cc", "ccc", "ac", "aab", "x.", "Z\xC3\xA9.", "-1", "e5", "\\n", "\\\"",
        "\"]", "1]", "],[", "\"b\":", "\"ab\":", "\"a\":{", "}}", "\xF0", "\x9F\x98\x83\xF0"};
    int np = (int)(sizeof pieces / sizeof *pieces);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    tv->n = 0;
    for (int b = 0; b < 256; b++) { /* every byte, as byte-fallback vocabularies have */
        tv->tok[tv->n] = malloc(1);
        tv->tok[tv->n][0] = (char)b;
        tv->len[tv->n++] = 1;
    }
    for (int k = 0; k < np; k++) {
        tv->tok[tv->n] = strdup(pieces[k]);
        tv->len[tv->n++] = strlen(pieces[k]);
    }
    while (tv->n < 560) { /* random concatenations of pieces and bytes */
        char buf[64];
        size_t len = 0;
        int parts = 2 + (int)(rnd(&s) % 3);
        for (int p = 0; p < parts; p++) {
            if (rnd(&s) % 2) {
                const char *pc = pieces[rnd(&s) % (uint32_t)np];
                memcpy(buf + len, pc, strlen(pc));
                len += strlen(pc);
            } else {
                static const char alpha[] = "{}[]\":, \n0123456789abcxyz!.-eE\\()";
                buf[len++] = alpha[rnd(&s) % (sizeof alpha - 1)];
            }
        }
        tv->tok[tv->n] = malloc(len);
        memcpy(tv->tok[tv->n], buf, len);
        tv->len[tv->n++] = len;
    }
    /* a special token whose text the grammars would accept, an empty one, a missing one */
    tv->tok[tv->n] = strdup("{");
    tv->len[tv->n] = 1;
    tv->special[tv->n++] = 1;
    tv->tok[tv->n] = strdup("");
    tv->len[tv->n++] = 0;
    tv->tok[tv->n] = NULL;
    tv->len[tv->n++] = 0;
    tv->tok[tv->n] = strdup("ab"); /* a duplicate of an earlier token's bytes */
    tv->len[tv->n++] = 2;
    tv->v = grammar_vocab_create(tv->n, (const char *const *)tv->tok, tv->len, tv->special);
}

static void free_vocab(struct tvocab *tv) {
    grammar_vocab_free(tv->v);
    for (int k = 0; k < tv->n; k++) free(tv->tok[k]);
}

static struct grammar *compile(int gi) {
    const char *src = gi == 0 ? json_gbnf : grammars[gi];
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_ebnf(src, strlen(src), NULL, &err);
    if (!g) fail_msg("grammar %d: %s", gi, err.msg);
    return g;
}

/* The truth: a fresh matcher fed `text` then the token's bytes. */
static void brute_mask(struct grammar *g, struct tvocab *tv, const struct buf *text, uint32_t *bits) {
    memset(bits, 0, (size_t)grammar_mask_words(tv->v) * 4);
    for (int t = 0; t < tv->n; t++) {
        if (!tv->tok[t] || tv->special[t] || !tv->len[t]) continue;
        struct grammar_matcher *m = grammar_matcher_create(g, NULL, NULL);
        assert_int_equal(grammar_matcher_accept_bytes(m, text->data, text->len), 0);
        if (grammar_matcher_accept_bytes(m, tv->tok[t], tv->len[t]) == 0) bits[t >> 5] |= 1u << (t & 31);
        grammar_matcher_free(m);
    }
}

static void check_walks(struct grammar *g, struct tvocab *tv, int gi, int seeds, int steps) {
    int words = grammar_mask_words(tv->v);
    uint32_t *want = calloc((size_t)words, 4), *cached = calloc((size_t)words, 4), *plain = calloc((size_t)words, 4);
    for (int seed = 0; seed < seeds; seed++) {
        uint64_t s = 0x1234567ull + (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)gi;
        struct grammar_matcher *m = grammar_matcher_create(g, tv->v, NULL);
        struct buf text = {0};
        buf_reserve(&text, 0);
        for (int step = 0; step < steps; step++) {
            brute_mask(g, tv, &text, want);
            m->use_cache = 1;
            grammar_matcher_fill_mask(m, cached);
            m->use_cache = 0;
            grammar_matcher_fill_mask(m, plain);
            for (int w = 0; w < words; w++) {
                if (want[w] != cached[w] || want[w] != plain[w]) {
                    for (int t = 32 * w; t < 32 * w + 32; t++)
                        if (((want[w] ^ cached[w]) | (want[w] ^ plain[w])) >> (t & 31) & 1)
                            print_message("token %d (%zu bytes): truth %d cached %d plain %d\n", t, tv->len[t],
                                          want[w] >> (t & 31) & 1, cached[w] >> (t & 31) & 1, plain[w] >> (t & 31) & 1);
                    fail_msg("grammar %d seed %d step %d after \"%s\": word %d: truth %08x cached %08x plain %08x", gi,
                             seed, step, text.data, w, want[w], cached[w], plain[w]);
                }
            }
            int n_allowed = 0;
            for (int t = 0; t < tv->n; t++) n_allowed += (want[t >> 5] >> (t & 31)) & 1;
            if (!n_allowed) {
                assert_true(grammar_matcher_can_end(m));
                assert_true(grammar_matcher_is_done(m));
                break;
            }
            int pick = (int)(rnd(&s) % (uint32_t)n_allowed), t = 0;
            for (;; t++)
                if (((want[t >> 5] >> (t & 31)) & 1) && pick-- == 0) break;
            assert_int_equal(grammar_matcher_accept_token(m, t), 0);
            buf_append(&text, tv->tok[t], tv->len[t]);
        }
        buf_free(&text);
        grammar_matcher_free(m);
    }
    free(want);
    free(cached);
    free(plain);
}

static void test_masks_match_brute_force(void **state) {
    struct tvocab tv = {0};
    make_vocab(&tv);
    for (int gi = 0; gi < (int)(sizeof grammars / sizeof *grammars); gi++) {
        struct grammar *g = compile(gi);
        if (gi % 2) assert_int_equal(grammar_prepare(g, tv.v, NULL), 0); /* else filled on first use */
        check_walks(g, &tv, gi, 4, 24);
        grammar_unref(g);
    }
    free_vocab(&tv);
}

/* Forced text then masks: positions inside strings, between rules, at
 * the end of the JSON grammar. */
static void test_mask_at_fixed_positions(void **state) {
    struct tvocab tv = {0};
    make_vocab(&tv);
    struct grammar *g = compile(0);
    const char *doc = "{\"a\": [1, 2.5, {\"b\": null}], \"c\": \"x\\u00e9\xC3\xA9y\", \"d\": {}}";
    int words = grammar_mask_words(tv.v);
    uint32_t *want = calloc((size_t)words, 4), *got = calloc((size_t)words, 4);
    struct grammar_matcher *m = grammar_matcher_create(g, tv.v, NULL);
    struct buf text = {0};
    buf_reserve(&text, 0);
    for (size_t i = 0; i <= strlen(doc); i++) {
        brute_mask(g, &tv, &text, want);
        grammar_matcher_fill_mask(m, got);
        assert_memory_equal(want, got, (size_t)words * 4);
        if (i == strlen(doc)) break;
        assert_int_equal(grammar_matcher_accept_bytes(m, doc + i, 1), 0);
        buf_append(&text, doc + i, 1);
    }
    /* the document is complete; whitespace may still follow, so not done */
    assert_true(grammar_matcher_can_end(m));
    assert_false(grammar_matcher_is_done(m));
    int special = tv.n - 4; /* the special "{" never is allowed */
    assert_int_equal((got[special >> 5] >> (special & 31)) & 1, 0);
    buf_free(&text);
    grammar_matcher_free(m);
    grammar_unref(g);
    free(want);
    free(got);
    free_vocab(&tv);
}

struct prep_arg {
    struct grammar *g;
    const struct grammar_vocab *v;
};

static void *prep_thread(void *p) {
    struct prep_arg *a = p;
    return (void *)(intptr_t)grammar_prepare(a->g, a->v, NULL);
}

static void test_prepare_concurrent(void **state) {
    struct tvocab tv = {0};
    make_vocab(&tv);
    struct grammar *g = compile(0);
    pthread_t th[4];
    struct prep_arg arg = {g, tv.v};
    for (int k = 0; k < 4; k++) assert_int_equal(pthread_create(&th[k], NULL, prep_thread, &arg), 0);
    for (int k = 0; k < 4; k++) {
        void *rc;
        pthread_join(th[k], &rc);
        assert_int_equal((int)(intptr_t)rc, 0);
    }
    assert_int_equal(grammar_prepare(g, tv.v, NULL), 0); /* again: nothing to do */
    check_walks(g, &tv, 0, 2, 16);
    grammar_unref(g);
    free_vocab(&tv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masks_match_brute_force),
        cmocka_unit_test(test_mask_at_fixed_positions),
        cmocka_unit_test(test_prepare_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
