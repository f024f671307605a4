/* cuda_embed.cu — embedding lookup: each block copies one token's row of
 * the table, widened to fp32 (exact). Programmatic dependent launch
 * (cuda_pdl.cuh): it follows the step's upload (a copy,
 * so it starts as before), but triggers early, so the first norm's launch
 * overlaps it. */
#include "backend/cuda/cuda_pdl.cuh"

/* Row id of a 16-bit table (dim % 8 == 0, 16-byte aligned rows) into yr:
 * 8 elements (one 16-byte load, two float4 stores) a thread. */
static __device__ __forceinline__ void embed_row16(float *yr, const void *table, int dt, long id,
                                                   long dim) {
    const uint4 *src = (const uint4 *)((const uint16_t *)table + (size_t)id * (size_t)dim);
    float4 *dst = (float4 *)yr;
    for (long k = threadIdx.x; k < dim / 8; k += blockDim.x) {
        uint4 v = __ldg(src + k);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        float f[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint16_t lo = (uint16_t)(w[j] & 0xffffu), hi = (uint16_t)(w[j] >> 16);
            if (dt == DTYPE_BF16) {
                f[2 * j] = __bfloat162float(__ushort_as_bfloat16(lo));
                f[2 * j + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
            } else {
                f[2 * j] = __half2float(__ushort_as_half(lo));
                f[2 * j + 1] = __half2float(__ushort_as_half(hi));
            }
        }
        dst[2 * k] = make_float4(f[0], f[1], f[2], f[3]);
        dst[2 * k + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

/* y[n][dim] = table[ids[i] - first] ; table [rows][dim] in dtype dt. VEC:
 * the 16-byte row copy (embed_row16). It is the step's first kernel, alone
 * on the GPU: element by element it spent 8 µs on Llama-3.1-8B's 64 rows
 * of 4096, by 16 bytes 2.3. SHARD (embed_shard): ids outside the table's
 * rows give zero rows. */
template <bool VEC, bool SHARD>
static __global__ void embed_kernel(float *__restrict__ y, const void *__restrict__ table, int dt,
                                    long rows, long dim, const int32_t *__restrict__ ids, long first,
                                    long n) {
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        long id = ids[i] - first;
        if (SHARD && (id < 0 || id >= rows)) { /* another rank's row */
            for (long k = threadIdx.x; k < dim; k += blockDim.x) y[i * dim + k] = 0.0f;
            continue;
        }
        if (id < 0 || id >= rows) __trap(); /* the model checks ids on the host first */
        if (VEC) {
            embed_row16(y + i * dim, table, dt, id, dim);
            continue;
        }
        size_t base = (size_t)id * (size_t)dim;
        for (long k = threadIdx.x; k < dim; k += blockDim.x)
            y[i * dim + k] = load_as_f32(table, base + (size_t)k, dt);
    }
}

template <bool SHARD>
static void embed_launch(void *ctx, float *y, const struct backend_weight *table, const int32_t *ids,
                         long first, long n) {
    if (n <= 0) return;
    CUDA_ASSERT_MSG(table->dtype == DTYPE_BF16 || table->dtype == DTYPE_F16 ||
                        table->dtype == DTYPE_F32,
                    "unsupported embedding dtype");
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    if (table->dtype != DTYPE_F32 && table->cols % 8 == 0 && ((uintptr_t)table->data & 15) == 0 &&
        ((uintptr_t)y & 15) == 0) {
        int threads = (int)((table->cols / 8 + 31) / 32 * 32);
        if (threads > 1024) threads = 1024;
        pdl_launch(c, embed_kernel<true, SHARD>, dim3(grid_for(n, 1)), dim3(threads), 0, y,
                      (const void *)table->data, (int)table->dtype, table->rows, table->cols, ids,
                      first, n);
        return;
    }
    pdl_launch(c, embed_kernel<false, SHARD>, dim3(grid_for(n, 1)), dim3(256), 0, y,
                  (const void *)table->data, (int)table->dtype, table->rows, table->cols, ids, first,
                  n);
}

extern "C" void cuda_op_embed(void *ctx, float *y, const struct backend_weight *table,
                              const int32_t *ids, long n) {
    embed_launch<false>(ctx, y, table, ids, 0, n);
}

extern "C" void cuda_op_embed_shard(void *ctx, float *y, const struct backend_weight *table,
                                    const int32_t *ids, long first, long n) {
    embed_launch<true>(ctx, y, table, ids, first, n);
}
