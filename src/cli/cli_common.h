/* cli_common.h — option parsing and model set-up shared by subcommands. */
#ifndef KILN_CLI_COMMON_H
#define KILN_CLI_COMMON_H

#include <stdint.h>

#include "tensor/backend.h"

struct model;
struct kiln_error;

/* Options every model-running command accepts. */
struct model_args {
    const char *model_dir;   /* --model DIR (default: the bundled model) */
    const char *device;      /* --device cpu|cuda|auto */
    const char *load_format; /* --load-format auto|dummy */
    int threads;             /* --threads N */
    int page_size;           /* --page-size N */
    int deterministic;       /* --deterministic: batch-invariant results (GPU) */
    int no_shared_fusion;    /* --disable-shared-experts-fusion */
};

/* Default model folder: $KILN_MODEL, else models/stories260K of the source
 * tree this binary was built from, else ./models/stories260K. */
const char *cli_default_model(void);

/* Consumes argv[*i] (and its value) when it is one of the model options;
 * returns 1 if consumed, 0 if not, -1 on a bad value (message printed). */
int model_args_parse(struct model_args *a, int argc, char **argv, int *i);
void model_args_defaults(struct model_args *a);

/* Parses a positive int option value; prints an error naming the option. */
int cli_parse_int(const char *opt, const char *val, long lo, long hi, long *out);
/* Comma-separated token ids. Returns count or -1. Caller frees *out. */
int cli_parse_ids(const char *s, int32_t **out);

#endif
