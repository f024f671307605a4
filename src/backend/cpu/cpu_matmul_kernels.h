/* cpu_matmul_kernels.h — private to cpu_matmul*.c: the per-ISA kernels that
 * cpu_matmul() dispatches to, one call per thread over a range of outputs.
 *
 * Every kernel computes each output y[i][j] the same way (this is what makes
 * cpu_matmul invariant to batch size, batch position and thread count):
 *
 *   acc[0..7] = 0
 *   for each block of 8 k-indices kb (the last one zero-padded):
 *       acc[l] = fma(x[i][kb+l], w[j][kb+l], acc[l])     l = 0..7
 *   y[i][j] = ((acc0+acc1) + (acc2+acc3)) + ((acc4+acc5) + (acc6+acc7))
 *   y[i][j] = y[i][j] + bias[j]                            (when bias)
 *
 * Tiling, packing, thread split and how many outputs are reduced together
 * only change which outputs are in flight at once, never this sequence.
 * The AVX-512 kernel performs exactly these operations too (two outputs per
 * 512-bit register), so its results are bitwise those of the AVX2 kernel.
 * The portable kernel follows the same structure with a plain multiply-add
 * (it need not match the AVX2 bits; invariance holds within one kernel).
 */
#ifndef KILN_BACKEND_CPU_MATMUL_KERNELS_H
#define KILN_BACKEND_CPU_MATMUL_KERNELS_H

#include "tensor/dtype.h"

struct cpu_matmul_job {
    float *y;          /* [n][ldy] */
    long ldy;
    const float *x;    /* [n][ldx] */
    long ldx;
    const void *w;     /* [m][k] of dtype wt */
    enum dtype wt;
    const float *bias; /* [m] or NULL */
    long n, m, k;
};

/* Computes outputs j in [j0, j1) for all n rows. */
void cpu_matmul_range_portable(const struct cpu_matmul_job *job, long j0, long j1);
#if defined(__x86_64__)
void cpu_matmul_range_avx2(const struct cpu_matmul_job *job, long j0, long j1);
void cpu_matmul_range_avx512(const struct cpu_matmul_job *job, long j0, long j1);
#endif

#endif
