/* cmd_grammar.c — `kiln grammar`: what a JSON Schema, a regular expression
 * or an EBNF grammar means to the grammar engine. Prints the EBNF a schema
 * or pattern translates to, and says for each text file whether the
 * compiled grammar accepts it completely: for debugging a schema, and for
 * the tests that hold the translators against independent validators.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/file.h"
#include "cli/cli.h"
#include "grammar/grammar.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln grammar (--json-schema FILE | --json-object | --regex PATTERN | --ebnf FILE)\n"
            "                    [--strict] [--compact] [--print] [--check TEXTFILE...]\n\n"
            "Translates a JSON Schema or a regular expression to the EBNF grammar kiln\n"
            "constrains generation with, and checks texts against it.\n"
            "  --json-schema FILE  a JSON Schema (response_format json_schema)\n"
            "  --json-object       any JSON object (response_format json_object)\n"
            "  --regex PATTERN     a regular expression the whole text must match\n"
            "  --ebnf FILE         an EBNF grammar (GBNF or xgrammar dialect), root rule \"root\"\n"
            "  --strict            the schema is strict (OpenAI json_schema.strict)\n"
            "  --compact           no white space between JSON tokens\n"
            "  --print             print the EBNF (the default without --check)\n"
            "  --check FILE...     for each file: \"FILE: accepted\", or why not; the exit\n"
            "                      status is 0 when every file is accepted, else 1\n");
}

/* Feeds the text byte by byte so that a rejection names its offset. */
static int check_file(struct grammar_matcher *m, const char *path) {
    char *text = NULL;
    size_t len = 0;
    struct kiln_error err;
    if (file_read_all(path, &text, &len, &err)) {
        printf("%s: cannot read: %s\n", path, err.msg);
        return 1;
    }
    grammar_matcher_reset(m);
    int rc = 0;
    for (size_t i = 0; i < len; i++) {
        if (grammar_matcher_accept_bytes(m, text + i, 1)) {
            printf("%s: rejected at byte %zu\n", path, i);
            rc = 1;
            goto done;
        }
    }
    if (grammar_matcher_can_end(m)) {
        printf("%s: accepted\n", path);
    } else {
        printf("%s: incomplete (the grammar expects more)\n", path);
        rc = 1;
    }
done:
    free(text);
    return rc;
}

int cmd_grammar(int argc, char **argv) {
    const char *schema = NULL, *regex = NULL, *ebnf = NULL;
    int json_object = 0, strict = 0, compact = 0, print = 0, first_check = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json-schema") && has_val) {
            schema = argv[++i];
        } else if (!strcmp(a, "--regex") && has_val) {
            regex = argv[++i];
        } else if (!strcmp(a, "--ebnf") && has_val) {
            ebnf = argv[++i];
        } else if (!strcmp(a, "--json-object")) {
            json_object = 1;
        } else if (!strcmp(a, "--strict")) {
            strict = 1;
        } else if (!strcmp(a, "--compact")) {
            compact = 1;
        } else if (!strcmp(a, "--print")) {
            print = 1;
        } else if (!strcmp(a, "--check")) {
            first_check = i + 1;
            break;
        } else {
            fprintf(stderr, "kiln grammar: unknown option or missing value '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if ((schema != NULL) + (regex != NULL) + (ebnf != NULL) + json_object != 1) {
        fprintf(stderr, "kiln grammar: give one of --json-schema, --json-object, --regex, --ebnf\n");
        usage(stderr);
        return 2;
    }
    if (first_check && first_check >= argc) {
        fprintf(stderr, "kiln grammar: --check needs at least one file\n");
        return 2;
    }
    if (!first_check) print = 1;

    struct kiln_error err = {0};
    struct buf text = {0};
    int rc = 1;
    struct grammar *g = NULL;
    struct grammar_vocab *v = NULL;
    struct grammar_matcher *m = NULL;
    if (schema) {
        json_error_t je;
        json_t *s = json_load_file(schema, JSON_DECODE_ANY, &je);
        if (!s) {
            fprintf(stderr, "kiln grammar: %s:%d:%d: %s\n", schema, je.line, je.column, je.text);
            goto done;
        }
        struct grammar_json_opts opts = {.any_whitespace = compact ? 0 : -1, .strict = strict};
        int r = grammar_ebnf_from_json_schema(s, &opts, &text, &err);
        json_decref(s);
        if (r) {
            fprintf(stderr, "kiln grammar: %s: %s\n", schema, err.msg);
            goto done;
        }
    } else if (regex) {
        if (grammar_ebnf_from_regex(regex, strlen(regex), &text, &err)) {
            fprintf(stderr, "kiln grammar: %s\n", err.msg);
            goto done;
        }
    } else if (ebnf) {
        char *t = NULL;
        size_t len = 0;
        if (file_read_all(ebnf, &t, &len, &err)) {
            fprintf(stderr, "kiln grammar: %s\n", err.msg);
            goto done;
        }
        buf_append(&text, t, len);
        free(t);
    }
    if (print && !json_object) fputs(text.data ? text.data : "", stdout);
    if (json_object) g = grammar_compile_json_object(&err);
    else g = grammar_compile_ebnf(text.data ? text.data : "", text.len, "root", &err);
    if (!g) {
        fprintf(stderr, "kiln grammar: %s: %s\n", schema ? schema : ebnf ? ebnf : "the pattern", err.msg);
        goto done;
    }
    rc = 0;
    if (first_check) {
        /* no tokens: the matcher is driven by bytes only */
        v = grammar_vocab_create(0, NULL, NULL, NULL);
        m = grammar_matcher_create(g, v, &err);
        if (!m) {
            fprintf(stderr, "kiln grammar: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        for (int i = first_check; i < argc; i++) rc |= check_file(m, argv[i]);
    }
done:
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    if (g) grammar_unref(g);
    buf_free(&text);
    return rc;
}
