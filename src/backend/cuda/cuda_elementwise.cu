/* cuda_elementwise.cu — the small element-wise operations: SwiGLU's
 * silu(g) * u, residual adds, Qwen2-MoE's sigmoid-gated shared expert add,
 * row gathers and strided row copies. Grid-stride loops over elements;
 * these are memory-bound and later fused into their neighbours. */
#include "backend/cuda/cuda_common.cuh"

/* y[n][dim] = silu(g) * u, each with its own row stride */
static __global__ void silu_mul_kernel(float *y, long ldy, const float *g, long ldg, const float *u,
                                       long ldu, long n, long dim) {
    long total = n * dim;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        long i = w / dim, k = w % dim;
        float gv = g[i * ldg + k];
        y[i * ldy + k] = gv / (1.0f + expf(-gv)) * u[i * ldu + k];
    }
}

extern "C" void cuda_op_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg,
                                 const float *u, long ldu, long n, long dim) {
    if (n * dim <= 0) return;
    silu_mul_kernel<<<grid_for(n * dim, 256), 256, 0, ctx_stream(ctx)>>>(y, ldy, g, ldg, u, ldu, n,
                                                                         dim);
    CUDA_CHECK_LAUNCH();
}

/* y[count] += x[count] */
static __global__ void add_kernel(float *y, const float *x, long count) {
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < count;
         w += (long)gridDim.x * blockDim.x)
        y[w] += x[w];
}

extern "C" void cuda_op_add(void *ctx, float *y, const float *x, long count) {
    if (count <= 0) return;
    add_kernel<<<grid_for(count, 256), 256, 0, ctx_stream(ctx)>>>(y, x, count);
    CUDA_CHECK_LAUNCH();
}

/* y[n][dim] += sigmoid(gate[i * ldgate]) * x[n][dim] */
static __global__ void gated_add_kernel(float *y, const float *x, const float *gate, long ldgate,
                                        long n, long dim) {
    long total = n * dim;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        long i = w / dim;
        float s = 1.0f / (1.0f + expf(-gate[i * ldgate]));
        y[w] += s * x[w];
    }
}

extern "C" void cuda_op_gated_add(void *ctx, float *y, const float *x, const float *gate,
                                  long ldgate, long n, long dim) {
    if (n * dim <= 0) return;
    gated_add_kernel<<<grid_for(n * dim, 256), 256, 0, ctx_stream(ctx)>>>(y, x, gate, ldgate, n,
                                                                          dim);
    CUDA_CHECK_LAUNCH();
}

/* dst[n][width] = src[rows[i]][width] */
static __global__ void gather_rows_kernel(float *__restrict__ dst, const float *__restrict__ src,
                                          long width, const int32_t *__restrict__ rows, long n) {
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float *s = src + (long)rows[i] * width;
        for (long k = threadIdx.x; k < width; k += blockDim.x) dst[i * width + k] = s[k];
    }
}

extern "C" void cuda_op_gather_rows(void *ctx, float *dst, const float *src, long width,
                                    const int32_t *rows, long n) {
    if (n <= 0 || width <= 0) return;
    gather_rows_kernel<<<grid_for(n, 1), 256, 0, ctx_stream(ctx)>>>(dst, src, width, rows, n);
    CUDA_CHECK_LAUNCH();
}

/* dst[n][width] (stride ldd) = src[n][width] (stride lds); the regions must
 * not overlap (the model only copies between distinct buffers). */
extern "C" void cuda_op_copy_rows(void *ctx, float *dst, long ldd, const float *src, long lds,
                                  long n, long width) {
    if (n <= 0 || width <= 0) return;
    if (ldd == width && lds == width) { /* contiguous: one plain copy (2-D copies run slower) */
        CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * (size_t)width * 4,
                                   cudaMemcpyDeviceToDevice, ctx_stream(ctx)));
        return;
    }
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * 4, src, (size_t)lds * 4, (size_t)width * 4,
                                 (size_t)n, cudaMemcpyDeviceToDevice, ctx_stream(ctx)));
}
