#include "tensor/dtype.h"

const struct dtype_info dtype_info[DTYPE_COUNT] = {
    [DTYPE_F32] = {"F32", 4},     [DTYPE_F16] = {"F16", 2},         [DTYPE_BF16] = {"BF16", 2},
    [DTYPE_F64] = {"F64", 8},     [DTYPE_I64] = {"I64", 8},         [DTYPE_I32] = {"I32", 4},
    [DTYPE_I16] = {"I16", 2},     [DTYPE_I8] = {"I8", 1},           [DTYPE_U8] = {"U8", 1},
    [DTYPE_BOOL] = {"BOOL", 1},   [DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

int dtype_from_name(const char *name) {
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (!strcmp(dtype_info[i].name, name)) return i;
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
