/* cuda_dummy_fp8.cu — backend_ops.weight_dummy_fp8: dummy weights under
 * --quantization fp8 made on the device. The values are weight_dummy's
 * (tensor/dummy_fill.h, rounded to the part's dtype), quantized as the
 * model's host quantization does (fp8_quantize_blocks, model/weights.c):
 * per block, scale = max(amax, 1e-12) / 448 and code = e4m3(x / scale)
 * rounded to nearest even, saturating; the same bytes and scales, so a
 * model of tens of GB (Qwen3-30B-A3B's experts) appears in a fraction of
 * a second instead of a host fill, a host quantization and an upload. */
#include "backend/cuda/cuda_common.cuh"
#include "tensor/dummy_fill.h"

/* f32_to_fp8_e4m3 of tensor/dtype.c, on the device (integer steps, so the
 * same code for every input). */
static __device__ uint8_t e4m3_from_f32(float f) {
    uint32_t u = __float_as_uint(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7e);
    int32_t exp = (int32_t)(a >> 23) - 127;
    uint32_t man = (a & 0x7fffff) | 0x800000;
    if (exp < -6) {
        if (exp < -10) return sign;
        uint32_t shift = (uint32_t)(20 + (-6 - exp));
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (q & 1))) q++;
        return (uint8_t)(sign | q);
    }
    uint32_t q = (uint32_t)(exp + 7) << 3 | ((man >> 20) & 7), rem = man & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (q & 1))) q++;
    return (uint8_t)(sign | q);
}

enum { DQ_THREADS = 256 };

/* Grid-stride over the blocks of a [rows][cols] tensor; each CTA first
 * makes the tensor's DUMMY_BLOCK values (rounded to the dtype, widened). */
static __global__ void __launch_bounds__(DQ_THREADS)
dummy_fp8_kernel(uint8_t *__restrict__ q, float *__restrict__ scale, struct dummy_part p, uint64_t off, long rows,
                 long cols, int br, int bc) {
    __shared__ float vals[DUMMY_BLOCK];
    __shared__ float red[32];
    for (int j = threadIdx.x; j < DUMMY_BLOCK; j += DQ_THREADS) {
        float v = dummy_unit(p.seed, p.tensor, (uint64_t)j) * p.scale;
        if (p.dtype == DTYPE_BF16) v = __uint_as_float((uint32_t)dummy_bf16(v) << 16);
        vals[j] = v;
    }
    __syncthreads();
    long nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    for (long b = blockIdx.x; b < nbr * nbc; b += gridDim.x) {
        long r0 = b / nbc * br, c0 = b % nbc * bc;
        long nr = rows - r0 < br ? rows - r0 : br, nc = cols - c0 < bc ? cols - c0 : bc;
        float amax = 0.0f;
        for (long e = threadIdx.x; e < nr * nc; e += DQ_THREADS) {
            long i = (r0 + e / nc) * cols + c0 + e % nc;
            amax = fmaxf(amax, fabsf(vals[(off + (uint64_t)i) % DUMMY_BLOCK]));
        }
        amax = block_max(amax, red);
        float s = fmaxf(amax, 1e-12f) / 448.0f;
        if (threadIdx.x == 0) scale[b] = s;
        for (long e = threadIdx.x; e < nr * nc; e += DQ_THREADS) {
            long i = (r0 + e / nc) * cols + c0 + e % nc;
            q[i] = e4m3_from_f32(vals[(off + (uint64_t)i) % DUMMY_BLOCK] / s);
        }
        __syncthreads(); /* red is read by every thread before the next block writes it */
    }
}

extern "C" const void *cuda_op_weight_dummy_fp8(void *ctx, const struct dummy_part *p, long rows, long cols,
                                                int block_rows, int block_cols, const float **scale) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if ((p->dtype != DTYPE_BF16 && p->dtype != DTYPE_F32) || rows < 1 || cols < 1 || block_rows < 1 ||
        block_cols < 1 || p->n != (size_t)rows * (size_t)cols)
        return NULL;
    long nb = (rows + block_rows - 1) / block_rows * ((cols + block_cols - 1) / block_cols);
    /* codes then scales, one allocation (the model releases the codes' pointer) */
    size_t bytes[2] = {((size_t)rows * (size_t)cols + 255) & ~(size_t)255, (size_t)nb * 4};
    unsigned char *d = (unsigned char *)cuda_weight_alloc(c, bytes, 2);
    if (!d) return NULL;
    float *s = (float *)(d + bytes[0]);
    long grid = nb < 8L * c->n_sm ? nb : 8L * c->n_sm;
    dummy_fp8_kernel<<<(unsigned)grid, DQ_THREADS, 0, c->stream>>>(d, s, *p, dummy_offset(p->seed, p->tensor), rows,
                                                                   cols, block_rows, block_cols);
    CUDA_CHECK_LAUNCH();
    *scale = s;
    return d;
}
