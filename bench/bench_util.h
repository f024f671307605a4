/* bench_util.h — helpers shared by the bench programs (header-only). */
#ifndef KILN_BENCH_BENCH_UTIL_H
#define KILN_BENCH_BENCH_UTIL_H

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

#endif
