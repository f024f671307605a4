/* cuda_workspace.c — backend_ops.workspace_bytes: the device scratch the
 * CUDA operations take at most for a model's largest step, which the
 * memory plan counts before it sizes the KV pool (src/runner/mem_plan.h).
 *
 * What grows on demand (cuda_scratch_reserve) reaches its size during the
 * start-up warm-up, which runs the largest step; the figure is the sum of
 * each scratch at its largest:
 *  - the cuBLAS / cuBLASLt workspace (allocated at creation);
 *  - the attention's split-KV chunk states (reserve);
 *  - act16, the 16-bit copy of a product's input: max_tokens rows of the
 *    widest input (two halves in bf16x2 mode; with FP8 weights, room for
 *    two e4m3 operands and their scales), and the side stream's own for
 *    steps of up to dual_max tokens;
 *  - the sampler's partials for max_tokens rows (reserve);
 *  - moe_dev, one MoE chunk's rows on the host or device path, and the
 *    experts' pointer tables (cuda_moe_scratch_bytes);
 *  - fp8w, with FP8 weights: the bf16 chunk of dequantized weight rows of
 *    a large product or the K-split partial sums of a small one, each at
 *    most CUDA_FP8_SCRATCH_BYTES (cuda_fp8.cu, cuda_matmul.cu). */
#include "backend/cuda/cuda_backend.h"

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t cuda_op_workspace_bytes(void *ctx, const struct backend_step_shape *s) {
    const struct cuda_ctx *c = ctx;
    long T = s->max_tokens > 0 ? s->max_tokens : 1;
    size_t act16 = round256((size_t)T * (size_t)(s->widest > 0 ? s->widest : 1) * 2 *
                            (size_t)(c->split_act ? 2 : 1));
    /* FP8: two e4m3 operands (the MLP's: its norm's and its SwiGLU's) with
     * their scales, one float per 128 codes, each part 256-byte aligned */
    if (s->fp8_weights) act16 += round256((size_t)T * (size_t)(s->widest > 0 ? s->widest : 1) / 16) + 1024;
    /* the side stream's own act16 (backend_ops.side_begin): its steps only */
    long side_rows = c->side_stream ? (T < c->dual_max ? T : c->dual_max) : 0;
    size_t act16_side = round256((size_t)side_rows * (size_t)(s->widest > 0 ? s->widest : 1) * 2 *
                                 (size_t)(c->split_act ? 2 : 1));
    return c->cublas_ws_bytes + round256(cuda_attention_scratch_bytes(c)) + act16 + act16_side +
           round256(cuda_sample_scratch_bytes(T)) + cuda_moe_scratch_bytes(c, s) +
           (s->fp8_weights ? round256(CUDA_FP8_SCRATCH_BYTES) * (c->side_stream ? 2 : 1) : 0);
}
