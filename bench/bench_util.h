/* bench_util.h — helpers shared by the bench programs (header-only). */
#ifndef KILN_BENCH_BENCH_UTIL_H
#define KILN_BENCH_BENCH_UTIL_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mem.h"
#include "tensor/backend.h"

/* Device-to-device copy bandwidth (bytes read + written per second), through
 * the backend's copy_rows: the ceiling decode is measured against. */
static inline double copy_bandwidth(struct backend *be) {
    const struct backend_ops *ops = be->ops;
    size_t bytes = (size_t)512 << 20;
    void *a = NULL, *b = NULL;
    while (bytes >= ((size_t)16 << 20)) {
        a = ops->alloc(be->ctx, bytes);
        b = a ? ops->alloc(be->ctx, bytes) : NULL;
        if (a && b) break;
        if (a) ops->free(be->ctx, a);
        a = b = NULL;
        bytes /= 2;
    }
    if (!a) return 0;
    long width = 1 << 18, rows = (long)(bytes / 4 / (size_t)width);
    for (int i = 0; i < 2; i++) ops->copy_rows(be->ctx, b, width, a, width, rows, width);
    ops->synchronize(be->ctx);
    int reps = 10;
    double t0 = time_now();
    for (int i = 0; i < reps; i++)
        ops->copy_rows(be->ctx, i & 1 ? a : b, width, i & 1 ? b : a, width, rows, width);
    ops->synchronize(be->ctx);
    double t = time_now() - t0;
    ops->free(be->ctx, a);
    ops->free(be->ctx, b);
    return 2.0 * (double)rows * width * 4 * reps / t;
}

struct read_bw_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *read_bw_thread(void *arg) {
    struct read_bw_job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* Host memory read bandwidth with n_threads (0 = one per CPU) streaming a
 * 1 GiB buffer: the ceiling CPU decode (which reads every weight once per
 * step) is measured against. Best of 3 passes, bytes read per second. */
static inline double host_read_bandwidth(int n_threads) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads > 64) n_threads = 64;
    size_t bytes = (size_t)1 << 30, words = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9e3779b97f4a7c15ull; /* never zeros */
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        pthread_t th[64];
        struct read_bw_job jobs[64];
        double t0 = time_now();
        for (int t = 0; t < n_threads; t++) {
            jobs[t] = (struct read_bw_job){buf + words / n_threads * t, words / n_threads, 0};
            pthread_create(&th[t], NULL, read_bw_thread, &jobs[t]);
        }
        uint64_t sum = 0;
        for (int t = 0; t < n_threads; t++) {
            pthread_join(th[t], NULL);
            sum += jobs[t].sum;
        }
        double t = time_now() - t0;
        if (sum == 42) t *= 1.0; /* keep the sum alive */
        if (bytes / t > best) best = (double)bytes / t;
    }
    free(buf);
    return best;
}

#endif
