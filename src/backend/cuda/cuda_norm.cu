/* cuda_norm.cu — RMSNorm and the fused residual add + RMSNorm.
 *
 * One block per row for wide rows (the hidden size), one warp per row for
 * narrow ones (per-head q/k norms over head_dim, where rows are many and
 * short). Each row's sum of squares is reduced in a fixed order, so a row's
 * result does not depend on the rest of the batch. In-place use (y == x,
 * or y == h) is safe: every element is read before it is written, by the
 * same thread.
 *
 * The residual add + norm can also write a 16-bit copy of its output for
 * the cuBLAS product that reads it next (cuda_add_rmsnorm16, used by the
 * fused norm_matmul / norm_swiglu_mlp): the same value the conversion pass
 * would round, without that pass.
 *
 * All kernels use programmatic dependent launch (cuda_pdl.cuh): they wait
 * before touching memory; only the norm weights are read-only. */
#include <stdint.h>

#include "backend/cuda/cuda_norm_row.cuh"
#include "backend/cuda/cuda_pdl.cuh"

enum { NORM_BLOCK = 256, NORM_WARP_ROWS = 8, NORM_WARP_MAX_DIM = 512 };

/* y[n][dim] (stride ldy) = x / rms(x) * w, x stride ldx; one block a row */
static __global__ void rmsnorm_block_kernel(float *y, long ldy, const float *x, long ldx,
                                            const float *__restrict__ w, long n, long dim,
                                            float eps) {
    __shared__ float red[32];
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float *xr = x + i * ldx;
        float ss = 0.0f;
        for (long k = threadIdx.x; k < dim; k += blockDim.x) ss += xr[k] * xr[k];
        ss = block_sum(ss, red);
        float inv = rsqrtf(ss / (float)dim + eps);
        float *yr = y + i * ldy;
        for (long k = threadIdx.x; k < dim; k += blockDim.x) yr[k] = w[k] * (xr[k] * inv);
        __syncthreads(); /* red is reused by the next row */
    }
}

/* Same, one warp a row. */
static __global__ void rmsnorm_warp_kernel(float *y, long ldy, const float *x, long ldx,
                                           const float *__restrict__ w, long n, long dim,
                                           float eps) {
    pdl_trigger();
    pdl_wait();
    int lane = threadIdx.x & 31;
    long stride = (long)gridDim.x * NORM_WARP_ROWS;
    for (long i = (long)blockIdx.x * NORM_WARP_ROWS + (threadIdx.x >> 5); i < n; i += stride) {
        const float *xr = x + i * ldx;
        float ss = 0.0f;
        for (long k = lane; k < dim; k += 32) ss += xr[k] * xr[k];
        ss = warp_sum(ss);
        float inv = rsqrtf(ss / (float)dim + eps);
        float *yr = y + i * ldy;
        for (long k = lane; k < dim; k += 32) yr[k] = w[k] * (xr[k] * inv);
    }
}

static void launch_rmsnorm(const struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                           const float *w, long n, long dim, float eps) {
    if (dim <= NORM_WARP_MAX_DIM)
        pdl_launch(c, rmsnorm_warp_kernel, dim3(grid_for(n, NORM_WARP_ROWS)),
                   dim3(32 * NORM_WARP_ROWS), 0, y, ldy, x, ldx, w, n, dim, eps);
    else
        pdl_launch(c, rmsnorm_block_kernel, dim3(grid_for(n, 1)), dim3(NORM_BLOCK), 0, y, ldy, x,
                   ldx, w, n, dim, eps);
}

extern "C" void cuda_op_rmsnorm(void *ctx, float *y, long ldy, const float *x, long ldx,
                                const float *w, long n, long dim, float eps) {
    if (n <= 0) return;
    launch_rmsnorm((const struct cuda_ctx *)ctx, y, ldy, x, ldx, w, n, dim, eps);
}

/* h[n][dim] += delta (DELTA); y[n][dim] = rmsnorm(h) * w; y may alias h.
 * O (bf16 / f16): also y16[n][dim] = y rounded to O, and y may be NULL
 * (not written: the 16-bit handoff's product reads y16 only). Without DELTA this is
 * rmsnorm_block_kernel's arithmetic exactly (the same per-thread partial
 * sums and block reduction). */
template <typename O, bool DELTA>
static __global__ void add_rmsnorm_kernel(float *h, const float *delta, float *y,
                                          const float *__restrict__ w, long n, long dim, float eps,
                                          O *y16) {
    __shared__ float red[32];
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        float *hr = h + i * dim;
        float ss = 0.0f;
        if (DELTA) {
            const float *dr = delta + i * dim;
            for (long k = threadIdx.x; k < dim; k += blockDim.x) {
                float v = hr[k] + dr[k];
                hr[k] = v;
                ss += v * v;
            }
        } else {
            for (long k = threadIdx.x; k < dim; k += blockDim.x) ss += hr[k] * hr[k];
        }
        norm_row_scalar(ss, hr, w, y, y16, i, dim, eps, red);
    }
}

/* The same with float4 accesses and up to 1024 threads (dim % 4 == 0,
 * rows 16-byte aligned, dim ≤ 16384): each thread holds its V float4 of
 * the row in registers, so every load of a row is issued before the first
 * store (the scalar kernel above walks a 4096-wide row in 16 dependent
 * steps: its loads cannot pass the in-place stores of h). At decode this
 * kernel is one CTA on the critical path between two products. The sum of
 * squares runs in a fixed order per row (each thread's V vectors in
 * order, x y z w, then the block reduction), whatever n is. The norm
 * weights are read before pdl_wait (they are never written). */
template <typename O, bool DELTA, int V>
static __global__ void __launch_bounds__(1024)
    add_rmsnorm_vec_kernel(float *h, const float *delta, float *y, const float *__restrict__ w,
                           long n, long dim, float eps, O *y16) {
    __shared__ float red[32];
    pdl_trigger();
    int t = threadIdx.x, nt = blockDim.x;
    long d4 = dim / 4;
    float4 wv[V];
    norm_weights_vec(wv, w, d4);
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        float4 *hr = (float4 *)(h + i * dim);
        const float4 *dr = (const float4 *)(DELTA ? delta + i * dim : h);
        float4 v[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            long k = t + (long)j * nt;
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (k < d4) {
                v[j] = hr[k];
                if (DELTA) {
                    float4 d = dr[k];
                    v[j].x += d.x, v[j].y += d.y, v[j].z += d.z, v[j].w += d.w;
                }
            }
        }
        norm_row_vec(v, wv, DELTA ? hr : (float4 *)NULL, y, y16, i, dim, eps, red, n);
    }
}

/* Whether add_rmsnorm takes the float4 kernel (the same choice for the
 * plain op, the 16-bit producer and the fused all-reduce, so that all
 * give the same bits). */
extern "C" int cuda_norm_vec_ok(const float *h, const float *delta, const float *y, const float *w, long dim) {
    uintptr_t a = (uintptr_t)h | (uintptr_t)delta | (uintptr_t)y | (uintptr_t)w;
    return dim % 4 == 0 && dim >= 128 && dim <= 4 * 4 * 1024 && a % 16 == 0;
}


template <typename O, bool DELTA>
static void launch_norm_vec(const struct cuda_ctx *c, float *h, const float *delta, float *y,
                            const float *w, long n, long dim, float eps, O *y16) {
    long d4 = dim / 4;
    int v = (int)((d4 + 1023) / 1024);
    int threads = (int)(((d4 + v - 1) / v + 31) / 32 * 32);
    dim3 grid(grid_for(n, 1)), block(threads);
    if (v == 1) pdl_launch(c, add_rmsnorm_vec_kernel<O, DELTA, 1>, grid, block, 0, h, delta, y, w, n, dim, eps, y16);
    else if (v == 2) pdl_launch(c, add_rmsnorm_vec_kernel<O, DELTA, 2>, grid, block, 0, h, delta, y, w, n, dim, eps, y16);
    else if (v == 3) pdl_launch(c, add_rmsnorm_vec_kernel<O, DELTA, 3>, grid, block, 0, h, delta, y, w, n, dim, eps, y16);
    else pdl_launch(c, add_rmsnorm_vec_kernel<O, DELTA, 4>, grid, block, 0, h, delta, y, w, n, dim, eps, y16);
}

extern "C" void cuda_op_add_rmsnorm(void *ctx, float *h, const float *delta, float *y,
                                    const float *w, long n, long dim, float eps) {
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    if (n <= 0) return;
    if (cuda_norm_vec_ok(h, delta, y, w, dim)) {
        if (delta) launch_norm_vec<float, true>(c, h, delta, y, w, n, dim, eps, (float *)NULL);
        else launch_norm_vec<float, false>(c, h, delta, y, w, n, dim, eps, (float *)NULL);
        return;
    }
    if (!delta) {
        launch_rmsnorm(c, y, dim, h, dim, w, n, dim, eps);
        return;
    }
    pdl_launch(c, add_rmsnorm_kernel<float, true>, dim3(grid_for(n, 1)), dim3(NORM_BLOCK), 0, h,
               delta, y, w, n, dim, eps, (float *)NULL);
}

/* The 16-bit handoff: only x16 is written (not nm->x), by the kernel the
 * plain op would choose for these operands (the same bits). */
template <typename O>
static void launch_norm16(const struct cuda_ctx *c, const struct backend_norm *nm, long n, O *x16) {
    if (cuda_norm_vec_ok(nm->h, nm->delta, nm->x, nm->w, nm->dim)) {
        if (nm->delta) launch_norm_vec<O, true>(c, nm->h, nm->delta, NULL, nm->w, n, nm->dim, nm->eps, x16);
        else launch_norm_vec<O, false>(c, nm->h, nm->delta, NULL, nm->w, n, nm->dim, nm->eps, x16);
        return;
    }
    dim3 grid(grid_for(n, 1)), block(NORM_BLOCK);
    if (nm->delta)
        pdl_launch(c, add_rmsnorm_kernel<O, true>, grid, block, 0, nm->h, nm->delta, (float *)NULL,
                   nm->w, n, nm->dim, nm->eps, x16);
    else
        pdl_launch(c, add_rmsnorm_kernel<O, false>, grid, block, 0, nm->h, nm->delta, (float *)NULL,
                   nm->w, n, nm->dim, nm->eps, x16);
}

/* The e4m3 handoff (FP8 products on the e4m3 wgmma kernel): the float4
 * kernel's output quantized per row and 128 columns into q8 (codes, then
 * the scales at q8_scales_off), as cuda_fp8_quant_act would quantize the
 * plain op's output (the same bytes); nm->x is not written. */
extern "C" int cuda_add_rmsnorm8_ok(const struct backend_norm *nm) {
    return !nm->reduce && nm->dim % 128 == 0 && cuda_norm_vec_ok(nm->h, nm->delta, nm->x, nm->w, nm->dim);
}

extern "C" void cuda_add_rmsnorm8(struct cuda_ctx *c, const struct backend_norm *nm, long n, void *q8) {
    if (n <= 0) return;
    CUDA_ASSERT(cuda_add_rmsnorm8_ok(nm));
    uint8_t *q = (uint8_t *)q8;
    if (nm->delta) launch_norm_vec<uint8_t, true>(c, nm->h, nm->delta, NULL, nm->w, n, nm->dim, nm->eps, q);
    else launch_norm_vec<uint8_t, false>(c, nm->h, nm->delta, NULL, nm->w, n, nm->dim, nm->eps, q);
}

extern "C" int cuda_add_rmsnorm16_ok(const struct backend_norm *nm) {
    return nm->delta || nm->reduce || nm->dim > NORM_WARP_MAX_DIM ||
           cuda_norm_vec_ok(nm->h, nm->delta, nm->x, nm->w, nm->dim);
}

extern "C" void cuda_add_rmsnorm16(struct cuda_ctx *c, const struct backend_norm *nm, long n,
                                   void *x16, enum dtype dt) {
    if (n <= 0) return;
    /* without a delta, narrow rows take rmsnorm's warp kernel: another sum order */
    CUDA_ASSERT(cuda_add_rmsnorm16_ok(nm));
    if (nm->reduce) { /* the ranks' parts summed in the same kernel (cuda_allreduce.cu) */
        cuda_ar_norm(cuda_comm_ar(nm->reduce), nm, n, x16, dt);
        return;
    }
    if (dt == DTYPE_BF16) launch_norm16(c, nm, n, (__nv_bfloat16 *)x16);
    else launch_norm16(c, nm, n, (__half *)x16);
}
