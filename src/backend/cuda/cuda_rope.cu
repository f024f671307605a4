/* cuda_rope.cu — rotary position embedding and KV-cache stores.
 *
 * Rope: one thread per rotated pair (token, head, i). cos_sin is the
 * model's table [max_pos][rot_dim / 2][2]; interleaved layouts pair
 * (2i, 2i+1) (DeepSeek, GPT-J), half layouts pair (i, i + rot_dim/2)
 * (Llama, Qwen). Only the first rot_dim dims of each head turn.
 * KV store: one block per token row, copying its K (or V, or MLA latent)
 * row into the cache slot the scheduler chose, in the cache's element type
 * (bf16 by default: rounded to nearest even; fp32 with KILN_CUDA_KV=f32;
 * e4m3 of x / scale with --kv-cache-dtype fp8_e4m3, kv_put_s).
 *
 * All three use programmatic dependent launch (cuda_pdl.cuh): rope and the KV store wait first thing; the fused
 * kernel loads its row's position, cache slot and rope factors (batch
 * metadata and the rope table: nothing a kernel writes) before waiting,
 * so the only loads after the wait are q / k / v themselves. Those inputs
 * are plain pointers, never `const __restrict__`, so that they are read
 * with ordinary coherent loads, not the non-coherent path (cuda_pdl.cuh,
 * rule 2). */
#include "backend/cuda/cuda_pdl.cuh"

/* x[n][ldx], heads at h * head_stride; pos[n] */
static __global__ void rope_kernel(float *x, long ldx, long n, int n_heads, long head_stride,
                                   int rot_half, const int32_t *__restrict__ pos,
                                   const float *__restrict__ cos_sin, int interleaved) {
    pdl_trigger();
    pdl_wait();
    long total = n * n_heads * rot_half;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        int d = (int)(w % rot_half);
        long th = w / rot_half;
        int h = (int)(th % n_heads);
        long i = th / n_heads;
        const float *cs = cos_sin + ((size_t)pos[i] * (size_t)rot_half + (size_t)d) * 2;
        float c = cs[0], s = cs[1];
        float *v = x + i * ldx + h * head_stride;
        float *a = interleaved ? v + 2 * d : v + d;
        float *b = interleaved ? v + 2 * d + 1 : v + d + rot_half;
        float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x1 * c + x0 * s;
    }
}

extern "C" void cuda_op_rope(void *ctx, float *x, long ldx, long n, int n_heads, long head_stride,
                             int rot_dim, const int32_t *pos, const float *cos_sin,
                             int interleaved) {
    long total = n * n_heads * (rot_dim / 2);
    if (total <= 0) return;
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    pdl_launch(c, rope_kernel, dim3(grid_for(total, 256)), dim3(256), 0, x, ldx, n,
                  n_heads, head_stride, rot_dim / 2, pos, cos_sin, interleaved);
}

/* cache[slots[i] * stride + 0..width) = src[i * ld + 0..width) (T: the
 * cache's element type; bf16 rounds to nearest even, fp8 stores x / scale) */
template <typename T>
static __global__ void kv_store_kernel(T *__restrict__ cache, long stride,
                                       const float *src, long ld, long width,
                                       const int32_t *__restrict__ slots, long n, float scale) {
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        T *dst = cache + (size_t)slots[i] * (size_t)stride;
        const float *s = src + i * ld;
        for (long k = threadIdx.x; k < width; k += blockDim.x) kv_put_s(dst + k, s[k], scale);
    }
}

extern "C" void cuda_op_kv_store(void *ctx, void *cache, long stride, const float *src, long ld,
                                 long width, const int32_t *slots, long n, float scale) {
    if (n <= 0 || width <= 0) return;
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    dim3 grid(grid_for(n, 1)), block(128);
    if (c->kv_fp8)
        pdl_launch(c, kv_store_kernel<kv_fp8_t>, grid, block, 0, (kv_fp8_t *)cache, stride, src,
                   ld, width, slots, n, scale);
    else if (c->kv_bf16)
        pdl_launch(c, kv_store_kernel<__nv_bfloat16>, grid, block, 0,
                      (__nv_bfloat16 *)cache, stride, src, ld, width, slots, n, scale);
    else
        pdl_launch(c, kv_store_kernel<float>, grid, block, 0, (float *)cache,
                      stride, src, ld, width, slots, n, scale);
}

/* Fused attention input preparation (backend.h qk_rope_store): one warp per
 * (row, head) of the n_heads query, n_kv_heads key and n_kv_heads value
 * heads. Query and key heads are normalised (optional) into the warp's
 * shared buffer, rotated from there and written back in place; key heads
 * are also written to the cache slot, value heads only copied there. Same
 * arithmetic as rmsnorm_warp_kernel followed by rope_kernel and
 * kv_store_kernel. */
enum { QKR_WARPS = 4, QKR_MAX_HEAD = 512, QKR_PER_LANE = QKR_MAX_HEAD / 32 };

template <typename T>
static __global__ void __launch_bounds__(QKR_WARPS * 32)
    qk_rope_store_kernel(float *q, float *k, const float *v, long ld, long n,
                         int n_heads, int n_kv_heads, int hd, const float *__restrict__ q_norm,
                         const float *__restrict__ k_norm, float eps, int rot_half,
                         const int32_t *__restrict__ pos, const float *__restrict__ cos_sin,
                         int interleaved, T *__restrict__ k_cache, T *__restrict__ v_cache,
                         long kv_stride, const int32_t *__restrict__ slots, float k_scale,
                         float v_scale) {
    __shared__ float buf[QKR_WARPS][QKR_MAX_HEAD];
    pdl_trigger();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int per_row = n_heads + 2 * n_kv_heads;
    long item = (long)blockIdx.x * QKR_WARPS + warp;
    if (item >= n * per_row) {
        pdl_wait(); /* cuda_pdl.cuh rule 1: no CTA finishes before its predecessor */
        return;
    }
    long i = item / per_row;
    int j = (int)(item % per_row);
    /* Before the wait: the row's slot, position and the rope factors of
     * this lane's elements e = lane + 32·r (batch metadata and the table:
     * no kernel writes them, cuda_pdl.cuh rule 2). */
    const size_t slot = (size_t)slots[i];
    float rc[QKR_PER_LANE], rs[QKR_PER_LANE];
    const bool vhead = j >= n_heads + n_kv_heads;
    if (!vhead) {
        const float *cs = cos_sin + (size_t)pos[i] * (size_t)rot_half * 2;
#pragma unroll
        for (int r = 0; r < QKR_PER_LANE; r++) {
            int e = lane + 32 * r;
            rc[r] = rs[r] = 0.0f;
            if (e < 2 * rot_half) {
                int d = interleaved ? e >> 1 : e < rot_half ? e : e - rot_half;
                rc[r] = cs[2 * d], rs[r] = cs[2 * d + 1];
            }
        }
    }
    pdl_wait();
    if (vhead) { /* value head: copy to the cache */
        int h = j - n_heads - n_kv_heads;
        const float *src = v + i * ld + (long)h * hd;
        T *dst = v_cache + slot * (size_t)kv_stride + (size_t)h * hd;
        for (int e = lane; e < hd; e += 32) kv_put_s(dst + e, src[e], v_scale);
        return;
    }
    float *x;
    T *dst = NULL;
    const float *nw;
    if (j < n_heads) {
        x = q + i * ld + (long)j * hd;
        nw = q_norm;
    } else {
        int h = j - n_heads;
        x = k + i * ld + (long)h * hd;
        nw = k_norm;
        dst = k_cache + slot * (size_t)kv_stride + (size_t)h * hd;
    }
    float *s = buf[warp];
    if (nw) {
        float ss = 0.0f;
        for (int e = lane; e < hd; e += 32) ss += x[e] * x[e];
        ss = warp_sum(ss);
        float inv = rsqrtf(ss / (float)hd + eps);
        for (int e = lane; e < hd; e += 32) s[e] = nw[e] * (x[e] * inv);
    } else {
        for (int e = lane; e < hd; e += 32) s[e] = x[e];
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < QKR_PER_LANE; r++) {
        int e = lane + 32 * r;
        if (e >= hd) break;
        float val = s[e];
        if (e < 2 * rot_half) {
            int partner;
            bool first;
            if (interleaved) {
                first = !(e & 1);
                partner = e ^ 1;
            } else {
                first = e < rot_half;
                partner = first ? e + rot_half : e - rot_half;
            }
            float c = rc[r], sn = rs[r], o = s[partner];
            val = first ? val * c - o * sn : val * c + o * sn;
        }
        x[e] = val;
        if (dst) kv_put_s(dst + e, val, k_scale);
    }
}

extern "C" void cuda_op_qk_rope_store(void *ctx, float *q, float *k, const float *v, long ld,
                                      long n, const struct backend_rope_store *r) {
    int n_heads = r->n_heads, n_kv_heads = r->n_kv_heads, head_dim = r->head_dim;
    const float *q_norm = r->q_norm, *k_norm = r->k_norm, *cos_sin = r->cos_sin;
    float eps = r->eps;
    int rot_dim = r->rot_dim, interleaved = r->interleaved;
    const int32_t *pos = r->pos, *slots = r->slots;
    void *k_cache = r->k_cache, *v_cache = r->v_cache;
    long kv_stride = r->kv_stride;
    long items = n * (long)(n_heads + 2 * n_kv_heads);
    if (items <= 0) return;
    CUDA_ASSERT_MSG(head_dim <= QKR_MAX_HEAD && rot_dim <= head_dim,
                    "qk_rope_store: head_dim above 512");
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    dim3 grid(grid_for(items, QKR_WARPS)), block(QKR_WARPS * 32);
    if (c->kv_fp8)
        pdl_launch(c, qk_rope_store_kernel<kv_fp8_t>, grid, block, 0, q, k, v, ld, n, n_heads,
                   n_kv_heads, head_dim, q_norm, k_norm, eps, rot_dim / 2, pos, cos_sin,
                   interleaved, (kv_fp8_t *)k_cache, (kv_fp8_t *)v_cache, kv_stride, slots,
                   r->k_scale, r->v_scale);
    else if (c->kv_bf16)
        pdl_launch(c, qk_rope_store_kernel<__nv_bfloat16>, grid, block, 0, q, k, v,
                      ld, n, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, rot_dim / 2, pos,
                      cos_sin, interleaved, (__nv_bfloat16 *)k_cache, (__nv_bfloat16 *)v_cache,
                      kv_stride, slots, r->k_scale, r->v_scale);
    else
        pdl_launch(c, qk_rope_store_kernel<float>, grid, block, 0, q, k, v, ld, n,
                      n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, rot_dim / 2, pos,
                      cos_sin, interleaved, (float *)k_cache, (float *)v_cache, kv_stride, slots,
                      r->k_scale, r->v_scale);
}
