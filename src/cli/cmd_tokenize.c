/* cmd_tokenize.c — `kiln tokenize` and `kiln detokenize`: line-oriented
 * JSON filters over a tokenizer folder, for scripts and tests.
 *
 *   kiln tokenize --tokenizer DIR [--add-special]   "text" per line -> [ids]
 *   kiln detokenize --tokenizer DIR [--skip-special] [ids] per line -> "text"
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "kiln/tokenizer.h"

struct tok_args {
    const char *dir;
    int flag;
    char *owned; /* dir when found in the Hugging Face cache */
};

static int parse_args(int argc, char **argv, const char *flag, const char *flag_help, struct tok_args *a,
                      const char *usage, const char *about) {
    memset(a, 0, sizeof *a);
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--tokenizer", &a->dir, "DIR", "folder with tokenizer.json, or a Hugging Face id in the local cache"),
        {.name = flag, .type = CLI_FLAG, .dst = &a->flag, .help = flag_help},
    };
    const struct cli_group groups[] = {{NULL, opts, 2}};
    const struct cli_command cmd = {.name = argv[0], .usage = usage, .about = about, .groups = groups, .n_groups = 1,
                                    .max_positional = 0};
    int n_pos, rc = cli_parse(&cmd, argc, argv, NULL, &n_pos);
    if (rc) return rc;
    if (!a->dir) {
        fprintf(stderr, "kiln %s: --tokenizer DIR is required (see --help)\n", argv[0]);
        return 2;
    }
    char msg[1024];
    int is_id;
    if (cli_resolve_model(a->dir, &a->dir, &a->owned, &is_id, msg, sizeof msg)) {
        fprintf(stderr, "kiln %s: --tokenizer: %s\n", argv[0], msg);
        return 2;
    }
    return 0;
}

static const char tokenize_about[] =
    "Reads one JSON string per line on stdin and writes one JSON array of token ids per line.";

static const char detokenize_about[] =
    "Reads one JSON array of token ids per line on stdin and writes one JSON string per line.";

/* Reads stdin line by line, calling fn on each parsed JSON value. */
static int each_line(const char *cmd, struct kiln_tokenizer *tok, int flag,
                     int (*fn)(struct kiln_tokenizer *, int, json_t *, size_t, const char *)) {
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) {
            fprintf(stderr, "kiln %s: line %zu: invalid JSON: %s\n", cmd, lineno, je.text);
            rc = 1;
            break;
        }
        rc = fn(tok, flag, v, lineno, cmd);
        json_decref(v);
        if (rc) break;
        fflush(stdout);
    }
    free(line);
    return rc;
}

static int tokenize_one(struct kiln_tokenizer *tok, int add_special, json_t *v, size_t lineno, const char *cmd) {
    struct kiln_error err;
    struct kiln_token_ids ids = {0};
    if (!json_is_string(v)) {
        fprintf(stderr, "kiln %s: line %zu: expected a JSON string\n", cmd, lineno);
        return 1;
    }
    if (kiln_tokenizer_encode(tok, json_string_value(v), json_string_length(v), add_special, &ids, &err)) {
        fprintf(stderr, "kiln %s: line %zu: %s\n", cmd, lineno, err.msg);
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < ids.n; i++) printf(i ? ",%d" : "%d", ids.ids[i]);
    puts("]");
    kiln_token_ids_free(&ids);
    return 0;
}

static int detokenize_one(struct kiln_tokenizer *tok, int skip_special, json_t *v, size_t lineno, const char *cmd) {
    struct kiln_error err;
    if (!json_is_array(v)) {
        fprintf(stderr, "kiln %s: line %zu: expected a JSON array of token ids\n", cmd, lineno);
        return 1;
    }
    size_t n = json_array_size(v);
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= kiln_tokenizer_id_limit(tok)) {
            fprintf(stderr, "kiln %s: line %zu: element %zu is not a token id in [0, %d)\n", cmd, lineno, i,
                    kiln_tokenizer_id_limit(tok));
            free(ids);
            return 1;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    char *text;
    size_t len;
    int rc = kiln_tokenizer_decode(tok, ids, n, skip_special, &text, &len, &err);
    free(ids);
    if (rc) {
        fprintf(stderr, "kiln %s: line %zu: %s\n", cmd, lineno, err.msg);
        return 1;
    }
    json_t *s = json_stringn(text, len);
    free(text);
    char *out = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(s);
    if (!out) {
        fprintf(stderr, "kiln %s: line %zu: cannot encode the text as JSON\n", cmd, lineno);
        return 1;
    }
    puts(out);
    free(out);
    return 0;
}

static int run(int argc, char **argv, const char *flag, const char *flag_help, const char *usage, const char *about,
               int (*fn)(struct kiln_tokenizer *, int, json_t *, size_t, const char *)) {
    struct tok_args a;
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    int rc = parse_args(argc, argv, flag, flag_help, &a, usage, about);
    if (rc) return rc == 1 ? 0 : rc;
    if (kiln_tokenizer_load(&tok, a.dir, &err)) {
        fprintf(stderr, "kiln %s: %s\n", argv[0], err.msg);
        free(a.owned);
        return 1;
    }
    rc = each_line(argv[0], tok, a.flag, fn);
    kiln_tokenizer_free(tok);
    free(a.owned);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    return run(argc, argv, "--add-special", "add the tokenizer's special tokens (its post-processor, e.g. BOS)",
               "--tokenizer DIR [--add-special]", tokenize_about, tokenize_one);
}

int cmd_detokenize(int argc, char **argv) {
    return run(argc, argv, "--skip-special", "drop special tokens", "--tokenizer DIR [--skip-special]",
               detokenize_about, detokenize_one);
}
