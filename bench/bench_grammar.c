/* bench_grammar — grammar-constrained decoding on the CPU: compile and
 * prepare time, and the time of one token mask (one decoding step) at
 * every position of a JSON document, with the per-state cache and without.
 *
 *   bench_grammar [tokenizer-name]      (a folder under $KILN_TOKENIZERS, default qwen3)
 *
 * The vocabulary is the tokenizer's tokens as raw bytes: byte-level BPE
 * token strings are mapped back through the GPT-2 byte alphabet here, a
 * bench-only reading of tokenizer.json (added tokens flagged special are
 * never allowed). Grammars: any JSON value in an object (what
 * response_format json_object asks for) and an object of 20 typed
 * properties written as EBNF, the shape a JSON Schema translates to.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

static const char *json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws ::= [ \\t\\n\\r]*\n";

static const char *doc =
    "{\"name\": \"Ada Lovelace\", \"id\": 1815, \"tags\": [\"math\", \"poetry\"], \"score\": -12.5e3,\n"
    "  \"address\": {\"city\": \"London\", \"zip\": null}, \"active\": true, \"note\": \"caf\xC3\xA9 \\u00e9\"}";

/* GPT-2's byte alphabet, inverted: code point -> byte (-1: not a byte). */
static void byte_decoder(int *dec) {
    for (int k = 0; k < 512; k++) dec[k] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable)
            dec[b] = b;
        else
            dec[256 + n++] = b;
    }
}

static struct grammar_vocab *load_vocab(const char *path, int *n_out) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "bench_grammar: %s: %s\n", path, je.text);
        exit(1);
    }
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    int n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) if (json_integer_value(val) + 1 > n) n = (int)json_integer_value(val) + 1;
    size_t ai;
    json_array_foreach(added, ai, val) {
        int id = (int)json_integer_value(json_object_get(val, "id"));
        if (id + 1 > n) n = id + 1;
    }
    char **tok = xcalloc((size_t)n, sizeof *tok);
    size_t *len = xcalloc((size_t)n, sizeof *len);
    uint8_t *special = xcalloc((size_t)n, 1);
    int dec[512];
    byte_decoder(dec);
    json_object_foreach(vocab, key, val) {
        int id = (int)json_integer_value(val);
        struct buf b = {0};
        const unsigned char *s = (const unsigned char *)key;
        while (*s) { /* the key is UTF-8 of code points < 512 */
            uint32_t cp = *s < 0x80 ? *s : (uint32_t)(*s & 0x1F) << 6 | (s[1] & 0x3F);
            s += *s < 0x80 ? 1 : 2;
            if (cp < 512 && dec[cp] >= 0) buf_push(&b, (char)dec[cp]);
        }
        len[id] = b.len;
        tok[id] = buf_take(&b);
    }
    json_array_foreach(added, ai, val) {
        int id = (int)json_integer_value(json_object_get(val, "id"));
        free(tok[id]);
        tok[id] = xstrdup(json_string_value(json_object_get(val, "content")));
        len[id] = strlen(tok[id]);
        special[id] = json_is_true(json_object_get(val, "special"));
    }
    struct grammar_vocab *v = grammar_vocab_create(n, (const char *const *)tok, len, special);
    for (int k = 0; k < n; k++) free(tok[k]);
    free(tok);
    free(len);
    free(special);
    json_decref(root);
    *n_out = n;
    return v;
}

static void schema_grammar(struct buf *b) {
    static const char *types[] = {"string", "integer", "number", "boolean", "enum"};
    buf_puts(b, "root ::= \"{\" ws");
    for (int k = 0; k < 20; k++)
        buf_printf(b, " %s\"\\\"field_%02d\\\"\" ws \":\" ws %s ws", k ? "\",\" ws " : "", k, types[k % 5]);
    buf_puts(b, " \"}\"\n"
                "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\"\n"
                "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
                "number ::= integer (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
                "boolean ::= \"true\" | \"false\"\n"
                "enum ::= \"\\\"red\\\"\" | \"\\\"green\\\"\" | \"\\\"blue\\\"\"\n"
                "ws ::= [ \\t\\n]{0,8}\n");
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Masks at every byte position of text; prints the distribution. */
static void run_positions(const char *label, struct grammar *g, const struct grammar_vocab *v, const char *text,
                          int use_cache, int verbose) {
    struct kiln_error err = {0};
    struct grammar_matcher *m = grammar_matcher_create(g, v, &err);
    m->use_cache = use_cache;
    uint32_t *bits = xcalloc((size_t)grammar_mask_words(v), 4);
    size_t n = strlen(text);
    double *us = xcalloc(n + 1, sizeof *us);
    size_t cnt = 0;
    for (size_t i = 0; i <= n; i++) {
        int reps = use_cache ? 20 : 1;
        double t0 = time_now();
        for (int r = 0; r < reps; r++) grammar_matcher_fill_mask(m, bits);
        us[cnt] = (time_now() - t0) / reps * 1e6;
        int allowed = 0;
        for (int w = 0; w < grammar_mask_words(v); w++) allowed += __builtin_popcount(bits[w]);
        if (verbose && us[cnt] > 20) /* the slow positions, if any */
            printf("    after %-18.*s ... %8.1f us  (%d tokens allowed, %u stacks)\n", (int)(i < 18 ? i : 18),
                   text + (i < 18 ? 0 : i - 18), us[cnt], allowed, m->cur.n);
        cnt++;
        if (i < n && grammar_matcher_accept_bytes(m, text + i, 1)) {
            fprintf(stderr, "bench_grammar: %s: the text is refused at byte %zu\n", label, i);
            exit(1);
        }
    }
    double sum = 0;
    for (size_t k = 0; k < cnt; k++) sum += us[k];
    qsort(us, cnt, sizeof *us, cmp_double);
    printf("  %-34s %s: mean %8.1f us  median %8.1f  p90 %8.1f  max %8.1f  (%zu positions)\n", label,
           use_cache ? "cache   " : "no cache", sum / (double)cnt, us[cnt / 2], us[cnt * 9 / 10], us[cnt - 1], cnt);
    free(us);
    free(bits);
    grammar_matcher_free(m);
}

static void bench_grammar_text(const char *label, const char *src, const struct grammar_vocab *v, const char *text) {
    struct kiln_error err = {0};
    double t0 = time_now();
    struct grammar *g = grammar_compile_ebnf(src, strlen(src), NULL, &err);
    double t1 = time_now();
    if (!g) {
        fprintf(stderr, "bench_grammar: %s: %s\n", label, err.msg);
        exit(1);
    }
    grammar_prepare(g, v, &err);
    double t2 = time_now();
    uint32_t with_edges = 0;
    for (uint32_t s = 0; s < g->n_states; s++) with_edges += g->states[s].n_edges > 0;
    printf("%s: compile %.2f ms, prepare %.1f ms (%u states, %u with byte edges, %u rules kept)\n", label,
           (t1 - t0) * 1e3, (t2 - t1) * 1e3, g->n_states, with_edges, g->n_rules);
    run_positions(label, g, v, text, 1, 1);
    run_positions(label, g, v, text, 1, 0);
    run_positions(label, g, v, text, 0, 0);
    grammar_unref(g);
}

/* The same 20 properties as a JSON Schema (strict, as OpenAI clients send
 * it, four strings of at most 64 characters): translation to EBNF, then the
 * grammar as above. */
static void bench_schema(const struct grammar_vocab *v, const char *doc20) {
    static const char *types[] = {"{\"type\": \"string\", \"maxLength\": 64}",
                                  "{\"type\": \"integer\", \"minimum\": -1000, \"maximum\": 1000}",
                                  "{\"type\": \"number\"}", "{\"type\": \"boolean\"}",
                                  "{\"enum\": [\"red\", \"green\", \"blue\"]}"};
    struct buf s = {0}, ebnf = {0};
    buf_puts(&s, "{\"type\": \"object\", \"additionalProperties\": false, \"properties\": {");
    for (int k = 0; k < 20; k++) buf_printf(&s, "%s\"field_%02d\": %s", k ? ", " : "", k, types[k % 5]);
    buf_puts(&s, "}}");
    struct grammar_json_opts opts = {.any_whitespace = -1, .strict = 1};
    struct kiln_error err = {0};
    json_t *schema = json_loads(s.data, 0, NULL);
    double t0 = time_now();
    int reps = 100;
    for (int r = 0; r < reps; r++) {
        buf_clear(&ebnf);
        if (grammar_ebnf_from_json_schema(schema, &opts, &ebnf, &err)) {
            fprintf(stderr, "bench_grammar: schema: %s\n", err.msg);
            exit(1);
        }
    }
    printf("20-property JSON Schema: translated to EBNF in %.3f ms (%zu bytes)\n", (time_now() - t0) / reps * 1e3,
           ebnf.len);
    bench_grammar_text("20-property JSON Schema", ebnf.data, v, doc20);
    json_decref(schema);
    buf_free(&s);
    buf_free(&ebnf);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "qwen3";
    const char *dir = knob_str(KNOB_TOKENIZERS);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir && *dir ? dir : ".cache/tokenizers", name);
    int n_tokens;
    double t0 = time_now();
    struct grammar_vocab *v = load_vocab(path, &n_tokens);
    printf("vocabulary %s: %d tokens, trie built in %.1f ms (with reading the file)\n", name, n_tokens,
           (time_now() - t0) * 1e3);
    bench_grammar_text("json (any object)", json_gbnf, v, doc);
    struct buf sg = {0}, sd = {0};
    schema_grammar(&sg);
    static const char *vals[] = {"\"hello, world\"", "-42", "3.25e-2", "true", "\"green\""};
    buf_puts(&sd, "{");
    for (int k = 0; k < 20; k++) buf_printf(&sd, "%s\"field_%02d\": %s", k ? ", " : "", k, vals[k % 5]);
    buf_puts(&sd, "}");
    bench_grammar_text("20-property object", sg.data, v, sd.data);
    bench_schema(v, sd.data);
    buf_free(&sg);
    buf_free(&sd);
    grammar_vocab_free(v);
    return 0;
}
