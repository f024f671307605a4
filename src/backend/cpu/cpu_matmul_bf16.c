/* cpu_matmul_bf16.c — the bf16 mode's rounding of x, its loop nest, and
 * its kernels for CPUs without AVX512-BF16 (AVX2 and portable).
 *
 * The arithmetic is fixed in cpu_matmul_kernels.h: per output, 16 fp32
 * lanes, lane l adding the products of k-indices kb+2l+1 and then kb+2l of
 * each 32-block, then a halving tree. The loop nest (cpu_matmul_bf16_drive)
 * only decides which outputs are computed together and where their
 * operands come from:
 *
 *  - x is rounded to bf16 once per product into rows padded to a multiple
 *    of 32 (zeros past k), so every kernel loads whole 32-blocks of x;
 *  - w is read where it lies: bf16 rows are [m][k], so the pairs of
 *    consecutive k-indices the arithmetic wants are already adjacent and
 *    nothing is packed. Small n (decode) streams each group of w-rows once
 *    past all n rows; large n (prefill) cuts x into L2-sized blocks that
 *    pass over each group, which stays in L1 (k cut into chunks where a
 *    group would not fit), while the next group is prefetched into L2.
 *
 * Storing and reloading the 16 raw lanes between k chunks is exact, and
 * each output's reduction is the same tree whatever shares its registers,
 * so results are invariant to n, the row's position, k chunks and threads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_matmul_kernels.h"
#include "base/error.h"
#include "base/mem.h"

enum {
    /* n up to this streams; above, x is blocked. */
    STREAM_MAX_N = 8,
    /* The x block (bf16) that should stay in L2 beside the prefetched w. */
    XBLOCK_BYTES = 512 * 1024,
    CACHE_LINE = 64,
};

static long min_l(long a, long b) { return a < b ? a : b; }

/* ---- rounding ------------------------------------------------------------ */

/* To nearest even, subnormals to signed zero, NaN kept quiet: bit for bit
 * what AVX512-BF16's vcvtneps2bf16 does. */
static uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    else if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__x86_64__)
#define KILN_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

/* round_bf16 on 8 lanes, results in the low 16 bits of each. */
KILN_AVX2_INLINE __m256i round8(const float *x) {
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)x);
    const __m256i sub = _mm256_cmpeq_epi32(_mm256_and_si256(u0, _mm256_set1_epi32(0x7f800000)),
                                           _mm256_setzero_si256());
    const __m256i u = _mm256_andnot_si256(_mm256_and_si256(sub, _mm256_set1_epi32(0x7fffffff)), u0);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

static __attribute__((target("avx2,fma"))) long round_row_avx2(uint16_t *dst, const float *x, long k) {
    long kk = 0;
    for (; kk + 16 <= k; kk += 16) {
        __m256i p = _mm256_packus_epi32(round8(x + kk), round8(x + kk + 8));
        _mm256_storeu_si256((__m256i *)(dst + kk), _mm256_permute4x64_epi64(p, 0xd8));
    }
    return kk;
}
#endif

void cpu_matmul_bf16_round_rows(const struct cpu_matmul_job *job, long i0, long i1, int avx2) {
    for (long i = i0; i < i1; i++) {
        const float *x = job->x + i * job->ldx;
        uint16_t *dst = (uint16_t *)job->xh + i * job->ldxh;
        long kk = 0;
#if defined(__x86_64__)
        if (avx2) kk = round_row_avx2(dst, x, job->k);
#endif
        for (; kk < job->k; kk++) dst[kk] = round_bf16(x[kk]);
        memset(dst + job->k, 0, (size_t)(job->ldxh - job->k) * sizeof *dst);
    }
}

/* ---- the loop nest -------------------------------------------------------- */

/* Rows [0, rows) of w (row stride k) into a panel of C rows interleaved
 * by 32-blocks: block b of row c at panel + (b * C + c) * 32, the last
 * block zero-padded. One stream for the tile to read instead of C rows
 * whose power-of-two strides would fall into the same L1 sets. */
static void pack_panel(uint16_t *panel, const uint16_t *w, long k, long rows, int C) {
    const long full = k / 32, t = k - full * 32;
    for (long c = 0; c < rows; c++) {
        const uint16_t *src = w + c * k;
        for (long b = 0; b < full; b++) memcpy(panel + (b * C + c) * 32, src + b * 32, 64);
        if (t) {
            uint16_t *d = panel + (full * C + c) * 32;
            memcpy(d, src + full * 32, (size_t)t * sizeof *d);
            memset(d + t, 0, (size_t)(32 - t) * sizeof *d);
        }
    }
}

void cpu_matmul_bf16_drive(const struct cpu_matmul_job *job, long j0, long j1,
                           const struct bf16_kernel *kern) {
    const long n = job->n, k = job->k, ldx = job->ldxh, ldy = job->ldy;
    const uint16_t *w = job->w;
    if (n <= STREAM_MAX_N) {
        const int rs = kern->stream_r[n], cs = kern->stream_c[n];
        /* Rows shorter than a page are too short for the hardware
         * prefetcher to ramp up on each stream: the tile asks for the next
         * group while it computes this one. */
        const int prefetch = k * 2 < 4096;
        for (long jb = j0, c; jb < j1; jb += c) {
            c = min_l(cs, j1 - jb);
            for (long i = 0; i < n; i += rs) {
                struct bf16_tile_io io = {.wstep = 32, .bias = job->bias ? job->bias + jb : NULL};
                if (prefetch && i == 0 && jb + c < j1) {
                    io.pf = (const char *)(w + (jb + c) * k);
                    io.pf_bytes = min_l(cs, j1 - jb - c) * k * 2;
                }
                kern->tile((int)min_l(rs, n - i), cs, job->xh + i * ldx, ldx, w + jb * k, k, k, (int)c,
                           job->y + i * ldy + jb, ldy, &io);
            }
        }
        return;
    }
    const int R = kern->pack_r, C = kern->pack_c;
    const long kc = k > kern->kchunk_min ? kern->kchunk : k, nb = (k + 31) / 32;
    uint16_t *panel = xaligned_alloc((size_t)((nb > 0 ? nb : 1) * C * 32) * sizeof(uint16_t));
    long xb = XBLOCK_BYTES / (ldx * 2);
    xb = xb < 2 * R ? 2 * R : xb / R * R;
    if (xb > n) xb = (n + R - 1) / R * R;
    float *acc = kc < k ? xmalloc((size_t)(xb * C * 16) * sizeof(float)) : NULL;
    const long tiles = (k > 0 ? (k + kc - 1) / kc : 1) * ((xb + R - 1) / R);
    for (long i0 = 0; i0 < n; i0 += xb) {
        const long i1 = min_l(i0 + xb, n);
        for (long jb = j0, c; jb < j1; jb += c) {
            c = min_l(C, j1 - jb);
            pack_panel(panel, w + jb * k, k, c, C);
            /* The next group comes from DRAM: each tile call asks for a
             * slice of it into L2, so it is there when its turn comes. */
            const char *next = jb + c < j1 ? (const char *)(w + (jb + c) * k) : NULL;
            const long next_bytes = next ? min_l(C, j1 - jb - c) * k * 2 : 0;
            long t = 0;
            /* At least one pass, so that k = 0 still writes y (= bias or 0). */
            for (long k0 = 0; k0 == 0 || k0 < k; k0 += kc) {
                const long len = min_l(kc, k - k0);
                for (long i = i0; i < i1; i += R, t++) {
#if defined(__x86_64__)
                    for (long o = next_bytes * t / tiles & ~(long)(CACHE_LINE - 1);
                         o < next_bytes * (t + 1) / tiles; o += CACHE_LINE)
                        _mm_prefetch(next + o, _MM_HINT_T1);
#endif
                    float *a = acc ? acc + (i - i0) * C * 16 : NULL;
                    struct bf16_tile_io io = {
                        .wstep = 32L * C,
                        .bias = job->bias ? job->bias + jb : NULL,
                        .acc_in = k0 > 0 ? a : NULL,
                        .acc_out = k0 + len < k ? a : NULL,
                    };
                    kern->tile((int)min_l(R, i1 - i), C, job->xh + i * ldx + k0, ldx, panel + k0 * C, 32,
                               len, (int)c, job->y + i * ldy + jb, ldy, &io);
                }
                if (kc == 0) break;
            }
        }
    }
    free(acc);
    free(panel);
}

/* ---- portable kernel -------------------------------------------------------- */

/* The sum of 16 lanes by the fixed halving tree. */
static float tree16(const float *a) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) t[l] = t[l] + t[l + 4];
    for (int l = 0; l < 2; l++) t[l] = t[l] + t[l + 2];
    return t[0] + t[1];
}

/* One output. The products are exact in fp32, so whether the compiler
 * fuses the multiply and the add does not change any bit. */
static float dot_bf16_portable(const uint16_t *x, const uint16_t *w, long k) {
    float acc[16] = {0};
    for (long kb = 0; kb < k; kb += 32) {
        for (int l = 0; l < 16; l++) {
            const long e = kb + 2 * l, o = e + 1;
            const float wo = o < k ? bf16_to_f32(w[o]) : 0.0f, we = e < k ? bf16_to_f32(w[e]) : 0.0f;
            acc[l] = acc[l] + bf16_to_f32(x[o]) * wo;
            acc[l] = acc[l] + bf16_to_f32(x[e]) * we;
        }
    }
    return tree16(acc);
}

void cpu_matmul_bf16_range_portable(const struct cpu_matmul_job *job, long j0, long j1) {
    const uint16_t *w = job->w;
    for (long i = 0; i < job->n; i++) {
        float *y = job->y + i * job->ldy;
        for (long j = j0; j < j1; j++) {
            float s = dot_bf16_portable(job->xh + i * job->ldxh, w + j * job->k, job->k);
            y[j] = job->bias ? s + job->bias[j] : s;
        }
    }
}

/* ---- AVX2 kernel (CPUs without AVX512-BF16) ---------------------------------- */

#if defined(__x86_64__)

enum { FB_RMAX = 2, FB_CMAX = 4 };

/* Half h of a 32-block: 16 bf16 values as 8 pairs. The odd element of a
 * pair is the high half of its 32-bit lane, so masking it is its fp32
 * value; the even one shifted up is its own. Each lane adds the odd
 * product first, as vdpbf16ps does. */
KILN_AVX2_INLINE void fb_step(const int R, const int C, __m256 acc[FB_RMAX][FB_CMAX][2], int h,
                              const uint16_t *x, long ldx, const uint16_t *const *wb) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 xo[FB_RMAX], xe[FB_RMAX];
    for (int r = 0; r < R; r++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + r * ldx + 16 * h));
        xo[r] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
        xe[r] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    for (int c = 0; c < C; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(wb[c] + 16 * h));
        __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
        __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        for (int r = 0; r < R; r++) {
            acc[r][c][h] = _mm256_fmadd_ps(xo[r], wo, acc[r][c][h]);
            acc[r][c][h] = _mm256_fmadd_ps(xe[r], we, acc[r][c][h]);
        }
    }
}

KILN_AVX2_INLINE void fb_tile(const int R, const int C, const uint16_t *x, long ldx,
                              const uint16_t *w, long ldw, long len, int cols, float *y, long ldy,
                              const struct bf16_tile_io *io) {
    long wo[FB_CMAX];
    for (int c = 0; c < C; c++) wo[c] = (c < cols ? c : cols - 1) * ldw;
    __m256 acc[FB_RMAX][FB_CMAX][2] = {{{_mm256_setzero_ps()}}};
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            for (int h = 0; h < 2; h++)
                acc[r][c][h] = io->acc_in ? _mm256_loadu_ps(io->acc_in + (r * C + c) * 16 + 8 * h)
                                          : _mm256_setzero_ps();
    const long full = len / 32, nb = (len + 31) / 32, pf_step = bf16_pf_step(io, nb);
    const uint16_t *wb[FB_CMAX];
    for (long b = 0; b < full; b++) {
        if (io->pf) bf16_prefetch_block(io, b, pf_step);
        for (int c = 0; c < C; c++) wb[c] = w + b * io->wstep + wo[c];
        fb_step(R, C, acc, 0, x + b * 32, ldx, wb);
        fb_step(R, C, acc, 1, x + b * 32, ldx, wb);
    }
    if (full < nb) { /* w's tail through a zero-padded copy; x is padded */
        const long kb = full * 32;
        uint16_t buf[FB_CMAX][32];
        for (int c = 0; c < C; c++) {
            memset(buf[c], 0, sizeof buf[c]);
            memcpy(buf[c], w + full * io->wstep + wo[c], (size_t)(len - kb) * sizeof(uint16_t));
            wb[c] = buf[c];
        }
        fb_step(R, C, acc, 0, x + kb, ldx, wb);
        fb_step(R, C, acc, 1, x + kb, ldx, wb);
    }
    if (io->acc_out) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                for (int h = 0; h < 2; h++) _mm256_storeu_ps(io->acc_out + (r * C + c) * 16 + 8 * h, acc[r][c][h]);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < cols; c++) {
            float a[16];
            _mm256_storeu_ps(a, acc[r][c][0]);
            _mm256_storeu_ps(a + 8, acc[r][c][1]);
            float s = tree16(a);
            y[r * ldy + c] = io->bias ? s + io->bias[c] : s;
        }
}

static __attribute__((target("avx2,fma"), noinline)) void fb_tile_any(
    int R, int C, const uint16_t *x, long ldx, const uint16_t *w, long ldw, long len, int cols, float *y,
    long ldy, const struct bf16_tile_io *io) {
    switch (R * 16 + C) {
    case 0x14: fb_tile(1, 4, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x12: fb_tile(1, 2, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    case 0x22: fb_tile(2, 2, x, ldx, w, ldw, len, cols, y, ldy, io); break;
    default: KILN_ASSERT_MSG(0, "cpu_matmul_bf16: tile shape not instantiated");
    }
}

static const struct bf16_kernel kFallback = {
    .tile = fb_tile_any,
    .stream_r = {0, 1, 2, 2, 2, 2, 2, 2, 2},
    .stream_c = {0, 4, 2, 2, 2, 2, 2, 2, 2},
    .pack_r = 2,
    .pack_c = 2,
    .kchunk_min = 4096,
    .kchunk = 2048,
};

void cpu_matmul_bf16_range_avx2(const struct cpu_matmul_job *job, long j0, long j1) {
    cpu_matmul_bf16_drive(job, j0, j1, &kFallback);
}

#endif
