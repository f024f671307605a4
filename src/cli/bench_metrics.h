/* bench_metrics.h — per-run statistics, the report block and the JSON line,
 * with bench_serving's definitions and names:
 *
 *   TTFT    first content chunk − request start
 *   ITL     gaps between consecutive content chunks (all requests pooled)
 *   TPOT    (latency − TTFT) / (output_len − 1), requests with output_len > 1
 *   E2E     latency: last chunk − request start
 *   concurrency = Σ latency / duration; throughputs = totals / duration
 *
 * Only successful requests enter the statistics and totals; failed ones
 * are counted (Failed requests) and their first messages reported. Medians
 * and percentiles interpolate linearly (numpy's default); std is the
 * population standard deviation; an empty set reads 0, as in
 * bench_serving. output_len is the server's completion_tokens when it sent
 * one, else the re-tokenized text.
 */
#ifndef KILN_CLI_BENCH_METRICS_H
#define KILN_CLI_BENCH_METRICS_H

#include <stdio.h>

#include "cli/bench.h"

struct bench_stat {
    double mean, median, std, p90, p95, p99, max;
};

struct bench_metrics {
    int completed, failed;
    long total_input, total_output, total_output_retokenized;
    long n_usage, n_retokenized; /* how many output counts came from each */
    long total_items;            /* score: items scored */
    long total_input_server;     /* Σ prompt_tokens the server reported */
    int n_input_server;          /* requests that reported it */
    double duration;
    double request_throughput, input_throughput, output_throughput, output_throughput_retokenized;
    double total_throughput, item_throughput;
    struct bench_stat ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double concurrency;
};

/* Results must already carry retok_output_len and output_len. */
void bench_metrics_compute(struct bench_metrics *m, const struct bench_run *run);
void bench_metrics_print(FILE *f, const struct bench_metrics *m, const struct bench_run *run);
/* Appends one JSON line to path. */
int bench_metrics_write_json(const char *path, const struct bench_metrics *m, const struct bench_run *run,
                             struct kiln_error *err);

#endif
