#include "cli/bench_metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "base/utf8.h"

/* How many distinct error messages the report and the JSON line show. */
#define FIRST_ERRORS 5

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile's default ("linear") on sorted data. */
static double percentile(const double *v, size_t n, double p) {
    if (n == 0) return 0;
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

/* Sorts v in place; values in seconds, statistics in ms. */
static struct bench_stat stat_of(double *v, size_t n) {
    struct bench_stat s = {0};
    if (n == 0) return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++) sq += (v[i] - mean) * (v[i] - mean);
    s.mean = mean * 1000;
    s.std = sqrt(sq / (double)n) * 1000;
    s.median = percentile(v, n, 50) * 1000;
    s.p90 = percentile(v, n, 90) * 1000;
    s.p95 = percentile(v, n, 95) * 1000;
    s.p99 = percentile(v, n, 99) * 1000;
    s.max = v[n - 1] * 1000;
    return s;
}

void bench_metrics_compute(struct bench_metrics *m, const struct bench_run *run) {
    memset(m, 0, sizeof *m);
    int n = run->n;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++)
        if (run->results[i].success) n_itl += (size_t)run->results[i].n_itl;
    double *ttft = xmalloc((size_t)(n + 1) * sizeof *ttft), *tpot = xmalloc((size_t)(n + 1) * sizeof *tpot);
    double *e2e = xmalloc((size_t)(n + 1) * sizeof *e2e), *itl = xmalloc((n_itl + 1) * sizeof *itl);
    size_t nt = 0, np = 0, ni = 0;
    double sum_latency = 0;
    for (int i = 0; i < n; i++) {
        const struct bench_result *r = &run->results[i];
        if (!r->success) {
            m->failed++;
            continue;
        }
        m->completed++;
        m->total_input += r->prompt_len;
        m->total_output += r->output_len;
        m->total_output_retokenized += r->retok_output_len;
        if (r->usage_output_len >= 0) m->n_usage++;
        else m->n_retokenized++;
        m->total_items += run->prompts[i].n_items;
        if (r->usage_prompt_len >= 0) {
            m->total_input_server += r->usage_prompt_len;
            m->n_input_server++;
        }
        if (r->output_len > 1) tpot[np++] = (r->latency - r->ttft) / (r->output_len - 1);
        if (r->n_itl) memcpy(itl + ni, r->itl, (size_t)r->n_itl * sizeof *itl);
        ni += (size_t)r->n_itl;
        ttft[nt] = r->ttft;
        e2e[nt++] = r->latency;
        sum_latency += r->latency;
    }
    double d = run->duration > 0 ? run->duration : 1e-9;
    m->duration = run->duration;
    m->request_throughput = m->completed / d;
    m->input_throughput = (double)m->total_input / d;
    m->output_throughput = (double)m->total_output / d;
    m->output_throughput_retokenized = (double)m->total_output_retokenized / d;
    m->total_throughput = (double)(m->total_input + m->total_output) / d;
    m->item_throughput = (double)m->total_items / d;
    m->ttft_ms = stat_of(ttft, nt);
    m->tpot_ms = stat_of(tpot, np);
    m->itl_ms = stat_of(itl, ni);
    m->e2e_ms = stat_of(e2e, nt);
    m->concurrency = sum_latency / d;
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

/* "usage", "retokenized", "mixed" or "none". */
static const char *bench_metrics_output_source(const struct bench_metrics *m) {
    if (m->n_usage && m->n_retokenized) return "mixed";
    if (m->n_usage) return "usage";
    if (m->n_retokenized) return "retokenized";
    return "none";
}

/* Python's repr of a float (shortest text that reads back the same), so
 * "Traffic request rate:" prints as bench_serving prints it. */
static void float_repr(char *out, size_t cap, double v) {
    if (isinf(v)) {
        snprintf(out, cap, "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!strpbrk(out, ".en")) strncat(out, ".0", cap - strlen(out) - 1);
}

/* A title centred in a 50-column rule, as Python's "{:c^50}" does. */
static void rule(FILE *f, const char *title, char c) {
    int len = (int)strlen(title), fill = 50 - len, left = fill / 2, right = fill - left;
    for (int i = 0; i < left; i++) fputc(c, f);
    fputs(title, f);
    for (int i = 0; i < right; i++) fputc(c, f);
    fputc('\n', f);
}

static void row_s(FILE *f, const char *k, const char *v) { fprintf(f, "%-40s %-10s\n", k, v); }
static void row_l(FILE *f, const char *k, long v) { fprintf(f, "%-40s %-10ld\n", k, v); }
static void row_f(FILE *f, const char *k, double v) { fprintf(f, "%-40s %-10.2f\n", k, v); }

/* Distinct messages, first ones first. */
static int first_errors(const struct bench_run *run, const char **out, int max) {
    int k = 0;
    for (int i = 0; i < run->n && k < max; i++) {
        const char *e = run->results[i].success ? NULL : run->results[i].error;
        if (!e) continue;
        int dup = 0;
        for (int j = 0; j < k && !dup; j++) dup = !strcmp(out[j], e);
        if (!dup) out[k++] = e;
    }
    return k;
}

void bench_metrics_print(FILE *f, const struct bench_metrics *m, const struct bench_run *run) {
    const struct bench_options *o = run->opt;
    char buf[64];
    fputc('\n', f);
    rule(f, " Serving Benchmark Result ", '=');
    row_s(f, "Backend:", o->backend);
    float_repr(buf, sizeof buf, o->request_rate);
    row_s(f, "Traffic request rate:", buf);
    if (o->max_concurrency) row_l(f, "Max request concurrency:", o->max_concurrency);
    else row_s(f, "Max request concurrency:", "not set");
    row_l(f, "Successful requests:", m->completed);
    row_l(f, "Failed requests:", m->failed);
    row_f(f, "Benchmark duration (s):", m->duration);
    row_l(f, "Total input tokens:", m->total_input);
    row_l(f, "Total generated tokens:", m->total_output);
    row_l(f, "Total generated tokens (retokenized):", m->total_output_retokenized);
    row_s(f, "Generated tokens counted from:", bench_metrics_output_source(m));
    row_f(f, "Request throughput (req/s):", m->request_throughput);
    row_f(f, "Input token throughput (tok/s):", m->input_throughput);
    row_f(f, "Output token throughput (tok/s):", m->output_throughput);
    row_f(f, "Total token throughput (tok/s):", m->total_throughput);
    if (o->dataset == BENCH_DATASET_SCORE) row_f(f, "Item throughput (items/s):", m->item_throughput);
    row_f(f, "Concurrency:", m->concurrency);
    rule(f, "End-to-End Latency", '-');
    row_f(f, "Mean E2E Latency (ms):", m->e2e_ms.mean);
    row_f(f, "Median E2E Latency (ms):", m->e2e_ms.median);
    row_f(f, "P90 E2E Latency (ms):", m->e2e_ms.p90);
    row_f(f, "P99 E2E Latency (ms):", m->e2e_ms.p99);
    rule(f, "Time to First Token", '-');
    row_f(f, "Mean TTFT (ms):", m->ttft_ms.mean);
    row_f(f, "Median TTFT (ms):", m->ttft_ms.median);
    row_f(f, "P99 TTFT (ms):", m->ttft_ms.p99);
    rule(f, "Time per Output Token (excl. 1st token)", '-');
    row_f(f, "Mean TPOT (ms):", m->tpot_ms.mean);
    row_f(f, "Median TPOT (ms):", m->tpot_ms.median);
    row_f(f, "P99 TPOT (ms):", m->tpot_ms.p99);
    rule(f, "Inter-Token Latency", '-');
    row_f(f, "Mean ITL (ms):", m->itl_ms.mean);
    row_f(f, "Median ITL (ms):", m->itl_ms.median);
    row_f(f, "P95 ITL (ms):", m->itl_ms.p95);
    row_f(f, "P99 ITL (ms):", m->itl_ms.p99);
    row_f(f, "Max ITL (ms):", m->itl_ms.max);
    for (int i = 0; i < 50; i++) fputc('=', f);
    fputc('\n', f);
    const char *errs[FIRST_ERRORS];
    int ne = first_errors(run, errs, FIRST_ERRORS);
    if (ne) {
        fprintf(f, "First errors (%d failed):\n", m->failed);
        for (int i = 0; i < ne; i++) fprintf(f, "  %s\n", errs[i]);
    }
}

/* A JSON string even from bytes that are not valid UTF-8 (a cut server
 * message, a model emitting broken text): such bytes become U+FFFD. */
static json_t *safe_string(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    struct buf b = {0};
    utf8_lossy_append(&b, s, n, 1);
    j = json_stringn(b.data, b.len);
    buf_free(&b);
    return j;
}

static void set_stat(json_t *j, const char *name, const struct bench_stat *s, int itl) {
    char key[64];
    snprintf(key, sizeof key, "mean_%s", name);
    json_object_set_new(j, key, json_real(s->mean));
    snprintf(key, sizeof key, "median_%s", name);
    json_object_set_new(j, key, json_real(s->median));
    snprintf(key, sizeof key, "std_%s", name);
    json_object_set_new(j, key, json_real(s->std));
    snprintf(key, sizeof key, "p90_%s", name);
    json_object_set_new(j, key, json_real(s->p90));
    if (itl) {
        snprintf(key, sizeof key, "p95_%s", name);
        json_object_set_new(j, key, json_real(s->p95));
    }
    snprintf(key, sizeof key, "p99_%s", name);
    json_object_set_new(j, key, json_real(s->p99));
    if (itl) {
        snprintf(key, sizeof key, "max_%s", name);
        json_object_set_new(j, key, json_real(s->max));
    }
}

static json_t *details(const struct bench_run *run) {
    json_t *in = json_array(), *out = json_array(), *ttft = json_array(), *itls = json_array();
    json_t *texts = json_array(), *errors = json_array();
    for (int i = 0; i < run->n; i++) {
        const struct bench_result *r = &run->results[i];
        json_array_append_new(in, json_integer(run->prompts[i].prompt_len));
        json_array_append_new(out, json_integer(r->success ? r->output_len : 0));
        json_array_append_new(ttft, json_real(r->success ? r->ttft : 0));
        json_t *one = json_array();
        for (int k = 0; k < r->n_itl; k++) json_array_append_new(one, json_real(r->itl[k]));
        json_array_append_new(itls, one);
        json_array_append_new(texts, safe_string(r->text.data ? r->text.data : "", r->text.len));
        const char *e = r->success || !r->error ? "" : r->error;
        json_array_append_new(errors, safe_string(e, strlen(e)));
    }
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "input_lens", in, "output_lens", out, "ttfts", ttft, "itls",
                     itls, "generated_texts", texts, "errors", errors);
}

int bench_metrics_write_json(const char *path, const struct bench_metrics *m, const struct bench_run *run,
                             struct kiln_error *err) {
    const struct bench_options *o = run->opt;
    json_t *j = json_object();
    json_object_set_new(j, "backend", json_string(o->backend));
    json_object_set_new(j, "dataset_name", json_string(o->dataset_name));
    /* JSON has no infinity (Python writes a bare Infinity, which strict
     * parsers reject): an unlimited rate is the string "inf". */
    json_object_set_new(j, "request_rate", isinf(o->request_rate) ? json_string("inf") : json_real(o->request_rate));
    json_object_set_new(j, "max_concurrency", o->max_concurrency ? json_integer(o->max_concurrency) : json_null());
    json_object_set_new(j, "num_prompts", json_integer(run->n));
    json_object_set_new(j, "sharegpt_output_len",
                        o->sharegpt_output_len ? json_integer(o->sharegpt_output_len) : json_null());
    json_object_set_new(j, "random_input_len", json_integer(o->random_input_len));
    json_object_set_new(j, "random_output_len", json_integer(o->random_output_len));
    json_object_set_new(j, "random_range_ratio", json_real(o->random_range_ratio));
    json_object_set_new(j, "duration", json_real(m->duration));
    json_object_set_new(j, "completed", json_integer(m->completed));
    json_object_set_new(j, "failed", json_integer(m->failed));
    json_object_set_new(j, "total_input_tokens", json_integer(m->total_input));
    /* The server's own prompt count: equal to total_input_tokens when it
     * tokenizes as the client did (null when it reports none). */
    json_object_set_new(j, "total_input_tokens_server",
                        m->n_input_server == m->completed && m->completed ? json_integer(m->total_input_server)
                                                                          : json_null());
    json_object_set_new(j, "total_output_tokens", json_integer(m->total_output));
    json_object_set_new(j, "total_output_tokens_retokenized", json_integer(m->total_output_retokenized));
    json_object_set_new(j, "output_tokens_source", json_string(bench_metrics_output_source(m)));
    json_object_set_new(j, "request_throughput", json_real(m->request_throughput));
    json_object_set_new(j, "input_throughput", json_real(m->input_throughput));
    json_object_set_new(j, "output_throughput", json_real(m->output_throughput));
    json_object_set_new(j, "output_throughput_retokenized", json_real(m->output_throughput_retokenized));
    json_object_set_new(j, "total_throughput", json_real(m->total_throughput));
    if (o->dataset == BENCH_DATASET_SCORE) {
        json_object_set_new(j, "total_items", json_integer(m->total_items));
        json_object_set_new(j, "item_throughput", json_real(m->item_throughput));
    }
    set_stat(j, "e2e_latency_ms", &m->e2e_ms, 0);
    set_stat(j, "ttft_ms", &m->ttft_ms, 0);
    set_stat(j, "tpot_ms", &m->tpot_ms, 0);
    set_stat(j, "itl_ms", &m->itl_ms, 1);
    json_object_set_new(j, "concurrency", json_real(m->concurrency));
    const char *errs[FIRST_ERRORS];
    int ne = first_errors(run, errs, FIRST_ERRORS);
    json_t *fe = json_array();
    for (int i = 0; i < ne; i++) json_array_append_new(fe, safe_string(errs[i], strlen(errs[i])));
    json_object_set_new(j, "first_errors", fe);
    if (o->output_details) json_object_update_new(j, details(run));
    char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(j);
    KILN_ASSERT(line);
    FILE *f = fopen(path, "a");
    if (!f) {
        free(line);
        return kiln_errorf(err, "--output-file %s: cannot open for appending", path);
    }
    int bad = fprintf(f, "%s\n", line) < 0;
    bad |= fclose(f) != 0;
    free(line);
    if (bad) return kiln_errorf(err, "--output-file %s: write failed", path);
    return 0;
}
