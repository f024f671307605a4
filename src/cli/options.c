#include "cli/options.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The command being parsed, for messages of the value parsers. */
static const char *cur_cmd = "";

static void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln%s%s: ", *cur_cmd ? " " : "", cur_cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Digits with an optional '-': strtoll alone would also take " 5", "+5"
 * and "0x5" (base 0) or stop at "5x". */
int cli_parse_integer(const char *opt, const char *val, long long lo, long long hi, long long *out) {
    const char *p = val + (val[0] == '-');
    int ok = *p != 0;
    for (; *p; p++) ok &= *p >= '0' && *p <= '9';
    errno = 0;
    long long v = ok ? strtoll(val, NULL, 10) : 0;
    if (!ok || errno || v < lo || v > hi) {
        errorf("%s: expected an integer in [%lld, %lld], got '%s'", opt, lo, hi, val);
        return -1;
    }
    *out = v;
    return 0;
}

static int cli_parse_double(const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (end == val || *end || val[0] == ' ' || errno == ERANGE || !(v >= lo && v <= hi)) {
        errorf("%s: expected a number in [%g, %g], got '%s'", opt, lo, hi, val);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_choice(const struct cli_opt *o, const char *val) {
    const char *c = o->meta;
    for (int i = 0; c && *c; i++) {
        size_t n = strcspn(c, "|");
        if (strlen(val) == n && !strncmp(c, val, n)) {
            *(int *)o->dst = i;
            return 0;
        }
        c += n + (c[n] == '|');
    }
    errorf("%s: expected one of %s, got '%s'", o->name, o->meta, val);
    return -1;
}

static int set_value(const struct cli_opt *o, const char *name, const char *val) {
    long long x;
    double d;
    switch (o->type) {
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    case CLI_STR: *(const char **)o->dst = val; return 0;
    case CLI_INT:
        if (cli_parse_integer(o->name, val, (long long)o->lo, (long long)o->hi, &x)) return -1;
        *(int *)o->dst = (int)x;
        return 0;
    case CLI_LONG:
        if (cli_parse_integer(o->name, val, (long long)o->lo, (long long)o->hi, &x)) return -1;
        *(long *)o->dst = (long)x;
        return 0;
    case CLI_SIZE:
        if (cli_parse_integer(o->name, val, (long long)o->lo, (long long)o->hi, &x)) return -1;
        *(size_t *)o->dst = (size_t)x;
        return 0;
    case CLI_U64: {
        const char *p = val;
        int ok = *p != 0;
        for (; *p; p++) ok &= *p >= '0' && *p <= '9';
        errno = 0;
        unsigned long long u = ok ? strtoull(val, NULL, 10) : 0;
        if (!ok || errno) {
            errorf("%s: expected an integer in [0, 2^64), got '%s'", o->name, val);
            return -1;
        }
        *(uint64_t *)o->dst = u;
        return 0;
    }
    case CLI_DOUBLE:
        if (cli_parse_double(o->name, val, o->lo, o->hi, &d)) return -1;
        *(double *)o->dst = d;
        return 0;
    case CLI_CHOICE: return parse_choice(o, val);
    case CLI_CALL: return o->call(o->dst, name, val);
    }
    return -1;
}

/* "--help" is an option of every command, so that "--he" finds it. */
static const struct cli_opt help_opt = {.name = "--help", .type = CLI_FLAG, .help = "this help"};

/* Exact name or alias, else the options the name is a prefix of. Returns
 * the option, or NULL with *n_hits 0 (unknown) or > 1 (ambiguous; the
 * candidates' names in hits). */
static const struct cli_opt *find(const struct cli_command *c, const char *name, size_t len,
                                  const char **hits, int *n_hits) {
    const struct cli_opt *hit = NULL;
    *n_hits = 0;
    for (size_t g = 0; g <= c->n_groups; g++) {
        const struct cli_opt *t = g < c->n_groups ? c->groups[g].opts : &help_opt;
        size_t n = g < c->n_groups ? c->groups[g].n : 1;
        for (size_t i = 0; i < n; i++) {
            const char *names[2] = {t[i].name, t[i].alias};
            for (int k = 0; k < 2 && names[k]; k++) {
                if (strlen(names[k]) == len && !strncmp(names[k], name, len)) {
                    *n_hits = 1;
                    return &t[i];
                }
                if (strncmp(names[k], name, len)) continue;
                /* a prefix of two names of one destination is not ambiguous */
                if (hit && hit->dst == t[i].dst && hit->dst) continue;
                if (*n_hits < 8) hits[*n_hits] = names[k];
                (*n_hits)++;
                hit = &t[i];
            }
        }
    }
    return *n_hits == 1 ? hit : NULL;
}

/* argparse's test: "-5" and "-.5" are values, "-x" is an option. */
static int looks_negative_number(const char *s) {
    if (s[0] != '-') return 0;
    char *end;
    (void)strtod(s, &end);
    return end != s && !*end;
}

static void cli_usage(const struct cli_command *c, FILE *f);

int cli_parse(const struct cli_command *c, int argc, char **argv, const char **pos, int *n_pos) {
    cur_cmd = c->name;
    *n_pos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1] || looks_negative_number(a)) {
            if (c->max_positional >= 0 && *n_pos >= c->max_positional) {
                if (c->max_positional == 0) errorf("unexpected argument '%s'", a);
                else errorf("unexpected argument '%s' (after '%s')", a, pos[*n_pos - 1]);
                fprintf(stderr, "see kiln %s --help\n", c->name);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(a, "-h")) {
            cli_usage(c, stdout);
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const char *hits[8];
        int n_hits;
        const struct cli_opt *o = a[1] == '-' ? find(c, a, len, hits, &n_hits) : (n_hits = 0, NULL);
        if (!o) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(len < 100 ? len : 100), a);
            if (n_hits > 1) {
                char list[512] = "";
                for (int k = 0; k < n_hits && k < 8; k++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", hits[k]);
                errorf("ambiguous option '%s': it could be %s%s", name, list, n_hits > 8 ? ", ..." : "");
            } else {
                errorf("unknown option '%s'", name);
            }
            fprintf(stderr, "see kiln %s --help\n", c->name);
            return 2;
        }
        if (o == &help_opt) {
            cli_usage(c, stdout);
            return 1;
        }
        const char *val = NULL;
        if (o->type == CLI_FLAG) {
            if (eq) {
                errorf("%s takes no value (got '%s')", o->name, eq + 1);
                return 2;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc && (argv[i + 1][0] != '-' || !argv[i + 1][1] || looks_negative_number(argv[i + 1]))) {
            val = argv[++i];
        } else {
            if (i + 1 < argc)
                errorf("%s needs a value (got the option '%s'; write %s=VALUE for a value that starts with '-')",
                       o->name, argv[i + 1], o->name);
            else
                errorf("%s needs a value", o->name);
            return 2;
        }
        if (set_value(o, o->name, val)) return 2;
    }
    return 0;
}

static void cli_usage(const struct cli_command *c, FILE *f) {
    fprintf(f, "usage: kiln %s %s\n", c->name, c->usage);
    if (c->about) fprintf(f, "\n%s\n", c->about);
    for (size_t g = 0; g < c->n_groups; g++) {
        const struct cli_group *gr = &c->groups[g];
        fprintf(f, "\n");
        if (gr->title) fprintf(f, "%s:\n", gr->title);
        for (size_t i = 0; i < gr->n; i++) {
            const struct cli_opt *o = &gr->opts[i];
            char head[160];
            int n = snprintf(head, sizeof head, "  %s%s%s", o->name, o->alias ? ", " : "", o->alias ? o->alias : "");
            if (o->type != CLI_FLAG && n > 0 && (size_t)n < sizeof head)
                snprintf(head + n, sizeof head - (size_t)n, " %s", o->meta ? o->meta : "VALUE");
            /* help text continues on its own lines, indented under the first */
            const char *h = o->help ? o->help : "";
            int w = (int)strlen(head);
            fprintf(f, "%s", head);
            int first = 1;
            while (*h || first) {
                size_t line = strcspn(h, "\n");
                if (first && w > 30) fprintf(f, "\n%32s", "");
                else if (first) fprintf(f, "%*s", 32 - w, "");
                else fprintf(f, "%32s", "");
                fprintf(f, "%.*s\n", (int)line, h);
                h += line + (h[line] == '\n');
                first = 0;
            }
        }
    }
    fprintf(f, "\n  --help                        this help\n");
    if (c->epilog) fprintf(f, "\n%s\n", c->epilog);
}
