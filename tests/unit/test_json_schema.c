/* test_json_schema.c — the JSON Schema translator (src/grammar/json_schema*.c)
 * through the compiled grammar, against independent truths: integer and
 * number bounds checked over whole ranges against arithmetic, dates against
 * the Gregorian calendar, IPv4 octets against their numeric value, string
 * lengths counted in code points as JSON Schema counts them (RFC 8259
 * escapes decoded by hand), and the refusals: every unsupported keyword and
 * bad reference named with its JSON pointer and error code, and schemas
 * whose recursion leaves no finite value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"

struct checker {
    struct grammar *g;
    struct grammar_vocab *v;
    struct grammar_matcher *m;
};

static int compile(struct checker *k, const char *schema, const struct grammar_json_opts *opts,
                   struct kiln_error *err) {
    memset(k, 0, sizeof *k);
    k->g = grammar_compile_json_schema(schema, strlen(schema), opts, err);
    if (!k->g) return -1;
    k->v = grammar_vocab_create(0, NULL, NULL, NULL);
    k->m = grammar_matcher_create(k->g, k->v, err);
    assert_non_null(k->m);
    return 0;
}

static void done(struct checker *k) {
    grammar_matcher_free(k->m);
    grammar_vocab_free(k->v);
    grammar_unref(k->g);
}

static int accepts(struct checker *k, const char *text) {
    grammar_matcher_reset(k->m);
    return grammar_matcher_accept_bytes(k->m, text, strlen(text)) == 0 && grammar_matcher_can_end(k->m);
}

static struct checker make(const char *schema, const struct grammar_json_opts *opts) {
    struct checker k;
    struct kiln_error err = {0};
    if (compile(&k, schema, opts, &err)) fail_msg("schema %s: %s", schema, err.msg);
    return k;
}

static void expect_error(const char *schema, enum kiln_error_code code, const char *want) {
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_json_schema(schema, strlen(schema), NULL, &err);
    if (g) fail_msg("schema %s was accepted", schema);
    if (err.code != code || !strstr(err.msg, want))
        fail_msg("schema %s: got \"%s\" (code %d), want \"%s\" (code %d)", schema, err.msg, err.code, want, code);
}

static void test_refusals(void **state) {
    expect_error("{\"properties\": {\"a\": {\"not\": {}}}}", KILN_ERR_UNSUPPORTED,
                 "json_schema: 'not' at /properties/a is not supported");
    expect_error("{\"items\": {\"if\": {}, \"then\": {}}}", KILN_ERR_UNSUPPORTED, "at /items is not supported");
    expect_error("{\"patternProperties\": {\"a\": {}}}", KILN_ERR_UNSUPPORTED, "'patternProperties' at the root");
    expect_error("{\"$defs\": {\"a~b/c\": {\"multipleOf\": 2}}, \"$ref\": \"#/$defs/a~0b~1c\"}", KILN_ERR_UNSUPPORTED,
                 "'multipleOf' at /$defs/a~0b~1c is not supported");
    /* keywords that do not combine */
    expect_error("{\"properties\": {\"p\": {\"allOf\": [{\"pattern\": \"a\"}, {\"pattern\": \"b\"}]}}}",
                 KILN_ERR_UNSUPPORTED, "json_schema: 'allOf' at /properties/p: 'pattern' of two schemas cannot be combined");
    expect_error("{\"additionalProperties\": false, \"anyOf\": [{\"properties\": {\"a\": {}}}]}", KILN_ERR_UNSUPPORTED,
                 "'anyOf' at the root: 'additionalProperties' of two schemas cannot be combined");
    expect_error("{\"allOf\": [{\"items\": [{}]}, {\"items\": {}}]}", KILN_ERR_UNSUPPORTED, "'items' of two schemas");
    expect_error("{\"allOf\": [{\"minimum\": 1, \"exclusiveMinimum\": true}, {\"minimum\": 2}]}",
                 KILN_ERR_UNSUPPORTED, "'exclusiveMinimum' of two schemas");
    expect_error("{\"$ref\": \"#/$defs/a\", \"$defs\": {\"a\": {}}, \"maxLength\": 2}", KILN_ERR_UNSUPPORTED,
                 "'$ref' next to 'maxLength'");
    /* oneOf whose branches may both match: an alternation would not enforce it */
    expect_error("{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}", KILN_ERR_UNSUPPORTED,
                 "'oneOf' at the root is not supported: branches 0 and 1 may both match");
    expect_error("{\"type\": \"array\", \"uniqueItems\": true}", KILN_ERR_UNSUPPORTED, "'uniqueItems'");
    expect_error("{\"type\": \"string\", \"format\": \"hostname\"}", KILN_ERR_UNSUPPORTED, "format 'hostname'");
    expect_error("{\"type\": \"number\", \"minimum\": 1.5}", KILN_ERR_UNSUPPORTED, "'minimum': 1.5 at");
    expect_error("{\"type\": \"number\", \"minimum\": 1, \"exclusiveMaximum\": 2.5}", KILN_ERR_UNSUPPORTED,
                 "'exclusiveMaximum': 2.5 at");
    expect_error("{\"type\": \"string\", \"pattern\": \"a\", \"maxLength\": 3}", KILN_ERR_UNSUPPORTED, "only one of");
    expect_error("{\"type\": \"string\", \"pattern\": \"(?=a)\"}", KILN_ERR_UNSUPPORTED,
                 "json_schema: 'pattern' at the root: regex: lookahead is not supported at offset 0");
    expect_error("{\"properties\": {\"x\": {\"type\": \"string\", \"pattern\": \"[b-a]\"}}}", KILN_ERR_BAD_INPUT,
                 "'pattern' at /properties/x: regex: range out of order in class at offset 1");
    /* references */
    expect_error("{\"$ref\": \"#/$defs/missing\"}", KILN_ERR_BAD_INPUT,
                 "'$ref' \"#/$defs/missing\" at the root: no such schema");
    expect_error("{\"properties\": {\"a\": {\"$ref\": \"other.json#/a\"}}}", KILN_ERR_UNSUPPORTED,
                 "at /properties/a: only local references");
    expect_error("{\"$ref\": \"#foo\"}", KILN_ERR_UNSUPPORTED, "anchors are not supported");
    expect_error("{\"$ref\": \"#\"}", KILN_ERR_UNSUPPORTED, "leads back to itself");
    expect_error("{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}", KILN_ERR_UNSUPPORTED, "leads back to itself");
    /* recursion every value must take again: no finite JSON value */
    expect_error("{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"next\": {\"$ref\": \"#/$defs/n\"}}, "
                 "\"required\": [\"next\"]}}, \"$ref\": \"#/$defs/n\"}",
                 KILN_ERR_BAD_INPUT, "json_schema: no finite value matches the schema");
    expect_error("{\"$defs\": {\"n\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/n\"}, \"minItems\": 1}}, "
                 "\"$ref\": \"#/$defs/n\"}",
                 KILN_ERR_BAD_INPUT, "no finite value");
    {
        /* the same object in strict mode (every property required): refused;
         * in the default mode the property is optional and the recursion ends */
        const char *sch = "{\"$defs\": {\"n\": {\"anyOf\": [{\"type\": \"object\", \"properties\": "
                          "{\"next\": {\"$ref\": \"#/$defs/n\"}}}]}}, \"$ref\": \"#/$defs/n\"}";
        const struct grammar_json_opts strict = {-1, 1};
        struct kiln_error err = {0};
        struct grammar *g = grammar_compile_json_schema(sch, strlen(sch), &strict, &err);
        if (g || !strstr(err.msg, "no finite value")) fail_msg("strict recursive schema: %s", g ? "accepted" : err.msg);
        struct checker r = make(sch, NULL);
        assert_true(accepts(&r, "{}"));
        assert_true(accepts(&r, "{\"next\": {\"next\": {}}}"));
        assert_false(accepts(&r, "{\"next\": 1}"));
        done(&r);
    }
    /* malformed schemas */
    expect_error("{\"type\": \"str\"}", KILN_ERR_BAD_INPUT, "'type' at the root must be a type name");
    expect_error("{\"properties\": {\"a\": 5}}", KILN_ERR_BAD_INPUT, "schema at /properties/a must be an object");
    expect_error("{\"required\": \"a\"}", KILN_ERR_BAD_INPUT, "'required' at the root must be an array");
    expect_error("{\"type\": \"string\", \"maxLength\": -1}", KILN_ERR_BAD_INPUT, "'maxLength' at the root");
    expect_error("{\"type\": \"array\", \"minItems\": 1000001}", KILN_ERR_TOO_LARGE, "'minItems'");
    expect_error("{\"enum\": 3}", KILN_ERR_BAD_INPUT, "'enum' at the root must be an array");
    expect_error("{\"type\": \"string\", \"maxLength\": 2, \"minLength\": 3}", KILN_ERR_BAD_INPUT, "no value matches");
    expect_error("{", KILN_ERR_BAD_INPUT, "json_schema: not valid JSON");
    /* annotations and keywords JSON Schema does not define are no errors */
    struct checker k = make("{\"title\": \"t\", \"description\": \"d\", \"$schema\": \"x\", \"examples\": [1], "
                            "\"default\": 2, \"$comment\": \"c\", \"deprecated\": true, \"readOnly\": true, "
                            "\"x-vendor\": 1, \"type\": \"integer\"}", NULL);
    assert_true(accepts(&k, "12"));
    done(&k);
}

/* Integer bounds: every integer in a window against arithmetic. */
static void test_integer_ranges(void **state) {
    static const struct { const char *bounds; int64_t lo, hi; } cases[] = {
        {"\"minimum\": 18, \"maximum\": 120", 18, 120},
        {"\"minimum\": -123, \"maximum\": 456", -123, 456},
        {"\"minimum\": 0, \"maximum\": 0", 0, 0},
        {"\"minimum\": -5, \"maximum\": -1", -5, -1},
        {"\"minimum\": 99, \"maximum\": 1000", 99, 1000},
        {"\"exclusiveMinimum\": 9, \"exclusiveMaximum\": 100", 10, 99},
        {"\"minimum\": 1.5, \"maximum\": 7.5", 2, 7},
        {"\"minimum\": 5, \"exclusiveMinimum\": true, \"maximum\": 10", 6, 10}, /* draft 4 */
        {"\"minimum\": 7", 7, INT64_MAX},
        {"\"maximum\": -7", INT64_MIN, -7},
        {"\"exclusiveMaximum\": 0", INT64_MIN, -1},
        {"\"minimum\": 1, \"maximum\": 1099", 1, 1099},
    };
    char schema[256], num[32];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(schema, sizeof schema, "{\"type\": \"integer\", %s}", cases[c].bounds);
        struct checker k = make(schema, NULL);
        for (long x = -1500; x <= 1500; x++) {
            snprintf(num, sizeof num, "%ld", x);
            int want = x >= cases[c].lo && x <= cases[c].hi;
            if (accepts(&k, num) != want) fail_msg("%s: %ld: want %d", schema, x, want);
        }
        /* far outside the window, and forms that are no integers */
        for (int64_t x = 13; x <= INT64_MAX / 8; x *= 7)
            for (int sign = -1; sign <= 1; sign += 2) {
                snprintf(num, sizeof num, "%lld", (long long)(sign * x));
                assert_int_equal(accepts(&k, num), sign * x >= cases[c].lo && sign * x <= cases[c].hi);
            }
        assert_false(accepts(&k, "007"));
        assert_false(accepts(&k, "1.0"));
        assert_false(accepts(&k, "+7"));
        done(&k);
    }
}

/* Number bounds that are integers: decimals around them against strtod. */
static void test_number_ranges(void **state) {
    static const char *const bounds[] = {
        "\"minimum\": 0", "\"maximum\": 5", "\"exclusiveMinimum\": 0, \"maximum\": 1",
        "\"minimum\": -2, \"exclusiveMaximum\": 3", "\"exclusiveMinimum\": -10, \"exclusiveMaximum\": -9",
        "\"minimum\": 10, \"maximum\": 10"};
    static const char *const nums[] = {"0", "0.0", "0.5", "1", "1.0", "1.000", "1.01", "5", "5.0", "5.1", "4.999",
                                       "3", "2.99", "3.0", "-0.5", "-2", "-2.0", "-2.01", "-9", "-9.5", "-10",
                                       "-9.0001", "-10.0", "10", "10.00", "10.01", "9.99", "123.25", "-1"};
    char schema[256];
    for (size_t c = 0; c < sizeof bounds / sizeof bounds[0]; c++) {
        snprintf(schema, sizeof schema, "{\"type\": \"number\", %s}", bounds[c]);
        json_t *s = json_loads(schema, 0, NULL);
        json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
        json_t *xmn = json_object_get(s, "exclusiveMinimum"), *xmx = json_object_get(s, "exclusiveMaximum");
        struct checker k = make(schema, NULL);
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            double x = strtod(nums[i], NULL);
            int want = (!mn || x >= json_number_value(mn)) && (!mx || x <= json_number_value(mx)) &&
                       (!xmn || x > json_number_value(xmn)) && (!xmx || x < json_number_value(xmx));
            if (accepts(&k, nums[i]) != want) fail_msg("%s: %s: want %d", schema, nums[i], want);
        }
        done(&k);
        json_decref(s);
    }
    /* without bounds: the JSON number grammar (RFC 8259) */
    struct checker k = make("{\"type\": \"number\"}", NULL);
    static const char *const good[] = {"0", "-0", "1.5", "1e5", "1E+5", "-2.5e-3", "10"};
    static const char *const bad[] = {"01", "1.", ".5", "+1", "1e", "--1", "0x1", "NaN", "1.5.2"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) assert_true(accepts(&k, good[i]));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_false(accepts(&k, bad[i]));
    done(&k);
}

static int days_in_month(int y, int m) {
    static const int d[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : d[m - 1];
}

static void test_formats(void **state) {
    struct checker k = make("{\"type\": \"string\", \"format\": \"date\"}", NULL);
    char s[64];
    static const int years[] = {1600, 1700, 1896, 1900, 1999, 2000, 2023, 2024, 2100, 2400, 2404, 9999, 0};
    for (size_t yi = 0; yi < sizeof years / sizeof years[0]; yi++)
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                snprintf(s, sizeof s, "\"%04d-%02d-%02d\"", years[yi], m, d);
                int want = m >= 1 && m <= 12 && d >= 1 && d <= days_in_month(years[yi], m);
                if (accepts(&k, s) != want) fail_msg("date %s: want %d", s, want);
            }
    assert_false(accepts(&k, "\"2024-1-01\""));
    done(&k);

    k = make("{\"type\": \"string\", \"format\": \"ipv4\"}", NULL);
    for (int o = 0; o <= 300; o++) {
        snprintf(s, sizeof s, "\"10.%d.0.1\"", o);
        assert_int_equal(accepts(&k, s), o <= 255);
        snprintf(s, sizeof s, "\"10.0%d.0.1\"", o); /* leading zeros are refused */
        assert_false(accepts(&k, s));
    }
    assert_false(accepts(&k, "\"1.2.3\""));
    done(&k);

    k = make("{\"type\": \"string\", \"format\": \"date-time\"}", NULL);
    assert_true(accepts(&k, "\"1985-04-12T23:20:50.52Z\""));
    assert_true(accepts(&k, "\"1996-12-19t16:39:57-08:00\""));
    assert_false(accepts(&k, "\"1996-12-19T16:39:57\""));  /* RFC 3339 needs the offset */
    assert_false(accepts(&k, "\"1996-12-19T24:00:00Z\""));
    assert_false(accepts(&k, "\"1990-02-31T15:59:60Z\""));
    done(&k);

    k = make("{\"type\": \"string\", \"format\": \"uuid\"}", NULL);
    assert_true(accepts(&k, "\"2EB8AA08-AA98-11EA-B4AA-73B441D16380\""));
    assert_false(accepts(&k, "\"2eb8aa08-aa98-11ea-b4aa-73b441d1638\""));
    done(&k);

    k = make("{\"type\": \"string\", \"format\": \"email\"}", NULL);
    assert_true(accepts(&k, "\"joe.bloggs@example.com\""));
    assert_false(accepts(&k, "\"2962\""));
    assert_false(accepts(&k, "\".joe@example.com\""));
    done(&k);

    k = make("{\"type\": \"string\", \"format\": \"uri\"}", NULL);
    assert_true(accepts(&k, "\"http://foo.bar/?baz=qux#quux\""));
    assert_true(accepts(&k, "\"urn:isbn:0451450523\""));
    assert_false(accepts(&k, "\"//foo.bar\""));
    assert_false(accepts(&k, "\"http://a b\""));
    /* RFC 3986's structure, not only its characters: '[' and ']' only
     * around an IP-literal host, one '#', a port of digits (the first was
     * written by a random-weight model, and ajv-formats rejects it too) */
    assert_false(accepts(&k, "\"ting:@@]::pies]:ow\""));
    assert_false(accepts(&k, "\"a:b[c\""));
    assert_false(accepts(&k, "\"a:#x#y\""));
    assert_false(accepts(&k, "\"a://x:y:z\""));
    assert_false(accepts(&k, "\"http://[::1/\""));
    assert_false(accepts(&k, "\"http://[1:2:3:4:5:6:7:8:9]/\""));
    assert_true(accepts(&k, "\"a:\""));
    assert_true(accepts(&k, "\"a://u:p@h:8/p/?q/?#f/?\""));
    assert_true(accepts(&k, "\"http://[::1]:80/\""));
    assert_true(accepts(&k, "\"http://[1:2:3:4:5:6:1.2.3.4]/\""));
    assert_true(accepts(&k, "\"http://[v7.x:y]/\""));
    assert_true(accepts(&k, "\"mailto:joe@example.com\""));
    done(&k);
}

static void test_strings(void **state) {
    /* lengths count code points (an escape is one), written canonically */
    struct checker k = make("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", NULL);
    assert_false(accepts(&k, "\"a\""));
    assert_true(accepts(&k, "\"ab\""));
    assert_true(accepts(&k, "\"a\\n\\u001f\""));
    assert_false(accepts(&k, "\"abcd\""));
    assert_true(accepts(&k, "\"\xF0\x9F\x98\x80\xC3\xA9\""));          /* two code points, six bytes */
    assert_false(accepts(&k, "\"\xF0\x9F\x98\x80\""));                  /* one */
    assert_false(accepts(&k, "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""));
    assert_false(accepts(&k, "\"a\\u00e9\""));                          /* not the canonical form */
    assert_false(accepts(&k, "\"a\nb\""));                            /* raw control character */
    assert_false(accepts(&k, "\"a\\x\""));                            /* no such escape */
    done(&k);
    /* without bounds every escape is allowed; surrogates only in pairs */
    k = make("{\"type\": \"string\"}", NULL);
    assert_true(accepts(&k, "\"\\u00e9\\ud83d\\ude00\\/\""));
    assert_false(accepts(&k, "\"\\ud83dx\""));
    assert_false(accepts(&k, "\"\\ude00\""));
    done(&k);

    /* patterns are unanchored: "contains"; ^ and $ anchor */
    k = make("{\"type\": \"string\", \"pattern\": \"b+c\"}", NULL);
    assert_true(accepts(&k, "\"abbcd\""));
    assert_true(accepts(&k, "\"bc\""));
    assert_false(accepts(&k, "\"bd\""));
    assert_true(accepts(&k, "\"\\n\\\"bc\\\"\""));
    done(&k);
    k = make("{\"type\": \"string\", \"pattern\": \"^ab|yz$\"}", NULL);
    assert_true(accepts(&k, "\"abx\""));
    assert_false(accepts(&k, "\"xab\""));
    assert_true(accepts(&k, "\"xyz\""));
    assert_false(accepts(&k, "\"yzx\""));
    done(&k);
    /* the pattern reads the decoded string: a quote, a newline, a slash */
    k = make("{\"type\": \"string\", \"pattern\": \"^\\\"\\n/[^a]$\"}", NULL);
    assert_true(accepts(&k, "\"\\\"\\n/b\""));
    assert_true(accepts(&k, "\"\\\"\\n\\/\\t\""));
    assert_false(accepts(&k, "\"\\\"\\n/a\""));
    assert_false(accepts(&k, "\"\\\"n/b\""));
    done(&k);
}

static void test_objects(void **state) {
    /* properties in order, optional ones absent, extra keys after them and
     * never one of the named keys */
    struct checker k = make("{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"}}, "
                            "\"required\": [\"b\"], \"additionalProperties\": {\"type\": \"string\"}}", NULL);
    assert_true(accepts(&k, "{\"a\": 1, \"b\": true}"));
    assert_true(accepts(&k, "{\"b\":false}"));
    assert_false(accepts(&k, "{\"a\": 1}"));
    assert_true(accepts(&k, "{\"b\": true, \"c\": \"x\", \"ab\": \"y\", \"\": \"z\"}"));
    assert_false(accepts(&k, "{\"b\": true, \"a\": \"x\"}"));
    assert_false(accepts(&k, "{\"b\": true, \"c\": 1}"));
    assert_false(accepts(&k, "{\"b\": true, \"b\": \"x\"}"));
    done(&k);

    /* strict: every property required, no others */
    struct grammar_json_opts strict = {.any_whitespace = -1, .strict = 1};
    k = make("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}", &strict);
    assert_false(accepts(&k, "{}"));
    assert_true(accepts(&k, "{\"a\": \"x\"}"));
    assert_false(accepts(&k, "{\"a\": \"x\", \"b\": 1}"));
    done(&k);

    /* white space: any amount, or none */
    k = make("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}", NULL);
    assert_true(accepts(&k, "{\n \"a\" :\t[ 1 , {} ] }"));
    done(&k);
    struct grammar_json_opts compact = {.any_whitespace = 0};
    k = make("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}", &compact);
    assert_true(accepts(&k, "{\"a\":[1,{}]}"));
    assert_false(accepts(&k, "{\"a\": [1,{}]}"));
    done(&k);

    /* a required name "properties" does not list, and recursion through $ref */
    k = make("{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"next\": {\"$ref\": \"#/$defs/node\"}}, "
             "\"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}", NULL);
    assert_true(accepts(&k, "{\"next\": {\"next\": {}}}"));
    assert_false(accepts(&k, "{\"next\": {\"x\": {}}}"));
    done(&k);
}

static void test_arrays_enums_unions(void **state) {
    struct checker k = make("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"type\": \"string\"}], "
                            "\"items\": {\"type\": \"boolean\"}, \"minItems\": 1, \"maxItems\": 4}", NULL);
    assert_false(accepts(&k, "[]"));
    assert_true(accepts(&k, "[1]"));
    assert_true(accepts(&k, "[1, \"a\", true, false]"));
    assert_false(accepts(&k, "[1, \"a\", true, false, true]"));
    assert_false(accepts(&k, "[\"a\"]"));
    assert_false(accepts(&k, "[1, \"a\", 3]"));
    done(&k);

    k = make("{\"enum\": [\"a\\\"b\", 1.5, null, {\"k\": [1, true]}, 100000000000000000000000.0]}", NULL);
    assert_true(accepts(&k, "\"a\\\"b\""));
    assert_true(accepts(&k, "1.5"));
    assert_true(accepts(&k, "null"));
    assert_true(accepts(&k, "{\"k\": [1, true]}"));
    assert_true(accepts(&k, "1e+23"));
    assert_false(accepts(&k, "\"ab\""));
    assert_false(accepts(&k, "{\"k\": [1]}"));
    done(&k);

    /* oneOf with a discriminator, and with disjoint types */
    k = make("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"a\"}, \"x\": {\"type\": "
             "\"integer\"}}, \"required\": [\"kind\"]}, {\"type\": \"object\", \"properties\": {\"kind\": {\"enum\": "
             "[\"b\", \"c\"]}}, \"required\": [\"kind\"]}]}", NULL);
    assert_true(accepts(&k, "{\"kind\": \"a\", \"x\": 1}"));
    assert_true(accepts(&k, "{\"kind\": \"c\"}"));
    assert_false(accepts(&k, "{\"kind\": \"d\"}"));
    done(&k);
    k = make("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": [\"integer\", \"null\"]}]}", NULL);
    assert_true(accepts(&k, "null"));
    assert_true(accepts(&k, "3"));
    assert_false(accepts(&k, "3.5"));
    done(&k);

    /* no type: every type, with each keyword applying to its own */
    k = make("{\"maxLength\": 1, \"minimum\": 3}", NULL);
    assert_true(accepts(&k, "\"a\""));
    assert_false(accepts(&k, "\"ab\""));
    assert_true(accepts(&k, "3.5"));
    assert_false(accepts(&k, "2"));
    assert_true(accepts(&k, "[\"ab\", 2]"));
    done(&k);
}

/* allOf, and anyOf / oneOf next to keywords of their own: merged */
static void test_merged(void **state) {
    struct checker k = make("{\"allOf\": [{\"type\": [\"integer\", \"string\"], \"minimum\": 2}, "
                            "{\"type\": \"number\", \"maximum\": 5}, {\"maximum\": 4}]}", NULL);
    for (int x = -3; x <= 9; x++) {
        char num[8];
        snprintf(num, sizeof num, "%d", x);
        assert_int_equal(accepts(&k, num), x >= 2 && x <= 4);
    }
    assert_false(accepts(&k, "2.5"));
    assert_false(accepts(&k, "\"a\""));
    done(&k);
    /* properties of both, in order; a property both name holds both schemas */
    k = make("{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"allOf\": [{\"properties\": {\"b\": {}, "
             "\"a\": {\"minimum\": 3}}, \"required\": [\"a\"]}, {\"required\": [\"b\"]}]}", NULL);
    assert_true(accepts(&k, "{\"a\": 3, \"b\": null}"));
    assert_false(accepts(&k, "{\"a\": 2, \"b\": null}"));
    assert_false(accepts(&k, "{\"a\": 3}"));
    done(&k);
    /* enum against const, and the base of a oneOf in every branch */
    k = make("{\"type\": \"string\", \"enum\": [\"x\", \"y\", 3], \"oneOf\": [{\"const\": \"x\"}, {\"const\": 3}, "
             "{\"enum\": [\"y\", \"z\"]}]}", NULL);
    assert_true(accepts(&k, "\"x\""));
    assert_true(accepts(&k, "\"y\""));
    assert_false(accepts(&k, "\"z\""));
    assert_false(accepts(&k, "3"));
    done(&k);
}

static void test_json_object(void **state) {
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_json_object(&err);
    assert_non_null(g);
    struct grammar_vocab *v = grammar_vocab_create(0, NULL, NULL, NULL);
    struct checker k = {g, v, grammar_matcher_create(g, v, &err)};
    assert_true(accepts(&k, "{}"));
    assert_true(accepts(&k, "{ \"a\" : [1, -2.5e3, \"x\\u00e9\", null, {\"b\": false}] }"));
    assert_false(accepts(&k, "[]"));
    assert_false(accepts(&k, "{\"a\": 01}"));
    assert_false(accepts(&k, "{\"a\" 1}"));
    done(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),      cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_number_ranges), cmocka_unit_test(test_formats),
        cmocka_unit_test(test_strings),       cmocka_unit_test(test_objects),
        cmocka_unit_test(test_arrays_enums_unions), cmocka_unit_test(test_merged),
        cmocka_unit_test(test_json_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
