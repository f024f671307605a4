/* attn_prefill.cu — prefill attention on Hopper tensor cores (wgmma,
 * sm_90a): the rows of sequences with more than one new token, bf16 paged
 * KV cache, head sizes dk × dv = 128 × 128 (ordinary attention) and
 * 192 × 128 (MLA in the MHA form: [k_nope 128 | k_rope 64] keys, 128-wide
 * values), template parameters DK and DV. Same contract and the same batch invariance as
 * fa_prefill_kernel in cuda_attn_prefill.cu (read its header first),
 * sliding windows and attention sinks included; this one replaces
 * mma.sync with warpgroup MMAs and moves Q to shared memory.
 *
 * Work split. One CTA of 256 threads (two warpgroups) per (query tile of
 * HA_BM = 128 rows of one sequence, query head); warpgroup w owns rows
 * 64w .. 64w + 63 and, inside it, warp w' of the group rows 16w' .. +15
 * (the wgmma accumulator layout). Tiles are taken longest first (the last
 * query tile of the last sequence has blockIdx.y = 0), heads of one KV head
 * are neighbours in blockIdx.x (the K/V tiles they share stay in L2).
 *
 * Per KV tile of HA_BN = 128 positions (aligned to position 0):
 *   S  = Q·Kᵀ   DK/16 × wgmma.m64n128k16, A = Q (bf16, shared), B = K tile (shared)
 *   online softmax on S in fp32 registers (exp2; masked only on tiles that
 *   cross a row's position), P rounded to bf16 in registers
 *   O += P·V    8 × wgmma.m64n128k16, A = P (registers), B = V tile (shared,
 *   read transposed: V is [position][d], the MMA wants B's N = d)
 * The tiles are gathered from the pages with cp.async (16-byte chunks; the
 * copy of tile j+1 is issued before tile j is computed) straight into the
 * layout wgmma reads: "128-byte swizzle", rows of 64 bf16 (128 bytes), a
 * 128-wide tile as two 64-column blocks (192-wide: three), chunk c of row r stored at chunk
 * c ^ (r % 8) of its row; each 8-row group is a 1024-byte atom. The same
 * layout serves K (K-major B: N = position rows, K = d along the row) and V
 * (MN-major B: K = position rows, N = d along the row), so one loader fills
 * both.
 *
 * Shared-memory matrix descriptors (PTX ISA, "matrix descriptor"): bits
 * 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride
 * byte offset >> 4, 62-63 swizzle (1 = 128 B). K-major operands (Q, K):
 * stride = 1024 (next 8-row group), leading unused (the 16-element K step
 * lies inside one 128-byte row); K step ks advances the start by 32 bytes
 * inside the atom (the hardware applies the XOR to the final address) and
 * by a whole 64-column block every 4 steps. MN-major V: leading = the
 * distance between the two 64-column blocks (N direction), stride = 1024
 * (next 8 positions, K direction); K step kk (16 positions) advances the
 * start by 16 rows = 2048 bytes.
 *
 * Register layouts (PTX ISA, wgmma fragments): the fp32 accumulator of
 * m64nN gives thread (warp w', lane l) rows 16w' + l/4 (elements 0, 1 of
 * each 8-column group j, columns 8j + 2(l%4) + {0, 1}) and that row + 8
 * (elements 2, 3) — the mma.sync m16n8 layout repeated along N; the bf16 A
 * fragment of a k16 step is the mma.sync m16n8k16 A fragment. So P's A
 * fragment for positions 16kk .. 16kk + 15 is packed from S's column
 * groups 2kk and 2kk + 1 without any data movement (as in FlashAttention-2).
 *
 * Schedule: S_j, wait, softmax_j, O·corr_j, O += P_j·V_j, wait (2 stages),
 * one __syncthreads per tile: after it, every thread has finished the tile
 * whose stage the next copy overwrites. FA3's intra-warpgroup overlap
 * (S_j and P_{j−1}·V_{j−1} in flight together, 3 stages) measured slower
 * on an H100 (one layer of Llama-3.1-8B at 8192 tokens, bench_attention:
 * 1.46 ms against 1.38): the two warpgroups of a CTA already overlap each
 * other's softmax and products.
 *
 * Batch invariance (as fa_prefill_kernel): KV tiles are aligned to
 * absolute position 0, a row's arithmetic uses only its own q, positions
 * and cache rows (wgmma computes each output row from its own A row), and a
 * tile past a row's position is an exact no-op for it (max unchanged,
 * corr = 2^0 = 1, p = 2^-inf = 0). So a row's result does not depend on its
 * query tile, the chunking of its prompt or the rest of the batch. */
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/hopper/attn_prefill.h"
#include "backend/cuda/cuda_prefill_tiles.cuh"
#include "backend/cuda/hopper/ptx.cuh"

using namespace hopper;

enum {
    HA_BM = 128, /* query rows per CTA (64 per warpgroup) */
    HA_BN = 128, /* KV positions per tile */
    HA_THREADS = 256,
    HA_WARPS = HA_THREADS / 32,
    HA_STAGES = 2,
};
/* bytes of one 64-column block of a KV tile / of the Q tile */
static constexpr uint32_t HA_KBLOCK = HA_BN * 128;
static constexpr uint32_t HA_QBLOCK = HA_BM * 128;

/* Tiles of a head shape: Q (DK wide), K (DK wide) and V (DV wide), bytes.
 * DK 192: 48 KiB of Q and 2 stages of 80 KiB of K and V, 209 KiB of the
 * 227 an H100 CTA may have. */
template <int DK, int DV> struct ha_shape {
    static_assert(DK % 64 == 0 && DV == 128, "head sizes: dk a multiple of 64, dv 128");
    static constexpr uint32_t QTILE = DK / 64 * HA_QBLOCK;
    static constexpr uint32_t KTILE = DK / 64 * HA_KBLOCK;
    static constexpr uint32_t VTILE = DV / 64 * HA_KBLOCK;
    static constexpr uint32_t STAGE = KTILE + VTILE;
    static constexpr size_t SMEM = (size_t)QTILE + (size_t)HA_STAGES * STAGE + 1024; /* + alignment */
};

/* Byte offset of 16-byte chunk c (0 .. width/8 - 1) of row r in a swizzled tile
 * whose 64-column blocks are `block` bytes apart. */
static __device__ __forceinline__ uint32_t swz(int r, int c, uint32_t block) {
    return (uint32_t)(c >> 3) * block + (uint32_t)r * 128 + ((uint32_t)((c & 7) ^ (r & 7)) << 4);
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
/* S = Q·Kᵀ for the warpgroup's 64 rows × 128 positions: DK/16 K steps of
 * 16. dq, dk: descriptors of the warpgroup's Q rows and of the K tile. */
template <int DK>
static __device__ __forceinline__ void ha_qk(float (&s)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
        uint32_t oq = (uint32_t)(ks >> 2) * HA_QBLOCK + (uint32_t)(ks & 3) * 32;
        uint32_t ok = (uint32_t)(ks >> 2) * HA_KBLOCK + (uint32_t)(ks & 3) * 32;
        wgmma_ss<false>(s, dq + (oq >> 4), dk + (ok >> 4), ks > 0);
    }
}

/* O += P·V: 8 K steps of 16 positions; dv: descriptor of the V tile. */
static __device__ __forceinline__ void ha_pv(float (&o)[64], const uint32_t (&p)[8][4], uint64_t dv) {
#pragma unroll
    for (int kk = 0; kk < HA_BN / 16; kk++) wgmma_rs_tb(o, p[kk], dv + (uint64_t)((kk * 16 * 128) >> 4));
}

/* Online softmax of one S tile (rows a and b of this thread), in place:
 * masks the positions past each row's own and before its window's first
 * (la, lb; only when `mask`: the tile crosses such an edge of a row of
 * this warp), updates the running max m and the per-thread partial sum l,
 * leaves the probabilities in s and returns the factors that rescale O. A
 * row with nothing in view yet keeps m = −inf and takes 0 as its
 * reference (p and corr 0, not NaN). Column of element e of group j:
 * kpos0 + 8j + (e & 1), kpos0 = tile start + 2(l%4). */
static __device__ __forceinline__ void ha_softmax(float (&s)[64], float &m_a, float &m_b, float &l_a,
                                                  float &l_b, float &corr_a, float &corr_b, bool mask,
                                                  int kpos0, int pa, int pb, int la, int lb,
                                                  float scale) {
    if (mask) {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int kp = kpos0 + 8 * j + (e & 1);
                if (kp > (e < 2 ? pa : pb) || kp < (e < 2 ? la : lb)) s[4 * j + e] = -INFINITY;
            }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        mx_a = fmaxf(mx_a, fmaxf(s[4 * j], s[4 * j + 1]));
        mx_b = fmaxf(mx_b, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    /* scale > 0: max(s)·scale is the max of the scaled scores */
    float mn_a = fmaxf(m_a, mx_a * scale), mn_b = fmaxf(m_b, mx_b * scale);
    const float new_a = mn_a, new_b = mn_b;
    if (mn_a == -INFINITY) mn_a = 0.0f; /* nothing in view yet (window): reference 0 */
    if (mn_b == -INFINITY) mn_b = 0.0f;
    corr_a = ptx_ex2(m_a - mn_a), corr_b = ptx_ex2(m_b - mn_b); /* 0 on the first tile (m = -inf) */
    m_a = new_a, m_b = new_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        s[4 * j] = ptx_ex2(fmaf(s[4 * j], scale, -mn_a));
        s[4 * j + 1] = ptx_ex2(fmaf(s[4 * j + 1], scale, -mn_a));
        s[4 * j + 2] = ptx_ex2(fmaf(s[4 * j + 2], scale, -mn_b));
        s[4 * j + 3] = ptx_ex2(fmaf(s[4 * j + 3], scale, -mn_b));
        sum_a += s[4 * j] + s[4 * j + 1];
        sum_b += s[4 * j + 2] + s[4 * j + 3];
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
}

/* P (fp32, the S accumulator layout) → bf16 A fragments of the P·V product:
 * the fragment of K step kk is column groups 2kk and 2kk + 1. */
static __device__ __forceinline__ void ha_pack(uint32_t (&p)[8][4], const float (&s)[64]) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
        p[j >> 1][(j & 1) * 2 + 0] = pack_bf16(s[4 * j], s[4 * j + 1]);
        p[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
    }
}

template <int DK, int DV>
static __global__ void __launch_bounds__(HA_THREADS, 1)
    hopper_attn_kernel(const __grid_constant__ struct hopper_attn_args a) {
    using SH = ha_shape<DK, DV>;
    extern __shared__ uint8_t ha_smem[];
    __shared__ int sc_warp[HA_WARPS], found[2], pos_s[1];
    /* swizzle atoms must be 1024-byte aligned (the descriptors' base offset is 0) */
    uint32_t q_s = ((uint32_t)__cvta_generic_to_shared(ha_smem) + 1023u) & ~1023u;
    uint32_t kv_s = q_s + SH::QTILE; /* stage st: K tile at kv_s + st·STAGE, V after it */

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int h = blockIdx.x, g = h / a.group;
    int s, tile; /* which (sequence, query tile) this CTA owns */
    if (!prefill_tile_of<HA_THREADS, HA_BM>(a.q_start, a.n_seqs, sc_warp, found, &s, &tile)) return;
    long r0 = a.q_start[s] + (long)tile * HA_BM;
    int nrows = min(HA_BM, (int)(a.q_start[s + 1] - r0));
    if (tid == 0) pos_s[0] = a.positions[r0 + nrows - 1] + 1; /* rows are in position order */
    const int32_t *pages = a.kv_pages + a.kv_page_start[s];
    const __nv_bfloat16 *kbase = (const __nv_bfloat16 *)a.k_cache + (long)g * DK;
    const __nv_bfloat16 *vbase = (const __nv_bfloat16 *)a.v_cache + (long)g * DV;

    /* this thread's rows (accumulator rows l/4 and l/4 + 8 of its warp) */
    int ra = warp * 16 + (lane >> 2), rb = ra + 8;
    int pa = a.positions[r0 + min(ra, nrows - 1)], pb = a.positions[r0 + min(rb, nrows - 1)];
    /* sliding window: row a sees la..pa, row b lb..pb */
    int la = a.window > 0 ? pa - a.window + 1 : 0, lb = a.window > 0 ? pb - a.window + 1 : 0;
    int wmin = min(pa, pb), wlo = max(la, lb);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
        wlo = max(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    }
    /* the CTA's first position: its first row's window start (rows are in
     * position order); tiles before it are skipped, its earlier positions
     * zero-filled and masked */
    const int p_first = a.positions[r0];
    const int kv_lo = a.window > 0 && p_first + 1 > a.window ? p_first + 1 - a.window : 0;
    const int kt0 = kv_lo / HA_BN;
    __syncthreads();
    int kv_end = pos_s[0];
    int n_tiles = (kv_end + HA_BN - 1) / HA_BN;

    /* Tile loads: iteration it of warp w copies rows 16·it + 2w + {0, 1}
     * (lanes 0-15, 16-31), 16-byte chunks c, c + 16, ... of K (DK/8 per
     * row) and of V (DV/8) per lane. Lanes 0-15 look the 16 rows' slots up
     * once and shuffle them out. */
    auto load_tile = [&](int st, int kt) {
        long long my_slot = -1;
        if (lane < 16) {
            int p = kt * HA_BN + (lane >> 1) * 16 + warp * 2 + (lane & 1);
            if (p < kv_end && p >= kv_lo)
                my_slot = (long long)pages[p / a.page_size] * a.page_size + p % a.page_size;
        }
        uint32_t kd = kv_s + (uint32_t)st * SH::STAGE, vd = kd + SH::KTILE;
        int c = lane & 15;
#pragma unroll
        for (int it = 0; it < HA_BN / 16; it++) {
            long long slot = __shfl_sync(0xffffffffu, my_slot, it * 2 + (lane >> 4));
            bool valid = slot >= 0;
            if (!valid) slot = 0; /* zero-filled: finite, and masked anyway */
            int row = it * 16 + warp * 2 + (lane >> 4);
#pragma unroll
            for (int cc = c; cc < DK / 8; cc += 16)
                ptx_cp_async16_zfill(kd + swz(row, cc, HA_KBLOCK), kbase + slot * a.k_stride + cc * 8, valid);
#pragma unroll
            for (int cc = c; cc < DV / 8; cc += 16)
                ptx_cp_async16_zfill(vd + swz(row, cc, HA_KBLOCK), vbase + slot * a.v_stride + cc * 8, valid);
        }
    };
    load_tile(0, kt0);
    ptx_cp_async_commit();

    /* Q → bf16 → the swizzled Q tile (rows past the tile: zeros) */
#pragma unroll
    for (int it = 0; it < HA_BM / 16; it++) {
        int r = it * 16 + warp * 2 + (lane >> 4);
#pragma unroll
        for (int c = lane & 15; c < DK / 8; c += 16) {
            uint4 pk = make_uint4(0, 0, 0, 0);
            if (r < nrows) {
                const float4 *src = (const float4 *)(a.q + (r0 + r) * a.ldq + (long)h * DK + c * 8);
                float4 x = src[0], y = src[1];
                pk = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y),
                                pack_bf16(y.z, y.w));
            }
            ptx_st_shared_v4(q_s + swz(r, c, HA_QBLOCK), pk);
        }
    }

    int wg = warp >> 2;
    const uint64_t dq = desc_sw128(q_s + (uint32_t)wg * 64 * 128, 16, 1024);
    auto desc_k = [&](int st) { return desc_sw128(kv_s + (uint32_t)st * SH::STAGE, 16, 1024); };
    auto desc_v = [&](int st) {
        return desc_sw128(kv_s + (uint32_t)st * SH::STAGE + SH::KTILE, HA_KBLOCK, 1024);
    };

    float oacc[64], sacc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) oacc[i] = 0.0f, sacc[i] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f, corr_a, corr_b;
    const float scale = a.scale_log2;
    const int col0 = 2 * (lane & 3);
    uint32_t p[8][4];

    for (int kt = kt0; kt < n_tiles; kt++) {
        ptx_cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile kt (and Q) landed; everyone is done with tile kt - 1 */
        if (kt + 1 < n_tiles) {
            load_tile((kt + 1 - kt0) % HA_STAGES, kt + 1);
            ptx_cp_async_commit();
        }
        int st = (kt - kt0) % HA_STAGES;
        wgmma_fence();
        ha_qk<DK>(sacc, dq, desc_k(st));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sacc);
        ha_softmax(sacc, m_a, m_b, l_a, l_b, corr_a, corr_b,
                   kt * HA_BN + HA_BN - 1 > wmin || kt * HA_BN < wlo, kt * HA_BN + col0, pa, pb, la,
                   lb, scale);
        ha_pack(p, sacc);
#pragma unroll
        for (int i = 0; i < 64; i++) oacc[i] *= (i & 2) ? corr_b : corr_a;
        fence_regs(oacc);
        wgmma_fence();
        ha_pv(oacc, p, desc_v(st));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(oacc);
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    /* a sink (log2 domain, as the scores) joins each row's sum once, here */
    if (a.sinks) {
        const float sk = __fmul_rn(a.sinks[h], 1.4426950408889634f);
        l_a += exp2f(sk - m_a), l_b += exp2f(sk - m_b);
    }
    float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
    float *oa = a.out + (r0 + ra) * a.ldo + (long)h * DV + col0;
    float *ob = a.out + (r0 + rb) * a.ldo + (long)h * DV + col0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        if (ra < nrows) *(float2 *)(oa + 8 * j) = make_float2(oacc[4 * j] * inv_a, oacc[4 * j + 1] * inv_a);
        if (rb < nrows) *(float2 *)(ob + 8 * j) = make_float2(oacc[4 * j + 2] * inv_b, oacc[4 * j + 3] * inv_b);
    }
}

template <int DK, int DV>
static void ha_launch(const struct hopper_attn_args *a, unsigned tiles, cudaStream_t stream) {
    size_t smem = ha_shape<DK, DV>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(hopper_attn_kernel<DK, DV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)a->n_heads, tiles);
    hopper_attn_kernel<DK, DV><<<grid, HA_THREADS, smem, stream>>>(*a);
    CUDA_CHECK_LAUNCH();
}

extern "C" int cuda_hopper_attn_prefill_shape(int dk, int dv) {
    return (dk == 128 || dk == 192) && dv == 128;
}

extern "C" void cuda_hopper_attn_prefill(const struct hopper_attn_args *a, int n_tokens,
                                         cudaStream_t stream) {
    /* Query tiles over the sequences with more than one new token: at most
     * ⌈T/BM⌉ + S and at most 2(T−S)/BM + (T−S) + 1 (fa_prefill_kernel's
     * bound); surplus CTAs find no tile and return. */
    long T = n_tokens, S = a->n_seqs;
    long bound1 = (T + HA_BM - 1) / HA_BM + S, bound2 = (2 * (T - S) + HA_BM - 1) / HA_BM + (T - S) + 1;
    long tiles = bound1 < bound2 ? bound1 : bound2;
    CUDA_ASSERT(tiles <= 65535);
    if (tiles <= 0) return;
    CUDA_ASSERT_MSG(cuda_hopper_attn_prefill_shape(a->dk, a->dv), "hopper attention: head shape");
    if (a->dk == 192) ha_launch<192, 128>(a, (unsigned)tiles, stream);
    else ha_launch<128, 128>(a, (unsigned)tiles, stream);
}
