/* cuda_prefill_tiles.cuh — which query tile a prefill-attention CTA owns.
 * Shared by the tensor-core prefill kernels (fa_prefill_kernel in
 * cuda_attention.cu, hopper_attn_kernel in hopper/attn_prefill.cu). */
#ifndef KILN_BACKEND_CUDA_PREFILL_TILES_CUH
#define KILN_BACKEND_CUDA_PREFILL_TILES_CUH

#include <stdint.h>

/* The query tiles of BM rows of every sequence with more than one new token
 * are numbered in sequence order; CTA y of the grid takes tile
 * gridDim.y − 1 − y (the last first: the sequences' last tiles have the
 * longest rows, so they start first). Sets *seq and *tile (the tile's index
 * within its sequence) and returns true, or returns false for a surplus
 * CTA (the grid is sized by an upper bound). Every one of the CTA's THREADS
 * threads calls it (it synchronizes); sc_warp[THREADS / 32] and found[2]
 * are the caller's shared memory. A block-wide prefix sum over the tile
 * counts of THREADS sequences at a time. */
template <int THREADS, int BM>
static __device__ __forceinline__ bool prefill_tile_of(const int32_t *q_start, int n_seqs,
                                                       int *sc_warp, int *found, int *seq,
                                                       int *tile) {
    constexpr int WARPS = THREADS / 32;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int target = (int)(gridDim.y - 1 - blockIdx.y);
    if (tid == 0) found[0] = -1;
    int before = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += THREADS) {
        int s = s0 + tid, cnt = 0;
        if (s < n_seqs) {
            int ql = q_start[s + 1] - q_start[s];
            cnt = ql > 1 ? (ql + BM - 1) / BM : 0;
        }
        int x = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) sc_warp[warp] = x;
        __syncthreads();
        int pre = 0, total = 0;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            pre += w < warp ? sc_warp[w] : 0;
            total += sc_warp[w];
        }
        int incl = before + pre + x;
        if (cnt > 0 && target >= incl - cnt && target < incl) found[0] = s, found[1] = target - (incl - cnt);
        before += total;
        __syncthreads();
        if (found[0] >= 0) break;
    }
    if (found[0] < 0) return false;
    *seq = found[0];
    *tile = found[1];
    return true;
}

#endif
