/* cpu_matmul_avx2.c — AVX2/FMA/F16C kernels for cpu_matmul.
 *
 * Dot-product (k-inner) formulation: every output owns one 8-lane fp32
 * accumulator that runs over k in blocks of 8, then a fixed horizontal
 * reduction (see cpu_matmul_kernels.h). A tile of R x-rows by C w-rows keeps
 * R*C accumulators in registers, so each x vector is reused C times and each
 * widened w vector R times. Two ways to feed the tile, same arithmetic:
 *
 *  - stream (small n, decode): w is read straight from its checkpoint dtype
 *    and widened in registers; the C w-rows stay in L1/L2 while all n x-rows
 *    pass over them, so w is read from memory exactly once.
 *  - packed (prefill): C w-rows are widened once into an fp32 panel that
 *    then serves every x-row of an L2-sized block of x; widening bf16/f16 is
 *    exact, so the values fed to the FMAs are the same as in stream mode.
 *
 * FP8 weights (cpu_matmul_kernels.h) stream through tile_fp8, which widens
 * and scales them in registers to the values cpu_matmul_fp8_row gives, and
 * are dequantized into the panel when packed: the F32 arithmetic on the
 * dequantized values either way.
 *
 * Compiled per function with target attributes; the caller checks the CPU.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_kernels.h"
#include "base/error.h"
#include "base/mem.h"

#define KILN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KILN_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* WK_FP8: block-scaled e4m3 rows, widened and scaled in registers (stream). */
enum wkind { WK_F32, WK_F16, WK_BF16, WK_FP8 };

enum {
    /* Largest tile; the accumulators must fit the 16 ymm registers. */
    TILE_RMAX = 4,
    TILE_CMAX = 8,
    /* n up to this streams w from its own dtype; above, w is packed. */
    STREAM_MAX_N = 8,
    /* Packed mode tile and the x block that should stay in L2. */
    PACK_R = 4,
    PACK_C = 3,
    XBLOCK_BYTES = 1024 * 1024,
    XBLOCK_MIN_ROWS = 16,
    /* k above KCHUNK_MIN is cut into chunks of KCHUNK (multiple of 8). */
    KCHUNK_MIN = 1024,
    KCHUNK = 512,
    PF_BLOCKS = 1,
    CACHE_LINE = 64,
};

/* 8 weights starting at element off, widened to fp32 (exact). */
KILN_AVX2_INLINE __m256 load8_w(const void *w, long off, int kind) {
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
KILN_AVX2_INLINE __m256 load_tail_w(const void *w, long off, long cnt, int kind) {
    if (kind == WK_F32) {
        float buf[8] = {0};
        memcpy(buf, (const float *)w + off, (size_t)cnt * sizeof(float));
        return _mm256_loadu_ps(buf);
    }
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)w + off, (size_t)cnt * sizeof(uint16_t));
    return load8_w(buf, 0, kind);
}

/* FP8: 8 codes widened to fp32 and multiplied by s256 (the block's scale
 * times 2^8): cpu_matmul_fp8_row's values, except for the NaN code (the
 * caller keeps rows with one away: cpu_matmul_fp8_has_nan). The int8 lanes
 * sign-extend, so code << 7 is the float16 with the code's fields and the
 * sign in bits 15 and 14 (cleared); see cpu_matmul_fp8.c. */
KILN_AVX2_INLINE __m256 widen_fp8(__m128i v, float s256) {
    __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(v), 7), _mm_set1_epi16((short)0xbf80));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(s256));
}

KILN_AVX2_INLINE __m256 load_tail_x(const float *x, long cnt) {
    float buf[8] = {0};
    memcpy(buf, x, (size_t)cnt * sizeof(float));
    return _mm256_loadu_ps(buf);
}

/* Reduces four accumulators to their four sums, each with the tree
 * ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). */
KILN_AVX2_INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Writes 4 sums (+ bias) of which the first cnt are real outputs. */
KILN_AVX2_INLINE void store_sums(float *y, const float *bias, __m128 s, int cnt) {
    if (cnt == 4) {
        if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias));
        _mm_storeu_ps(y, s);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, s);
    for (int c = 0; c < cnt; c++) y[c] = bias ? t[c] + bias[c] : t[c];
}

/* What a tile does besides the FMAs. A k range split into chunks (at
 * multiples of 8) carries the raw accumulators between calls, [R][C][8]
 * floats: storing and reloading them is exact, so the chunked sum is the
 * same as the unchunked one. */
struct tile_io {
    const float *bias;    /* [C] or NULL */
    const char *pf;       /* block to prefetch alongside, or NULL */
    const float *acc_in;  /* accumulators to continue, or NULL to start at 0 */
    float *acc_out;       /* where to leave them, or NULL to reduce into y */
    /* WK_FP8: each w-row's row of block scales, and the block width, a
     * multiple of 8 (so an 8-block has one scale) */
    const float *const *srow;
    long bc;
};

/* y[r][c] = x[r] . w[c] for r < R, c < C over k. R, C and kind are
 * constants after inlining so the accumulators live in registers. */
KILN_AVX2_INLINE void tile(const int R, const int C, const int kind, const float *x, long ldx,
                           const void *w, long ldw, long k, float *y, long ldy,
                           const struct tile_io *io) {
    const int esz = kind == WK_F32 ? 4 : kind == WK_FP8 ? 1 : 2;
    const char *pf = io->pf;
    const uint8_t *w8 = w;
    float s256[TILE_CMAX] = {0}; /* WK_FP8: the column block's scales times 2^8 */
    long next_cb = 0;            /* WK_FP8: where the next column block starts */
    __m256 acc[TILE_RMAX][TILE_CMAX];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = io->acc_in ? _mm256_loadu_ps(io->acc_in + (r * C + c) * 8) : _mm256_setzero_ps();
    const long k8 = k & ~7L;
    for (long kk = 0; kk < k8; kk += 8) {
        __m256 wv[TILE_CMAX];
        if (kind == WK_FP8) {
            if (kk == next_cb) {
                for (int c = 0; c < C; c++) s256[c] = io->srow[c][kk / io->bc] * 256.0f;
                next_cb += io->bc;
            }
            for (int c = 0; c < C; c++)
                wv[c] = widen_fp8(_mm_loadl_epi64((const __m128i *)(w8 + c * ldw + kk)), s256[c]);
        } else {
            for (int c = 0; c < C; c++) wv[c] = load8_w(w, c * ldw + kk, kind);
        }
        if (pf)
            for (int o = 0; o < C * 8 * esz; o += 64) _mm_prefetch(pf + kk * C * esz + o, _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * ldx + kk);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (k8 < k) {
        __m256 wv[TILE_CMAX];
        if (kind == WK_FP8) {
            if (k8 == next_cb)
                for (int c = 0; c < C; c++) s256[c] = io->srow[c][k8 / io->bc] * 256.0f;
            /* the padding lanes +0, as the F32 path's, whatever the scale */
            static const int32_t lanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
            const __m256 live = _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - k8)), _mm256_loadu_si256((const __m256i *)lanes)));
            for (int c = 0; c < C; c++) {
                uint8_t b[8] = {0};
                memcpy(b, w8 + c * ldw + k8, (size_t)(k - k8));
                wv[c] = _mm256_and_ps(live, widen_fp8(_mm_loadl_epi64((const __m128i *)b), s256[c]));
            }
        } else {
            for (int c = 0; c < C; c++) wv[c] = load_tail_w(w, c * ldw + k8, k - k8, kind);
        }
        for (int r = 0; r < R; r++) {
            __m256 xv = load_tail_x(x + r * ldx + k8, k - k8);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (io->acc_out) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) _mm256_storeu_ps(io->acc_out + (r * C + c) * 8, acc[r][c]);
        return;
    }
    const float *bias = io->bias;
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) {
        for (int c0 = 0; c0 < C; c0 += 4) {
            int cnt = C - c0 < 4 ? C - c0 : 4;
            __m128 s = reduce4(acc[r][c0], cnt > 1 ? acc[r][c0 + 1] : z, cnt > 2 ? acc[r][c0 + 2] : z,
                               cnt > 3 ? acc[r][c0 + 3] : z);
            store_sums(y + r * ldy + c0, bias ? bias + c0 : NULL, s, cnt);
        }
    }
}

/* One switch instantiates every tile shape the drivers below ask for. */
KILN_AVX2_INLINE void tile_any(int R, int C, const int kind, const float *x, long ldx, const void *w,
                               long ldw, long k, float *y, long ldy,
                               const struct tile_io *io) {
    switch (R * 16 + C) {
    case 0x11: tile(1, 1, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x12: tile(1, 2, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x13: tile(1, 3, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x14: tile(1, 4, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x18: tile(1, 8, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x21: tile(2, 1, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x22: tile(2, 2, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x23: tile(2, 3, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x24: tile(2, 4, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x31: tile(3, 1, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x32: tile(3, 2, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x33: tile(3, 3, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x34: tile(3, 4, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x41: tile(4, 1, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x42: tile(4, 2, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    case 0x43: tile(4, 3, kind, x, ldx, w, ldw, k, y, ldy, io); break;
    default: KILN_ASSERT_MSG(0, "cpu_matmul: tile shape not instantiated");
    }
}

static KILN_AVX2 __attribute__((noinline)) void tile_f32(int R, int C, const float *x, long ldx,
                                                          const void *w, long ldw, long k, float *y,
                                                          long ldy, const struct tile_io *io) {
    tile_any(R, C, WK_F32, x, ldx, w, ldw, k, y, ldy, io);
}

static KILN_AVX2 __attribute__((noinline)) void tile_f16(int R, int C, const float *x, long ldx,
                                                          const void *w, long ldw, long k, float *y,
                                                          long ldy, const struct tile_io *io) {
    tile_any(R, C, WK_F16, x, ldx, w, ldw, k, y, ldy, io);
}

static KILN_AVX2 __attribute__((noinline)) void tile_fp8(int R, int C, const float *x, long ldx,
                                                          const void *w, long ldw, long k, float *y,
                                                          long ldy, const struct tile_io *io) {
    tile_any(R, C, WK_FP8, x, ldx, w, ldw, k, y, ldy, io);
}

static KILN_AVX2 __attribute__((noinline)) void tile_bf16(int R, int C, const float *x, long ldx,
                                                           const void *w, long ldw, long k, float *y,
                                                           long ldy, const struct tile_io *io) {
    tile_any(R, C, WK_BF16, x, ldx, w, ldw, k, y, ldy, io);
}

typedef void (*tile_fn)(int R, int C, const float *x, long ldx, const void *w, long ldw, long k,
                        float *y, long ldy, const struct tile_io *io);

/* Widens rows [0, rows) of w (row stride k) into panel [rows][kp], zero
 * padded to kp = k rounded up to 8. */
static KILN_AVX2 void pack_panel(float *panel, long kp, const void *w, long k, long rows, int kind) {
    const long k8 = k & ~7L;
    for (long c = 0; c < rows; c++) {
        float *dst = panel + c * kp;
        long off = c * k;
        for (long kk = 0; kk < k8; kk += 8) _mm256_storeu_ps(dst + kk, load8_w(w, off + kk, kind));
        if (k8 < k) _mm256_storeu_ps(dst + k8, load_tail_w(w, off + k8, k - k8, kind));
    }
}

static int min_int(long a, long b) { return (int)(a < b ? a : b); }

/* Tile width for the columns left at jb; widths 5..7 are not instantiated. */
static int tile_cols(int cmax, long left) {
    int c = min_int(cmax, left);
    return c > 4 && c < 8 ? 4 : c;
}

/* Small n: each group of C w-rows is read from memory once, widened in
 * registers, and reused from cache by all n rows of x. FP8 rows are widened
 * in registers by tile_fp8 where the block width is a multiple of 8, the
 * scales allow (cpu_matmul_fp8_scales_ok) and the group has no NaN code;
 * otherwise into deq by cpu_matmul_fp8_row, for tile_f32. For FP8, fn is
 * tile_f32 and esz 1. */
static void range_stream(const struct cpu_matmul_job *job, long j0, long j1, tile_fn fn, size_t esz) {
    const long n = job->n, k = job->k, kp = (k + 7) & ~7L;
    const char *w = job->w;
    /* Shapes whose accumulators and w vectors fit the 16 ymm registers. */
    const int rs = n < 4 ? (int)n : 4, cs = n == 1 ? 8 : n == 2 ? 4 : 3;
    const int fp8 = job->wt == DTYPE_F8_E4M3;
    const int in_tiles = fp8 && job->block_cols % 8 == 0 && cpu_matmul_fp8_scales_ok(job, j0, j1);
    float *deq = NULL; /* rows widened by cpu_matmul_fp8_row, allocated when needed */
    const float *srow[TILE_CMAX];
    const long nbc = fp8 ? (k + job->block_cols - 1) / job->block_cols : 0;
    /* Rows shorter than a page are too short for the hardware prefetcher to
     * ramp up on each of the C streams; longer ones it handles better alone. */
    const int prefetch = (!fp8 || in_tiles) && (size_t)k * esz < 4096;
    for (long jb = j0, c; jb < j1; jb += c) {
        c = tile_cols(cs, j1 - jb);
        const void *wc = w + jb * k * esz;
        long ldw = k;
        tile_fn f = fn;
        if (in_tiles && !cpu_matmul_fp8_has_nan(wc, c * k, 1)) {
            for (long r = 0; r < c; r++) srow[r] = job->scale + (jb + r) / job->block_rows * nbc;
            f = tile_fp8;
        } else if (fp8) {
            if (!deq) deq = xaligned_alloc((size_t)(cs * kp + 8) * sizeof(float));
            for (long r = 0; r < c; r++) cpu_matmul_fp8_row(job, jb + r, deq + r * kp, 8, 1);
            wc = deq;
            ldw = kp;
        }
        for (long i = 0; i < n; i += rs) {
            struct tile_io io = {.bias = job->bias ? job->bias + jb : NULL, .srow = srow, .bc = job->block_cols};
            if (prefetch && i == 0 && jb + PF_BLOCKS * c < j1) io.pf = w + (jb + PF_BLOCKS * c) * k * esz;
            f(min_int(rs, n - i), (int)c, job->x + i * job->ldx, job->ldx, wc, ldw, k,
              job->y + i * job->ldy + jb, job->ldy, &io);
        }
    }
    free(deq);
}

/* Large n: C w-rows at a time are widened into an fp32 panel that serves a
 * block of x-rows sized to stay in L2. Long rows are cut into k chunks so
 * that the panel chunk stays in L1 while the block's x-rows pass over it;
 * the accumulators wait in acc between chunks. */
static void range_packed(const struct cpu_matmul_job *job, long j0, long j1, int kind, size_t esz) {
    const long n = job->n, k = job->k, ldx = job->ldx, ldy = job->ldy;
    const char *w = job->w;
    const long kc = k > KCHUNK_MIN ? KCHUNK : k; /* a multiple of 8 when k is cut */
    long xb = XBLOCK_BYTES / ((k + 1) * (long)sizeof(float));
    xb = xb < XBLOCK_MIN_ROWS ? XBLOCK_MIN_ROWS : xb / PACK_R * PACK_R;
    if (xb > n) xb = (n + PACK_R - 1) / PACK_R * PACK_R;
    /* fp32 weights need no packing: their rows are the panel. */
    const int fp8 = job->wt == DTYPE_F8_E4M3;
    const long kp = kind == WK_F32 && !fp8 ? k : (k + 7) & ~7L;
    float *panel = kind == WK_F32 && !fp8 ? NULL : xmalloc((size_t)(PACK_C * kp + 8) * sizeof(float));
    float *acc = kc < k ? xmalloc((size_t)(xb * PACK_C * 8) * sizeof(float)) : NULL;
    const long tiles = (k > 0 ? (k + kc - 1) / kc : 1) * ((xb + PACK_R - 1) / PACK_R);
    for (long i0 = 0; i0 < n; i0 += xb) {
        long i1 = i0 + xb < n ? i0 + xb : n;
        for (long jb = j0, c; jb < j1; jb += c) {
            c = min_int(PACK_C, j1 - jb);
            const float *p = (const float *)w + jb * k;
            if (fp8) {
                for (long r = 0; r < c; r++) cpu_matmul_fp8_row(job, jb + r, panel + r * kp, 8, 1);
                p = panel;
            } else if (panel) {
                pack_panel(panel, kp, w + jb * k * esz, k, c, kind);
                p = panel;
            }
            /* The next group's weights come from DRAM: each tile call below
             * asks for a slice of them into L2, so that they arrive while
             * this group computes and the next packing finds them cached. */
            const char *next = panel && jb + c < j1 ? w + (jb + c) * k * esz : NULL;
            long next_bytes = next ? min_int(PACK_C, j1 - jb - c) * k * (long)esz : 0, t = 0;
            /* At least one pass, so that k = 0 still writes y (= bias or 0). */
            for (long k0 = 0; k0 == 0 || k0 < k; k0 += kc) {
                long len = k - k0 < kc ? k - k0 : kc;
                for (long i = i0; i < i1; i += PACK_R, t++) {
                    for (long o = next_bytes * t / tiles & ~(long)(CACHE_LINE - 1);
                         o < next_bytes * (t + 1) / tiles; o += CACHE_LINE)
                        _mm_prefetch(next + o, _MM_HINT_T1);
                    float *a = acc ? acc + (i - i0) * PACK_C * 8 : NULL;
                    struct tile_io io = {
                        .bias = job->bias ? job->bias + jb : NULL,
                        .acc_in = k0 > 0 ? a : NULL,
                        .acc_out = k0 + len < k ? a : NULL,
                    };
                    tile_f32(min_int(PACK_R, i1 - i), (int)c, job->x + i * ldx + k0, ldx, p + k0, kp, len,
                             job->y + i * ldy + jb, ldy, &io);
                }
                if (kc == 0) break;
            }
        }
    }
    free(panel);
    free(acc);
}

void cpu_matmul_range_avx2(const struct cpu_matmul_job *job, long j0, long j1) {
    /* FP8: the F32 tiles on dequantized rows; esz is that of the rows in memory */
    const int fp8 = job->wt == DTYPE_F8_E4M3;
    int kind = job->wt == DTYPE_F32 || fp8 ? WK_F32 : job->wt == DTYPE_F16 ? WK_F16 : WK_BF16;
    size_t esz = fp8 ? 1 : kind == WK_F32 ? 4 : 2;
    if (job->n <= STREAM_MAX_N)
        range_stream(job, j0, j1, kind == WK_F32 ? tile_f32 : kind == WK_F16 ? tile_f16 : tile_bf16, esz);
    else
        range_packed(job, j0, j1, kind, esz);
}

#endif
