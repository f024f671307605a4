/* main.c — `kiln <subcommand> [options]`: dispatch only. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#include "cli/cli.h"
#include "dist/launch.h"

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct subcommand subcommands[] = {
    {"verify", cmd_verify, "check the forward pass against reference logits"},
    {"generate", cmd_generate, "greedy generation from token ids"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "benchmark a server (serving) or the engine (offline)"},
    {"chat-template", cmd_chat_template, "render a chat template for messages on stdin"},
    {"tokenize", cmd_tokenize, "text (JSON string per line) to token ids"},
    {"detokenize", cmd_detokenize, "token ids (JSON array per line) to text"},
    {"profile-report", cmd_profile_report, "GPU time of traces by kernel category (HTML and CSV)"},
    {"grammar", cmd_grammar, "JSON Schema / regex to EBNF; check texts against a grammar"},
    {"parse-output", cmd_parse_output, "a model's text to the chat message (reasoning, tool calls)"},
    {"knobs", cmd_knobs, "the KILN_* environment variables (--markdown: all of them)"},
    {"help", NULL, "this list"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-14s %s\n", subcommands[i].name, subcommands[i].help);
    fprintf(f, "\n`kiln <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (!subcommands[i].fn || strcmp(argv[1], subcommands[i].name)) continue;
        /* a bad KILN_* value stops every command before it starts (kiln
         * knobs reports it itself, and prints the table regardless) */
        struct kiln_error err;
        if (subcommands[i].fn != cmd_knobs && knob_init(&err)) {
            fprintf(stderr, "kiln: %s\n", err.msg);
            return 2;
        }
        /* a rank another kiln process started: its output is tagged from
         * the first line on (dist/launch.h) */
        if (subcommands[i].fn != cmd_knobs && dist_launched_rank() > 0) dist_tag_output(dist_launched_rank());
        static const char *const logs[] = {"serve", "generate", "verify", "bench"};
        for (size_t j = 0; j < sizeof logs / sizeof logs[0]; j++)
            if (!strcmp(argv[1], logs[j])) knob_log_set();
        return subcommands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "kiln: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
