/* cpu_backend.h — the portable CPU backend: fp32 arithmetic over weights
 * kept in their checkpoint dtype, a thread pool for data parallelism.
 *
 * Every operation computes each token row independently of the other rows
 * of the batch and with a fixed reduction order, so a sequence's results
 * do not depend on what else is batched with it or on chunk boundaries
 * (the scheduler's batch-invariance tests rely on this).
 */
#ifndef KILN_BACKEND_CPU_BACKEND_H
#define KILN_BACKEND_CPU_BACKEND_H

#include "tensor/backend.h"

struct threadpool;

/* The context shared by the CPU operation files. */
struct cpu_ctx {
    struct threadpool *tp;
    int n_threads;
    int matmul_bf16; /* KILN_CPU_MATMUL=bf16: products with bf16 weights in bf16 */
    int kv_fp8;      /* backend_options.kv_fp8: the KV cache holds e4m3 (kv_dtype) */
    long max_tokens, max_context;
    int max_heads;
    float *attn_scratch; /* [n_threads][max_context] scores */
    /* grow-only scratch for the MoE operation */
    float *moe_buf;
    size_t moe_buf_floats;
    int32_t *moe_idx;
    size_t moe_idx_count;
};

int cpu_backend_create(struct backend *be, const struct backend_options *opt,
                       struct kiln_error *err);

/* dst[k] = fp8_e4m3_to_f32(src[k]) * scale: an FP8 KV row read back. */
void cpu_fp8_widen(float *dst, const uint8_t *src, long n, float scale);

/* Operations implemented in their own files. */
void cpu_attention(void *ctx, float *out, long ldo, const float *q, long ldq, const void *k_cache,
                   const void *v_cache, const struct attn_params *p, const struct backend_batch *b);
void cpu_moe_route(void *ctx, int32_t *ids, float *weights, const float *logits, const float *bias,
                   const struct moe_route_params *p, long n);
void cpu_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids, const float *weights,
                 int top_k, const struct moe_experts *e, long n);
/* Host scratch of cpu_moe_ffn for a chunk of `rows` (token, slot) rows. */
size_t cpu_moe_scratch_bytes(long rows, long hidden, long inter);
void cpu_matmul_op(void *ctx, float *y, long ldy, const float *x, long ldx,
                   const struct backend_weight *w, const float *bias, long n);
void cpu_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u, long ldu,
                  long n, long dim);

#endif
