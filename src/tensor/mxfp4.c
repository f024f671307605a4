/* mxfp4.c — MXFP4 decoding (mxfp4.h). */
#include "tensor/mxfp4.h"

/* e2m1 by its 4-bit code */
static const float e2m1_value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

long mxfp4_decode(const uint8_t *codes, const uint8_t *exponents, long n_blocks, float *out) {
    for (long b = 0; b < n_blocks; b++) {
        int e = (int)exponents[b] - 127;
        for (int k = 0; k < 16; k++) {
            uint8_t v = codes[b * 16 + k];
            float lo = ldexpf(e2m1_value[v & 15], e), hi = ldexpf(e2m1_value[v >> 4], e);
            if (exponents[b] == MXFP4_E8M0_NAN || !isfinite(lo) || !isfinite(hi)) return b;
            out[b * 32 + 2 * k] = lo;
            out[b * 32 + 2 * k + 1] = hi;
        }
    }
    return -1;
}
