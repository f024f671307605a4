/* cuda_rope.cu — rotary position embedding and KV-cache stores.
 *
 * Rope: one thread per rotated pair (token, head, i). cos_sin is the
 * model's table [max_pos][rot_dim / 2][2]; interleaved layouts pair
 * (2i, 2i+1) (DeepSeek, GPT-J), half layouts pair (i, i + rot_dim/2)
 * (Llama, Qwen). Only the first rot_dim dims of each head turn.
 * KV store: one block per token row, copying its K (or V, or MLA latent)
 * row into the cache slot the scheduler chose, in the cache's element type
 * (bf16 by default: rounded to nearest even; fp32 with KILN_CUDA_KV=f32). */
#include "backend/cuda/cuda_common.cuh"

/* x[n][ldx], heads at h * head_stride; pos[n] */
static __global__ void rope_kernel(float *x, long ldx, long n, int n_heads, long head_stride,
                                   int half, const int32_t *__restrict__ pos,
                                   const float *__restrict__ cos_sin, int interleaved) {
    long total = n * n_heads * half;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        int d = (int)(w % half);
        long th = w / half;
        int h = (int)(th % n_heads);
        long i = th / n_heads;
        const float *cs = cos_sin + ((size_t)pos[i] * (size_t)half + (size_t)d) * 2;
        float c = cs[0], s = cs[1];
        float *v = x + i * ldx + h * head_stride;
        float *a = interleaved ? v + 2 * d : v + d;
        float *b = interleaved ? v + 2 * d + 1 : v + d + half;
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
    rope_kernel<<<grid_for(total, 256), 256, 0, ctx_stream(ctx)>>>(
        x, ldx, n, n_heads, head_stride, rot_dim / 2, pos, cos_sin, interleaved);
    CUDA_CHECK_LAUNCH();
}

/* cache[slots[i] * stride + 0..width) = src[i * ld + 0..width) (T: the
 * cache's element type; bf16 rounds to nearest even) */
template <typename T>
static __global__ void kv_store_kernel(T *__restrict__ cache, long stride,
                                       const float *__restrict__ src, long ld, long width,
                                       const int32_t *__restrict__ slots, long n) {
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        T *dst = cache + (size_t)slots[i] * (size_t)stride;
        const float *s = src + i * ld;
        for (long k = threadIdx.x; k < width; k += blockDim.x) kv_put(dst + k, s[k]);
    }
}

extern "C" void cuda_op_kv_store(void *ctx, void *cache, long stride, const float *src, long ld,
                                 long width, const int32_t *slots, long n) {
    if (n <= 0 || width <= 0) return;
    if (((struct cuda_ctx *)ctx)->kv_bf16)
        kv_store_kernel<<<grid_for(n, 1), 128, 0, ctx_stream(ctx)>>>(
            (__nv_bfloat16 *)cache, stride, src, ld, width, slots, n);
    else
        kv_store_kernel<<<grid_for(n, 1), 128, 0, ctx_stream(ctx)>>>((float *)cache, stride, src,
                                                                     ld, width, slots, n);
    CUDA_CHECK_LAUNCH();
}

/* Fused attention input preparation (backend.h qk_rope_store): one warp per
 * (row, head) of the n_heads query, n_kv_heads key and n_kv_heads value
 * heads. Query and key heads are normalised (optional) into the warp's
 * shared buffer, rotated from there and written back in place; key heads
 * are also written to the cache slot, value heads only copied there. Same
 * arithmetic as rmsnorm_warp_kernel followed by rope_kernel and
 * kv_store_kernel. */
enum { QKR_WARPS = 4, QKR_MAX_HEAD = 512 };

template <typename T>
static __global__ void __launch_bounds__(QKR_WARPS * 32)
    qk_rope_store_kernel(float *q, float *k, const float *__restrict__ v, long ld, long n,
                         int n_heads, int n_kv_heads, int hd, const float *__restrict__ q_norm,
                         const float *__restrict__ k_norm, float eps, int half,
                         const int32_t *__restrict__ pos, const float *__restrict__ cos_sin,
                         int interleaved, T *__restrict__ k_cache, T *__restrict__ v_cache,
                         long kv_stride, const int32_t *__restrict__ slots) {
    __shared__ float buf[QKR_WARPS][QKR_MAX_HEAD];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int per_row = n_heads + 2 * n_kv_heads;
    long item = (long)blockIdx.x * QKR_WARPS + warp;
    if (item >= n * per_row) return;
    long i = item / per_row;
    int j = (int)(item % per_row);
    if (j >= n_heads + n_kv_heads) { /* value head: copy to the cache */
        int h = j - n_heads - n_kv_heads;
        const float *src = v + i * ld + (long)h * hd;
        T *dst = v_cache + (size_t)slots[i] * (size_t)kv_stride + (size_t)h * hd;
        for (int e = lane; e < hd; e += 32) kv_put(dst + e, src[e]);
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
        dst = k_cache + (size_t)slots[i] * (size_t)kv_stride + (size_t)h * hd;
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
    const float *cs = cos_sin + (size_t)pos[i] * (size_t)half * 2;
    for (int e = lane; e < hd; e += 32) {
        float val = s[e];
        if (e < 2 * half) {
            int d, partner;
            bool first;
            if (interleaved) {
                d = e >> 1;
                first = !(e & 1);
                partner = e ^ 1;
            } else {
                first = e < half;
                d = first ? e : e - half;
                partner = first ? e + half : e - half;
            }
            float c = cs[2 * d], sn = cs[2 * d + 1], o = s[partner];
            val = first ? val * c - o * sn : val * c + o * sn;
        }
        x[e] = val;
        if (dst) kv_put(dst + e, val);
    }
}

extern "C" void cuda_op_qk_rope_store(void *ctx, float *q, float *k, const float *v, long ld,
                                      long n, int n_heads, int n_kv_heads, int head_dim,
                                      const float *q_norm, const float *k_norm, float eps,
                                      int rot_dim, const int32_t *pos, const float *cos_sin,
                                      int interleaved, void *k_cache, void *v_cache,
                                      long kv_stride, const int32_t *slots) {
    long items = n * (long)(n_heads + 2 * n_kv_heads);
    if (items <= 0) return;
    CUDA_ASSERT_MSG(head_dim <= QKR_MAX_HEAD && rot_dim <= head_dim,
                    "qk_rope_store: head_dim above 512");
    if (((struct cuda_ctx *)ctx)->kv_bf16)
        qk_rope_store_kernel<<<grid_for(items, QKR_WARPS), QKR_WARPS * 32, 0, ctx_stream(ctx)>>>(
            q, k, v, ld, n, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, rot_dim / 2, pos,
            cos_sin, interleaved, (__nv_bfloat16 *)k_cache, (__nv_bfloat16 *)v_cache, kv_stride,
            slots);
    else
        qk_rope_store_kernel<<<grid_for(items, QKR_WARPS), QKR_WARPS * 32, 0, ctx_stream(ctx)>>>(
            q, k, v, ld, n, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, rot_dim / 2, pos,
            cos_sin, interleaved, (float *)k_cache, (float *)v_cache, kv_stride, slots);
    CUDA_CHECK_LAUNCH();
}
