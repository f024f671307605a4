#include "cli/cli_common.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/knob.h"
#include "base/mem.h"
#include "dist/net.h"
#include "dist/wire.h"
#include "model/model.h"
#include "scheduler/engine.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

const char *cli_default_model(void) {
    const char *e = knob_str(KNOB_MODEL);
    if (*e) return e;
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
    memset(a, 0, sizeof *a);
    a->device = backend_default_name();
    a->load_format = "auto";
    a->page_size = 1;
    a->kv_cache_dtype = "auto";
    a->dummy_routing_name = "model";
    a->tp = a->ep = a->dp = a->pp = a->nnodes = 1;
    a->dist_timeout = 300;
}

size_t model_args_options(struct model_args *a, int with_model, struct cli_opt *out) {
    const struct cli_opt model = {.name = "--model", .alias = "--model-path", .type = CLI_STR, .dst = &a->model,
                                  .meta = "MODEL",
                                  .help = "model folder, or a Hugging Face id in the local cache (ORG/NAME);\n"
                                          "also the first positional argument (default: the bundled model)"};
    const struct cli_opt t[] = {
        CLI_OPT_STR("--device", &a->device, "auto|cpu|cuda", "default auto: the GPU when one is found ($KILN_DEVICE)"),
        CLI_OPT_STR("--load-format", &a->load_format, "auto|dummy", "dummy: random weights, no safetensors read"),
        CLI_OPT_STR("--quantization", &a->quantization, "fp8",
                    "fp8: attention and MLP projections become FP8 (e4m3, 128x128 block\n"
                    "scales) at load, dummy weights too; FP8 checkpoints load as FP8\n"
                    "without it (CPU only for now)"),
        CLI_OPT_INT("--threads", &a->threads, 1, 1024, "N",
                    "CPU threads (default: the cores, shared by this node's ranks)"),
        CLI_OPT_INT("--page-size", &a->page_size, 1, 4096, "N", "tokens per KV page (default 1)"),
        CLI_OPT_STR("--kv-cache-dtype", &a->kv_cache_dtype, "auto|fp8_e4m3",
                    "KV cache elements: auto (default) fp32 on the CPU, bf16 on CUDA;\n"
                    "fp8_e4m3 with a scale per layer for K and V (CPU only for now)"),
        CLI_OPT_FLAG("--deterministic", &a->deterministic, "a request's results do not depend on the batch (GPU)"),
        CLI_OPT_FLAG("--disable-shared-experts-fusion", &a->no_shared_fusion,
                     "DeepSeek: keep the shared expert a separate MLP"),
        CLI_OPT_STR("--dummy-routing", &a->dummy_routing_name, "model|uniform",
                    "MoE benchmarks: uniform routes each token to uniformly random\n"
                    "experts (outputs meaningless; default model: the router)"),
        {.name = "--tp", .alias = "--tensor-parallel-size", .type = CLI_INT, .dst = CLI_DST(int *, &a->tp), .lo = 1,
         .hi = 4096, .meta = "N",
         .help = "ranks (one process each) the model is split over (default 1); this\n"
                 "process is rank 0 and starts this node's others"},
        {.name = "--ep", .alias = "--expert-parallel-size", .type = CLI_INT, .dst = CLI_DST(int *, &a->ep), .lo = 1,
         .hi = 4096, .meta = "N",
         .help = "MoE: 1 (default) splits every expert over the --tp ranks; equal to\n"
                 "--tp, the experts go whole to the ranks of the same group"},
        {.name = "--dp", .alias = "--data-parallel-size", .type = CLI_INT, .dst = CLI_DST(int *, &a->dp), .lo = 1,
         .hi = 4096, .meta = "N",
         .help = "with --enable-dp-attention: N data parallel attention groups of\n"
                 "--tp / N ranks, each with its own sequences and KV (default 1)"},
        {.name = "--dp-size", .type = CLI_INT, .dst = CLI_DST(int *, &a->dp), .lo = 1, .hi = 4096, .meta = "N",
         .help = "the same as --dp"},
        CLI_OPT_FLAG("--enable-dp-attention", &a->dp_attention,
                     "MLA models (DeepSeek-V2/V3): attention data parallel over the --dp\n"
                     "groups, the MLPs split over all --tp ranks"),
        {.name = "--pp", .alias = "--pipeline-parallel-size", .type = CLI_INT, .dst = CLI_DST(int *, &a->pp),
         .lo = 1, .hi = 4096, .meta = "N",
         .help = "pipeline stages the layers are split over (default 1), each of --tp\n"
                 "ranks: --tp x --pp ranks in all"},
        CLI_OPT_INT("--nnodes", &a->nnodes, 1, 4096, "M",
                    "machines the --tp x --pp ranks span, as many on each (default 1); run\n"
                    "kiln with the same options on each, its own --node-rank"),
        CLI_OPT_INT("--node-rank", &a->node_rank, 0, 4095, "R", "this machine's index (default 0: holds rank 0)"),
        CLI_OPT_STR("--dist-init-addr", &a->dist_init_addr, "HOST:PORT",
                    "where rank 0 meets the other ranks: node 0's address (required with\n"
                    "--nnodes > 1; one node: default 127.0.0.1 and a free port)"),
        CLI_OPT_DOUBLE("--dist-timeout", &a->dist_timeout, 1, 1e6, "S",
                       "seconds the ranks' start-up, or a collective, waits for a rank\n"
                       "(default 300; a rank that dies ends the job at once)"),
    };
    size_t n = 0;
    if (with_model) out[n++] = model;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) out[n++] = t[i];
    KILN_ASSERT(n <= MODEL_ARGS_MAX_OPTS);
    return n;
}

/* Pipeline parallel: tp x pp ranks, as many on every node, and no stage's
 * tensor parallel group cut by a node's edge (each node holds whole stages,
 * or each stage whole nodes). */
static int model_args_check_pp(const struct model_args *a, const char *cmd) {
    long world = (long)a->tp * a->pp;
    if (world > 4096) {
        fprintf(stderr, "kiln %s: --tp %d x --pp %d: %ld ranks, more than 4096\n", cmd, a->tp, a->pp, world);
        return -1;
    }
    if (world % a->nnodes) {
        fprintf(stderr, "kiln %s: --tp %d x --pp %d = %ld ranks is not divisible by --nnodes %d (every node runs "
                        "as many ranks)\n", cmd, a->tp, a->pp, world, a->nnodes);
        return -1;
    }
    long local = world / a->nnodes;
    if (local % a->tp && a->tp % local) {
        fprintf(stderr, "kiln %s: --tp %d --pp %d on --nnodes %d: %ld ranks a node would cut a stage's tensor "
                        "parallel group at a node's edge; choose sizes where each node holds whole stages or each "
                        "stage whole nodes\n", cmd, a->tp, a->pp, a->nnodes, local);
        return -1;
    }
    return 0;
}

/* The ranks' layout, before anything starts. */
static int model_args_check_ranks(const struct model_args *a, const char *cmd) {
    if (a->ep != 1 && a->ep != a->tp) {
        fprintf(stderr, "kiln %s: --ep %d: expert parallel reuses the tensor-parallel group: give 1 or --tp (%d)\n",
                cmd, a->ep, a->tp);
        return -1;
    }
    if (a->dp > 1 && !a->dp_attention) {
        fprintf(stderr, "kiln %s: --dp %d needs --enable-dp-attention: data parallel replicas of the whole model "
                        "are not supported, only DP attention\n", cmd, a->dp);
        return -1;
    }
    if (a->dp_attention && a->dp <= 1) {
        fprintf(stderr, "kiln %s: --enable-dp-attention needs --dp N (N > 1 attention groups)\n", cmd);
        return -1;
    }
    if (a->dp > 1 && a->pp > 1) {
        fprintf(stderr, "kiln %s: --dp %d with --pp %d: DP attention with pipeline stages is not supported\n", cmd,
                a->dp, a->pp);
        return -1;
    }
    if (a->tp % a->dp) {
        fprintf(stderr, "kiln %s: --dp %d does not divide --tp %d (each attention group is --tp / --dp ranks)\n", cmd,
                a->dp, a->tp);
        return -1;
    }
    if (a->node_rank >= a->nnodes) {
        fprintf(stderr, "kiln %s: --node-rank %d: must be below --nnodes %d\n", cmd, a->node_rank, a->nnodes);
        return -1;
    }
    if (a->nnodes > 1 && !a->dist_init_addr) {
        fprintf(stderr, "kiln %s: --nnodes %d needs --dist-init-addr HOST:PORT (node 0's address, the same on "
                        "every node)\n", cmd, a->nnodes);
        return -1;
    }
    if (a->pp > 1 && model_args_check_pp(a, cmd)) return -1;
    if (a->pp <= 1 && a->tp % a->nnodes) {
        fprintf(stderr, "kiln %s: --tp %d is not divisible by --nnodes %d (every node runs as many ranks)\n", cmd,
                a->tp, a->nnodes);
        return -1;
    }
    if (a->dist_init_addr) {
        char host[DIST_ADDR_MAX];
        int port;
        struct kiln_error err;
        if (dist_addr_split(a->dist_init_addr, host, sizeof host, &port, &err)) {
            fprintf(stderr, "kiln %s: --dist-init-addr: %s\n", cmd, err.msg);
            return -1;
        }
        if (port == 0 && a->nnodes > 1) {
            fprintf(stderr, "kiln %s: --dist-init-addr %s: the other nodes need a port other than 0\n", cmd,
                    a->dist_init_addr);
            return -1;
        }
    }
    return 0;
}

/* DP attention keeps MLA's latent KV per group: the model must have one.
 * Read from config.json before any rank starts (the model refuses too). */
static int model_args_check_dp_model(const struct model_args *a, const char *cmd) {
    if (a->dp <= 1 || !a->model_dir) return 0;
    size_t n = strlen(a->model_dir);
    int is_json = n > 5 && !strcmp(a->model_dir + n - 5, ".json");
    char *path = is_json ? xstrdup(a->model_dir) : path_join(a->model_dir, "config.json");
    struct model_config c;
    struct kiln_error err = {0};
    int rc = model_config_load(&c, path, &err);
    free(path);
    if (rc) return 0; /* the load reports it */
    if (c.kv_lora_rank > 0) return 0;
    fprintf(stderr, "kiln %s: --enable-dp-attention: model_type %s has no multi-head latent attention; DP "
                    "attention is for DeepSeek-V2/V3-style (MLA) models only\n", cmd, c.model_type);
    return 2;
}

int model_args_finish(struct model_args *a, const char *cmd, const char *positional) {
    enum model_routing routing;
    if (model_routing_parse(a->dummy_routing_name, &routing)) {
        fprintf(stderr, "kiln %s: --dummy-routing '%s': expected model or uniform\n", cmd, a->dummy_routing_name);
        return 2;
    }
    a->dummy_routing = (int)routing;
    if (strcmp(a->kv_cache_dtype, "auto") && strcmp(a->kv_cache_dtype, "fp8_e4m3")) {
        fprintf(stderr, "kiln %s: --kv-cache-dtype '%s': expected auto or fp8_e4m3\n", cmd, a->kv_cache_dtype);
        return 2;
    }
    a->kv_fp8 = !strcmp(a->kv_cache_dtype, "fp8_e4m3");
    if (a->quantization && strcmp(a->quantization, "fp8")) {
        fprintf(stderr, "kiln %s: --quantization '%s': only fp8 is supported\n", cmd, a->quantization);
        return 2;
    }
    if (model_args_check_ranks(a, cmd)) return 2;
    if (positional) {
        if (a->model && strcmp(a->model, positional)) {
            fprintf(stderr, "kiln %s: the model is given twice: '%s' and --model '%s'\n", cmd, positional, a->model);
            return 2;
        }
        a->model = positional;
    }
    if (!a->model) {
        a->model_dir = cli_default_model();
        return 0;
    }
    char msg[1024];
    int is_id;
    if (cli_resolve_model(a->model, &a->model_dir, &a->owned, &is_id, msg, sizeof msg)) {
        fprintf(stderr, "kiln %s: %s\n", cmd, msg);
        return 1;
    }
    a->hf_id = is_id ? a->model : NULL;
    return model_args_check_dp_model(a, cmd);
}

void model_args_free(struct model_args *a) {
    free(a->owned);
    a->owned = NULL;
}

/* huggingface_hub's repo id: NAME or ORG/NAME of [A-Za-z0-9_.-], no part
 * starting or ending with '-' or '.', no "--" or "..", at most 96 chars. */
static int is_hf_id(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 96 || strstr(s, "--") || strstr(s, "..")) return 0;
    int slashes = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '/') {
            slashes++;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("_.-", c)))
            return 0;
        int edge = i == 0 || s[i - 1] == '/' || i + 1 == n || s[i + 1] == '/';
        if (edge && (c == '-' || c == '.')) return 0;
    }
    return slashes <= 1 && s[0] != '/' && s[n - 1] != '/';
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The hub cache folder, as huggingface_hub finds it. */
static char *hub_cache_dir(void) {
    const char *e = getenv("HF_HUB_CACHE");
    if (e && *e) return xstrdup(e);
    e = getenv("HF_HOME");
    if (e && *e) return path_join(e, "hub");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char *base = xdg && *xdg ? xstrdup(xdg) : home && *home ? path_join(home, ".cache") : xstrdup(".cache");
    char *hf = path_join(base, "huggingface"), *hub = path_join(hf, "hub");
    free(base);
    free(hf);
    return hub;
}

/* The snapshot refs/main names; else the only one. */
static char *pick_snapshot(const char *repo, const char *id, char *msg, size_t msg_size) {
    char *refs = path_join(repo, "refs/main"), *snaps = path_join(repo, "snapshots"), *text = NULL, *out = NULL;
    struct kiln_error err;
    if (file_exists(refs) && file_read_all(refs, &text, NULL, &err) == 0) {
        size_t n = strcspn(text, " \t\r\n");
        text[n] = 0;
        if (n == 0 || strchr(text, '/') || !strcmp(text, "..")) {
            snprintf(msg, msg_size, "%s: expected a commit hash", refs);
        } else {
            out = path_join(snaps, text);
            if (!is_dir(out)) {
                snprintf(msg, msg_size, "%s names the snapshot %s, which is not in %s (an interrupted download?)",
                         refs, text, snaps);
                free(out);
                out = NULL;
            }
        }
    } else {
        DIR *d = opendir(snaps);
        int n = 0;
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            if (n++ == 0) out = path_join(snaps, de->d_name);
        }
        if (d) closedir(d);
        if (n != 1) {
            if (n == 0) snprintf(msg, msg_size, "'%s' has no snapshot in %s (an interrupted download?)", id, snaps);
            else snprintf(msg, msg_size, "'%s' has %d snapshots in %s and no refs/main to choose one: give the folder", id, n, snaps);
            free(out);
            out = NULL;
        }
    }
    free(refs);
    free(snaps);
    free(text);
    return out;
}

int cli_resolve_model(const char *arg, const char **out, char **owned, int *is_id, char *msg, size_t msg_size) {
    struct stat st;
    *out = arg;
    *owned = NULL;
    *is_id = 0;
    if (stat(arg, &st) == 0 || !is_hf_id(arg)) return 0;
    char *hub = hub_cache_dir();
    size_t n = strlen(arg);
    char *name = xmalloc(n + 16), *q = name;
    q += sprintf(q, "models--");
    for (const char *p = arg; *p; p++) {
        if (*p == '/') q += sprintf(q, "--");
        else *q++ = *p;
    }
    *q = 0;
    char *repo = path_join(hub, name);
    int rc = -1;
    if (!is_dir(repo)) {
        snprintf(msg, msg_size,
                 "'%s' is neither a folder nor a model in the Hugging Face cache (no %s); kiln does not download: "
                 "fetch it first, e.g. `huggingface-cli download %s`, or set HF_HOME / HF_HUB_CACHE",
                 arg, repo, arg);
    } else if ((*owned = pick_snapshot(repo, arg, msg, msg_size))) {
        *out = *owned;
        *is_id = 1;
        rc = 0;
    }
    free(hub);
    free(name);
    free(repo);
    return rc;
}

int cli_parse_int(const char *opt, const char *val, long lo, long hi, long *out) {
    long long x;
    if (!val) {
        fprintf(stderr, "kiln: %s needs a value\n", opt);
        return -1;
    }
    if (cli_parse_integer(opt, val, lo, hi, &x)) return -1;
    *out = (long)x;
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

size_t spec_args_options(struct spec_args *a, struct cli_opt *out) {
    const struct cli_opt o[SPEC_ARGS_OPTS] = {
        CLI_OPT_STR("--speculative-algorithm", &a->algorithm, "NGRAM",
                    "speculative decoding: NGRAM drafts a request's next tokens\n"
                    "from its own earlier tokens and checks them in the same step"),
        CLI_OPT_INT("--speculative-num-draft-tokens", &a->draft_tokens, 1, ENGINE_SPEC_MAX_DRAFT, "N",
                    "draft tokens a decode row carries (default 4)"),
        CLI_OPT_INT("--speculative-ngram-min-match-window-size", &a->min_window, 1, 1 << 10, "N",
                    "the fewest last tokens a draft's match takes (default 1)"),
        CLI_OPT_INT("--speculative-ngram-max-match-window-size", &a->max_window, 1, 1 << 10, "N",
                    "the most (default 12; the longest match wins)"),
    };
    memcpy(out, o, sizeof o);
    return SPEC_ARGS_OPTS;
}

int spec_args_finish(const struct spec_args *a, const char *cmd, struct engine_options *eo) {
    if (!a->algorithm) {
        if (a->draft_tokens || a->min_window || a->max_window) {
            fprintf(stderr, "kiln %s: --speculative-num-draft-tokens and the match windows need "
                            "--speculative-algorithm NGRAM\n", cmd);
            return 2;
        }
        return 0;
    }
    if (strcasecmp(a->algorithm, "NGRAM")) {
        fprintf(stderr, "kiln %s: --speculative-algorithm %s: not supported; NGRAM is (EAGLE, EAGLE3 and "
                        "STANDALONE need a draft model, which kiln does not run yet)\n", cmd, a->algorithm);
        return 2;
    }
    int lo = a->min_window ? a->min_window : 1, hi = a->max_window ? a->max_window : 12;
    if (lo > hi) {
        fprintf(stderr, "kiln %s: --speculative-ngram-min-match-window-size %d is above the max %d\n", cmd, lo, hi);
        return 2;
    }
    eo->spec_draft_tokens = a->draft_tokens ? a->draft_tokens : 4;
    eo->spec_min_window = lo;
    eo->spec_max_window = hi;
    return 0;
}
