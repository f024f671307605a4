/* cmd_knobs.c — `kiln knobs`: the KILN_* environment variables (base/knob.h). */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln knobs [--markdown | --names]\n\n"
               "Checks the KILN_* environment variables and prints those set to other\n"
               "values than their defaults.\n"
               "  --markdown  the table of every variable (docs/knobs.md)\n"
               "  --names     every variable's name, one a line\n");
}

int cmd_knobs(int argc, char **argv) {
    if (argc > 2) {
        usage(stderr);
        return 2;
    }
    if (argc == 2) {
        if (!strcmp(argv[1], "--markdown")) knob_print_markdown(stdout);
        else if (!strcmp(argv[1], "--names")) knob_print_names(stdout);
        else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) usage(stdout);
        else {
            fprintf(stderr, "kiln knobs: unknown option '%s'\n", argv[1]);
            usage(stderr);
            return 2;
        }
        return 0;
    }
    struct kiln_error err;
    if (knob_init(&err)) {
        fprintf(stderr, "kiln: %s\n", err.msg);
        return 2;
    }
    char line[4096];
    if (knob_describe_set(line, sizeof line) == 0) printf("every knob is at its default\n");
    else
        for (char *p = strtok(line, " "); p; p = strtok(NULL, " ")) printf("%s\n", p);
    return 0;
}
