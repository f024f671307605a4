/* cuda_mla.cu — the MHA form of multi-head latent attention
 * (model/deepseek_mha.c): kv_gather reads a sequence's latent rows back
 * from the paged cache to fp32 (the kv_b_proj product's input), and
 * mla_kv_expand writes per-head K = [k_nope_h | k_rope] (one k_rope per
 * position, broadcast over the heads) and V = v_h from the product's
 * output into the workspace the attention then reads as a cache. Both
 * keep the cache's element type (bf16 rounds to nearest even, as
 * kv_store; fp32 copies), so a value is the same whichever path wrote it;
 * on the FP8 cache kv_gather widens fp8(q) · scale and mla_kv_expand
 * writes fp32 (attn_params.f32_cache).
 * Element-wise kernels, one CTA per position, launched with programmatic
 * dependent launch (cuda_pdl.cuh). */
#include "backend/cuda/cuda_pdl.cuh"

/* dst[i][0..width) = cache[slot(p0 + i)][0..width), slot from the page list */
template <typename T>
static __global__ void kv_gather_kernel(float *dst, long ldd, const T *__restrict__ cache,
                                        long stride, long width, const int32_t *__restrict__ pages,
                                        int page_size, long p0, long n, float scale) {
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        long p = p0 + i;
        const T *src = cache + ((size_t)pages[p / page_size] * page_size + p % page_size) * (size_t)stride;
        for (long k = threadIdx.x; k < width; k += blockDim.x) dst[i * ldd + k] = kv_get(src + k) * scale;
    }
}

extern "C" void cuda_op_kv_gather(void *ctx, float *dst, long ldd, const void *cache, long stride,
                                  long width, const int32_t *pages, int page_size, long p0, long n,
                                  float scale) {
    if (n <= 0 || width <= 0) return;
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    dim3 grid(grid_for(n, 1)), block(128);
    if (c->kv_fp8)
        pdl_launch(c, kv_gather_kernel<kv_fp8_t>, grid, block, 0, dst, ldd,
                   (const kv_fp8_t *)cache, stride, width, pages, page_size, p0, n, scale);
    else if (c->kv_bf16)
        pdl_launch(c, kv_gather_kernel<__nv_bfloat16>, grid, block, 0, dst, ldd,
                   (const __nv_bfloat16 *)cache, stride, width, pages, page_size, p0, n, 1.0f);
    else
        pdl_launch(c, kv_gather_kernel<float>, grid, block, 0, dst, ldd, (const float *)cache,
                   stride, width, pages, page_size, p0, n, 1.0f);
}

/* Position i: k[i][h][0..nope) | k[i][h][nope..qh) and v[i][h][0..vd) for
 * every head h; the threads of the CTA walk the row's k then v elements. */
template <typename T>
static __global__ void mla_kv_expand_kernel(T *__restrict__ k, T *__restrict__ v, const float *kv,
                                            long ldkv, const float *k_rope, long ldr, long n,
                                            int n_heads, int nope, int rope, int vd) {
    pdl_trigger();
    pdl_wait();
    int qh = nope + rope;
    long kw = (long)n_heads * qh, vw = (long)n_heads * vd;
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float *src = kv + i * ldkv, *kr = k_rope + i * ldr;
        T *kd = k + i * kw, *vdst = v + i * vw;
        for (long e = threadIdx.x; e < kw + vw; e += blockDim.x) {
            if (e < kw) {
                int h = (int)(e / qh), d = (int)(e % qh);
                kv_put(kd + e, d < nope ? src[(long)h * (nope + vd) + d] : kr[d - nope]);
            } else {
                long f = e - kw;
                int h = (int)(f / vd), d = (int)(f % vd);
                kv_put(vdst + f, src[(long)h * (nope + vd) + nope + d]);
            }
        }
    }
}

extern "C" void cuda_op_mla_kv_expand(void *ctx, void *k, void *v, const float *kv, long ldkv,
                                      const float *k_rope, long ldr, long n, int n_heads, int nope,
                                      int rope, int vd) {
    if (n <= 0) return;
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    dim3 grid(grid_for(n, 1)), block(256);
    if (c->kv_bf16) /* the FP8 cache: fp32 K / V (attn_params.f32_cache) */
        pdl_launch(c, mla_kv_expand_kernel<__nv_bfloat16>, grid, block, 0, (__nv_bfloat16 *)k,
                   (__nv_bfloat16 *)v, kv, ldkv, k_rope, ldr, n, n_heads, nope, rope, vd);
    else
        pdl_launch(c, mla_kv_expand_kernel<float>, grid, block, 0, (float *)k, (float *)v, kv, ldkv,
                   k_rope, ldr, n, n_heads, nope, rope, vd);
}
