/* cmd_parse_output.c — `kiln parse-output`: a model's text split into the
 * OpenAI chat message the server would answer with (reasoning_content,
 * content, tool_calls), by the same parsers (server/chat_output.h): the
 * offline counterpart of the server's /separate_reasoning and
 * /parse_function_call, for checking a parser on texts a model wrote.
 *
 *   kiln parse-output [--tool-call-parser F] [--reasoning-parser R]
 *                     [--chunk N] [--no-parallel-tool-calls] [--seed S]
 *   "text" per line (special tokens kept) -> {"role": "assistant", ...}
 *
 * --chunk N feeds each text in deltas of N bytes, as a stream delivers it
 * (a delta may end inside a marker or a UTF-8 character); the message is
 * the same whatever the split. Tool call ids come from --seed. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/options.h"
#include "server/chat_output.h"

static int parse_one(const struct chat_output_opts *o, uint64_t seed, long chunk, const char *text, size_t len) {
    struct chat_output c;
    chat_output_init(&c, o, NULL, 0, seed);
    size_t step = chunk > 0 ? (size_t)chunk : (len ? len : 1);
    for (size_t at = 0; at < len; at += step) {
        size_t n = len - at < step ? len - at : step;
        json_decref(chat_output_feed(&c, text + at, n, 0));
    }
    json_decref(chat_output_feed(&c, "", 0, 1));
    json_t *m = chat_output_message(&c);
    char *s = json_dumps(m, JSON_COMPACT | JSON_ENSURE_ASCII);
    int rc = s ? 0 : 1;
    if (s) puts(s);
    free(s);
    json_decref(m);
    chat_output_free(&c);
    return rc;
}

int cmd_parse_output(int argc, char **argv) {
    const char *tools_name = NULL, *reasoning_name = NULL;
    long chunk = 0;
    int no_parallel = 0;
    uint64_t seed = 0;
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--tool-call-parser", &tools_name, "F", "split tool calls out (as kiln serve's option)"),
        CLI_OPT_STR("--reasoning-parser", &reasoning_name, "R", "split reasoning out (as kiln serve's option)"),
        CLI_OPT_LONG("--chunk", &chunk, 0, 1l << 30, "N", "feed each text in deltas of N bytes (0: whole)"),
        CLI_OPT_FLAG("--no-parallel-tool-calls", &no_parallel, "keep the first call only"),
        CLI_OPT_U64("--seed", &seed, "S", "seed of the tool call ids (default 0)"),
    };
    const struct cli_group groups[] = {{NULL, opts, sizeof opts / sizeof opts[0]}};
    const struct cli_command cmd = {
        .name = "parse-output",
        .usage = "[--tool-call-parser F] [--reasoning-parser R] [options] < texts",
        .about = "Reads one JSON string per line on stdin (a model's output, special tokens kept) and\n"
                 "writes the assistant message kiln serve would return for it, one JSON object per line.",
        .groups = groups, .n_groups = 1, .max_positional = 0};
    int n_pos, prc = cli_parse(&cmd, argc, argv, NULL, &n_pos);
    if (prc) return prc == 1 ? 0 : prc;
    struct chat_output_opts o = {.parallel_tool_calls = !no_parallel};
    if (tools_name && tool_format_from_name(tools_name, &o.tools)) {
        fprintf(stderr, "kiln parse-output: --tool-call-parser '%s': expected one of %s\n", tools_name,
                tool_format_choices());
        return 2;
    }
    if (reasoning_name && reasoning_format_from_name(reasoning_name, &o.reasoning)) {
        fprintf(stderr, "kiln parse-output: --reasoning-parser '%s': expected one of %s\n", reasoning_name,
                reasoning_format_choices());
        return 2;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    int rc = 0;
    while (!rc && (n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v || !json_is_string(v)) {
            fprintf(stderr, "kiln parse-output: stdin line %zu: expected a JSON string%s%s\n", lineno,
                    v ? "" : ": ", v ? "" : je.text);
            rc = 1;
        } else {
            rc = parse_one(&o, seed, chunk, json_string_value(v), json_string_length(v));
            fflush(stdout);
        }
        json_decref(v);
    }
    free(line);
    return rc;
}
