/* cuda_matmul_det.cu — y[n][rows] = x[n][cols] · Wᵀ (+ bias) for
 * --deterministic: every output's reduction order depends on cols only,
 * never on n, so a row gives the same bits alone or in any batch.
 *
 * cuBLAS picks its algorithm (tile shape, split-K) from the problem size,
 * and the default path sends n ≤ 8 rows to a fp32 GEMV and larger batches
 * to bf16 cuBLAS: both make a row's result depend on its batch. Here:
 *
 *  - 16-bit weights: one tensor-core kernel for every n. A CTA of 4 warps
 *    computes a 64 × 64 tile of y; the activations are rounded to the
 *    weights' type (as on the cuBLAS path), the K dimension is walked in
 *    tiles of 32 in order, and each output accumulates in fp32 through the
 *    same chain of mma.sync m16n8k16 steps (k = 0, 16, 32, ...) whatever the
 *    tile it sits in. Tiles are staged through registers (the next tile's
 *    loads are issued before the current tile's products).
 *  - F32 weights, or rows not 16-byte aligned: a thread per output summing
 *    k in order in fp32 (slow; only tiny fp32 models take it).
 * Decode batches pay for this: a 64-row tile for one row, no split over K
 * (docs/cuda.md, "Deterministic mode"). */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ptx.cuh"

enum {
    DET_BM = 64, /* activation rows per CTA */
    DET_BN = 64, /* output features per CTA */
    DET_BK = 32,
    DET_LD = DET_BK + 8, /* padded smem row (16-bit elements): conflict-free ldmatrix */
    DET_THREADS = 128,
};

static __device__ __forceinline__ uint32_t det_pack(float lo, float hi, const __nv_bfloat16 *) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ uint32_t det_pack(float lo, float hi, const __half *) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* y[n][rows] = x[n][cols] · w[rows][cols]ᵀ + bias; cols % 8 == 0, x rows
 * and w 16-byte aligned. */
template <typename T>
static __global__ void __launch_bounds__(DET_THREADS)
    det_mma_kernel(float *__restrict__ y, long ldy, const float *__restrict__ x, long ldx,
                   const T *__restrict__ w, const float *__restrict__ bias, long rows, long cols,
                   long n, long hy, long hx, long hw) {
    __shared__ __align__(16) T xs[DET_BM * DET_LD];
    y += blockIdx.z * hy; /* head blockIdx.z of matmul_heads (0 otherwise) */
    x += blockIdx.z * hx;
    w += blockIdx.z * hw;
    __shared__ __align__(16) T ws[DET_BN * DET_LD];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp >> 1, wn = warp & 1; /* the warp's 32 × 32 quarter */
    long i0 = (long)blockIdx.y * DET_BM, f0 = (long)blockIdx.x * DET_BN;

    /* per k-tile: x 64×32 fp32 = 512 float4 (4 a thread), w 64×32 = 256
     * uint4 (2 a thread) */
    float4 xr[4];
    uint4 wr[2];
    auto load = [&](long k0) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int idx = tid + u * DET_THREADS, r = idx >> 3, c = (idx & 7) * 4;
            long i = i0 + r, k = k0 + c;
            xr[u] = i < n && k < cols ? *(const float4 *)(x + i * ldx + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int idx = tid + u * DET_THREADS, r = idx >> 2, c = (idx & 3) * 8;
            long f = f0 + r, k = k0 + c;
            wr[u] = f < rows && k < cols ? *(const uint4 *)(w + f * cols + k) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int idx = tid + u * DET_THREADS, r = idx >> 3, c = (idx & 7) * 4;
            *(uint2 *)(xs + r * DET_LD + c) = make_uint2(det_pack(xr[u].x, xr[u].y, (const T *)0),
                                                         det_pack(xr[u].z, xr[u].w, (const T *)0));
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int idx = tid + u * DET_THREADS, r = idx >> 2, c = (idx & 3) * 8;
            *(uint4 *)(ws + r * DET_LD + c) = wr[u];
        }
    };

    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.0f;

    load(0);
    for (long k0 = 0; k0 < cols; k0 += DET_BK) {
        __syncthreads(); /* everyone is done reading the previous tile */
        store();
        __syncthreads();
        if (k0 + DET_BK < cols) load(k0 + DET_BK);
#pragma unroll
        for (int ks = 0; ks < DET_BK / 16; ks++) {
            uint32_t af[2][4], bf[2][4];
            int mi = lane >> 3;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ptx_ldmatrix_x4(af[mt], xs + (wm * 32 + mt * 16 + (lane & 7) + (mi & 1) * 8) * DET_LD +
                                            ks * 16 + (mi >> 1) * 8);
#pragma unroll
            for (int np = 0; np < 2; np++)
                ptx_ldmatrix_x4(bf[np], ws + (wn * 32 + np * 16 + (lane & 7) + (mi >> 1) * 8) * DET_LD +
                                            ks * 16 + (mi & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    ptx_mma_m16n8k16<T>(acc[mt][2 * np], af[mt], bf[np][0], bf[np][1]);
                    ptx_mma_m16n8k16<T>(acc[mt][2 * np + 1], af[mt], bf[np][2], bf[np][3]);
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            long f = f0 + wn * 32 + nt * 8 + 2 * (lane & 3);
            long ia = i0 + wm * 32 + mt * 16 + (lane >> 2), ib = ia + 8;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                long i = e < 2 ? ia : ib, ff = f + (e & 1);
                if (i < n && ff < rows) y[i * ldy + ff] = acc[mt][nt][e] + (bias ? bias[ff] : 0.0f);
            }
        }
}

/* A thread per output, k in order: any dtype and alignment. */
static __global__ void det_simple_kernel(float *__restrict__ y, long ldy, const float *__restrict__ x,
                                         long ldx, const void *__restrict__ w, int dt,
                                         const float *__restrict__ bias, long rows, long cols,
                                         long hy, long hx, long hw) {
    long f = (long)blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (f >= rows) return;
    y += blockIdx.z * hy;
    x += blockIdx.z * hx;
    size_t w0 = (size_t)blockIdx.z * (size_t)hw;
    const float *xr = x + i * ldx;
    float acc = 0.0f;
    for (long k = 0; k < cols; k++) acc = fmaf(xr[k], load_as_f32(w, w0 + (size_t)(f * cols + k), dt), acc);
    y[i * ldy + f] = acc + (bias ? bias[f] : 0.0f);
}

/* cuda_matmul_det, or with n_heads > 1 matmul_heads: head h's y, x and w
 * start h·hy, h·hx, h·hw elements after head 0's (grid.z), each head the
 * single product's kernel and bits. */
static void det_run(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x, long ldx,
                    long hx, const struct backend_weight *w, long hw, const float *bias,
                    int n_heads, long n) {
    long rows = w->rows, cols = w->cols;
    if (n <= 0 || rows <= 0) return;
    cudaStream_t s = c->stream;
    bool w16 = w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16;
    bool vec = w16 && cols % 8 == 0 && ldx % 4 == 0 && (uintptr_t)x % 16 == 0 &&
               (uintptr_t)w->data % 16 == 0 && (n_heads == 1 || (hx % 4 == 0 && hw % 8 == 0));
    CUDA_ASSERT(n_heads >= 1 && n_heads <= 65535);
    if (vec) {
        CUDA_ASSERT((n + DET_BM - 1) / DET_BM <= 65535);
        dim3 grid((unsigned)((rows + DET_BN - 1) / DET_BN), (unsigned)((n + DET_BM - 1) / DET_BM),
                  (unsigned)n_heads);
        if (w->dtype == DTYPE_BF16)
            det_mma_kernel<__nv_bfloat16><<<grid, DET_THREADS, 0, s>>>(
                y, ldy, x, ldx, (const __nv_bfloat16 *)w->data, bias, rows, cols, n, hy, hx, hw);
        else
            det_mma_kernel<__half><<<grid, DET_THREADS, 0, s>>>(y, ldy, x, ldx, (const __half *)w->data,
                                                                bias, rows, cols, n, hy, hx, hw);
    } else {
        CUDA_ASSERT(n <= 65535);
        dim3 grid((unsigned)((rows + 127) / 128), (unsigned)n, (unsigned)n_heads);
        det_simple_kernel<<<grid, 128, 0, s>>>(y, ldy, x, ldx, w->data, (int)w->dtype, bias, rows,
                                               cols, hy, hx, hw);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_matmul_det(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                                const struct backend_weight *w, const float *bias, long n) {
    det_run(c, y, ldy, 0, x, ldx, 0, w, 0, bias, 1, n);
}

extern "C" void cuda_matmul_det_heads(struct cuda_ctx *c, float *y, long ldy, long hy,
                                      const float *x, long ldx, long hx,
                                      const struct backend_weight *w, long w_stride, int n_heads,
                                      long n) {
    det_run(c, y, ldy, hy, x, ldx, hx, w, w_stride, NULL, n_heads, n);
}
