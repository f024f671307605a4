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

static __device__ __forceinline__ void put16(float *, long, float) {}
static __device__ __forceinline__ void put16(__nv_bfloat16 *p, long i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
static __device__ __forceinline__ void put16(__half *p, long i, float v) { p[i] = __float2half_rn(v); }

/* h[n][dim] += delta (DELTA); y[n][dim] = rmsnorm(h) * w; y may alias h.
 * O (bf16 / f16): also y16[n][dim] = y rounded to O. Without DELTA this is
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
        ss = block_sum(ss, red);
        float inv = rsqrtf(ss / (float)dim + eps);
        float *yr = y + i * dim;
        for (long k = threadIdx.x; k < dim; k += blockDim.x) {
            float v = w[k] * (hr[k] * inv);
            yr[k] = v;
            put16(y16, i * dim + k, v);
        }
        __syncthreads();
    }
}

extern "C" void cuda_op_add_rmsnorm(void *ctx, float *h, const float *delta, float *y,
                                    const float *w, long n, long dim, float eps) {
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    if (n <= 0) return;
    if (!delta) {
        launch_rmsnorm(c, y, dim, h, dim, w, n, dim, eps);
        return;
    }
    pdl_launch(c, add_rmsnorm_kernel<float, true>, dim3(grid_for(n, 1)), dim3(NORM_BLOCK), 0, h,
               delta, y, w, n, dim, eps, (float *)NULL);
}

template <typename O>
static void launch_norm16(const struct cuda_ctx *c, const struct backend_norm *nm, long n, O *x16) {
    dim3 grid(grid_for(n, 1)), block(NORM_BLOCK);
    if (nm->delta)
        pdl_launch(c, add_rmsnorm_kernel<O, true>, grid, block, 0, nm->h, nm->delta, nm->x, nm->w, n,
                   nm->dim, nm->eps, x16);
    else
        pdl_launch(c, add_rmsnorm_kernel<O, false>, grid, block, 0, nm->h, nm->delta, nm->x, nm->w,
                   n, nm->dim, nm->eps, x16);
}

extern "C" void cuda_add_rmsnorm16(struct cuda_ctx *c, const struct backend_norm *nm, long n,
                                   void *x16, enum dtype dt) {
    if (n <= 0) return;
    /* without a delta, narrow rows take rmsnorm's warp kernel: another sum order */
    CUDA_ASSERT(nm->delta || nm->dim > NORM_WARP_MAX_DIM);
    if (dt == DTYPE_BF16) launch_norm16(c, nm, n, (__nv_bfloat16 *)x16);
    else launch_norm16(c, nm, n, (__half *)x16);
}
