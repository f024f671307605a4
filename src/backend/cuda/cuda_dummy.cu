/* cuda_dummy.cu — backend_ops.weight_dummy: dummy weights generated on
 * the device, element by element from tensor/dummy_fill.h's counter-based
 * generator, so they are the same bytes as the host fill (weights.c) and
 * a model of tens of GB appears in well under a second instead of a host
 * fill and an upload. BF16 and F32 (an F16 model fills on the host), FP8
 * (block-quantized BF16 or F32 values, codes and scales) and MXFP4 (BF16
 * or F32 values encoded by tensor/mxfp4.h, codes and exponents). */
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "tensor/dummy_fill.h"
#include "tensor/mxfp4.h"

/* The block of one part: DUMMY_BLOCK values, then the tensor tiled. */
template <typename T>
static __global__ void dummy_kernel(T *__restrict__ out, struct dummy_part p, uint64_t off) {
    __shared__ T block[DUMMY_BLOCK];
    for (int j = threadIdx.x; j < DUMMY_BLOCK; j += blockDim.x) {
        float v = dummy_unit(p.seed, p.tensor, (uint64_t)j) * p.scale;
        if constexpr (sizeof(T) == 2) block[j] = dummy_bf16(v);
        else block[j] = v;
    }
    __syncthreads();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        out[i] = block[(off + i) % DUMMY_BLOCK];
}

/* An FP8 part: a CTA per block of block_rows × block_cols: the block's
 * largest magnitude, its scale, then its codes, as fp8_quantize_blocks
 * computes them on the host (the same fp32 operations, rounded alike). */
static __global__ void dummy_fp8_kernel(uint8_t *__restrict__ codes, float *__restrict__ scales,
                                        struct dummy_part p, uint64_t off) {
    __shared__ float block[DUMMY_BLOCK];
    __shared__ float wmax[32];
    for (int j = threadIdx.x; j < DUMMY_BLOCK; j += blockDim.x) {
        float v = dummy_unit(p.seed, p.tensor, (uint64_t)j) * p.scale;
        block[j] = p.src == DTYPE_BF16 ? __uint_as_float((uint32_t)dummy_bf16(v) << 16) : v;
    }
    __syncthreads();
    long nbc = (p.cols + p.block_cols - 1) / p.block_cols;
    long b = blockIdx.x, r0 = b / nbc * p.block_rows, c0 = b % nbc * p.block_cols;
    long nr = p.rows - r0 < p.block_rows ? p.rows - r0 : p.block_rows;
    long nc = p.cols - c0 < p.block_cols ? p.cols - c0 : p.block_cols;
    long total = nr * nc;
    float amax = 0.0f;
    for (long e = threadIdx.x; e < total; e += blockDim.x) {
        long r = r0 + e / nc, c = c0 + e % nc;
        amax = fmaxf(amax, fabsf(block[(off + (uint64_t)(r * p.cols + c)) % DUMMY_BLOCK]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, wmax[w]);
    float s = __fdiv_rn(fmaxf(amax, 1e-12f), 448.0f);
    if (threadIdx.x == 0) scales[b] = s;
    for (long e = threadIdx.x; e < total; e += blockDim.x) {
        long r = r0 + e / nc, c = c0 + e % nc;
        float x = block[(off + (uint64_t)(r * p.cols + c)) % DUMMY_BLOCK];
        codes[r * p.cols + c] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(x, s), __NV_SATFINITE, __NV_E4M3);
    }
}

/* An MXFP4 part: a thread per run of 32 values, encoded as the host does. */
static __global__ void dummy_mxfp4_kernel(uint8_t *__restrict__ codes, uint8_t *__restrict__ ex, struct dummy_part p,
                                          uint64_t off) {
    __shared__ float block[DUMMY_BLOCK];
    for (int j = threadIdx.x; j < DUMMY_BLOCK; j += blockDim.x) {
        float v = dummy_unit(p.seed, p.tensor, (uint64_t)j) * p.scale;
        block[j] = p.src == DTYPE_BF16 ? __uint_as_float((uint32_t)dummy_bf16(v) << 16) : v;
    }
    __syncthreads();
    const size_t nb = p.n / 32;
    for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += (size_t)gridDim.x * blockDim.x) {
        float x[32];
        for (int i = 0; i < 32; i++) x[i] = block[(off + b * 32 + (size_t)i) % DUMMY_BLOCK];
        mxfp4_encode32(x, codes + b * 16, ex + b);
    }
}

static const void *dummy_mxfp4(struct cuda_ctx *c, const struct dummy_part *parts, int count) {
    size_t codes = 0, nex = 0;
    for (int i = 0; i < count; i++) {
        const struct dummy_part *p = &parts[i];
        if (p->dtype != DTYPE_MXFP4 || (p->src != DTYPE_BF16 && p->src != DTYPE_F32) || p->n % 32) return NULL;
        codes += p->n / 2;
        nex += p->n / 32;
    }
    size_t eat = (codes + 15) & ~(size_t)15, bytes = eat + nex;
    unsigned char *d = (unsigned char *)cuda_weight_alloc(c, &bytes, 1);
    if (!d) return NULL;
    size_t at = 0, e = 0;
    for (int i = 0; i < count; i++) {
        const struct dummy_part *p = &parts[i];
        long nb = (long)(p->n / 32), g = (nb + 255) / 256;
        int grid = (int)(g < 4L * c->n_sm * 8 ? (g > 0 ? g : 1) : 4L * c->n_sm * 8);
        dummy_mxfp4_kernel<<<grid, 256, 0, c->stream>>>(d + at, d + eat + e, *p, dummy_offset(p->seed, p->tensor));
        CUDA_CHECK_LAUNCH();
        at += p->n / 2;
        e += p->n / 32;
    }
    return d;
}

static const void *dummy_fp8(struct cuda_ctx *c, const struct dummy_part *parts, int count) {
    size_t codes = 0, nscale = 0;
    for (int i = 0; i < count; i++) {
        const struct dummy_part *p = &parts[i];
        if (p->dtype != DTYPE_F8_E4M3 || (p->src != DTYPE_BF16 && p->src != DTYPE_F32) ||
            p->block_rows <= 0 || p->block_cols <= 0 || p->rows <= 0 || p->cols <= 0 ||
            (size_t)p->rows * (size_t)p->cols != p->n)
            return NULL;
        codes += p->n;
        nscale += (size_t)((p->rows + p->block_rows - 1) / p->block_rows) *
                  (size_t)((p->cols + p->block_cols - 1) / p->block_cols);
    }
    size_t sat = (codes + 15) & ~(size_t)15, bytes = sat + nscale * 4;
    unsigned char *d = (unsigned char *)cuda_weight_alloc(c, &bytes, 1);
    if (!d) return NULL;
    size_t at = 0, sc = 0;
    for (int i = 0; i < count; i++) {
        const struct dummy_part *p = &parts[i];
        long nb = ((p->rows + p->block_rows - 1) / p->block_rows) *
                  ((p->cols + p->block_cols - 1) / p->block_cols);
        dummy_fp8_kernel<<<(unsigned)nb, 256, 0, c->stream>>>(d + at, (float *)(d + sat) + sc, *p,
                                                              dummy_offset(p->seed, p->tensor));
        CUDA_CHECK_LAUNCH();
        at += p->n;
        sc += (size_t)nb;
    }
    return d;
}

extern "C" const void *cuda_op_weight_dummy(void *ctx, const struct dummy_part *parts, int count) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    size_t bytes[8];
    CUDA_ASSERT(count >= 1 && count <= 8);
    if (parts[0].dtype == DTYPE_F8_E4M3) return dummy_fp8(c, parts, count);
    if (parts[0].dtype == DTYPE_MXFP4) return dummy_mxfp4(c, parts, count);
    for (int i = 0; i < count; i++) {
        if (parts[i].dtype != DTYPE_BF16 && parts[i].dtype != DTYPE_F32) return NULL;
        bytes[i] = parts[i].n * dtype_size(parts[i].dtype);
    }
    unsigned char *p = (unsigned char *)cuda_weight_alloc(c, bytes, count);
    if (!p) return NULL;
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        uint64_t off = dummy_offset(parts[i].seed, parts[i].tensor);
        long n = (long)((parts[i].n + 255) / 256);
        int grid = (int)(n < 4L * c->n_sm * 8 ? (n > 0 ? n : 1) : 4L * c->n_sm * 8);
        if (parts[i].dtype == DTYPE_BF16)
            dummy_kernel<uint16_t><<<grid, 256, 0, c->stream>>>((uint16_t *)(p + at), parts[i], off);
        else
            dummy_kernel<float><<<grid, 256, 0, c->stream>>>((float *)(p + at), parts[i], off);
        CUDA_CHECK_LAUNCH();
        at += bytes[i];
    }
    return p;
}
