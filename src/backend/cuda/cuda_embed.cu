/* cuda_embed.cu — embedding lookup: each block copies one token's row of
 * the table, widened to fp32. Programmatic dependent launch with
 * cuda_ctx.pdl_attn (cuda_pdl.cuh): it follows the step's upload (a copy,
 * so it starts as before), but triggers early, so the first norm's launch
 * overlaps it. */
#include "backend/cuda/cuda_pdl.cuh"

/* y[n][dim] = table[ids[i]] ; table [rows][dim] in dtype dt */
static __global__ void embed_kernel(float *__restrict__ y, const void *__restrict__ table, int dt,
                                    long rows, long dim, const int32_t *__restrict__ ids, long n) {
    pdl_trigger();
    pdl_wait();
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        long id = ids[i];
        if (id < 0 || id >= rows) __trap(); /* the model checks ids on the host first */
        size_t base = (size_t)id * (size_t)dim;
        for (long k = threadIdx.x; k < dim; k += blockDim.x)
            y[i * dim + k] = load_as_f32(table, base + (size_t)k, dt);
    }
}

extern "C" void cuda_op_embed(void *ctx, float *y, const struct backend_weight *table,
                              const int32_t *ids, long n) {
    if (n <= 0) return;
    CUDA_ASSERT_MSG(table->dtype == DTYPE_BF16 || table->dtype == DTYPE_F16 ||
                        table->dtype == DTYPE_F32,
                    "unsupported embedding dtype");
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    pdl_launch_on(c, pdl_attn(c), embed_kernel, dim3(grid_for(n, 1)), dim3(256), 0, y,
                  (const void *)table->data, (int)table->dtype, table->rows, table->cols, ids, n);
}
