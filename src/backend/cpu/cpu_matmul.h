/* cpu_matmul.h — matrix products of fp32 activations with weights that stay
 * in their checkpoint dtype (BF16, F16 or F32) in memory.
 *
 *   y[i][j] = sum_k x[i][k] * w[j][k]  (+ bias[j] when bias != NULL)
 *   x: fp32 [n][k], row stride ldx (floats)
 *   w: [m][k] of dtype wt, rows contiguous (row stride k elements)
 *   y: fp32 [n][m], row stride ldy (floats)
 *
 * Weights are widened to fp32 in registers, never converted at load: decode
 * is bound by memory bandwidth and bf16 halves the bytes read.
 *
 * Invariance contract (the scheduler relies on it): every y[i][j] is
 * computed with the same sequence of floating-point operations whatever n,
 * the row's position in the batch and the number of threads are. Work is
 * split across threads over outputs only, never over k.
 */
#ifndef KILN_BACKEND_CPU_MATMUL_H
#define KILN_BACKEND_CPU_MATMUL_H

#include "tensor/dtype.h"

struct threadpool;

void cpu_matmul(struct threadpool *tp, float *y, long ldy, const float *x, long ldx, const void *w,
                enum dtype wt, const float *bias, long n, long m, long k);

/* The same product through the portable (non-SIMD) kernel that machines
 * without AVX2/FMA/F16C get; for tests and comparisons. Its results may
 * differ in the last bits from cpu_matmul's SIMD kernel but obey the same
 * invariance contract. tp may be NULL (caller's thread only), here and in
 * cpu_matmul. */
void cpu_matmul_portable(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                         const void *w, enum dtype wt, const float *bias, long n, long m, long k);

#endif
