/* cuda_attn_prefill.cu — tensor-core prefill attention (FlashAttention-2
 * style, mma.sync) for the rows of sequences with more than one new token
 * when dk = dv ∈ {64, 128}, on the bf16, fp32 or FP8 (e4m3) cache, with
 * sliding windows and attention sinks. cuda_attention.cu dispatches here
 * (cuda_attn_fa_prefill); docs/cuda.md "Attention" has the design.
 *
 * One CTA of 8 warps per (query tile of FA_BM = 128 rows of one sequence,
 * query head); each warp owns 16 query rows. Q is rounded to bf16 once and
 * kept in registers as mma A fragments. K/V tiles of FA_BN = 64 positions
 * are copied into shared memory with cp.async (two stages: the copy of
 * tile j+1 overlaps the work on tile j): bf16 straight into the padded
 * tiles; fp32 and e4m3 into staging, then widened to bf16 in shared memory
 * (e4m3 exactly; its scales are folded into the softmax scale and the
 * output). S = Q·Kᵀ and O += P·V run on mma.sync.m16n8k16 (bf16 in, fp32
 * accumulate; ldmatrix fragments). The softmax is online in fp32 (exp2,
 * running max and sum per row); only tiles that cross a row's position or
 * its window's first position are masked, and tiles before the CTA's
 * first window are skipped. KV tiles are aligned to absolute position 0,
 * every row is computed only from its own data, and a fully masked tile
 * is an exact no-op for a row, so a row's result does not depend on the
 * query tile it lands in, on chunking, or on the batch. A sink joins each
 * row's sum once, at the end. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_attn_common.cuh"
#include "backend/cuda/cuda_prefill_tiles.cuh"
#include "backend/cuda/cuda_ptx.cuh"

enum {
    FA_BM = 128, /* query rows per CTA (16 per warp) */
    FA_BN = 64,  /* KV positions per tile */
    FA_WARPS = 8,
    FA_THREADS = FA_WARPS * 32,
};

struct fa_args {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const void *k_cache, *v_cache; /* elements of T */
    long k_stride, v_stride;
    int n_heads, group;
    float scale_log2; /* softmax scale · log2(e) */
    int n_seqs, page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    float vscale;       /* V's scale (FP8 cache; K's is in scale_log2), else 1 */
    int window;         /* attn_params.window */
    const float *sinks; /* attn_params.sinks */
};

/* four staged cache elements (shared memory) widened to fp32 */
static __device__ __forceinline__ float4 stage_get4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ float4 stage_get4(const kv_fp8_t *p) {
    uint32_t u = *(const uint32_t *)p;
    __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
    __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
    float2 fa = __half22float2(*(const __half2 *)&a), fb = __half22float2(*(const __half2 *)&b);
    return make_float4(fa.x, fa.y, fb.x, fb.y);
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* Shared memory of fa_prefill_kernel<T, D>. fp32 and FP8 caches: two
 * stages of K and V in the cache's type (es bytes an element), and bf16 K
 * and V tiles (rows padded by 8 elements: conflict-free ldmatrix) they are
 * widened into (e4m3 is exact in bf16; its scales are applied to the
 * scores and the output); Q's bf16 tile reuses the K/V tiles' space
 * before the first tile. bf16 cache: two stages of bf16 K and V tiles that
 * cp.async fills directly (no staging, no conversion); Q's tile is stage 1
 * until the first tile. */
static constexpr size_t fa_smem_bytes(int D, bool bf16, int es) {
    return bf16 ? (size_t)2 * 2 * FA_BN * (D + 8) * 2
                : (size_t)2 * 2 * FA_BN * D * es +
                      ((size_t)2 * FA_BN * (D + 8) * 2 > (size_t)FA_BM * (D + 8) * 2
                           ? (size_t)2 * FA_BN * (D + 8) * 2
                           : (size_t)FA_BM * (D + 8) * 2);
}

template <typename T, int D>
static __global__ void __launch_bounds__(FA_THREADS, 1) fa_prefill_kernel(struct fa_args a) {
    constexpr bool BF = sizeof(T) == 2; /* bf16 cache: tiles land as they are (else fp32 / fp8) */
    constexpr int LDB = D + 8;        /* bf16 row stride */
    constexpr int EPC = 16 / (int)sizeof(T); /* elements per 16-byte chunk */
    constexpr int C4 = D / EPC;       /* 16-byte chunks per cache row */
    constexpr int TILE_F = FA_BN * D; /* elements per staged fp32 / fp8 tile */
    constexpr int TILE_B = FA_BN * LDB; /* elements per bf16 tile */
    static_assert(!BF || FA_BM * LDB == 2 * TILE_B, "Q tile fits stage 1");
    extern __shared__ float4 fa_smem4[];
    T *stage = (T *)fa_smem4;                               /* fp32 / fp8: [2][K,V][FA_BN][D] */
    /* fp32 / fp8: one K and one V bf16 tile after the stages; bf16: [2][K,V][FA_BN][LDB] */
    __nv_bfloat16 *tiles = BF ? (__nv_bfloat16 *)fa_smem4 : (__nv_bfloat16 *)(stage + 4 * TILE_F);
    __nv_bfloat16 *qb = BF ? tiles + 2 * TILE_B : tiles;    /* [FA_BM][LDB], before tile 0 */
    __shared__ int sc_warp[FA_WARPS], found[2], pos_s[2];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int h = blockIdx.x, g = h / a.group;
    int s, tile; /* which (sequence, query tile) this CTA owns */
    if (!prefill_tile_of<FA_THREADS, FA_BM>(a.q_start, a.n_seqs, sc_warp, found, &s, &tile)) return;
    long r0 = a.q_start[s] + (long)tile * FA_BM;
    int nrows = min(FA_BM, (int)(a.q_start[s + 1] - r0));
    if (tid == 0) pos_s[0] = a.positions[r0 + nrows - 1] + 1; /* rows are in position order */
    const int32_t *pages = a.kv_pages + a.kv_page_start[s];
    const T *kbase = (const T *)a.k_cache + (long)g * D, *vbase = (const T *)a.v_cache + (long)g * D;

    /* this thread's two rows (g, g + 8 of the warp's 16) and their positions */
    int ra = warp * 16 + (lane >> 2), rb = ra + 8;
    int pa = a.positions[r0 + min(ra, nrows - 1)], pb = a.positions[r0 + min(rb, nrows - 1)];
    /* sliding window: row a sees la..pa (la = pa − window + 1), row b lb..pb */
    int la = a.window > 0 ? pa - a.window + 1 : 0, lb = a.window > 0 ? pb - a.window + 1 : 0;
    int wmin = min(pa, pb), wlo = max(la, lb);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
        wlo = max(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    }
    /* the CTA's first position: the window's start for its first row (rows
     * are in position order); tiles before it are skipped, its positions
     * before it zero-filled and masked */
    const int kv_lo = window_first(a.window, a.positions[r0] + 1), kt0 = kv_lo / FA_BN;
    __syncthreads();
    int kv_end = pos_s[0];
    int n_tiles = (kv_end + FA_BN - 1) / FA_BN;

    /* Tile loads: thread tid copies 16-byte chunk i = tid + it·FA_THREADS
     * (row i / C4). A warp touches 8 rows per tile; lanes 0..7 look their
     * slots up in the page table once and shuffle them to the others. */
    constexpr int RPW = 32 / C4;                    /* rows per warp per iteration */
    constexpr int NIT = FA_BN * C4 / FA_THREADS;    /* iterations per tile */
    static_assert(C4 <= 32 && NIT * RPW <= 32 && NIT * FA_THREADS == FA_BN * C4, "tile load mapping");
    auto load_tile = [&](int st, int kt) {
        long long my_slot = -1;
        if (lane < NIT * RPW) {
            int p = kt * FA_BN + warp * RPW + lane % RPW + lane / RPW * (FA_THREADS / C4);
            if (p < kv_end && p >= kv_lo)
                my_slot = (long long)pages[p / a.page_size] * a.page_size + p % a.page_size;
        }
#pragma unroll
        for (int it = 0; it < NIT; it++) {
            int i = tid + it * FA_THREADS, j = i / C4, c4 = i % C4;
            long long slot = __shfl_sync(0xffffffffu, my_slot, it * RPW + lane / C4);
            bool valid = slot >= 0;
            if (!valid) slot = 0;
            void *kd, *vd;
            if constexpr (BF) {
                kd = tiles + st * 2 * TILE_B + j * LDB + c4 * EPC;
                vd = (__nv_bfloat16 *)kd + TILE_B;
            } else {
                kd = stage + st * 2 * TILE_F + j * D + c4 * EPC;
                vd = (T *)kd + TILE_F;
            }
            ptx_cp_async16_zfill(kd, kbase + slot * a.k_stride + c4 * EPC, valid);
            ptx_cp_async16_zfill(vd, vbase + slot * a.v_stride + c4 * EPC, valid);
        }
    };
    load_tile(0, kt0);
    ptx_cp_async_commit();

    /* Q → bf16 → A fragments (rows past the tile are zeros) */
    for (int i = tid; i < FA_BM * (D / 4); i += FA_THREADS) {
        int r = i / (D / 4), c4 = i % (D / 4);
        float4 v = r < nrows ? *(const float4 *)(a.q + (r0 + r) * a.ldq + (long)h * D + c4 * 4)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        uint2 pk = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
        *(uint2 *)(qb + r * LDB + c4 * 4) = pk;
    }
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        int mi = lane >> 3;
        ptx_ldmatrix_x4(qf[ks], qb + (warp * 16 + (lane & 7) + (mi & 1) * 8) * LDB + ks * 16 + (mi >> 1) * 8);
    }

    float oacc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    int col0 = 2 * (lane & 3);

    for (int kt = kt0; kt < n_tiles; kt++) {
        const int it = kt - kt0; /* stage it & 1 holds tile kt */
        /* bf16: stage (it+1)&1 held tile kt-1 (or Q): every warp is done with it */
        if constexpr (BF) __syncthreads();
        if (kt + 1 < n_tiles) {
            load_tile((it + 1) & 1, kt + 1);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads(); /* tile kt landed; every warp is done with kb/vb (and qb) */
        __nv_bfloat16 *kb = BF ? tiles + (it & 1) * 2 * TILE_B : tiles, *vb = kb + TILE_B;
        if constexpr (!BF) {
            const T *ks = stage + (it & 1) * 2 * TILE_F, *vs = ks + TILE_F;
#pragma unroll 4
            for (int i = tid; i < FA_BN * (D / 4); i += FA_THREADS) {
                int j = i / (D / 4), c4 = i % (D / 4);
                float4 k4 = stage_get4(ks + j * D + c4 * 4);
                float4 v4 = stage_get4(vs + j * D + c4 * 4);
                *(uint2 *)(kb + j * LDB + c4 * 4) = make_uint2(pack_bf16(k4.x, k4.y), pack_bf16(k4.z, k4.w));
                *(uint2 *)(vb + j * LDB + c4 * 4) = make_uint2(pack_bf16(v4.x, v4.y), pack_bf16(v4.z, v4.w));
            }
            __syncthreads();
        }

        /* S = Q·Kᵀ for the warp's 16 rows × 64 positions */
        float sacc[FA_BN / 8][4];
#pragma unroll
        for (int i = 0; i < FA_BN / 8; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
            for (int np = 0; np < FA_BN / 16; np++) {
                uint32_t b[4];
                int mi = lane >> 3;
                ptx_ldmatrix_x4(b, kb + (np * 16 + (lane & 7) + (mi >> 1) * 8) * LDB + ks * 16 + (mi & 1) * 8);
                ptx_mma_m16n8k16<__nv_bfloat16>(sacc[2 * np], qf[ks], b[0], b[1]);
                ptx_mma_m16n8k16<__nv_bfloat16>(sacc[2 * np + 1], qf[ks], b[2], b[3]);
            }
        }
        /* scale, mask (only tiles that cross a row's position), online softmax */
        bool mask = kt * FA_BN + FA_BN - 1 > wmin || kt * FA_BN < wlo;
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < FA_BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sacc[nt][e] * a.scale_log2;
                if (mask) {
                    int p = kt * FA_BN + nt * 8 + col0 + (e & 1);
                    if (p > (e < 2 ? pa : pb) || p < (e < 2 ? la : lb)) v = -INFINITY;
                }
                sacc[nt][e] = v;
            }
            mx_a = fmaxf(mx_a, fmaxf(sacc[nt][0], sacc[nt][1]));
            mx_b = fmaxf(mx_b, fmaxf(sacc[nt][2], sacc[nt][3]));
        }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
        /* a row with nothing in view so far (window) keeps m = −inf and
         * takes 0 as its reference: its p and corr are then 0, not NaN */
        float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        if (mn_a == -INFINITY) mn_a = 0.0f;
        if (mn_b == -INFINITY) mn_b = 0.0f;
        float corr_a = exp2f(m_a - mn_a), corr_b = exp2f(m_b - mn_b);
        m_a = fmaxf(m_a, mx_a), m_b = fmaxf(m_b, mx_b);
        float sum_a = 0.0f, sum_b = 0.0f;
        uint32_t pf[FA_BN / 16][4];
#pragma unroll
        for (int nt = 0; nt < FA_BN / 8; nt++) {
            float p0 = exp2f(sacc[nt][0] - mn_a), p1 = exp2f(sacc[nt][1] - mn_a);
            float p2 = exp2f(sacc[nt][2] - mn_b), p3 = exp2f(sacc[nt][3] - mn_b);
            sum_a += p0 + p1;
            sum_b += p2 + p3;
            pf[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(p0, p1);
            pf[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
        l_a = l_a * corr_a + sum_a;
        l_b = l_b * corr_b + sum_b;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            oacc[i][0] *= corr_a, oacc[i][1] *= corr_a;
            oacc[i][2] *= corr_b, oacc[i][3] *= corr_b;
        }
        /* O += P·V */
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                int mi = lane >> 3;
                ptx_ldmatrix_x4_trans(b, vb + (kk * 16 + (lane & 7) + (mi & 1) * 8) * LDB + dp * 16 + (mi >> 1) * 8);
                ptx_mma_m16n8k16<__nv_bfloat16>(oacc[2 * dp], pf[kk], b[0], b[1]);
                ptx_mma_m16n8k16<__nv_bfloat16>(oacc[2 * dp + 1], pf[kk], b[2], b[3]);
            }
        }
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    float inv_a = a.vscale / (l_a + sink_share(a.sinks, h, m_a, true));
    float inv_b = a.vscale / (l_b + sink_share(a.sinks, h, m_b, true));
    float *oa = a.out + (r0 + ra) * a.ldo + (long)h * D + col0;
    float *ob = a.out + (r0 + rb) * a.ldo + (long)h * D + col0;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        if (ra < nrows) *(float2 *)(oa + nt * 8) = make_float2(oacc[nt][0] * inv_a, oacc[nt][1] * inv_a);
        if (rb < nrows) *(float2 *)(ob + nt * 8) = make_float2(oacc[nt][2] * inv_b, oacc[nt][3] * inv_b);
    }
}

template <typename KT, int D>
static void launch_fa(struct cuda_ctx *c, const struct fa_args &a, const struct backend_batch *b) {
    /* Tiles of FA_BM rows over the sequences with more than one new token:
     * at most ⌈T/BM⌉ + S, and (P sequences of ≥ 2 rows each) at most
     * 2(T−S)/BM + (T−S) + 1. Surplus CTAs find no tile and return. */
    long T = b->n_tokens, S = b->n_seqs;
    long bound1 = (T + FA_BM - 1) / FA_BM + S, bound2 = (2 * (T - S) + FA_BM - 1) / FA_BM + (T - S) + 1;
    long tiles = bound1 < bound2 ? bound1 : bound2;
    CUDA_ASSERT(tiles <= 65535);
    size_t smem = fa_smem_bytes(D, sizeof(KT) == 2, (int)sizeof(KT));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_kernel<KT, D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)a.n_heads, (unsigned)tiles);
    fa_prefill_kernel<KT, D><<<grid, FA_THREADS, smem, c->stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_attn_fa_prefill(struct cuda_ctx *c, float *out, long ldo, const float *q,
                                     long ldq, const void *k_cache, const void *v_cache,
                                     const struct attn_params *p, const struct backend_batch *b) {
    CUDA_ASSERT(p->dk == p->dv && (p->dk == 64 || p->dk == 128));
    struct fa_args a = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride, p->v_stride,
                        p->n_heads, p->n_heads / p->n_kv_heads,
                        k_scale_of(c, p) * 1.4426950408889634f, b->n_seqs, b->page_size,
                        b->positions, b->q_start, b->kv_page_start, b->kv_pages,
                        v_scale_of(c, p), p->window, p->sinks};
    int kt = kv_type(c, p);
    if (kt == KV_BF16) {
        if (p->dk == 64) launch_fa<__nv_bfloat16, 64>(c, a, b);
        else launch_fa<__nv_bfloat16, 128>(c, a, b);
    } else if (kt == KV_FP8) {
        if (p->dk == 64) launch_fa<kv_fp8_t, 64>(c, a, b);
        else launch_fa<kv_fp8_t, 128>(c, a, b);
    } else {
        if (p->dk == 64) launch_fa<float, 64>(c, a, b);
        else launch_fa<float, 128>(c, a, b);
    }
}
