/* cuda_dummy.cu — backend_ops.weight_dummy: dummy weights generated on
 * the device, element by element from tensor/dummy_fill.h's counter-based
 * generator, so they are the same bytes as the host fill (weights.c) and
 * a model of tens of GB appears in well under a second instead of a host
 * fill and an upload. BF16 and F32 (an F16 model fills on the host). */
#include "backend/cuda/cuda_common.cuh"
#include "tensor/dummy_fill.h"

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

extern "C" const void *cuda_op_weight_dummy(void *ctx, const struct dummy_part *parts, int count) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    size_t bytes[8];
    CUDA_ASSERT(count >= 1 && count <= 8);
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
