/* cpu_matmul_avx512.c — AVX-512 kernels for cpu_matmul, bitwise equal to the
 * AVX2 kernels.
 *
 * The arithmetic is the 8-lane one of cpu_matmul_kernels.h. A 512-bit
 * register holds the 8-lane accumulators of two outputs side by side: the
 * low half belongs to w-row c, the high half to w-row c+1, and the x block
 * x[i][kb..kb+8) is broadcast into both halves. One 16-lane FMA therefore
 * performs, lane for lane, the FMAs the AVX2 kernel performs for those two
 * outputs, and the final reduction runs the AVX2 tree on each half. Results
 * match the AVX2 kernels to the bit, so the AVX-512 path keeps every
 * invariance and accuracy property of the AVX2 one and the choice of ISA
 * never changes a logit; the gain is twice the FMA width and 32 registers
 * (tiles of up to 2 x 12, 4 x 8 or 6 x 8 outputs).
 *
 * A native 16-lane accumulator (blocks of 16 k-elements) or AVX512-BF16's
 * vdpbf16ps would be other arithmetic: the first changes the sums' rounding
 * relative to the AVX2 path, the second rounds the fp32 activations to bf16
 * (a relative error of 2^-9 per product, far outside the oracle tolerance).
 *
 * Two ways to feed a tile, as in the AVX2 file:
 *  - stream (small n): w is read in its checkpoint dtype and widened in
 *    registers; rows c and c+1 are loaded into the two halves.
 *  - packed (large n): 8 w-rows are widened once into an fp32 panel whose
 *    pairs of rows are interleaved in 8-blocks, so one aligned 64-byte load
 *    feeds a pair.
 * FP8 weights (cpu_matmul_kernels.h) stream through tile_fp8, which widens
 * and scales them in registers to the values cpu_matmul_fp8_row gives, and
 * are dequantized into the panel when packed: the F32 arithmetic on the
 * dequantized values either way.
 *
 * Compiled per function with target attributes; the caller checks the CPU.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_kernels.h"
#include "base/error.h"
#include "base/mem.h"

#define KILN_AVX512_TARGET "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c"
#define KILN_AVX512 __attribute__((target(KILN_AVX512_TARGET)))
#define KILN_AVX512_INLINE static inline __attribute__((always_inline, target(KILN_AVX512_TARGET)))

/* WK_PANEL: fp32 pairs interleaved by 8-blocks (packed mode). WK_FP8:
 * block-scaled e4m3 rows, widened and scaled in registers (stream mode). */
enum wkind { WK_F32, WK_F16, WK_BF16, WK_PANEL, WK_FP8 };

enum {
    /* Largest number of register pairs (2 outputs each) in a tile row. */
    TILE_PMAX = 6,
    TILE_RMAX = 6,
    /* n up to this streams w from its own dtype; above, w is packed. */
    STREAM_MAX_N = 8,
    /* Packed tile: 6 x-rows by 4 pairs = 24 accumulators + 4 w + 1 x. */
    PACK_R = 6,
    PACK_P = 4,
    PACK_C = 2 * PACK_P,
    XBLOCK_BYTES = 1024 * 1024,
    XBLOCK_MIN_ROWS = 2 * PACK_R,
    /* k above KCHUNK_MIN is cut into chunks of KCHUNK (multiple of 8).
     * Measured on Zen 5 (48 KiB L1): a 96 KiB panel (k = 3072) streamed
     * from L2 still beats chunking, by 2-3%. */
    KCHUNK_MIN = 3072,
    KCHUNK = 1024,
    CACHE_LINE = 64,
};

/* 8 weights of one row starting at element off, widened to fp32 (exact). */
KILN_AVX512_INLINE __m256 load8_row(const void *w, long off, int kind) {
    switch (kind) {
    case WK_F32:
        return _mm256_loadu_ps((const float *)w + off);
    case WK_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + off)));
    default: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + off));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    }
}

/* cnt (< 8) weights starting at off, zeros in the remaining lanes. */
KILN_AVX512_INLINE __m256 load_tail_row(const void *w, long off, long cnt, int kind) {
    if (kind == WK_F32) {
        float buf[8] = {0};
        memcpy(buf, (const float *)w + off, (size_t)cnt * sizeof(float));
        return _mm256_loadu_ps(buf);
    }
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)w + off, (size_t)cnt * sizeof(uint16_t));
    return load8_row(buf, 0, kind);
}

KILN_AVX512_INLINE __m512 join(__m256 lo, __m256 hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* Rows r0 (low half) and r1 (high half), 8 weights each from element kk. */
KILN_AVX512_INLINE __m512 load_pair(const void *w, long r0, long r1, long ldw, long kk, int kind) {
    switch (kind) {
    case WK_PANEL: /* ldw is the pair stride; r0 the pair index */
        return _mm512_loadu_ps((const float *)w + r0 * ldw + 2 * kk);
    case WK_F32:
        return join(_mm256_loadu_ps((const float *)w + r0 * ldw + kk),
                    _mm256_loadu_ps((const float *)w + r1 * ldw + kk));
    default: {
        const uint16_t *h = w;
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(h + r0 * ldw + kk))),
            _mm_loadu_si128((const __m128i *)(h + r1 * ldw + kk)), 1);
        if (kind == WK_F16) return _mm512_cvtph_ps(v);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    }
    }
}

/* FP8: 8 codes (a 128-bit register's halves: row a's, row b's) widened to
 * fp32 and multiplied by s256 (each half's scale times 2^8): the values of
 * cpu_matmul_fp8_row, bit for bit, but for the NaN code S.1111.111, which
 * comes out finite (1.875 * 2^8 * scale). cpu_matmul_fp8.c explains the
 * float16 route; here the int8 lanes sign-extend, so code << 7 is the
 * float16 with the code's fields and the sign in bits 15 and 14 (cleared).
 * 256-bit integer steps: on Zen 4, where a 512-bit operation takes two
 * cycles of its unit, they measured 15% faster than 512-bit ones over two
 * blocks at once. */
KILN_AVX512_INLINE __m512 widen_fp8_16(__m128i v, __m512 s256) {
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(v), 7), _mm256_set1_epi16((short)0xbf80));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
}

/* widen_fp8_16 of rows a and b from a and b, NaN codes included: they
 * become float16 NaN sign | 0x7e00 (fp32 sign | 0x7fc00000, as the scalar
 * widening). */
KILN_AVX512_INLINE __m512 widen_fp8_pair(const uint8_t *a, const uint8_t *b, __m512 s256) {
    __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(v), 7);
    __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x3f80)),
                                            _mm256_set1_epi16(0x3f80));
    /* (h & 0x8000) | 0x7e00 where NaN, else h & 0xbf80 */
    h = _mm256_mask_blend_epi16(nan, _mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80)),
                                _mm256_ternarylogic_epi32(h, _mm256_set1_epi16((short)0x8000),
                                                          _mm256_set1_epi16(0x7e00), 0xea));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
}

/* Two 8-blocks of rows a and b at once, without the NaN fix: 16 codes of
 * each, the block at a, b into lo and the next one into hi. The codes' NaN
 * lanes are or-ed into *nan, and the caller computes again where any was
 * (checkpoints have none; testing the codes costs less than fixing the
 * lanes). */
KILN_AVX512_INLINE void widen_fp8_pair2(const uint8_t *a, const uint8_t *b, __m512 s256, __m512 *lo, __m512 *hi,
                                        __mmask32 *nan) {
    const __m128i top = _mm_set1_epi8((char)0x80), ones = _mm_set1_epi8(-1);
    __m128i va = _mm_loadu_si128((const __m128i *)a), vb = _mm_loadu_si128((const __m128i *)b);
    *nan |= (__mmask32)(_mm_cmpeq_epi8_mask(_mm_or_si128(va, top), ones) |
                        _mm_cmpeq_epi8_mask(_mm_or_si128(vb, top), ones));
    *lo = widen_fp8_16(_mm_unpacklo_epi64(va, vb), s256);
    *hi = widen_fp8_16(_mm_unpackhi_epi64(va, vb), s256);
}

/* The AVX2 kernel's reduction, verbatim: four accumulators to their four
 * sums, each ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). */
KILN_AVX512_INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Writes 4 sums (+ bias) of which the first cnt are real outputs. */
KILN_AVX512_INLINE void store_sums(float *y, const float *bias, __m128 s, int cnt) {
    if (cnt == 4) {
        if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias));
        _mm_storeu_ps(y, s);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, s);
    for (int c = 0; c < cnt; c++) y[c] = bias ? t[c] + bias[c] : t[c];
}

/* As in the AVX2 file: a k range split into chunks (at multiples of 8)
 * carries the raw accumulators, [R][P][16] floats, between calls. */
struct tile_io {
    const float *bias;   /* [cols] or NULL */
    const char *pf;      /* block to prefetch alongside, or NULL */
    const float *acc_in; /* accumulators to continue, or NULL to start at 0 */
    float *acc_out;      /* where to leave them, or NULL to reduce into y */
    /* WK_FP8: each w-row's row of block scales ([cols]), and the block
     * width, a multiple of 16 (so a 16-block has one scale) */
    const float *const *srow;
    long bc;
    int *nan; /* WK_FP8: set where a NaN code made the tile's results wrong */
};

/* WK_FP8: the scale pairs (times 2^8) of column block cb. */
KILN_AVX512_INLINE void fp8_scales(const int P, const long *r0, const long *r1, const struct tile_io *io,
                                   long cb, __m512 *sv) {
    for (int p = 0; p < P; p++)
        sv[p] = join(_mm256_set1_ps(io->srow[r0[p]][cb] * 256.0f), _mm256_set1_ps(io->srow[r1[p]][cb] * 256.0f));
}

/* y[r][c] = x[r] . w[c] for r < R, c < cols (cols <= 2P) over k. R, P and
 * kind are constants after inlining so the accumulators live in registers.
 * WK_FP8 widens two 8-blocks a step (the FMAs of each output still in k
 * order) and sets *io->nan where a NaN code went by unfixed.
 * For row kinds, pair p holds rows 2p and 2p+1; a row past cols repeats the
 * last real row (its sums are dropped), so no memory beyond w is read. For
 * the panel, pair p starts at w + p * ldw. */
KILN_AVX512_INLINE void tile(const int R, const int P, const int kind, const float *x, long ldx,
                             const void *w, long ldw, long k, int cols, float *y, long ldy,
                             const struct tile_io *io) {
    const int esz = kind == WK_F32 ? 4 : kind == WK_FP8 ? 1 : 2;
    const char *pf = io->pf;
    const uint8_t *w8 = w;
    __m512 sv[TILE_PMAX];
    long next_cb = 0; /* WK_FP8: where the next column block starts */
    long r0[TILE_PMAX], r1[TILE_PMAX];
    for (int p = 0; p < P; p++) {
        r0[p] = kind == WK_PANEL ? p : (2 * p < cols ? 2 * p : cols - 1);
        r1[p] = 2 * p + 1 < cols ? 2 * p + 1 : cols - 1;
    }
    __m512 acc[TILE_RMAX][TILE_PMAX];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++)
            acc[r][p] = io->acc_in ? _mm512_loadu_ps(io->acc_in + (r * P + p) * 16) : _mm512_setzero_ps();
    const long k8 = k & ~7L;
    long kk0 = 0; /* where the loop below starts */
    __mmask32 nan = 0;
    if (kind == WK_FP8) {
        /* two 8-blocks a step (one column block: bc is a multiple of 16),
         * each pair's FMAs in k order */
        for (; kk0 + 16 <= k8; kk0 += 16) {
            const long kk = kk0;
            if (kk == next_cb) {
                fp8_scales(P, r0, r1, io, kk / io->bc, sv);
                next_cb += io->bc;
            }
            if (pf)
                for (int o = 0; o < 2 * P * 16; o += 64) _mm_prefetch(pf + kk * 2 * P + o, _MM_HINT_T0);
            for (int p = 0; p < P; p++) {
                __m512 lo, hi;
                widen_fp8_pair2(w8 + r0[p] * ldw + kk, w8 + r1[p] * ldw + kk, sv[p], &lo, &hi, &nan);
                for (int r = 0; r < R; r++)
                    acc[r][p] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + r * ldx + kk)), lo,
                                                acc[r][p]);
                for (int r = 0; r < R; r++)
                    acc[r][p] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + r * ldx + kk + 8)), hi,
                                                acc[r][p]);
            }
        }
        if (nan) *io->nan = 1;
    }
    for (long kk = kk0; kk < k8; kk += 8) {
        __m512 wv[TILE_PMAX];
        if (kind == WK_FP8) {
            if (kk == next_cb) {
                fp8_scales(P, r0, r1, io, kk / io->bc, sv);
                next_cb += io->bc;
            }
            for (int p = 0; p < P; p++)
                wv[p] = widen_fp8_pair(w8 + r0[p] * ldw + kk, w8 + r1[p] * ldw + kk, sv[p]);
        } else {
            for (int p = 0; p < P; p++) wv[p] = load_pair(w, r0[p], r1[p], ldw, kk, kind);
        }
        if (pf)
            for (int o = 0; o < 2 * P * 8 * esz; o += 64) _mm_prefetch(pf + kk * 2 * P * esz + o, _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + r * ldx + kk));
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);
        }
    }
    if (k8 < k) {
        const long t = k - k8;
        __m512 wv[TILE_PMAX];
        for (int p = 0; p < P; p++) {
            if (kind == WK_PANEL) {
                wv[p] = load_pair(w, r0[p], r1[p], ldw, k8, kind); /* zero-padded when packed */
            } else if (kind == WK_FP8) {
                if (p == 0 && k8 == next_cb) fp8_scales(P, r0, r1, io, k8 / io->bc, sv);
                uint8_t a[8] = {0}, b[8] = {0};
                memcpy(a, w8 + r0[p] * ldw + k8, (size_t)t);
                memcpy(b, w8 + r1[p] * ldw + k8, (size_t)t);
                /* the padding lanes +0, as the F32 path's, whatever the scale */
                const __mmask16 live = (__mmask16)(((1u << t) - 1) * 0x101u);
                wv[p] = _mm512_maskz_mov_ps(live, widen_fp8_pair(a, b, sv[p]));
            } else {
                wv[p] = join(load_tail_row(w, r0[p] * ldw + k8, t, kind),
                             load_tail_row(w, r1[p] * ldw + k8, t, kind));
            }
        }
        for (int r = 0; r < R; r++) {
            float buf[8] = {0};
            memcpy(buf, x + r * ldx + k8, (size_t)t * sizeof(float));
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(buf));
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);
        }
    }
    if (io->acc_out) {
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) _mm512_storeu_ps(io->acc_out + (r * P + p) * 16, acc[r][p]);
        return;
    }
    const float *bias = io->bias;
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) {
        for (int p = 0; 2 * p < cols; p += 2) {
            int cnt = cols - 2 * p < 4 ? cols - 2 * p : 4;
            __m512 a = acc[r][p], b = p + 1 < P ? acc[r][p + 1] : _mm512_setzero_ps();
            __m128 s = reduce4(_mm512_castps512_ps256(a), cnt > 1 ? _mm512_extractf32x8_ps(a, 1) : z,
                               cnt > 2 ? _mm512_castps512_ps256(b) : z,
                               cnt > 3 ? _mm512_extractf32x8_ps(b, 1) : z);
            store_sums(y + r * ldy + 2 * p, bias ? bias + 2 * p : NULL, s, cnt);
        }
    }
}

/* Stream tile shapes: by n class, the pairs per tile row; R = rows. (n = 1
 * goes to the AVX2 kernel, see cpu_matmul_range_avx512.) */
static int stream_pairs(long n) { return n == 2 ? 6 : 4; }

/* One switch instantiates every shape the drivers ask for. */
KILN_AVX512_INLINE void tile_any(int R, int P, const int kind, const float *x, long ldx,
                                 const void *w, long ldw, long k, int cols, float *y, long ldy,
                                 const struct tile_io *io) {
    switch (R * 16 + P) {
    case 0x26: tile(2, 6, kind, x, ldx, w, ldw, k, cols, y, ldy, io); break;
    case 0x14: tile(1, 4, kind, x, ldx, w, ldw, k, cols, y, ldy, io); break;
    case 0x24: tile(2, 4, kind, x, ldx, w, ldw, k, cols, y, ldy, io); break;
    case 0x34: tile(3, 4, kind, x, ldx, w, ldw, k, cols, y, ldy, io); break;
    case 0x44: tile(4, 4, kind, x, ldx, w, ldw, k, cols, y, ldy, io); break;
    default: KILN_ASSERT_MSG(0, "cpu_matmul: tile shape not instantiated");
    }
}

static KILN_AVX512 __attribute__((noinline)) void tile_f32(int R, int P, const float *x, long ldx,
                                                            const void *w, long ldw, long k, int cols,
                                                            float *y, long ldy, const struct tile_io *io) {
    tile_any(R, P, WK_F32, x, ldx, w, ldw, k, cols, y, ldy, io);
}

static KILN_AVX512 __attribute__((noinline)) void tile_f16(int R, int P, const float *x, long ldx,
                                                            const void *w, long ldw, long k, int cols,
                                                            float *y, long ldy, const struct tile_io *io) {
    tile_any(R, P, WK_F16, x, ldx, w, ldw, k, cols, y, ldy, io);
}

static KILN_AVX512 __attribute__((noinline)) void tile_fp8(int R, int P, const float *x, long ldx,
                                                            const void *w, long ldw, long k, int cols,
                                                            float *y, long ldy, const struct tile_io *io) {
    tile_any(R, P, WK_FP8, x, ldx, w, ldw, k, cols, y, ldy, io);
}

static KILN_AVX512 __attribute__((noinline)) void tile_bf16(int R, int P, const float *x, long ldx,
                                                             const void *w, long ldw, long k, int cols,
                                                             float *y, long ldy, const struct tile_io *io) {
    tile_any(R, P, WK_BF16, x, ldx, w, ldw, k, cols, y, ldy, io);
}

/* The packed micro-kernel: PACK_P pairs of the panel, R = 1..PACK_R rows. */
static KILN_AVX512 __attribute__((noinline)) void tile_panel(int R, const float *x, long ldx,
                                                              const float *panel, long ldp, long k,
                                                              int cols, float *y, long ldy,
                                                              const struct tile_io *io) {
    switch (R) {
    case 1: tile(1, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    case 2: tile(2, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    case 3: tile(3, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    case 4: tile(4, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    case 5: tile(5, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    case 6: tile(6, PACK_P, WK_PANEL, x, ldx, panel, ldp, k, cols, y, ldy, io); break;
    default: KILN_ASSERT_MSG(0, "cpu_matmul: panel tile rows out of range");
    }
}

typedef void (*tile_fn)(int R, int P, const float *x, long ldx, const void *w, long ldw, long k,
                        int cols, float *y, long ldy, const struct tile_io *io);

/* Widens rows [0, rows) of w (row stride k, rows <= PACK_C) into the
 * interleaved panel: pair p at panel + p * 2 * kp holds, per 8-block kb,
 * row 2p's 8 values then row 2p+1's. k is zero-padded to kp (a multiple
 * of 8) and missing rows are zeros. */
static KILN_AVX512 void pack_panel(float *panel, long kp, const void *w, long k, long rows, int kind) {
    const long k8 = k & ~7L;
    for (long c = 0; c < PACK_C; c++) {
        float *dst = panel + (c / 2) * 2 * kp + (c % 2) * 8;
        if (c >= rows) {
            for (long kk = 0; kk < kp; kk += 8) _mm256_storeu_ps(dst + 2 * kk, _mm256_setzero_ps());
            continue;
        }
        long off = c * k;
        for (long kk = 0; kk < k8; kk += 8) _mm256_storeu_ps(dst + 2 * kk, load8_row(w, off + kk, kind));
        if (k8 < k) _mm256_storeu_ps(dst + 2 * k8, load_tail_row(w, off + k8, k - k8, kind));
    }
}

/* pack_panel for FP8 rows: each dequantized straight into its place. */
static void pack_panel_fp8(float *panel, long kp, const struct cpu_matmul_job *job, long r0, long rows) {
    for (long c = 0; c < PACK_C; c++) {
        float *dst = panel + (c / 2) * 2 * kp + (c % 2) * 8;
        if (c < rows) cpu_matmul_fp8_row(job, r0 + c, dst, 16, 1);
        else
            for (long kk = 0; kk < kp; kk += 8) memset(dst + 2 * kk, 0, 8 * sizeof(float));
    }
}

static int min_int(long a, long b) { return (int)(a < b ? a : b); }

/* Whether the FP8 rows [j0, j1) can be widened in the tiles (tile_fp8):
 * a 16-block never crosses a column block, and no scale is so large that
 * scale * 2^8 could overflow (or NaN); otherwise the rows are widened by
 * cpu_matmul_fp8_row into a buffer for the F32 tile. */
static int fp8_in_tiles(const struct cpu_matmul_job *job, long j0, long j1) {
    return job->block_cols % 16 == 0 && cpu_matmul_fp8_scales_ok(job, j0, j1);
}

/* Small n: each group of w-rows is read from memory once, widened in
 * registers, and reused from cache by all n rows of x. FP8 rows are widened
 * in registers by tile_fp8 (fn, esz 1), or, where they cannot be
 * (fp8_in_tiles), into deq for the F32 tile (fn is tile_f32 and esz 1); a
 * tile_fp8 tile that met a NaN code runs again as the latter. */
static void range_stream(const struct cpu_matmul_job *job, long j0, long j1, tile_fn fn, size_t esz) {
    const long n = job->n, k = job->k, kp = (k + 7) & ~7L;
    const char *w = job->w;
    const int rs = n < 4 ? (int)n : 4, ps = stream_pairs(n), cs = 2 * ps;
    const int fp8 = job->wt == DTYPE_F8_E4M3, in_tiles = fn == tile_fp8;
    float *deq = fp8 && !in_tiles ? xaligned_alloc((size_t)(cs * kp + 8) * sizeof(float)) : NULL;
    /* Rows shorter than a page are too short for the hardware prefetcher to
     * ramp up on each of the streams; longer ones it handles better alone.
     * (FP8 rows widened into deq are read one after another, one stream.) */
    const int prefetch = (!fp8 || in_tiles) && (size_t)k * esz < 4096;
    const float *srow[2 * TILE_PMAX];
    const long nbc = fp8 ? (k + job->block_cols - 1) / job->block_cols : 0;
    for (long jb = j0, c; jb < j1; jb += c) {
        c = min_int(cs, j1 - jb);
        const void *wc = w + jb * k * esz;
        long ldw = k;
        int widened = 0; /* the group's rows are in deq */
        if (fp8 && !in_tiles) {
            for (long r = 0; r < c; r++) cpu_matmul_fp8_row(job, jb + r, deq + r * kp, 8, 1);
            wc = deq;
            ldw = kp;
        } else if (fp8) {
            for (long r = 0; r < c; r++) srow[r] = job->scale + (jb + r) / job->block_rows * nbc;
        }
        for (long i = 0; i < n; i += rs) {
            int nan = 0;
            struct tile_io io = {.bias = job->bias ? job->bias + jb : NULL, .srow = srow, .bc = job->block_cols,
                                 .nan = &nan};
            if (prefetch && i == 0 && jb + cs < j1) io.pf = w + (jb + cs) * k * esz;
            fn(min_int(rs, n - i), ps, job->x + i * job->ldx, job->ldx, wc, ldw, k, (int)c,
               job->y + i * job->ldy + jb, job->ldy, &io);
            if (nan) { /* NaN codes: the tile again on the rows widened exactly */
                if (!deq) deq = xaligned_alloc((size_t)(cs * kp + 8) * sizeof(float));
                if (!widened)
                    for (long r = 0; r < c; r++) cpu_matmul_fp8_row(job, jb + r, deq + r * kp, 8, 1);
                widened = 1;
                io.pf = NULL;
                tile_f32(min_int(rs, n - i), ps, job->x + i * job->ldx, job->ldx, deq, kp, k, (int)c,
                         job->y + i * job->ldy + jb, job->ldy, &io);
            }
        }
    }
    free(deq);
}

/* Large n: PACK_C w-rows at a time are widened into a panel that serves a
 * block of x-rows sized to stay in L2; long rows are cut into k chunks so
 * that the panel chunk stays in L1, the accumulators waiting in acc. */
static void range_packed(const struct cpu_matmul_job *job, long j0, long j1, int kind, size_t esz) {
    const long n = job->n, k = job->k, ldx = job->ldx, ldy = job->ldy;
    const char *w = job->w;
    const long kc = k > KCHUNK_MIN ? KCHUNK : k; /* a multiple of 8 when k is cut */
    long xb = XBLOCK_BYTES / ((k + 1) * (long)sizeof(float));
    xb = xb < XBLOCK_MIN_ROWS ? XBLOCK_MIN_ROWS : xb / PACK_R * PACK_R;
    if (xb > n) xb = (n + PACK_R - 1) / PACK_R * PACK_R;
    const long kp = (k + 7) & ~7L, ldp = 2 * kp;
    float *panel = xaligned_alloc((size_t)(PACK_C * kp) * sizeof(float));
    float *acc = kc < k ? xmalloc((size_t)(xb * PACK_P * 16) * sizeof(float)) : NULL;
    const long tiles = (k > 0 ? (k + kc - 1) / kc : 1) * ((xb + PACK_R - 1) / PACK_R);
    for (long i0 = 0; i0 < n; i0 += xb) {
        long i1 = i0 + xb < n ? i0 + xb : n;
        for (long jb = j0, c; jb < j1; jb += c) {
            c = min_int(PACK_C, j1 - jb);
            if (job->wt == DTYPE_F8_E4M3) pack_panel_fp8(panel, kp, job, jb, c);
            else pack_panel(panel, kp, w + jb * k * esz, k, c, kind);
            /* The next group's weights come from DRAM: each tile call below
             * asks for a slice of them into L2, so that they arrive while
             * this group computes and the next packing finds them cached. */
            const char *next = jb + c < j1 ? w + (jb + c) * k * esz : NULL;
            long next_bytes = next ? min_int(PACK_C, j1 - jb - c) * k * (long)esz : 0, t = 0;
            /* At least one pass, so that k = 0 still writes y (= bias or 0). */
            for (long k0 = 0; k0 == 0 || k0 < k; k0 += kc) {
                long len = k - k0 < kc ? k - k0 : kc;
                for (long i = i0; i < i1; i += PACK_R, t++) {
                    for (long o = next_bytes * t / tiles & ~(long)(CACHE_LINE - 1);
                         o < next_bytes * (t + 1) / tiles; o += CACHE_LINE)
                        _mm_prefetch(next + o, _MM_HINT_T1);
                    float *a = acc ? acc + (i - i0) * PACK_P * 16 : NULL;
                    struct tile_io io = {
                        .bias = job->bias ? job->bias + jb : NULL,
                        .acc_in = k0 > 0 ? a : NULL,
                        .acc_out = k0 + len < k ? a : NULL,
                    };
                    tile_panel(min_int(PACK_R, i1 - i), job->x + i * ldx + k0, ldx, panel + 2 * k0, ldp, len,
                               (int)c, job->y + i * ldy + jb, ldy, &io);
                }
                if (kc == 0) break;
            }
        }
    }
    free(panel);
    free(acc);
}

void cpu_matmul_range_avx512(const struct cpu_matmul_job *job, long j0, long j1) {
    /* FP8: the F32 tiles on dequantized rows; esz is that of the rows in memory */
    const int fp8 = job->wt == DTYPE_F8_E4M3;
    int kind = job->wt == DTYPE_F32 || fp8 ? WK_F32 : job->wt == DTYPE_F16 ? WK_F16 : WK_BF16;
    size_t esz = fp8 ? 1 : kind == WK_F32 ? 4 : 2;
    /* One row is bound by memory bandwidth, not FMAs: the AVX2 tile (8
     * streams of w) measured as fast or up to ~5% faster than a 16-row
     * AVX-512 tile, and its results are the same bits. FP8 rows, whose
     * widening costs more than their bytes, take the AVX-512 tiles. */
    if (fp8 && job->n <= STREAM_MAX_N)
        range_stream(job, j0, j1, fp8_in_tiles(job, j0, j1) ? tile_fp8 : tile_f32, esz);
    else if (job->n == 1)
        cpu_matmul_range_avx2(job, j0, j1);
    else if (job->n <= STREAM_MAX_N)
        range_stream(job, j0, j1, kind == WK_F32 ? tile_f32 : kind == WK_F16 ? tile_f16 : tile_bf16, esz);
    else
        range_packed(job, j0, j1, kind, esz);
}

#endif
