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
 *
 * The bf16 mode (cpu_matmul_bf16, BF16 weights) fixes another sequence:
 *
 *   xh[i] = bf16(x[i])  (to nearest even, subnormals to zero), k padded to
 *           a multiple of 32 with zeros, once per product
 *   acc[0..15] = 0
 *   for each block of 32 k-indices kb (w's tail read as zeros):
 *       acc[l] = acc[l] + xh[kb+2l+1] * w[kb+2l+1]        l = 0..15
 *       acc[l] = acc[l] + xh[kb+2l]   * w[kb+2l]
 *   t[l] = acc[l] + acc[l+8]; t[l] = t[l] + t[l+4]; t[l] = t[l] + t[l+2]
 *   y[i][j] = t[0] + t[1]  (+ bias[j])
 *
 * This is vdpbf16ps's own order (odd element first, each addition rounded
 * to fp32), so the AVX512-BF16 kernel is one instruction per block. A
 * bf16 x bf16 product is exact in fp32, so a multiply-add, fused or not,
 * performs each step bit for bit: the AVX2 and portable kernels give the
 * same results, except that vdpbf16ps takes subnormal inputs and partial
 * sums as zero.
 */
#ifndef KILN_BACKEND_CPU_MATMUL_KERNELS_H
#define KILN_BACKEND_CPU_MATMUL_KERNELS_H

#include <stdint.h>

#include "tensor/dtype.h"

struct cpu_matmul_job {
    float *y;          /* [n][ldy] */
    long ldy;
    const float *x;    /* [n][ldx] */
    long ldx;
    const void *w;     /* [m][k] of dtype wt */
    enum dtype wt;
    /* DTYPE_F8_E4M3: one fp32 scale per block of block_rows x block_cols,
     * row-major over ceil(m / block_rows) x ceil(k / block_cols) blocks */
    const float *scale;
    long block_rows, block_cols;
    const float *bias; /* [m] or NULL */
    long n, m, k;
    const uint16_t *xh; /* bf16 mode: x rounded, [n][ldxh], zero-padded past k */
    long ldxh;          /* a multiple of 32 */
};

/* Computes outputs j in [j0, j1) for all n rows. */
void cpu_matmul_range_portable(const struct cpu_matmul_job *job, long j0, long j1);
#if defined(__x86_64__)
void cpu_matmul_range_avx2(const struct cpu_matmul_job *job, long j0, long j1);
void cpu_matmul_range_avx512(const struct cpu_matmul_job *job, long j0, long j1);
#endif

/* FP8 weights (DTYPE_F8_E4M3) take the f32 arithmetic on their
 * dequantized values: every kernel widens a w-row into fp32 (each value
 * fp8_e4m3_to_f32(w[r][c]) * scale of its block, rounded once, exactly as
 * torch's q.float() * s) where it would read or pack the row, and runs its
 * F32 tiles on it. The products are bitwise those of F32 weights holding the
 * dequantized values, in every path. cpu_matmul_fp8_row writes row r: the
 * 8-block of k-indices [8b, 8b + 8) at dst + b * bstride, the last one
 * zero-padded; avx2 selects the vector widening (the same values). */
void cpu_matmul_fp8_row(const struct cpu_matmul_job *job, long r, float *dst, long bstride, int avx2);
/* The SIMD kernels' stream tiles widen FP8 rows in registers instead, with
 * a float16 route that gives the same values for every code but NaN and
 * every scale up to 2^100 in magnitude: cpu_matmul_fp8_scales_ok says
 * whether the scales of rows [j0, j1) are, cpu_matmul_fp8_has_nan whether
 * bytes of codes hold a NaN (S.1111.111). Rows that fail go through
 * cpu_matmul_fp8_row. */
int cpu_matmul_fp8_scales_ok(const struct cpu_matmul_job *job, long j0, long j1);
int cpu_matmul_fp8_has_nan(const uint8_t *p, long bytes, int avx2);

/* The bf16 mode's kernels (job->xh set, BF16 weights). */
void cpu_matmul_bf16_range_portable(const struct cpu_matmul_job *job, long j0, long j1);
#if defined(__x86_64__)
void cpu_matmul_bf16_range_avx2(const struct cpu_matmul_job *job, long j0, long j1);
void cpu_matmul_bf16_range_avx512bf16(const struct cpu_matmul_job *job, long j0, long j1);
#endif

/* Rows [i0, i1) of x rounded into job->xh (the bf16 mode's first step). */
void cpu_matmul_bf16_round_rows(const struct cpu_matmul_job *job, long i0, long i1, int avx2);

/* The bf16 mode's loop nest, shared by its kernels: a tile computes
 * y[r][c] = xh[r] . w[c] for r < R, c < cols (C >= cols; a w-row past cols
 * repeats the last real one and its sums are dropped) over len k-indices
 * (a k chunk: a multiple of 32 unless it ends the row). Block b of w-row c
 * starts at w + c * ldw + b * io->wstep: rows as they lie in memory
 * (ldw = k, wstep = 32) or a panel of C rows interleaved by blocks
 * (ldw = 32, wstep = 32 * C). */
struct bf16_tile_io {
    long wstep;
    const float *bias;   /* [cols] or NULL */
    const char *pf;      /* bytes to prefetch into L1 during the tile, or NULL */
    long pf_bytes;
    const float *acc_in; /* raw accumulators [R][C][16] to continue, or NULL */
    float *acc_out;      /* where to leave them, or NULL to reduce into y */
};
typedef void (*bf16_tile_fn)(int R, int C, const uint16_t *x, long ldx, const uint16_t *w, long ldw,
                             long len, int cols, float *y, long ldy, const struct bf16_tile_io *io);
/* Tile shapes: stream_r/c[n] for n <= 8 (decode), pack_r x pack_c above;
 * every tail shape (R from 1 up, the same C) must be instantiated. k
 * longer than kchunk_min is cut into kchunk pieces (a multiple of 32). */
struct bf16_kernel {
    bf16_tile_fn tile;
    unsigned char stream_r[9], stream_c[9];
    int pack_r, pack_c;
    long kchunk_min, kchunk;
};
/* Prefetching io->pf over a tile of nb blocks: each block asks for
 * the next pf_step bytes. */
static inline long bf16_pf_step(const struct bf16_tile_io *io, long nb) {
    return nb > 0 ? (io->pf_bytes + nb - 1) / nb : 0;
}
static inline void bf16_prefetch_block(const struct bf16_tile_io *io, long b, long step) {
    for (long o = b * step & ~63L, end = (b + 1) * step < io->pf_bytes ? (b + 1) * step : io->pf_bytes;
         o < end; o += 64)
        __builtin_prefetch(io->pf + o, 0, 3);
}
void cpu_matmul_bf16_drive(const struct cpu_matmul_job *job, long j0, long j1,
                           const struct bf16_kernel *kern);

#endif
