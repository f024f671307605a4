/* dtype.h — element types and scalar conversions.
 *
 * Weights keep their checkpoint dtype in memory (bf16 mostly); kernels widen
 * to fp32 in registers. The table `dtype_info` is the one place that knows
 * names and sizes; safetensors names ("BF16") map through dtype_from_name.
 */
#ifndef KILN_TENSOR_DTYPE_H
#define KILN_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_F64,
    DTYPE_I64,
    DTYPE_I32,
    DTYPE_I16,
    DTYPE_I8,
    DTYPE_U8,
    DTYPE_BOOL,
    DTYPE_F8_E4M3,
    DTYPE_F8_E5M2,
    /* MXFP4 (OCP microscaling, gpt-oss's expert weights): a [rows][cols]
     * matrix is rows × cols/2 bytes of e2m1 codes, two a byte, the low
     * nibble the even column, plus a uint8 e8m0 exponent per row and 32
     * columns (struct backend_weight.e8m0): value = e2m1 × 2^(e - 127).
     * A weight type only, never a checkpoint dtype (dtype_from_name does
     * not return it); its size is 0 (packed: mxfp4_bytes). */
    DTYPE_MXFP4,
    DTYPE_COUNT
};

struct dtype_info {
    const char *name; /* safetensors spelling */
    size_t size;      /* bytes per element */
};

extern const struct dtype_info dtype_info[DTYPE_COUNT];

/* Returns the dtype for a safetensors name, or -1. */
int dtype_from_name(const char *name);
static inline size_t dtype_size(enum dtype t) { return dtype_info[t].size; }
static inline const char *dtype_name(enum dtype t) { return dtype_info[t].name; }

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
/* float8 e4m3fn (4 exponent bits, bias 7, no infinities, S.1111.111 NaN,
 * largest finite 448): exact widening, and rounding to nearest even with
 * values past 448 saturated to ±448 (what block quantization wants: its
 * scales keep every value in range). */
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);

/* Bytes of an MXFP4 [rows][cols] matrix's codes (cols even). */
static inline size_t mxfp4_bytes(long rows, long cols) { return (size_t)rows * (size_t)cols / 2; }

#endif
