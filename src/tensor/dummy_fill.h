/* dummy_fill.h — the values of dummy (random) weights, one counter-based
 * generator for the host and the device: element i of tensor t is a pure
 * function of (seed, t, i), so the weights.c host fill and a device
 * kernel (backend_ops.weight_dummy, CUDA: cuda_dummy.cu) give the same
 * bytes, and a tensor's values do not depend on the order it was made in.
 *
 * Each tensor has a block of DUMMY_BLOCK values, uniform in [-scale,
 * scale) from a splitmix64 hash of (seed, t, j), and element i is block
 * value (offset_t + i) mod DUMMY_BLOCK: on the host the tensor is the
 * block tiled with memcpy (multi-GB models fill at memory speed), and a
 * prime period keeps rows of any width from repeating each other.
 * Never zeros (zeros can run faster than real data).
 *
 * Plain C, and __host__ __device__ under nvcc. */
#ifndef KILN_TENSOR_DUMMY_FILL_H
#define KILN_TENSOR_DUMMY_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

#ifdef __CUDACC__
#define DUMMY_FN static inline __host__ __device__
#else
#define DUMMY_FN static inline
#endif

enum { DUMMY_BLOCK = 4093 };

/* One tensor (or one part of a stacked tensor) to fill. */
struct dummy_part {
    uint64_t seed, tensor; /* the model's seed, the tensor's index in load order */
    size_t n;              /* elements */
    float scale;           /* values in [-scale, scale) */
    enum dtype dtype;      /* BF16, F16, F32, F8_E4M3 or MXFP4 (below) */
    /* F8_E4M3 (dummy weights under --quantization fp8): the tensor's values
     * in dtype src (BF16 or F32), then block-quantized as --quantization
     * fp8 quantizes a checkpoint (model/weights.c fp8_quantize_blocks):
     * [rows][cols] (rows·cols = n) in blocks of block_rows × block_cols,
     * each block's scale max(max|x|, 1e-12) / 448 in fp32 and each code
     * the e4m3 rounding (to nearest even, saturating) of x / scale. */
    /* MXFP4 (dummy experts of an MXFP4 checkpoint's config on a backend
     * with backend_ops.mxfp4_experts): the values in dtype src, then each
     * run of 32 (rows·cols = n, cols % 32 == 0) encoded by
     * mxfp4_encode32 (tensor/mxfp4.h). */
    enum dtype src;
    long rows, cols;
    int block_rows, block_cols;
};

/* splitmix64's output function (Steele, Lea, Flood 2014). */
DUMMY_FN uint64_t dummy_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

DUMMY_FN uint64_t dummy_hash(uint64_t seed, uint64_t tensor, uint64_t j) {
    return dummy_mix(seed ^ dummy_mix(tensor * 0x9e3779b97f4a7c15ull + j + 1));
}

/* Block value j of a tensor, in [-1, 1): 24 random bits, exact in fp32. */
DUMMY_FN float dummy_unit(uint64_t seed, uint64_t tensor, uint64_t j) {
    return (float)(dummy_hash(seed, tensor, j) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

/* Where element 0 starts in the tensor's block. */
DUMMY_FN uint64_t dummy_offset(uint64_t seed, uint64_t tensor) {
    return dummy_hash(seed, tensor, DUMMY_BLOCK) % DUMMY_BLOCK;
}

/* Element i's value (before the dtype's rounding). The product by scale
 * is one rounding on both sides. */
DUMMY_FN float dummy_value(const struct dummy_part *p, uint64_t off, size_t i) {
    return dummy_unit(p->seed, p->tensor, (off + i) % DUMMY_BLOCK) * p->scale;
}

/* fp32 to bf16, round to nearest even (as f32_to_bf16 in dtype.h). */
DUMMY_FN uint16_t dummy_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    uint32_t u = v.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#undef DUMMY_FN

#endif
