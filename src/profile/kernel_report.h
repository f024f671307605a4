/* kernel_report.h — where a GPU trace's time goes, by kernel category
 * (`kiln profile-report`).
 *
 * A trace is a list of GPU activities (kernels, copies, sets) with start
 * and end. Each activity's name is classified by the first matching rule
 * (regular expression → category): kiln's own kernels, cuBLAS/CUTLASS,
 * FlashAttention/FlashInfer and the NCCL / memory operations by default, or
 * rules from a JSON file in the layout of SGLang's gputrc2graph
 * ({"engine": {"model": {"regex": "category", ...}}}).
 *
 * Time is counted without overlap: activities sorted by start, each one is
 * credited only with the part of its interval that no earlier activity
 * already covered. The credits add up to the time the GPU was busy (the
 * union of the intervals), so concurrent kernels (streams, programmatic
 * dependent launch) are not counted twice. With the run's wall time
 * (elapsed), the rest is reported as "idle" (the GPU doing nothing: host
 * work, launch gaps).
 *
 * Inputs (the format is recognised from the contents):
 *   - Nsight Systems' cuda_gpu_trace report as CSV
 *     (`nsys stats --report cuda_gpu_trace --format csv`): columns
 *     "Start (ns)", "Duration (ns)", "Name";
 *   - scripts/gpu/cupti_trace.c's records (K/M/S lines: start and end in ns);
 *   - Chrome trace JSON (PyTorch profiler, SGLang's /start_profile):
 *     complete events ("ph": "X", ts/dur in µs) of GPU categories (kernel,
 *     gpu_memcpy, gpu_memset).
 * Outputs: a CSV row per (trace, kernel) and an HTML page with a stacked
 * bar per trace (categories) and the tables. */
#ifndef KILN_PROFILE_KERNEL_REPORT_H
#define KILN_PROFILE_KERNEL_REPORT_H

#include <stddef.h>
#include <stdio.h>

struct kiln_error;

struct kr_activity {
    char *name;
    double start, end; /* ns */
};

struct kr_trace {
    char *label;
    struct kr_activity *a;
    long n, cap;
    double elapsed_ns; /* the run's wall time; 0: unknown */
};

/* Reads a trace file (format from its contents). */
int kr_trace_load(struct kr_trace *t, const char *path, const char *label, double elapsed_s,
                  struct kiln_error *err);
/* The same from bytes (fuzzing, tests); `what` names the source in errors. */
int kr_trace_parse(struct kr_trace *t, const char *data, size_t len, const char *what, struct kiln_error *err);
void kr_trace_free(struct kr_trace *t);

struct kr_rules {
    void **re; /* pcre2_code * */
    char **category;
    int n, cap;
};

/* kiln's kernels and the common libraries', then ".*" → "misc". */
int kr_rules_default(struct kr_rules *r, struct kiln_error *err);
/* Rules of engine/model from a gputrc2graph-style JSON file, then a final
 * ".*" → "misc" unless the file has a catch-all. */
int kr_rules_load(struct kr_rules *r, const char *path, const char *engine, const char *model,
                  struct kiln_error *err);
/* From JSON text (an object of regex → category). */
int kr_rules_parse_object(struct kr_rules *r, const char *json, size_t len, const char *what,
                          struct kiln_error *err);
const char *kr_classify(const struct kr_rules *r, const char *name);
void kr_rules_free(struct kr_rules *r);

struct kr_kernel_row {
    const char *name, *category;
    long count;
    double total_ns; /* the sum of its durations */
    double gpu_ns;   /* its non-overlapped share */
};

struct kr_category_row {
    const char *category;
    double gpu_ns;
    long count;
};

struct kr_report {
    const struct kr_trace *trace;
    struct kr_kernel_row *kernels; /* by gpu_ns, largest first */
    long n_kernels;
    struct kr_category_row *categories; /* by gpu_ns, largest first */
    int n_categories;
    double busy_ns; /* the union of the activities */
    double span_ns; /* first start to last end */
};

void kr_analyze(const struct kr_trace *t, const struct kr_rules *r, struct kr_report *out);
void kr_report_free(struct kr_report *rep);

/* CSV: trace,category,kernel,count,total_ms,gpu_ms (plus an "idle" row
 * per trace with a known elapsed time). */
void kr_write_csv(FILE *f, const struct kr_report *reps, int n);
/* A self-contained HTML page (inline SVG, no scripts). */
void kr_write_html(FILE *f, const char *title, const struct kr_report *reps, int n);

#endif
