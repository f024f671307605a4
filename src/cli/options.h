/* options.h — the one command-line parser of every `kiln` subcommand.
 *
 * A command describes its options in tables (name, type, destination,
 * range, value name, help), grouped under headings; cli_parse reads argv
 * against them the way Python's argparse (so SGLang) does: `--name value`
 * and `--name=value`, any unambiguous prefix of a name (two names of one
 * destination are not ambiguous), flags without a value, `--` before
 * arguments that start with '-', and positional arguments. Every error
 * names the option and the value; `--help` prints the usage generated from
 * the tables. A value is written to its destination as it is parsed, so the
 * destinations hold their defaults beforehand.
 */
#ifndef KILN_CLI_OPTIONS_H
#define KILN_CLI_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cli_opt_type {
    CLI_FLAG,   /* int, set to 1; takes no value */
    CLI_STR,    /* const char *, pointing into argv */
    CLI_INT,    /* int in [lo, hi] */
    CLI_LONG,   /* long in [lo, hi] */
    CLI_SIZE,   /* size_t in [lo, hi] */
    CLI_U64,    /* uint64_t */
    CLI_DOUBLE, /* double in [lo, hi] */
    CLI_CHOICE, /* int: the index of the value among meta's "a|b|c" */
    CLI_CALL,   /* call(dst, name, value): 0, or -1 after printing why */
};

struct cli_opt {
    const char *name;  /* "--port" */
    enum cli_opt_type type;
    void *dst;
    double lo, hi;     /* CLI_INT, CLI_LONG, CLI_SIZE, CLI_DOUBLE */
    const char *meta;  /* the value in --help ("N", "DIR"); CLI_CHOICE: "a|b|c" */
    const char *help;
    const char *alias; /* a second name, or NULL */
    int (*call)(void *dst, const char *name, const char *value);
};

/* The destination's type is checked at compile time. */
#define CLI_DST(T, p) _Generic((p), T: (p))
#define CLI_OPT_FLAG(n, d, h) {.name = n, .type = CLI_FLAG, .dst = CLI_DST(int *, d), .help = h}
#define CLI_OPT_STR(n, d, m, h) {.name = n, .type = CLI_STR, .dst = CLI_DST(const char **, d), .meta = m, .help = h}
#define CLI_OPT_INT(n, d, l, u, m, h)                                                                                  \
    {.name = n, .type = CLI_INT, .dst = CLI_DST(int *, d), .lo = l, .hi = u, .meta = m, .help = h}
#define CLI_OPT_LONG(n, d, l, u, m, h)                                                                                 \
    {.name = n, .type = CLI_LONG, .dst = CLI_DST(long *, d), .lo = l, .hi = u, .meta = m, .help = h}
#define CLI_OPT_SIZE(n, d, l, u, m, h)                                                                                 \
    {.name = n, .type = CLI_SIZE, .dst = CLI_DST(size_t *, d), .lo = l, .hi = u, .meta = m, .help = h}
#define CLI_OPT_U64(n, d, m, h) {.name = n, .type = CLI_U64, .dst = CLI_DST(uint64_t *, d), .meta = m, .help = h}
#define CLI_OPT_DOUBLE(n, d, l, u, m, h)                                                                               \
    {.name = n, .type = CLI_DOUBLE, .dst = CLI_DST(double *, d), .lo = l, .hi = u, .meta = m, .help = h}
#define CLI_OPT_CHOICE(n, d, choices, h)                                                                               \
    {.name = n, .type = CLI_CHOICE, .dst = CLI_DST(int *, d), .meta = choices, .help = h}
#define CLI_OPT_CALL(n, d, fn, m, h) {.name = n, .type = CLI_CALL, .dst = d, .call = fn, .meta = m, .help = h}

struct cli_group {
    const char *title; /* heading in --help; NULL: none */
    const struct cli_opt *opts;
    size_t n;
};

struct cli_command {
    const char *name;       /* "serve" (messages say "kiln serve: ...") */
    const char *usage;      /* the usage line after "kiln NAME " */
    const char *about;      /* a paragraph after it, or NULL */
    const struct cli_group *groups;
    size_t n_groups;
    int max_positional;     /* how many positional arguments; -1: any number */
    const char *epilog;     /* printed after the options, or NULL */
};

/* Parses argv[1..argc). Positional arguments go to pos[0..*n_pos) (pos has
 * room for argc). Returns 0; 1 after printing --help (exit 0); 2 after
 * printing a usage error (exit 2). */
int cli_parse(const struct cli_command *c, int argc, char **argv, const char **pos, int *n_pos);

/* The value parser shared with CLI_CALL functions; prints an error naming
 * the option and returns -1 on a bad value. */
int cli_parse_integer(const char *opt, const char *val, long long lo, long long hi, long long *out);

#endif
