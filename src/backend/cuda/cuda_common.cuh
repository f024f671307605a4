/* cuda_common.cuh — device helpers shared by the kernel files (CUDA C++,
 * included by .cu files only): warp and block reductions, 16-bit loads,
 * grid sizing. Everything here is static inline, so each .cu file gets its
 * own copy and exports nothing beyond its extern "C" entry points. */
#ifndef KILN_BACKEND_CUDA_COMMON_CUH
#define KILN_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_backend.h"

/* Sums / maxima over the 32 lanes of a warp, result in every lane. The
 * butterfly order is fixed, so results do not depend on timing. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024), result in
 * every thread. shared: 32 floats. Ends with the block synchronized, so the
 * caller may reuse `shared` afterwards only after another __syncthreads. */
static __device__ __forceinline__ float block_sum(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < nw ? shared[lane] : 0.0f;
    t = warp_sum(t);
    return t;
}

static __device__ __forceinline__ float block_max(float v, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < nw ? shared[lane] : -INFINITY;
    return warp_max(t);
}

/* Element i of a weight of dtype dt, widened to fp32. */
static __device__ __forceinline__ float load_as_f32(const void *p, size_t i, int dt) {
    switch (dt) {
    case DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Blocks for n items of `per_block` each, capped so grid-stride loops cover
 * the rest (grid.x is limited to 2^31-1, grid.y to 65535). */
static inline unsigned grid_for(long n, int per_block) {
    long b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > (1l << 30)) b = 1l << 30;
    return (unsigned)b;
}

/* KV cache elements: fp32 or bf16 (struct cuda_ctx.kv_bf16); math in fp32. */
static __device__ __forceinline__ void kv_put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void kv_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
static __device__ __forceinline__ float kv_get(const float *p) { return *p; }
static __device__ __forceinline__ float kv_get(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
/* four consecutive elements (16-byte aligned fp32, 8-byte aligned bf16) */
static __device__ __forceinline__ float4 kv_get4(const float *p) { return __ldg((const float4 *)p); }
static __device__ __forceinline__ float4 kv_get4(const __nv_bfloat16 *p) {
    uint2 u = __ldg((const uint2 *)p);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
    float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* The FP8 cache (struct cuda_ctx.kv_fp8, --kv-cache-dtype fp8_e4m3): e4m3
 * elements that read as fp8(q) · scale (the layer's k_scale / v_scale).
 * kv_get / kv_get4 return fp8(q) unscaled (exact in fp32, and in bf16:
 * e4m3 has 3 mantissa bits and exponents bf16 holds); the attention kernels
 * fold the scales into the softmax scale (K) and the output (V).
 * kv_put_s stores x / scale rounded to nearest even, saturating at ±448
 * (the CPU's f32_to_fp8_e4m3); on the other types it is kv_put. */
typedef __nv_fp8_e4m3 kv_fp8_t;
static __device__ __forceinline__ float kv_get(const kv_fp8_t *p) { return float(*p); }
/* four consecutive fp8 elements (4-byte aligned) */
static __device__ __forceinline__ float4 kv_get4(const kv_fp8_t *p) {
    uint32_t u = __ldg((const unsigned int *)p);
    __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
    __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
    float2 fa = __half22float2(*(const __half2 *)&a), fb = __half22float2(*(const __half2 *)&b);
    return make_float4(fa.x, fa.y, fb.x, fb.y);
}
static __device__ __forceinline__ void kv_put_s(float *p, float v, float) { *p = v; }
static __device__ __forceinline__ void kv_put_s(__nv_bfloat16 *p, float v, float) {
    *p = __float2bfloat16_rn(v);
}
static __device__ __forceinline__ void kv_put_s(kv_fp8_t *p, float v, float scale) {
    p->__x = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

/* 8 bf16 / f16 values packed in a uint4, widened to fp32 (the third
 * argument picks the type) */
static __device__ __forceinline__ void widen8(const uint4 &p, float *f, const __nv_bfloat16 *) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
static __device__ __forceinline__ void widen8(const uint4 &p, float *f, const __half *) {
    const __half2 *h = (const __half2 *)&p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

/* v rounded to the 16-bit type */
static __device__ __forceinline__ void store16(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
static __device__ __forceinline__ void store16(__half *p, float v) { *p = __float2half_rn(v); }

static inline cudaStream_t ctx_stream(void *ctx) { return ((struct cuda_ctx *)ctx)->stream; }

/* The end of a GEMV warp's sums (cuda_gemv.cu, cuda_fp8.cu,
 * cuda_moe_quant.cu): acc[RG][NR] (its first m activation rows) summed across
 * the lanes by warp_sum's butterfly, so every lane holds the same bits, and
 * with a K split (KS > 1) the KS consecutive warps of a row group (parts 0
 * .. KS - 1) added through red (RG·NR floats a warp of shared memory) in
 * part order into part 0's acc. Every thread of the block calls it; 0: the
 * warp is done (a later part). */
template <int RG, int NR, int KS>
static __device__ __forceinline__ int gemv_reduce(float (&acc)[RG][NR], float *red, int warp, int part,
                                                  int m = NR) {
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++)
            if (j < m) acc[q][j] = warp_sum(acc[q][j]);
    if (KS == 1) return 1;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int q = 0; q < RG; q++)
#pragma unroll
            for (int j = 0; j < NR; j++)
                if (j < m) red[(warp * RG + q) * NR + j] = acc[q][j];
    __syncthreads();
    if (part != 0) return 0;
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++)
            if (j < m) {
                float s = red[(warp * RG + q) * NR + j];
#pragma unroll
                for (int k = 1; k < KS; k++) s += red[((warp + k) * RG + q) * NR + j];
                acc[q][j] = s;
            }
    return 1;
}

/* The K split of the GEMVs (cuda_gemv.cu, cuda_fp8.cu, cuda_moe_quant.cu)
 * for a weight of rows × cols, in pieces of 8 columns: 4 parts from 1,024
 * pieces (8,192 columns) on, and from 512 for weights of fewer than 4,096
 * rows; 2 parts for 512-1,023 pieces and 4,096 rows or more; below 512
 * pieces 2 parts from 256 where two256 (the FP8 GEMVs), else none. Every
 * part keeps at least 128 pieces, 4 steps a lane. Fewer parts give each
 * warp more bytes in flight; more parts keep a small weight's grid over
 * the SMs. Measured:
 *  - H100, bf16 (bench_gemv, bench_forward; docs/cuda-decode.md
 *    "Products"): splitting was the fastest for every Llama-3.1-8B shape
 *    (q|k|v 86 → 94% of the copy bandwidth at n = 1 with 4 parts, 92%
 *    with 2), while Qwen3-0.6B (rows of 1024 to 3072 columns) decoded
 *    faster unsplit than with 2 or 4 parts;
 *  - H200, one row: 2 parts for every 4,096-column Llama-3.1-8B product
 *    against 4 took FP8 from 310 to 330 tok/s and bf16 from 222.0 to 235.2
 *    (85 → 91% of the copy bandwidth; at 2 rows bf16 427.2 → 414.2);
 *    Qwen3-30B-A3B's 2,048 × 4,096 FP8 o_proj in 2 parts (512 CTAs) was
 *    slower. The FP8 2-part tier below 512 pieces is the bf16 count, not
 *    measured; the H100 has not been measured with the row rule.
 * A function of the weight's shape only, never of n, so a row's sums run
 * in one order whatever its batch (for SwiGLU, the stacked gate|up's
 * shape, so the fused epilogue gets the plain kernel's bits).
 * KILN_CUDA_GEMV_KS forces 1, 2 or 4. */
static inline int gemv_k_parts(const struct cuda_ctx *c, long rows, long cols, bool two256) {
    if (c->gemv_ks == 1 || c->gemv_ks == 2 || c->gemv_ks == 4) return c->gemv_ks;
    const long np = cols / 8;
    if (np >= 8 * 128 || (np >= 4 * 128 && rows < 4096)) return 4;
    if (np >= 4 * 128) return 2;
    return two256 && np >= 2 * 128 ? 2 : 1;
}

/* Activations in e4m3 per row and 128 columns (the operand of the FP8
 * products: cuda_fp8_quant_act and the kernels that write it as they
 * produce the values, one warp a group, so all give the same bytes): the
 * group's scale from its largest magnitude (448, e4m3's largest, maps to
 * it) and each value's code. */
static __device__ __forceinline__ float q8_warp_scale(float amax) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    return __fdiv_rn(fmaxf(amax, 1e-12f), 448.0f);
}
static __device__ __forceinline__ uint32_t q8_code(float v, float sc) {
    return (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, sc), __NV_SATFINITE, __NV_E4M3);
}

#endif
