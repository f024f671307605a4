/* mxfp4.h — MXFP4 (OCP microscaling with e2m1 elements), the format of
 * gpt-oss's published expert weights: blocks of 32 values, each block 16
 * bytes of 4-bit e2m1 codes (two a byte, the low nibble the even element)
 * and one e8m0 exponent byte e: value = e2m1(code) × 2^(e - 127), e2m1 =
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives (code bit 3 the sign).
 *
 * mxfp4_encode32 quantizes one block the OCP way, as the checkpoints are
 * made (and scripts/oracle/make_mxfp4_gpt_oss.py, transformers' reader
 * its check): e = floor(log2(max |x|)) - 2 + 127 (0 for an all-zero
 * block), each value rounded to the nearest e2m1 code of x / 2^(e - 127),
 * ties to the even code, saturating at ±6. Plain C, __host__ __device__
 * under nvcc, so dummy MXFP4 weights made on the device have the host's
 * bytes. */
#ifndef KILN_TENSOR_MXFP4_H
#define KILN_TENSOR_MXFP4_H

#include <math.h>
#include <stdint.h>

/* The e8m0 exponent byte that encodes NaN (no scale). */
enum { MXFP4_E8M0_NAN = 255 };

#ifdef __CUDACC__
#define MXFP4_FN static inline __host__ __device__
#else
#define MXFP4_FN static inline
#endif

/* The e2m1 code (sign in bit 3) nearest v, ties to the even code,
 * saturating at ±6. */
MXFP4_FN uint8_t mxfp4_code(float v) {
    float m = fabsf(v);
    uint8_t c = m <= 0.25f ? 0 : m < 0.75f ? 1 : m <= 1.25f ? 2 : m < 1.75f ? 3
              : m <= 2.5f  ? 4 : m < 3.5f  ? 5 : m <= 5.0f  ? 6 : 7;
    return (uint8_t)(c | (signbit(v) ? 8 : 0));
}

/* One block: x[32] to codes[16] and *e. x must be finite. */
MXFP4_FN void mxfp4_encode32(const float *x, uint8_t *codes, uint8_t *e) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    int ex = -127; /* floor(log2(amax)) - 2: frexp's amax = f · 2^k, f in [0.5, 1) */
    if (amax > 0.0f) {
        int k;
        (void)frexpf(amax, &k);
        ex = k - 1 - 2;
        if (ex < -127) ex = -127;
        if (ex > 127) ex = 127;
    }
    *e = (uint8_t)(ex + 127);
    for (int i = 0; i < 16; i++)
        codes[i] = (uint8_t)(mxfp4_code(ldexpf(x[2 * i], -ex)) | (mxfp4_code(ldexpf(x[2 * i + 1], -ex)) << 4));
}

/* Decodes n_blocks blocks (16 code bytes each, exponents[n_blocks]) into
 * out[32 · n_blocks] fp32, exactly. Returns -1, or the first block whose
 * exponent is 255 (NaN in e8m0) or whose values fp32 cannot hold. */
long mxfp4_decode(const uint8_t *codes, const uint8_t *exponents, long n_blocks, float *out);

#endif
