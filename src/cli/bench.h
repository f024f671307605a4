/* bench.h — `kiln bench serving|offline`: the load generator that measures a
 * server (or the engine directly) the way SGLang's bench_serving does.
 *
 * Flow: cmd_bench.c parses `struct bench_options`, loads the tokenizer,
 * builds the prompts (bench_dataset.h) and the arrival times (Poisson with
 * the seed), then hands a `struct bench_run` to one runner — HTTP
 * (bench_serving.c, one poll() loop, no thread per request) or in-process
 * (bench_offline.c, engine callbacks). Each runner fills one
 * `struct bench_result` per prompt; bench_metrics.h turns them into the
 * report block and the JSON line. Runners never drop a request: each
 * result ends either successful or with an error message.
 */
#ifndef KILN_CLI_BENCH_H
#define KILN_CLI_BENCH_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "base/buf.h"
#include "cli/cli_common.h"

struct kiln_error;
struct kiln_tokenizer;

/* Which HTTP API the requests go to. */
enum bench_api {
    BENCH_API_OPENAI = 0,  /* POST /v1/completions */
    BENCH_API_OPENAI_CHAT, /* POST /v1/chat/completions */
    BENCH_API_GENERATE,    /* POST /generate (SGLang native) */
    BENCH_API_SCORE,       /* POST /v1/score (the score dataset) */
};

enum bench_dataset_kind {
    BENCH_DATASET_RANDOM = 0,
    BENCH_DATASET_SHAREGPT,
    BENCH_DATASET_SHARED_PREFIX,
    BENCH_DATASET_SCORE,
};

struct bench_options {
    /* target */
    const char *base_url;     /* serving: http://host:port */
    char url_buf[300];        /* base_url made from --host/--port */
    const char *backend;      /* name as given (printed and written back) */
    enum bench_api api;
    const char *model;        /* "model" field; NULL = ask /v1/models */
    const char *tokenizer;    /* folder with tokenizer.json */
    char *tokenizer_owned;    /* tokenizer when it was found in the Hugging Face cache */
    struct model_args engine; /* offline: the engine's model options */
    struct spec_args spec;    /* offline: speculative decoding */
    double mem_fraction_static; /* offline: GPU memory plan (0 = the engine's default) */
    double swa_full_tokens_ratio; /* offline: engine_options */
    int disable_hybrid_swa;
    int max_total_tokens;     /* offline: the KV pool in tokens (0: from memory) */
    int enable_hicache;       /* offline: the prefix cache's host tier and its size */
    double hicache_ratio, hicache_size_gb;
    int moe_counts;           /* offline: count the experts each step touches (--moe-counts) */
    /* dataset */
    const char *dataset_name; /* as given */
    enum bench_dataset_kind dataset;
    const char *dataset_path;
    int num_prompts;
    int random_input_len, random_output_len;
    double random_range_ratio;
    int sharegpt_output_len;  /* 0 = from the completion */
    int sharegpt_context_len; /* 0 = no limit */
    int gsp_num_groups, gsp_prompts_per_group;
    int gsp_system_prompt_len, gsp_question_len, gsp_output_len;
    int score_query_len, score_item_len, score_num_items;
    int32_t *score_label_ids; /* owned; NULL = the first few ordinary ids */
    int n_score_label_ids;
    /* traffic */
    double request_rate;      /* requests/s; INFINITY = all at once */
    int max_concurrency;      /* 0 = not set */
    uint64_t seed;
    int warmup_requests;
    double timeout_s;         /* per request */
    int disable_stream;
    int disable_ignore_eos;
    const char *extra_request_body; /* JSON object merged into each payload */
    /* output */
    const char *output_file;
    int output_details;
    int disable_tqdm;
};

/* One prompt of the workload. `ids` is the exact tokenization (what the
 * offline runner submits and what `prompt_len` counts); `text` is what goes
 * over HTTP. Score prompts also carry items, each scored after the query. */
struct bench_prompt {
    char *text;
    int32_t *ids;
    int n_ids;
    int prompt_len; /* tokens the server processes for this request */
    int output_len; /* max new tokens asked for */
    int n_items;
    char **items;
    int32_t **item_ids;
    int *item_lens;
};

/* What one request measured. Times are seconds; `start` is absolute
 * (time_now()), the others relative to it. */
struct bench_result {
    int success;
    char *error;          /* malloc'd when !success */
    double start;
    double ttft;          /* first chunk with content */
    double latency;       /* last chunk (or the whole body) */
    double *itl;          /* gaps between content chunks */
    int n_itl, cap_itl;
    struct buf text;      /* generated text */
    int prompt_len;
    int usage_output_len; /* completion_tokens from the server/engine, -1 if none */
    int usage_prompt_len; /* prompt_tokens from the server/engine, -1 if none */
    int retok_output_len; /* re-tokenized generated text (set after the run) */
    int output_len;       /* what the metrics count: usage if known, else retok */
    int gen_tokens_seen;  /* /generate: completion_tokens at the last chunk */
};

void bench_result_free(struct bench_result *r);
void bench_result_add_itl(struct bench_result *r, double gap);
/* Marks the request failed (keeps the first message). */
void bench_result_fail(struct bench_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One benchmark pass (warm-up or measured) handed to a runner. */
struct bench_run {
    const struct bench_options *opt;
    const struct bench_prompt *prompts; /* [n] */
    const int *output_lens;             /* [n]: max new tokens per request */
    const double *arrivals;             /* [n]: seconds after the start */
    int n;
    int max_concurrency;                /* 0 = unbounded */
    int show_progress;
    const char *model_name;             /* "model" field for HTTP */
    struct bench_result *results;       /* [n], zeroed by the caller */
    double duration;                    /* out: first dispatch to last completion */
};

struct engine;

/* HTTP runner: 0 when every request ended (successful or not), -1 when the
 * run could not start at all (bad URL, no sockets). */
int bench_serving_run(struct bench_run *run, struct kiln_error *err);
/* Asks GET base_url/v1/models for the first model id; malloc'd or NULL. */
char *bench_serving_model_name(const struct bench_options *opt, struct kiln_error *err);
/* In-process runner over an engine created by the caller. */
int bench_offline_run(struct bench_run *run, struct engine *e, struct kiln_error *err);
/* --moe-counts: the engine's touched-expert counts since the last reset,
 * per MoE layer and in total (model_moe_report). */
void bench_offline_moe_report(struct engine *e, FILE *out);

/* Progress on stderr when it is a terminal: "[####    ] 12/100". */
struct bench_progress {
    int enabled;
    int total;
    double last_draw;
};
void bench_progress_init(struct bench_progress *p, int total, int enabled);
void bench_progress_update(struct bench_progress *p, int done, int force);
void bench_progress_end(struct bench_progress *p);

#endif
