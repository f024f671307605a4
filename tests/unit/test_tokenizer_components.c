/* Components on small hand-made tokenizer.json files, with the expected
 * results taken from the unit tests of Hugging Face `tokenizers` (split
 * behaviors, Metaspace prepend schemes, Punctuation, Digits, ...), plus
 * error reporting for unsupported and malformed files.
 *
 * The model is a BPE with ignore_merges and no merges whose vocabulary
 * holds every expected piece and every single character: each pre-token
 * then comes out as one token, and joining the tokens with '|' shows the
 * pre-tokenization. */
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
#include "kiln/tokenizer.h"
#include "tokenizer/normalizer.h"
#include <utf8proc.h>

struct spec {
    const char *normalizer, *pre_tokenizer, *decoder, *post_processor, *added_tokens;
    const char *pieces; /* '|'-separated vocabulary entries besides single chars */
    const char *texts[4];
};

static json_t *parse_or_null(const char *s) {
    if (!s) return json_null();
    json_error_t je;
    json_t *v = json_loads(s, 0, &je);
    if (!v) fail_msg("bad test JSON: %s: %s", s, je.text);
    return v;
}

static void add_word(json_t *vocab, const char *w, size_t n) {
    char *k = strndup(w, n);
    if (!json_object_get(vocab, k)) json_object_set_new(vocab, k, json_integer((json_int_t)json_object_size(vocab)));
    free(k);
}

static char *build_json(const struct spec *sp) {
    json_t *vocab = json_object();
    for (const char *p = sp->pieces; p && *p;) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n) add_word(vocab, p, n);
        p += n + (e ? 1 : 0);
    }
    const char *extra[] = {"▁", "Ġ", " "};
    for (size_t i = 0; i < 3; i++) add_word(vocab, extra[i], strlen(extra[i]));
    for (int t = 0; t < 4 && sp->texts[t]; t++)
        for (const char *c = sp->texts[t]; *c;) {
            size_t k = 1;
            while (((unsigned char)c[k] & 0xC0) == 0x80) k++;
            add_word(vocab, c, k);
            c += k;
        }
    json_t *model = json_pack("{s:s, s:o, s:[], s:b}", "type", "BPE", "vocab", vocab, "merges", "ignore_merges", 1);
    json_t *root = json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "model", model, "normalizer",
                             parse_or_null(sp->normalizer), "pre_tokenizer", parse_or_null(sp->pre_tokenizer), "decoder",
                             parse_or_null(sp->decoder), "post_processor", parse_or_null(sp->post_processor),
                             "added_tokens", sp->added_tokens ? parse_or_null(sp->added_tokens) : json_array());
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static struct kiln_tokenizer *build(const struct spec *sp) {
    char *js = build_json(sp);
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    if (kiln_tokenizer_load_buffer(&tok, js, strlen(js), NULL, 0, &err)) fail_msg("load: %s\n%s", err.msg, js);
    free(js);
    return tok;
}

/* Encodes and joins the token texts with '|'. */
static char *pieces(struct kiln_tokenizer *tok, const char *text) {
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    if (kiln_tokenizer_encode(tok, text, strlen(text), 0, &ids, &err)) fail_msg("encode: %s", err.msg);
    size_t cap = 1024, len = 0;
    char *out = calloc(cap, 1);
    for (size_t i = 0; i < ids.n; i++) {
        size_t n;
        const char *s = kiln_tokenizer_id_to_token(tok, ids.ids[i], &n);
        assert_non_null(s);
        while (len + n + 2 >= cap) out = realloc(out, cap *= 2);
        if (i) out[len++] = '|';
        memcpy(out + len, s, n);
        len += n;
        out[len] = 0;
    }
    kiln_token_ids_free(&ids);
    return out;
}

static void expect(const struct spec *sp, const char *text, const char *want) {
    struct kiln_tokenizer *tok = build(sp);
    char *got = pieces(tok, text);
    if (strcmp(got, want)) fail_msg("text \"%s\":\n got:  %s\n want: %s", text, got, want);
    free(got);
    kiln_tokenizer_free(tok);
}

#define WS_REGEX "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[^\\\\w\\\\s]+\"},\"invert\":true,\"behavior\":\"%s\"}"

static void test_split_behaviors(void **state) {
    (void)state;
    const char *text = "How are you doing?";
    const struct {
        const char *behavior, *want;
    } cases[] = {
        {"Removed", "How|are|you|doing|?"},
        {"Isolated", "How| |are| |you| |doing|?"},
        {"MergedWithPrevious", "How |are |you |doing|?"},
        {"MergedWithNext", "How| are| you| doing|?"},
        {"Contiguous", "How| |are| |you| |doing?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pt[512];
        snprintf(pt, sizeof pt, WS_REGEX, cases[i].behavior);
        struct spec sp = {.pre_tokenizer = pt, .pieces = "How|are|you|doing|How |are |you | are| you| doing|doing?",
                          .texts = {text}};
        expect(&sp, text, cases[i].want);
    }
    struct spec sp = {.pre_tokenizer = "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\",\"invert\":false}",
                      .pieces = "Hello", .texts = {"Hello Hello Hello"}};
    expect(&sp, "Hello Hello Hello", "Hello|Hello|Hello");
    sp.pre_tokenizer = "{\"type\":\"Split\",\"pattern\":{\"String\":\"Hello\"},\"behavior\":\"Removed\",\"invert\":true}";
    expect(&sp, "Hello Hello Hello", "Hello|Hello|Hello");
}

static void test_metaspace(void **state) {
    (void)state;
    struct spec sp = {.pre_tokenizer = "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\",\"split\":true}",
                      .pieces = "▁Hey|▁friend!", .texts = {"Hey   friend!"}};
    expect(&sp, "Hey friend!", "▁Hey|▁friend!");
    expect(&sp, "Hey   friend!", "▁Hey|▁|▁|▁friend!");
    /* "first": only the piece at the start of the input gets the prefix. */
    struct spec first = {
        .pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\"<s>\"},"
                         "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Metaspace\",\"replacement\":\"▁\","
                         "\"prepend_scheme\":\"first\",\"split\":false}]}",
        .pieces = "▁Hey▁my▁friend▁|<s>|how▁are▁you|▁Hey▁|how",
        .texts = {"Hey my friend <s>how▁are you"}};
    expect(&first, "Hey my friend <s>how▁are you", "▁Hey▁my▁friend▁|<s>|how▁are▁you");
    expect(&first, " Hey <s>how", "▁Hey▁|<s>|how");
    /* "never" and the decoder that undoes it. */
    struct spec never = {.pre_tokenizer = "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"never\"}",
                         .pieces = "Hey|▁friend", .texts = {"Hey friend"}};
    expect(&never, "Hey friend", "Hey|▁friend");
}

static void test_char_classes(void **state) {
    (void)state;
    struct spec punct = {.pre_tokenizer = "{\"type\":\"Punctuation\"}", .pieces = "Hey friend|     How are you",
                         .texts = {"Hey friend!     How are you?!?"}};
    expect(&punct, "Hey friend!     How are you?!?", "Hey friend|!|     How are you|?|!|?");
    struct spec digits = {.pre_tokenizer = "{\"type\":\"Digits\",\"individual_digits\":false}", .pieces = "Hey |123| friend!",
                          .texts = {"Hey 123 friend!"}};
    expect(&digits, "Hey 123 friend!", "Hey |123| friend!");
    digits.pre_tokenizer = "{\"type\":\"Digits\",\"individual_digits\":true}";
    expect(&digits, "Hey 123 friend!", "Hey |1|2|3| friend!");
    struct spec ws = {.pre_tokenizer = "{\"type\":\"Whitespace\"}", .pieces = "Hey|man|How|are|you|doing",
                      .texts = {"Hey man!", "How are you doing?"}};
    expect(&ws, "Hey man!", "Hey|man|!");
    expect(&ws, "How are you doing?", "How|are|you|doing|?");
    struct spec wss = {.pre_tokenizer = "{\"type\":\"WhitespaceSplit\"}", .pieces = "Hey|man!", .texts = {"Hey man!"}};
    expect(&wss, "Hey   man!", "Hey|man!");
    struct spec bert = {.pre_tokenizer = "{\"type\":\"BertPreTokenizer\"}", .pieces = "Hey|friend|How|are|you",
                        .texts = {"Hey friend!     How are you?!?"}};
    expect(&bert, "Hey friend!     How are you?!?", "Hey|friend|!|How|are|you|?|!|?");
}

static void test_byte_level(void **state) {
    (void)state;
    struct spec sp = {.pre_tokenizer = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}",
                      .decoder = "{\"type\":\"ByteLevel\"}", .pieces = "ĠHello|Ġmy|Ġfriend|,|Ġhow|Ġis|Ġyour|Ġday|Ġgoing|?",
                      .texts = {"Hello my friend, how is your day going?"}};
    expect(&sp, "Hello my friend, how is your day going?", "ĠHello|Ġmy|Ġfriend|,|Ġhow|Ġis|Ġyour|Ġday|Ġgoing|?");
    /* A word outside the vocabulary falls apart; bytes without a token
     * vanish (no unk token). */
    expect(&sp, "Hello\xC3\xA9", "Ġ|H|e|l|l|o");
}

static void test_normalizers(void **state) {
    (void)state;
    struct spec sp = {.normalizer = "{\"type\":\"Lowercase\"}", .pieces = "hello i̇ σς", .texts = {"HeLLo İ Σς"}};
    expect(&sp, "HeLLo İ Σς", "hello i̇ σς");
    struct spec nfkc = {.normalizer = "{\"type\":\"NFKC\"}", .pieces = "fi ABC", .texts = {"ﬁ ＡＢＣ"}};
    expect(&nfkc, "ﬁ ＡＢＣ", "fi ABC");
    struct spec strip = {.normalizer = "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":false}", .pieces = "hi  ",
                         .texts = {"  hi  "}};
    expect(&strip, " \t hi  ", "hi  ");
    struct spec seq = {.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},"
                                     "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]}",
                       .pieces = "▁a▁b", .texts = {"a b"}};
    expect(&seq, "a b", "▁a▁b");
    struct spec re = {.normalizer = "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\d+\"},\"content\":\"#\"}",
                      .pieces = "a#b#", .texts = {"a12b3#"}};
    expect(&re, "a12b3", "a#b#");
    struct spec acc = {.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"StripAccents\"}]}",
                       .pieces = "cafe", .texts = {"café"}};
    expect(&acc, "café", "cafe");
}

static void test_added_tokens(void **state) {
    (void)state;
    struct spec sp = {
        .pre_tokenizer = "{\"type\":\"WhitespaceSplit\"}",
        .added_tokens = "[{\"id\":100,\"content\":\"<mask>\",\"lstrip\":true,\"rstrip\":true,\"single_word\":false,"
                        "\"normalized\":false,\"special\":true},"
                        "{\"id\":101,\"content\":\"ab\",\"lstrip\":false,\"rstrip\":false,\"single_word\":true,"
                        "\"normalized\":false,\"special\":false},"
                        "{\"id\":102,\"content\":\"<s>\",\"lstrip\":false,\"rstrip\":false,\"single_word\":false,"
                        "\"normalized\":false,\"special\":true},"
                        "{\"id\":103,\"content\":\"<s><s>\",\"lstrip\":false,\"rstrip\":false,\"single_word\":false,"
                        "\"normalized\":false,\"special\":true}]",
        .pieces = "Hey|there|abc|x",
        .texts = {"Hey <mask>  there abc ab x"}};
    expect(&sp, "Hey <mask>  there", "Hey|<mask>|there");
    expect(&sp, "abc ab x", "abc|ab|x"); /* "ab" inside "abc" is no single word */
    expect(&sp, "x<s><s><s>x", "x|<s><s>|<s>|x"); /* leftmost-longest */
    struct kiln_tokenizer *tok = build(&sp);
    int32_t mask = kiln_tokenizer_token_to_id(tok, "<mask>", 6);
    assert_true(mask >= 0);
    assert_true(kiln_tokenizer_is_special(tok, mask));
    assert_false(kiln_tokenizer_is_special(tok, kiln_tokenizer_token_to_id(tok, "ab", 2)));
    kiln_tokenizer_free(tok);
}

static char *decode_tokens(struct kiln_tokenizer *tok, const char *const *toks, size_t n, int skip) {
    int32_t ids[32];
    struct kiln_error err;
    for (size_t i = 0; i < n; i++) {
        ids[i] = kiln_tokenizer_token_to_id(tok, toks[i], strlen(toks[i]));
        if (ids[i] < 0) fail_msg("token %s not in vocab", toks[i]);
    }
    char *out;
    size_t len;
    assert_int_equal(kiln_tokenizer_decode(tok, ids, n, skip, &out, &len, &err), 0);
    return out;
}

static void test_decoders(void **state) {
    (void)state;
    struct spec sp = {.decoder = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"▁\"},"
                                 "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
                                 "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}",
                      .pieces = "▁Hey|▁friend|<0xE2>|<0x82>|<0xAC>|<0x61>|<0xFF>"};
    struct kiln_tokenizer *tok = build(&sp);
    const char *a[] = {"▁Hey", "▁friend", "<0xE2>", "<0x82>", "<0xAC>"};
    char *s = decode_tokens(tok, a, 5, 0);
    assert_string_equal(s, "Hey friend€");
    free(s);
    /* An invalid byte run becomes one U+FFFD per byte. */
    const char *b[] = {"▁Hey", "<0xE2>", "<0x82>", "▁friend", "<0xFF>", "<0x61>"};
    s = decode_tokens(tok, b, 6, 0);
    assert_string_equal(s, "Hey\xEF\xBF\xBD\xEF\xBF\xBD friend\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    kiln_tokenizer_free(tok);

    struct spec ms = {.decoder = "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\"}",
                      .pieces = "▁Hey|▁friend|▁▁a"};
    tok = build(&ms);
    const char *c[] = {"▁Hey", "▁friend", "▁▁a"};
    s = decode_tokens(tok, c, 3, 0);
    assert_string_equal(s, "Hey friend  a");
    free(s);
    kiln_tokenizer_free(tok);

    /* ByteLevel: bytes joined across tokens, invalid UTF-8 made lossy. */
    struct spec bl = {.decoder = "{\"type\":\"ByteLevel\"}", .pieces = "Ġhi|âĤ|¬|ÿ|<|s|>"};
    tok = build(&bl);
    const char *d[] = {"Ġhi", "âĤ", "¬", "ÿ", "Ġhi"};
    s = decode_tokens(tok, d, 5, 0);
    assert_string_equal(s, " hi€\xEF\xBF\xBD hi");
    free(s);
    kiln_tokenizer_free(tok);

    /* No decoder: tokens joined by spaces. */
    struct spec none = {.pieces = "a|b"};
    tok = build(&none);
    const char *e[] = {"a", "b"};
    s = decode_tokens(tok, e, 2, 0);
    assert_string_equal(s, "a b");
    free(s);
    kiln_tokenizer_free(tok);
}

static void test_post_processors(void **state) {
    (void)state;
    struct spec sp = {
        .post_processor = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                          "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],"
                          "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[7],\"tokens\":[\"<s>\"]},"
                          "\"</s>\":{\"id\":\"</s>\",\"ids\":[8,9],\"tokens\":[\"</s>\",\"x\"]}}}",
        .pieces = "a"};
    struct kiln_tokenizer *tok = build(&sp);
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_encode(tok, "a", 1, 1, &ids, &err), 0);
    assert_int_equal(ids.n, 4);
    assert_int_equal(ids.ids[0], 7);
    assert_int_equal(ids.ids[2], 8);
    assert_int_equal(ids.ids[3], 9);
    assert_int_equal(kiln_tokenizer_encode(tok, "a", 1, 0, &ids, &err), 0);
    assert_int_equal(ids.n, 1);
    kiln_tokenizer_free(tok);
    struct spec bert = {.post_processor = "{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",102],\"cls\":[\"[CLS]\",101]}",
                        .pieces = "a"};
    tok = build(&bert);
    assert_int_equal(kiln_tokenizer_encode(tok, "a", 1, 1, &ids, &err), 0);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], 101);
    assert_int_equal(ids.ids[2], 102);
    kiln_tokenizer_free(tok);
    kiln_token_ids_free(&ids);
}

static void expect_error(const char *json, const char *want) {
    struct kiln_error err = {0};
    struct kiln_tokenizer *tok = NULL;
    assert_int_equal(kiln_tokenizer_load_buffer(&tok, json, strlen(json), NULL, 0, &err), -1);
    assert_null(tok);
    if (!strstr(err.msg, want)) fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
}

static void test_errors(void **state) {
    (void)state;
    struct spec sp = {.pre_tokenizer = "{\"type\":\"Foo\"}", .pieces = "a"};
    char *js = build_json(&sp);
    expect_error(js, "tokenizer.json: pre_tokenizer type 'Foo' is not supported");
    free(js);
    sp.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},{\"type\":\"UnicodeScripts\"}]}";
    js = build_json(&sp);
    expect_error(js, "pre_tokenizer type 'UnicodeScripts' is not supported (at pre_tokenizer.pretokenizers[1])");
    free(js);
    sp.pre_tokenizer = NULL;
    sp.normalizer = "{\"type\":\"Precompiled\"}";
    js = build_json(&sp);
    expect_error(js, "normalizer type 'Precompiled' is not supported");
    free(js);
    sp.normalizer = NULL;
    sp.decoder = "{\"type\":\"WordPiece\"}";
    js = build_json(&sp);
    expect_error(js, "decoder type 'WordPiece' is not supported");
    free(js);
    sp.decoder = "{\"type\":\"Strip\",\"content\":\"ab\"}";
    js = build_json(&sp);
    expect_error(js, "decoder.content: expected exactly one character");
    free(js);
    sp.decoder = NULL;
    sp.pre_tokenizer = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false}";
    js = build_json(&sp);
    expect_error(js, "pre_tokenizer.pattern.Regex");
    free(js);
    expect_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "model type 'Unigram' is not supported");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
                 "model.merges[0]: token 'b' is not in the vocabulary");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "model.vocab[\"a\"]");
    expect_error("{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "model.vocab: expected an object");
    expect_error("{\"model\": ", "invalid JSON at line 1");
    expect_error("[1]", "expected an object at the top level");
    expect_error("{}", "model: missing");
}

static void test_encode_rejects_invalid_utf8(void **state) {
    (void)state;
    struct spec sp = {.pieces = "a"};
    struct kiln_tokenizer *tok = build(&sp);
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_encode(tok, "a\xC3", 2, 0, &ids, &err), -1);
    assert_non_null(strstr(err.msg, "not valid UTF-8"));
    assert_int_equal(kiln_tokenizer_encode(tok, "", 0, 1, &ids, &err), 0);
    assert_int_equal(ids.n, 0);
    kiln_token_ids_free(&ids);
    kiln_tokenizer_free(tok);
}

/* The normalization quick check never calls a changing character stable:
 * every code point, alone and after a starter, under all four forms. */
static void test_unicode_quick_check(void **state) {
    (void)state;
    const enum normalizer_type forms[] = {NORMALIZER_TYPE_NFC, NORMALIZER_TYPE_NFD, NORMALIZER_TYPE_NFKC,
                                          NORMALIZER_TYPE_NFKD};
    const int opts[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                        UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    size_t stable = 0;
    for (int32_t cp = 0x80; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char s[8] = "a";
        utf8proc_ssize_t n = utf8proc_encode_char(cp, (utf8proc_uint8_t *)s + 1);
        for (int f = 0; f < 4; f++) {
            if (!normalizer_is_stable(forms[f], s + 1, (size_t)n, NULL)) continue;
            stable++;
            for (int pre = 0; pre < 2; pre++) {
                utf8proc_uint8_t *out = NULL;
                utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s + 1 - pre, n + pre, &out,
                                                  (utf8proc_option_t)(UTF8PROC_STABLE | opts[f]));
                if (m != n + pre || memcmp(out, s + 1 - pre, (size_t)m)) fail_msg("U+%04X form %d changes", cp, f);
                free(out);
            }
        }
    }
    assert_true(stable > 1000000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_behaviors), cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_char_classes),    cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_normalizers),     cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_decoders),        cmocka_unit_test(test_post_processors),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_encode_rejects_invalid_utf8),
        cmocka_unit_test(test_unicode_quick_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
