/* attn_prefill.h — Hopper (sm_90a) prefill attention with wgmma
 * (hopper/attn_prefill.cu). Built only when kiln_cuda_hopper is (CUDA
 * architectures 90*, KILN_CUDA_HOPPER defined); callers check the device's
 * compute capability (9.0) before calling. */
#ifndef KILN_BACKEND_CUDA_HOPPER_ATTN_PREFILL_H
#define KILN_BACKEND_CUDA_HOPPER_ATTN_PREFILL_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The contract of fa_prefill_kernel (cuda_attn_prefill.cu): q fp32
 * [tokens][ldq] (head h at h·dk), out fp32 [tokens][ldo] (head h at h·dv),
 * K and V bf16 in the paged cache (slot s of KV head g at k_cache +
 * s·k_stride + g·dk, v_cache + s·v_stride + g·dv), causal by absolute
 * position, query head h reads KV head h / group, scale_log2 = softmax
 * scale · log2(e). Only the rows of sequences with more than one new token
 * are computed; a sliding window and attention sinks as fa_prefill_kernel
 * honours them. Head sizes dk × dv: 128 × 128 or 192 × 128
 * (cuda_hopper_attn_prefill_shape). Requirements (checked
 * by the caller): q, k_cache, v_cache 16-byte aligned, ldq % 4 == 0,
 * k_stride % 8 == 0, v_stride % 8 == 0, out 8-byte aligned, ldo even. */
struct hopper_attn_args {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const void *k_cache, *v_cache;
    long k_stride, v_stride;
    int n_heads, group;
    float scale_log2;
    int n_seqs, page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int dk, dv;
    int window;         /* attn_params.window (0: none): a row sees its last window positions */
    const float *sinks; /* attn_params.sinks (NULL: none): one logit per query head */
};

/* 1 when the kernel is built for head sizes dk × dv. */
int cuda_hopper_attn_prefill_shape(int dk, int dv);

/* Launches the kernel on stream for a batch of n_tokens rows in n_seqs
 * sequences. */
void cuda_hopper_attn_prefill(const struct hopper_attn_args *a, int n_tokens, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
