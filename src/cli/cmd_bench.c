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
#include "cli/cli_job.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine.h"

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

/* The command's table; offline adds the engine's options. */
static int parse_table(struct bench_options *o, int offline, int argc, char **argv, const char **host_arg,
                       const char **port_arg, const char **rate, const char **labels) {
    const struct cli_opt target[] = {
        CLI_OPT_STR("--base-url", &o->base_url, "URL", "serving: the server (default http://127.0.0.1:30000)"),
        CLI_OPT_STR("--host", host_arg, "HOST", "serving: the server's host, with --port P"),
        CLI_OPT_STR("--port", port_arg, "P", "serving: the server's port"),
        CLI_OPT_STR("--backend", &o->backend, "NAME",
                    "kiln|openai|openai-chat (also sglang, sglang-oai, sglang-oai-chat, vllm,\n"
                    "vllm-chat, lmdeploy, lmdeploy-chat; default kiln)"),
        CLI_OPT_STR("--model", &o->model, "NAME",
                    "serving: the request's model (default: /v1/models asked);\n"
                    "offline: the model folder or Hugging Face id (default: the bundled model)"),
        CLI_OPT_STR("--tokenizer", &o->tokenizer, "DIR", "tokenizer folder (default: the model's)"),
    };
    const struct cli_opt dataset[] = {
        CLI_OPT_STR("--dataset-name", &o->dataset_name, "random|sharegpt|shared-prefix|score", "(default random)"),
        CLI_OPT_STR("--dataset-path", &o->dataset_path, "FILE", "ShareGPT JSON"),
        CLI_OPT_INT("--num-prompts", &o->num_prompts, 1, 1e8, "N", "(default 1000)"),
        CLI_OPT_INT("--random-input-len", &o->random_input_len, 1, 1e8, "N", "(default 1024)"),
        CLI_OPT_INT("--random-output-len", &o->random_output_len, 1, 1e8, "N", "(default 1024)"),
        CLI_OPT_DOUBLE("--random-range-ratio", &o->random_range_ratio, 0, 1, "R", "(default 0)"),
        CLI_OPT_INT("--sharegpt-output-len", &o->sharegpt_output_len, 4, 1e8, "N", "(default: the completion's)"),
        CLI_OPT_INT("--sharegpt-context-len", &o->sharegpt_context_len, 1, 1e9, "N", "(default: no limit)"),
        CLI_OPT_INT("--gsp-num-groups", &o->gsp_num_groups, 1, 1e6, "N", "(default 64)"),
        CLI_OPT_INT("--gsp-prompts-per-group", &o->gsp_prompts_per_group, 1, 1e6, "N", "(default 16)"),
        CLI_OPT_INT("--gsp-system-prompt-len", &o->gsp_system_prompt_len, 0, 1e8, "N", "(default 2048)"),
        CLI_OPT_INT("--gsp-question-len", &o->gsp_question_len, 0, 1e8, "N", "(default 128)"),
        CLI_OPT_INT("--gsp-output-len", &o->gsp_output_len, 1, 1e8, "N", "(default 256)"),
        CLI_OPT_INT("--score-query-len", &o->score_query_len, 0, 1e8, "N", "(default 128)"),
        CLI_OPT_INT("--score-item-len", &o->score_item_len, 1, 1e8, "N", "(default 32)"),
        CLI_OPT_INT("--score-num-items", &o->score_num_items, 1, 1e6, "N", "(default 8)"),
        CLI_OPT_STR("--score-label-token-ids", labels, "1,2,3", "(default: the first 4 ordinary ids)"),
    };
    const struct cli_opt traffic[] = {
        CLI_OPT_STR("--request-rate", rate, "R|inf", "requests per second, Poisson arrivals (default inf)"),
        CLI_OPT_INT("--max-concurrency", &o->max_concurrency, 1, 1e7, "N", "requests in flight at most"),
        CLI_OPT_U64("--seed", &o->seed, "N", "(default 1)"),
        CLI_OPT_INT("--warmup-requests", &o->warmup_requests, 0, 1e6, "N", "(default 1)"),
        CLI_OPT_DOUBLE("--timeout", &o->timeout_s, 0.001, 1e7, "SECONDS", "per request (default 300)"),
        CLI_OPT_FLAG("--disable-stream", &o->disable_stream, "one JSON answer per request"),
        CLI_OPT_FLAG("--disable-ignore-eos", &o->disable_ignore_eos, "stop at end-of-sequence tokens"),
        CLI_OPT_STR("--extra-request-body", &o->extra_request_body, "JSON", "merged into each request"),
    };
    const struct cli_opt output[] = {
        CLI_OPT_STR("--output-file", &o->output_file, "FILE", "append one JSON line"),
        CLI_OPT_FLAG("--output-details", &o->output_details, "per-request figures in that line"),
        CLI_OPT_FLAG("--disable-tqdm", &o->disable_tqdm, "no progress bar"),
    };
    const struct cli_opt mem[] = {
        CLI_OPT_DOUBLE("--mem-fraction-static", &o->mem_fraction_static, 0.01, 1, "F",
                       "GPU: share of memory for weights + KV cache"),
        CLI_OPT_DOUBLE("--swa-full-tokens-ratio", &o->swa_full_tokens_ratio, 0.01, 1, "R",
                       "sliding + full layers: the sliding layers' KV pool against the\nfull layers' (default 0.8)"),
        CLI_OPT_FLAG("--disable-hybrid-swa-memory", &o->disable_hybrid_swa, "one KV pool for every layer"),
        CLI_OPT_INT("--max-total-tokens", &o->max_total_tokens, 1, 2147483647LL, "N",
                    "KV cache size in tokens (default from memory)"),
        CLI_OPT_FLAG("--enable-hierarchical-cache", &o->enable_hicache,
                     "keep the KV pages the prefix cache evicts in host memory (kiln serve's)"),
        CLI_OPT_DOUBLE("--hicache-ratio", &o->hicache_ratio, 0.01, 1e6, "R",
                       "the host cache against the device KV pool (default 2)"),
        CLI_OPT_DOUBLE("--hicache-size", &o->hicache_size_gb, 0.001, 1e6, "GB", "the host cache in GB"),
        CLI_OPT_FLAG("--moe-counts", &o->moe_counts,
                     "MoE: count the experts each step touches and the bytes they hold\n"
                     "(adds a little work to every route: take speed figures without it)"),
    };
    struct cli_opt engine[MODEL_ARGS_MAX_OPTS], spec[SPEC_ARGS_OPTS];
    const struct cli_group groups[] = {
        {"target", target, sizeof target / sizeof target[0]},
        {"dataset", dataset, sizeof dataset / sizeof dataset[0]},
        {"traffic", traffic, sizeof traffic / sizeof traffic[0]},
        {"output", output, sizeof output / sizeof output[0]},
        {"offline: the engine", engine, model_args_options(&o->engine, 0, engine)},
        {NULL, mem, sizeof mem / sizeof mem[0]},
        {NULL, spec, spec_args_options(&o->spec, spec)},
    };
    const struct cli_command cmd = {
        .name = "bench", .usage = "serving --base-url http://HOST:PORT [options]\n"
                                  "       kiln bench offline [--model DIR] [options]",
        .about = "serving sends the workload to a running server over HTTP (kiln, SGLang, vLLM, ...);\n"
                 "offline creates the engine in this process and submits the same workload directly.\n"
                 "Options have bench_serving's names; --opt=value and unambiguous prefixes work.",
        .groups = groups, .n_groups = sizeof groups / sizeof groups[0] - (offline ? 0 : 3), .max_positional = 0};
    int n_pos;
    return cli_parse(&cmd, argc, argv, NULL, &n_pos);
}

/* Returns 0, or the exit code (2 usage error, -1 --help). */
static int parse_args(struct bench_options *o, int offline, int argc, char **argv) {
    const char *host = "127.0.0.1", *rate = NULL, *labels = NULL;
    int port = 30000, have_host = 0;
    const char *host_arg = NULL, *port_arg = NULL;
    int rc = parse_table(o, offline, argc, argv, &host_arg, &port_arg, &rate, &labels);
    if (rc) return rc == 1 ? -1 : rc;
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
    if (o->tokenizer) {
        char msg[1024];
        int is_id;
        if (cli_resolve_model(o->tokenizer, &o->tokenizer, &o->tokenizer_owned, &is_id, msg, sizeof msg)) {
            fprintf(stderr, "kiln bench: --tokenizer: %s\n", msg);
            return 1;
        }
    }
    if (offline) {
        o->engine.model = o->model;
        struct engine_options check = {0};
        if ((rc = spec_args_finish(&o->spec, "bench", &check))) return rc;
        if ((rc = model_args_finish(&o->engine, "bench", NULL))) return rc;
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
        if (kiln_tokenizer_encode(tok, r->text.data ? r->text.data : "", r->text.len, 0, &ids, err)) {
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
    int rc = parse_args(&o, offline, argc, argv), follower = -1;
    struct cli_job job;
    memset(&job, 0, sizeof job);
    /* offline: ranks other than 0 follow rank 0's engine and print nothing */
    if (rc == 0 && offline) follower = cli_job_start(&job, &o.engine, "bench", "bench", argc, argv);
    if (rc || follower >= 0) {
        free(o.score_label_ids);
        model_args_free(&o.engine);
        free(o.tokenizer_owned);
        return rc ? (rc < 0 ? 0 : rc) : follower;
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
        eo.quantization = o.engine.quantization;
        eo.threads = o.engine.threads;
        eo.deterministic = o.engine.deterministic;
        eo.kv_fp8 = o.engine.kv_fp8;
        eo.page_size = o.engine.page_size;
        eo.no_shared_expert_fusion = o.engine.no_shared_fusion;
        eo.dummy_routing = o.engine.dummy_routing;
        eo.moe_count = o.moe_counts;
        eo.mem_fraction_static = o.mem_fraction_static;
        KILN_ASSERT(spec_args_finish(&o.spec, "bench", &eo) == 0); /* checked when parsed */
        eo.swa_full_tokens_ratio = o.swa_full_tokens_ratio;
        eo.disable_hybrid_swa = o.disable_hybrid_swa;
        eo.max_total_tokens = o.max_total_tokens;
        eo.enable_hicache = o.enable_hicache;
        eo.hicache_ratio = o.hicache_ratio;
        eo.hicache_size_gb = o.hicache_size_gb;
        eo.device_index = job.device_index;
        eo.par = job.started ? &job.par : NULL;
        eo.ctrl = job.ctrl;
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
    if (eng && o.moe_counts) engine_moe_counts(eng, NULL, 0, 1); /* the measured run only */
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
    if (eng && o.moe_counts) bench_offline_moe_report(eng, stdout);
    if (eng) { /* the prefix cache's part, counted by the engine */
        struct engine_stats st;
        engine_stats(eng, &st);
        printf("Prompt tokens from the prefix cache: %ld of %ld", st.cached_tokens_total, st.prompt_tokens_total);
        if (st.hicache_pages_total > 0)
            printf(" (%ld loaded back from host memory, %ld pages stored there)", st.hicache_loaded_tokens_total,
                   st.hicache_saved_pages_total);
        printf("\n");
    }
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
    model_args_free(&o.engine);
    free(o.tokenizer_owned);
    kiln_tokenizer_free(tok);
    return cli_job_end(&job, rc);
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "serving")) return bench_main(0, argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "offline")) return bench_main(1, argc - 1, argv + 1);
    char *help[] = {"bench", "--help"};
    int help_asked = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (!help_asked) fprintf(stderr, "kiln bench: expected 'serving' or 'offline'%s%s%s\n", argc >= 2 ? ", got '" : "",
                             argc >= 2 ? argv[1] : "", argc >= 2 ? "'" : "");
    else bench_main(1, 2, help); /* the usage of both, the engine's options included */
    return help_asked ? 0 : 2;
}
