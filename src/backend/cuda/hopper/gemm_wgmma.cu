/* gemm_wgmma.cu — y[m][n] = x16[m][:] · w[n][:] (+ bias[n]) for a few
 * activation rows (batched decode: 1..64 rows), 16-bit weights W[N][K] and
 * activations X[M][K] in the weights' type (bf16 or f16), fp32 accumulation
 * and output (row stride ldy). Hopper only (sm_90a: wgmma, TMA, clusters).
 * On by default for weights of at least 40 MiB, and for the output
 * projection after the decode attention from 16 MiB (KILN_CUDA_WGMMA=0:
 * off): faster than cuBLASLt product by product on the H100; under graphs
 * the 64-sequence Llama-3.1-8B decode step gained 4% with q|k|v, gate|up,
 * down and lm_head on it, and 2.8% more with o_proj too once the K splits
 * were planned with headroom (docs/cuda-decode.md).
 *
 * Why: at 16..64 rows the product is bound by reading W once (M·N·K·2 flops
 * against N·K·2 bytes: at most 64 flops a byte, the H100 has ~300), yet
 * cuBLAS(Lt) reaches 46..83% of the copy bandwidth on Llama-3.1-8B's shapes
 * (docs/cuda-decode.md). An mma.sync kernel (the one cuda_gemm_small.cu
 * keeps for the MoE experts) re-read the activations from shared memory
 * for every 16 weight rows and ran short of bandwidth past 16 rows.
 *
 * Design:
 *  - wgmma m64n128k16 with the ACTIVATIONS as operand A (64 rows, M padded
 *    to 64 by TMA's zero fill) and BN = 128 or 256 WEIGHT rows as operand B
 *    (one or two n128 instructions per k16): each weight byte is read from
 *    shared memory once per k-step, the activations once per 128 weight
 *    rows. Both tiles are K-major with 128-byte swizzle, BK = 64 columns
 *    (one 128-byte swizzle atom) per stage. Accumulators: fp32 registers of
 *    one consumer warpgroup (64 per n128 block per thread).
 *  - One producer warp (one lane) streams the W and X tiles of each k-step
 *    with TMA (cp.async.bulk.tensor) into a STAGES-deep ring of shared
 *    memory, each stage guarded by a "full" mbarrier (the copy engine
 *    completes its byte count) and an "empty" one (each consumer warp
 *    arrives once its wgmmas of that stage have finished reading it). The
 *    tensor cores need ~1/5 of the time the weight stream takes, so the
 *    consumers wait for every stage's wgmmas before releasing it (no
 *    overlap needed) and the point is only to keep the ring full: 96 KB
 *    (BN = 128, two CTAs an SM) or 200 KB (BN = 256, one) per SM.
 *  - BN = 128 by default (two CTAs an SM; cuda_wgmma_run takes 256 for
 *    measurements): measured on the H100 it was as fast or faster on every
 *    Llama-3.1-8B shape but o_proj at 64 rows (docs/cuda-decode.md).
 *  - Grid (N tiles, S): K is split into S ranges of whole k-steps, S the
 *    largest (≤ 8) that keeps tiles × S CTAs resident at once (one wave, as
 *    cudaOccupancyMaxActiveClusters counts them: all CTAs share the memory
 *    bandwidth and finish together) and ≥ 8 k-steps a split (each CTA pays
 *    a pipeline ramp and the reduction). The S CTAs of a tile form
 *    a thread-block cluster (1, S, 1); each writes its fp32 partial tile
 *    into its own shared memory and, after a cluster barrier, CTA r adds
 *    the S partials of its share of the tile in split order 0..S-1 through
 *    distributed shared memory, adds the bias and stores y. No global
 *    round trip, no atomics: the bits do not depend on the schedule.
 *    S = 1 stores from the same shared-memory staging (coalesced rows).
 *  - TMA descriptors (CUtensorMap, passed by value as __grid_constant__):
 *    the weight's is cached per (pointer, shape) — weights never move —
 *    the activations' per (pointer, rows, row stride) in a small ring. The
 *    encoder comes from the driver (hopper/tmap.cuh, also for moe_wgmma.cu)
 *    (no -lcuda).
 *  - Programmatic dependent launch (cuda_pdl.cuh): the producer issues the
 *    weight tiles of the first STAGES k-steps before griddepcontrol.wait
 *    (weights are never written by kernels), the activations after it;
 *    the consumers wait there too (parked, not polling an mbarrier while
 *    the previous kernel runs), every thread before its global stores.
 *    The trigger for the next kernel comes first thing, as in the small
 *    kernels (the next kernel's CTAs land on SMs while this one streams
 *    and prefetch their weight tiles). After the main loop measured the
 *    same until the rope kernel left the step; since then 6.459-6.473
 *    against 6.435-6.438 ms (Llama-3.1-8B, 64 sequences; docs/cuda-decode.md).
 *  - SwiGLU in the epilogue (cuda_wgmma_glu_run, the decode MLP's
 *    gate|up): a tile is BN/2 gate rows and the same BN/2 up rows (two TMA
 *    boxes into the one operand), so each thread holds g and u of the same
 *    columns, and the epilogue writes silu(g)·u in 16 bits — the down
 *    product's operand — instead of 2·inter fp32 columns for a SwiGLU
 *    kernel to read (the same bits: the sums, then silu_mul_f32, then the
 *    rounding). Llama-3.1-8B at 64 sequences: the step 0.2 ms shorter.
 *  - Rope and the K/V-cache stores in the epilogue of the stacked q|k|v
 *    product (cuda_wgmma_rope_run, backend_ops.norm_matmul_rope): with
 *    128-column tiles a tile is one head, so the pairs (c, c + 64) of
 *    half-layout rope are in one thread's reach (as gate and up are for
 *    the SwiGLU); queries go to y rotated, keys and values to their cache
 *    rows in bf16 (e4m3 over the layer scale on the FP8 cache). No
 *    qk_rope_store kernel between the product and the attention:
 *    Llama-3.1-8B at 64 sequences 6.62-6.67 → 6.51 ms.
 *  - FP8 weights (cuda_wgmma_fp8; 128 × 128 blocks): the same kernel with
 *    e4m3 operands. A k-step is one 128-byte row of each tile as before,
 *    now 128 columns (one scale block), run as four m64n128k32 e4m3
 *    wgmmas into a fresh accumulator that is then added to the sums times
 *    the weight block's scale and the row's activation scale (the
 *    DeepGEMM scheme: the tensor cores never add across scale blocks).
 *    The activations arrive in e4m3 per row and 128 columns (from the
 *    norm, the SwiGLU or cuda_fp8_quant_act). Any number of rows: row
 *    tiles of 64 on grid.z; from 256 rows, where its tiles fill the GPU,
 *    the product goes to gemm_fp8.cu's 128- or 192-row tiles instead
 *    (two or three warpgroups on one weight tile: at 2,048 rows 1.2-1.8x
 *    these tiles' rate on Llama-3.1-8B's shapes). BN = 128 only (the
 *    second accumulator).
 *    Llama-3.1-8B at 64 sequences on one H100, one run: 12,538 tok/s
 *    against 6,383 on the mma.sync tile kernel (KILN_CUDA_WGMMA_FP8=0);
 *    with the norm and SwiGLU handoffs and rope in the epilogue 14,016
 *    against 9,989 in bf16 (docs/perf-models.md).
 *  - Only for weights of at least KILN_CUDA_WGMMA_MIN_MB (40) MiB: on
 *    smaller ones (Qwen3-0.6B's layers) the fixed costs (launch, ramp,
 *    cluster reduction) lost to cuBLAS in the measurements under graphs.
 *    The output projection after the decode attention takes it from 16
 *    MiB (cuda_wgmma_attn_out: Llama's o_proj, 32 MiB), since there it
 *    lets the norm after it launch early.
 *  - K splits are planned on 85% of the clusters an empty GPU holds
 *    (WG_FILL): a product launched early under the previous
 *    kernel finds SMs still taken, and a plan that needs every cluster
 *    slot leaves its last clusters waiting for whole GPCs to drain.
 *    Llama-3.1-8B at 64 sequences: 6.61-6.62 ms a step at 75% against
 *    6.78-6.80 at 100% when the products triggered late; with the early
 *    trigger and no rope kernel, 6.37-6.38 at 85% against 6.43-6.47 at 75%
 *    and 6.59-6.60 at 60% (docs/cuda-decode.md).
 * Requirements (cuda_wgmma_ok): K a multiple of 8 (TMA's 16-byte row
 * stride; a K tail inside the last 64 columns is zero-filled on both
 * operands), 16-byte aligned W and X and X's row stride a multiple of 8
 * elements; anything else takes cuBLAS. FP8 (cuda_wgmma_fp8_ok): K a
 * multiple of 128, 128 × 128 blocks, 16-byte aligned codes. */
#include <cuda.h> /* CUtensorMap and its enums (header only; no -lcuda) */
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/hopper/gemm_wgmma.cuh"
#include "backend/cuda/hopper/ptx.cuh"
#include "backend/cuda/hopper/tmap.cuh"

using namespace hopper;

namespace {

constexpr int BK = 64;        /* 16-bit columns per k-step: one 128-byte swizzle atom */
constexpr int BM = 64;        /* activation rows: wgmma's M */
constexpr int CONSUMERS = 128; /* one warpgroup: warps 0..3 */
constexpr int THREADS = CONSUMERS + 32; /* + the producer warp (warp 4) */
constexpr int MAX_SPLIT = 8;  /* portable cluster size */
/* Split plans (docs/cuda-decode.md, measured on an H100 at 64 decode
 * rows): each split keeps at least WG_MIN_STEPS k-steps; a plan takes at
 * most WG_FILL% of the clusters resident on an empty GPU (the headroom lets
 * products launched early start at once); the output projection after the
 * decode attention takes the kernel from WG_OPROJ_BYTES of weight. */
constexpr int WG_MIN_STEPS = 8, WG_FILL = 85;
constexpr long WG_OPROJ_BYTES = 16l << 20;

/* operand types: bf16, f16, or e4m3 with block scales (FP8 weights of 128 ×
 * 128 blocks, activations quantized per row and 128 columns) */
enum { OP_BF16 = 0, OP_F16 = 1, OP_E4M3 = 2 };
/* columns per k-step (one 128-byte row of the operand tiles) */
template <int OP> __host__ __device__ constexpr int bk_of() { return OP == OP_E4M3 ? 128 : BK; }

template <int BN> struct cfg {
    static constexpr int NB = BN / 128;                 /* n128 wgmmas per k16 */
    static constexpr int STAGES = BN == 256 ? 5 : 4;    /* 200 KB / 96 KB ring */
    static constexpr uint32_t W_BYTES = BN * BK * 2;
    static constexpr uint32_t X_BYTES = BM * BK * 2;
    static constexpr uint32_t STAGE_BYTES = W_BYTES + X_BYTES;
    static constexpr int LDP = BN + 8; /* partial tile row, floats: +8 spreads the 8 rows
                                          of a warp's float2 stores over all banks */
    static constexpr uint32_t PART_BYTES = BM * LDP * 4;
    static constexpr uint32_t RING = STAGES * STAGE_BYTES;
    static constexpr uint32_t BAR_OFF = RING > PART_BYTES ? RING : PART_BYTES;
    static constexpr size_t SMEM = 1024 + BAR_OFF + 2 * STAGES * 8; /* +1024: alignment */
};

template <int OP>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
    wgmma_ss<OP == OP_F16>(d, da, db, 1);
}

/* One CTA: the BN weight rows from n0 = blockIdx.x·BN, k-steps
 * [split·nk/S, (split+1)·nk/S) with split = blockIdx.y (= the CTA's rank in
 * its cluster of S), activation rows [64·blockIdx.z, 64·blockIdx.z + 64)
 * (more than one row tile: FP8 products of more than 64 rows).
 * OP_E4M3: each k-step (one 128-column scale block) runs its four k32
 * products into a fresh accumulator, which is then added to the running
 * sums times the weight block's scale and the row's activation scale (the
 * DeepGEMM scheme: fp32 sums, scales applied once a block). */
template <int BN, int OP>
__global__ void __launch_bounds__(THREADS, BN == 128 ? 2 : 1)
wgmma_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx,
             float *y, long ldy, const float *bias, int M, int N, int nk, int S,
             void *y16, long ldy16, int glu, const struct wg_rope rp, const struct wg_fp8 f8) {
    using C = cfg<BN>;
    constexpr int BKE = bk_of<OP>();
    static_assert(OP != OP_E4M3 || BN == 128, "e4m3 tiles are 128 rows");
    extern __shared__ unsigned char smem_raw[];
    /* the dependents may launch first thing: measured 0.02-0.04 ms a
     * decode step better than after the main loop (docs/cuda-decode.md) */
    pdl_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* glu: the tile is BN/2 gate rows from n0 and the same up rows from
     * glu + n0 (glu = inter: W is [gate; up]) */
    const int n0 = blockIdx.x * (glu ? BN / 2 : BN), split = blockIdx.y;
    /* this CTA's row tile: rows [m0, m0 + Mt) */
    const int m0 = (int)blockIdx.z * BM, Mt = M - m0 < BM ? M - m0 : BM;
    const int k0 = (int)((long)split * nk / S), cnt = (int)((long)(split + 1) * nk / S) - k0;
    const uint32_t raw = ptx_smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    float *part = (float *)(smem_raw + (base - raw)); /* [BM][LDP], after the main loop */
    auto full = [&](int s) { return base + C::BAR_OFF + 8u * (uint32_t)s; };
    auto empty = [&](int s) { return base + C::BAR_OFF + 8u * (uint32_t)(C::STAGES + s); };
    auto w_tile = [&](int s) { return base + (uint32_t)s * C::STAGE_BYTES; };
    auto x_tile = [&](int s) { return base + (uint32_t)s * C::STAGE_BYTES + C::W_BYTES; };

    if (tid == 0) {
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), CONSUMERS / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();

    float acc[C::NB][64];
    if (warp == CONSUMERS / 32) {
        /* producer */
        if (lane == 0) {
            prefetch_tensormap(&tw);
            prefetch_tensormap(&tx);
            const uint64_t pol = ptx_policy_evict_first();
            const int pre = cnt < C::STAGES ? cnt : C::STAGES;
            auto load_w = [&](int st, int i) {
                if (glu) { /* two boxes of BN/2 rows: the same layout as one of BN */
                    tma_load_2d_hint(w_tile(st), &tw, full(st), (k0 + i) * BKE, n0, pol);
                    tma_load_2d_hint(w_tile(st) + C::W_BYTES / 2, &tw, full(st), (k0 + i) * BKE,
                                     glu + n0, pol);
                } else {
                    tma_load_2d_hint(w_tile(st), &tw, full(st), (k0 + i) * BKE, n0, pol);
                }
            };
            for (int i = 0; i < pre; i++) {
                mbar_arrive_tx(full(i), C::STAGE_BYTES);
                load_w(i, i);
            }
            pdl_wait(); /* the activations come from the previous kernel */
            for (int i = 0; i < pre; i++) tma_load_2d(x_tile(i), &tx, full(i), (k0 + i) * BKE, m0);
            for (int i = pre; i < cnt; i++) {
                const int s = i % C::STAGES;
                mbar_wait(empty(s), (uint32_t)((i / C::STAGES) & 1) ^ 1u);
                mbar_arrive_tx(full(s), C::STAGE_BYTES);
                load_w(s, i);
                tma_load_2d(x_tile(s), &tx, full(s), (k0 + i) * BKE, m0);
            }
        }
    } else {
        /* consumers: the warpgroup of warps 0..3. Nothing to do before the
         * activations arrive, which the producer requests after its
         * griddepcontrol.wait: waiting there too parks these warps instead
         * of polling the mbarrier while the previous kernel runs. */
        pdl_wait();
#pragma unroll
        for (int b = 0; b < C::NB; b++)
#pragma unroll
            for (int j = 0; j < 64; j++) acc[b][j] = 0.0f;
        if constexpr (OP == OP_E4M3) {
            /* the thread's rows r, r + 8 (the accumulator layout); columns
             * 0..63 of a gate|up tile are gate rows, 64..127 up rows */
            const int r = 16 * warp + (lane >> 2);
            const bool ok0 = r < Mt, ok1 = r + 8 < Mt;
            const float *sw_lo = f8.wsc + (long)(n0 / 128) * f8.nbc;
            const float *sw_hi = glu ? f8.wsc + (long)((glu + n0) / 128) * f8.nbc : sw_lo;
            const float *xs = f8.xsc + m0 + r;
            float t[64];
            for (int i = 0; i < cnt; i++) {
                const int s = i % C::STAGES, kb = k0 + i;
                /* the scales' loads first: they overlap the wait */
                const float slo = sw_lo[kb], shi = sw_hi[kb];
                const float x0 = ok0 ? xs[(long)kb * M] : 0.0f, x1 = ok1 ? xs[(long)kb * M + 8] : 0.0f;
                mbar_wait(full(s), (uint32_t)((i / C::STAGES) & 1));
                const uint64_t da = desc_sw128(x_tile(s)), db = desc_sw128(w_tile(s));
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BKE / 32; kk++) wgmma_ss_e4m3(t, da + 2 * kk, db + 2 * kk, kk > 0);
                wgmma_commit();
                wgmma_wait<0>();
                fence_regs(t);
                if (lane == 0) mbar_arrive(empty(s)); /* this warp is done reading stage s */
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const float sc = j < 8 ? slo : shi, a0 = x0 * sc, a1 = x1 * sc;
                    acc[0][4 * j] = fmaf(t[4 * j], a0, acc[0][4 * j]);
                    acc[0][4 * j + 1] = fmaf(t[4 * j + 1], a0, acc[0][4 * j + 1]);
                    acc[0][4 * j + 2] = fmaf(t[4 * j + 2], a1, acc[0][4 * j + 2]);
                    acc[0][4 * j + 3] = fmaf(t[4 * j + 3], a1, acc[0][4 * j + 3]);
                }
            }
        } else {
            for (int i = 0; i < cnt; i++) {
                const int s = i % C::STAGES;
                mbar_wait(full(s), (uint32_t)((i / C::STAGES) & 1));
                const uint64_t da = desc_sw128(x_tile(s)), db = desc_sw128(w_tile(s));
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
                    for (int b = 0; b < C::NB; b++)
                        wgmma_n128<OP>(acc[b], da + 2 * kk, db + (uint64_t)(b * 128 * 128 >> 4) + 2 * kk);
                wgmma_commit();
                wgmma_wait<0>();
#pragma unroll
                for (int b = 0; b < C::NB; b++) fence_regs(acc[b]);
                if (lane == 0) mbar_arrive(empty(s)); /* this warp is done reading stage s */
            }
        }
    }
    /* every stage consumed: the ring's memory is free for the partial tile */
    __syncthreads();
    if (warp < CONSUMERS / 32) {
        const int r = 16 * warp + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
        for (int b = 0; b < C::NB; b++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int col = b * 128 + 8 * j + c;
                *(float2 *)&part[r * C::LDP + col] = make_float2(acc[b][4 * j], acc[b][4 * j + 1]);
                *(float2 *)&part[(r + 8) * C::LDP + col] =
                    make_float2(acc[b][4 * j + 2], acc[b][4 * j + 3]);
            }
    }
    if (S > 1) cluster_sync();
    else __syncthreads();
    pdl_wait(); /* before the first global store */
    /* the row tile's outputs */
    if (y) y += (long)m0 * ldy;

    /* this CTA's share of the tile: float4 groups i ≡ split (mod S) in
     * blocks of THREADS, summed over the S partials in split order */
    const uint32_t pbase = ptx_smem_u32(part);
    auto tile_sum = [&](int m, int c) {
        float4 v;
        if (S == 1) {
            v = *(const float4 *)&part[m * C::LDP + c];
        } else {
            /* all S loads first (they overlap), then the sum in split order */
            const uint32_t off = (uint32_t)(m * C::LDP + c) * 4u;
            float4 u[MAX_SPLIT];
#pragma unroll
            for (int s = 0; s < MAX_SPLIT; s++)
                if (s < S) u[s] = ld_cluster_f4(cluster_map(pbase + off, (uint32_t)s));
            v = u[0];
#pragma unroll
            for (int s = 1; s < MAX_SPLIT; s++)
                if (s < S) v.x += u[s].x, v.y += u[s].y, v.z += u[s].z, v.w += u[s].w;
        }
        return v;
    };
    if (BN == 128 && rp.cos_sin) {
        /* tile = one head of 128 columns (the sums + bias as the plain
         * product's y). Query and key heads: the pairs (c, c + 64) rotated
         * as qk_rope_store rotates them, queries into y, keys rounded to
         * bf16 into the cache row of the token's slot; value heads into
         * their cache row. */
        const int tile = blockIdx.x;
        auto biased = [&](int m, int c) {
            float4 v = tile_sum(m, c);
            if (bias) {
                const int n = n0 + c;
                v.x += bias[n], v.y += bias[n + 1], v.z += bias[n + 2], v.w += bias[n + 3];
            }
            return v;
        };
        auto put4 = [&](__nv_bfloat16 *dst, float4 v) {
            alignas(8) __nv_bfloat16 b[4] = {__float2bfloat16_rn(v.x), __float2bfloat16_rn(v.y),
                                             __float2bfloat16_rn(v.z), __float2bfloat16_rn(v.w)};
            *(uint2 *)dst = *(const uint2 *)b;
        };
        /* four cache elements at element offset off of cache (FP8: 4 bytes) */
        auto put4kv = [&](__nv_bfloat16 *cache, long off, float4 v, float scale) {
            if (rp.fp8) {
                uint32_t u = 0;
                const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int q = 0; q < 4; q++)
                    u |= (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(x[q], scale), __NV_SATFINITE,
                                                         __NV_E4M3) << (8 * q);
                *(uint32_t *)((unsigned char *)cache + off) = u;
            } else {
                put4(cache + off, v);
            }
        };
        if (tile >= rp.nq + rp.nk) {
            const long vh = (long)(tile - rp.nq - rp.nk) * 128;
            for (int i = split * THREADS + tid; i < Mt * 32; i += S * THREADS) {
                const int m = i / 32, c = (i % 32) * 4;
                put4kv(rp.vc, vh + (long)rp.slots[m0 + m] * rp.kv_stride + c, biased(m, c), rp.v_scale);
            }
        } else {
            for (int i = split * THREADS + tid; i < Mt * 16; i += S * THREADS) {
                const int m = i / 16, c = (i % 16) * 4;
                const float4 a = biased(m, c), b = biased(m, c + 64);
                const float4 *cs = (const float4 *)(rp.cos_sin + ((long)rp.pos[m0 + m] * 64 + c) * 2);
                const float4 cs0 = cs[0], cs1 = cs[1]; /* cos, sin of c, c+1; of c+2, c+3 */
                const float x0[4] = {a.x, a.y, a.z, a.w}, x1[4] = {b.x, b.y, b.z, b.w};
                const float co[4] = {cs0.x, cs0.z, cs1.x, cs1.z}, sn[4] = {cs0.y, cs0.w, cs1.y, cs1.w};
                float o0[4], o1[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    o0[q] = __fsub_rn(__fmul_rn(x0[q], co[q]), __fmul_rn(x1[q], sn[q]));
                    o1[q] = __fadd_rn(__fmul_rn(x1[q], co[q]), __fmul_rn(x0[q], sn[q]));
                }
                const float4 r0 = make_float4(o0[0], o0[1], o0[2], o0[3]),
                             r1 = make_float4(o1[0], o1[1], o1[2], o1[3]);
                if (tile < rp.nq) {
                    float *yr = y + (long)m * ldy + n0 + c;
                    *(float4 *)yr = r0;
                    *(float4 *)(yr + 64) = r1;
                } else {
                    const long kh = (long)rp.slots[m0 + m] * rp.kv_stride + (long)(tile - rp.nq) * 128 + c;
                    put4kv(rp.kc, kh, r0, rp.k_scale);
                    put4kv(rp.kc, kh + 64, r1, rp.k_scale);
                }
            }
        }
        if (S > 1) cluster_sync();
        return;
    }
    if (glu) {
        /* silu(gate) · up of BN/2 columns, rounded to the 16-bit type:
         * the SwiGLU kernel's value (cuda_silu16) of the sums above */
        using T = typename std::conditional<OP == OP_F16, __half, __nv_bfloat16>::type;
        constexpr int NG = BN / 8;
        for (int i = split * THREADS + tid; i < Mt * NG; i += S * THREADS) {
            const int m = i / NG, c = (i % NG) * 4, n = n0 + c;
            const float4 g = tile_sum(m, c), u = tile_sum(m, c + BN / 2);
            const float gs[4] = {g.x, g.y, g.z, g.w}, us[4] = {u.x, u.y, u.z, u.w};
            T *yr = (T *)y16 + (long)(m0 + m) * ldy16 + n;
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (n + q < glu) yr[q] = T(silu_mul_f32(gs[q], us[q]));
        }
        if (S > 1) cluster_sync();
        return;
    }
    constexpr int NV = BN / 4;
    const int total = Mt * NV;
    for (int i = split * THREADS + tid; i < total; i += S * THREADS) {
        const int m = i / NV, c = (i % NV) * 4;
        const float4 v = tile_sum(m, c);
        const int n = n0 + c;
        float *yr = y + (long)m * ldy + n;
        const float o[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (n + q < N) yr[q] = bias ? o[q] + bias[n + q] : o[q];
    }
    if (S > 1) cluster_sync(); /* peers may still read this CTA's partial */
}

/* ---- host side --------------------------------------------------------- */

enum { WMAP_SLOTS = 2048, XMAP_SLOTS = 16 };

struct tmap_entry {
    const void *p;
    long rows, cols, ld;
    int dtype, box;
    CUtensorMap map;
};

struct wg_state {
    PFN_cuTensorMapEncodeTiled_v12000 encode;
    int per_sm[2];                    /* resident CTAs an SM: BN = 128, 256 */
    int clusters[2][MAX_SPLIT + 1];   /* resident clusters of S CTAs */
    struct tmap_entry w[WMAP_SLOTS];  /* open addressing by pointer */
    int n_w;
    struct tmap_entry x[XMAP_SLOTS];  /* ring */
    int x_next;
};

template <int BN, int OP> void setup_kernel(struct wg_state *st, int bi, int n_sm) {
    auto k = wgmma_kernel<BN, OP>;
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)cfg<BN>::SMEM));
    /* f16 has bf16's resources; e4m3 (BN = 128 only) the same shared
     * memory, which is what bounds the CTAs an SM */
    if (OP != OP_BF16) return;
    int b = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, THREADS, cfg<BN>::SMEM));
    st->per_sm[bi] = b > 0 ? b : 1;
    for (int s = 1; s <= MAX_SPLIT; s++) {
        cudaLaunchConfig_t lc = {};
        lc.gridDim = dim3(1, (unsigned)s);
        lc.blockDim = dim3(THREADS);
        lc.dynamicSmemBytes = cfg<BN>::SMEM;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1, at[0].val.clusterDim.y = (unsigned)s, at[0].val.clusterDim.z = 1;
        lc.attrs = at, lc.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, k, &lc) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            n = st->per_sm[bi] * n_sm / s;
        }
        st->clusters[bi][s] = n;
    }
}

static int encode(const struct wg_state *st, CUtensorMap *m, const void *p, long rows, long cols,
                  long ld, int dtype, int box) {
    return tmap_2d(st->encode, m, p, rows, cols, ld, dtype, box);
}

/* The weight's map: cached by pointer and shape (weights never move; a new
 * weight at a freed one's address with another shape gets its own entry). */
static const CUtensorMap *weight_map(struct wg_state *st, const struct backend_weight *w, int box,
                                     CUtensorMap *tmp) {
    uint64_t h = ((uint64_t)(uintptr_t)w->data >> 8) * 0x9E3779B97F4A7C15ull;
    unsigned i = (unsigned)(h >> 53) & (WMAP_SLOTS - 1);
    for (int probe = 0; probe < WMAP_SLOTS; probe++, i = (i + 1) & (WMAP_SLOTS - 1)) {
        struct tmap_entry *e = &st->w[i];
        if (!e->p) break;
        if (e->p == w->data && e->rows == w->rows && e->cols == w->cols && e->dtype == (int)w->dtype &&
            e->box == box)
            return &e->map;
    }
    CUDA_ASSERT_MSG(encode(st, tmp, w->data, w->rows, w->cols, w->cols, (int)w->dtype, box),
                    "wgmma: cannot encode the weight's tensor map");
    if (st->n_w < WMAP_SLOTS * 3 / 4 && !st->w[i].p) {
        st->w[i] = (struct tmap_entry){w->data, w->rows, w->cols, w->cols, (int)w->dtype, box, *tmp};
        st->n_w++;
        return &st->w[i].map;
    }
    return tmp; /* table full: encoded for this call only */
}

static const CUtensorMap *act_map(struct wg_state *st, const void *x, long n, long cols, long ldx,
                                  int dtype, int box = BM) {
    for (int i = 0; i < XMAP_SLOTS; i++) {
        struct tmap_entry *e = &st->x[i];
        if (e->p == x && e->rows == n && e->cols == cols && e->ld == ldx && e->dtype == dtype &&
            e->box == box)
            return &e->map;
    }
    struct tmap_entry *e = &st->x[st->x_next];
    st->x_next = (st->x_next + 1) % XMAP_SLOTS;
    CUDA_ASSERT_MSG(encode(st, &e->map, x, n, cols, ldx, dtype, box),
                    "wgmma: cannot encode the activations' tensor map");
    e->p = x, e->rows = n, e->cols = cols, e->ld = ldx, e->dtype = dtype, e->box = box;
    return &e->map;
}

/* The K split for `tiles` N tiles: the largest S ≤ 8 whose `tiles`
 * clusters of S CTAs take at most WG_FILL% of the clusters resident at once
 * on an empty GPU and whose splits keep at least WG_MIN_STEPS k-steps each
 * (each CTA pays a pipeline ramp and the cluster reduction). */
static int choose_splits(const struct wg_state *st, int bi, long tiles, int nk) {
    int best = 1;
    for (int s = 2; s <= MAX_SPLIT && s * WG_MIN_STEPS <= nk; s++)
        if (tiles * 100 <= (long)st->clusters[bi][s] * WG_FILL) best = s;
    return best;
}

template <int BN, int OP>
void launch(struct cuda_ctx *c, const CUtensorMap *tw, const CUtensorMap *tx, float *y, long ldy,
            const float *bias, int M, int N, int nk, int S, void *y16, long ldy16,
            int glu, const struct wg_rope &rp, const struct wg_fp8 &f8 = wg_fp8{}) {
    long tiles = glu ? glu / (BN / 2) : (N + BN - 1) / BN;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)tiles, (unsigned)S, (unsigned)((M + BM - 1) / BM));
    lc.blockDim = dim3(THREADS);
    lc.dynamicSmemBytes = cfg<BN>::SMEM;
    lc.stream = c->stream;
    cudaLaunchAttribute at[2];
    int na = 0;
    if (c->pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (S > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1, at[na].val.clusterDim.y = (unsigned)S;
        at[na++].val.clusterDim.z = 1;
    }
    lc.attrs = at, lc.numAttrs = (unsigned)na;
    CUDA_CHECK(cudaLaunchKernelEx(&lc, wgmma_kernel<BN, OP>, *tw, *tx, y, ldy, bias, M, N, nk, S,
                                  y16, ldy16, glu, rp, f8));
}

} // namespace

extern "C" int cuda_wgmma_init(struct cuda_ctx *c) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = tmap_encoder(c->device);
    if (!fn) return 0;
    struct wg_state *st = (struct wg_state *)calloc(1, sizeof *st);
    CUDA_ASSERT(st);
    st->encode = fn;
    setup_kernel<128, OP_BF16>(st, 0, c->n_sm);
    setup_kernel<128, OP_F16>(st, 0, c->n_sm);
    setup_kernel<128, OP_E4M3>(st, 0, c->n_sm);
    setup_kernel<256, OP_BF16>(st, 1, c->n_sm);
    setup_kernel<256, OP_F16>(st, 1, c->n_sm);
    fp8_rows_setup();
    c->wgmma_state = st;
    return 1;
}

extern "C" void cuda_wgmma_release(struct cuda_ctx *c) {
    free(c->wgmma_state);
    c->wgmma_state = NULL;
}

/* Everything cuda_wgmma_ok checks but the weight's size. */
static int operands_ok(const struct cuda_ctx *c, const struct backend_weight *w, const void *x16,
                       long ldx, long n) {
    const struct wg_state *st = (const struct wg_state *)c->wgmma_state;
    return c->wgmma && st && !c->deterministic && !c->split_act &&
           (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16) && n >= 1 && n <= BM && w->rows >= 1 &&
           w->cols >= 8 && w->cols % 8 == 0 && ldx % 8 == 0 && ldx >= w->cols && w->rows <= INT32_MAX &&
           w->cols <= INT32_MAX && ((uintptr_t)w->data & 15) == 0 && ((uintptr_t)x16 & 15) == 0;
}

extern "C" int cuda_wgmma_ok(const struct cuda_ctx *c, const struct backend_weight *w,
                             const void *x16, long ldx, long n) {
    return operands_ok(c, w, x16, ldx, n) && w->rows * w->cols * 2 >= c->wgmma_min_bytes;
}

/* The output projection right after the decode attention. On cuBLAS it
 * cannot launch before the attention ends, and the norm after it cannot
 * either; on this kernel both start early. With plans on every resident
 * cluster (Llama-3.1-8B's o_proj: 32 tiles × 7) it waited for the
 * attention's CTAs to leave whole GPCs and lost; with headroom in the
 * plans (WG_FILL, then 75%) the 64-sequence step went 6.80 → 6.61-6.62 ms
 * (docs/cuda-decode.md). Returns 0 (nothing run) where it does not apply. */
extern "C" int cuda_wgmma_attn_out(struct cuda_ctx *c, float *y, long ldy, const void *x16,
                                   long ldx, const struct backend_weight *w, const float *bias,
                                   long n) {
    if (!operands_ok(c, w, x16, ldx, n) || w->rows * w->cols * 2 < WG_OPROJ_BYTES) return 0;
    cuda_wgmma_run(c, y, ldy, x16, ldx, w, bias, n, 0, 0);
    return 1;
}

extern "C" void cuda_wgmma_plan(const struct cuda_ctx *c, long N, long K, int *bn, int *splits) {
    const struct wg_state *st = (const struct wg_state *)c->wgmma_state;
    CUDA_ASSERT(st);
    const int nk = (int)((K + BK - 1) / BK);
    if (*bn != 128 && *bn != 256) *bn = 128;
    const long tiles = (N + *bn - 1) / *bn;
    int S = *splits > 0 ? *splits : choose_splits(st, *bn == 256, tiles, nk);
    if (S > MAX_SPLIT) S = MAX_SPLIT;
    if (S > nk) S = nk;
    *splits = S;
}

/* The product, or with glu = inter > 0 the SwiGLU of W = [gate; up]
 * (2·inter rows) into y16 (16-bit, row stride ldy16). */
static void wgmma_any(struct cuda_ctx *c, float *y, long ldy, void *y16, long ldy16, int glu,
                      const void *x16, long ldx, const struct backend_weight *w,
                      const float *bias, long n, int bn, int splits,
                      const struct wg_rope &rp = wg_rope{}) {
    struct wg_state *st = (struct wg_state *)c->wgmma_state;
    CUDA_ASSERT(st && n >= 1 && n <= BM);
    const long N = w->rows, K = w->cols;
    const int nk = (int)((K + BK - 1) / BK);
    int S = splits;
    cuda_wgmma_plan(c, N, K, &bn, &S);
    CUtensorMap tmp;
    const CUtensorMap *tw = weight_map(st, w, glu ? bn / 2 : bn, &tmp);
    const CUtensorMap *tx = act_map(st, x16, n, K, ldx, (int)w->dtype);
    const int f16 = w->dtype == DTYPE_F16;
    if (bn == 256) {
        CUDA_ASSERT(!rp.cos_sin);
        if (f16) launch<256, OP_F16>(c, tw, tx, y, ldy, bias, (int)n, (int)N, nk, S, y16, ldy16, glu, rp);
        else launch<256, OP_BF16>(c, tw, tx, y, ldy, bias, (int)n, (int)N, nk, S, y16, ldy16, glu, rp);
    } else {
        if (f16) launch<128, OP_F16>(c, tw, tx, y, ldy, bias, (int)n, (int)N, nk, S, y16, ldy16, glu, rp);
        else launch<128, OP_BF16>(c, tw, tx, y, ldy, bias, (int)n, (int)N, nk, S, y16, ldy16, glu, rp);
    }
    c->wgmma_calls++;
}

extern "C" void cuda_wgmma_run(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                               const struct backend_weight *w, const float *bias, long n, int bn,
                               int splits) {
    wgmma_any(c, y, ldy, NULL, 0, 0, x16, ldx, w, bias, n, bn, splits);
}

extern "C" int cuda_wgmma_glu_ok(const struct cuda_ctx *c, const struct backend_weight *gate_up,
                                 const void *x16, long ldx, const void *y16, long ldy16, long n) {
    const long inter = gate_up->rows / 2;
    return c->wgmma_glu && cuda_wgmma_ok(c, gate_up, x16, ldx, n) && gate_up->rows % 2 == 0 &&
           inter % 128 == 0 && ldy16 % 4 == 0 && ldy16 >= inter && ((uintptr_t)y16 & 7) == 0;
}

extern "C" void cuda_wgmma_glu_run(struct cuda_ctx *c, void *y16, long ldy16, const void *x16,
                                   long ldx, const struct backend_weight *gate_up, long n, int bn,
                                   int splits) {
    wgmma_any(c, NULL, 0, y16, ldy16, (int)(gate_up->rows / 2), x16, ldx, gate_up, NULL, n, bn,
              splits);
}

extern "C" void cuda_wgmma(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldx,
                           const struct backend_weight *w, const float *bias, long n) {
    cuda_wgmma_run(c, y, ldy, x16, ldx, w, bias, n, 0, 0);
}

/* What the rope epilogue needs of the q|k|v product (tiles of 128 rows,
 * each one head). */
static int rope_shape_ok(const struct cuda_ctx *c, const struct backend_weight *w,
                         const struct backend_rope_store *r) {
    uintptr_t a = (uintptr_t)r->cos_sin | (uintptr_t)r->k_cache | (uintptr_t)r->v_cache;
    return c->wgmma_rope && (c->kv_bf16 || c->kv_fp8) && r->head_dim == 128 && r->rot_dim == 128 &&
           !r->interleaved && !r->q_norm && !r->k_norm && r->n_heads >= 1 && r->n_kv_heads >= 1 &&
           w->rows == (long)(r->n_heads + 2 * r->n_kv_heads) * 128 && r->kv_stride % 4 == 0 &&
           a % 16 == 0 && r->pos && r->slots;
}

extern "C" int cuda_wgmma_rope_ok(const struct cuda_ctx *c, const struct backend_weight *w,
                                  const void *x16, long ldx, long n,
                                  const struct backend_rope_store *r) {
    int bn = 0, S = 0;
    if (!cuda_wgmma_ok(c, w, x16, ldx, n)) return 0;
    cuda_wgmma_plan(c, w->rows, w->cols, &bn, &S);
    return bn == 128 && rope_shape_ok(c, w, r);
}

extern "C" void cuda_wgmma_rope_run(struct cuda_ctx *c, float *y, long ldy, const void *x16,
                                    long ldx, const struct backend_weight *w, const float *bias,
                                    long n, const struct backend_rope_store *r) {
    CUDA_ASSERT(ldy % 4 == 0 && ((uintptr_t)y & 15) == 0);
    struct wg_rope rp = {r->pos, r->slots, r->cos_sin, (__nv_bfloat16 *)r->k_cache,
                         (__nv_bfloat16 *)r->v_cache, r->kv_stride, r->n_heads, r->n_kv_heads,
                         c->kv_fp8, r->k_scale, r->v_scale};
    wgmma_any(c, y, ldy, NULL, 0, 0, x16, ldx, w, bias, n, 128, 0, rp);
}

/* ---- FP8 weights ------------------------------------------------------- */

extern "C" int cuda_wgmma_fp8_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n) {
    const struct wg_state *st = (const struct wg_state *)c->wgmma_state;
    return c->wgmma && c->wgmma_fp8 && st && !c->deterministic && !c->split_act &&
           w->dtype == DTYPE_F8_E4M3 && w->scale && w->block_rows == 128 && w->block_cols == 128 &&
           n >= 1 && n <= 65535l * BM && w->rows >= 1 && w->rows <= INT32_MAX && w->cols >= 128 &&
           w->cols % 128 == 0 && w->cols <= INT32_MAX && ((uintptr_t)w->data & 15) == 0;
}

/* The rows of gemm_fp8.cu's tiles for a product of n rows, 0 for none:
 * from FP8_ROWS_MIN rows, when its tiles fill at least FP8_ROWS_FILL% of
 * the SMs (each CTA one SM; fewer tiles leave SMs idle where the 64-row
 * tiles and their K splits fill the GPU) and y takes its float2 stores;
 * 192-row tiles (three consumer warpgroups) from FP8_ROWS_LARGE_MIN rows
 * where they fill the SMs so (else the 128-row ones), their padding then
 * small: on an H200 they ran Llama-3.1-8B's
 * gate|up at 819 and 780 TFLOP/s (2,048 and 8,192 rows) against 725 and
 * 702 on 128-row tiles, and down at 2,048 rows 803 against 762; at 512
 * rows their last row tile is a third padding. */
enum { FP8_ROWS_MIN = 256, FP8_ROWS_FILL = 75, FP8_ROWS_LARGE_MIN = 1024 };
static int rows_tile(const struct cuda_ctx *c, long n, long N, const float *y, long ldy) {
    if (n < FP8_ROWS_MIN || ldy % 2 || ((uintptr_t)y & 7)) return 0;
    const long fill = (long)c->n_sm * FP8_ROWS_FILL;
    if (n >= FP8_ROWS_LARGE_MIN && fp8_rows_tiles(n, N, FP8_ROWS_BM_LARGE) * 100 >= fill) return FP8_ROWS_BM_LARGE;
    return fp8_rows_tiles(n, N, FP8_ROWS_BM_SMALL) * 100 >= fill ? FP8_ROWS_BM_SMALL : 0;
}

/* y[n][w.rows] (stride ldy) = dequant(xq, xs) · dequant(w)ᵀ (+ bias): xq
 * [n][w.cols] e4m3 (row stride w.cols bytes, 16-byte aligned), xs [w.cols /
 * 128][n] its scales (cuda_fp8_quant_act). tile_rows 128 or 192:
 * gemm_fp8.cu's kernels; 64: row tiles of 64 here, the K split as the
 * 16-bit kernel plans it over every tile of the grid; 0: by rows_tile. */
static void wgmma_fp8_any(struct cuda_ctx *c, float *y, long ldy, const void *xq, const float *xs,
                          const struct backend_weight *w, const float *bias, long n,
                          const struct wg_rope &rp, int tile_rows) {
    struct wg_state *st = (struct wg_state *)c->wgmma_state;
    CUDA_ASSERT(cuda_wgmma_fp8_ok(c, w, n) && ((uintptr_t)xq & 15) == 0);
    const long N = w->rows, K = w->cols;
    const int nk = (int)(K / 128);
    if (!tile_rows) {
        tile_rows = rows_tile(c, n, N, y, ldy);
        if (!tile_rows) tile_rows = BM;
    }
    CUtensorMap tmp;
    const CUtensorMap *tw = weight_map(st, w, 128, &tmp);
    const CUtensorMap *tx = act_map(st, xq, n, K, K, (int)DTYPE_F8_E4M3, tile_rows);
    const struct wg_fp8 f8 = {w->scale, xs, nk};
    if (tile_rows == FP8_ROWS_BM_SMALL || tile_rows == FP8_ROWS_BM_LARGE) {
        fp8_rows_launch(c, tile_rows, tw, tx, y, ldy, bias, (int)n, (int)N, nk, rp, f8);
        c->wgmma_fp8_rows_calls++;
        c->wgmma_fp8_rows192_calls += tile_rows == FP8_ROWS_BM_LARGE;
    } else {
        CUDA_ASSERT(tile_rows == BM);
        const long tiles = (N + 127) / 128 * ((n + BM - 1) / BM);
        const int S = choose_splits(st, 0, tiles, nk);
        launch<128, OP_E4M3>(c, tw, tx, y, ldy, bias, (int)n, (int)N, nk, S, NULL, 0, 0, rp, f8);
    }
    c->wgmma_fp8_calls++;
}

extern "C" void cuda_wgmma_fp8(struct cuda_ctx *c, float *y, long ldy, const void *xq,
                               const float *xs, const struct backend_weight *w, const float *bias,
                               long n) {
    wgmma_fp8_any(c, y, ldy, xq, xs, w, bias, n, wg_rope{}, 0);
}

extern "C" void cuda_wgmma_fp8_run(struct cuda_ctx *c, float *y, long ldy, const void *xq,
                                   const float *xs, const struct backend_weight *w,
                                   const float *bias, long n, int tile_rows) {
    CUDA_ASSERT(tile_rows == 0 || tile_rows == BM ||
                ((tile_rows == FP8_ROWS_BM_SMALL || tile_rows == FP8_ROWS_BM_LARGE) && ldy % 2 == 0 &&
                 ((uintptr_t)y & 7) == 0));
    wgmma_fp8_any(c, y, ldy, xq, xs, w, bias, n, wg_rope{}, tile_rows);
}

/* The q|k|v product of FP8 weights with rope and the K/V stores in its
 * epilogue, as cuda_wgmma_rope_run does for 16-bit weights. */
extern "C" int cuda_wgmma_fp8_rope_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n,
                                      const struct backend_rope_store *r) {
    return cuda_wgmma_fp8_ok(c, w, n) && rope_shape_ok(c, w, r);
}

extern "C" void cuda_wgmma_fp8_rope(struct cuda_ctx *c, float *y, long ldy, const void *xq,
                                    const float *xs, const struct backend_weight *w, const float *bias,
                                    long n, const struct backend_rope_store *r) {
    CUDA_ASSERT(cuda_wgmma_fp8_rope_ok(c, w, n, r) && ldy % 4 == 0 && ((uintptr_t)y & 15) == 0);
    const struct wg_rope rp = {r->pos, r->slots, r->cos_sin, (__nv_bfloat16 *)r->k_cache,
                               (__nv_bfloat16 *)r->v_cache, r->kv_stride, r->n_heads, r->n_kv_heads,
                               c->kv_fp8, r->k_scale, r->v_scale};
    wgmma_fp8_any(c, y, ldy, xq, xs, w, bias, n, rp, 0);
}
