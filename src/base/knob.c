/* knob.c — the table of KILN_* environment variables and their parser. */
#include "base/knob.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"

struct knob_def {
    const char *name;
    enum knob_type type;
    enum knob_class cls;
    const char *def;               /* the default as the environment would spell it */
    long lo, hi;                   /* KNOB_INT: allowed range */
    double flo, fhi;               /* KNOB_FLOAT: allowed range */
    const char *const *words;      /* KNOB_ENUM: allowed values, NULL-terminated */
    const char *doc;               /* one line for docs/knobs.md */
};

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define BOOL(cls_, def_, doc_) .type = KNOB_BOOL, .cls = (cls_), .def = (def_), .doc = (doc_)
#define INT(cls_, def_, lo_, hi_, doc_)                                                            \
    .type = KNOB_INT, .cls = (cls_), .def = (def_), .lo = (lo_), .hi = (hi_), .doc = (doc_)
#define FLOAT(cls_, def_, lo_, hi_, doc_)                                                          \
    .type = KNOB_FLOAT, .cls = (cls_), .def = (def_), .flo = (lo_), .fhi = (hi_), .doc = (doc_)
#define STR(cls_, def_, doc_) .type = KNOB_STRING, .cls = (cls_), .def = (def_), .doc = (doc_)
#define ENUM(cls_, def_, words_, doc_)                                                             \
    .type = KNOB_ENUM, .cls = (cls_), .def = (def_), .words = (words_), .doc = (doc_)

static const struct knob_def table[KNOB_COUNT] = {
    /* PUBLIC */
    [KNOB_LOG] = {"KILN_LOG", ENUM(KNOB_PUBLIC, "info", WORDS("error", "warn", "info", "debug"),
                                   "log level of every command (stderr)")},
    [KNOB_DEVICE] = {"KILN_DEVICE",
                     ENUM(KNOB_PUBLIC, "auto", WORDS("auto", "cpu", "cuda"),
                          "the default of --device: auto takes the GPU when one can be opened")},
    [KNOB_MODEL] = {"KILN_MODEL", STR(KNOB_PUBLIC, "",
                                      "the default of --model (unset: the bundled models/stories260K)")},
    [KNOB_CPU_MATMUL] = {"KILN_CPU_MATMUL",
                         ENUM(KNOB_PUBLIC, "f32", WORDS("f32", "bf16"),
                              "CPU products with bf16 weights: f32 activations, or bf16 (activations "
                              "rounded to bf16, vdpbf16ps where the CPU has it: faster prefill)")},
    [KNOB_CUDA_MATMUL] = {"KILN_CUDA_MATMUL",
                          ENUM(KNOB_PUBLIC, "bf16", WORDS("bf16", "bf16x2"),
                               "GPU products: bf16 operands, or bf16x2 (activations as bf16 hi + lo, "
                               "fp32-grade results, about twice the product time)")},
    [KNOB_CUDA_KV] = {"KILN_CUDA_KV",
                      ENUM(KNOB_PUBLIC, "auto", WORDS("auto", "bf16", "f32"),
                           "GPU KV cache element: auto is bf16, or f32 with KILN_CUDA_MATMUL=bf16x2")},
    [KNOB_CUDA_MOE] = {"KILN_CUDA_MOE",
                       ENUM(KNOB_PUBLIC, "device", WORDS("host", "device"),
                            "MoE rows sorted by expert on the host, or on the device (batches up "
                            "to KILN_CUDA_MOE_MAX tokens; MoE models then decode from graphs; FP8 "
                            "and MXFP4 experts: the device only)")},
    [KNOB_DIST_RANK] = {"KILN_DIST_RANK",
                        INT(KNOB_PUBLIC, "0", 0, 4095,
                            "set by kiln, not by users: the global rank of a process a node's first "
                            "rank started (--tp > 1; 0: a process the user started)")},
    [KNOB_DIST_INIT_ADDR] = {"KILN_DIST_INIT_ADDR",
                             STR(KNOB_PUBLIC, "",
                                 "set by kiln, not by users: the rendezvous HOST:PORT of the processes "
                                 "a node's first rank started (overrides --dist-init-addr)")},
    /* DEBUG */
    [KNOB_GRAPHS] = {"KILN_GRAPHS", BOOL(KNOB_DEBUG, "1", "decode steps replay CUDA graphs (0: eager)")},
    [KNOB_GPU_SAMPLE] = {"KILN_GPU_SAMPLE",
                         BOOL(KNOB_DEBUG, "1", "sample on the device (0: download logits, sample on the host)")},
    [KNOB_GRAPH_SAMPLE] = {"KILN_GRAPH_SAMPLE",
                           BOOL(KNOB_DEBUG, "1", "decode graphs include lm_head and sampling (0: the layers only)")},
    [KNOB_SHARED_EXPERTS_FUSION] = {"KILN_SHARED_EXPERTS_FUSION",
                                    BOOL(KNOB_DEBUG, "1",
                                         "a single shared expert joins the routed experts "
                                         "(0: as --disable-shared-experts-fusion)")},
    [KNOB_MLA_FORM] = {"KILN_MLA_FORM",
                       ENUM(KNOB_DEBUG, "auto", WORDS("auto", "absorbed", "mha"),
                            "MLA attention form of every sequence: auto chooses by FLOP cost "
                            "(MHA for long new-token runs), or force one (tests; mha turns graphs off)")},
    [KNOB_LOAD_OVERLAP] = {"KILN_LOAD_OVERLAP",
                           BOOL(KNOB_DEBUG, "1",
                                "the checkpoint's copy to the GPU overlaps the KV pool and warm-up "
                                "(0: load first)")},
    [KNOB_CUDA_ATTN] = {"KILN_CUDA_ATTN",
                        ENUM(KNOB_DEBUG, "auto", WORDS("auto", "scalar", "split"),
                             "force one GPU attention kernel family (auto: by shape and cache type)")},
    [KNOB_CUDA_FA] = {"KILN_CUDA_FA",
                      ENUM(KNOB_DEBUG, "auto", WORDS("auto", "fa2", "fa3"),
                           "prefill attention: auto is fa3 (wgmma) on compute capability 9.0, "
                           "else fa2; fa3 elsewhere is an error")},
    [KNOB_CUDA_GEMV_MAX_ROWS] = {"KILN_CUDA_GEMV_MAX_ROWS",
                                 INT(KNOB_DEBUG, "2", 0, 8,
                                     "GPU products of at most this many rows take the GEMV kernel "
                                     "(0: none)")},
    [KNOB_CUDA_GEMV_KS] = {"KILN_CUDA_GEMV_KS",
                           ENUM(KNOB_DEBUG, "auto", WORDS("auto", "1", "2", "4"),
                                "force the GEMV's K split (auto: by the weight's shape)")},
    [KNOB_CUDA_PDL] = {"KILN_CUDA_PDL",
                       BOOL(KNOB_DEBUG, "1",
                            "programmatic dependent launch on compute capability 9.0 (0: ordinary "
                            "launches)")},
    [KNOB_CUDA_FUSE] = {"KILN_CUDA_FUSE",
                        BOOL(KNOB_DEBUG, "1",
                             "fused GPU ops (norm + product, SwiGLU MLP, attention + projection) "
                             "(0: their plain sequence)")},
    [KNOB_CUDA_ONE_SHOT] = {"KILN_CUDA_ONE_SHOT",
                            INT(KNOB_DEBUG, "1048576", 0, 1 << 24,
                                "tensor parallel all-reduces between the GPUs of one machine of up to this "
                                "many bytes run as one kernel over CUDA IPC, fused with the residual add and "
                                "RMSNorm after them where there is one (0: NCCL always)")},
    [KNOB_CUDA_LT] = {"KILN_CUDA_LT",
                      BOOL(KNOB_DEBUG, "1", "16-bit GPU products through cuBLASLt (0: cublasGemmEx)")},
    [KNOB_CUDA_FP8_LT] = {"KILN_CUDA_FP8_LT",
                          BOOL(KNOB_DEBUG, "1",
                               "FP8 GPU products of more than 64 rows through cuBLASLt's block-scaled "
                               "FP8 where it has an algorithm (0: weights dequantized to bf16)")},
    [KNOB_CUDA_AD_W] = {"KILN_CUDA_AD_W",
                        ENUM(KNOB_DEBUG, "auto", WORDS("auto", "2", "4"),
                             "force the warps per CTA of the decode attention at head size 128")},
    [KNOB_CUDA_WGMMA] = {"KILN_CUDA_WGMMA",
                         BOOL(KNOB_DEBUG, "1",
                              "the wgmma product for 1..64 rows on compute capability 9.0 (0: cuBLAS)")},
    [KNOB_CUDA_WGMMA_MIN_MB] = {"KILN_CUDA_WGMMA_MIN_MB",
                                INT(KNOB_DEBUG, "40", 0, 1 << 20,
                                    "weights of at least this many MiB take the wgmma product")},
    [KNOB_CUDA_WGMMA_GLU] = {"KILN_CUDA_WGMMA_GLU",
                             BOOL(KNOB_DEBUG, "1", "SwiGLU in the wgmma gate|up product's epilogue")},
    [KNOB_CUDA_WGMMA_ROPE] = {"KILN_CUDA_WGMMA_ROPE",
                              BOOL(KNOB_DEBUG, "1",
                                   "rope and the K/V store in the wgmma q|k|v product's epilogue")},
    [KNOB_CUDA_WGMMA_FP8] = {"KILN_CUDA_WGMMA_FP8",
                             BOOL(KNOB_DEBUG, "1",
                                  "FP8 products of more than 4 rows on the e4m3 wgmma kernel on compute "
                                  "capability 9.0, the activations quantized per row and 128 columns "
                                  "(0: the tile kernel and cuBLASLt)")},
    [KNOB_CUDA_MOE_WGMMA] = {"KILN_CUDA_MOE_WGMMA",
                             BOOL(KNOB_DEBUG, "1",
                                  "MoE expert products of long prompts on wgmma on compute capability "
                                  "9.0 (0: the mma.sync kernel)")},
    [KNOB_CUDA_MOE_MAX] = {"KILN_CUDA_MOE_MAX",
                           INT(KNOB_DEBUG, "1048576", 0, 1 << 20,
                               "largest batch (tokens) of the MoE device path; larger ones sort "
                               "on the host (FP8 and MXFP4 experts: every batch on the device)")},
    [KNOB_CUDA_DUAL_STREAM] = {"KILN_CUDA_DUAL_STREAM",
                               INT(KNOB_PUBLIC, "1024", 0, 1 << 20,
                                   "MoE steps of up to this many tokens run the shared experts on a "
                                   "second stream beside the routed ones (0: one stream)")},
    [KNOB_CUDA_PROFILE] = {"KILN_CUDA_PROFILE",
                           BOOL(KNOB_DEBUG, "0",
                                "time every GPU operation per shape; a table at exit (slows every step)")},
    /* TEST */
    [KNOB_CUDA_UPLOAD_DELAY_MS] = {"KILN_CUDA_UPLOAD_DELAY_MS",
                                   INT(KNOB_TEST, "0", 0, 600000,
                                       "sleep before each deferred weight copy: a slow disk")},
    [KNOB_MLA_CHUNK] = {"KILN_MLA_CHUNK",
                        INT(KNOB_TEST, "0", 0, 1 << 20,
                            "positions per kv_b_proj product of MLA's MHA form (0: by its memory "
                            "budget); small values test the chunked decompression")},
    [KNOB_FIXTURES] = {"KILN_FIXTURES", STR(KNOB_TEST, "tests/fixtures", "the test fixtures folder")},
    [KNOB_TOKENIZERS] = {"KILN_TOKENIZERS",
                         STR(KNOB_TEST, ".cache/tokenizers",
                             "the real tokenizers (scripts/fetch-tokenizers.sh)")},
    [KNOB_MODELS] = {"KILN_MODELS", STR(KNOB_TEST, "models", "the models folder of the source tree")},
    [KNOB_SRC] = {"KILN_SRC", STR(KNOB_TEST, "", "the source tree, for the shell tests")},
    [KNOB_TEST_SEED] = {"KILN_TEST_SEED",
                        STR(KNOB_TEST, "", "seed of the randomized GPU tests (unset: the clock; printed)")},
    [KNOB_TEST_DEVICE] = {"KILN_TEST_DEVICE",
                          ENUM(KNOB_TEST, "cuda", WORDS("cuda", "cpu"),
                               "device of test_deterministic")},
    [KNOB_TEST_ONLY] = {"KILN_TEST_ONLY", STR(KNOB_TEST, "", "run only the server tests whose name has this")},
    [KNOB_TEST_MOE_CHUNK_ROWS] = {"KILN_TEST_MOE_CHUNK_ROWS",
                                  INT(KNOB_TEST, "0", 0, 1 << 30,
                                      "(token, slot) rows of a MoE chunk (0: the default 32768)")},
    [KNOB_CUDA_TOL] = {"KILN_CUDA_TOL",
                       FLOAT(KNOB_TEST, "0.25", 0, 1e9, "verify_cuda.sh: tolerance of the bf16 path")},
    [KNOB_CUDA_TOL_X2] = {"KILN_CUDA_TOL_X2",
                          FLOAT(KNOB_TEST, "1e-3", 0, 1e9, "verify_cuda.sh: tolerance of bf16x2")},
    [KNOB_CUDA_TOL_KV] = {"KILN_CUDA_TOL_KV",
                          FLOAT(KNOB_TEST, "1.0", 0, 1e9,
                                "verify_cuda.sh: tolerance of bf16x2 with the bf16 KV cache")},
    [KNOB_FUZZ_SECONDS] = {"KILN_FUZZ_SECONDS",
                           INT(KNOB_TEST, "60", 0, INT_MAX,
                               "scripts/test.sh: seconds per fuzz target (0: no fuzzing)")},
    [KNOB_FUZZ_JOBS] = {"KILN_FUZZ_JOBS",
                        INT(KNOB_TEST, "0", 0, 4096, "scripts/fuzz.sh: targets at a time (0: one a core)")},
    [KNOB_FUZZ_TOKENIZER] = {"KILN_FUZZ_TOKENIZER",
                             STR(KNOB_TEST, "", "fuzz_tokenizer_encode: a tokenizer folder to fuzz")},
    [KNOB_FUZZ_LOSSLESS] = {"KILN_FUZZ_LOSSLESS",
                            BOOL(KNOB_TEST, "0",
                                 "fuzz_tokenizer_encode: every input must round-trip exactly")},
    [KNOB_BENCH_ONLY] = {"KILN_BENCH_ONLY",
                         STR(KNOB_TEST, "", "scripts/gpu-check.sh: any value runs the benchmarks alone")},
    [KNOB_GPU_BUILD] = {"KILN_GPU_BUILD",
                        STR(KNOB_TEST, "build-gpu", "scripts/gpu-check.sh: the build folder")},
    [KNOB_GPU_FORCE_DEBS] = {"KILN_GPU_FORCE_DEBS",
                             STR(KNOB_TEST, "",
                                 "scripts/gpu-check.sh: any value installs the build's packages even "
                                 "when found")},
    [KNOB_CTEST_TIMEOUT] = {"KILN_CTEST_TIMEOUT",
                            INT(KNOB_TEST, "200", 1, INT_MAX,
                                "scripts/gpu-check.sh: seconds for the GPU tests")},
    [KNOB_NPM] = {"KILN_NPM",
                  STR(KNOB_TEST, ".cache/npm", "scripts/fetch-npm.sh: where the npm packages go")},
    [KNOB_TRACE_OUT] = {"KILN_TRACE_OUT",
                        STR(KNOB_TEST, "trace.csv", "dev/trace/cupti_trace.c: the kernel trace file")},
};

struct knob_val {
    int set;  /* the environment gave a valid value */
    long i;   /* bool, int, enum index */
    double f; /* float */
    char *s;  /* string: owned copy; NULL: the default */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_parsed;
static int g_status;
static struct kiln_error g_err;
static struct knob_val g_val[KNOB_COUNT];
static struct knob_val g_def[KNOB_COUNT]; /* the defaults, parsed */

static int word_index(const struct knob_def *k, const char *text) {
    for (int i = 0; k->words[i]; i++)
        if (!strcmp(k->words[i], text)) return i;
    return -1;
}

static void list_words(const struct knob_def *k, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; k->words[i] && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? (k->words[i + 1] ? ", " : " or ") : "",
                              k->words[i]);
}

/* Parses one value of knob k; 0, or -1 with a message naming the knob. */
static int parse_value(const struct knob_def *k, const char *text, struct knob_val *v,
                       struct kiln_error *err) {
    switch (k->type) {
    case KNOB_BOOL: {
        static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no", "off"};
        for (int i = 0; i < 4; i++) {
            if (!strcasecmp(text, on[i]) || !strcasecmp(text, off[i])) {
                v->i = !strcasecmp(text, on[i]);
                return 0;
            }
        }
        return kiln_errorf(err, "%s='%s': expected a boolean (1, 0, true, false, on, off, yes or no)",
                           k->name, text);
    }
    case KNOB_INT: {
        char *end;
        errno = 0;
        long x = (text[0] == '-' || isdigit((unsigned char)text[0])) ? strtol(text, &end, 10) : 0;
        if (!(text[0] == '-' || isdigit((unsigned char)text[0])) || *end || end == text ||
            errno == ERANGE || x < k->lo || x > k->hi)
            return kiln_errorf(err, "%s='%s': expected an integer from %ld to %ld", k->name, text,
                               k->lo, k->hi);
        v->i = x;
        return 0;
    }
    case KNOB_FLOAT: {
        char *end;
        errno = 0;
        double x = isspace((unsigned char)text[0]) ? NAN : strtod(text, &end);
        if (isnan(x) || *end || errno == ERANGE || !isfinite(x) || x < k->flo || x > k->fhi)
            return kiln_errorf(err, "%s='%s': expected a number from %g to %g", k->name, text,
                               k->flo, k->fhi);
        v->f = x;
        return 0;
    }
    case KNOB_STRING:
        v->s = xstrdup(text);
        return 0;
    case KNOB_ENUM: {
        int i = word_index(k, text);
        if (i < 0) {
            char words[256];
            list_words(k, words, sizeof words);
            return kiln_errorf(err, "%s='%s': expected %s%s", k->name, text,
                               k->words[1] ? "one of " : "", words);
        }
        v->i = i;
        return 0;
    }
    }
    return kiln_errorf(err, "%s: bad knob type", k->name);
}

/* Under g_lock. */
static void parse_all(void) {
    g_status = 0;
    g_err.msg[0] = 0;
    for (int id = 0; id < KNOB_COUNT; id++) {
        const struct knob_def *k = &table[id];
        KILN_ASSERT_MSG(k->name && k->doc && k->def, "knob table entry missing");
        free(g_val[id].s);
        memset(&g_val[id], 0, sizeof g_val[id]);
        /* the default goes through the same parser: a bad table is a bug */
        struct knob_val d = {0};
        KILN_ASSERT_MSG(k->type == KNOB_STRING || parse_value(k, k->def, &d, NULL) == 0, k->name);
        g_val[id] = g_def[id] = d;
        const char *e = getenv(k->name);
        if (!e || !*e) continue;
        struct knob_val v = {0};
        struct kiln_error err;
        if (parse_value(k, e, &v, &err)) {
            if (!g_status) g_err = err;
            g_status = -1;
            continue;
        }
        v.set = 1;
        g_val[id] = v;
    }
    g_parsed = 1;
}

static int init_locked(struct kiln_error *err, int again) {
    pthread_mutex_lock(&g_lock);
    if (again || !g_parsed) parse_all();
    int rc = g_status;
    if (rc && err) *err = g_err;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int knob_init(struct kiln_error *err) { return init_locked(err, 0); }
int knob_reload(struct kiln_error *err) { return init_locked(err, 1); }

static struct knob_val get(enum knob_id id, enum knob_type type) {
    KILN_ASSERT(id >= 0 && id < KNOB_COUNT && table[id].type == type);
    pthread_mutex_lock(&g_lock);
    if (!g_parsed) parse_all();
    struct knob_val v = g_val[id];
    pthread_mutex_unlock(&g_lock);
    return v;
}

int knob_bool(enum knob_id id) { return (int)get(id, KNOB_BOOL).i; }
long knob_int(enum knob_id id) { return get(id, KNOB_INT).i; }
double knob_float(enum knob_id id) { return get(id, KNOB_FLOAT).f; }
int knob_enum(enum knob_id id) { return (int)get(id, KNOB_ENUM).i; }

const char *knob_str(enum knob_id id) {
    KILN_ASSERT(id >= 0 && id < KNOB_COUNT);
    const struct knob_def *k = &table[id];
    if (k->type == KNOB_ENUM) return k->words[knob_enum(id)];
    struct knob_val v = get(id, KNOB_STRING);
    return v.s ? v.s : k->def;
}

int knob_is_set(enum knob_id id) {
    KILN_ASSERT(id >= 0 && id < KNOB_COUNT);
    pthread_mutex_lock(&g_lock);
    if (!g_parsed) parse_all();
    int set = g_val[id].set;
    pthread_mutex_unlock(&g_lock);
    return set;
}

/* 1 when knob id is set to something else than its default. */
static int differs(int id) {
    pthread_mutex_lock(&g_lock);
    if (!g_parsed) parse_all();
    const struct knob_val *v = &g_val[id], *d = &g_def[id];
    int diff = v->set && (table[id].type == KNOB_STRING ? strcmp(v->s, table[id].def) != 0
                          : table[id].type == KNOB_FLOAT ? v->f != d->f
                                                         : v->i != d->i);
    pthread_mutex_unlock(&g_lock);
    return diff;
}

int knob_describe_set(char *buf, size_t size) {
    size_t n = 0;
    int count = 0;
    if (size) buf[0] = 0;
    for (int id = 0; id < KNOB_COUNT; id++) {
        if (!differs(id)) continue;
        const struct knob_def *k = &table[id];
        char val[64];
        const char *text = val;
        switch (k->type) {
        case KNOB_BOOL: snprintf(val, sizeof val, "%d", knob_bool((enum knob_id)id)); break;
        case KNOB_INT: snprintf(val, sizeof val, "%ld", knob_int((enum knob_id)id)); break;
        case KNOB_FLOAT: snprintf(val, sizeof val, "%g", knob_float((enum knob_id)id)); break;
        case KNOB_STRING:
        case KNOB_ENUM: text = knob_str((enum knob_id)id); break;
        }
        if (n < size)
            n += (size_t)snprintf(buf + n, size - n, "%s%s=%s", count ? " " : "", k->name, text);
        count++;
    }
    return count;
}

void knob_log_set(void) {
    char line[1536];
    if (knob_describe_set(line, sizeof line) > 0) log_info("knobs not at their defaults: %s", line);
}

static const char *type_name(enum knob_type t) {
    static const char *const names[] = {"bool", "int", "float", "string", "enum"};
    return names[t];
}

void knob_print_markdown(FILE *f) {
    static const char *const heads[] = {
        "## PUBLIC: settings\n\nSettings for users of kiln.\n",
        ("## DEBUG: switches and forcings\n\nEach turns a kernel family or an optimization off, or\n"
         "forces one of its shapes: to isolate a defect or to measure. The defaults\n"
         "are the fastest measured paths.\n"),
        ("## TEST: test and check hooks\n\nRead by the tests, the benchmarks' harness and the check\n"
         "scripts (scripts/, dev/), not by the engine.\n"),
    };
    fprintf(f, "# Environment variables (knobs)\n\n"
               "<!-- Generated by `kiln knobs --markdown` from src/base/knob.c;\n"
               "     tests/cli/knobs.sh fails when this file differs. Edit the table. -->\n\n"
               "Every `KILN_*` environment variable kiln reads is listed here. Values\n"
               "are parsed once, at start-up: a value that does not parse, is out of\n"
               "range or is not one of the allowed words stops the command (exit status\n"
               "2) with a message naming the variable; an empty value counts as unset.\n"
               "`kiln serve`, `generate`, `verify` and `bench` log the variables set to\n"
               "other values than their defaults in one INFO line at start-up; `kiln\n"
               "knobs` lists them. Booleans take 1, 0, true, false, on, off, yes or no.\n");
    for (int cls = KNOB_PUBLIC; cls <= KNOB_TEST; cls++) {
        fprintf(f, "\n%s\n| Variable | Type | Values | Default | Meaning |\n|---|---|---|---|---|\n",
                heads[cls]);
        for (int id = 0; id < KNOB_COUNT; id++) {
            const struct knob_def *k = &table[id];
            if ((int)k->cls != cls) continue;
            char values[256] = "any";
            if (k->type == KNOB_INT) snprintf(values, sizeof values, "%ld .. %ld", k->lo, k->hi);
            else if (k->type == KNOB_FLOAT) snprintf(values, sizeof values, "%g .. %g", k->flo, k->fhi);
            else if (k->type == KNOB_BOOL) snprintf(values, sizeof values, "0, 1");
            else if (k->type == KNOB_ENUM) list_words(k, values, sizeof values);
            fprintf(f, "| `%s` | %s | %s | %s%s%s | ", k->name, type_name(k->type), values,
                    *k->def ? "`" : "", *k->def ? k->def : "(none)", *k->def ? "`" : "");
            for (const char *p = k->doc; *p; p++) { /* a | would end the cell */
                if (*p == '|') fputc('\\', f);
                fputc(*p, f);
            }
            fprintf(f, " |\n");
        }
    }
}

void knob_print_names(FILE *f) {
    for (int id = 0; id < KNOB_COUNT; id++) fprintf(f, "%s\n", table[id].name);
}
