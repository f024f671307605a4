/* cuda_backend.h — the CUDA backend: fp32 activations on one stream, weights
 * kept in their checkpoint dtype (bf16 mostly), matrix products through
 * cuBLAS with the activations rounded to the weights' 16-bit type (see
 * docs/cuda-testing.md for what that costs in accuracy), everything else in
 * hand-written kernels that accumulate in fp32.
 *
 * Files, one per kernel family; each exports only the extern "C" entry
 * points declared here and keeps its kernels static:
 *   cuda_backend.c      context, memory, graphs, the operation table
 *   cuda_embed.cu       embedding rows
 *   cuda_norm.cu        rmsnorm, fused residual add + rmsnorm
 *   cuda_norm_row.cuh   one row of the add + norm, shared with the fused all-reduce
 *   cuda_rope.cu        rotary embedding, KV-cache stores, fused q/k norm + rope + store
 *   cuda_elementwise.cu silu_mul, gelu_tanh_mul, scale, add, gated_add, gather_rows, copy_rows
 *   cuda_matmul.cu      the product dispatch: cuBLASLt / cuBLAS on 16-bit operands,
 *                       fused norm + product and SwiGLU MLP ops
 *   cuda_gemv.cu        the GEMV for few rows (fixed K split, fused SwiGLU epilogue)
 *   cuda_fp8.cu         products with block-quantized FP8 (e4m3) weights: GEMV, tiles,
 *                       dequantization for cuBLASLt
 *   cuda_pdl.cuh        programmatic dependent launch helpers
 *   cuda_profile.c      per-operation device timing (KILN_CUDA_PROFILE=1)
 *   cuda_attention.cu   paged causal attention (GQA, MLA): tensor-core prefill,
 *                       fixed-chunk split-KV decode
 *   cuda_attn_decode.cu decode attention on the bf16 cache (tensor cores, fixed chunks)
 *   cuda_attn_mla.cu    MLA decode attention on the bf16 latent cache (all heads of a
 *                       token share one pass over its latent rows; fixed chunks)
 *   cuda_matmul_det.cu  row-invariant matmul for --deterministic
 *   cuda_moe.cu         expert routing and the expert MLPs
 *   cuda_gemm_small.cu  the experts' grouped products on the device (mma.sync)
 *   cuda_moe_gemv.cu    the experts' products for a few rows per expert (grouped GEMV)
 *   cuda_moe_quant.cu   the experts' products with FP8 or MXFP4 experts (GEMV and grouped mma)
 *   cuda_sample.cu      sampling: adjustments, greedy, top_k / top_p / min_p, the draw
 *   cuda_nccl.c         the communicator between ranks (NCCL on the stream)
 *   cuda_allreduce.cu   the one-shot all-reduce over CUDA IPC, alone or fused
 *                       with the residual add + RMSNorm after it
 *   hopper/gemm_wgmma.cu small-M product on wgmma + TMA (sm_90a, cc 9.0)
 *
 * Every CUDA and cuBLAS call goes through CUDA_CHECK / CUBLAS_CHECK: a
 * failure there is a broken invariant (bad launch, device fault) and aborts
 * with file:line. Failures a user can cause (no GPU, out of memory) are
 * reported through return values instead; operations return nothing, so
 * device memory a step cannot get is recorded in the context (oom) and
 * reported by backend_ops.step_status after the step.
 *
 * This header is plain C (the .cu files include it inside extern "C").
 */
#ifndef KILN_BACKEND_CUDA_BACKEND_H
#define KILN_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "tensor/backend.h"

struct threadpool;

__attribute__((noreturn)) void cuda_fail(const char *expr, const char *what, const char *file,
                                         int line);

#define CUDA_CHECK(call)                                                        \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) cuda_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CHECK(call)                                                      \
    do {                                                                        \
        cublasStatus_t s_ = (call);                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                        \
            cuda_fail(#call, cublasGetStatusString(s_), __FILE__, __LINE__);    \
    } while (0)
/* KILN_ASSERT for the .cu files (base/error.h is C-only). */
__attribute__((noreturn)) void cuda_assert_fail(const char *expr, const char *file, int line,
                                                const char *msg);
#define CUDA_ASSERT_MSG(cond, msg)                                              \
    do {                                                                        \
        if (!(cond)) cuda_assert_fail(#cond, __FILE__, __LINE__, (msg));        \
    } while (0)
#define CUDA_ASSERT(cond) CUDA_ASSERT_MSG(cond, NULL)
/* After every kernel launch: catches bad configurations at once. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* Grow-only device scratch: sized by the first (largest) batches, then
 * reused, so steady-state steps allocate nothing. */
struct cuda_scratch {
    void *p;
    size_t bytes;
};

struct cuda_ctx {
    int device;
    int n_sm;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws;             /* cuBLAS workspace */
    long max_tokens, max_context;
    int max_heads;
    struct cuda_scratch act16;   /* 16-bit copy of a matmul's activations */
    struct cuda_scratch fp8w;    /* FP8 weight rows dequantized to bf16 (cuda_matmul.cu) */
    struct cuda_scratch attn;    /* split-KV partial results */
    /* mixture of experts */
    struct cuda_scratch moe_dev; /* gathered rows, expert outputs, row lists */
    int32_t *moe_host_ids;       /* [rows] routing ids copied back */
    int32_t *moe_host_list;      /* [rows] rows grouped by expert */
    size_t moe_host_rows;
    /* MoE on the device (cuda_moe.cu): batches of up to moe_device_max
     * tokens with 16-bit experts sort their rows by expert on the device
     * and run grouped products, no host round trip (graph-capturable);
     * larger ones take the host sort and cuBLAS per expert.
     * KILN_CUDA_MOE=device turns it on (0 otherwise: always the host
     * path); KILN_CUDA_MOE_MAX: the bound */
    int moe_device_max;
    void *moe_tables;            /* per-layer device tables of expert weight pointers */
    long moe_device_calls;       /* moe_ffn calls that took the device path (host count, for tests) */
    /* weight uploads: pinned staging, the loader thread (cuda_upload.c) */
    struct cuda_uploader *up;
    long upload_delay_ms;        /* test hook: a slow disk (KILN_CUDA_UPLOAD_DELAY_MS) */
    int gemv_max_rows;           /* matmuls of at most this many rows use the GEMV */
    int split_act;               /* 1: activations as bf16 hi + lo (two products) */
    /* graphs: scratch_gen counts moves of scratch memory (a graph captured
     * before a move points at freed memory and is stale); capturing is set
     * between graph_begin and graph_end, when nothing may be (re)allocated */
    unsigned scratch_gen;
    int capturing;
    int deterministic;           /* 1: batch-invariant results (cuda_matmul_det for products) */
    int attn_impl;               /* enum cuda_attn_impl (KILN_CUDA_ATTN) */
    int kv_bf16;                 /* 1: the KV cache holds bf16 (default); 0: fp32
                                    (KILN_CUDA_KV=f32, KILN_CUDA_MATMUL=bf16x2) or FP8 */
    int kv_fp8;                  /* 1: the KV cache holds e4m3 with per-layer scales
                                    (--kv-cache-dtype fp8_e4m3; kv_bf16 is 0) */
    struct cuda_scratch sample_part; /* sampling: per-chunk argmax partials */
    /* the second stream (backend_ops.side_begin): MoE steps of up to
     * dual_max tokens (KILN_CUDA_DUAL_STREAM; 0: off) run the shared
     * experts on it. While on_side, `stream` is the side stream and act16
     * holds the side's 16-bit scratch (swapped with act16_side). */
    cudaStream_t main_stream, side_stream;
    cudaEvent_t side_fork, side_done;
    struct cuda_scratch act16_side;
    struct cuda_scratch fp8w_side;
    int on_side;
    long dual_max;
    int sample_ready;            /* the row kernel's shared-memory limit is set */
    /* the product path (cuda_matmul.cu, cuda_gemv.cu, cuda_pdl.cuh) */
    int pdl;                     /* 1: small kernels use programmatic dependent launch
                                    (sm_90+; KILN_CUDA_PDL=0 clears it) */
    int fuse;                    /* 1: norm_matmul / norm_swiglu_mlp fuse (KILN_CUDA_FUSE=0:
                                    they run the plain sequence) */
    int gemv_ks;                 /* GEMV K split: 0 = by shape, or 1, 2, 4 (KILN_CUDA_GEMV_KS) */
    int use_lt;                  /* 1: 16-bit products through cuBLASLt (KILN_CUDA_LT=0: GemmEx) */
    int fp8_lt;                  /* 1: FP8 products of many rows through cuBLASLt's block-scaled
                                    FP8 where it has an algorithm (KILN_CUDA_FP8_LT=0: bf16) */
    void *lt;                    /* cuBLASLt handle and plan cache (cuda_matmul.cu) */
    size_t cublas_ws_bytes;      /* size of cublas_ws */
    void *prof;                  /* per-operation timing (KILN_CUDA_PROFILE=1, cuda_profile.c) */
    /* prefill attention on head size 128 and the bf16 cache: 0 the
     * FlashAttention-2-style kernel (cuda_attention.cu), 1 the wgmma kernel
     * (hopper/attn_prefill.cu, default on compute capability 9.0 when built;
     * KILN_CUDA_FA=fa2|fa3) */
    int fa_hopper;
    /* small-M wgmma product (hopper/gemm_wgmma.cu; Hopper builds, cc 9.0) */
    int wgmma;                   /* 1: 16-bit products of 1..64 rows use it
                                    (KILN_CUDA_WGMMA=0: cuBLAS) */
    long wgmma_min_bytes;        /* smaller weights take cuBLAS (KILN_CUDA_WGMMA_MIN_MB) */
    int wgmma_glu;               /* 1: gate|up on it writes silu(g)·u in 16 bits from its
                                    epilogue, no SwiGLU kernel (KILN_CUDA_WGMMA_GLU=0: off) */
    int wgmma_rope;              /* 1: q|k|v on it rotates and stores K/V in its epilogue, no
                                    qk_rope_store kernel (KILN_CUDA_WGMMA_ROPE=0: off) */
    int wgmma_fp8;               /* 1: FP8 products past the GEMV's rows on its e4m3 form
                                    (KILN_CUDA_WGMMA_FP8=0: the tile kernel, cuBLASLt) */
    long rope_fused;             /* products that did (host count, for tests) */
    long mla_decode_calls;       /* launches of the MLA decode kernel (host count, for tests) */
    int mla_occ;                 /* MLA decode CTAs an SM holds (cuda_attn_mla.cu; 0: not set up yet) */
    long wgmma_calls;            /* 16-bit products it ran (host count, for tests) */
    long wgmma_fp8_calls;        /* e4m3 products it ran (host count, for tests) */
    long wgmma_fp8_rows_calls;   /* of them, on hopper/gemm_fp8.cu's 128- or 192-row tiles */
    long wgmma_fp8_rows192_calls; /* of those, on its 192-row tiles */
    long fp8_lt_calls;           /* FP8 products on cuBLASLt's block-scaled FP8 (host count) */
    void *wgmma_state;           /* tensor-map caches, occupancy (gemm_wgmma.cu) */
    int moe_wgmma;               /* 1: MoE expert products of prefill-sized groups on wgmma
                                    (hopper/moe_wgmma.cu; KILN_CUDA_MOE_WGMMA=0: mma.sync) */
    void *moe_wg_state;          /* its tensor-map caches (moe_wgmma.cu) */
    int ad_warps;                /* decode attention at head size 128: warps per CTA, 2 or 4
                                    (chunks of 32 positions per warp); 0: by the batch
                                    (KILN_CUDA_AD_W=2|4 forces) */
    int ad_occ4;                 /* CTAs of its 4-warp kernel an SM (0: not asked yet) */
    unsigned gemm_small_ready;   /* MoE product variants whose smem limit is set (cuda_gemm_small.cu) */
    /* Device memory a step could not get (cuda_oom_record): the first
     * failure since backend_ops.step_status last looked; bytes 0: none.
     * While one is pending, scratch does not grow and MoE layers skip. */
    struct {
        size_t bytes, free_bytes, total_bytes;
        char what[112];
    } oom;
};

/* Attention kernels (KILN_CUDA_ATTN=auto|scalar|split; see cuda_attention.cu). */
enum cuda_attn_impl {
    CUDA_ATTN_AUTO = 0, /* tensor-core prefill; decode: cuda_attn_decode on bf16, else split-KV */
    CUDA_ATTN_SCALAR,   /* the first kernel: one block per (token, head) */
    CUDA_ATTN_SPLIT,    /* the fp32 split-KV kernel for every row */
};

/* Makes sure s holds at least bytes (stream-ordered; contents are lost)
 * for an operation on `rows` rows. Out of device memory (or another
 * failure pending) returns -1 with the failure recorded and s empty: the
 * caller skips its kernels; the step's result is discarded
 * (backend_ops.step_status). */
int cuda_scratch_reserve(struct cuda_ctx *c, struct cuda_scratch *s, size_t bytes, long rows);
/* Records that `bytes` of device memory for `what` could not be had
 * (the first failure of a step wins) with the device's free and total
 * memory now, and clears the CUDA error state. */
void cuda_oom_record(struct cuda_ctx *c, size_t bytes, const char *what);

/* Operations, with the signatures of struct backend_ops. */
void cuda_op_embed(void *ctx, float *y, const struct backend_weight *table, const int32_t *ids,
                   long n);
void cuda_op_embed_shard(void *ctx, float *y, const struct backend_weight *table,
                         const int32_t *ids, long first, long n);
void cuda_op_matmul(void *ctx, float *y, long ldy, const float *x, long ldx,
                    const struct backend_weight *w, const float *bias, long n);
void cuda_op_matmul_heads(void *ctx, float *y, long ldy, long hy, const float *x, long ldx,
                          long hx, const struct backend_weight *w, long w_stride, int n_heads,
                          long n);
void cuda_op_rmsnorm(void *ctx, float *y, long ldy, const float *x, long ldx, const float *w,
                     long n, long dim, float eps);
void cuda_op_add_rmsnorm(void *ctx, float *h, const float *delta, float *y, const float *w, long n,
                         long dim, float eps);
void cuda_op_rope(void *ctx, float *x, long ldx, long n, int n_heads, long head_stride,
                  int rot_dim, const int32_t *pos, const float *cos_sin, int interleaved);
void cuda_op_kv_store(void *ctx, void *cache, long stride, const float *src, long ld, long width,
                      const int32_t *slots, long n, float scale);
void cuda_op_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u,
                      long ldu, long n, long dim);
void cuda_op_add(void *ctx, float *y, const float *x, long count);
void cuda_op_gelu_tanh_mul(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u,
                           long ldu, long n, long dim);
void cuda_op_scale(void *ctx, float *x, long count, float s);
void cuda_op_gated_add(void *ctx, float *y, const float *x, const float *gate, long ldgate, long n,
                       long dim);
void cuda_op_gather_rows(void *ctx, float *dst, const float *src, long width, const int32_t *rows,
                         long n);
void cuda_op_copy_rows(void *ctx, float *dst, long ldd, const float *src, long lds, long n,
                       long width);
void cuda_op_attention(void *ctx, float *out, long ldo, const float *q, long ldq,
                       const void *k_cache, const void *v_cache, const struct attn_params *p,
                       const struct backend_batch *b);
/* cuda_mla.cu: backend_ops.kv_gather and mla_kv_expand */
void cuda_op_kv_gather(void *ctx, float *dst, long ldd, const void *cache, long stride, long width,
                       const int32_t *pages, int page_size, long p0, long n, float scale);
void cuda_op_mla_kv_expand(void *ctx, void *k, void *v, const float *kv, long ldkv,
                           const float *k_rope, long ldr, long n, int n_heads, int nope, int rope,
                           int vd);
void cuda_op_moe_route(void *ctx, int32_t *ids, float *weights, const float *logits,
                       const float *bias, const struct moe_route_params *p, long n);
void cuda_op_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids, const float *weights,
                     int top_k, const struct moe_experts *e, long n);
int cuda_op_moe_ffn_graphable(void *ctx, const struct moe_experts *e, int top_k, long n);
const char *cuda_op_moe_experts_refuse(void *ctx, const struct moe_experts *e);
/* Device scratch of moe_ffn for steps up to s (one chunk's rows on either
 * path, and the expert tables of s->moe_layers layers). */
size_t cuda_moe_scratch_bytes(const struct cuda_ctx *c, const struct backend_step_shape *s);
/* backend_ops.workspace_bytes (cuda_workspace.c). */
size_t cuda_op_workspace_bytes(void *ctx, const struct backend_step_shape *s);
/* Sampler partials for `rows` rows (cuda_sample.cu). */
size_t cuda_sample_scratch_bytes(long rows);
void cuda_moe_release(struct cuda_ctx *c);
void cuda_op_qk_rope_store(void *ctx, float *q, float *k, const float *v, long ld, long n,
                           const struct backend_rope_store *r);

/* y[n][w.rows] = x · wᵀ (+ bias) with every output's reduction order fixed
 * by cols alone, never by n: a row's result does not depend on the batch. */
void cuda_matmul_det(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                     const struct backend_weight *w, const float *bias, long n);

/* cuda_matmul_det for each of n_heads heads (matmul_heads' strides). */
void cuda_matmul_det_heads(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x,
                           long ldx, long hx, const struct backend_weight *w, long w_stride,
                           int n_heads, long n);

/* Scratch the attention wants for split-KV decode (bytes), given the
 * context's SM count; used by reserve. */
size_t cuda_attention_scratch_bytes(const struct cuda_ctx *c);

/* Sampling (cuda_sample.cu): backend_ops.sample, and a test hook that
 * also writes kept[n][vocab] = 1 for every token the row's draw could pick
 * (the kept set after top_k / top_p / min_p with positive weight; the one
 * greedy token for greedy rows). */
void cuda_op_sample(void *ctx, int32_t *tokens, float *logits, long ld, long n, long vocab,
                    const struct backend_sample_row *rows, const struct backend_sample_adj *adj);
/* Reserves the sampler's scratch for c->max_tokens rows (from reserve);
 * -1: out of device memory (recorded in c->oom). */
int cuda_sample_reserve(struct cuda_ctx *c);
void cuda_sample_kept(void *ctx, unsigned char *kept, int32_t *tokens, float *logits, long ld,
                      long n, long vocab, const struct backend_sample_row *rows,
                      const struct backend_sample_adj *adj);

/* The attention scratch (cuda_ctx.attn) starts with CUDA_ATTN_COUNTER_BYTES
 * of arrival counters (cuda_attn_decode.cu; zeroed when reserve allocates
 * the scratch, and zero again after every launch), then the chunk states. */
enum { CUDA_ATTN_COUNTER_BYTES = 64 << 10 };
static inline float *cuda_attn_states(const struct cuda_ctx *c) {
    return (float *)((char *)c->attn.p + CUDA_ATTN_COUNTER_BYTES);
}
static inline size_t cuda_attn_states_bytes(const struct cuda_ctx *c) {
    return c->attn.bytes > CUDA_ATTN_COUNTER_BYTES ? c->attn.bytes - CUDA_ATTN_COUNTER_BYTES : 0;
}

/* Decode attention on the bf16 cache (cuda_attn_decode.cu): the rows of
 * sequences with exactly one new token, dk = dv ∈ {64, 128}, K/V strides
 * multiples of 8 elements, 16-byte aligned caches. */
void cuda_attn_decode(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                      const void *k_cache, const void *v_cache, const struct attn_params *p,
                      const struct backend_batch *b);
/* cuda_attn_prefill.cu: the tensor-core prefill kernel for the rows of
 * b's multi-token sequences (dk = dv ∈ {64, 128}; bf16, fp32 or FP8
 * cache; windows and sinks) */
void cuda_attn_fa_prefill(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                          const void *k_cache, const void *v_cache, const struct attn_params *p,
                          const struct backend_batch *b);
/* Whether cuda_op_attention (out, ldo: its output) sends every row of b
 * to cuda_attn_decode: a batch of decode rows and the kernel's conditions
 * (cuda_attention.cu keeps the routing in one place). */
int cuda_attn_decode_all(const struct cuda_ctx *c, const void *out, long ldo, const float *q,
                         long ldq, const void *k_cache, const void *v_cache,
                         const struct attn_params *p, const struct backend_batch *b);
/* The same with the output rounded to dt (DTYPE_BF16 or DTYPE_F16) as the
 * output projection's 16-bit operand: the bits of cuda_attn_decode then
 * the conversion pass. */
void cuda_attn_decode16(struct cuda_ctx *c, void *out16, enum dtype dt, long ldo, const float *q,
                        long ldq, const void *k_cache, const void *v_cache,
                        const struct attn_params *p, const struct backend_batch *b);

/* MLA decode attention (cuda_attn_mla.cu): the rows of sequences with
 * exactly one new token over the bf16 latent cache, one KV head, dk =
 * kv_lora + rope = 576, dv = kv_lora = 512, V the first dv columns of the
 * K rows (v_cache == k_cache). cuda_attn_mla_ok: whether it applies to
 * this call's shapes and pointers; rows of other sequences are skipped. */
int cuda_attn_mla_ok(const struct cuda_ctx *c, const float *out, long ldo, const float *q,
                     long ldq, const void *k_cache, const void *v_cache,
                     const struct attn_params *p);
void cuda_attn_mla(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                   const void *k_cache, const struct attn_params *p,
                   const struct backend_batch *b);

int cuda_backend_create(struct backend *be, const struct backend_options *opt,
                        struct kiln_error *err);

/* Fused operations (cuda_matmul.cu): norm + product, attention + output
 * projection. */
void cuda_op_attention_matmul(void *ctx, float *y, long ldy, float *att, long ldatt,
                              const float *q, long ldq, const void *k_cache, const void *v_cache,
                              const struct attn_params *p, const struct backend_batch *b,
                              const struct backend_weight *wo, const float *bias, long n);
int cuda_op_norm_reduce_ok(void *ctx, const struct dist_comm *comm, long n, long dim);
void cuda_op_reduce_add_rmsnorm(void *ctx, const struct backend_norm *nm, long n);
void cuda_op_norm_matmul(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                         const struct backend_weight *w, const float *bias, long n);
void cuda_op_norm_matmul_rope(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                              const struct backend_stack *w, const float *bias, long n,
                              const struct backend_rope_store *r);
void cuda_op_norm_swiglu_mlp(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                             const struct backend_stack *gate_up, const struct backend_weight *down,
                             float *gu, long ldgu, long n);
/* The product path's internals. */
void cuda_matmul_init(struct cuda_ctx *c);    /* cuBLASLt handle when use_lt */
void cuda_matmul_release(struct cuda_ctx *c);
/* The GEMV (cuda_gemv.cu): whether it serves w for n rows, whether x rows
 * allow its 16-byte activation loads, and y = x · wᵀ (+ bias); swiglu: w is
 * gate|up stacked and y[n][w.rows / 2] = silu(x·gateᵀ) · (x·upᵀ). */
int cuda_gemv_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n);
int cuda_gemv_xvec(const float *x, long ldx);
void cuda_gemv(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
               const struct backend_weight *w, const float *bias, long n, int swiglu);
/* The GEMV for each of n_heads heads in one launch (matmul_heads' strides;
 * each head the bits of cuda_gemv on its views). */
int cuda_gemv_heads_ok(const struct cuda_ctx *c, const struct backend_weight *w, long w_stride,
                       int n_heads, long n);
void cuda_gemv_heads(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x, long ldx,
                     long hx, const struct backend_weight *w, long w_stride, int n_heads, long n);
/* FP8 weights (cuda_fp8.cu). Decode rows (n ≤ CUDA_FP8_GEMV_ROWS) take the
 * FP8 GEMV (swiglu as cuda_gemv's); up to CUDA_FP8_TILE_ROWS rows (every n
 * under --deterministic) the row-invariant tile kernel; more rows
 * cuBLASLt's block-scaled FP8, or the weight dequantized to bf16 in chunks
 * of rows for cuBLASLt's bf16 product (cuda_matmul.cu fp8_matmul). */
enum { CUDA_FP8_GEMV_ROWS = 4, CUDA_FP8_TILE_ROWS = 64 };
/* The largest fp8w scratch: a chunk of dequantized rows, or split partials. */
#define CUDA_FP8_SCRATCH_BYTES ((size_t)64 << 20)
/* The 16-byte loads of the GEMV, the tiles and the dequantization apply:
 * cols and block_cols multiples of 16, data 16-byte aligned. */
int cuda_fp8_vec_ok(const struct backend_weight *w);
int cuda_fp8_gemv_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n);
void cuda_fp8_gemv(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                   const struct backend_weight *w, const float *bias, long n, int swiglu);
/* y = x · wᵀ (+ bias) on the tile kernel (the scalar kernel where
 * cuda_fp8_vec_ok fails), for n_heads heads: head h's y, x at h·hy, h·hx
 * and its weight rows from row h·w_row_stride (a multiple of block_rows). */
void cuda_fp8_tiles(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x, long ldx,
                    long hx, const struct backend_weight *w, long w_row_stride, const float *bias,
                    int n_heads, long n);
/* dst[r1 - r0][cols] (bf16) = rows r0..r1 of w dequantized, each
 * bf16(e4m3 · scale). */
void cuda_fp8_dequant(struct cuda_ctx *c, void *dst, const struct backend_weight *w, long r0,
                      long r1);
/* The e4m3 operand of n rows of cols (cols % 128 == 0) in one buffer, as
 * the norm and the SwiGLU write it: the codes [n][cols], then from the next
 * 256-byte boundary (q8_scales_off) the scales [cols / 128][n]; q8_bytes in
 * all, the scales' part rounded to 256 bytes too. */
#ifdef __CUDACC__
#define KILN_Q8_HD __host__ __device__
#else
#define KILN_Q8_HD
#endif
static inline KILN_Q8_HD size_t q8_scales_off(long n, long cols) {
    return ((size_t)n * (size_t)cols + 255) & ~(size_t)255;
}
static inline size_t q8_bytes(long n, long cols) {
    return q8_scales_off(n, cols) + (((size_t)n * (size_t)(cols / 128) * 4 + 255) & ~(size_t)255);
}
static inline float *q8_scales(void *q8, long n, long cols) {
    return (float *)((char *)q8 + q8_scales_off(n, cols));
}
/* xq[n][cols] (e4m3) and xs[cols / 128][n] (fp32): x quantized per row and
 * 128-column group, scale max|x| / 448 (cuBLASLt's VEC128_32F layout). */
void cuda_fp8_quant_act(struct cuda_ctx *c, void *xq, float *xs, const float *x, long ldx, long n,
                        long cols);
/* q8 = silu(gate)·up of gu [n][2·inter] (stride ldgu) as the e4m3 operand
 * above (n rows of inter). */
void cuda_fp8_silu_quant(struct cuda_ctx *c, void *q8, const float *gu, long ldgu, long n, long inter);
/* add_rmsnorm of nm into that e4m3 form (codes [n][dim], the scales at
 * q8_scales_off(n, dim)) instead of nm->x: the bytes cuda_fp8_quant_act
 * makes of the plain op's output (cuda_norm.cu); ok: no all-reduce, dim %
 * 128 == 0, the float4 kernel's operands. */
int cuda_add_rmsnorm8_ok(const struct backend_norm *nm);
void cuda_add_rmsnorm8(struct cuda_ctx *c, const struct backend_norm *nm, long n, void *q8);
/* add_rmsnorm of nm that also writes x16[n][dim] = x rounded to dt (BF16 or
 * F16) for the product that follows (cuda_norm.cu). */
void cuda_add_rmsnorm16(struct cuda_ctx *c, const struct backend_norm *nm, long n, void *x16,
                        enum dtype dt);
/* Whether cuda_add_rmsnorm16 can give add_rmsnorm's bits for nm (not: no
 * delta and narrow rows, which add_rmsnorm sends to rmsnorm's warp kernel). */
int cuda_add_rmsnorm16_ok(const struct backend_norm *nm);
/* x16[n][inter] = silu(g) · u rounded to dt, g | u rows of gu (stride ldgu)
 * (cuda_elementwise.cu). */
void cuda_silu16(struct cuda_ctx *c, void *x16, enum dtype dt, const float *gu, long ldgu, long n,
                 long inter);
/* KILN_CUDA_PROFILE=1: times every operation with events and prints a
 * table at exit (cuda_profile.c); replaces be->ops with a timing copy. */
void cuda_profile_install(struct backend *be);

/* cuda_upload.c: weight uploads, synchronous or queued to a loader thread */
const void *cuda_weight_upload(void *ctx, const void *host, size_t bytes);
const void *cuda_weight_upload_cat(void *ctx, const void *const *hosts, const size_t *bytes,
                                   int count);
const void *cuda_weight_upload_later(void *ctx, const void *const *hosts, const size_t *bytes,
                                     int count);
void cuda_weights_finish(void *ctx);
void cuda_uploader_destroy(struct cuda_ctx *c);
/* backend_ops.weight_release: the tensor's slab goes back to the device
 * with its last tensor. */
void cuda_weight_free(struct cuda_ctx *c, const void *dev);
/* Device memory for the concatenation of count weights, from the slabs;
 * NULL when out of memory. */
void *cuda_weight_alloc(struct cuda_ctx *c, const size_t *bytes, int count);
/* backend_ops.weight_dummy (cuda_dummy.cu). */
const void *cuda_op_weight_dummy(void *ctx, const struct dummy_part *parts, int count);
/* Device memory the weights' slabs take (bytes), for tests and the log. */
size_t cuda_weight_slab_bytes(const struct cuda_ctx *c);

/* The MoE experts' products (cuda_gemm_small.cu): rows sorted by expert, `tiles`
 * [max_tiles] of int4 (expert, first sorted row, rows <= tile_rows, -)
 * with *n_tiles of them valid (both on the device); sorted row p reads x16
 * row p, or row order[p] / top_k where order is not NULL. Without w_b,
 * y (fp32, stride ldy) = x16 · w_a[expert]ᵀ, N = the weights' rows; with
 * w_b (glu), y (16-bit, stride ldy) = silu(x16 · w_aᵀ) · (x16 · w_bᵀ),
 * N = the inner size. w_a, w_b: device arrays of per-expert pointers.
 * e (NULL: none) gives the experts' biases and activation (struct
 * moe_experts): with glu its gate and up biases and act, without its
 * down bias (cuda_moe_act.cuh); the same for the GEMV and FP8 products. */
int cuda_gemm_small_grouped_ok(long N, long K, int glu);
void cuda_gemm_small_grouped(struct cuda_ctx *c, enum dtype dt, int tile_rows, void *y, long ldy,
                             const void *x16, long ldx, const int32_t *order, int top_k,
                             const void *const *w_a, const void *const *w_b, const void *tiles,
                             const int *n_tiles, long max_tiles, long N, long K, const struct moe_experts *e);
/* The experts' products for a few rows per expert (cuda_moe_gemv.cu): the
 * tile list of cuda_gemm_small_grouped with tiles of tile_rows (1, 4 or 8)
 * rows; h [rows][F] (dt) = silu(x·gateᵀ)·(x·upᵀ) with sorted row p reading
 * fp32 x row order[p] / top_k, then out [rows][H] (fp32) = h · downᵀ. tab:
 * the device table [gate E][up E][down E]. ok: shapes and x alignment. */
int cuda_moe_gemv_ok(long hidden, long inter, const float *x);
void cuda_moe_gemv(struct cuda_ctx *c, enum dtype dt, int tile_rows, void *h, float *out,
                   const float *x, long H, long F, const int32_t *order, int top_k,
                   void *const *tab, long E, const void *tiles, const int *n_tiles, long max_tiles,
                   const struct moe_experts *e);
/* The experts' products with quantized experts, FP8 or MXFP4
 * (cuda_moe_quant.cu), over the same tile list: tab is the device table
 * [gate E][up E][down E][their scales 3 E] (cuda_moe.cu: FP8 block scales
 * or MXFP4 exponents); h [rows][F] bf16 (gemv with h32: fp32), out
 * [rows][H] fp32 as cuda_moe_gemv. gemv: fp32 x, tile_rows 1 or 8;
 * grouped: x16 [n][H] bf16, tile_rows <= 16 or 64. ok: the dtype, shapes
 * and blocks the GEMV takes; mma_ok: those the grouped product takes too. */
int cuda_moe_quant_ok(enum dtype dt, long hidden, long inter, int block_rows, int block_cols);
int cuda_moe_quant_mma_ok(long hidden, long inter);
void cuda_moe_quant_gemv(struct cuda_ctx *c, int tile_rows, void *h, float *out, const float *x, long H, long F,
                         const int32_t *order, int top_k, void *const *tab, long E, const void *tiles,
                         const int *n_tiles, long max_tiles, int br, int bc, int h32, const struct moe_experts *e);
void cuda_moe_quant_grouped(struct cuda_ctx *c, int tile_rows, void *h, float *out, const void *x16, long H, long F,
                            const int32_t *order, int top_k, void *const *tab, long E, const void *tiles,
                            const int *n_tiles, long max_tiles, int br, int bc, const struct moe_experts *e);
/* The NCCL communicator (cuda_nccl.c): backend_ops.comm_id / comm_init.
 * cuda_comm_ar: the one-shot all-reduce of a communicator cuda_comm_init
 * made, or NULL (another communicator, or its ranks could not map each
 * other's memory, or KILN_CUDA_ONE_SHOT=0). */
int cuda_comm_id(void *ctx, void *blob, size_t *len, struct kiln_error *err);
int cuda_comm_init(void *ctx, struct dist_comm *c, int rank, int size, const void *id, size_t id_len,
                   struct kiln_error *err);
const struct cuda_ar *cuda_comm_ar(const struct dist_comm *c);
/* The one-shot all-reduce (cuda_allreduce.cu; cuda_nccl.c sets it up).
 * peers.buf[p]: rank p's three buffers of `size` slots of cap floats
 * ([3][size][cap]), as this rank maps them, filled with -0 at the start
 * (cuda_ar_fill); peers.state: this rank's five counter words, zero at the
 * start. Messages of up to max_bytes (and cap floats) take it, on cc's
 * stream. cuda_ar_sum: x[n] in place (cuda_ar_sum_ok: n % 4 == 0, x
 * 16-byte aligned). cuda_ar_norm: nm->delta is this rank's part; h += the
 * sum over the ranks, then the norm into nm->x, or into x16 (dt, 16-bit)
 * when x16 is not NULL; cuda_ar_norm_ok says which n and dim it serves
 * (all of h, delta, w and the output 16-byte aligned). */
enum { CUDA_AR_MAX_RANKS = 8, CUDA_AR_STATE_WORDS = 5 };
struct cuda_ar_peers {
    int rank, size;
    long cap;
    float *buf[CUDA_AR_MAX_RANKS];
    uint32_t *state;
};
struct cuda_ar {
    const struct cuda_ctx *cc;
    size_t max_bytes;
    struct cuda_ar_peers peers;
};
int cuda_ar_fill(void *p, size_t bytes);
/* Whether add_rmsnorm's float4 kernel serves these operands (cuda_norm.cu) */
int cuda_norm_vec_ok(const float *h, const float *delta, const float *y, const float *w, long dim);
int cuda_ar_sum_ok(const struct cuda_ar *ar, const float *x, long n);
void cuda_ar_sum(const struct cuda_ar *ar, float *x, long n);
int cuda_ar_norm_ok(const struct cuda_ar *ar, long n, long dim);
void cuda_ar_norm(const struct cuda_ar *ar, const struct backend_norm *nm, long n, void *x16, enum dtype dt);
/* x16 [n][cols] = x in dt (16-bit), in the act16 scratch (cuda_matmul.cu);
 * NULL when the scratch could not grow (nothing run) */
void *cuda_act16(struct cuda_ctx *c, const float *x, long ldx, long n, long cols, enum dtype dt);

/* The small-M wgmma + TMA product (hopper/gemm_wgmma.cu, built only with
 * KILN_CUDA_HOPPER): init returns 1 when the device is compute capability
 * 9.0 and the driver's tensor-map encoder is there (sets wgmma_state);
 * ok says whether it serves w for n rows of x16 (row stride ldx, w's
 * 16-bit type); cuda_wgmma is y[n][w.rows] (stride ldy) = x16 · wᵀ (+ bias);
 * cuda_wgmma_run forces the tile width bn (128 | 256) and the K split
 * (1..8) where they are not 0. */
int cuda_wgmma_init(struct cuda_ctx *c);
void cuda_wgmma_release(struct cuda_ctx *c);
int cuda_wgmma_ok(const struct cuda_ctx *c, const struct backend_weight *w, const void *x16,
                  long ldx, long n);
void cuda_wgmma(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                const struct backend_weight *w, const float *bias, long n);
void cuda_wgmma_run(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                    const struct backend_weight *w, const float *bias, long n, int bn, int splits);
/* The output projection after the decode attention (attention_matmul):
 * runs it on the kernel from a smaller weight size than cuda_wgmma (16
 * MiB); 0 when it does not apply (nothing run). */
int cuda_wgmma_attn_out(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                        const struct backend_weight *w, const float *bias, long n);
/* SwiGLU in the product's epilogue: y16[n][inter] (16-bit, row stride
 * ldy16) = silu(x16 · gateᵀ) · (x16 · upᵀ) for gate_up = [gate; up]
 * (2·inter rows), the bits of cuda_wgmma then cuda_silu16. ok: it serves
 * these operands (inter a multiple of 128 among others). */
int cuda_wgmma_glu_ok(const struct cuda_ctx *c, const struct backend_weight *gate_up,
                      const void *x16, long ldx, const void *y16, long ldy16, long n);
void cuda_wgmma_glu_run(struct cuda_ctx *c, void *y16, long ldy16, const void *x16, long ldx,
                        const struct backend_weight *gate_up, long n, int bn, int splits);
/* Rope and the KV-cache stores in the epilogue of the stacked q|k|v
 * product (backend_ops.norm_matmul_rope): with 128-column tiles, tile t is
 * query head t (t < n_heads, rotated, fp32 into y), key head t − n_heads
 * (rotated, bf16 into k_cache at the row's slot) or value head (bf16 into
 * v_cache). ok: head size = rot_dim = 128, half (not interleaved) rope, no
 * q/k norm, the bf16 cache, w = the (n_heads + 2 n_kv_heads)·128 stacked
 * rows, and what cuda_wgmma_ok asks. */
int cuda_wgmma_rope_ok(const struct cuda_ctx *c, const struct backend_weight *w, const void *x16,
                       long ldx, long n, const struct backend_rope_store *r);
void cuda_wgmma_rope_run(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                         const struct backend_weight *w, const float *bias, long n,
                         const struct backend_rope_store *r);
/* The MoE expert products for prefill-sized groups on wgmma + TMA
 * (hopper/moe_wgmma.cu, KILN_CUDA_HOPPER builds): init returns 1 on
 * compute capability 9.0 with the driver's tensor-map encoder (sets
 * moe_wg_state); ok: it serves these experts now (their tensor maps are
 * made on the first call, which a graph's capture cannot do: 0 then);
 * gather writes xs16[p] =
 * x[order[p] / top_k] in dt for the rows of the device tile list (tiles
 * of at most 128 rows, cuda_moe.cu); ffn runs h16 = silu(xs16 · gateᵀ) ·
 * (xs16 · upᵀ) and out = h16 · downᵀ (fp32) per tile's expert, rows
 * sorted by expert. forget drops the cached maps of the experts. */
int cuda_moe_wgmma_init(struct cuda_ctx *c);
void cuda_moe_wgmma_forget(struct cuda_ctx *c);
void cuda_moe_wgmma_release(struct cuda_ctx *c);
int cuda_moe_wgmma_ok(const struct cuda_ctx *c, const struct moe_experts *e);

void cuda_moe_wgmma_gather(struct cuda_ctx *c, enum dtype dt, void *xs16, const float *x, long H,
                           const int32_t *order, int top_k, const void *tiles, const int *n_tiles,
                           long max_tiles);
void cuda_moe_wgmma_ffn(struct cuda_ctx *c, const struct moe_experts *e, void *h16, float *out,
                        const void *xs16, long rows, const void *tiles, const int *n_tiles,
                        long max_tiles);

/* The tile width and K split cuda_wgmma_run would use for a [N][K] weight
 * (bn, splits: 0 = by shape, else forced), written back. */
void cuda_wgmma_plan(const struct cuda_ctx *c, long N, long K, int *bn, int *splits);

/* FP8 weights (128 × 128 blocks, columns a multiple of 128) on the same
 * kernel in e4m3: y[n][w.rows] = xq · wᵀ (+ bias) with the activations xq
 * [n][w.cols] in e4m3 and xs [w.cols / 128][n] their scales
 * (cuda_fp8_quant_act), any n: row tiles of 64 for decode batches,
 * hopper/gemm_fp8.cu's 128-row tiles where those fill the GPU. */
int cuda_wgmma_fp8_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n);
void cuda_wgmma_fp8(struct cuda_ctx *c, float *y, long ldy, const void *xq, const float *xs,
                    const struct backend_weight *w, const float *bias, long n);
/* The same on the kernel of tile_rows rows (64: the row tiles of the
 * decode kernel; 128 or 192: hopper/gemm_fp8.cu's, which need ldy even
 * and y 8-byte aligned; 0: by the shape, as cuda_wgmma_fp8), for
 * measurements. */
void cuda_wgmma_fp8_run(struct cuda_ctx *c, float *y, long ldy, const void *xq, const float *xs,
                        const struct backend_weight *w, const float *bias, long n, int tile_rows);
/* The same for q|k|v with rope and the K/V stores in the epilogue (what
 * cuda_wgmma_rope_ok asks of the shape). */
int cuda_wgmma_fp8_rope_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n,
                           const struct backend_rope_store *r);
void cuda_wgmma_fp8_rope(struct cuda_ctx *c, float *y, long ldy, const void *xq, const float *xs,
                         const struct backend_weight *w, const float *bias, long n,
                         const struct backend_rope_store *r);

#ifdef __cplusplus
}
#endif

#endif
