/* cpu_matmul.h — matrix products of fp32 activations with weights that stay
 * in their checkpoint dtype (BF16, F16, F32 or block-scaled F8_E4M3) in
 * memory.
 *
 *   y[i][j] = sum_k x[i][k] * w[j][k]  (+ bias[j] when bias != NULL)
 *   x: fp32 [n][k], row stride ldx (floats)
 *   w: [m][k] = [w->rows][w->cols] of dtype w->dtype, rows contiguous
 *   y: fp32 [n][m], row stride ldy (floats)
 *
 * Weights are widened to fp32 in registers, never converted at load: decode
 * is bound by memory bandwidth and bf16 halves the bytes read. F8_E4M3
 * weights (struct backend_weight's block scales) are dequantized a few rows
 * at a time into fp32 (each value fp8 * scale, rounded once) and take the
 * F32 arithmetic: the results are bitwise those of F32 weights holding the
 * dequantized values.
 *
 * Invariance contract (the scheduler relies on it): every y[i][j] is
 * computed with the same sequence of floating-point operations whatever n,
 * the row's position in the batch and the number of threads are. Work is
 * split across threads over outputs only, never over k. tp may be NULL
 * (caller's thread only).
 */
#ifndef KILN_BACKEND_CPU_MATMUL_H
#define KILN_BACKEND_CPU_MATMUL_H

#include "tensor/dtype.h"

struct threadpool;
struct backend_weight;

void cpu_matmul(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                const struct backend_weight *w, const float *bias, long n);

/* The bf16 mode (KILN_CPU_MATMUL=bf16), for BF16 weights: each x row is
 * rounded to bf16 (to nearest even, subnormals to zero) once per product,
 * and every y[i][j] is the bf16 x bf16 dot product accumulated in fp32 in
 * a fixed order (cpu_matmul_kernels.h) -- the arithmetic of AVX512-BF16's
 * vdpbf16ps, which computes it where the CPU has it. Same signature and
 * invariance contract as cpu_matmul; other weights go to cpu_matmul.
 * Results agree with cpu_matmul's to about 2^-9 relative per product. */
void cpu_matmul_bf16(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                     const struct backend_weight *w, const float *bias, long n);

/* Kernel families, in order: cpu_matmul (and the CPU attention, which
 * follows its choice) uses the highest one the CPU runs. AVX2 needs
 * AVX2+FMA+F16C; AVX-512 needs AVX-512 F/DQ/BW/VL as well; AVX512-BF16
 * adds vdpbf16ps, which only the bf16 mode uses (cpu_matmul runs the
 * AVX-512 kernels there).
 *
 * cpu_matmul: the AVX-512 kernel's results are bitwise those of the AVX2
 * kernel; the portable kernel's may differ from them in the last bits.
 * cpu_matmul_bf16: the AVX2 and portable kernels give the vdpbf16ps
 * kernel's bits except where a bf16 weight or a partial sum is subnormal
 * (below 2^-126), which vdpbf16ps takes as zero. Each obeys the invariance
 * contract on its own. */
enum cpu_matmul_isa {
    CPU_MATMUL_PORTABLE = 1,
    CPU_MATMUL_AVX2 = 2,
    CPU_MATMUL_AVX512 = 3,
    CPU_MATMUL_AVX512BF16 = 4,
};

/* The family cpu_matmul uses now. */
enum cpu_matmul_isa cpu_matmul_isa(void);
/* "portable", "avx2", "avx512" or "avx512bf16". */
const char *cpu_matmul_isa_name(enum cpu_matmul_isa isa);
/* Caps the family at max (process-wide) and returns the one now used: the
 * lower of max and what the CPU runs. For tests and benchmarks that compare
 * families; call it while no product is running. */
enum cpu_matmul_isa cpu_matmul_cap_isa(enum cpu_matmul_isa max);

#endif
