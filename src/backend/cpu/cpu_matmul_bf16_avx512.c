/* cpu_matmul_bf16_avx512.c — the bf16 mode on AVX512-BF16: one vdpbf16ps
 * per output and 32-block.
 *
 * vdpbf16ps acc, a, b computes, in each of 16 fp32 lanes l,
 * acc += a[2l+1]*b[2l+1], then acc += a[2l]*b[2l], each addition rounded
 * (subnormal inputs and results as zero): exactly the lane step of the bf16
 * arithmetic in cpu_matmul_kernels.h when a is a 32-block of a rounded x
 * row and b the same block of a w row. So a zmm accumulator per output runs
 * over k with one instruction per block, at twice the multiply-adds of an
 * fp32 FMA, and w's bf16 rows are loaded as they lie in memory.
 *
 * A tile of R x-rows by C w-rows holds R*C accumulators (up to 24, with R
 * x vectors and one w vector: at most 29 of the 32 registers). At the end
 * the accumulators of one x-row are reduced together by a transposing tree
 * whose every level adds, for each output, the lanes the halving tree of
 * cpu_matmul_kernels.h adds; outputs never mix, so an output's sum does not
 * depend on its companions (missing ones are zeros).
 *
 * Compiled per function with target attributes; the caller checks the CPU.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/cpu_matmul_kernels.h"
#include "base/error.h"

#define KILN_DP_TARGET "avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma"
#define KILN_DP_INLINE static inline __attribute__((always_inline, target(KILN_DP_TARGET)))







enum { DP_RMAX = 6, DP_CMAX = 8 };

/* Level 1 for outputs a, b: [a.t1 | b.t1], t1[l] = lane l + lane l+8. */
KILN_DP_INLINE __m512 halve_pair(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}

/* The sums of 8 accumulators, output c in lane c: the halving tree of
 * each, computed 8 outputs at a time. */
KILN_DP_INLINE __m256 reduce8(const __m512 *a) {
    const __m512 b0 = halve_pair(a[0], a[1]), b1 = halve_pair(a[2], a[3]);
    const __m512 b2 = halve_pair(a[4], a[5]), b3 = halve_pair(a[6], a[7]);
    /* level 2: one 128-bit chunk per output, t2[l] = t1[l] + t1[l+4] */
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xdd));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b2, b3, 0x88), _mm512_shuffle_f32x4(b2, b3, 0xdd));
    /* level 3: chunk q holds outputs q and 4+q, t3[l] = t2[l] + t2[l+2] */
    const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c0, c1, 0x44), _mm512_shuffle_ps(c0, c1, 0xee));
    /* level 4: t3[0] + t3[1]; chunk q lanes 0, 1 = outputs q, 4+q */
    const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d, d, 0x88), _mm512_shuffle_ps(d, d, 0xdd));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, e));
}

KILN_DP_INLINE __m512bh load_bh(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

KILN_DP_INLINE __m512bh load_bh_tail(const uint16_t *p, long cnt) {
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1ull << cnt) - 1), p);
}

KILN_DP_INLINE void dp_tile(const int R, const int C, const uint16_t *x, long ldx, const uint16_t *w,
                            long ldw, long len, int cols, float *y, long ldy,
                            const struct bf16_tile_io *io) {
    long wo[DP_CMAX];
    for (int c = 0; c < C; c++) wo[c] = (c < cols ? c : cols - 1) * ldw;
    __m512 acc[DP_RMAX][DP_CMAX];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = io->acc_in ? _mm512_loadu_ps(io->acc_in + (r * C + c) * 16) : _mm512_setzero_ps();
    const long full = len / 32, nb = (len + 31) / 32, wstep = io->wstep, pf_step = bf16_pf_step(io, nb);
    const uint16_t *wb = w;
    for (long b = 0; b < full; b++, wb += wstep) {
        if (io->pf) bf16_prefetch_block(io, b, pf_step);
        __m512bh xv[DP_RMAX];
        for (int r = 0; r < R; r++) xv[r] = load_bh(x + r * ldx + b * 32);
        for (int c = 0; c < C; c++) {
            const __m512bh wv = load_bh(wb + wo[c]);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
        }
    }
    if (full < nb) { /* the masked lanes read nothing, so w's end is never passed */
        const long t = len - full * 32;
        __m512bh xv[DP_RMAX];
        for (int r = 0; r < R; r++) xv[r] = load_bh_tail(x + r * ldx + full * 32, t);
        for (int c = 0; c < C; c++) {
            const __m512bh wv = load_bh_tail(wb + wo[c], t);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
        }
    }
    if (io->acc_out) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) _mm512_storeu_ps(io->acc_out + (r * C + c) * 16, acc[r][c]);
        return;
    }
    const __mmask8 keep = (__mmask8)((1u << cols) - 1);
    for (int r = 0; r < R; r++) {
        __m512 a[8];
        for (int c = 0; c < 8; c++) a[c] = c < C ? acc[r][c] : _mm512_setzero_ps();
        __m256 s = reduce8(a);
        if (io->bias) s = _mm256_add_ps(s, _mm256_maskz_loadu_ps(keep, io->bias));
        _mm256_mask_storeu_ps(y + r * ldy, keep, s);
    }
}

static __attribute__((target(KILN_DP_TARGET), noinline)) void dp_tile_any(
    int R, int C, const uint16_t *x, long ldx, const uint16_t *w, long ldw, long len, int cols, float *y,
    long ldy, const struct bf16_tile_io *io) {
    switch (R * 16 + C) {
    case 0x18: dp_tile(1, 8, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x28: dp_tile(2, 8, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x38: dp_tile(3, 8, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x16: dp_tile(1, 6, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x26: dp_tile(2, 6, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x36: dp_tile(3, 6, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x46: dp_tile(4, 6, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x14: dp_tile(1, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x24: dp_tile(2, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x34: dp_tile(3, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x44: dp_tile(4, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x54: dp_tile(5, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x64: dp_tile(6, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x15: dp_tile(1, 5, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x25: dp_tile(2, 5, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x35: dp_tile(3, 5, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x45: dp_tile(4, 5, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x55: dp_tile(5, 5, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    default: KILN_ASSERT_MSG(0, "cpu_matmul_bf16: tile shape not instantiated");
    }
}

static const struct bf16_kernel kDp = {
    .tile = dp_tile_any,
    .stream_r = {0, 1, 2, 3, 4, 4, 4, 4, 4},
    .stream_c = {0, 8, 8, 8, 6, 6, 6, 6, 6},
    .pack_r = 4,
    .pack_c = 6,
    /* a panel of 6 rows of 2048 bf16 (24 KiB) stays in the 48 KiB L1 */
    .kchunk_min = 2048,
    .kchunk = 1024,
};

void cpu_matmul_bf16_range_avx512bf16(const struct cpu_matmul_job *job, long j0, long j1) {
    cpu_matmul_bf16_drive(job, j0, j1, &kDp);
}

#endif
