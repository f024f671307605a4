/* gemm_wgmma.cuh — what the two products of hopper/ share (CUDA C++,
 * included by gemm_wgmma.cu and gemm_fp8.cu only): the epilogue's rope and
 * K/V-store parameters, the e4m3 product's scales, and the launcher of the
 * FP8 product of prefill-sized row counts (gemm_fp8.cu), which
 * gemm_wgmma.cu's entry points call with the tensor maps they keep. */
#ifndef KILN_BACKEND_CUDA_HOPPER_GEMM_WGMMA_CUH
#define KILN_BACKEND_CUDA_HOPPER_GEMM_WGMMA_CUH

#include <cuda.h> /* CUtensorMap (header only) */
#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"

namespace hopper {

/* Rope + KV store in the epilogue of the stacked q|k|v product
 * (cos_sin NULL: off). Tiles are 128 columns = one head of 128. */
struct wg_rope {
    const int32_t *pos, *slots;
    const float *cos_sin; /* [position][64][2]: cos, sin of pair i of head size 128 */
    __nv_bfloat16 *kc, *vc; /* elements of the cache type: bf16, or e4m3 where fp8 */
    long kv_stride;
    int nq, nk; /* query and key heads: tiles [0, nq), [nq, nq + nk), then value heads */
    int fp8;    /* the FP8 cache: e4m3 of x / k_scale (v_scale), as kv_store */
    float k_scale, v_scale;
};

/* The scales of an e4m3 product: the weight's, one per 128 × 128 block
 * ([row block][nbc]), and the activations', one per row and 128 columns
 * ([column group][M], cuda_fp8_quant_act's layout). */
struct wg_fp8 {
    const float *wsc, *xsc;
    int nbc;
};

/* The FP8 product of many rows (gemm_fp8.cu): activation tiles of
 * FP8_ROWS_BM_SMALL or FP8_ROWS_BM_LARGE rows (two or three consumer
 * warpgroups), so the activations' map has boxes of that many rows (the
 * weight's: 128). */
enum { FP8_ROWS_BM_SMALL = 128, FP8_ROWS_BM_LARGE = 192 };
/* once per context: the kernels' shared-memory size */
void fp8_rows_setup();
/* The tiles of an M × N product on bm-row tiles (the launch's measure of work). */
static inline long fp8_rows_tiles(long M, long N, int bm) {
    return (M + bm - 1) / bm * ((N + 127) / 128);
}
/* y[M][N] (row stride ldy, 8-byte aligned with ldy even) = the product of
 * the e4m3 activations (map tx, boxes of bm rows) and weight (map tw) of
 * nk 128-column blocks, scales f8, + bias; with rp.cos_sin, q|k|v's rope
 * and K/V stores instead of y for key and value heads (gemm_wgmma.cu's
 * epilogue). */
void fp8_rows_launch(struct cuda_ctx *c, int bm, const CUtensorMap *tw, const CUtensorMap *tx, float *y,
                     long ldy, const float *bias, int M, int N, int nk, const wg_rope &rp,
                     const wg_fp8 &f8);

} // namespace hopper

#endif
