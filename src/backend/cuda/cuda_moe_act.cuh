/* cuda_moe_act.cuh — what the epilogues of the experts' products apply
 * (CUDA C++, included by the MoE .cu files only): the experts' biases
 * and the activation between gate|up and down (struct moe_experts: act,
 * alpha, limit, gate_bias / up_bias / down_bias).
 *
 * The values follow cpu_moe.c's order: each product's fp32 sum, plus its
 * bias (one rounding), then the activation of the biased g and u; down's
 * sum plus its bias is the expert's output, which the top-k combine then
 * weighs. Every rounding is spelled out (__fadd_rn, __fmul_rn, __fdiv_rn)
 * so that each kernel computing it gives the same bits whatever the
 * compiler contracts around it. */
#ifndef KILN_BACKEND_CUDA_MOE_ACT_CUH
#define KILN_BACKEND_CUDA_MOE_ACT_CUH

#include "backend/cuda/cuda_pdl.cuh"

/* An epilogue's view of struct moe_experts (a kernel parameter). The
 * biases are device fp32 rows indexed by the tile's expert (0 ..
 * n_experts - 1): gate_bias, up_bias [E][inter], down_bias [E][hidden];
 * NULL where there are none. */
struct moe_epi {
    const float *gate_bias, *up_bias, *down_bias;
    int clamp; /* MOE_ACT_SWIGLU_CLAMP */
    float alpha, limit;
};

static inline struct moe_epi moe_epi_of(const struct moe_experts *e) {
    struct moe_epi p = {NULL, NULL, NULL, 0, 0.0f, 0.0f};
    if (!e) return p;
    p.gate_bias = e->gate_bias, p.up_bias = e->up_bias, p.down_bias = e->down_bias;
    p.clamp = e->act == MOE_ACT_SWIGLU_CLAMP;
    p.alpha = e->alpha, p.limit = e->limit;
    return p;
}

/* gpt-oss's clamped SwiGLU (MOE_ACT_SWIGLU_CLAMP), cpu_moe.c's expression:
 * g = min(g, limit), u = clamp(u, -limit, limit),
 * (u + 1) · (g / (1 + exp(-alpha · g))). */
static __device__ __forceinline__ float swiglu_clamp_f32(float g, float u, float alpha, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return __fmul_rn(__fadd_rn(u, 1.0f), __fdiv_rn(g, __fadd_rn(1.0f, expf(-__fmul_rn(alpha, g)))));
}

/* The gate|up epilogue of feature n (of F) of expert e: g and u are the
 * products' fp32 sums. */
static __device__ __forceinline__ float moe_glu_f32(const struct moe_epi &p, int e, long n, long F, float g,
                                                    float u) {
    if (p.gate_bias) g = __fadd_rn(g, __ldg(p.gate_bias + (long)e * F + n));
    if (p.up_bias) u = __fadd_rn(u, __ldg(p.up_bias + (long)e * F + n));
    return p.clamp ? swiglu_clamp_f32(g, u, p.alpha, p.limit) : silu_mul_f32(g, u);
}

/* The down epilogue of output feature n (of H) of expert e. */
static __device__ __forceinline__ float moe_down_f32(const struct moe_epi &p, int e, long n, long H, float v) {
    return p.down_bias ? __fadd_rn(v, __ldg(p.down_bias + (long)e * H + n)) : v;
}

/* The epilogue of the grouped mma.sync products (cuda_gemm_small.cu's
 * 16-bit experts, cuda_moe_quant.cu's FP8 and MXFP4 ones): a CTA of 4
 * warps over the weight rows from n0, the lane holding acc[j] for weight
 * rows n0 + 16·warp + lane/4 (and + 8) and the tile's activation rows
 * 8j + 2·(lane%4) (and + 1), of M. GLU: warps 0-1 hold gate rows, 2-3 the
 * same units' up rows, which pass to warps 0-1 through xs (free shared
 * memory, 2 · MT · 4 · 32 floats); those write y as H rows [M][N] of the
 * activation; else y is fp32 [M][N] of the down sums plus their bias
 * (+ 0.0f turns a -0 sum into +0, as the products have always stored).
 * Every thread of the CTA calls it (GLU meets two barriers). */
template <int MT, bool GLU, typename H>
static __device__ __forceinline__ void moe_mma_epilogue(float (*acc)[4], float *xs, void *y, long ldy, int n0,
                                                        int N, int M, int e, const struct moe_epi &ep) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (GLU) {
        __syncthreads();
        if (warp >= 2)
#pragma unroll
            for (int j = 0; j < MT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) xs[(((warp - 2) * MT + j) * 4 + q) * 32 + lane] = acc[j][q];
        __syncthreads();
        if (warp >= 2) return;
        H *h = (H *)y;
        const int nA = n0 + warp * 16 + (lane >> 2), nB = nA + 8;
#pragma unroll
        for (int j = 0; j < MT; j++) {
            float u[4];
#pragma unroll
            for (int q = 0; q < 4; q++) u[q] = xs[((warp * MT + j) * 4 + q) * 32 + lane];
            int m = j * 8 + 2 * (lane & 3);
            if (m < M) {
                if (nA < N) store16(h + (long)m * ldy + nA, moe_glu_f32(ep, e, nA, N, acc[j][0], u[0]));
                if (nB < N) store16(h + (long)m * ldy + nB, moe_glu_f32(ep, e, nB, N, acc[j][2], u[2]));
            }
            if (m + 1 < M) {
                if (nA < N) store16(h + (long)(m + 1) * ldy + nA, moe_glu_f32(ep, e, nA, N, acc[j][1], u[1]));
                if (nB < N) store16(h + (long)(m + 1) * ldy + nB, moe_glu_f32(ep, e, nB, N, acc[j][3], u[3]));
            }
        }
        return;
    }
    float *o = (float *)y;
    const int nA = n0 + warp * 16 + (lane >> 2), nB = nA + 8;
#pragma unroll
    for (int j = 0; j < MT; j++) {
        int m = j * 8 + 2 * (lane & 3);
        if (m < M) {
            if (nA < N) o[(long)m * ldy + nA] = moe_down_f32(ep, e, nA, N, acc[j][0]) + 0.0f;
            if (nB < N) o[(long)m * ldy + nB] = moe_down_f32(ep, e, nB, N, acc[j][2]) + 0.0f;
        }
        if (m + 1 < M) {
            if (nA < N) o[(long)(m + 1) * ldy + nA] = moe_down_f32(ep, e, nA, N, acc[j][1]) + 0.0f;
            if (nB < N) o[(long)(m + 1) * ldy + nB] = moe_down_f32(ep, e, nB, N, acc[j][3]) + 0.0f;
        }
    }
}

#endif
