/* cmd_serve.c — `kiln serve`: an OpenAI-compatible HTTP server over the
 * engine (see src/server/server.h). Options have SGLang's names. What can
 * be checked without the model (options, the chat template file, the
 * tracing endpoint, the listening socket) is checked before it loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_parser.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "cli/cli_job.h"
#include "cli/listen.h"
#include "scheduler/engine.h"
#include "server/server.h"
#include "server/trace.h"

struct listening_info {
    struct engine_stats st;
    double t_start; /* when cmd_serve began */
};

static void on_listening(void *arg, const char *host, int port) {
    const struct listening_info *li = arg;
    const struct engine_stats *st = &li->st;
    int v6 = strchr(host, ':') != NULL;
    if (st->kv_groups > 1)
        printf("kiln serve: KV cache %ld tokens (%ld pages of %d), %ld in each of %d DP attention groups\n",
               st->kv_pages_total * st->page_size, st->kv_pages_total, st->page_size,
               st->kv_pages_total / st->kv_groups * st->page_size, st->kv_groups);
    else
        printf("kiln serve: KV cache %ld tokens (%ld pages of %d)\n", st->kv_pages_total * st->page_size,
               st->kv_pages_total, st->page_size);
    printf("kiln serve: listening on http://%s%s%s:%d (ready %.2f s after start)\n", v6 ? "[" : "",
           host, v6 ? "]" : "", port, time_now() - li->t_start);
    fflush(stdout);
}

/* --otlp-export-interval: milliseconds on the command line, seconds inside. */
static int parse_interval_ms(void *dst, const char *name, const char *val) {
    long long ms;
    if (cli_parse_integer(name, val, 1, 600000, &ms)) return -1;
    *(double *)dst = (double)ms / 1000.0;
    return 0;
}

/* Fails fast on a template file that is missing or does not compile (it
 * would otherwise be found only after the model has loaded). */
static int check_chat_template(const char *path) {
    struct kiln_error err = {0};
    char *src = NULL;
    struct chat_template ct;
    int rc = file_read_all(path, &src, NULL, &err); /* its message names the file */
    if (rc) fprintf(stderr, "kiln serve: --chat-template: %s\n", err.msg);
    else if ((rc = chat_template_init(&ct, src, NULL, NULL, &err)) == 0) chat_template_free(&ct);
    else fprintf(stderr, "kiln serve: --chat-template %s: %s\n", path, err.msg);
    free(src);
    return rc;
}

int cmd_serve(int argc, char **argv) {
    struct listening_info li = {.t_start = time_now()};
    struct model_args ma;
    model_args_defaults(&ma);
    struct engine_options eo;
    engine_options_default(&eo);
    struct server_options so;
    server_options_default(&so);
    int enable_trace = 0, log_requests = 0, policy = (int)eo.policy, sdefaults = (int)eo.sampling_defaults;
    const struct cli_opt server_opts[] = {
        CLI_OPT_STR("--host", &so.host, "HOST", "name or address to listen on (default 127.0.0.1)"),
        CLI_OPT_INT("--port", &so.port, 0, 65535, "N", "port (default 30000; 0 picks a free one)"),
        CLI_OPT_STR("--api-key", &so.api_key, "KEY", "require 'Authorization: Bearer KEY' (not on /health)"),
        CLI_OPT_STR("--served-model-name", &so.served_model_name, "NAME",
                    "the model name clients use (default: the Hugging Face id, else the folder's name)"),
        CLI_OPT_STR("--chat-template", &so.chat_template, "FILE", "Jinja chat template overriding the model's"),
        CLI_OPT_STR("--tool-call-parser", &so.tool_call_parser, "NAME",
                    "return tool calls in this format: auto (from the chat template),\n"
                    "hermes, llama3_json, deepseek_v3, deepseek_v31, mistral (default: none)"),
        CLI_OPT_STR("--reasoning-parser", &so.reasoning_parser, "NAME",
                    "split <think> reasoning into reasoning_content: qwen3, deepseek_r1"),
        CLI_OPT_SIZE("--max-body-bytes", &so.max_body_bytes, 1024, 1LL << 34, "N",
                     "larger request bodies get 413 (default 33554432)"),
        CLI_OPT_INT("--max-connections", &so.max_connections, 1, 1 << 20, "N",
                    "more connections get 503 (default 4096)"),
        CLI_OPT_INT("--idle-timeout", &so.idle_timeout_s, 0, 86400, "SEC",
                    "close keep-alive connections idle this long (default 60)"),
        CLI_OPT_INT("--request-head-timeout", &so.head_timeout_s, 1, 86400, "SEC",
                    "408 unless a request's head is in this long after its first byte (default 30)"),
        CLI_OPT_INT("--request-body-timeout", &so.body_timeout_s, 1, 86400, "SEC",
                    "408 unless the body is in this long after the head (default 300)"),
        CLI_OPT_STR("--allowed-origins", &so.allowed_origins, "LIST",
                    "CORS: comma-separated origins, '*' any (default), '' none"),
        CLI_OPT_DOUBLE("--shutdown-timeout", &so.shutdown_timeout_s, 0, 86400, "SEC",
                       "on SIGTERM, let requests finish this long (default 5)"),
        CLI_OPT_INT("--tokenizer-workers", &so.tokenizer_workers, 0, 64, "N",
                    "threads tokenizing prompts off the HTTP loop (default 1; 0: on it)"),
        CLI_OPT_SIZE("--tokenizer-inline-bytes", &so.tokenizer_inline_bytes, 0, 1LL << 34, "N",
                     "bodies smaller than this tokenize on the loop (default 4096)"),
        CLI_OPT_FLAG("--log-requests", &log_requests, "log request bodies (prompts!)"),
        CLI_OPT_FLAG("--enable-trace", &enable_trace, "OpenTelemetry spans of every request (OTLP/HTTP JSON)"),
        CLI_OPT_STR("--otlp-traces-endpoint", &so.otlp_traces_endpoint, "URL",
                    "where they go (default http://127.0.0.1:4318/v1/traces;\nimplies --enable-trace)"),
        CLI_OPT_CALL("--otlp-export-interval", &so.otlp_export_interval_s, parse_interval_ms, "MS",
                     "longest a span waits before it is sent (default 500)"),
    };
    const struct cli_opt engine_opts[] = {
        CLI_OPT_INT("--max-running-requests", &eo.max_running_requests, 1, 1 << 16, "N",
                    "requests in one batch (default 256)"),
        CLI_OPT_INT("--max-queued-requests", &eo.max_queued_requests, 0, 1 << 30, "N",
                    "waiting requests before 429 (default unbounded)"),
        CLI_OPT_INT("--chunked-prefill-size", &eo.chunked_prefill_size, 1, 1 << 20, "N",
                    "prefill tokens per step (default 8192 GPU, 512 CPU)"),
        CLI_OPT_INT("--max-total-tokens", &eo.max_total_tokens, 1, 2147483647LL, "N",
                    "KV cache size in tokens (default from memory)"),
        CLI_OPT_DOUBLE("--mem-fraction-static", &eo.mem_fraction_static, 0.01, 1, "F",
                       "GPU: share of memory for weights + KV cache (default 0.88)"),
        CLI_OPT_DOUBLE("--swa-full-tokens-ratio", &eo.swa_full_tokens_ratio, 0.01, 1, "R",
                       "sliding + full layers (Gemma-3, gpt-oss): the sliding layers' KV\n"
                       "pool in tokens against the full layers' (default 0.8)"),
        CLI_OPT_FLAG("--disable-hybrid-swa-memory", &eo.disable_hybrid_swa,
                     "one KV pool for sliding and full layers (every position kept)"),
        CLI_OPT_INT("--context-length", &eo.context_length, 1, 1 << 24, "N", "cap the model's context length"),
        CLI_OPT_CHOICE("--schedule-policy", &policy, "fcfs|lpm|priority", "(default fcfs)"),
        CLI_OPT_FLAG("--disable-radix-cache", &eo.disable_radix_cache, "no prefix caching"),
        CLI_OPT_FLAG("--enable-hierarchical-cache", &eo.enable_hicache,
                     "keep the KV pages the prefix cache evicts in host memory and load\n"
                     "them back for later requests (one rank, no sliding windows)"),
        CLI_OPT_DOUBLE("--hicache-ratio", &eo.hicache_ratio, 0.01, 1e6, "R",
                       "the host cache's size against the device KV pool (default 2)"),
        CLI_OPT_DOUBLE("--hicache-size", &eo.hicache_size_gb, 0.001, 1e6, "GB",
                       "the host cache's size in GB (instead of --hicache-ratio)"),
        CLI_OPT_FLAG("--skip-sampler-warmup", &eo.skip_sampler_warmup, "start faster"),
        CLI_OPT_FLAG("--skip-warmup", &eo.skip_warmup, "no GPU kernel/graph prewarm by bucket"),
        CLI_OPT_INT("--decode-log-interval", &eo.decode_log_interval, 0, 1 << 30, "N",
                    "a 'Decode batch' log line every N decode steps (default 40; 0: none)"),
        CLI_OPT_CHOICE("--sampling-defaults", &sdefaults, "model|openai",
                       "unset temperature/top_p/top_k/min_p/repetition_penalty from\n"
                       "generation_config.json (model, default) or OpenAI's"),
    };
    struct cli_opt model_opts[MODEL_ARGS_MAX_OPTS], spec_opts[SPEC_ARGS_OPTS];
    struct spec_args spec = {0};
    const struct cli_group groups[] = {
        {"model", model_opts, model_args_options(&ma, 1, model_opts)},
        {"server", server_opts, sizeof server_opts / sizeof server_opts[0]},
        {"engine", engine_opts, sizeof engine_opts / sizeof engine_opts[0]},
        {"speculative decoding", spec_opts, spec_args_options(&spec, spec_opts)},
    };
    const struct cli_command cmd = {
        .name = "serve", .usage = "[MODEL] [options]",
        .about = "An OpenAI-compatible HTTP server (also SGLang's /generate). Options have SGLang's names;\n"
                 "--opt=value and unambiguous prefixes work. MODEL: a model folder, or a Hugging Face id\n"
                 "already in the local cache ($HF_HOME/hub; nothing is downloaded).",
        .groups = groups, .n_groups = sizeof groups / sizeof groups[0], .max_positional = 1};
    const char *positional[2];
    int n_pos, rc = cli_parse(&cmd, argc, argv, positional, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = spec_args_finish(&spec, "serve", &eo))) return rc;
    eo.policy = (enum schedule_policy)policy;
    eo.sampling_defaults = (enum engine_sampling_defaults)sdefaults;
    eo.log_requests = so.log_requests = log_requests;
    if (enable_trace && !so.otlp_traces_endpoint) so.otlp_traces_endpoint = "http://127.0.0.1:4318/v1/traces";
    /* everything that can be checked is, before a model that may take minutes to load */
    if (so.otlp_traces_endpoint) {
        struct kiln_error terr;
        if (tracer_endpoint_check(so.otlp_traces_endpoint, &terr)) {
            fprintf(stderr, "kiln serve: %s\n", terr.msg);
            return 2;
        }
    }
    if (so.chat_template && check_chat_template(so.chat_template)) return 2;
    enum tool_format tf;
    if (so.tool_call_parser && strcmp(so.tool_call_parser, "auto") && tool_format_from_name(so.tool_call_parser, &tf)) {
        fprintf(stderr, "kiln serve: --tool-call-parser %s: unknown; choose one of %s\n", so.tool_call_parser,
                tool_format_choices());
        return 2;
    }
    enum reasoning_format rf;
    if (so.reasoning_parser && reasoning_format_from_name(so.reasoning_parser, &rf)) {
        fprintf(stderr, "kiln serve: --reasoning-parser %s: unknown; choose one of %s\n", so.reasoning_parser,
                reasoning_format_choices());
        return 2;
    }
    if ((rc = model_args_finish(&ma, "serve", n_pos ? positional[0] : NULL))) return rc;
    /* ranks other than 0 follow rank 0's engine: no HTTP port of their own */
    struct cli_job job;
    if ((rc = cli_job_start(&job, &ma, "serve", NULL, argc, argv)) >= 0) {
        model_args_free(&ma);
        return rc;
    }
    if (!so.served_model_name && ma.hf_id) so.served_model_name = ma.hf_id;
    struct kiln_error err = {0};
    so.listen_fd = cli_listen(so.host, so.port, &err);
    if (so.listen_fd < 0) {
        fprintf(stderr, "kiln serve: %s\n", err.msg);
        model_args_free(&ma);
        return cli_job_end(&job, so.listen_fd == -1 ? 2 : 1);
    }
    char bare[256];
    if (so.host[0] == '[') { /* printed in a URL later, with brackets added once */
        snprintf(bare, sizeof bare, "%.*s", (int)strcspn(so.host + 1, "]"), so.host + 1);
        so.host = bare;
    }
    eo.model_dir = so.model_dir = ma.model_dir;
    so.max_queued_requests = eo.max_queued_requests;
    eo.device = ma.device;
    eo.load_format = ma.load_format;
    eo.quantization = ma.quantization;
    eo.threads = ma.threads;
    eo.deterministic = ma.deterministic;
    eo.kv_fp8 = ma.kv_fp8;
    eo.no_shared_expert_fusion = ma.no_shared_fusion;
    eo.dummy_routing = ma.dummy_routing;
    eo.page_size = ma.page_size;
    eo.device_index = job.device_index;
    eo.par = job.started ? &job.par : NULL;
    eo.ctrl = job.ctrl;

    struct engine *e = NULL;
    if (engine_create(&e, &eo, &err)) {
        fprintf(stderr, "kiln serve: %s\n", err.msg);
        close(so.listen_fd);
        model_args_free(&ma);
        return cli_job_end(&job, 1);
    }
    struct engine_stats *st = &li.st;
    engine_stats(e, st);
    printf("kiln serve: model %s (%s), context %d tokens, vocabulary %d%s\n", ma.model_dir,
           so.served_model_name ? so.served_model_name : engine_model_name(e), engine_context_length(e),
           engine_vocab_size(e), engine_tokenizer(e) ? "" : ", no tokenizer");
    so.on_listening = on_listening;
    so.on_listening_arg = &li;
    rc = 0;
    if (server_run(e, &so, &err)) { /* destroys the engine */
        fprintf(stderr, "kiln serve: %s\n", err.msg);
        rc = 1;
    }
    model_args_free(&ma);
    return cli_job_end(&job, rc);
}
