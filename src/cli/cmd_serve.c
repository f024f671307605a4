/* cmd_serve.c — `kiln serve`: an OpenAI-compatible HTTP server over the
 * engine (see src/server/server.h). Engine options have SGLang's names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "scheduler/engine.h"
#include "server/server.h"
#include "server/trace.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln serve [--model DIR] [options]\n"
            "\n"
            "  --model DIR                 model folder (default: the bundled model)\n"
            "  --host ADDR                 address to listen on (default 127.0.0.1)\n"
            "  --port N                    port (default 30000; 0 picks a free one)\n"
            "  --api-key KEY               require 'Authorization: Bearer KEY' (not on /health)\n"
            "  --served-model-name NAME    the model name clients use (default: folder name)\n"
            "  --chat-template FILE        Jinja chat template overriding the model's\n"
            "  --max-running-requests N    requests in one batch (default 256)\n"
            "  --max-queued-requests N     waiting requests before 429 (default unbounded)\n"
            "  --chunked-prefill-size N    prefill tokens per step (default 8192 GPU, 512 CPU)\n"
            "  --max-total-tokens N        KV cache size in tokens (default from memory)\n"
            "  --mem-fraction-static F     GPU: share of memory for weights + KV cache (default 0.88)\n"
            "  --context-length N          cap the model's context length\n"
            "  --page-size N               tokens per KV page (default 1)\n"
            "  --schedule-policy P         fcfs | lpm | priority (default fcfs)\n"
            "  --disable-radix-cache       no prefix caching\n"
            "  --skip-sampler-warmup       start faster\n"
            "  --skip-warmup               no GPU kernel/graph prewarm by bucket\n"
            "  --log-requests              log request bodies (prompts!)\n"
            "  --decode-log-interval N     a 'Decode batch' log line every N decode steps (default 40; 0: none)\n"
            "  --sampling-defaults model|openai  unset temperature/top_p/top_k/min_p/repetition_penalty\n"
            "                              from generation_config.json (model, default) or OpenAI's\n"
            "  --allowed-origins LIST      CORS: comma-separated origins, '*' any (default), '' none\n"
            "  --max-body-bytes N          larger request bodies get 413 (default 33554432)\n"
            "  --max-connections N         more connections get 503 (default 4096)\n"
            "  --idle-timeout SEC          close keep-alive connections idle this long (default 60)\n"
            "  --request-head-timeout SEC  408 unless a request's head is in this long after its first byte (default 30)\n"
            "  --request-body-timeout SEC  408 unless the body is in this long after the head (default 300)\n"
            "  --shutdown-timeout SEC      on SIGTERM, let requests finish this long (default 5)\n"
            "  --tokenizer-workers N       threads tokenizing prompts off the HTTP loop (default 1; 0: on it)\n"
            "  --tokenizer-inline-bytes N  bodies smaller than this tokenize on the loop (default 4096)\n"
            "  --enable-trace              OpenTelemetry spans of every request (OTLP/HTTP JSON)\n"
            "  --otlp-traces-endpoint URL  where they go (default http://127.0.0.1:4318/v1/traces;\n"
            "                              implies --enable-trace)\n"
            "  --otlp-export-interval MS   longest a span waits before it is sent (default 500)\n"
            "  --device auto|cpu|cuda       default auto: the GPU when one is found ($KILN_DEVICE)\n"
            "  --threads N --load-format auto|dummy\n"
            "  --deterministic             a request's results do not depend on the batch (GPU)\n"
            "  --disable-shared-experts-fusion  DeepSeek: keep the shared expert a separate MLP\n");
}

struct listening_info {
    struct engine_stats st;
    double t_start; /* when cmd_serve began */
};

static void on_listening(void *arg, const char *host, int port) {
    const struct listening_info *li = arg;
    const struct engine_stats *st = &li->st;
    int v6 = strchr(host, ':') != NULL;
    printf("kiln serve: KV cache %ld tokens (%ld pages of %d)\n", st->kv_pages_total * st->page_size,
           st->kv_pages_total, st->page_size);
    printf("kiln serve: listening on http://%s%s%s:%d (ready %.2f s after start)\n", v6 ? "[" : "",
           host, v6 ? "]" : "", port, time_now() - li->t_start);
    fflush(stdout);
}

int cmd_serve(int argc, char **argv) {
    struct listening_info li = {.t_start = time_now()};
    struct model_args ma;
    model_args_defaults(&ma);
    struct engine_options eo;
    engine_options_default(&eo);
    struct server_options so;
    server_options_default(&so);
    int enable_trace = 0;
    for (int i = 1; i < argc; i++) {
        int r = model_args_parse(&ma, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
#define INT_OPT(name, lo, hi, dst)                                                                                     \
    if (!strcmp(o, name)) {                                                                                            \
        if (cli_parse_int(name, v, lo, hi, &x)) return 2;                                                              \
        dst = x;                                                                                                       \
        i++;                                                                                                           \
        continue;                                                                                                      \
    }
#define STR_OPT(name, dst)                                                                                             \
    if (!strcmp(o, name)) {                                                                                            \
        if (!v) {                                                                                                      \
            fprintf(stderr, "kiln serve: %s needs a value\n", name);                                                   \
            return 2;                                                                                                  \
        }                                                                                                              \
        dst = v;                                                                                                       \
        i++;                                                                                                           \
        continue;                                                                                                      \
    }
        STR_OPT("--host", so.host)
        INT_OPT("--port", 0, 65535, so.port)
        STR_OPT("--api-key", so.api_key)
        STR_OPT("--served-model-name", so.served_model_name)
        STR_OPT("--chat-template", so.chat_template)
        STR_OPT("--otlp-traces-endpoint", so.otlp_traces_endpoint)
        STR_OPT("--allowed-origins", so.allowed_origins)
        INT_OPT("--decode-log-interval", 0, 1 << 30, eo.decode_log_interval)
        INT_OPT("--max-running-requests", 1, 1 << 16, eo.max_running_requests)
        INT_OPT("--max-queued-requests", 0, 1 << 30, eo.max_queued_requests)
        INT_OPT("--chunked-prefill-size", 1, 1 << 20, eo.chunked_prefill_size)
        INT_OPT("--max-total-tokens", 1, 2147483647L, eo.max_total_tokens)
        INT_OPT("--context-length", 1, 1 << 24, eo.context_length)
        INT_OPT("--max-body-bytes", 1024, 1L << 34, so.max_body_bytes)
        INT_OPT("--max-connections", 1, 1 << 20, so.max_connections)
        INT_OPT("--idle-timeout", 0, 86400, so.idle_timeout_s)
        INT_OPT("--request-head-timeout", 1, 86400, so.head_timeout_s)
        INT_OPT("--request-body-timeout", 1, 86400, so.body_timeout_s)
        INT_OPT("--shutdown-timeout", 0, 86400, so.shutdown_timeout_s)
        INT_OPT("--tokenizer-workers", 0, 64, so.tokenizer_workers)
        INT_OPT("--tokenizer-inline-bytes", 0, 1L << 34, so.tokenizer_inline_bytes)
        if (!strcmp(o, "--mem-fraction-static")) {
            char *end = NULL;
            double f = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(f > 0 && f <= 1)) {
                fprintf(stderr, "kiln serve: --mem-fraction-static: expected a number in (0, 1], got '%s'\n",
                        v ? v : "");
                return 2;
            }
            eo.mem_fraction_static = f;
            i++;
        } else if (!strcmp(o, "--sampling-defaults")) {
            if (v && !strcmp(v, "model")) eo.sampling_defaults = ENGINE_SAMPLING_DEFAULTS_MODEL;
            else if (v && !strcmp(v, "openai")) eo.sampling_defaults = ENGINE_SAMPLING_DEFAULTS_OPENAI;
            else {
                fprintf(stderr, "kiln serve: --sampling-defaults: expected model or openai\n");
                return 2;
            }
            i++;
        } else if (!strcmp(o, "--schedule-policy")) {
            if (v && !strcmp(v, "fcfs")) eo.policy = SCHEDULE_FCFS;
            else if (v && !strcmp(v, "lpm")) eo.policy = SCHEDULE_LPM;
            else if (v && !strcmp(v, "priority")) eo.policy = SCHEDULE_PRIORITY;
            else {
                fprintf(stderr, "kiln serve: --schedule-policy: expected fcfs, lpm or priority\n");
                return 2;
            }
            i++;
        } else if (!strcmp(o, "--disable-radix-cache")) {
            eo.disable_radix_cache = 1;
        } else if (!strcmp(o, "--skip-sampler-warmup")) {
            eo.skip_sampler_warmup = 1;
        } else if (!strcmp(o, "--skip-warmup")) {
            eo.skip_warmup = 1;
        } else if (!strcmp(o, "--enable-trace")) {
            enable_trace = 1;
        } else if (!strcmp(o, "--otlp-export-interval")) {
            char *end = NULL;
            long ms = v ? strtol(v, &end, 10) : 0;
            if (!v || end == v || *end || ms < 1 || ms > 600000) {
                fprintf(stderr, "kiln serve: --otlp-export-interval: expected milliseconds in 1..600000, got '%s'\n",
                        v ? v : "");
                return 2;
            }
            so.otlp_export_interval_s = (double)ms / 1000.0;
            i++;
        } else if (!strcmp(o, "--log-requests")) {
            eo.log_requests = so.log_requests = 1;
        } else if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kiln serve: unknown option '%s'\n", o);
            usage(stderr);
            return 2;
        }
#undef INT_OPT
#undef STR_OPT
    }
    if (enable_trace && !so.otlp_traces_endpoint) so.otlp_traces_endpoint = "http://127.0.0.1:4318/v1/traces";
    if (so.otlp_traces_endpoint) { /* before a model that may take minutes to load */
        struct kiln_error terr;
        if (tracer_endpoint_check(so.otlp_traces_endpoint, &terr)) {
            fprintf(stderr, "kiln serve: %s\n", terr.msg);
            return 2;
        }
    }
    if (!ma.model_dir) ma.model_dir = cli_default_model();
    eo.model_dir = so.model_dir = ma.model_dir;
    so.max_queued_requests = eo.max_queued_requests;
    eo.device = ma.device;
    eo.load_format = ma.load_format;
    eo.threads = ma.threads;
    eo.deterministic = ma.deterministic;
    eo.no_shared_expert_fusion = ma.no_shared_fusion;
    eo.page_size = ma.page_size;

    struct kiln_error err = {0};
    struct engine *e = NULL;
    if (engine_create(&e, &eo, &err)) {
        fprintf(stderr, "kiln serve: %s\n", err.msg);
        return 1;
    }
    struct engine_stats *st = &li.st;
    engine_stats(e, st);
    printf("kiln serve: model %s (%s), context %d tokens, vocabulary %d%s\n", ma.model_dir,
           so.served_model_name ? so.served_model_name : engine_model_name(e), engine_context_length(e),
           engine_vocab_size(e), engine_tokenizer(e) ? "" : ", no tokenizer");
    so.on_listening = on_listening;
    so.on_listening_arg = &li;
    if (server_run(e, &so, &err)) { /* destroys the engine */
        fprintf(stderr, "kiln serve: %s\n", err.msg);
        return 1;
    }
    return 0;
}
