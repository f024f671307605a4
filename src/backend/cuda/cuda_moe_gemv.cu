/* cuda_moe_gemv.cu — the experts' products of a MoE layer when every expert
 * gets only a few rows (decode): a grouped GEMV, one weight stream per
 * expert touched, at the copy bandwidth.
 *
 * The rows come sorted by expert with the device tile list of cuda_moe.cu
 * (expert, first sorted row, rows <= NR), as for the mma.sync grouped
 * product (cuda_gemm_small.cu). That one stages 64×64 weight tiles in
 * shared memory for up to 64 rows a tile; with one to a few rows per expert
 * its weight stream runs at about half the bandwidth (too few bytes in
 * flight per SM, a tail of half-empty waves). Here a warp owns R output
 * features ("units") of one tile and reads their weight rows straight from
 * global memory, 16 bytes per lane, U steps of every row issued before the
 * first is used (U·R·G independent loads in flight per lane); each weight
 * piece serves every row of the tile from registers.
 *
 *  - gate|up (G = 2): unit u is gate row u and up row u of the expert; the
 *    activations are the fp32 token rows (sorted row p reads x row
 *    order[p] / top_k: no gather), the epilogue adds the experts' gate
 *    and up biases and writes the activation (silu(g)·u or the clamped
 *    SwiGLU, cuda_moe_act.cuh) in the weights' 16-bit type, the down
 *    product's operand (as the mma path's epilogue);
 *  - down (G = 1): 16-bit activations h [sorted rows][inter], fp32 output
 *    [sorted rows][hidden] plus the down bias, which moe_combine_kernel
 *    sums per token.
 *
 * Sums: each (unit, row) runs pieces in ascending order per lane, then a
 * fixed butterfly over the lanes, whatever the tile's row count, so a row's
 * value does not depend on the other rows of its tile.
 *
 * Programmatic dependent launch: the tile list is written by the kernel
 * before, so every CTA waits first; CTAs past the list's device count
 * return at once (the grid is sized by a bound). */
#include <stdint.h>

#include "backend/cuda/cuda_moe_act.cuh"

namespace {

constexpr int MG_WARPS = 4;
constexpr int MG_THREADS = 32 * MG_WARPS;
/* 16-byte steps per row loaded ahead. U = 4 with one unit a warp for
 * gate|up and two for down measured best on an H100 (Qwen3-30B-A3B batch-1
 * decode 3.67 ms/step, DeepSeek-V2-Lite 3.25): U = 8, or twice the units
 * a warp, gave 3.71-3.77 and 3.26-3.29. */
constexpr int MG_U = 4;

/* 8 activations at column 8·v of a row: fp32 rows (two 16-byte loads) or
 * 16-bit rows of the weights' type (one). Ordinary loads: the rows were
 * written by the kernels before (cuda_pdl.cuh, rule 2). */
template <typename T>
__device__ __forceinline__ void load_act8(const float *row, long v, float *xv) {
    float4 a = ((const float4 *)(row + v * 8))[0], b = ((const float4 *)(row + v * 8))[1];
    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
    xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load_act8(const T *row, long v, float *xv) {
    uint4 p = ((const uint4 *)row)[v];
    widen8(p, xv, (const T *)0);
}


/* T: the weights' 16-bit type; XT: the activations' (float or T); G = 2:
 * gate|up with the SwiGLU epilogue into y (T), G = 1: y fp32; NR: the most
 * rows a tile has; R: units per warp. */
template <typename T, typename XT, int G, int NR, int R>
__global__ void __launch_bounds__(MG_THREADS)
moe_gemv_kernel(void *y, long ldy, const XT *x, long ldx, const int32_t *order, int top_k,
                const void *const *w_a, const void *const *w_b, const int4 *tiles,
                const int *n_tiles, long units, long cols, struct moe_epi ep) {
    constexpr int RG = R * G;
    pdl_trigger();
    pdl_wait();
    if ((int)blockIdx.y >= *n_tiles) return;
    const int4 t = tiles[blockIdx.y];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long u0 = ((long)blockIdx.x * MG_WARPS + warp) * R;
    if (u0 >= units) return;
    const int m = t.z;
    const T *wa = (const T *)w_a[t.x];
    const T *wb = G == 2 ? (const T *)w_b[t.x] : wa;
    const uint4 *wr[RG];
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r < units ? u0 + r : units - 1; /* past the end: re-read the last; not stored */
        wr[r * G] = (const uint4 *)(wa + u * cols);
        if (G == 2) wr[r * G + 1] = (const uint4 *)(wb + u * cols);
    }
    const XT *xr[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) {
        int p = t.y + (j < m ? j : m - 1);
        long row = order ? order[p] / top_k : p;
        xr[j] = x + row * ldx;
    }
    float acc[RG][NR];
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[q][j] = 0.0f;

    const long nvec = cols / 8;
    for (long v0 = lane; v0 < nvec; v0 += 32 * MG_U) {
        uint4 wv[MG_U][RG];
#pragma unroll
        for (int s = 0; s < MG_U; s++) {
            long v = v0 + 32 * s;
#pragma unroll
            for (int q = 0; q < RG; q++)
                wv[s][q] = v < nvec ? ptx_ld_stream_v4(wr[q] + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < MG_U; s++) {
            long v = v0 + 32 * s;
            if (v >= nvec) break;
            float wf[RG][8];
#pragma unroll
            for (int q = 0; q < RG; q++) widen8(wv[s][q], wf[q], (const T *)0);
#pragma unroll
            for (int j = 0; j < NR; j++) {
                if (j >= m) break;
                float xv[8];
                load_act8<T>(xr[j], v, xv);
#pragma unroll
                for (int q = 0; q < RG; q++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[q][j] = fmaf(wf[q][e], xv[e], acc[q][j]);
            }
        }
    }
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[q][j] = warp_sum(acc[q][j]);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r;
        if (u >= units) break;
#pragma unroll
        for (int j = 0; j < NR; j++) {
            if (j >= m) break;
            long p = t.y + j;
            if (G == 2)
                store16((T *)y + p * ldy + u, moe_glu_f32(ep, t.x, u, units, acc[r * 2][j], acc[r * 2 + 1][j]));
            else
                ((float *)y)[p * ldy + u] = moe_down_f32(ep, t.x, u, units, acc[r][j]);
        }
    }
}

template <typename T, typename XT, int G, int NR, int R>
void launch_mg(struct cuda_ctx *c, void *y, long ldy, const XT *x, long ldx, const int32_t *order,
               int top_k, const void *const *w_a, const void *const *w_b, const int4 *tiles,
               const int *n_tiles, long max_tiles, long units, long cols, const struct moe_epi &ep) {
    unsigned gx = (unsigned)((units + MG_WARPS * R - 1) / (MG_WARPS * R));
    pdl_launch(c, moe_gemv_kernel<T, XT, G, NR, R>, dim3(gx, (unsigned)max_tiles), dim3(MG_THREADS), 0,
               y, ldy, x, ldx, order, top_k, w_a, w_b, tiles, n_tiles, units, cols, ep);
}

template <typename T, int NR>
void moe_gemv_pair(struct cuda_ctx *c, void *h, const float *x, long H, long F, const int32_t *order,
                   int top_k, void *const *tab, long E, const int4 *tiles, const int *n_tiles,
                   long max_tiles, float *out, const struct moe_epi &ep) {
    launch_mg<T, float, 2, NR, 1>(c, h, F, x, H, order, top_k, (const void *const *)tab,
                                  (const void *const *)(tab + E), tiles, n_tiles, max_tiles, F, H, ep);
    launch_mg<T, T, 1, NR, 2>(c, out, H, (const T *)h, F, NULL, 1, (const void *const *)(tab + 2 * E), NULL,
                              tiles, n_tiles, max_tiles, H, F, ep);
}

} // namespace

extern "C" int cuda_moe_gemv_ok(long hidden, long inter, const float *x) {
    return hidden % 8 == 0 && inter % 8 == 0 && (uintptr_t)x % 16 == 0;
}

extern "C" void cuda_moe_gemv(struct cuda_ctx *c, enum dtype dt, int tile_rows, void *h, float *out,
                              const float *x, long H, long F, const int32_t *order, int top_k,
                              void *const *tab, long E, const void *tiles, const int *n_tiles,
                              long max_tiles, const struct moe_experts *e) {
    const int4 *tl = (const int4 *)tiles;
    const struct moe_epi ep = moe_epi_of(e);
    if (max_tiles <= 0) return;
    CUDA_ASSERT(tile_rows == 1 || tile_rows == 4 || tile_rows == 8);
#define MG_CASE(NR)                                                                                \
    do {                                                                                           \
        if (dt == DTYPE_BF16)                                                                      \
            moe_gemv_pair<__nv_bfloat16, NR>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles,      \
                                             max_tiles, out, ep);                                  \
        else                                                                                       \
            moe_gemv_pair<__half, NR>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, \
                                      out, ep);                                                    \
    } while (0)
    if (tile_rows == 1) MG_CASE(1);
    else if (tile_rows == 4) MG_CASE(4);
    else MG_CASE(8);
#undef MG_CASE
}
