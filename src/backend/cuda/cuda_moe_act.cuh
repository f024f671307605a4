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

#endif
