/* cuda_rope.cu — rotary position embedding and KV-cache stores.
 *
 * Rope: one thread per rotated pair (token, head, i). cos_sin is the
 * model's table [max_pos][rot_dim / 2][2]; interleaved layouts pair
 * (2i, 2i+1) (DeepSeek, GPT-J), half layouts pair (i, i + rot_dim/2)
 * (Llama, Qwen). Only the first rot_dim dims of each head turn.
 * KV store: one block per token row, copying its K (or V, or MLA latent)
 * row into the cache slot the scheduler chose. */
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

/* cache[slots[i] * stride + 0..width) = src[i * ld + 0..width) */
static __global__ void kv_store_kernel(float *__restrict__ cache, long stride,
                                       const float *__restrict__ src, long ld, long width,
                                       const int32_t *__restrict__ slots, long n) {
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        float *dst = cache + (size_t)slots[i] * (size_t)stride;
        const float *s = src + i * ld;
        for (long k = threadIdx.x; k < width; k += blockDim.x) dst[k] = s[k];
    }
}

extern "C" void cuda_op_kv_store(void *ctx, float *cache, long stride, const float *src, long ld,
                                 long width, const int32_t *slots, long n) {
    if (n <= 0 || width <= 0) return;
    kv_store_kernel<<<grid_for(n, 1), 128, 0, ctx_stream(ctx)>>>(cache, stride, src, ld, width,
                                                                 slots, n);
    CUDA_CHECK_LAUNCH();
}
