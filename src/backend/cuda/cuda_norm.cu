/* cuda_norm.cu — RMSNorm and the fused residual add + RMSNorm.
 *
 * One block per row for wide rows (the hidden size), one warp per row for
 * narrow ones (per-head q/k norms over head_dim, where rows are many and
 * short). Each row's sum of squares is reduced in a fixed order, so a row's
 * result does not depend on the rest of the batch. In-place use (y == x,
 * or y == h) is safe: every element is read before it is written, by the
 * same thread. */
#include "backend/cuda/cuda_common.cuh"

enum { NORM_BLOCK = 256, NORM_WARP_ROWS = 8, NORM_WARP_MAX_DIM = 512 };

/* y[n][dim] (stride ldy) = x / rms(x) * w, x stride ldx; one block a row */
static __global__ void rmsnorm_block_kernel(float *y, long ldy, const float *x, long ldx,
                                            const float *__restrict__ w, long n, long dim,
                                            float eps) {
    __shared__ float red[32];
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

static void launch_rmsnorm(cudaStream_t s, float *y, long ldy, const float *x, long ldx,
                           const float *w, long n, long dim, float eps) {
    if (dim <= NORM_WARP_MAX_DIM) {
        rmsnorm_warp_kernel<<<grid_for(n, NORM_WARP_ROWS), 32 * NORM_WARP_ROWS, 0, s>>>(
            y, ldy, x, ldx, w, n, dim, eps);
    } else {
        rmsnorm_block_kernel<<<grid_for(n, 1), NORM_BLOCK, 0, s>>>(y, ldy, x, ldx, w, n, dim, eps);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_op_rmsnorm(void *ctx, float *y, long ldy, const float *x, long ldx,
                                const float *w, long n, long dim, float eps) {
    if (n <= 0) return;
    launch_rmsnorm(ctx_stream(ctx), y, ldy, x, ldx, w, n, dim, eps);
}

/* h[n][dim] += delta; y[n][dim] = rmsnorm(h) * w. y may alias h. */
static __global__ void add_rmsnorm_kernel(float *h, const float *__restrict__ delta, float *y,
                                          const float *__restrict__ w, long n, long dim,
                                          float eps) {
    __shared__ float red[32];
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        float *hr = h + i * dim;
        const float *dr = delta + i * dim;
        float ss = 0.0f;
        for (long k = threadIdx.x; k < dim; k += blockDim.x) {
            float v = hr[k] + dr[k];
            hr[k] = v;
            ss += v * v;
        }
        ss = block_sum(ss, red);
        float inv = rsqrtf(ss / (float)dim + eps);
        float *yr = y + i * dim;
        for (long k = threadIdx.x; k < dim; k += blockDim.x) yr[k] = w[k] * (hr[k] * inv);
        __syncthreads();
    }
}

extern "C" void cuda_op_add_rmsnorm(void *ctx, float *h, const float *delta, float *y,
                                    const float *w, long n, long dim, float eps) {
    if (n <= 0) return;
    cudaStream_t s = ctx_stream(ctx);
    if (!delta) {
        launch_rmsnorm(s, y, dim, h, dim, w, n, dim, eps);
        return;
    }
    add_rmsnorm_kernel<<<grid_for(n, 1), NORM_BLOCK, 0, s>>>(h, delta, y, w, n, dim, eps);
    CUDA_CHECK_LAUNCH();
}
