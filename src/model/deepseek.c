/* deepseek.c — DeepSeek-V2/V3 multi-head latent attention (MLA).
 *
 * The cache keeps one latent row per token: [c_kv (kv_lora_rank) | k_rope
 * (qk_rope_head_dim)]. Attention runs in the "absorbed" form: each head's
 * no-rope query is mapped into latent space through that head's slice of
 * kv_b_proj (W_UK, transposed at load), so every head attends to the same
 * latent rows (one KV head, MQA-like), and the latent output is mapped back
 * through W_UV. This equals the reference's expanded form mathematically
 * and reads far less KV. Sequences with many new tokens (prefill) take
 * the MHA form instead, by FLOP cost (deepseek_mha.c says how and why).
 * Rope uses the interleaved pair layout; the pairing
 * permutes q and k identically, so scores match the reference.
 * The MoE MLP of these models is in moe.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/model_internal.h"

/* kv_b_proj of an FP8 checkpoint (or --quantization fp8), dequantized
 * once into fp32 (the W_UK transpose and the per-head W_UV views below are
 * byte-level views of it, which a block-scaled layout does not allow): w
 * becomes an F32 weight of exactly the values the FP8 products use (code
 * × scale, one rounding), on every backend, so the absorbed and MHA forms
 * compute what the checkpoint means (a bf16 copy would add a 2^-9
 * rounding to every weight; fp32 costs twice its bytes, and on CUDA the
 * per-head products of fp32 weights run as one strided-batched fp32
 * cuBLAS product, not on the GEMV). The
 * codes and scales come from the weight itself where the backend holds
 * them in place (the CPU), else from the host copies the loader keeps
 * (ws->last_host, ws->last_scale), else from the device, where the weight
 * was made (dummy weights). Returns the fp32 host rows, NULL when out of
 * memory. */
static const unsigned char *mla_dequant_kv_b(struct weight_source *ws, struct backend_weight *w) {
    struct model *m = ws->m;
    const struct backend_ops *ops = m->be->ops;
    int in_place = ops->weights_in_place;
    KILN_ASSERT(w->scale && w->block_rows > 0 && w->block_cols > 0);
    long rows = w->rows, cols = w->cols, nbc = (cols + w->block_cols - 1) / w->block_cols;
    size_t n = (size_t)(rows * cols), ns = (size_t)((rows + w->block_rows - 1) / w->block_rows * nbc);
    const uint8_t *q = w->data;
    const float *sc = w->scale;
    uint8_t *qd = NULL;
    float *sd = NULL;
    if (!in_place && ws->last_host && ws->last_scale) {
        q = ws->last_host, sc = ws->last_scale;
    } else if (!in_place) { /* made on the device, no deferred copy in flight */
        qd = xmalloc(n), sd = xmalloc(ns * 4);
        ops->download(m->be->ctx, qd, w->data, n);
        ops->download(m->be->ctx, sd, w->scale, ns * 4);
        q = qd, sc = sd;
    }
    float *f = xaligned_alloc(n * 4);
    for (long r = 0; r < rows; r++)
        for (long j = 0; j < cols; j++)
            f[r * cols + j] =
                fp8_e4m3_to_f32(q[r * cols + j]) * sc[(r / w->block_rows) * nbc + j / w->block_cols];
    free(qd), free(sd);
    model_own(m, f);
    const void *dev = model_upload(m, f, n * 4);
    if (!dev) return NULL;
    m->weight_bytes += n * 4;
    *w = (struct backend_weight){.data = dev, .dtype = DTYPE_F32, .rows = rows, .cols = cols};
    return (const unsigned char *)f;
}

static int mla_load(struct weight_source *ws, int l, struct attn_mla *a, struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, H = c->n_heads, nope = c->qk_nope_head_dim,
         rope = c->qk_rope_head_dim, vd = c->v_head_dim, kvr = c->kv_lora_rank,
         qr = c->q_lora_rank, qh = nope + rope;
    char name[256];
    /* Tensor parallel: H is the rank's heads (rows of q_b / q and kv_b,
     * columns of o_proj); what makes the latent (q_a, kv_a and their
     * norms) is whole on every rank, as is the latent cache. DP attention:
     * the heads split over the ranks of the rank's group only
     * (model_attn_tp; whole with one rank a group). */
    long Hw = H * model_attn_tp(c);
    struct ws_slice q_sl, kv_sl, o_sl;
#define P(suffix) (snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, suffix), name)
    if (qr > 0) {
        if (ws_proj(ws, P("q_a_proj.weight"), qr, d, NULL, &a->wq_a, err) ||
            ws_vector(ws, P("q_a_layernorm.weight"), qr, 1.0f, &a->q_a_norm, err) ||
            ws_proj(ws, P("q_b_proj.weight"), Hw * qh, qr, ws_split_attn(&q_sl, c, 0, H * qh), &a->wq_b, err))
            return -1;
    } else if (ws_proj(ws, P("q_proj.weight"), Hw * qh, d, ws_split_attn(&q_sl, c, 0, H * qh), &a->wq, err)) {
        return -1;
    }
    if (ws_proj(ws, P("kv_a_proj_with_mqa.weight"), kvr + rope, d, NULL, &a->wkv_a, err) ||
        ws_vector(ws, P("kv_a_layernorm.weight"), kvr, 1.0f, &a->kv_a_norm, err) ||
        ws_proj(ws, P("kv_b_proj.weight"), Hw * (nope + vd), kvr, ws_split_attn(&kv_sl, c, 0, H * (nope + vd)),
                &a->wkv_b, err))
        return -1;
    /* W_UK_h^T [kvr][nope] per head, in the checkpoint dtype (a transpose
     * is exact), made from kv_b_proj's host bytes: all heads stacked in one
     * [H][kvr][nope] tensor (w_uk_t[h] are views into it), so the q_nope
     * products of every head run as one matmul_heads. W_UV stays strided
     * views into kv_b_proj (head stride (nope + vd)·kvr elements). */
    const unsigned char *src = a->wkv_b.dtype == DTYPE_F8_E4M3 ? mla_dequant_kv_b(ws, &a->wkv_b) : ws_last_host(ws);
    if (!src) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for MLA weights");
    if (ws_proj(ws, P("o_proj.weight"), d, Hw * vd, ws_split_attn(&o_sl, c, 1, H * vd), &a->wo, err)) return -1;
#undef P
    enum dtype dt = a->wkv_b.dtype;
    size_t es = dtype_size(dt), head_bytes = (size_t)(kvr * nope) * es;
    a->w_uk_t = model_own(m, xcalloc((size_t)H, sizeof *a->w_uk_t));
    a->w_uv = model_own(m, xcalloc((size_t)H, sizeof *a->w_uv));
    unsigned char *t = model_own(m, xaligned_alloc(head_bytes * (size_t)H));
    for (long h = 0; h < H; h++)
        for (long r = 0; r < nope; r++)
            for (long j = 0; j < kvr; j++)
                memcpy(t + head_bytes * (size_t)h + (size_t)(j * nope + r) * es,
                       src + (size_t)((h * (nope + vd) + r) * kvr + j) * es, es);
    const unsigned char *uk = model_upload(m, t, head_bytes * (size_t)H);
    if (!uk) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for MLA weights");
    for (long h = 0; h < H; h++) {
        a->w_uk_t[h] = (struct backend_weight){.data = uk + head_bytes * (size_t)h, .dtype = dt,
                                               .rows = kvr, .cols = nope};
        a->w_uv[h] = (struct backend_weight){
            .data = (const unsigned char *)a->wkv_b.data + (size_t)((h * (nope + vd) + nope) * kvr) * es,
            .dtype = dt, .rows = vd, .cols = kvr};
    }
    return 0;
}

/* The absorbed form over f's rows: o[n][H·vd] from q[n][H·(nope+rope)]. */
static void mla_absorbed(const struct fwd *f, int l, const struct attn_mla *a, const float *q,
                         float *o) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, H = c->n_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim,
         vd = c->v_head_dim, kvr = c->kv_lora_rank, qh = nope + rope, lw = kvr + rope;
    float *q2 = m->act.q2, *att = m->act.att;
    /* q2 head h = [q_nope_h · W_UK_h (kvr) | q_rope_h (rope)]: the products of
     * every head in one operation, the rope columns in one copy (rows of q
     * and q2 are whole heads: (row, head) pairs are n·H rows of stride qh
     * and lw) */
    ops->matmul_heads(ctx, q2, H * lw, lw, q, H * qh, qh, &a->w_uk_t[0], kvr * nope, (int)H, n);
    ops->copy_rows(ctx, q2 + kvr, lw, q + nope, qh, n * H, rope);
    struct attn_params p = {.n_heads = (int)H, .n_kv_heads = 1, .dk = (int)lw, .dv = (int)kvr,
                            .k_stride = lw, .v_stride = lw, .scale = m->attn_scale,
                            .k_scale = m->layers[l].k_scale, .v_scale = m->layers[l].k_scale};
    ops->attention(ctx, att, H * kvr, q2, H * lw, f->kv->k[l], f->kv->k[l], &p, f->bb);
    ops->matmul_heads(ctx, o, H * vd, vd, att, H * kvr, kvr, &a->w_uv[0], (nope + vd) * kvr,
                      (int)H, n);
}

static void mla_forward(const struct fwd *f, int l, const struct attn_mla *a, const float *x, float *out) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    long n = f->n, d = c->hidden_size, H = c->n_heads, nope = c->qk_nope_head_dim,
         rope = c->qk_rope_head_dim, vd = c->v_head_dim, kvr = c->kv_lora_rank,
         qr = c->q_lora_rank, qh = nope + rope, lw = kvr + rope;
    float eps = (float)c->rms_norm_eps;
    float *q = m->act.q, *kva = m->act.k, *o = m->act.o;

    if (qr > 0) {
        float *cq = m->act.v; /* [n][q_lora] scratch */
        ops->matmul(ctx, cq, qr, x, d, &a->wq_a, NULL, n);
        ops->rmsnorm(ctx, cq, qr, cq, qr, a->q_a_norm, n, qr, eps);
        ops->matmul(ctx, q, H * qh, cq, qr, &a->wq_b, NULL, n);
    } else {
        ops->matmul(ctx, q, H * qh, x, d, &a->wq, NULL, n);
    }
    ops->matmul(ctx, kva, lw, x, d, &a->wkv_a, NULL, n);
    ops->rmsnorm(ctx, kva, lw, kva, lw, a->kv_a_norm, n, kvr, eps);
    ops->rope(ctx, kva + kvr, lw, n, 1, lw, (int)rope, f->pos, m->rope_table, 1);
    ops->rope(ctx, q + nope, H * qh, n, (int)H, qh, (int)rope, f->pos, m->rope_table, 1);
    ops->kv_store(ctx, f->kv->k[l], lw, kva, lw, lw, f->slot, n, m->layers[l].k_scale);

    mla_attend(f, l, a, q, o, mla_absorbed); /* each sequence in its form (deepseek_mha.c) */
    ops->matmul(ctx, out, d, o, H * vd, &a->wo, NULL, n);
}

/* MLA has no key/value heads: num_key_value_heads is not used (transformers
 * accepts any value), so it is not checked against num_attention_heads. */
static int deepseek_check(const struct model_config *c, const char *file, struct kiln_error *err) {
    if (c->attention_bias)
        return kiln_errorf(err, "%s: attention_bias true is not supported for %s (no q_a/kv_a/o "
                                "projection biases)",
                           file, model_arch_name(c->arch));
    return family_check_common(c, file, err);
}

static struct kv_layer_layout deepseek_kv_layout(const struct model_config *c, int layer) {
    (void)layer;
    return (struct kv_layer_layout){.k_width = c->kv_lora_rank + c->qk_rope_head_dim,
                                    .v_width = c->kv_lora_rank, .v_in_k = 1};
}

static void deepseek_act_widths(const struct model_config *c, struct act_widths *w) {
    long H = c->n_heads, qh = c->qk_nope_head_dim + c->qk_rope_head_dim,
         lw = c->kv_lora_rank + c->qk_rope_head_dim;
    w->q = H * qh;
    w->k = lw;
    w->v = c->q_lora_rank > 1 ? c->q_lora_rank : 1; /* q_lora scratch */
    w->q2 = H * lw;
    w->att = H * c->kv_lora_rank;
    w->o = H * c->v_head_dim;
}

static int deepseek_rope_dim(const struct model_config *c) { return c->qk_rope_head_dim; }

static double deepseek_attn_scale(const struct model_config *c) {
    double qh = c->qk_nope_head_dim + c->qk_rope_head_dim;
    return 1.0 / sqrt(qh) * rope_softmax_mscale(&c->rope);
}

static int deepseek_layer_is_moe(const struct model_config *c, int layer) {
    return layer >= c->first_k_dense_replace && layer % c->moe_layer_freq == 0;
}

static int deepseek_load_layer(struct weight_source *ws, int l, struct layer *L,
                               struct kiln_error *err) {
    const struct model_config *c = &ws->m->cfg;
    /* V3 scales the routed weights whether or not it renormalised them; V2
     * only when it did not. */
    const struct moe_kind kind = {.scaling = (float)c->routed_scaling_factor,
                                  .scale_when_renormalized = c->arch == ARCH_DEEPSEEK_V3,
                                  .shared_summed = 1};
    L->attn_kind = LAYER_ATTN_MLA;
    return mla_load(ws, l, &L->mla, err) || mlp_load(ws, l, &kind, L, err);
}

/* MLA reads its normed input several times: the norm runs on its own. */
static void deepseek_forward_layer(const struct fwd *f, int l, const struct layer *L) {
    struct model *m = f->m;
    struct activations *a = &m->act;
    struct backend_norm nm = layer_norm_in(f, l, L->ln_attn);
    model_norm(f, &nm);
    if (m->dp) { /* the group's rows only, gathered from every group (dp_attention.c) */
        dp_attention(f, l, &L->mla, mla_forward);
    } else {
        mla_forward(f, l, &L->mla, a->xn, a->delta);
        model_defer_delta(f);
    }
    nm = layer_norm_delta(f, L->ln_mlp);
    mlp_forward_norm(f, L, &nm, a->delta);
    model_defer_delta(f);
}

const struct model_family family_deepseek = {
    .name = "deepseek",
    .check_config = deepseek_check,
    .kv_layout = deepseek_kv_layout,
    .act_widths = deepseek_act_widths,
    .rope_dim = deepseek_rope_dim,
    .attn_scale = deepseek_attn_scale,
    .layer_is_moe = deepseek_layer_is_moe,
    .load_layer = deepseek_load_layer,
    .forward_layer = deepseek_forward_layer,
};
