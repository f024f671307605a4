/* backend.h — the device interface: a table of operations plus a context.
 *
 * Model code (src/model/) is written once against these operations; a
 * device is one folder under src/backend/ that fills the table (ggml's
 * ggml_backend_i, SQLite's pcache_methods). Pointers passed to operations
 * are device pointers obtained from `alloc` or `weight_upload`; on the CPU
 * they are ordinary host pointers. Activations are fp32 row-major matrices
 * with a row stride ("ld", in elements); weights keep their checkpoint dtype.
 * Operations are enqueued in order; `synchronize` waits for all of them
 * (the CPU backend runs each one to completion before returning).
 *
 * Shape comments use [rows][cols]. n is the number of token rows.
 */
#ifndef KILN_TENSOR_BACKEND_H
#define KILN_TENSOR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

struct kiln_error;
struct dist_comm;
struct moe_route_count;
struct backend_sample_row;
struct backend_sample_adj;
struct dummy_part;

/* A weight matrix on the device: [rows][cols] contiguous, in its dtype.
 * DTYPE_F8_E4M3 (block-quantized checkpoints, DeepSeek-V3 / Qwen3-FP8
 * format) carries one fp32 scale per block of block_rows x block_cols
 * elements, row-major over the ceil(rows / block_rows) x ceil(cols /
 * block_cols) blocks (the last ones may be partial): element (r, c) is
 * fp8(data[r][c]) * scale[(r / block_rows) * ceil(cols / block_cols) +
 * c / block_cols], the product rounded to fp32 once. Other dtypes: scale
 * NULL. */
struct backend_weight {
    const void *data;
    enum dtype dtype;
    long rows, cols;
    const float *scale;
    int block_rows, block_cols;
    const uint8_t *e8m0; /* DTYPE_MXFP4: [rows][cols / 32] exponents */
};

/* The largest e8m0 exponent a backend with backend_ops.mxfp4_experts
 * takes: 2^(240 - 127), values up to 6 · 2^113 (the CUDA products carry a
 * further 2^14 in their fp32 scale: cuda_moe_quant.cu). */
enum { BACKEND_MXFP4_MAX_EXPONENT = 240 };

/* Bytes a product reads of w's elements (MXFP4: its codes and exponents;
 * FP8: its codes, the block scales not counted). */
static inline size_t backend_weight_bytes(const struct backend_weight *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    return w->dtype == DTYPE_MXFP4 ? mxfp4_bytes(w->rows, w->cols) + n / 32 : n * dtype_size(w->dtype);
}

/* Batch metadata on the device (see model/batch.h for the meaning). */
struct backend_batch {
    int n_tokens, n_seqs, page_size;
    const int32_t *positions;     /* [n_tokens] */
    const int32_t *q_start;       /* [n_seqs + 1] */
    const int32_t *kv_page_start; /* [n_seqs + 1] */
    const int32_t *kv_pages;
};

struct attn_params {
    int n_heads, n_kv_heads; /* query heads share kv head h / (n_heads / n_kv_heads) */
    int dk, dv;              /* per-head widths of q·k and of v */
    long k_stride, v_stride; /* elements between consecutive slots of the K / V cache */
    float scale;             /* softmax scale */
    /* An FP8 (DTYPE_F8_E4M3) cache's per-layer scales: an element reads as
     * fp8_e4m3_to_f32(q) * k_scale (v_scale for V). Unused by other KV
     * types. */
    float k_scale, v_scale;
    int f32_cache; /* the caches are fp32 whatever kv_dtype is (the MLA MHA form's
                      expanded K/V, which mla_kv_expand writes in fp32 on an FP8 cache) */
    /* Sliding-window attention: > 0, a query at position pos sees only the
     * keys at positions pos - window + 1 .. pos (window tokens, itself
     * included; transformers' sliding-window causal mask); 0, all of 0..pos.
     * Only a backend with backend_ops.sliding_window honours it. */
    int window;
    /* Attention sinks (gpt-oss): NULL, none; else device [n_heads] fp32
     * logits, one per query head, that join every softmax row's
     * denominator only (exp(sink - m) added to the sum; no value row).
     * Only a backend with backend_ops.attention_sinks honours it. */
    const float *sinks;
};

enum moe_route_scoring { MOE_ROUTE_SOFTMAX = 0, MOE_ROUTE_SIGMOID };
enum moe_route_method { MOE_ROUTE_GREEDY = 0, MOE_ROUTE_GROUP_LIMITED, MOE_ROUTE_NOAUX_TC };

struct moe_route_params {
    int n_experts, top_k;
    enum moe_route_scoring scoring;
    enum moe_route_method method;
    int n_group, topk_group;
    int renormalize;        /* divide the chosen weights by their sum */
    float scaling;          /* routed_scaling_factor applied to the weights */
    int scale_when_renormalized; /* deepseek_v3 scales after renormalising; v2 scales only without it */
    /* shared-expert fusion: after the top_k chosen experts, every row also
     * lists experts n_experts .. n_experts + n_fused - 1 with weight 1 (the
     * shared experts appended to the expert list); rows of ids and weights
     * then hold top_k + n_fused entries */
    int n_fused;
    /* Benchmarks only (model_options.dummy_routing). uniform: the logits
     * and the bias are ignored; row i takes the top_k largest of the
     * scores route_uniform_score gives its key (key_slot[i], key_pos[i],
     * layer) (tensor/route_uniform.h): distinct experts, uniformly random,
     * identical on every backend. Its weights come from those scores as
     * from logits (scoring, renormalize, scaling as above); no group
     * limit. key_slot, key_pos: device [n]. */
    int uniform;
    int layer;
    const int32_t *key_slot, *key_pos;
    /* Touched-expert counting (benchmarks): device record, or NULL */
    struct moe_route_count *count;
};

/* What moe_route counts where moe_route_params.count is set: each call
 * while `enabled` is non-zero adds the number of distinct routed experts
 * (ids < n_experts) its n rows chose. Device memory, followed by
 * n_experts int32 flags (scratch, zero between calls); written by the
 * host only between steps. `enabled` is read by the operation when it
 * runs, so a recorded graph counts or not as the host last set it. */
struct moe_route_count {
    int32_t enabled;
    int32_t pending;  /* CUDA: blocks of the running call done (0 between calls) */
    int32_t min, max; /* over the counted calls */
    int64_t calls, sum, rows; /* calls counted; sum of their experts; rows routed */
};

/* The activation between an expert's products (moe_experts.act), g and u
 * the gate and up rows (their biases added):
 * MOE_ACT_SILU: silu(g) * u.
 * MOE_ACT_SWIGLU_CLAMP (gpt-oss): g = min(g, limit), u = clamp(u, -limit,
 *   limit), (u + 1) * g * sigmoid(alpha * g). */
enum moe_act { MOE_ACT_SILU = 0, MOE_ACT_SWIGLU_CLAMP };

struct moe_experts {
    int n_experts, hidden, inter;
    const struct backend_weight *gate; /* [n_experts], each [inter][hidden] */
    const struct backend_weight *up;   /* [n_experts], each [inter][hidden] */
    const struct backend_weight *down; /* [n_experts], each [hidden][inter] */
    /* Expert parallel: gate[i] is routed expert first + i; moe_ffn drops
     * the (token, slot) rows routed to experts outside [first, first +
     * n_experts) (they add nothing: another rank holds them). 0 with every
     * expert here. */
    int first;
    /* Expert biases (gpt-oss): NULL, none; else device fp32
     * [n_experts][inter] (gate_bias, up_bias) and [n_experts][hidden]
     * (down_bias), added to each product's rows. With act, only on a
     * backend with backend_ops.moe_bias_act. */
    const float *gate_bias, *up_bias, *down_bias;
    enum moe_act act;
    float alpha, limit; /* MOE_ACT_SWIGLU_CLAMP */
};

/* moe_ffn runs a long batch's expert products over chunks of tokens, each
 * of at most this many (token, slot) rows, so that its scratch is bounded
 * by the chunk, not by the largest prefill chunk a server allows. Each
 * token's k outputs are summed in its own order within its chunk, so a
 * token's result does not depend on the chunk it falls in. 32768 rows
 * still fill an H100: at 128 experts and top-8 (Qwen3-MoE, 4096 tokens a
 * chunk) the average expert gets 256 rows, at 256 experts and top-8 + 1
 * shared (DeepSeek-V3, 3640 tokens) 128, enough M for tensor-core tiles
 * of 128 rows on every expert; a 8448-token step runs in three chunks.
 * backend_moe_chunk_rows is this, or KILN_TEST_MOE_CHUNK_ROWS where a test
 * sets it. */
enum { BACKEND_MOE_CHUNK_ROWS = 32768 };
long backend_moe_chunk_rows(void);
/* Tokens of a chunk with top_k slots a token (at least 1). */
long backend_moe_chunk_tokens(int top_k);

/* The largest step a model runs, for the memory plan (workspace_bytes). */
struct backend_step_shape {
    long max_tokens, max_context, vocab;
    long widest;         /* the widest input of a product: floats a row */
    int max_heads;
    int moe_layers;      /* 0: no mixture of experts */
    int moe_experts, moe_hidden, moe_inter, moe_slots; /* the largest of the MoE layers */
    int device_sampling; /* the runner samples on the device */
    int fp8_weights;     /* the model has FP8 (block-quantized) weights */
};

/* A residual add + RMSNorm pending in front of a product (norm_matmul,
 * norm_swiglu_mlp): h[n][dim] += delta (delta NULL: not), x[n][dim] =
 * h / rms(h) * w. h, delta and x are contiguous rows of dim floats.
 * reduce (tensor parallel): delta is this rank's part of a sum over the
 * communicator's ranks, summed in the same operation. Set only where the
 * backend's norm_reduce_ok said yes for it; NULL otherwise. */
struct backend_norm {
    float *h;
    const float *delta;
    float *x;
    const float *w;
    long dim;
    float eps;
    struct dist_comm *reduce;
};

/* A stacked weight: `count` parts (q|k|v, gate|up) one under the other,
 * read by one product. Backends that copy weights to a device get `cat`,
 * one matrix; in-place backends (weights_in_place: the CPU) keep the parts
 * where they lie (cat.data NULL) and run them one by one into the same
 * output columns. */
struct backend_stack {
    struct backend_weight cat;
    const struct backend_weight *parts;
    int count;
};

/* The arguments of qk_rope_store and norm_matmul_rope. */
struct backend_rope_store {
    int n_heads, n_kv_heads, head_dim;
    const float *q_norm, *k_norm; /* NULL: no per-head norm */
    float eps;
    int rot_dim;
    const int32_t *pos;
    const float *cos_sin;
    int interleaved;
    void *k_cache, *v_cache;
    long kv_stride;
    const int32_t *slots;
    float k_scale, v_scale; /* an FP8 cache's scales, as kv_store's */
};

struct backend_ops {
    const char *name;
    /* The backend computes on host weights in place (weight_upload returns
     * the host pointer): weights must stay zero-copy views of the mmapped
     * checkpoint, so the model does not stack them into new buffers. */
    int weights_in_place;
    /* The backend's matmul (and the layer-level products built on it) and
     * moe_ffn take DTYPE_F8_E4M3 weights with block scales (struct
     * backend_weight); the model refuses to load FP8 weights (an FP8
     * checkpoint, --quantization fp8) on a backend without. */
    int fp8_weights;
    /* The backend's attention honours attn_params.window; the model
     * refuses a checkpoint with a sliding window on a backend without. */
    int sliding_window;
    /* The backend's attention honours attn_params.sinks; the model refuses
     * a checkpoint with attention sinks on a backend without. */
    int attention_sinks;
    /* The backend's moe_ffn honours moe_experts' biases and its act; the
     * model refuses a checkpoint with either (gpt-oss) on a backend
     * without. */
    int moe_bias_act;
    /* The backend's moe_ffn takes DTYPE_MXFP4 experts whose exponents are
     * at most BACKEND_MXFP4_MAX_EXPONENT (gpt-oss's MXFP4 checkpoints stay
     * MXFP4 on it, larger exponents refused at load; elsewhere they are
     * decoded to bf16 at load). */
    int mxfp4_experts;
    void (*destroy)(void *ctx);
    /* Reserves scratch for batches of up to max_tokens rows and contexts of up
     * to max_context positions; called once before the first forward. */
    int (*reserve)(void *ctx, long max_tokens, long max_context, int max_heads,
                   struct kiln_error *err);

    void *(*alloc)(void *ctx, size_t bytes); /* zeroed; NULL when out of memory */
    void (*free)(void *ctx, void *p);
    void (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Device view of `bytes` of host weights that stay valid for the model's
     * life (CPU: the same pointer, no copy). NULL when out of memory. */
    const void *(*weight_upload)(void *ctx, const void *host, size_t bytes);
    void (*weight_release)(void *ctx, const void *dev);
    void (*synchronize)(void *ctx);

    /* y[n][table.cols] = table[ids[i]] */
    void (*embed)(void *ctx, float *y, const struct backend_weight *table, const int32_t *ids,
                  long n);
    /* Vocab-parallel embedding (tensor parallel): table holds rows [first,
     * first + table.rows) of the vocabulary; y[i] = table[ids[i] - first]
     * for ids in that range, a zero row for the others (the ranks' rows
     * meet in an all-reduce). NULL: the backend cannot split a model. */
    void (*embed_shard)(void *ctx, float *y, const struct backend_weight *table, const int32_t *ids,
                        long first, long n);
    /* y[n][w.rows] = x[n][w.cols] · wᵀ (+ bias[w.rows]) */
    void (*matmul)(void *ctx, float *y, long ldy, const float *x, long ldx,
                   const struct backend_weight *w, const float *bias, long n);
    /* Per-head products, all heads in one operation: for each head h <
     * n_heads of each row i < n, y[i·ldy + h·hy ..][w.rows] = x[i·ldx + h·hx
     * ..][w.cols] · W_hᵀ, where W_h is the [w.rows][w.cols] matrix that
     * starts w_stride elements after W_{h-1} (W_0 = w; a stacked tensor, or
     * strided views into a larger one). Each head's product is matmul's
     * arithmetic, without bias: the CPU gives matmul's bits; CUDA gives the
     * per-head cuda matmul's bits on its GEMV and deterministic paths and
     * the same 16-bit operands with fp32 sums (cuBLAS's order) above them. */
    void (*matmul_heads)(void *ctx, float *y, long ldy, long hy, const float *x, long ldx,
                         long hx, const struct backend_weight *w, long w_stride, int n_heads,
                         long n);
    /* y[n][dim] = x / rms(x) * w, row by row */
    void (*rmsnorm)(void *ctx, float *y, long ldy, const float *x, long ldx, const float *w,
                    long n, long dim, float eps);
    /* h[n][dim] += delta; y = rmsnorm(h) (delta NULL: only the norm) */
    void (*add_rmsnorm)(void *ctx, float *h, const float *delta, float *y, const float *w, long n,
                        long dim, float eps);
    /* Rotates the first rot_dim dims of n_heads heads of every row in place.
     * cos_sin: [max_pos][rot_dim / 2][2]. interleaved: pairs (2i, 2i+1),
     * else halves (i, i + rot_dim/2). */
    void (*rope)(void *ctx, float *x, long ldx, long n, int n_heads, long head_stride, int rot_dim,
                 const int32_t *pos, const float *cos_sin, int interleaved);
    /* y[n][dim] = silu(g) * u */
    void (*silu_mul)(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u,
                     long ldu, long n, long dim);
    /* y[n][dim] = gelu_tanh(g) * u, gelu_tanh(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
     * (transformers' gelu_pytorch_tanh; Gemma's GeGLU). NULL: the backend
     * has none; the model refuses a family that needs it. */
    void (*gelu_tanh_mul)(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u,
                          long ldu, long n, long dim);
    /* x[count] *= s (Gemma's embedding scale). NULL: as gelu_tanh_mul. */
    void (*scale)(void *ctx, float *x, long count, float s);
    /* y[count] += x[count] */
    void (*add)(void *ctx, float *y, const float *x, long count);
    /* y[n][dim] += sigmoid(gate[i * ldgate]) * x */
    void (*gated_add)(void *ctx, float *y, const float *x, const float *gate, long ldgate, long n,
                      long dim);
    /* dst[i] = src[rows[i]] for rows of width floats (both contiguous) */
    void (*gather_rows)(void *ctx, float *dst, const float *src, long width, const int32_t *rows,
                        long n);
    /* dst[n][width] (row stride ldd) = src[n][width] (row stride lds) */
    void (*copy_rows)(void *ctx, float *dst, long ldd, const float *src, long lds, long n,
                      long width);
    /* cache[slots[i] * stride + 0..width) = src[i][0..width), converted to
     * the KV element type (kv_dtype below; strides count elements). An FP8
     * cache stores f32_to_fp8_e4m3(x / scale) (the layer's k_scale or
     * v_scale; saturating at ±448); other types ignore scale. */
    void (*kv_store)(void *ctx, void *cache, long stride, const float *src, long ld, long width,
                     const int32_t *slots, long n, float scale);
    /* Causal paged attention: out[n][n_heads * dv] from q[n][n_heads * dk]
     * against the sequence's cached positions 0..position (caches of
     * kv_dtype elements). */
    void (*attention)(void *ctx, float *out, long ldo, const float *q, long ldq,
                      const void *k_cache, const void *v_cache, const struct attn_params *p,
                      const struct backend_batch *b);
    /* Multi-head latent attention in the MHA form (model/deepseek_mha.c).
     * kv_gather: dst[i][0..width) (row stride ldd) = the cache row of
     * position p0 + i of a sequence whose page list is pages (slot
     * pages[p / page_size]·page_size + p % page_size; row stride `stride`
     * elements of kv_dtype), widened to fp32: kv_store read back (an FP8
     * element as fp8_e4m3_to_f32(q) * scale).
     * mla_kv_expand: per-head K and V of n positions, in kv_dtype (fp32
     * where kv_dtype is FP8: attn_params.f32_cache), as a
     * cache the attention reads: k[i][h][0..nope) = kv[i][h·(nope+vd) + 0..nope),
     * k[i][h][nope..nope+rope) = k_rope[i][0..rope) (one rope key shared by
     * every head), v[i][h][0..vd) = kv[i][h·(nope+vd) + nope + 0..vd);
     * k rows are n_heads·(nope+rope) elements, v rows n_heads·vd. */
    void (*kv_gather)(void *ctx, float *dst, long ldd, const void *cache, long stride, long width,
                      const int32_t *pages, int page_size, long p0, long n, float scale);
    void (*mla_kv_expand)(void *ctx, void *k, void *v, const float *kv, long ldkv,
                          const float *k_rope, long ldr, long n, int n_heads, int nope, int rope,
                          int vd);
    /* Chooses top_k experts per row from router logits[n][n_experts]
     * (bias: correction bias or NULL), or at random (p->uniform); counts
     * them where p->count says. ids[n][top_k + n_fused], weights likewise. */
    void (*moe_route)(void *ctx, int32_t *ids, float *weights, const float *logits,
                      const float *bias, const struct moe_route_params *p, long n);
    /* y[n][hidden] = sum_j weights[i][j] * expert_{ids[i][j]}(x[i]), over
     * the slots j whose expert is one of e's (e->first ..), in j order */
    void (*moe_ffn)(void *ctx, float *y, const float *x, const int32_t *ids, const float *weights,
                    int top_k, const struct moe_experts *e, long n);

    /* ---- Layer-level operations: each computes what the primitives named
     * in its comment compute, in that order (the CUDA backend: the same
     * bits). A backend fuses inside where it can (CUDA: the norm hands the
     * products a 16-bit copy of the activations, silu(g)·u in the gate|up
     * product's epilogue, rope and the K/V stores in the q|k|v product's
     * epilogue) and runs the primitives where it cannot; a backend without
     * fusions composes them with tensor/backend_compose.h. */

    /* Attention input preparation for ordinary multi-head attention: for
     * each row i of n, the r->n_heads query heads at q + i*ld and the
     * r->n_kv_heads key heads at k + i*ld (head h at h*head_dim) are
     * RMS-normalised per head (q_norm / k_norm [head_dim]; NULL: not) and
     * rotated in place (as `rope`), then the key row and the value row
     * (v + i*ld, n_kv_heads*head_dim floats) are stored to k_cache /
     * v_cache at slot slots[i] (row stride kv_stride, as `kv_store`). */
    void (*qk_rope_store)(void *ctx, float *q, float *k, const float *v, long ld, long n,
                          const struct backend_rope_store *r);
    /* nm->h += nm->delta (delta NULL: not); x = rmsnorm(nm->h) * nm->w
     * (as add_rmsnorm); then y[n][w.rows] (row stride ldy) = x · wᵀ
     * (+ bias), as matmul. nm->dim == w.cols. nm->x is scratch for x: its
     * contents afterwards are unspecified (the CUDA backend's 16-bit
     * handoff does not write it). */
    void (*norm_matmul)(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                        const struct backend_weight *w, const float *bias, long n);
    /* norm_matmul into stacked q|k|v rows (y[n] = q | k | v, row stride
     * ldy; the product by stack w), then qk_rope_store on them (q = y,
     * k = y + n_heads·head_dim, v = k + n_kv_heads·head_dim, ld = ldy).
     * Afterwards y's q columns hold the rotated queries; its k and v
     * columns are unspecified. */
    void (*norm_matmul_rope)(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                             const struct backend_stack *w, const float *bias, long n,
                             const struct backend_rope_store *r);
    /* A SwiGLU MLP after its norm: the norm as in norm_matmul, then
     * gu[n][2 inter] (row stride ldgu) = x · gate_upᵀ (gate rows first,
     * inter = down.cols), g = silu(g) * u (as silu_mul into gu's first inter
     * columns), y[n][down.rows] (row stride ldy) = g · downᵀ. gu is scratch:
     * its contents afterwards are unspecified. */
    void (*norm_swiglu_mlp)(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                            const struct backend_stack *gate_up,
                            const struct backend_weight *down, float *gu, long ldgu, long n);
    /* Attention and its output projection: att[n][ldatt] = attention(q,
     * caches) as `attention` computes it, then y[n][wo.rows] (row stride
     * ldy) = att · woᵀ (+ bias) as matmul (n = b->n_tokens). att is
     * scratch: its contents afterwards are unspecified (the CUDA backend
     * may hand the product a 16-bit copy made by the attention kernel
     * instead). */
    void (*attention_matmul)(void *ctx, float *y, long ldy, float *att, long ldatt,
                             const float *q, long ldq, const void *k_cache, const void *v_cache,
                             const struct attn_params *p, const struct backend_batch *b,
                             const struct backend_weight *wo, const float *bias, long n);

    /* ---- Optional: NULL where a backend has no use for them; the model
     * then takes the plain path (malloc, eager operations, unfused ops). */

    /* Whether moe_ffn of up to n tokens with these experts runs without
     * the host (a step with it can be recorded as a graph). */
    int (*moe_ffn_graphable)(void *ctx, const struct moe_experts *e, int top_k, long n);
    /* Why moe_ffn cannot run these experts at all (a static string), NULL
     * when it can; the model refuses such a layer at load. NULL op: any. */
    const char *(*moe_experts_refuse)(void *ctx, const struct moe_experts *e);
    /* Optional (NULL: one stream). Dual-stream overlap for a step of n
     * tokens: side_begin returns 1 when the operations that follow run on
     * a second stream, after everything enqueued before (0: declined, one
     * stream as usual, call nothing else); side_end returns to the main
     * stream while the side work goes on; side_join makes what the main
     * stream runs next wait for the side work. Scratch is the side
     * stream's own; the results are the same bits. */
    int (*side_begin)(void *ctx, long n);
    void (*side_end)(void *ctx);
    void (*side_join)(void *ctx);
    /* Device scratch (bytes) the operations take at most for steps up to
     * shape s, library workspaces included: what the memory plan counts
     * for the backend (src/runner/mem_plan.h). NULL: none on the device. */
    size_t (*workspace_bytes)(void *ctx, const struct backend_step_shape *s);
    /* Dummy weights made on the device: device memory holding `count`
     * tensors one after another, part i filled as tensor/dummy_fill.h
     * defines (the same bytes as the host fill). F8_E4M3 parts (all or
     * none of them): their codes one after another, then from the next
     * 16-byte boundary their fp32 block scales one after another
     * (ceil(rows / block_rows) × ceil(cols / block_cols) each, row-major:
     * struct backend_weight's layout). MXFP4 parts (all or
     * none): their codes (n / 2 bytes each) one after another, then from
     * the next 16-byte boundary their exponents (n / 32 bytes each). NULL where the backend
     * cannot (a dtype it does not fill, out of memory): the model fills
     * on the host and uploads. Saves a host fill and a copy of every
     * byte of a model of tens of GB. */
    const void *(*weight_dummy)(void *ctx, const struct dummy_part *parts, int count);

    /* Several ranks (dist/comm.h). NULL: the TCP communicator of
     * dist/comm.h serves this backend (its buffers are host memory).
     * comm_id: rank 0's start-up token for the group (CUDA: an NCCL unique
     * id), at most *len bytes into blob, *len set; it travels to every
     * rank (the runner broadcasts it on the job's host communicator).
     * comm_init: this rank's communicator (rank of size) from that token,
     * on the backend's memory, ordered with its operations (CUDA: NCCL on
     * the backend's stream). */
    int (*comm_id)(void *ctx, void *blob, size_t *len, struct kiln_error *err);
    int (*comm_init)(void *ctx, struct dist_comm *c, int rank, int size, const void *id, size_t id_len,
                     struct kiln_error *err);
    /* Optional (NULL: never). Whether the ops that take a backend_norm
     * sum its delta over c's ranks themselves (backend_norm.reduce) for
     * n rows of dim, c being one comm_init made. CUDA: the one-shot
     * all-reduce over IPC fused with the add and the norm. */
    int (*norm_reduce_ok)(void *ctx, const struct dist_comm *c, long n, long dim);
    /* The norm of nm alone (nm->reduce set), into nm->x: add_rmsnorm
     * after the sum. Present wherever norm_reduce_ok is. */
    void (*reduce_add_rmsnorm)(void *ctx, const struct backend_norm *nm, long n);

    /* Host memory the device copies from without staging (CUDA: pinned).
     * An upload from it may still be in flight when `upload` returns: the
     * caller rewrites it only after a synchronize or download. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);

    /* Graphs: the operations enqueued between graph_begin and graph_end are
     * recorded, not run, into a graph that graph_launch replays with the
     * same arguments (pointers and sizes are frozen; only the contents of
     * device buffers may change between replays). graph_end returns NULL
     * when recording failed. graph_launch returns -1 without running when
     * the graph went stale (the backend moved scratch memory it captured):
     * destroy it and record again. */
    void (*graph_begin)(void *ctx);
    void *(*graph_end)(void *ctx);
    int (*graph_launch)(void *ctx, void *graph);
    void (*graph_destroy)(void *ctx, void *graph);

    /* The element type of the KV cache the backend reads and writes
     * (kv_store, qk_rope_store, attention): NULL means DTYPE_F32. Fixed for
     * the backend's life. CPU: fp32 (its exactness tests rely on it), or
     * DTYPE_F8_E4M3 with backend_options.kv_fp8 (--kv-cache-dtype fp8_e4m3);
     * CUDA: bf16 unless KILN_CUDA_KV=f32 or KILN_CUDA_MATMUL=bf16x2, or
     * DTYPE_F8_E4M3 with kv_fp8. */
    enum dtype (*kv_dtype)(void *ctx);

    /* Sampling on the device (NULL on the CPU, whose engine samples on the
     * host with src/sample). For each of n rows of logits[n][ld] (vocab
     * columns): applies the row's grammar mask (rows[i].mask) and its
     * adjustments in place (entries
     * adj[rows[i].adj_start, + n_adj), see struct backend_sample_adj), then
     * writes tokens[i] with the CPU sampler's semantics (sample/sampling.h:
     * greedy, temperature, top_k, top_p, min_p, the (seed, step) draw).
     * tokens, rows and adj are device memory, so a call can be recorded in
     * a graph; nothing is read back on the host. A row's token depends only
     * on its logits and parameters, never on the other rows. */
    void (*sample)(void *ctx, int32_t *tokens, float *logits, long ld, long n, long vocab,
                   const struct backend_sample_row *rows, const struct backend_sample_adj *adj);

    /* Device memory now free and in total (bytes), for the memory plan
     * (scheduler: weights, activations, then the KV pool from what is left
     * under --mem-fraction-static). NULL: host memory, no plan (the CPU). */
    void (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* weight_upload of the concatenation of count host buffers (stacked
     * q|k|v, gate|up) without building it on the host first. */
    const void *(*weight_upload_cat)(void *ctx, const void *const *hosts, const size_t *bytes,
                                     int count);
    /* weight_upload_cat whose copy may still be running on return: the
     * device memory is allocated (and reads as zeros until the copy lands)
     * and the host bytes must stay valid and unchanged until
     * weights_finish, which waits for every such copy. Lets start-up work
     * (KV pool, warm-up) overlap reading the checkpoint. NULL: uploads are
     * synchronous. */
    const void *(*weight_upload_later)(void *ctx, const void *const *hosts, const size_t *bytes,
                                       int count);
    void (*weights_finish)(void *ctx);
    /* Whether the operations enqueued since the last call could run:
     * operations return nothing, so one that cannot get the device memory
     * it needs (a larger batch than the memory plan foresaw) skips its
     * work and the failure waits here; later operations of the step may
     * compute garbage. -1 with the failure in err (KILN_ERR_OUT_OF_MEMORY:
     * what, how much, the device's memory) and the failure cleared; the
     * backend is then ready for the next step. The runner calls it after
     * every forward and discards a failed one's results. NULL: operations
     * never fail (the CPU aborts on host out of memory). */
    int (*step_status)(void *ctx, struct kiln_error *err);
};

/* Per-row parameters of backend_ops.sample (device memory). Greedy (the
 * first index of the largest logit) when temperature <= 0, top_k == 1 or
 * the largest logit is not finite. */
struct backend_sample_row {
    float temperature;
    int32_t top_k;     /* <= 0 or >= vocab: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;     /* the draw is uniform01(seed, step), as the CPU sampler's */
    uint64_t step;     /* index of the output token being drawn */
    int32_t adj_start; /* this row's adjustments: adj[adj_start, adj_start + n_adj) */
    int32_t n_adj;
    /* grammar mask (structured outputs), device memory: bit (i & 31) of
     * word i >> 5 clear means token i is -inf before anything else; NULL:
     * no mask. Covers the whole vocabulary. */
    const uint32_t *mask;
};

/* One token's adjustment, applied in the CPU's order (the engine's
 * min_new_tokens mask, logit_bias, repetition penalty, then frequency /
 * presence) with the CPU's float arithmetic; at most one entry per token
 * and row. Built by sampler_build_adjustments (sample/sampling.h). */
enum {
    BACKEND_ADJ_MASK = 1, /* x = -inf */
    BACKEND_ADJ_BIAS = 2, /* x = x + bias */
    BACKEND_ADJ_REP = 4,  /* x = x > 0 ? x / rep : x * rep */
    BACKEND_ADJ_SUB = 8,  /* x = x - sub (frequency * count + presence) */
};
struct backend_sample_adj {
    int32_t id;
    uint32_t flags;
    float bias, rep, sub;
};

struct backend {
    const struct backend_ops *ops;
    void *ctx;
};

static inline enum dtype backend_kv_dtype(const struct backend *be) {
    return be->ops->kv_dtype ? be->ops->kv_dtype(be->ctx) : DTYPE_F32;
}

struct backend_options {
    int n_threads; /* CPU: 0 = one per core */
    int device;    /* GPU ordinal */
    int deterministic; /* 1: a row's results do not depend on the batch it is in (GPU: fixed
                          reduction orders for matmuls; the CPU backend always is) */
    int kv_fp8;    /* 1: an FP8 (e4m3) KV cache, --kv-cache-dtype fp8_e4m3 (0: auto, the
                      backend's own type); a backend without one fails to create */
    int cpu_f32;   /* CPU: fp32 products whatever KILN_CPU_MATMUL says (the reference runner
                      of kiln verify --routing-check) */
};

/* Backends are created by name in backend/registry.h; this frees one made
 * there (a zeroed or already destroyed one too). */
void backend_destroy(struct backend *be);

#endif
