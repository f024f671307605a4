/* bench_gemv.c — matrix products at decode sizes (n = 1..8 rows and a few
 * larger batches) on Llama-3.1-8B's shapes, as weight bytes read per second
 * beside the device copy bandwidth measured in the same run. Each shape
 * rotates over enough copies of its weight (≥ 512 MB) that the L2 cache
 * cannot hold them. Device-agnostic (backend ops), meant for --device cuda.
 *
 *   bench_gemv [--device cuda] [--rows N] [--cols N] [--n N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "bench_util.h"
#include "tensor/backend.h"

static double run(struct backend *be, long rows, long cols, long n, double bw) {
    const struct backend_ops *ops = be->ops;
    size_t wbytes = (size_t)rows * (size_t)cols * 2;
    int copies = (int)(((size_t)512 << 20) / wbytes) + 1;
    if (copies < 2) copies = 2;
    uint16_t *h = xmalloc(wbytes);
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)rows;
    for (size_t i = 0; i < wbytes / 2; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        h[i] = (uint16_t)(0x3c00 | (r & 0x3ff)) ^ (uint16_t)((r >> 20) & 0x8000); /* ±[0.0078, 0.0156) */
    }
    struct backend_weight *w = xmalloc((size_t)copies * sizeof *w);
    for (int c = 0; c < copies; c++) {
        w[c] = (struct backend_weight){ops->weight_upload(be->ctx, h, wbytes), DTYPE_BF16, rows, cols};
        if (!w[c].data) {
            fprintf(stderr, "out of device memory\n");
            exit(1);
        }
    }
    free(h);
    float *x = ops->alloc(be->ctx, (size_t)n * cols * 4), *y = ops->alloc(be->ctx, (size_t)n * rows * 4);
    float *xh = xmalloc((size_t)n * cols * 4);
    for (long i = 0; i < n * cols; i++) xh[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    ops->upload(be->ctx, x, xh, (size_t)n * cols * 4);
    for (int c = 0; c < copies; c++) ops->matmul(be->ctx, y, rows, x, cols, &w[c], NULL, n);
    ops->synchronize(be->ctx);
    int reps = (int)(4e9 / (double)wbytes) + copies;
    double t0 = time_now();
    for (int i = 0; i < reps; i++) ops->matmul(be->ctx, y, rows, x, cols, &w[i % copies], NULL, n);
    ops->synchronize(be->ctx);
    double t = (time_now() - t0) / reps;
    double gbs = (double)wbytes / t;
    printf("  %6ld x %-6ld n=%-3ld %8.2f us  %7.1f GB/s  %5.1f%% of copy bandwidth\n", rows, cols, n,
           t * 1e6, gbs / 1e9, 100.0 * gbs / bw);
    for (int c = 0; c < copies; c++) ops->weight_release(be->ctx, w[c].data);
    ops->free(be->ctx, x), ops->free(be->ctx, y);
    free(w), free(xh);
    return gbs;
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    long rows = 0, cols = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--rows")) rows = atol(v), i++;
        else if (!strcmp(a, "--cols")) cols = atol(v), i++;
        else if (!strcmp(a, "--n")) n = atol(v), i++;
        else {
            fprintf(stderr, "usage: bench_gemv [--device cuda] [--rows N --cols N] [--n N]\n");
            return 2;
        }
    }
    struct kiln_error err = {{0}};
    struct backend be;
    struct backend_options bo = {0};
    if (backend_create(&be, device, &bo, &err) ||
        be.ops->reserve(be.ctx, 256, 4096, 64, &err)) {
        fprintf(stderr, "bench_gemv: %s\n", err.msg);
        return 1;
    }
    double bw = copy_bandwidth(&be);
    printf("device %s: copy bandwidth %.1f GB/s (read + write)\n", device, bw / 1e9);
    /* Llama-3.1-8B: q|k|v, o, gate|up, down, lm_head */
    const long shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336},
                              {128256, 4096}};
    const long ns[] = {1, 2, 4, 8, 16, 64};
    double sum = 0, bytes = 0;
    for (int s = 0; s < 5; s++) {
        if (rows && (rows != shapes[s][0] || cols != shapes[s][1])) continue;
        for (int j = 0; j < 6; j++) {
            if (n && ns[j] != n) continue;
            double g = run(&be, shapes[s][0], shapes[s][1], ns[j], bw);
            if (ns[j] == 1) sum += (double)shapes[s][0] * shapes[s][1] * 2 / g, bytes += (double)shapes[s][0] * shapes[s][1] * 2;
        }
    }
    if (rows && cols && sum == 0) run(&be, rows, cols, n ? n : 1, bw);
    if (sum > 0)
        printf("n=1 over the five shapes: %.1f GB/s, %.1f%% of copy bandwidth\n", bytes / sum / 1e9,
               100.0 * bytes / sum / bw);
    backend_destroy(&be);
    return 0;
}
