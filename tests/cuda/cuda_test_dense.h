/* cuda_test_dense.h — helpers of the product tests that check raw device
 * buffers against a double reference (test_matmul_wgmma, test_wgmma_fp8):
 * a device copy of host bytes, outputs poisoned with NaN and padded with a
 * sentinel, and the relative error that fails on either. Include after
 * cmocka.h. */
#ifndef KILN_TESTS_CUDA_TEST_DENSE_H
#define KILN_TESTS_CUDA_TEST_DENSE_H

#include <math.h>
#include <stddef.h>

#include <cuda_runtime.h>

#include "base/mem.h"

#define SENTINEL 7777.0f

static void *dev_from(const void *h, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* [m][ldy]: NaN in the first N columns, the sentinel after them */
static float *poisoned(long m, long N, long ldy) {
    float *y = xmalloc((size_t)(m * ldy) * 4);
    for (long i = 0; i < m; i++)
        for (long j = 0; j < ldy; j++) y[i * ldy + j] = j < N ? NAN : SENTINEL;
    return y;
}

/* ‖y − ref‖ / ‖ref‖ over [m][N] of y (stride ldy), failing on NaN or a
 * changed sentinel in the padding columns. */
static double rel_err(const float *y, const double *ref, long m, long N, long ldy) {
    double num = 0, den = 0;
    for (long i = 0; i < m; i++) {
        for (long j = 0; j < N; j++) {
            double g = y[i * ldy + j], r = ref[i * N + j];
            if (isnan(g)) fail_msg("NaN at row %ld col %ld (unwritten?)", i, j);
            num += (g - r) * (g - r), den += r * r;
        }
        for (long j = N; j < ldy; j++)
            if (y[i * ldy + j] != SENTINEL) fail_msg("row %ld col %ld (padding) overwritten", i, j);
    }
    return sqrt(num / (den > 0 ? den : 1));
}

#endif
