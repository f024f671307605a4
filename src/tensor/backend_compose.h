/* backend_compose.h — the layer-level operations of backend_ops
 * (qk_rope_store, norm_matmul, norm_matmul_rope, norm_swiglu_mlp,
 * attention_matmul) composed from a backend's primitives, in the order
 * their comments in backend.h name them. A backend without fusions fills
 * its table with these (through one-line wrappers that pass its own ops);
 * a fusing backend can fall back to them where its fused kernels do not
 * apply. */
#ifndef KILN_TENSOR_BACKEND_COMPOSE_H
#define KILN_TENSOR_BACKEND_COMPOSE_H

#include "tensor/backend.h"

/* y = x · stackᵀ: one product with stack->cat, or the parts one by one
 * into their columns (bias split alike). */
void compose_matmul_stack(const struct backend_ops *ops, void *ctx, float *y, long ldy,
                          const float *x, long ldx, const struct backend_stack *w,
                          const float *bias, long n);
/* matmul_heads as one matmul per head on a view of the head's weights
 * (F8_E4M3: each head must start on a row of scale blocks; asserted). */
void compose_matmul_heads(const struct backend_ops *ops, void *ctx, float *y, long ldy, long hy,
                          const float *x, long ldx, long hx, const struct backend_weight *w,
                          long w_stride, int n_heads, long n);
void compose_qk_rope_store(const struct backend_ops *ops, void *ctx, float *q, float *k,
                           const float *v, long ld, long n, const struct backend_rope_store *r);
void compose_norm_matmul(const struct backend_ops *ops, void *ctx, const struct backend_norm *nm,
                         float *y, long ldy, const struct backend_weight *w, const float *bias,
                         long n);
void compose_norm_matmul_rope(const struct backend_ops *ops, void *ctx,
                              const struct backend_norm *nm, float *y, long ldy,
                              const struct backend_stack *w, const float *bias, long n,
                              const struct backend_rope_store *r);
void compose_norm_swiglu_mlp(const struct backend_ops *ops, void *ctx,
                             const struct backend_norm *nm, float *y, long ldy,
                             const struct backend_stack *gate_up, const struct backend_weight *down,
                             float *gu, long ldgu, long n);
void compose_attention_matmul(const struct backend_ops *ops, void *ctx, float *y, long ldy,
                              float *att, long ldatt, const float *q, long ldq,
                              const void *k_cache, const void *v_cache,
                              const struct attn_params *p, const struct backend_batch *b,
                              const struct backend_weight *wo, const float *bias, long n);

#endif
