/* cpu_matmul_fp8.c — widening of block-quantized float8 e4m3 weight rows
 * into fp32 for cpu_matmul (see cpu_matmul_kernels.h, "FP8 weights").
 *
 * Element (r, c) is fp8_e4m3_to_f32(w[r][c]) * scale[r / block_rows][c /
 * block_cols], the product rounded to fp32 once: torch's `q.float() * s`.
 * cpu_matmul_fp8_row writes a row of these where a kernel packs a panel or
 * cannot widen in registers; the F32 tiles then run on it, so an FP8
 * product is bitwise the product of an fp32 copy of the dequantized
 * weights. The SIMD stream tiles widen in registers the same way as the
 * vector path here, without the NaN fix, for rows that pass the checks
 * below (cpu_matmul_fp8_scales_ok, cpu_matmul_fp8_has_nan).
 *
 * The vector path widens 8 codes at a time without a table: the code's
 * magnitude bits shifted left by 7 are the float16 with the same exponent
 * and mantissa fields, whose value is the e4m3 value times 2^-8 (exponent
 * bias 15 against 7; e4m3's subnormals land on float16 subnormals, which
 * vcvtph2ps widens exactly). Multiplying by scale * 2^8 then gives the
 * exact product rounded once, as the scalar path's table value times the
 * scale does: scale * 2^8 is exact, so both round the same real number.
 * The one code e4m3fn gives no finite value, S.1111.111, becomes float16
 * NaN 0x7e00 (fp32 0x7fc00000, as the scalar widening). Scales above 2^100
 * in magnitude (where scale * 2^8 could overflow; never in a checkpoint)
 * take the scalar path.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_matmul_kernels.h"

static float g_fp8_table[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;

static void fp8_table_init(void) {
    for (int v = 0; v < 256; v++) g_fp8_table[v] = fp8_e4m3_to_f32((uint8_t)v);
}

/* The scalar widening of one 8-block starting at kk: per-element scales,
 * zeros past k. */
static void block_scalar(const uint8_t *w, const float *srow, long bc, long kk, long k, float *dst) {
    for (int l = 0; l < 8; l++) {
        long c = kk + l;
        dst[l] = c < k ? g_fp8_table[w[c]] * srow[c / bc] : 0.0f;
    }
}

#if defined(__x86_64__)
#define KILN_FP8_AVX2 __attribute__((target("avx2,fma,f16c")))

/* 8 codes widened and multiplied by s256 = scale * 2^8 (see the top). */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256 widen8(const uint8_t *p,
                                                                                    __m256 s256) {
    __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i mag = _mm_and_si128(v, _mm_set1_epi16(0x7f));
    __m128i h = _mm_slli_epi16(mag, 7);
    h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    h = _mm_or_si128(h, _mm_and_si128(_mm_slli_epi16(v, 8), _mm_set1_epi16((short)0x8000)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), s256);
}

static KILN_FP8_AVX2 void row_avx2(const uint8_t *w, const float *srow, long bc, long k, float *dst,
                                   long bstride) {
    long kk = 0;
    while (kk < k) {
        const long cb = kk / bc, c1 = (cb + 1) * bc < k ? (cb + 1) * bc : k;
        const float s = srow[cb];
        if (kk + 8 <= c1 && fabsf(s) <= 0x1p100f) {
            const __m256 s256 = _mm256_set1_ps(s * 256.0f);
            for (; kk + 8 <= c1; kk += 8) _mm256_storeu_ps(dst + kk / 8 * bstride, widen8(w + kk, s256));
            continue;
        }
        /* a block across a scale boundary, the zero-padded tail, or a huge scale */
        block_scalar(w, srow, bc, kk, k, dst + kk / 8 * bstride);
        kk += 8;
    }
}
#endif

void cpu_matmul_fp8_row(const struct cpu_matmul_job *job, long r, float *dst, long bstride, int avx2) {
    pthread_once(&g_fp8_once, fp8_table_init);
    const long k = job->k, bc = job->block_cols, nbc = (k + bc - 1) / bc;
    const uint8_t *w = (const uint8_t *)job->w + r * k;
    const float *srow = job->scale + r / job->block_rows * nbc;
#if defined(__x86_64__)
    if (avx2) {
        row_avx2(w, srow, bc, k, dst, bstride);
        return;
    }
#endif
    (void)avx2;
    for (long kk = 0; kk < k; kk += 8) block_scalar(w, srow, bc, kk, k, dst + kk / 8 * bstride);
}

int cpu_matmul_fp8_scales_ok(const struct cpu_matmul_job *job, long j0, long j1) {
    if (j0 >= j1) return 1;
    const long nbc = (job->k + job->block_cols - 1) / job->block_cols;
    const float *s = job->scale + j0 / job->block_rows * nbc;
    const float *e = job->scale + ((j1 - 1) / job->block_rows + 1) * nbc;
    for (; s < e; s++)
        if (!(fabsf(*s) <= 0x1p100f)) return 0;
    return 1;
}

#if defined(__x86_64__)
static KILN_FP8_AVX2 int has_nan_avx2(const uint8_t *p, long bytes) {
    const __m256i top = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(-1);
    __m256i any = _mm256_setzero_si256();
    long i = 0;
    for (; i + 32 <= bytes; i += 32)
        any = _mm256_or_si256(
            any, _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + i)), top), ones));
    int found = !_mm256_testz_si256(any, any);
    for (; i < bytes; i++) found |= (p[i] & 0x7f) == 0x7f;
    return found;
}
#endif

int cpu_matmul_fp8_has_nan(const uint8_t *p, long bytes, int avx2) {
#if defined(__x86_64__)
    if (avx2) return has_nan_avx2(p, bytes);
#endif
    (void)avx2;
    for (long i = 0; i < bytes; i++)
        if ((p[i] & 0x7f) == 0x7f) return 1;
    return 0;
}
