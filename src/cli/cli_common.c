#include "cli/cli_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/file.h"
#include "base/mem.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

const char *cli_default_model(void) {
    const char *e = getenv("KILN_MODEL");
    if (e && *e) return e;
    static const char *candidates[] = {KILN_SOURCE_DIR "/models/stories260K", "models/stories260K"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        char *p = path_join(candidates[i], "config.json");
        int ok = file_exists(p);
        free(p);
        if (ok) return candidates[i];
    }
    return "models/stories260K";
}

void model_args_defaults(struct model_args *a) {
    a->model_dir = NULL;
    a->device = backend_default_name();
    a->load_format = "auto";
    a->threads = 0;
    a->page_size = 1;
    a->deterministic = 0;
    a->no_shared_fusion = 0;
}

int cli_parse_int(const char *opt, const char *val, long lo, long hi, long *out) {
    if (!val) {
        fprintf(stderr, "kiln: %s needs a value\n", opt);
        return -1;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        fprintf(stderr, "kiln: %s: expected an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, val);
        return -1;
    }
    *out = v;
    return 0;
}

int model_args_parse(struct model_args *a, int argc, char **argv, int *i) {
    const char *o = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
    if (!strcmp(o, "--model") || !strcmp(o, "--device") || !strcmp(o, "--load-format")) {
        if (!v) {
            fprintf(stderr, "kiln: %s needs a value\n", o);
            return -1;
        }
        if (!strcmp(o, "--model")) a->model_dir = v;
        else if (!strcmp(o, "--device")) a->device = v;
        else a->load_format = v;
        (*i)++;
        return 1;
    }
    if (!strcmp(o, "--deterministic")) {
        a->deterministic = 1;
        return 1;
    }
    if (!strcmp(o, "--disable-shared-experts-fusion")) {
        a->no_shared_fusion = 1;
        return 1;
    }
    if (!strcmp(o, "--threads")) {
        if (cli_parse_int(o, v, 1, 1024, &x)) return -1;
        a->threads = (int)x;
        (*i)++;
        return 1;
    }
    if (!strcmp(o, "--page-size")) {
        if (cli_parse_int(o, v, 1, 4096, &x)) return -1;
        a->page_size = (int)x;
        (*i)++;
        return 1;
    }
    return 0;
}

int cli_parse_ids(const char *s, int32_t **out) {
    int n = 0, cap = 16;
    int32_t *ids = xmalloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "kiln: --ids: expected comma-separated token ids, got '%s'\n", s);
            free(ids);
            return -1;
        }
        if (n == cap) ids = xrealloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "kiln: --ids: unexpected '%c' in '%s'\n", *p, s);
            free(ids);
            return -1;
        }
    }
    *out = ids;
    return n;
}
