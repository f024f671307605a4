/* cuda_attn_common.cuh — what the attention kernel files share (CUDA
 * C++, included by .cu files only): the cache element type a call reads
 * and the scales folded into the kernels (FP8 cache: K's scale into the
 * softmax scale, V's into the output), the first position a sliding
 * window lets a query see, and an attention sink's share of a row's sum. */
#ifndef KILN_BACKEND_CUDA_ATTN_COMMON_CUH
#define KILN_BACKEND_CUDA_ATTN_COMMON_CUH

#include <math.h>

#include "backend/cuda/cuda_common.cuh"

/* The element type the kernels read for these caches, and the scales they
 * fold in (K's into the softmax scale, V's into the output). */
enum { KV_F32, KV_BF16, KV_FP8 };
static inline int kv_type(const struct cuda_ctx *c, const struct attn_params *p) {
    return p->f32_cache ? KV_F32 : c->kv_fp8 ? KV_FP8 : c->kv_bf16 ? KV_BF16 : KV_F32;
}
static inline float k_scale_of(const struct cuda_ctx *c, const struct attn_params *p) {
    return kv_type(c, p) == KV_FP8 ? p->scale * p->k_scale : p->scale;
}
static inline float v_scale_of(const struct cuda_ctx *c, const struct attn_params *p) {
    return kv_type(c, p) == KV_FP8 ? p->v_scale : 1.0f;
}

/* The first position a query at position len − 1 sees (attn_params.window). */
static __device__ __forceinline__ int window_first(int window, int len) {
    return window > 0 && len > window ? len - window : 0;
}

/* The sink's share of a row's softmax sum, exp(sink − m) (m: the row's
 * running max in the kernel's domain, log2 when log2); 0 without sinks. */
static __device__ __forceinline__ float sink_share(const float *sinks, int h, float m, bool log2) {
    if (!sinks) return 0.0f;
    return log2 ? exp2f(__fmul_rn(sinks[h], 1.4426950408889634f) - m) : expf(sinks[h] - m);
}

#endif
