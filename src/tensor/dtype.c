#include "tensor/dtype.h"

const struct dtype_info dtype_info[DTYPE_COUNT] = {
    [DTYPE_F32] = {"F32", 4},     [DTYPE_F16] = {"F16", 2},         [DTYPE_BF16] = {"BF16", 2},
    [DTYPE_F64] = {"F64", 8},     [DTYPE_I64] = {"I64", 8},         [DTYPE_I32] = {"I32", 4},
    [DTYPE_I16] = {"I16", 2},     [DTYPE_I8] = {"I8", 1},           [DTYPE_U8] = {"U8", 1},
    [DTYPE_BOOL] = {"BOOL", 1},   [DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [DTYPE_MXFP4] = {"MXFP4", 0},
};

int dtype_from_name(const char *name) {
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (i != DTYPE_MXFP4 && !strcmp(dtype_info[i].name, name)) return i;
    return -1;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

float fp8_e4m3_to_f32(uint8_t v) {
    uint32_t sign = (uint32_t)(v & 0x80) << 24, exp = (v >> 3) & 0xf, man = v & 7, u;
    if (exp == 0xf && man == 7) {
        u = sign | 0x7fc00000u; /* e4m3fn has no infinity: S.1111.111 is NaN */
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: man / 8 * 2^-6 */
            exp = 127 - 7 + 1;
            while (!(man & 8)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 7) << 20);
        }
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint8_t f32_to_fp8_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f); /* NaN */
    /* 448 = 1.75 * 2^8 is the largest finite value; from 464 (the midpoint
     * to the next step, 480, which is NaN's code) on, saturate */
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7e);
    int32_t exp = (int32_t)(a >> 23) - 127; /* unbiased */
    uint32_t man = (a & 0x7fffff) | 0x800000;
    if (exp < -6) { /* subnormal in e4m3: steps of 2^-9 */
        if (exp < -10) return sign; /* below half the smallest subnormal */
        uint32_t shift = (uint32_t)(20 + (-6 - exp)); /* keep man's top (3 - (-6 - exp)) bits */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (q & 1))) q++;
        return (uint8_t)(sign | q); /* q == 8 is the smallest normal, exp field 1 */
    }
    uint32_t q = (uint32_t)(exp + 7) << 3 | ((man >> 20) & 7), rem = man & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (q & 1))) q++;
    return (uint8_t)(sign | q);
}
