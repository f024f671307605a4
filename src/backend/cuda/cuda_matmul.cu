/* cuda_matmul.cu — y[n][rows] = x[n][cols] · Wᵀ (+ bias) with W [rows][cols]
 * in its checkpoint dtype.
 *
 * Two paths:
 *  - few rows (decode: n ≤ gemv_max_rows): a GEMV-style kernel, one warp
 *    per group of 1-4 output features, reading each weight row once with
 *    16-byte streaming loads (8 in flight per lane) and the fp32
 *    activations through L1. Decode is bound by weight bandwidth, and this
 *    keeps the activations in fp32.
 *  - otherwise cuBLAS: the fp32 activations are rounded once into a 16-bit
 *    copy of the weights' type (bf16 or f16), then cublasGemmEx multiplies
 *    on tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F). F32
 *    weights take a plain fp32 GEMM (no TF32). The bias is added by a
 *    small epilogue kernel.
 *  - KILN_CUDA_MATMUL=bf16x2 (struct cuda_ctx.split_act): the activations
 *    are split into hi = bf16(x) and lo = bf16(x − hi), and y = W·hi + W·lo
 *    by two products accumulating into y. W is exact in bf16, so only lo's
 *    rounding remains (2^-18 relative): fp32-grade results at twice the
 *    tensor-core work. For checking against fp32 references.
 * Row-major y = x·Wᵀ is column-major Yᵀ = W'ᵀ·Xᵀ where W' is W read as a
 * column-major [cols][rows] matrix: op(A) = T on W (lda = cols), op(B) = N
 * on x (ldb = its row stride), C = y (ldc = ldy). */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

enum { GEMV_WARPS = 4, GEMV_LOADS = 8 /* 16-byte weight loads in flight per lane */ };

/* 8 bf16 / f16 values packed in a uint4, widened to fp32 */
static __device__ __forceinline__ void widen8(const uint4 &p, float *f, const __nv_bfloat16 *) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
static __device__ __forceinline__ void widen8(const uint4 &p, float *f, const __half *) {
    const __half2 *h = (const __half2 *)&p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

/* Weight rows are streamed once: bypass L1 (activations stay cached there)
 * and let L2 fetch whole 256-byte sectors ahead. */
static __device__ __forceinline__ uint4 load_stream(const uint4 *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* 8 consecutive activations of row j at column 8·vi */
template <bool XVEC>
static __device__ __forceinline__ void load_x8(const float *__restrict__ x, long ldx, int j,
                                               long vi, float *xv) {
    const float *xr = x + j * ldx + vi * 8;
    if (XVEC) {
        float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
        xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) xv[e] = __ldg(xr + e);
    }
}

/* y[n][rows] (stride ldy) = x[n][cols] (stride ldx) · w[rows][cols]ᵀ + bias,
 * n ≤ NR, cols % 8 == 0, w 16-byte aligned, XVEC: x rows 16-byte aligned.
 *
 * Each warp owns R consecutive output rows and walks them together: lane l
 * takes the 16-byte pieces l, l + 32, l + 64, ... of each row, so every
 * activation it loads serves R weight rows (the activations are fp32 and
 * read from L1: R rows cut that traffic R-fold), and U = GEMV_LOADS / R
 * steps are loaded before the first is used, keeping GEMV_LOADS
 * independent 16-byte loads in flight per lane. Each (row, activation row)
 * sum runs in the same order whatever NR, R and U are (pieces in ascending
 * order per lane, then a fixed butterfly across lanes), so a row's result
 * does not depend on the batch it came in: padding a batch to a captured
 * graph size changes no logits. */
template <int NR, int R, typename T, bool XVEC>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(float *__restrict__ y, long ldy, const float *__restrict__ x, long ldx,
                const T *__restrict__ w, const float *__restrict__ bias, long rows, long cols,
                int n) {
    constexpr int U = GEMV_LOADS / R;
    int lane = threadIdx.x & 31;
    long r0 = ((long)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return;
    long nvec = cols / 8;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) /* rows past the end re-read the last one; not stored */
        wr[r] = (const uint4 *)(w + (r0 + r < rows ? r0 + r : rows - 1) * cols);
    float acc[R][NR];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[r][j] = 0.0f;

    long v = lane;
    for (; v + 32 * (U - 1) < nvec; v += 32 * U) {
        uint4 wv[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wv[u][r] = load_stream(wr[r] + v + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int j = 0; j < NR; j++) {
                if (j < n) {
                    float xv[8];
                    load_x8<XVEC>(x, ldx, j, v + 32 * u, xv);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float wf[8];
                        widen8(wv[u][r], wf, (const T *)0);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r][j] = fmaf(wf[e], xv[e], acc[r][j]);
                    }
                }
            }
        }
    }
    for (; v < nvec; v += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++) wv[r] = load_stream(wr[r] + v);
#pragma unroll
        for (int j = 0; j < NR; j++) {
            if (j < n) {
                float xv[8];
                load_x8<XVEC>(x, ldx, j, v, xv);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[8];
                    widen8(wv[r], wf, (const T *)0);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][j] = fmaf(wf[e], xv[e], acc[r][j]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float b = (bias && r0 + r < rows) ? bias[r0 + r] : 0.0f;
#pragma unroll
        for (int j = 0; j < NR; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0 && j < n && r0 + r < rows) y[j * ldy + r0 + r] = s + b;
        }
    }
}

template <int NR, int R, typename T>
static void launch_gemv_r(cudaStream_t s, float *y, long ldy, const float *x, long ldx,
                          const void *w, const float *bias, long rows, long cols, int n) {
    bool xvec = ((uintptr_t)x % 16 == 0) && ldx % 4 == 0;
    unsigned grid = grid_for(rows, GEMV_WARPS * R);
    if (xvec)
        gemv_kernel<NR, R, T, true><<<grid, GEMV_WARPS * 32, 0, s>>>(y, ldy, x, ldx, (const T *)w,
                                                                     bias, rows, cols, n);
    else
        gemv_kernel<NR, R, T, false><<<grid, GEMV_WARPS * 32, 0, s>>>(y, ldy, x, ldx, (const T *)w,
                                                                      bias, rows, cols, n);
    CUDA_CHECK_LAUNCH();
}

/* Rows per warp: more rows share each activation load (4 from 3 activation
 * rows on), fewer leave enough blocks to spread over the SMs. */
template <int NR, typename T>
static void launch_gemv_t(cudaStream_t s, int n_sm, int r_max, float *y, long ldy, const float *x,
                          long ldx, const void *w, const float *bias, long rows, long cols, int n) {
    int r = NR <= 2 ? 2 : 4;
    if (r > r_max) r = r_max;
    while (r > 1 && (rows + GEMV_WARPS * r - 1) / (GEMV_WARPS * r) < 2l * n_sm) r /= 2;
    if (r == 4) launch_gemv_r<NR, 4, T>(s, y, ldy, x, ldx, w, bias, rows, cols, n);
    else if (r == 2) launch_gemv_r<NR, 2, T>(s, y, ldy, x, ldx, w, bias, rows, cols, n);
    else launch_gemv_r<NR, 1, T>(s, y, ldy, x, ldx, w, bias, rows, cols, n);
}

template <typename T>
static void launch_gemv(const struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                        const void *w, const float *bias, long rows, long cols, int n) {
    cudaStream_t s = c->stream;
    int sm = c->n_sm, rm = c->gemv_rows_per_warp;
    if (n <= 1) launch_gemv_t<1, T>(s, sm, rm, y, ldy, x, ldx, w, bias, rows, cols, n);
    else if (n <= 2) launch_gemv_t<2, T>(s, sm, rm, y, ldy, x, ldx, w, bias, rows, cols, n);
    else if (n <= 4) launch_gemv_t<4, T>(s, sm, rm, y, ldy, x, ldx, w, bias, rows, cols, n);
    else launch_gemv_t<8, T>(s, sm, rm, y, ldy, x, ldx, w, bias, rows, cols, n);
}

/* xb[n][cols] = x[n][cols] (stride ldx), rounded to nearest in T */
template <typename T>
static __global__ void to16_kernel(T *__restrict__ xb, const float *__restrict__ x, long ldx,
                                   long n, long cols) {
    long total = n * cols;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / cols, k = i % cols;
        float v = x[r * ldx + k];
        xb[i] = T(v);
    }
}

/* xb[0][n][cols] = T(x), xb[1][n][cols] = T(x − T(x)) */
template <typename T>
static __global__ void split16_kernel(T *__restrict__ xb, const float *__restrict__ x, long ldx,
                                      long n, long cols) {
    long total = n * cols;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / cols, k = i % cols;
        float v = x[r * ldx + k];
        T hi = T(v);
        xb[i] = hi;
        xb[total + i] = T(v - (float)hi);
    }
}

/* y[n][rows] (stride ldy) += bias[rows] */
static __global__ void bias_add_kernel(float *y, long ldy, const float *__restrict__ bias, long n,
                                       long rows) {
    long total = n * rows;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / rows, k = i % rows;
        y[r * ldy + k] += bias[k];
    }
}

extern "C" void cuda_op_matmul(void *ctx, float *y, long ldy, const float *x, long ldx,
                               const struct backend_weight *w, const float *bias, long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cudaStream_t s = c->stream;
    long rows = w->rows, cols = w->cols;
    if (n <= 0 || rows <= 0) return;
    CUDA_ASSERT(rows <= INT32_MAX && cols <= INT32_MAX && n <= INT32_MAX && ldx >= cols &&
                ldy >= rows);
    if (c->deterministic) return cuda_matmul_det(c, y, ldy, x, ldx, w, bias, n);
    int half = w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16;
    CUDA_ASSERT_MSG(half || w->dtype == DTYPE_F32, "matmul: weights must be BF16, F16 or F32");

    if (half && n <= c->gemv_max_rows && n <= 8 && cols % 8 == 0 &&
        (uintptr_t)w->data % 16 == 0) {
        if (w->dtype == DTYPE_BF16)
            launch_gemv<__nv_bfloat16>(c, y, ldy, x, ldx, w->data, bias, rows, cols, (int)n);
        else
            launch_gemv<__half>(c, y, ldy, x, ldx, w->data, bias, rows, cols, (int)n);
        return;
    }

    const float alpha = 1.0f, beta = 0.0f, one = 1.0f;
    if (half) {
        int parts = c->split_act ? 2 : 1;
        size_t elems = (size_t)n * (size_t)cols;
        cuda_scratch_reserve(c, &c->act16, elems * 2 * (size_t)parts);
        cudaDataType_t t = w->dtype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        unsigned grid = grid_for(n * cols, 256);
        if (w->dtype == DTYPE_BF16) {
            __nv_bfloat16 *xb = (__nv_bfloat16 *)c->act16.p;
            if (parts == 2) split16_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(xb, x, ldx, n, cols);
            else to16_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(xb, x, ldx, n, cols);
        } else {
            __half *xb = (__half *)c->act16.p;
            if (parts == 2) split16_kernel<__half><<<grid, 256, 0, s>>>(xb, x, ldx, n, cols);
            else to16_kernel<__half><<<grid, 256, 0, s>>>(xb, x, ldx, n, cols);
        }
        CUDA_CHECK_LAUNCH();
        for (int part = 0; part < parts; part++)
            CUBLAS_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n,
                                      (int)cols, &alpha, w->data, t, (int)cols,
                                      (const char *)c->act16.p + elems * 2 * (size_t)part, t,
                                      (int)cols, part ? &one : &beta, y, CUDA_R_32F, (int)ldy,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        CUBLAS_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n,
                                  (int)cols, &alpha, w->data, CUDA_R_32F, (int)cols, x,
                                  CUDA_R_32F, (int)ldx, &beta, y, CUDA_R_32F, (int)ldy,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (bias) {
        bias_add_kernel<<<grid_for(n * rows, 256), 256, 0, s>>>(y, ldy, bias, n, rows);
        CUDA_CHECK_LAUNCH();
    }
}
