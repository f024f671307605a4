/* cmd_bench.c — `kiln bench serving|offline`: options (bench_serving's
 * names; unambiguous prefixes accepted as argparse does), workload set-up,
 * warm-up, the measured run and the report.
 *
 * serving  sends the workload to a running server over HTTP (kiln, SGLang,
 *          vLLM, llama-server...).
 * offline  creates the engine in this process and submits the same
 *          workload directly: the engine's ceiling without HTTP.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "cli/bench.h"
#include "cli/bench_api.h"
#include "cli/bench_dataset.h"
#include "cli/bench_metrics.h"
#include "cli/bench_rng.h"
#include "cli/cli.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine.h"

enum opt_kind { OPT_INT, OPT_DOUBLE, OPT_STR, OPT_FLAG, OPT_U64, OPT_IDS };

struct opt_spec {
    const char *name;
    enum opt_kind kind;
    void *dst;
    double lo, hi;
};

/* Backend names: ours, and bench_serving's for the same protocols. */
static int parse_backend(const char *b, enum bench_api *api) {
    static const struct {
        const char *name;
        enum bench_api api;
    } names[] = {
        {"kiln", BENCH_API_GENERATE},        {"sglang", BENCH_API_GENERATE},
        {"sglang-native", BENCH_API_GENERATE}, {"openai", BENCH_API_OPENAI},
        {"sglang-oai", BENCH_API_OPENAI},    {"vllm", BENCH_API_OPENAI},
        {"lmdeploy", BENCH_API_OPENAI},      {"openai-chat", BENCH_API_OPENAI_CHAT},
        {"sglang-oai-chat", BENCH_API_OPENAI_CHAT}, {"vllm-chat", BENCH_API_OPENAI_CHAT},
        {"lmdeploy-chat", BENCH_API_OPENAI_CHAT},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(b, names[i].name)) {
            *api = names[i].api;
            return 0;
        }
    return -1;
}

static int parse_dataset(const char *d, enum bench_dataset_kind *k) {
    if (!strcmp(d, "random")) *k = BENCH_DATASET_RANDOM;
    else if (!strcmp(d, "sharegpt")) *k = BENCH_DATASET_SHAREGPT;
    else if (!strcmp(d, "shared-prefix") || !strcmp(d, "generated-shared-prefix")) *k = BENCH_DATASET_SHARED_PREFIX;
    else if (!strcmp(d, "score")) *k = BENCH_DATASET_SCORE;
    else return -1;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln bench serving --base-url http://HOST:PORT [options]\n"
            "       kiln bench offline [--model DIR] [--load-format dummy] [options]\n"
            "\n"
            "target:   --base-url URL | --host H --port P   --backend kiln|openai|openai-chat\n"
            "          (also sglang, sglang-oai, sglang-oai-chat, vllm, vllm-chat)   --model NAME\n"
            "          --tokenizer DIR (default: the bundled model)\n"
            "          offline: --model DIR --device --load-format --threads --page-size\n"
            "                   --deterministic --mem-fraction-static F\n"
            "dataset:  --dataset-name random|sharegpt|shared-prefix|score   --num-prompts N (1000)\n"
            "          --random-input-len N (1024) --random-output-len N (1024) --random-range-ratio R (0)\n"
            "          --dataset-path FILE --sharegpt-output-len N --sharegpt-context-len N\n"
            "          --gsp-num-groups N (64) --gsp-prompts-per-group N (16) --gsp-system-prompt-len N (2048)\n"
            "          --gsp-question-len N (128) --gsp-output-len N (256)\n"
            "          --score-query-len N (128) --score-item-len N (32) --score-num-items N (8)\n"
            "          --score-label-token-ids 1,2,3 (default: the first 4 ordinary ids)\n"
            "traffic:  --request-rate R|inf (inf) --max-concurrency N --seed N (1) --warmup-requests N (1)\n"
            "          --timeout SECONDS (300, per request) --disable-stream --disable-ignore-eos\n"
            "          --extra-request-body JSON\n"
            "output:   --output-file FILE (append one JSON line) --output-details --disable-tqdm\n");
}

static int set_opt(const struct opt_spec *s, const char *v) {
    char *end;
    errno = 0;
    switch (s->kind) {
    case OPT_FLAG: *(int *)s->dst = 1; return 0;
    case OPT_STR: *(const char **)s->dst = v; return 0;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < s->lo || x > s->hi) break;
        *(int *)s->dst = (int)x;
        return 0;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end) break;
        *(uint64_t *)s->dst = x;
        return 0;
    }
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= s->lo && x <= s->hi)) break;
        *(double *)s->dst = x;
        return 0;
    }
    case OPT_IDS: return 0; /* handled by the caller */
    }
    fprintf(stderr, "kiln bench: %s: bad value '%s'\n", s->name, v);
    return -1;
}

/* Exact name, or the one option it is an unambiguous prefix of. */
static const struct opt_spec *find_opt(const struct opt_spec *t, size_t n, const char *arg) {
    const struct opt_spec *hit = NULL;
    size_t len = strlen(arg);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(t[i].name, arg)) return &t[i];
        if (!strncmp(t[i].name, arg, len)) {
            if (hit) return NULL;
            hit = &t[i];
        }
    }
    return hit;
}

static void options_default(struct bench_options *o) {
    memset(o, 0, sizeof *o);
    model_args_defaults(&o->engine);
    o->backend = "kiln";
    o->api = BENCH_API_GENERATE;
    o->dataset_name = "random";
    o->num_prompts = 1000;
    o->random_input_len = o->random_output_len = 1024;
    o->gsp_num_groups = 64;
    o->gsp_prompts_per_group = 16;
    o->gsp_system_prompt_len = 2048;
    o->gsp_question_len = 128;
    o->gsp_output_len = 256;
    o->score_query_len = 128;
    o->score_item_len = 32;
    o->score_num_items = 8;
    o->request_rate = INFINITY;
    o->seed = 1;
    o->warmup_requests = 1;
    o->timeout_s = 300;
}

/* Returns 0, or the exit code (2 usage error, -1 --help). */
static int parse_args(struct bench_options *o, int offline, int argc, char **argv) {
    const char *host = "127.0.0.1", *rate = NULL, *labels = NULL;
    int port = 30000, have_host = 0;
    const char *host_arg = NULL, *port_arg = NULL;
    const struct opt_spec t[] = {
        {"--base-url", OPT_STR, &o->base_url, 0, 0},
        {"--host", OPT_STR, &host_arg, 0, 0},
        {"--port", OPT_STR, &port_arg, 0, 0},
        {"--backend", OPT_STR, &o->backend, 0, 0},
        {"--model", OPT_STR, &o->model, 0, 0},
        {"--tokenizer", OPT_STR, &o->tokenizer, 0, 0},
        {"--dataset-name", OPT_STR, &o->dataset_name, 0, 0},
        {"--dataset-path", OPT_STR, &o->dataset_path, 0, 0},
        {"--num-prompts", OPT_INT, &o->num_prompts, 1, 1e8},
        {"--random-input-len", OPT_INT, &o->random_input_len, 1, 1e8},
        {"--random-output-len", OPT_INT, &o->random_output_len, 1, 1e8},
        {"--random-range-ratio", OPT_DOUBLE, &o->random_range_ratio, 0, 1},
        {"--sharegpt-output-len", OPT_INT, &o->sharegpt_output_len, 4, 1e8},
        {"--sharegpt-context-len", OPT_INT, &o->sharegpt_context_len, 1, 1e9},
        {"--gsp-num-groups", OPT_INT, &o->gsp_num_groups, 1, 1e6},
        {"--gsp-prompts-per-group", OPT_INT, &o->gsp_prompts_per_group, 1, 1e6},
        {"--gsp-system-prompt-len", OPT_INT, &o->gsp_system_prompt_len, 0, 1e8},
        {"--gsp-question-len", OPT_INT, &o->gsp_question_len, 0, 1e8},
        {"--gsp-output-len", OPT_INT, &o->gsp_output_len, 1, 1e8},
        {"--score-query-len", OPT_INT, &o->score_query_len, 0, 1e8},
        {"--score-item-len", OPT_INT, &o->score_item_len, 1, 1e8},
        {"--score-num-items", OPT_INT, &o->score_num_items, 1, 1e6},
        {"--score-label-token-ids", OPT_STR, &labels, 0, 0},
        {"--request-rate", OPT_STR, &rate, 0, 0},
        {"--max-concurrency", OPT_INT, &o->max_concurrency, 1, 1e7},
        {"--seed", OPT_U64, &o->seed, 0, 0},
        {"--warmup-requests", OPT_INT, &o->warmup_requests, 0, 1e6},
        {"--timeout", OPT_DOUBLE, &o->timeout_s, 0.001, 1e7},
        {"--mem-fraction-static", OPT_DOUBLE, &o->mem_fraction_static, 0.01, 1},
        {"--disable-stream", OPT_FLAG, &o->disable_stream, 0, 0},
        {"--disable-ignore-eos", OPT_FLAG, &o->disable_ignore_eos, 0, 0},
        {"--extra-request-body", OPT_STR, &o->extra_request_body, 0, 0},
        {"--output-file", OPT_STR, &o->output_file, 0, 0},
        {"--output-details", OPT_FLAG, &o->output_details, 0, 0},
        {"--disable-tqdm", OPT_FLAG, &o->disable_tqdm, 0, 0},
    };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return -1;
        }
        if (offline && strcmp(argv[i], "--model")) {
            int r = model_args_parse(&o->engine, argc, argv, &i);
            if (r < 0) return 2;
            if (r > 0) continue;
        }
        /* --opt=value as argparse allows */
        char name[64];
        const char *eq = strchr(argv[i], '='), *val = NULL;
        size_t nl = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
        if (nl >= sizeof name) nl = sizeof name - 1;
        memcpy(name, argv[i], nl);
        name[nl] = 0;
        const struct opt_spec *s = strncmp(name, "--", 2) ? NULL : find_opt(t, sizeof t / sizeof t[0], name);
        if (!s) {
            fprintf(stderr, "kiln bench: unknown or ambiguous option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (s->kind != OPT_FLAG) {
            val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val) {
                fprintf(stderr, "kiln bench: %s needs a value\n", s->name);
                return 2;
            }
        }
        if (set_opt(s, val)) return 2;
    }
    if (host_arg) {
        host = host_arg;
        have_host = 1;
    }
    if (port_arg) {
        long p;
        if (cli_parse_int("--port", port_arg, 1, 65535, &p)) return 2;
        port = (int)p;
        have_host = 1;
    }
    if (!o->base_url || have_host) {
        snprintf(o->url_buf, sizeof o->url_buf, "http://%s:%d", host, port);
        if (!o->base_url) o->base_url = o->url_buf;
    }
    if (rate) {
        if (!strcmp(rate, "inf") || !strcmp(rate, "Infinity")) {
            o->request_rate = INFINITY;
        } else {
            char *end;
            o->request_rate = strtod(rate, &end);
            if (end == rate || *end || !(o->request_rate > 0)) {
                fprintf(stderr, "kiln bench: --request-rate: expected a positive number or inf, got '%s'\n", rate);
                return 2;
            }
        }
    }
    if (parse_backend(o->backend, &o->api)) {
        fprintf(stderr, "kiln bench: --backend '%s': expected kiln, openai or openai-chat\n", o->backend);
        return 2;
    }
    if (parse_dataset(o->dataset_name, &o->dataset)) {
        fprintf(stderr, "kiln bench: --dataset-name '%s': expected random, sharegpt, shared-prefix or score\n",
                o->dataset_name);
        return 2;
    }
    if (o->dataset == BENCH_DATASET_SCORE) o->api = BENCH_API_SCORE;
    if (labels) {
        o->n_score_label_ids = cli_parse_ids(labels, &o->score_label_ids);
        if (o->n_score_label_ids <= 0) {
            fprintf(stderr, "kiln bench: --score-label-token-ids: expected ids like 1,2,3\n");
            return 2;
        }
    }
    if (offline) {
        o->engine.model_dir = o->model ? o->model : cli_default_model();
        if (!strcmp(o->backend, "kiln")) o->backend = "kiln-offline";
    }
    return 0;
}

/* Re-tokenizes every generated text and settles the count the metrics use. */
static int count_outputs(struct bench_run *run, const struct kiln_tokenizer *tok, struct kiln_error *err) {
    struct kiln_token_ids ids = {0};
    for (int i = 0; i < run->n; i++) {
        struct bench_result *r = &run->results[i];
        if (!r->success) continue;
        if (kiln_tokenizer_encode(tok, r->text ? r->text : "", r->text_len, 0, &ids, err)) {
            /* Text the tokenizer refuses (invalid UTF-8) still has a usage count. */
            bench_result_fail(r, "generated text could not be re-tokenized: %s", err->msg);
            continue;
        }
        r->retok_output_len = (int)ids.n;
        r->output_len = r->usage_output_len >= 0 ? r->usage_output_len : r->retok_output_len;
    }
    kiln_token_ids_free(&ids);
    return 0;
}

static void results_free(struct bench_result *r, int n) {
    if (!r) return;
    for (int i = 0; i < n; i++) bench_result_free(&r[i]);
    free(r);
}

/* One pass through the chosen runner. */
static int run_pass(struct bench_run *run, struct engine *e, struct kiln_error *err) {
    return e ? bench_offline_run(run, e, err) : bench_serving_run(run, err);
}

static int warmup(const struct bench_options *o, const struct bench_prompt *p0, const char *model, struct engine *e) {
    int n = o->warmup_requests;
    if (n <= 0) return 0;
    printf("Starting warmup with %d sequences...\n", n);
    fflush(stdout);
    int out = p0->output_len < 32 ? p0->output_len : 32;
    struct bench_prompt *ps = xcalloc((size_t)n, sizeof *ps);
    int *outs = xcalloc((size_t)n, sizeof *outs);
    double *arr = xcalloc((size_t)n, sizeof *arr);
    for (int i = 0; i < n; i++) {
        ps[i] = *p0; /* shallow: the prompt's buffers stay owned by the dataset */
        outs[i] = out;
    }
    struct bench_run run = {.opt = o, .prompts = ps, .output_lens = outs, .arrivals = arr, .n = n,
                            .model_name = model, .results = xcalloc((size_t)n, sizeof(struct bench_result))};
    struct kiln_error err = {0};
    int rc = run_pass(&run, e, &err), ok = 0;
    for (int i = 0; i < n; i++) ok += run.results[i].success;
    if (rc) {
        fprintf(stderr, "kiln bench: warmup: %s\n", err.msg);
    } else if (!ok) {
        fprintf(stderr, "kiln bench: warmup failed - check the benchmark arguments. Error: %s\n",
                run.results[0].error ? run.results[0].error : "?");
        rc = -1;
    } else {
        printf("Warmup completed with %d sequences. Starting main benchmark run...\n", n);
    }
    results_free(run.results, n);
    free(ps);
    free(outs);
    free(arr);
    return rc;
}

static int bench_main(int offline, int argc, char **argv) {
    struct bench_options o;
    options_default(&o);
    int rc = parse_args(&o, offline, argc, argv);
    if (rc) {
        free(o.score_label_ids);
        return rc < 0 ? 0 : rc;
    }
    struct kiln_error err = {0};
    struct kiln_tokenizer *tok = NULL;
    struct engine *eng = NULL;
    struct bench_prompt *ps = NULL;
    int n = 0, *outs = NULL;
    double *arrivals = NULL;
    char *model_name = NULL;
    struct bench_run run = {0};
    rc = 1;
    const char *tok_dir = o.tokenizer ? o.tokenizer : offline ? o.engine.model_dir : cli_default_model();
    if (kiln_tokenizer_load(&tok, tok_dir, &err)) {
        fprintf(stderr, "kiln bench: tokenizer %s: %s\n", tok_dir, err.msg);
        goto done;
    }
    if (o.dataset == BENCH_DATASET_SCORE && !o.score_label_ids) {
        o.score_label_ids = xmalloc(4 * sizeof *o.score_label_ids);
        o.n_score_label_ids = bench_default_label_ids(tok, o.score_label_ids, 4);
    }
    struct bench_rng rng;
    bench_rng_init(&rng, o.seed);
    if (bench_dataset_build(&o, tok, &rng, &ps, &n, &err)) {
        fprintf(stderr, "kiln bench: dataset %s: %s\n", o.dataset_name, err.msg);
        goto done;
    }
    long tin = 0, tout = 0;
    outs = xmalloc((size_t)n * sizeof *outs);
    arrivals = xmalloc((size_t)n * sizeof *arrivals);
    double t = 0;
    for (int i = 0; i < n; i++) {
        tin += ps[i].prompt_len;
        tout += ps[i].output_len;
        outs[i] = ps[i].output_len;
        /* Poisson arrivals: the first request goes at 0, each next one an
         * exponential gap later (bench_serving's get_request). */
        arrivals[i] = t;
        if (!isinf(o.request_rate)) t += bench_rng_exponential(&rng, o.request_rate);
    }
    printf("#Input tokens: %ld\n#Output tokens: %ld\n", tin, tout);
    if (offline) {
        struct engine_options eo;
        engine_options_default(&eo);
        eo.model_dir = o.engine.model_dir;
        eo.device = o.engine.device;
        eo.load_format = o.engine.load_format;
        eo.threads = o.engine.threads;
        eo.deterministic = o.engine.deterministic;
        eo.page_size = o.engine.page_size;
        eo.mem_fraction_static = o.mem_fraction_static;
        if (engine_create(&eng, &eo, &err)) {
            fprintf(stderr, "kiln bench: engine: %s\n", err.msg);
            goto done;
        }
    } else if (o.model) {
        model_name = xstrdup(o.model);
    } else if (o.api != BENCH_API_GENERATE) {
        model_name = bench_serving_model_name(&o, &err);
        if (!model_name) {
            fprintf(stderr, "kiln bench: %s; pass --model NAME\n", err.msg);
            goto done;
        }
    } else {
        model_name = xstrdup("default");
    }
    if (warmup(&o, &ps[0], model_name, eng)) goto done;
    run = (struct bench_run){.opt = &o, .prompts = ps, .output_lens = outs, .arrivals = arrivals, .n = n,
                             .max_concurrency = o.max_concurrency, .show_progress = !o.disable_tqdm,
                             .model_name = model_name,
                             .results = xcalloc((size_t)n, sizeof(struct bench_result))};
    if (run_pass(&run, eng, &err)) {
        fprintf(stderr, "kiln bench: %s\n", err.msg);
        goto done;
    }
    count_outputs(&run, tok, &err);
    struct bench_metrics m;
    bench_metrics_compute(&m, &run);
    bench_metrics_print(stdout, &m, &run);
    fflush(stdout);
    if (o.output_file && bench_metrics_write_json(o.output_file, &m, &run, &err)) {
        fprintf(stderr, "kiln bench: %s\n", err.msg);
        goto done;
    }
    /* A run where nothing succeeded measured nothing: say so in the code. */
    rc = m.completed > 0 ? 0 : 1;
done:
    if (eng) engine_destroy(eng);
    results_free(run.results, run.n);
    bench_prompts_free(ps, n);
    free(outs);
    free(arrivals);
    free(model_name);
    free(o.score_label_ids);
    kiln_tokenizer_free(tok);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "serving")) return bench_main(0, argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "offline")) return bench_main(1, argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    return 2;
}
