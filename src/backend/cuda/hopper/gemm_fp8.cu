/* gemm_fp8.cu — products with FP8 weights (128 × 128 blocks) for
 * prefill-sized row counts on Hopper: y[m][n] = Σ_k xq[m][k]·sx[m][k/128] ·
 * wq[n][k]·sw[n/128][k/128], e4m3 operands, fp32 sums, fp32 output.
 * gemm_wgmma.cu's e4m3 kernel (row tiles of 64, K split in clusters) is
 * built for decode batches, where reading the weight once is the cost;
 * past a few hundred rows the product is bound by the tensor cores and the
 * bytes each tile pulls from L2, and that kernel's 64 × 128 tiles fetch
 * 24 KB for every 2.1 MFLOP of a 128-column step.
 *
 * Design (the DeepGEMM scheme on 128- or 192-row tiles):
 *  - A CTA computes 128 or 192 activation rows × 128 weight rows: two or
 *    three consumer warpgroups, each wgmma m64n128k32 (e4m3) on its 64
 *    rows against the one weight tile, so each weight tile serves two or
 *    three times the rows of the decode kernel's (32 KB a step for 4.2
 *    MFLOP; 40 KB for 6.3). The 192-row form from 1,024 rows, where it
 *    measured faster and its padding is small (gemm_wgmma.cu's
 *    rows_tile).
 *  - A k-step is one 128-column scale block: four k32 wgmmas into a fresh
 *    accumulator, then added to the running sums times the weight block's
 *    scale and the row's activation scale (the tensor cores never add
 *    across scale blocks). One warpgroup scales while the other's wgmmas
 *    run, so the tensor cores stay fed (ptxas serializes the wgmmas of a
 *    warpgroup that scales one accumulator while it has another group
 *    in flight, so the overlap comes from the other warpgroups).
 *  - One producer lane streams both tiles with TMA into a ring of stages
 *    ("full" mbarriers count the bytes, "empty" ones the consumer warps):
 *    6 of 32 KB, or 5 of 40 KB for 192 rows, whose producer is a whole
 *    warpgroup that gives its registers to the consumers (setmaxnreg).
 *    One CTA an SM (193 or 201 KB of shared memory).
 *  - Persistent: min(tiles, SMs) CTAs walk the tiles t = blockIdx.x +
 *    i·gridDim.x, row tile fastest (t % row tiles), so the CTAs running
 *    at once share a few weight tiles through L2 and the whole activation
 *    matrix stays there. The ring runs on across tiles: the producer loads
 *    the next tile's first steps while the consumers store the last one.
 *  - The epilogue stores from registers (each lane holds two adjacent
 *    columns of two rows: float2 stores, whole 32-byte sectors), plus the
 *    bias; or, for the stacked q|k|v product, gemm_wgmma.cu's rope and
 *    K/V-cache stores (the pairs c, c + 64 of half-layout rope are in one
 *    thread: accumulator groups j and j + 8), the same arithmetic.
 * Called by gemm_wgmma.cu (cuda_wgmma_fp8, cuda_wgmma_fp8_rope) when the
 * tiles of this kernel fill the GPU; it keeps the tensor maps. */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/hopper/gemm_wgmma.cuh"
#include "backend/cuda/hopper/ptx.cuh"

using namespace hopper;

namespace {

constexpr int FK = 128;                 /* e4m3 columns a k-step: one scale block, one 128-byte row */
constexpr int FN = 128;                 /* weight rows a tile: one scale block */
constexpr uint32_t F_W = FN * FK;       /* a stage's weight tile */
/* registers a thread with three consumer warpgroups: the producer's
 * warpgroup gives its own back (128·24 + 384·160 ≤ 65,536) */
constexpr int F_REG_PRODUCER = 24, F_REG_CONSUMER = 160;

/* The two tile heights: WGS consumer warpgroups of 64 rows. Two: one
 * producer warp, a 6-deep ring of 32 KB; three: a producer warpgroup
 * (its registers given to the consumers), a 5-deep ring of 40 KB. */
template <int WGS> struct fcfg {
    static constexpr int FM = 64 * WGS;              /* activation rows a tile */
    static constexpr int STAGES = WGS == 3 ? 5 : 6;
    static constexpr int CONSUMERS = 128 * WGS;
    static constexpr int THREADS = CONSUMERS + (WGS == 3 ? 128 : 32);
    static constexpr uint32_t STAGE = F_W + (uint32_t)FM * FK;
    static constexpr uint32_t BAR = STAGES * STAGE;
    static constexpr size_t SMEM = 1024 + BAR + 2 * STAGES * 8; /* +1024: alignment */
};
static_assert(fcfg<2>::FM == FP8_ROWS_BM_SMALL && fcfg<3>::FM == FP8_ROWS_BM_LARGE, "tile heights");

__device__ __forceinline__ uint16_t e4m3x2(float a, float b, float scale) {
    return (uint16_t)((uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(a, scale), __NV_SATFINITE, __NV_E4M3) |
                      (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(b, scale), __NV_SATFINITE, __NV_E4M3) << 8);
}

/* Two adjacent cache elements (bf16, or e4m3 of x / scale) at element
 * offset off: 4-byte or 2-byte aligned (off even). */
__device__ __forceinline__ void put2kv(const wg_rope &rp, __nv_bfloat16 *cache, long off, float a,
                                       float b, float scale) {
    if (rp.fp8) *(uint16_t *)((unsigned char *)cache + off) = e4m3x2(a, b, scale);
    else *(__nv_bfloat162 *)(cache + off) = __floats2bfloat162_rn(a, b);
}

template <int WGS>
__global__ void __launch_bounds__(fcfg<WGS>::THREADS, 1)
fp8_rows_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx,
                float *y, long ldy, const float *bias, int M, int N, int nk, int mt, int tiles,
                const struct wg_rope rp, const struct wg_fp8 f8) {
    using C = fcfg<WGS>;
    constexpr int F_STAGES = C::STAGES, F_CONSUMERS = C::CONSUMERS, FM = C::FM;
    constexpr uint32_t F_STAGE = C::STAGE, F_BAR = C::BAR;
    extern __shared__ unsigned char smem_raw[];
    pdl_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t raw = ptx_smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    auto full = [&](int s) { return base + F_BAR + 8u * (uint32_t)s; };
    auto empty = [&](int s) { return base + F_BAR + 8u * (uint32_t)(F_STAGES + s); };
    auto w_tile = [&](int s) { return base + (uint32_t)s * F_STAGE; };
    auto x_tile = [&](int s) { return base + (uint32_t)s * F_STAGE + F_W; };
    if (tid == 0) {
        for (int s = 0; s < F_STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), F_CONSUMERS / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pdl_wait(); /* the activations, their scales, positions and slots come from kernels before */

    if (warp >= F_CONSUMERS / 32) {
        /* producer: the ring runs on from tile to tile */
        if constexpr (WGS == 3) setmaxnreg_dec<F_REG_PRODUCER>();
        if (warp == F_CONSUMERS / 32 && lane == 0) {
            prefetch_tensormap(&tw);
            prefetch_tensormap(&tx);
            int it = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const int m0 = (t % mt) * FM, n0 = (t / mt) * FN;
                for (int kb = 0; kb < nk; kb++, it++) {
                    const int s = it % F_STAGES;
                    if (it >= F_STAGES) mbar_wait(empty(s), (uint32_t)((it / F_STAGES) & 1) ^ 1u);
                    mbar_arrive_tx(full(s), F_STAGE);
                    tma_load_2d(w_tile(s), &tw, full(s), kb * FK, n0);
                    tma_load_2d(x_tile(s), &tx, full(s), kb * FK, m0);
                }
            }
        }
        return;
    }

    /* consumers: warpgroup wg has the tile's rows [64·wg, 64·wg + 64);
     * this thread rows r and r + 8 of them, columns 8j + cq + {0, 1} */
    if constexpr (WGS == 3) setmaxnreg_inc<F_REG_CONSUMER>();
    const int wg = warp >> 2;
    const int r = 64 * wg + 16 * (warp & 3) + (lane >> 2), cq = 2 * (lane & 3);
    float acc[64], t8[64];
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t % mt) * FM, nt = t / mt, n0 = nt * FN;
        const int row0 = m0 + r, row1 = row0 + 8;
        const bool ok0 = row0 < M, ok1 = row1 < M;
        const float *sw = f8.wsc + (long)nt * f8.nbc;
#pragma unroll
        for (int j = 0; j < 64; j++) acc[j] = 0.0f;
        /* the scales of step kb + 1 are loaded during step kb (loaded
         * just before their step's wait, they stalled the promotion on L2
         * latency: half the warps' stalls in Nsight Compute) */
        const float *xs0 = f8.xsc + row0, *xs1 = f8.xsc + row1;
        float swn = sw[0], x0n = ok0 ? xs0[0] : 0.0f, x1n = ok1 ? xs1[0] : 0.0f;
        for (int kb = 0; kb < nk; kb++, it++) {
            const int s = it % F_STAGES;
            const float swk = swn, x0 = x0n, x1 = x1n;
            if (kb + 1 < nk) {
                const long o = (long)(kb + 1) * M;
                swn = sw[kb + 1];
                x0n = ok0 ? xs0[o] : 0.0f;
                x1n = ok1 ? xs1[o] : 0.0f;
            }
            mbar_wait(full(s), (uint32_t)((it / F_STAGES) & 1));
            const uint64_t da = desc_sw128(x_tile(s) + (uint32_t)wg * (64 * FK)), db = desc_sw128(w_tile(s));
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < FK / 32; kk++) wgmma_ss_e4m3(t8, da + 2 * kk, db + 2 * kk, kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(t8);
            if (lane == 0) mbar_arrive(empty(s)); /* this warp is done reading stage s */
            const float a0 = x0 * swk, a1 = x1 * swk;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                acc[4 * j] = fmaf(t8[4 * j], a0, acc[4 * j]);
                acc[4 * j + 1] = fmaf(t8[4 * j + 1], a0, acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(t8[4 * j + 2], a1, acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(t8[4 * j + 3], a1, acc[4 * j + 3]);
            }
        }
        /* the sums + bias of column group j, rows row0 (h = 0) and row1 */
        auto val = [&](int j, int h, int q) {
            const float v = acc[4 * j + 2 * h + q];
            return bias ? v + bias[n0 + 8 * j + cq + q] : v;
        };
        if (rp.cos_sin) {
            /* q|k|v: tile nt is one head of 128 columns (gemm_wgmma.cu's
             * epilogue): query and key heads rotated in pairs (c, c + 64),
             * queries into y, keys into their cache rows; value heads into
             * theirs */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = h ? row1 : row0;
                if (!(h ? ok1 : ok0)) continue;
                const long slot = (long)rp.slots[row] * rp.kv_stride;
                if (nt >= rp.nq + rp.nk) {
                    const long vh = slot + (long)(nt - rp.nq - rp.nk) * 128;
#pragma unroll
                    for (int j = 0; j < 16; j++)
                        put2kv(rp, rp.vc, vh + 8 * j + cq, val(j, h, 0), val(j, h, 1), rp.v_scale);
                    continue;
                }
                const float *cs = rp.cos_sin + (long)rp.pos[row] * 128;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int c = 8 * j + cq;
                    const float4 cs4 = *(const float4 *)(cs + 2 * c); /* cos, sin of c; of c + 1 */
                    const float co[2] = {cs4.x, cs4.z}, sn[2] = {cs4.y, cs4.w};
                    float o0[2], o1[2];
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const float x0v = val(j, h, q), x1v = val(j + 8, h, q);
                        o0[q] = __fsub_rn(__fmul_rn(x0v, co[q]), __fmul_rn(x1v, sn[q]));
                        o1[q] = __fadd_rn(__fmul_rn(x1v, co[q]), __fmul_rn(x0v, sn[q]));
                    }
                    if (nt < rp.nq) {
                        float *yr = y + (long)row * ldy + n0 + c;
                        *(float2 *)yr = make_float2(o0[0], o0[1]);
                        *(float2 *)(yr + 64) = make_float2(o1[0], o1[1]);
                    } else {
                        const long kh = slot + (long)(nt - rp.nq) * 128 + c;
                        put2kv(rp, rp.kc, kh, o0[0], o0[1], rp.k_scale);
                        put2kv(rp, rp.kc, kh + 64, o1[0], o1[1], rp.k_scale);
                    }
                }
            }
            continue;
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = h ? row1 : row0;
            if (!(h ? ok1 : ok0)) continue;
            float *yr = y + (long)row * ldy;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int n = n0 + 8 * j + cq;
                if (n + 1 < N) *(float2 *)(yr + n) = make_float2(val(j, h, 0), val(j, h, 1));
                else if (n < N) yr[n] = val(j, h, 0);
            }
        }
    }
}

} // namespace

namespace {

template <int WGS>
void launch_rows(struct cuda_ctx *c, const CUtensorMap *tw, const CUtensorMap *tx, float *y, long ldy,
                 const float *bias, int M, int N, int nk, const wg_rope &rp, const wg_fp8 &f8) {
    using C = fcfg<WGS>;
    const long tiles = fp8_rows_tiles(M, N, C::FM);
    CUDA_ASSERT(tiles <= INT32_MAX && ldy % 2 == 0 && ((uintptr_t)y & 7) == 0);
    const int mt = (M + C::FM - 1) / C::FM;
    const long grid = tiles < c->n_sm ? tiles : c->n_sm;
    pdl_launch(c, fp8_rows_kernel<WGS>, dim3((unsigned)grid), dim3(C::THREADS), C::SMEM, *tw, *tx, y, ldy,
               bias, M, N, nk, mt, (int)tiles, rp, f8);
}

} // namespace

namespace hopper {

void fp8_rows_setup() {
    CUDA_CHECK(cudaFuncSetAttribute(fp8_rows_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fcfg<2>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fp8_rows_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fcfg<3>::SMEM));
}

void fp8_rows_launch(struct cuda_ctx *c, int bm, const CUtensorMap *tw, const CUtensorMap *tx, float *y,
                     long ldy, const float *bias, int M, int N, int nk, const wg_rope &rp,
                     const wg_fp8 &f8) {
    if (bm == FP8_ROWS_BM_LARGE) launch_rows<3>(c, tw, tx, y, ldy, bias, M, N, nk, rp, f8);
    else launch_rows<2>(c, tw, tx, y, ldy, bias, M, N, nk, rp, f8);
}

} // namespace hopper
