/* cuda_elementwise.cu — the small element-wise operations: SwiGLU's
 * silu(g) * u (also as the 16-bit producer of the down product's
 * operand), Gemma's GeGLU gelu_tanh(g) * u and embedding scale, residual adds, Qwen2-MoE's sigmoid-gated shared expert add,
 * row gathers and strided row copies. Grid-stride loops over elements,
 * launched with programmatic dependent launch (cuda_pdl.cuh: each waits
 * before touching memory). */
#include "backend/cuda/cuda_pdl.cuh"

static const struct cuda_ctx *cctx(void *ctx) { return (const struct cuda_ctx *)ctx; }

/* y[n][dim] = silu(g) * u, each with its own row stride */
static __global__ void silu_mul_kernel(float *y, long ldy, const float *g, long ldg, const float *u,
                                       long ldu, long n, long dim) {
    pdl_trigger();
    pdl_wait();
    long total = n * dim;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        long i = w / dim, k = w % dim;
        y[i * ldy + k] = silu_mul_f32(g[i * ldg + k], u[i * ldu + k]);
    }
}

extern "C" void cuda_op_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg,
                                 const float *u, long ldu, long n, long dim) {
    if (n * dim <= 0) return;
    pdl_launch(cctx(ctx), silu_mul_kernel, dim3(grid_for(n * dim, 256)), dim3(256), 0, y, ldy, g,
               ldg, u, ldu, n, dim);
}

/* y[n][dim] = gelu_tanh(g) * u (Gemma's GeGLU), the CPU's expression:
 * 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))·u in fp32 */
static __global__ void gelu_tanh_mul_kernel(float *y, long ldy, const float *g, long ldg,
                                            const float *u, long ldu, long n, long dim) {
    pdl_trigger();
    pdl_wait();
    const float c = 0.7978845608028654f; /* √(2/π) */
    long total = n * dim;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        long i = w / dim, k = w % dim;
        float x = g[i * ldg + k];
        y[i * ldy + k] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i * ldu + k];
    }
}

extern "C" void cuda_op_gelu_tanh_mul(void *ctx, float *y, long ldy, const float *g, long ldg,
                                      const float *u, long ldu, long n, long dim) {
    if (n * dim <= 0) return;
    pdl_launch(cctx(ctx), gelu_tanh_mul_kernel, dim3(grid_for(n * dim, 256)), dim3(256), 0, y,
               ldy, g, ldg, u, ldu, n, dim);
}

/* x[count] *= s */
static __global__ void scale_kernel(float *x, long count, float s) {
    pdl_trigger();
    pdl_wait();
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < count;
         w += (long)gridDim.x * blockDim.x)
        x[w] *= s;
}

extern "C" void cuda_op_scale(void *ctx, float *x, long count, float s) {
    if (count <= 0) return;
    pdl_launch(cctx(ctx), scale_kernel, dim3(grid_for(count, 256)), dim3(256), 0, x, count, s);
}

/* x16[n][inter] = T(silu(g) * u), g = gu[i][k], u = gu[i][inter + k] */
template <typename T>
static __global__ void silu16_kernel(T *__restrict__ x16, const float *gu, long ldgu, long n,
                                     long inter) {
    pdl_trigger();
    pdl_wait();
    long total = n * inter;
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (long)gridDim.x * blockDim.x) {
        long i = w / inter, k = w % inter;
        const float *r = gu + i * ldgu;
        x16[w] = T(silu_mul_f32(r[k], r[inter + k]));
    }
}

extern "C" void cuda_silu16(struct cuda_ctx *c, void *x16, enum dtype dt, const float *gu,
                            long ldgu, long n, long inter) {
    if (n * inter <= 0) return;
    dim3 grid(grid_for(n * inter, 256)), block(256);
    if (dt == DTYPE_BF16)
        pdl_launch(c, silu16_kernel<__nv_bfloat16>, grid, block, 0, (__nv_bfloat16 *)x16, gu, ldgu,
                   n, inter);
    else
        pdl_launch(c, silu16_kernel<__half>, grid, block, 0, (__half *)x16, gu, ldgu, n, inter);
}

/* y[count] += x[count] */
static __global__ void add_kernel(float *y, const float *x, long count) {
    pdl_trigger();
    pdl_wait();
    for (long w = (long)blockIdx.x * blockDim.x + threadIdx.x; w < count;
         w += (long)gridDim.x * blockDim.x)
        y[w] += x[w];
}

extern "C" void cuda_op_add(void *ctx, float *y, const float *x, long count) {
    if (count <= 0) return;
    pdl_launch(cctx(ctx), add_kernel, dim3(grid_for(count, 256)), dim3(256), 0, y, x, count);
}

/* y[n][dim] += sigmoid(gate[i * ldgate]) * x[n][dim] */
static __global__ void gated_add_kernel(float *y, const float *x, const float *gate, long ldgate,
                                        long n, long dim) {
    pdl_trigger();
    pdl_wait();
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
    pdl_launch(cctx(ctx), gated_add_kernel, dim3(grid_for(n * dim, 256)), dim3(256), 0, y, x, gate,
               ldgate, n, dim);
}

/* dst[n][width] = src[rows[i]][width] */
static __global__ void gather_rows_kernel(float *dst, const float *src, long width,
                                          const int32_t *rows, long n) {
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float *s = src + (long)rows[i] * width;
        for (long k = threadIdx.x; k < width; k += blockDim.x) dst[i * width + k] = s[k];
    }
}

extern "C" void cuda_op_gather_rows(void *ctx, float *dst, const float *src, long width,
                                    const int32_t *rows, long n) {
    if (n <= 0 || width <= 0) return;
    pdl_launch(cctx(ctx), gather_rows_kernel, dim3(grid_for(n, 1)), dim3(256), 0, dst, src, width,
               rows, n);
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
