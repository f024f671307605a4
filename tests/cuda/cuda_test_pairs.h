/* cuda_test_pairs.h — what the GPU op tests share: a CPU and a CUDA
 * backend, buffers and weights held on both (the CPU copy is plain host
 * memory), and the comparison of a device result with the CPU's.
 * Included by one test file each (static definitions), after <cmocka.h>. */
#ifndef KILN_TESTS_CUDA_TEST_PAIRS_H
#define KILN_TESTS_CUDA_TEST_PAIRS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_rng.h"

static struct backend cpu, gpu;
static int have_gpu;

static int irand(int n) { return (int)(rng_next() % (uint64_t)n); }

static float *rand_floats(size_t n, float scale) {
    float *v = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) v[i] = frand(scale);
    return v;
}

/* One buffer on both backends. The CPU copy is plain host memory. */
struct pair {
    float *h; /* host copy: CPU backend input/output */
    void *d;  /* device copy */
    size_t bytes;
};

static struct pair pair_from(const void *host, size_t bytes) {
    struct pair p = {xmalloc(bytes + 4), gpu.ops->alloc(gpu.ctx, bytes), bytes};
    assert_non_null(p.d);
    memcpy(p.h, host, bytes);
    gpu.ops->upload(gpu.ctx, p.d, host, bytes);
    /* tests run other contexts (streams) on these buffers: the copy first */
    gpu.ops->synchronize(gpu.ctx);
    return p;
}

static struct pair pair_rand(size_t n, float scale) {
    float *v = rand_floats(n, scale);
    struct pair p = pair_from(v, n * 4);
    free(v);
    return p;
}

/* Output buffer, NaN on both sides. */
static struct pair pair_poison(size_t n) {
    float *v = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) v[i] = NAN;
    struct pair p = pair_from(v, n * 4);
    free(v);
    return p;
}

static void pair_free(struct pair *p) {
    free(p->h);
    gpu.ops->free(gpu.ctx, p->d);
}

/* ‖gpu − cpu‖ / ‖cpu‖ over the first n floats (compared with stride: rows
 * of `width` inside rows of `ld`, so padding that neither side writes is
 * skipped). NaN anywhere fails. */
static double rel_err(const struct pair *p, long rows, long width, long ld) {
    float *g = xmalloc(p->bytes + 4);
    gpu.ops->download(gpu.ctx, g, p->d, p->bytes);
    double num = 0, den = 0;
    for (long r = 0; r < rows; r++)
        for (long k = 0; k < width; k++) {
            double a = g[r * ld + k], b = p->h[r * ld + k];
            if (isnan(a) || isnan(b)) {
                free(g);
                fail_msg("NaN at row %ld col %ld (gpu %g cpu %g)", r, k, a, b);
            }
            num += (a - b) * (a - b);
            den += b * b;
        }
    free(g);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define expect_close(p, rows, width, ld, tol)                                            \
    do {                                                                                 \
        double e_ = rel_err((p), (rows), (width), (ld));                                 \
        if (!(e_ <= (tol))) fail_msg("relative error %.3g above %.3g", e_, (double)(tol)); \
        printf("  %-40s rel err %.3g (tol %.0e)\n", #p, e_, (double)(tol));             \
    } while (0)

#define SKIP_WITHOUT_GPU()  \
    do {                    \
        if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)"); \
    } while (0)

/* A weight on both backends. */
struct wpair {
    struct backend_weight c, g;
    void *host;
};

static struct wpair weight_rand(enum dtype dt, long rows, long cols, float scale) {
    size_t n = (size_t)rows * (size_t)cols, es = dtype_size(dt);
    unsigned char *h = xaligned_alloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float v = frand(scale);
        if (dt == DTYPE_BF16) ((uint16_t *)h)[i] = f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)h)[i] = f32_to_f16(v);
        else ((float *)h)[i] = v;
    }
    struct wpair w = {{.data = cpu.ops->weight_upload(cpu.ctx, h, n * es), .dtype = dt, .rows = rows, .cols = cols},
                      {.data = gpu.ops->weight_upload(gpu.ctx, h, n * es), .dtype = dt, .rows = rows, .cols = cols}, h};
    assert_non_null(w.g.data);
    return w;
}

static void weight_free(struct wpair *w) {
    gpu.ops->weight_release(gpu.ctx, w->g.data);
    free(w->host);
}

#endif
