/* cli_common.h — what the model-running subcommands share: the model
 * options (one table for serve, generate, verify and bench offline), and
 * finding the model folder: a path, or a Hugging Face id already in the
 * local Hugging Face cache (never downloaded). */
#ifndef KILN_CLI_COMMON_H
#define KILN_CLI_COMMON_H

#include <stdint.h>

#include "cli/options.h"
#include "tensor/backend.h"

/* Options every model-running command accepts. */
struct model_args {
    const char *model;       /* --model / --model-path / the positional MODEL, as given */
    const char *model_dir;   /* the folder (or config.json) to load: set by model_args_finish */
    const char *hf_id;       /* the Hugging Face id `model` named, or NULL */
    const char *device;      /* --device cpu|cuda|auto */
    const char *load_format; /* --load-format auto|dummy */
    const char *quantization; /* --quantization fp8, or NULL (model_options.quantization) */
    int threads;             /* --threads N */
    int page_size;           /* --page-size N */
    const char *kv_cache_dtype; /* --kv-cache-dtype auto|fp8_e4m3 */
    int kv_fp8;              /* it is fp8_e4m3 (backend_options.kv_fp8): set by model_args_finish */
    int deterministic;       /* --deterministic: batch-invariant results (GPU) */
    int no_shared_fusion;    /* --disable-shared-experts-fusion */
    const char *dummy_routing_name; /* --dummy-routing model|uniform */
    int dummy_routing;       /* its enum model_routing: set by model_args_finish */
    /* the ranks (cli/cli_job.h, docs/distributed.md) */
    int tp;                  /* --tp / --tensor-parallel-size N (default 1) */
    int ep;                  /* --ep / --expert-parallel-size: 1 or tp */
    int dp;                  /* --dp / --data-parallel-size / --dp-size N (default 1): DP attention groups */
    int dp_attention;        /* --enable-dp-attention (required with --dp > 1) */
    int pp;                  /* --pp / --pipeline-parallel-size N (default 1): stages of tp ranks each */
    int nnodes, node_rank;   /* --nnodes M (1), --node-rank R (0) */
    const char *dist_init_addr; /* --dist-init-addr HOST:PORT, or NULL */
    double dist_timeout;     /* --dist-timeout S (default 300) */
    char *owned;             /* model_dir when it was built here */
};

#define MODEL_ARGS_MAX_OPTS 21

void model_args_defaults(struct model_args *a);
/* Writes the model options into out[MODEL_ARGS_MAX_OPTS] and returns how
 * many; with_model 0 leaves out --model (bench offline names the model its
 * own way). */
size_t model_args_options(struct model_args *a, int with_model, struct cli_opt *out);
/* After parsing: checks --dummy-routing, --quantization, --kv-cache-dtype and the ranks' layout (--tp,
 * --ep, --pp, --nnodes, --node-rank, --dist-init-addr) (exit 2), takes the positional
 * model (NULL: none), refuses a model given twice (exit 2), resolves it (exit 1 when it is neither a path nor
 * in the Hugging Face cache) and defaults to cli_default_model(). Returns
 * 0 or the exit code, after printing the reason as "kiln CMD: ...". */
int model_args_finish(struct model_args *a, const char *cmd, const char *positional);
void model_args_free(struct model_args *a);

/* Speculative decoding's options (serve, bench offline), SGLang's names:
 * --speculative-algorithm NGRAM, --speculative-num-draft-tokens N,
 * --speculative-ngram-min-match-window-size / -max-match-window-size. */
struct spec_args {
    const char *algorithm;
    int draft_tokens, min_window, max_window;
};
#define SPEC_ARGS_OPTS 4
/* Writes the options into out[SPEC_ARGS_OPTS]; returns how many. */
size_t spec_args_options(struct spec_args *a, struct cli_opt *out);
/* After parsing: the engine's spec_* fields (0 draft tokens without an
 * algorithm), or exit code 2 after printing why ("kiln CMD: ..."): an
 * algorithm other than NGRAM (a draft model kiln does not run), draft
 * options without one, windows the wrong way round. */
struct engine_options;
int spec_args_finish(const struct spec_args *a, const char *cmd, struct engine_options *eo);

/* Default model folder: $KILN_MODEL, else models/stories260K of the source
 * tree this binary was built from, else ./models/stories260K. */
const char *cli_default_model(void);

/* A model or tokenizer argument: an existing path is returned as is (in
 * *out, NULL in *owned); a Hugging Face id ("ORG/NAME" or "NAME") that is no
 * path is looked up in the local cache: $HF_HUB_CACHE, else $HF_HOME/hub,
 * HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or
 * ~/.cache/huggingface; the snapshot is the one refs/main names (or the
 * only one). *owned is the path to free. Returns 0, or -1 with the reason
 * in msg (naming the folders looked at); anything else that is no path is
 * returned as is, for the loader to report. */
int cli_resolve_model(const char *arg, const char **out, char **owned, int *is_hf_id, char *msg, size_t msg_size);

/* Parses an int option value; prints an error naming the option. */
int cli_parse_int(const char *opt, const char *val, long lo, long hi, long *out);
/* Comma-separated token ids. Returns count or -1. Caller frees *out. */
int cli_parse_ids(const char *s, int32_t **out);

#endif
