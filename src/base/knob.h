/* knob.h — every KILN_* environment variable, in one table.
 *
 * A knob is an environment variable kiln (or its test harness) reads: its
 * name, type (bool, int, float, string or enum), range or allowed values,
 * default, class and a one-line description live in the table in knob.c,
 * and nowhere else. Code asks for a knob by id (knob_bool(KNOB_CUDA_PDL)),
 * never through getenv, so a typo is a compile error and docs/knobs.md
 * (`kiln knobs --markdown`) lists everything there is.
 *
 * Classes: PUBLIC knobs are settings for users (KILN_LOG, KILN_DEVICE...);
 * DEBUG knobs turn a kernel family or an optimization off, or force one of
 * its shapes, to isolate a defect or to measure; TEST knobs are hooks for
 * the tests and check scripts.
 *
 * The environment is parsed once, on first use (thread-safe). An empty
 * value counts as unset. A value that does not parse, is out of range or is
 * not one of the allowed words is an error that names the knob and what
 * was expected: knob_init() returns it (the commands report it and exit
 * with status 2, backend_create fails with it); the getters then return
 * that knob's default. knob_reload() parses again, for tests and
 * benchmarks that compare settings in one process (not while other
 * threads read knobs).
 */
#ifndef KILN_BASE_KNOB_H
#define KILN_BASE_KNOB_H

#include <stdio.h>

struct kiln_error;

enum knob_id {
    /* PUBLIC */
    KNOB_LOG,
    KNOB_DEVICE,
    KNOB_MODEL,
    KNOB_CPU_MATMUL,
    KNOB_CUDA_MATMUL,
    KNOB_CUDA_KV,
    KNOB_CUDA_MOE,
    KNOB_DIST_RANK,
    KNOB_DIST_INIT_ADDR,
    /* DEBUG */
    KNOB_GRAPHS,
    KNOB_GPU_SAMPLE,
    KNOB_GRAPH_SAMPLE,
    KNOB_SHARED_EXPERTS_FUSION,
    KNOB_MLA_FORM,
    KNOB_LOAD_OVERLAP,
    KNOB_CUDA_ATTN,
    KNOB_CUDA_FA,
    KNOB_CUDA_GEMV_MAX_ROWS,
    KNOB_CUDA_GEMV_KS,
    KNOB_CUDA_PDL,
    KNOB_CUDA_FUSE,
    KNOB_CUDA_ONE_SHOT,
    KNOB_CUDA_LT,
    KNOB_CUDA_FP8_LT,
    KNOB_CUDA_AD_W,
    KNOB_CUDA_WGMMA,
    KNOB_CUDA_WGMMA_MIN_MB,
    KNOB_CUDA_WGMMA_GLU,
    KNOB_CUDA_WGMMA_ROPE,
    KNOB_CUDA_WGMMA_FP8,
    KNOB_CUDA_MOE_WGMMA,
    KNOB_CUDA_MOE_MAX,
    KNOB_CUDA_DUAL_STREAM,
    KNOB_CUDA_PROFILE,
    /* TEST */
    KNOB_CUDA_UPLOAD_DELAY_MS,
    KNOB_MLA_CHUNK,
    KNOB_FIXTURES,
    KNOB_TOKENIZERS,
    KNOB_MODELS,
    KNOB_SRC,
    KNOB_TEST_SEED,
    KNOB_TEST_DEVICE,
    KNOB_TEST_ONLY,
    KNOB_TEST_MOE_CHUNK_ROWS,
    KNOB_CUDA_TOL,
    KNOB_CUDA_TOL_X2,
    KNOB_CUDA_TOL_KV,
    KNOB_FUZZ_SECONDS,
    KNOB_FUZZ_JOBS,
    KNOB_FUZZ_TOKENIZER,
    KNOB_FUZZ_LOSSLESS,
    KNOB_BENCH_ONLY,
    KNOB_GPU_BUILD,
    KNOB_GPU_FORCE_DEBS,
    KNOB_CTEST_TIMEOUT,
    KNOB_NPM,
    KNOB_TRACE_OUT,
    KNOB_COUNT
};

enum knob_type { KNOB_BOOL, KNOB_INT, KNOB_FLOAT, KNOB_STRING, KNOB_ENUM };
enum knob_class { KNOB_PUBLIC, KNOB_DEBUG, KNOB_TEST };

/* Parses the environment (once) and returns 0, or -1 with the first bad
 * knob's message ("KILN_CUDA_KV='fp8': expected one of auto, bf16, f32").
 * Every later call returns the same answer until knob_reload(). */
int knob_init(struct kiln_error *err);

/* Parses the environment again (tests, benchmarks); returns as knob_init. */
int knob_reload(struct kiln_error *err);

/* Values (parsed on first use). Asking for a knob of another type is a bug
 * (an assertion). knob_enum is the index of the value among the allowed
 * words as listed by knob_describe; knob_str of an unset string knob is its
 * default ("" where there is none), of an enum its word. */
int knob_bool(enum knob_id id);
long knob_int(enum knob_id id);
double knob_float(enum knob_id id);
const char *knob_str(enum knob_id id);
int knob_enum(enum knob_id id);

/* 1 when the environment sets this knob (to a valid value). */
int knob_is_set(enum knob_id id);

/* Writes "KILN_LOG=debug KILN_CUDA_PDL=0": the knobs the environment
 * sets to other values than their defaults, in table order, cut to size;
 * returns how many there are. */
int knob_describe_set(char *buf, size_t size);

/* Logs knob_describe_set's list as one INFO line (none: nothing). */
void knob_log_set(void);

/* The table as a Markdown page (docs/knobs.md), or as one name a line. */
void knob_print_markdown(FILE *f);
void knob_print_names(FILE *f);

#endif
