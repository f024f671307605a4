/* cuda_norm_row.cuh — the second half of one row of the residual add +
 * RMSNorm (the sum of squares, the scale, the stores), shared by
 * cuda_norm.cu's kernels and the all-reduce fused with the norm
 * (cuda_allreduce.cu): whichever path a step's size takes, a row gets the
 * same bits (CUDA C++, included by .cu files only).
 *
 * Both forms run in one block a row and end with the block synchronized
 * (red, 32 floats of shared memory, may be reused). y NULL: not written;
 * O bf16 / f16: y16 gets the output rounded (O float: no 16-bit copy); O
 * uint8_t (the float4 form only): y16 gets it in e4m3 (put4). */
#ifndef KILN_BACKEND_CUDA_NORM_ROW_CUH
#define KILN_BACKEND_CUDA_NORM_ROW_CUH

#include "backend/cuda/cuda_common.cuh"

static __device__ __forceinline__ void put16(float *, long, float) {}
static __device__ __forceinline__ void put16(__nv_bfloat16 *p, long i, float v) { store16(p + i, v); }
static __device__ __forceinline__ void put16(__half *p, long i, float v) { store16(p + i, v); }

/* The float4 form's copy of output float4 k of row i (of n rows): 16-bit,
 * or (O = uint8_t, cuda_add_rmsnorm8) e4m3 codes of the row's 128-column
 * groups with their scales at q8_scales_off (cuda_fp8_quant_act's bytes):
 * the 32 lanes of a warp hold one group (dim % 128 == 0, blockDim % 32 ==
 * 0), all of them here together. */
template <typename O>
static __device__ __forceinline__ void put4(O *y16, long i, long n, long dim, long k, float4 o) {
    put16(y16, i * dim + 4 * k, o.x);
    put16(y16, i * dim + 4 * k + 1, o.y);
    put16(y16, i * dim + 4 * k + 2, o.z);
    put16(y16, i * dim + 4 * k + 3, o.w);
}
static __device__ __forceinline__ void put4(uint8_t *q, long i, long n, long dim, long k, float4 o) {
    const float sc = q8_warp_scale(fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))));
    *(uint32_t *)(q + i * dim + 4 * k) =
        q8_code(o.x, sc) | q8_code(o.y, sc) << 8 | q8_code(o.z, sc) << 16 | q8_code(o.w, sc) << 24;
    if ((threadIdx.x & 31) == 0) ((float *)(q + q8_scales_off(n, dim)))[(4 * k / 128) * n + i] = sc;
}

/* The float4 form's norm weights: wv[j] = w's float4 t + j·blockDim (zero
 * past d4). They are never written: load them before pdl_wait. */
template <int V>
static __device__ __forceinline__ void norm_weights_vec(float4 (&wv)[V], const float *__restrict__ w, long d4) {
#pragma unroll
    for (int j = 0; j < V; j++) {
        long k = threadIdx.x + (long)j * blockDim.x;
        wv[j] = k < d4 ? ((const float4 *)w)[k] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

/* The float4 form: thread t holds elements t + j·blockDim of the row's d4
 * float4 in v[j] (the sum h + delta; zero past d4), wv[j] the norm
 * weights'. hr not NULL: v is stored back into the row of h. The sum of
 * squares runs in a fixed order: each thread's vectors in order, x y z w,
 * then the block reduction. */
template <typename O, int V>
static __device__ __forceinline__ void norm_row_vec(const float4 (&v)[V], const float4 (&wv)[V], float4 *hr,
                                                    float *y, O *y16, long i, long dim, float eps,
                                                    float *red, long n = 0) {
    const int t = threadIdx.x, nt = blockDim.x;
    const long d4 = dim / 4;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        long k = t + (long)j * nt;
        if (k < d4) {
            if (hr) hr[k] = v[j];
            ss = fmaf(v[j].x, v[j].x, ss);
            ss = fmaf(v[j].y, v[j].y, ss);
            ss = fmaf(v[j].z, v[j].z, ss);
            ss = fmaf(v[j].w, v[j].w, ss);
        }
    }
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)dim + eps);
    float4 *yr = (float4 *)(y + i * dim);
#pragma unroll
    for (int j = 0; j < V; j++) {
        long k = t + (long)j * nt;
        if (k < d4) {
            float4 o = make_float4(wv[j].x * (v[j].x * inv), wv[j].y * (v[j].y * inv), wv[j].z * (v[j].z * inv),
                                   wv[j].w * (v[j].w * inv));
            if (y) yr[k] = o;
            put4(y16, i, n, dim, k, o);
        }
    }
    __syncthreads(); /* red is reused by the next row */
}

/* The scalar form, after the row of h holds its sums and ss each thread's
 * partial sum of squares (elements t, t + blockDim, ... in order, each
 * added as ss += v * v). */
template <typename O>
static __device__ __forceinline__ void norm_row_scalar(float ss, const float *hr, const float *w, float *y,
                                                       O *y16, long i, long dim, float eps, float *red) {
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)dim + eps);
    float *yr = y + i * dim;
    for (long k = threadIdx.x; k < dim; k += blockDim.x) {
        float v = w[k] * (hr[k] * inv);
        if (y) yr[k] = v;
        put16(y16, i * dim + k, v);
    }
    __syncthreads();
}

#endif
