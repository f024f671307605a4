/* backend_compose.c — layer-level operations from primitives (see
 * backend_compose.h). */
#include "tensor/backend_compose.h"

#include "base/error.h"

void compose_matmul_stack(const struct backend_ops *ops, void *ctx, float *y, long ldy,
                          const float *x, long ldx, const struct backend_stack *w,
                          const float *bias, long n) {
    if (w->cat.data) {
        ops->matmul(ctx, y, ldy, x, ldx, &w->cat, bias, n);
        return;
    }
    long off = 0;
    for (int i = 0; i < w->count; i++) {
        ops->matmul(ctx, y + off, ldy, x, ldx, &w->parts[i], bias ? bias + off : NULL, n);
        off += w->parts[i].rows;
    }
}

void compose_matmul_heads(const struct backend_ops *ops, void *ctx, float *y, long ldy, long hy,
                          const float *x, long ldx, long hx, const struct backend_weight *w,
                          long w_stride, int n_heads, long n) {
    size_t es = dtype_size(w->dtype);
    /* F8_E4M3: head h's scales are the rows of w's grid of scales its rows
     * start on; a head starting inside a block row has no grid of its own */
    long scale_stride = 0;
    if (w->dtype == DTYPE_F8_E4M3 && n_heads > 1) {
        KILN_ASSERT_MSG(w->cols > 0 && w->block_rows > 0 && w->block_cols > 0 &&
                            w_stride % (w->cols * w->block_rows) == 0,
                        "matmul_heads: F8_E4M3 heads must start on a row of scale blocks");
        scale_stride = w_stride / (w->cols * w->block_rows) * ((w->cols + w->block_cols - 1) / w->block_cols);
    }
    for (int h = 0; h < n_heads; h++) {
        struct backend_weight wh = *w;
        wh.data = (const unsigned char *)w->data + (size_t)h * (size_t)w_stride * es;
        if (scale_stride) wh.scale = w->scale + h * scale_stride;
        ops->matmul(ctx, y + h * hy, ldy, x + h * hx, ldx, &wh, NULL, n);
    }
}

void compose_qk_rope_store(const struct backend_ops *ops, void *ctx, float *q, float *k,
                           const float *v, long ld, long n, const struct backend_rope_store *r) {
    long hd = r->head_dim, kw = (long)r->n_kv_heads * hd;
    if (r->q_norm) { /* head h of every row: rows of stride ld */
        for (long h = 0; h < r->n_heads; h++)
            ops->rmsnorm(ctx, q + h * hd, ld, q + h * hd, ld, r->q_norm, n, hd, r->eps);
        for (long h = 0; h < r->n_kv_heads; h++)
            ops->rmsnorm(ctx, k + h * hd, ld, k + h * hd, ld, r->k_norm, n, hd, r->eps);
    }
    ops->rope(ctx, q, ld, n, r->n_heads, hd, r->rot_dim, r->pos, r->cos_sin, r->interleaved);
    ops->rope(ctx, k, ld, n, r->n_kv_heads, hd, r->rot_dim, r->pos, r->cos_sin, r->interleaved);
    ops->kv_store(ctx, r->k_cache, r->kv_stride, k, ld, kw, r->slots, n, r->k_scale);
    ops->kv_store(ctx, r->v_cache, r->kv_stride, v, ld, kw, r->slots, n, r->v_scale);
}

void compose_norm_matmul(const struct backend_ops *ops, void *ctx, const struct backend_norm *nm,
                         float *y, long ldy, const struct backend_weight *w, const float *bias,
                         long n) {
    ops->add_rmsnorm(ctx, nm->h, nm->delta, nm->x, nm->w, n, nm->dim, nm->eps);
    ops->matmul(ctx, y, ldy, nm->x, nm->dim, w, bias, n);
}

void compose_norm_matmul_rope(const struct backend_ops *ops, void *ctx,
                              const struct backend_norm *nm, float *y, long ldy,
                              const struct backend_stack *w, const float *bias, long n,
                              const struct backend_rope_store *r) {
    ops->add_rmsnorm(ctx, nm->h, nm->delta, nm->x, nm->w, n, nm->dim, nm->eps);
    compose_matmul_stack(ops, ctx, y, ldy, nm->x, nm->dim, w, bias, n);
    long qw = (long)r->n_heads * r->head_dim, kw = (long)r->n_kv_heads * r->head_dim;
    ops->qk_rope_store(ctx, y, y + qw, y + qw + kw, ldy, n, r);
}

void compose_norm_swiglu_mlp(const struct backend_ops *ops, void *ctx,
                             const struct backend_norm *nm, float *y, long ldy,
                             const struct backend_stack *gate_up, const struct backend_weight *down,
                             float *gu, long ldgu, long n) {
    long inter = down->cols;
    ops->add_rmsnorm(ctx, nm->h, nm->delta, nm->x, nm->w, n, nm->dim, nm->eps);
    compose_matmul_stack(ops, ctx, gu, ldgu, nm->x, nm->dim, gate_up, NULL, n);
    ops->silu_mul(ctx, gu, ldgu, gu, ldgu, gu + inter, ldgu, n, inter);
    ops->matmul(ctx, y, ldy, gu, ldgu, down, NULL, n);
}

void compose_attention_matmul(const struct backend_ops *ops, void *ctx, float *y, long ldy,
                              float *att, long ldatt, const float *q, long ldq,
                              const void *k_cache, const void *v_cache,
                              const struct attn_params *p, const struct backend_batch *b,
                              const struct backend_weight *wo, const float *bias, long n) {
    ops->attention(ctx, att, ldatt, q, ldq, k_cache, v_cache, p, b);
    ops->matmul(ctx, y, ldy, att, ldatt, wo, bias, n);
}
