/* cuda_attn_decode.cu — decode attention on the bf16 or FP8 (e4m3) KV
 * cache: the rows of sequences with one new token, dk = dv = D ∈ {64, 128}
 * (Llama, Qwen, Mistral shapes), on tensor cores, with sliding windows
 * (the chunks before the window skipped, its first chunk's earlier
 * positions zero-filled and masked) and attention sinks (joining the sum
 * once, at the output). cuda_attention.cu dispatches here; the fp32 cache,
 * MLA (dk 576 / dv 512), odd head sizes and the KILN_CUDA_ATTN overrides
 * keep the kernels there. The FP8 cache has its own pipeline (below);
 * k_scale is folded into the scores' scale, v_scale into the output.
 *
 * Why this shape. A decode row reads every K/V row of its sequence once
 * and does 2·D flops per element read per query head: far too little work
 * for the tensor cores to matter, so the kernel is about keeping bytes in
 * flight. The previous split-KV kernel computed in fp32 on CUDA cores with
 * 4 elements per lane per load: 8-byte loads on the bf16 cache, a few
 * rows in flight per warp, load-latency-bound (71% of the copy bandwidth
 * at 32 × 4096 with fp32, less with bf16). Here:
 *
 *  - K/V tiles go into shared memory with 16-byte `cp.async` loads (a warp
 *    copies its whole tile of BN positions at once: 16 KB at BN = 32,
 *    D = 128), and the next chunk's K tile is issued as soon as Q·Kᵀ has
 *    read the current one, its V tile after P·V: a warp always has a tile
 *    on its way while it computes.
 *  - The query heads that share a KV head (the GQA group, up to 8 per CTA)
 *    are the M dimension of `mma.sync.m16n8k16`: one pass over a K/V tile
 *    serves all of them. Rows 0–7 of the A operand hold the heads' values
 *    rounded to bf16 (hi), rows 8–15 the bf16 rounding of what is left
 *    (lo = bf16(x − hi)). One mma then gives hi·k and lo·k in the two halves
 *    of its accumulator, and their sum carries q (and, for P·V, p) to
 *    2^-17 relative instead of bf16's 2^-9: K and V are exactly bf16, the
 *    products are exact and the sums fp32, so the result is fp32-grade
 *    (measured against float64 in dev/attention; test_cuda_ops compares
 *    with the CPU at 1e-5) for the cost of rows that would otherwise be
 *    padding. Group sizes above 8 take several head blocks (CTAs).
 *  - Q·Kᵀ and P·V use `ldmatrix` fragments from rows padded by 16 bytes
 *    (conflict-free), as the prefill kernel does.
 *
 * Work decomposition and batch invariance. A CTA of W warps (4, or 2 for
 * big batches: ad_warps_for) owns (row, KV head, head block). The context
 * is cut into chunks of AD_TPC = 4 tiles of BN positions (BN = AD_BN_D128 =
 * 32 at head size 128, AD_BN_D64 = 64 at 64) aligned to position 0 — a
 * constant per head size, never derived from the batch, the warps, the SM
 * count or the split — and warp w takes tiles w, w + W, … of each chunk
 * (one after the other, the next tile's K and V loading while one
 * computes). A tile state (max m, exp-sum l, acc[D] per head) is a
 * fixed function of the tile; the chunk state is the four tile states
 * folded in tile order (shared memory); the row's result is the chunk
 * states folded in chunk order starting from the empty state, every fold
 * by ad_merge with its roundings spelled out (__fmaf_rn / __fmul_rn:
 * nothing for the compiler to contract differently in the two places it
 * is inlined). Two ways to run it, chosen per launch from the number of
 * rows and max_context only (graph-capturable):
 *  - unsplit: one CTA walks the row's chunks and folds as it goes;
 *  - split (fewer CTAs than the GPU holds at once): slot y of a row takes
 *    chunks y, y + slots, … and writes each chunk state to scratch; the
 *    last CTA of the row to finish (an arrival counter per (row, KV head,
 *    head block), reset to zero by that CTA, so it is zero between
 *    launches) stages the chunk states in shared memory and folds them in
 *    chunk order. No second launch.
 * Both compute the same chunk states and fold them in the same order, so a
 * row's bits do not depend on the batch, the slots or the path
 * (dev/attention checks this bitwise; test_deterministic end to end).
 * Rows whose chunks do not fit in the scratch run unsplit.
 *
 * The FP8 cache. Half the bytes per position means twice the arithmetic
 * per byte, so this path is about instructions per byte and warps per
 * SM. The operands are f16 (e4m3 → f16x2 is one exact cvt) read straight
 * from the e4m3 stages, with no 16-bit tiles: Q·Kᵀ's B fragments are a
 * lane's 8 staged bytes of its position, which serve a pair of k-steps
 * (q's dimensions permuted to match: the sum over dimensions is the same
 * in any order); P·V's come from ldmatrix.trans of the V stage read as
 * 16-bit pairs of dimensions — a lane gets dims (2c, 2c + 1) of positions
 * (2·tq, 2·tq + 1), and one byte permute splits them into the fragments
 * of an even-dims and an odd-dims column tile. Staged rows are padded
 * (K D + 32, V D + 16 bytes) so both reads are conflict-free. A warp
 * keeps NS = 2 items in flight (K and V one cp.async group each, the next
 * item's K issued once Q·Kᵀ has read the stage, its V after P·V), which
 * leaves two CTAs of 4 warps an SM, as on the bf16 cache. q and p are
 * split hi + lo in f16 as above (f16's narrower range: q · scale · log2 e
 * must stay under 65504; lo parts under 2^-14 lose bits as subnormals, an
 * absolute 2^-25, far under the e4m3 values' own rounding).
 *
 * Programmatic dependent launch (cuda_pdl.cuh): the
 * kernel triggers its dependents first thing, then does everything that
 * needs only the batch metadata — the row's q_start / position (len, the
 * chunk count, split or not), the page-table lookups of its first tile and,
 * when that tile ends before this step's token, its K/V copies — before
 * pdl_wait; the tiles that hold this step's token (its cache row is written
 * by the store kernel just before), q, the scratch states and the arrival
 * counters are touched only after it. A CTA with no work waits
 * before returning (rule 1). The counters stay correct: every access to
 * them is after the wait, which returns only once every earlier kernel —
 * the previous layer's attention included — has completed.
 */
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/cuda_pdl.cuh"

enum {
    AD_HB = 8, /* query heads per CTA: mma rows 0-7 (hi) and 8-15 (lo) */
    AD_COUNTERS = CUDA_ATTN_COUNTER_BYTES / 4,
    /* positions per warp per chunk (chunks of 4 × that): measured best in
     * dev/attention on the H100 (head size 128: 32, two CTAs per SM; 64:
     * 64, two CTAs per SM) */
    AD_BN_D128 = 32,
    AD_BN_D64 = 64,
    AD_TPC = 4, /* tiles of BN positions per chunk, whatever the warps per CTA */
    /* warps per CTA at head size 64 (head size 128: cuda_ctx.ad_warps) */
    AD_W_D64 = 4,
};

struct ad_args {
    void *out; /* [rows][ldo] of the kernel's output type O (fp32, bf16 or f16) */
    long ldo;
    const float *q;
    long ldq;
    const void *k, *v; /* bf16, or e4m3 (F8) */
    long k_stride, v_stride;
    int n_heads, n_kv_heads, group, hblocks;
    float scale_log2; /* softmax scale · log2(e): scores in the log2 domain */
    int page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int max_chunks;     /* chunk states per (row, head) in `partial`; 0: no split */
    float *partial;     /* [rows][n_heads][max_chunks][D + 4]: acc[D], m, l */
    unsigned *counters; /* [rows · n_kv_heads · hblocks] arrivals, zero between launches */
    int window;         /* attn_params.window: 0, every position */
    const float *sinks; /* attn_params.sinks: NULL, none */
    float vscale;       /* the FP8 cache's v_scale (k_scale is in scale_log2); 1 on bf16 */
};

/* F8: the FP8 cache. A warp keeps NS = 2 items (a tile's K and V rows)
 * in flight in its e4m3 stages, and the mma reads its operands from them
 * (below, "The FP8 cache"): no 16-bit tiles. */
template <int D, int BN, int W, bool F8 = false>
struct ad_cfg {
    static constexpr int THREADS = W * 32;
    static constexpr int TPW = AD_TPC / W;           /* tiles of a chunk per warp */
    static constexpr int LDB = D + 8;                /* bf16 tile row stride (16-byte pad) */
    static constexpr int TILE = BN * LDB;            /* elements of one K or V tile */
    static constexpr int CHUNK = AD_TPC * BN;        /* positions per chunk */
    /* fold buffer row stride (floats): F8's float4 stores of rows hr and
     * hr + 1 in distinct banks */
    static constexpr int LDF = F8 ? D + 16 : D + 8;
    static constexpr int DS = D + 4;                 /* chunk state stride: acc[D], m, l, pad */
    static constexpr int EPT = AD_HB * D / THREADS;  /* fold elements per thread (contiguous) */
    static constexpr int TPH = D / EPT;              /* fold threads per head */
    static constexpr size_t FOLD_BYTES = (size_t)AD_TPC * AD_HB * LDF * 4 + (size_t)AD_TPC * AD_HB * 8;
    /* F8 staging rows (bytes): K at D + 32, so that the 8-byte fragment
     * loads of 16 lanes (4 rows) fall in distinct banks; V at D + 16, so
     * that ldmatrix's 8 rows of 16 bytes do. One stage holds an item. */
    static constexpr int KLD = D + 32, VLD = D + 16;
    static constexpr size_t STG = (size_t)BN * (KLD + VLD);
    static constexpr int NS = F8 ? 2 : 1;
    /* a warp's bytes: bf16 its K and V tiles; F8 its stages */
    static constexpr size_t WARP_BYTES = F8 ? NS * STG : (size_t)2 * TILE * 2;
    static constexpr size_t TILE_BYTES = (size_t)W * WARP_BYTES;
    static constexpr size_t SMEM = TILE_BYTES + FOLD_BYTES;
    /* CTAs per SM the shared memory allows (228 KB per SM, 1 KB per CTA reserved) */
    static constexpr int MINB = (int)(228 * 1024 / (SMEM + 1024)) < 1   ? 1
                                : (int)(228 * 1024 / (SMEM + 1024)) > 4 ? 4
                                                                        : (int)(228 * 1024 / (SMEM + 1024));
    static_assert(EPT % 4 == 0 && TPH * AD_HB == THREADS, "fold mapping");
    static_assert(AD_TPC % W == 0, "whole tiles per warp");
    static_assert(BN % 32 == 0 && D % 32 == 0, "tile shape");
};

/* K/V loads are marked L2 evict-first: read once a step, they should not
 * push out what the L2 holds for the next kernel (activations, weight
 * tiles); docs/cuda-decode.md. */
static __device__ __forceinline__ uint64_t ad_policy(void) {
    uint64_t p = ptx_policy_evict_first();
    return p;
}
/* (x, y) → hi = T(x), T(y) and lo = T of the remainders (T: bf16, or f16
 * on the FP8 cache), packed as mma operands (first element in the low
 * half). x − hi is exact. */
template <typename T>
static __device__ __forceinline__ void ad_split2(float x, float y, uint32_t *hi, uint32_t *lo) {
    if constexpr (std::is_same<T, __half>::value) {
        __half2 h = __floats2half2_rn(x, y);
        float2 hf = __half22float2(h);
        __half2 l = __floats2half2_rn(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
        *hi = *(uint32_t *)&h;
        *lo = *(uint32_t *)&l;
    } else {
        __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        float2 hf = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
        *hi = *(uint32_t *)&h;
        *lo = *(uint32_t *)&l;
    }
}

/* Folds state (mc, lc, oc) into (m, l, o), log2 domain. (m, l, o) may be
 * the empty state (−inf, 0, 0); (mc, lc, oc) never is. */
template <int N>
static __device__ __forceinline__ void ad_merge(float &m, float &l, float *o, float mc, float lc,
                                                const float *oc) {
    float mn = fmaxf(m, mc);
    float fa = exp2f(m - mn), fc = exp2f(mc - mn); /* fa = 0 from the empty state */
    l = __fmaf_rn(l, fa, __fmul_rn(lc, fc));
#pragma unroll
    for (int e = 0; e < N; e++) o[e] = __fmaf_rn(o[e], fa, __fmul_rn(oc[e], fc));
    m = mn;
}

/* Two e4m3 values (the low 16 bits, first in the low byte) as f16x2,
 * exactly (one cvt) */
static __device__ __forceinline__ uint32_t ad_h2(uint32_t w) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}

template <int D, int BN, int W, typename O, bool F8>
static __global__ void __launch_bounds__(W * 32, (ad_cfg<D, BN, W, F8>::MINB))
    ad_kernel(const struct ad_args a) {
    using C = ad_cfg<D, BN, W, F8>;
    using KT = typename std::conditional<F8, kv_fp8_t, __nv_bfloat16>::type;
    using MT = typename std::conditional<F8, __half, __nv_bfloat16>::type; /* mma operands */
    constexpr int KS = D / 16;  /* k-steps of Q·Kᵀ */
    constexpr int NT = BN / 8;  /* 8-position column tiles of S */
    constexpr int DT = D / 8;   /* 8-dim column tiles of O */
    constexpr int SR = BN / 32; /* page-table lookups per lane per tile */
    constexpr int EPT = C::EPT;
    extern __shared__ float4 ad_smem4[];
    float *fold = (float *)((char *)ad_smem4 + C::TILE_BYTES);      /* [tile][AD_HB][LDF] */
    float2 *ml = (float2 *)(fold + AD_TPC * AD_HB * C::LDF);        /* [tile][AD_HB] (m, l) */
    __shared__ int last_s;
    pdl_trigger();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hr = lane >> 2, tq = lane & 3; /* mma: head row and column pair of this lane */
    const long unit = blockIdx.x;
    const int hb = (int)(unit % a.hblocks);
    const long rg = unit / a.hblocks;
    const int g = (int)(rg % a.n_kv_heads);
    const long row = rg / a.n_kv_heads; /* = the sequence */
    const long t = a.q_start[row];
    const int32_t *pages = a.kv_pages + a.kv_page_start[row]; /* loaded beside q_start */
    if (a.q_start[row + 1] - t != 1) { /* not a decode row (prefill kernel's) */
        pdl_wait();
        return;
    }
    const int len = a.positions[t] + 1;
    /* Sliding window: positions wfirst .. len − 1, chunks c0 .. cend − 1
     * (earlier chunks are skipped; positions before wfirst in chunk c0
     * are neither looked up nor loaded, and masked). nch counts the
     * window's chunks; chunk states are indexed from c0. */
    const int wfirst = a.window > 0 && len > a.window ? len - a.window : 0;
    const int c0 = wfirst / C::CHUNK, cend = (len + C::CHUNK - 1) / C::CHUNK;
    const int nch = cend - c0;
    const bool split = gridDim.y > 1 && nch > 1 && nch <= a.max_chunks;
    if (split ? (int)blockIdx.y >= nch : blockIdx.y != 0) {
        pdl_wait();
        return;
    }
    const int step = split ? (int)gridDim.y : 1;
    const int h0 = g * a.group + hb * AD_HB, nh = min(AD_HB, a.group - hb * AD_HB);
    const int fh = tid / C::TPH, fd = (tid % C::TPH) * EPT; /* fold: head, first dim */
    const KT *kbase = (const KT *)a.k + (long)g * D, *vbase = (const KT *)a.v + (long)g * D;
    /* bf16: this warp's K and V tiles. F8: its stages. */
    unsigned char *wbuf = (unsigned char *)ad_smem4 + (size_t)warp * C::WARP_BYTES;
    __nv_bfloat16 *kt = (__nv_bfloat16 *)wbuf, *vt = kt + C::TILE;
    const uint64_t kv_policy = ad_policy();

    /* Slots of positions p0 + lane + 32·i (−1 past the end), looked up once
     * per tile and shuffled to the lanes that copy the row. */
    auto lookup = [&](int p0, long long *sl) {
#pragma unroll
        for (int i = 0; i < SR; i++) {
            int p = p0 + lane + 32 * i;
            sl[i] = p < len && p >= wfirst
                        ? (long long)pages[p / a.page_size] * a.page_size + p % a.page_size
                        : -1;
        }
    };
    /* One K or V tile: a warp-iteration copies RPI whole rows (16 bytes a
     * lane: EPC elements) to rows of ld bytes at dst; rows past the end are
     * zero-filled (p = 0 there). */
    auto load = [&](void *dst, int ld, const KT *base, long stride, const long long *sl) {
        constexpr int EPC = 16 / (int)sizeof(KT), CK = D / EPC, RPI = 32 / CK, NIT = BN / RPI;
#pragma unroll
        for (int it = 0; it < NIT; it++) {
            int j = it * RPI + lane / CK, ck = lane % CK;
            long long s = __shfl_sync(0xffffffffu, sl[it * RPI / 32], j & 31);
            bool valid = s >= 0;
            ptx_cp_async16_zfill_hint((char *)dst + j * ld + ck * 16,
                                      base + (valid ? s : 0) * stride + ck * EPC, valid, kv_policy);
        }
    };

    /* The tile's softmax from its scores (hi + lo row halves), masked past
     * the end and before the window: the max mx, the sum of 2^(s − mx) and
     * P as A fragments (hi in rows 0-7, lo in rows 8-15). A tile wholly
     * before the window gives m = −inf, sum 0 (reference 0: no NaN); the
     * chunk fold skips it. */
    auto softmax = [&](const float (*sacc)[4], int p0, float &mx, float &sum, uint32_t (*pf)[4]) {
        float sv[NT][2];
        mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float s = __fadd_rn(sacc[nt][e], sacc[nt][e + 2]);
                int pp = p0 + nt * 8 + 2 * tq + e;
                sv[nt][e] = pp < len && pp >= wfirst ? s : -INFINITY;
                mx = fmaxf(mx, sv[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mref = mx == -INFINITY ? 0.0f : mx;
        sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float e0 = exp2f(sv[nt][0] - mref), e1 = exp2f(sv[nt][1] - mref);
            sum = __fadd_rn(__fadd_rn(sum, e0), e1);
            ad_split2<MT>(e0, e1, &pf[nt >> 1][(nt & 1) * 2], &pf[nt >> 1][(nt & 1) * 2 + 1]);
        }
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
    };
    /* P·V from the bf16 V tile */
    auto pv = [&](const uint32_t (*pf)[4], float (*oacc)[4]) {
#pragma unroll
        for (int i = 0; i < DT; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NT / 2; kk++)
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                int mi = lane >> 3;
                ptx_ldmatrix_x4_trans(b, vt + (kk * 16 + (lane & 7) + (mi & 1) * 8) * C::LDB + dp * 16 + (mi >> 1) * 8);
                ptx_mma_m16n8k16<MT>(oacc[2 * dp], pf[kk], b[0], b[1]);
                ptx_mma_m16n8k16<MT>(oacc[2 * dp + 1], pf[kk], b[2], b[3]);
            }
        __syncwarp(); /* every lane is done with vt */
    };
    /* the tile state (head hr's acc = hi + lo rows, m, l) for the chunk fold */
    auto put_state = [&](const float (*oacc)[4], int tile, float mx, float sum) {
        float *fw = fold + (tile * AD_HB + hr) * C::LDF + 2 * tq;
#pragma unroll
        for (int j = 0; j < DT; j++)
            *(float2 *)(fw + 8 * j) =
                make_float2(__fadd_rn(oacc[j][0], oacc[j][2]), __fadd_rn(oacc[j][1], oacc[j][3]));
        if (tq == 0) ml[tile * AD_HB + hr] = make_float2(mx, sum);
    };

    /* A warp's items: tiles warp, warp + W, … of chunks c, c + step, …
     * (item i: tile warp + (i mod TPW)·W of chunk c + ⌊i / TPW⌋·step).
     * Positions only grow along the items, so past the first empty one
     * all are empty. */
    int c = c0 + blockIdx.y;
    const int cfirst = c;
    /* F8: the first position of item i (len when it is empty), and its K
     * or V copies into stage i mod NS from its looked-up slots si */
    auto item_p0 = [&](int i) -> int {
        const int ci = cfirst + (i / C::TPW) * step, p0 = ci * C::CHUNK + (warp + (i % C::TPW) * W) * BN;
        return ci < cend && p0 < len ? p0 : len;
    };
    auto copy_k = [&](int i, const long long *si) {
        load(wbuf + (size_t)(i % C::NS) * C::STG, C::KLD, kbase, a.k_stride, si);
    };
    auto copy_v = [&](int i, const long long *si) {
        load(wbuf + (size_t)(i % C::NS) * C::STG + BN * C::KLD, C::VLD, vbase, a.v_stride, si);
    };
    long long sl[SR];
    const bool first = c * C::CHUNK + warp * BN < len;
    if (first) lookup(c * C::CHUNK + warp * BN, sl); /* page table: metadata, before the wait */
    /* A first tile that ends before this step's token (position len − 1,
     * which the kernel before writes) holds only K/V rows no kernel of this
     * step writes: its copies go out before the wait, under the previous
     * kernels' tails (cuda_pdl.cuh rule 2). */
    const bool early = first && c * C::CHUNK + warp * BN + BN < len;
    if constexpr (F8) { /* K and V groups of items 0 .. NS − 1 */
        if (early) {
            copy_k(0, sl);
            ptx_cp_async_commit();
            copy_v(0, sl);
            ptx_cp_async_commit();
        }
        pdl_wait(); /* q and the cache row of this step's token come from the kernels before */
        if (!early) {
            if (first) copy_k(0, sl);
            ptx_cp_async_commit();
            if (first) copy_v(0, sl);
            ptx_cp_async_commit();
        }
#pragma unroll
        for (int i = 1; i < C::NS; i++) {
            const int pi = item_p0(i);
            if (pi < len) lookup(pi, sl);
            if (pi < len) copy_k(i, sl);
            ptx_cp_async_commit();
            if (pi < len) copy_v(i, sl);
            ptx_cp_async_commit();
        }
    } else { /* K and V groups of item 0 */
        if (early) {
            load(kt, C::LDB * 2, kbase, a.k_stride, sl);
            ptx_cp_async_commit();
            load(vt, C::LDB * 2, vbase, a.v_stride, sl);
            ptx_cp_async_commit();
        }
        pdl_wait(); /* q and the cache row of this step's token come from the kernels before */
        if (first && !early) {
            load(kt, C::LDB * 2, kbase, a.k_stride, sl);
            ptx_cp_async_commit();
            load(vt, C::LDB * 2, vbase, a.v_stride, sl);
            ptx_cp_async_commit();
        }
    }

    /* Q of the block's heads, pre-scaled by scale·log2(e), as A fragments:
     * rows 0-7 hi, rows 8-15 lo; heads past the block are zeros. bf16: k
     * index 2·tq + e of k-step ks is dimension 16·ks + 2·tq + e (and + 8).
     * F8: k-steps come in pairs (2s, 2s + 1) whose k index 2·tq + e (+ 8)
     * is dimension 32·s + 8·tq + 4·(ks − 2s) + e (+ 2), the order of the
     * staged K bytes a lane reads at once (the sum over dimensions is the
     * same in any order). */
    uint32_t qf[KS][4];
    {
        const bool hv = hr < nh;
        const float *qr = a.q + t * a.ldq + (long)(h0 + (hv ? hr : 0)) * D;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int d0 = F8 ? 32 * (ks >> 1) + 8 * tq + 4 * (ks & 1) : 16 * ks + 2 * tq;
            const int d1 = F8 ? d0 + 2 : d0 + 8;
            float2 x0 = hv ? *(const float2 *)(qr + d0) : make_float2(0.f, 0.f);
            float2 x1 = hv ? *(const float2 *)(qr + d1) : make_float2(0.f, 0.f);
            ad_split2<MT>(__fmul_rn(x0.x, a.scale_log2), __fmul_rn(x0.y, a.scale_log2), &qf[ks][0], &qf[ks][1]);
            ad_split2<MT>(__fmul_rn(x1.x, a.scale_log2), __fmul_rn(x1.y, a.scale_log2), &qf[ks][2], &qf[ks][3]);
        }
    }

    float rm = -INFINITY, rl = 0.0f, ro[EPT]; /* the row's running state (unsplit) */
#pragma unroll
    for (int e = 0; e < EPT; e++) ro[e] = 0.0f;

    /* F8: the warp's next item (its stage: item mod NS), and the slots of
     * item + NS, looked up one item ahead so that the page-table loads are
     * off the copies' path */
    int item = 0, pn = len;
    if constexpr (F8) {
        pn = item_p0(C::NS);
        if (pn < len) lookup(pn, sl);
    }
    for (; c < cend; c += step) {
#pragma unroll 1
        for (int j = 0; j < C::TPW; j++) {
            const int tile = warp + j * W, p0 = c * C::CHUNK + tile * BN;
            if (p0 >= len) continue; /* this tile of chunk c is empty */
            float sacc[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
            uint32_t pf[NT / 2][4];
            float mx, sum;
            if constexpr (F8) {
                /* The FP8 cache: groups K, V of each item in order; item
                 * `item`'s K (then V) landed when at most 2·NS − 1 groups
                 * are pending (the copies of item + NS go out in between) */
                const unsigned char *ks8 = wbuf + (size_t)(item % C::NS) * C::STG, *vs8 = ks8 + BN * C::KLD;
                ptx_cp_async_wait<2 * C::NS - 1>();
                __syncwarp();
                /* Q·Kᵀ: a lane's 8 staged bytes of its position (column
                 * hr of the 8-position tile nt) are the B fragments of a
                 * pair of k-steps, each e4m3 pair one cvt to f16x2 */
#pragma unroll
                for (int s2 = 0; s2 < KS / 2; s2++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        uint2 w = *(const uint2 *)(ks8 + (nt * 8 + hr) * C::KLD + 32 * s2 + 8 * tq);
                        ptx_mma_m16n8k16<MT>(sacc[nt], qf[2 * s2], ad_h2(w.x), ad_h2(w.x >> 16));
                        ptx_mma_m16n8k16<MT>(sacc[nt], qf[2 * s2 + 1], ad_h2(w.y), ad_h2(w.y >> 16));
                    }
                __syncwarp(); /* every lane is done with the K stage */
                if (pn < len) copy_k(item + C::NS, sl);
                ptx_cp_async_commit();
                softmax(sacc, p0, mx, sum, pf);
                ptx_cp_async_wait<2 * C::NS - 1>();
                __syncwarp(); /* V landed */
                /* P·V straight from the staged V bytes: ldmatrix.trans of
                 * the stage as 16-bit pairs gives a lane the dims (2c, 2c+1)
                 * of positions (2·tq, 2·tq + 1), which one byte permute
                 * and two cvts make the B fragments of two 8-column tiles:
                 * the even dims (ov[2cb]) and the odd ones (ov[2cb + 1]) of
                 * the 16-dim block cb. A lane's accumulators of the pair
                 * are then dims 16·cb + 4·tq + 0..3. */
                float oacc[DT][4];
#pragma unroll
                for (int i = 0; i < DT; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < NT / 2; kk++)
#pragma unroll
                    for (int cb = 0; cb < D / 16; cb += 2) {
                        uint32_t b[4];
                        int mi = lane >> 3;
                        ptx_ldmatrix_x4_trans(b, vs8 + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * C::VLD + (cb + (mi >> 1)) * 16);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            uint32_t lo = __byte_perm(b[2 * h], 0, 0x3120), hi = __byte_perm(b[2 * h + 1], 0, 0x3120);
                            ptx_mma_m16n8k16<MT>(oacc[2 * (cb + h)], pf[kk], ad_h2(lo), ad_h2(hi));
                            ptx_mma_m16n8k16<MT>(oacc[2 * (cb + h) + 1], pf[kk], ad_h2(lo >> 16), ad_h2(hi >> 16));
                        }
                    }
                __syncwarp(); /* every lane is done with the V stage */
                if (pn < len) copy_v(item + C::NS, sl);
                ptx_cp_async_commit();
                item++;
                pn = item_p0(item + C::NS);
                if (pn < len) lookup(pn, sl);
                float *fw = fold + (tile * AD_HB + hr) * C::LDF + 4 * tq;
#pragma unroll
                for (int cb = 0; cb < D / 16; cb++) {
                    const float *e = oacc[2 * cb], *o = oacc[2 * cb + 1];
                    *(float4 *)(fw + 16 * cb) = make_float4(__fadd_rn(e[0], e[2]), __fadd_rn(o[0], o[2]),
                                                            __fadd_rn(e[1], e[3]), __fadd_rn(o[1], o[3]));
                }
                if (tq == 0) ml[tile * AD_HB + hr] = make_float2(mx, sum);
            } else {
                /* item j: tile `tile` of chunk c; the next item (its K and V
                 * are loaded while this one computes): tile + W, or tile
                 * `warp` of the warp's next chunk */
                const int cn = j + 1 < C::TPW ? c : c + step, tn = j + 1 < C::TPW ? tile + W : warp;
                const bool next = cn < cend && cn * C::CHUNK + tn * BN < len;
                ptx_cp_async_wait<1>(); /* K landed (V may still be on its way) */
                __syncwarp();
#pragma unroll
                for (int ks = 0; ks < KS; ks++)
#pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        uint32_t b[4];
                        int mi = lane >> 3;
                        ptx_ldmatrix_x4(b, kt + (np * 16 + (lane & 7) + (mi >> 1) * 8) * C::LDB + ks * 16 + (mi & 1) * 8);
                        ptx_mma_m16n8k16<MT>(sacc[2 * np], qf[ks], b[0], b[1]);
                        ptx_mma_m16n8k16<MT>(sacc[2 * np + 1], qf[ks], b[2], b[3]);
                    }
                __syncwarp(); /* every lane is done with kt */
                long long sn[SR];
                if (next) {
                    lookup(cn * C::CHUNK + tn * BN, sn);
                    load(kt, C::LDB * 2, kbase, a.k_stride, sn);
                    ptx_cp_async_commit();
                }
                softmax(sacc, p0, mx, sum, pf);
                if (next) ptx_cp_async_wait<1>();
                else ptx_cp_async_wait<0>();
                __syncwarp(); /* V landed */
                float oacc[DT][4];
                pv(pf, oacc);
                if (next) {
                    load(vt, C::LDB * 2, vbase, a.v_stride, sn);
                    ptx_cp_async_commit();
                }
                put_state(oacc, tile, mx, sum);
            }
        }
        __syncthreads();
        /* the chunk state: the tile states folded in tile order (tile 0 is
         * never past the end; before the window it is the empty state
         * (−inf, 0, 0), and so are the other tiles there, which are
         * skipped), whichever warps computed them */
        if (fh < nh) {
            float cm, cl, co[EPT], ow[EPT];
            {
                float2 s0 = ml[fh];
                cm = s0.x, cl = s0.y;
                const float *f0 = fold + fh * C::LDF + fd;
#pragma unroll
                for (int e = 0; e < EPT; e += 4) *(float4 *)(co + e) = *(const float4 *)(f0 + e);
            }
#pragma unroll
            for (int w = 1; w < AD_TPC; w++) {
                float2 sw = c * C::CHUNK + w * BN < len ? ml[w * AD_HB + fh] : make_float2(-INFINITY, 0.f);
                if (sw.x != -INFINITY) {
                    const float *fwp = fold + (w * AD_HB + fh) * C::LDF + fd;
#pragma unroll
                    for (int e = 0; e < EPT; e += 4) *(float4 *)(ow + e) = *(const float4 *)(fwp + e);
                    ad_merge<EPT>(cm, cl, co, sw.x, sw.y, ow);
                }
            }
            if (split) {
                float *st = a.partial + ((row * a.n_heads + h0 + fh) * (long)a.max_chunks + (c - c0)) * C::DS;
#pragma unroll
                for (int e = 0; e < EPT; e += 4) *(float4 *)(st + fd + e) = *(const float4 *)(co + e);
                if (fd == 0) *(float2 *)(st + D) = make_float2(cm, cl);
            } else {
                ad_merge<EPT>(rm, rl, ro, cm, cl, co);
            }
        }
        __syncthreads(); /* fold and ml are rewritten by the next chunk */
    }

    auto write_out = [&]() {
        if (fh < nh) {
            /* the sink (log2 domain, as the scores) joins the sum once, here */
            const float sk = a.sinks ? exp2f(__fmul_rn(a.sinks[h0 + fh], 1.4426950408889634f) - rm) : 0.0f;
            float inv = a.vscale / (rl + sk);
            O *o = (O *)a.out + t * a.ldo + (long)(h0 + fh) * D + fd;
#pragma unroll
            for (int e = 0; e < EPT; e++) o[e] = O(__fmul_rn(ro[e], inv)); /* 16-bit: nearest */
        }
    };
    if (!split) {
        write_out();
        return;
    }

    /* Split: the last CTA of the row to get here folds the chunk states. */
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned active = (unsigned)min((int)gridDim.y, nch);
        unsigned prev = atomicAdd(a.counters + unit, 1u);
        last_s = prev == active - 1;
        if (last_s) atomicExch(a.counters + unit, 0u); /* zero for the next launch */
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    /* Stage batches of chunk states in shared memory (every cp.async of the
     * tiles has completed: the last chunk waited for all groups), all
     * copies in flight at once, then fold them in chunk order. cp.async.cg
     * reads L2, where the other CTAs' states are. (Tried: the factors of
     * every chunk at once from prefix maxima of the chunks' m — the same
     * bits — with only l and acc folded serially: slower on the H100, b1
     * ctx 4096 12.5 → 13.7 µs, ctx 16384 44.5 → 50 µs, its prefix loops
     * being chains of shared-memory loads; a log-step scan would be next.) */
    float *stage = (float *)ad_smem4; /* [head][chunk of the batch][DS] */
    const int nb = (int)(C::TILE_BYTES / 4 / (size_t)(nh * C::DS));
    for (int cb = 0; cb < nch; cb += nb) {
        const int n = min(nb, nch - cb), q4 = n * C::DS / 4; /* 16-byte pieces per head */
        for (int i = tid; i < nh * q4; i += C::THREADS) {
            int h = i / q4, r = i % q4;
            const float *src =
                a.partial + ((row * a.n_heads + h0 + h) * (long)a.max_chunks + cb) * C::DS + r * 4;
            ptx_cp_async16_zfill(stage + (h * q4 + r) * 4, src, true);
        }
        ptx_cp_async_commit();
        ptx_cp_async_wait<0>();
        __syncthreads();
        if (fh < nh) {
            const float *sh = stage + fh * q4 * 4;
            for (int cc = 0; cc < n; cc++) {
                const float *sc = sh + cc * C::DS;
                float2 st = *(const float2 *)(sc + D);
                float oc[EPT];
#pragma unroll
                for (int e = 0; e < EPT; e += 4) *(float4 *)(oc + e) = *(const float4 *)(sc + fd + e);
                ad_merge<EPT>(rm, rl, ro, st.x, st.y, oc);
            }
        }
        __syncthreads(); /* the stage is refilled by the next batch */
    }
    write_out();
}

/* ------------------------------------------------------------------ */
/* Launch                                                                */
/* ------------------------------------------------------------------ */

/* Slots per row: when the (row, KV head, head block) CTAs are fewer than
 * the GPU holds at once, each row gets up to ⌊resident / CTAs⌋ slots (at
 * most its chunks at max_context, and what the scratch holds): one wave,
 * so that the slots that find no chunk at a shorter context are cheap and
 * no CTA waits for a second wave. Depends on rows and max_context only. */
template <int D, int BN, int W, typename O, bool F8>
static void ad_launch(struct cuda_ctx *c, struct ad_args a, long rows) {
    using C = ad_cfg<D, BN, W, F8>;
    long units = rows * a.n_kv_heads * (long)a.hblocks;
    CUDA_ASSERT(units < (1l << 31));
    CUDA_CHECK(cudaFuncSetAttribute(ad_kernel<D, BN, W, O, F8>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
    int occ = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ad_kernel<D, BN, W, O, F8>,
                                                             C::THREADS, C::SMEM));
    if (occ < 1) occ = 1;
    long wave = (long)occ * c->n_sm;
    long chunks = (c->max_context + C::CHUNK - 1) / C::CHUNK;
    long slots = 1;
    a.max_chunks = 0;
    a.partial = cuda_attn_states(c);
    a.counters = (unsigned *)c->attn.p;
    if (units < wave && chunks > 1 && units <= AD_COUNTERS) {
        long per_chunk = rows * a.n_heads * (long)C::DS * 4;
        long cap = (long)(cuda_attn_states_bytes(c) / (size_t)per_chunk);
        if (cap > chunks) cap = chunks;
        slots = wave / units;
        if (slots > cap) slots = cap;
        if (slots > 65535) slots = 65535;
        if (slots >= 2) a.max_chunks = (int)cap;
        else slots = 1;
    }
    pdl_launch(c, ad_kernel<D, BN, W, O, F8>, dim3((unsigned)units, (unsigned)slots),
                  dim3(C::THREADS), C::SMEM, a);
}

/* Warps per CTA at head size 128: 4, unless the (row, KV head, head
 * block) CTAs of 4 warps (2 an SM: 87 KB of shared memory each) would take
 * more than one wave; then 2 (52 KB, 4 an SM), each warp taking two of a
 * chunk's four tiles one after the other: Llama-3.1-8B's 64 sequences at
 * context 128 then run in one wave (attention 24.5 → 17-19 µs a layer,
 * docs/cuda-decode.md). Small batches keep 4 warps: their few CTAs split the
 * context over the GPU, and a CTA's one tile per warp is the shorter
 * chain (batch 1, context 4096: 7-15% slower with 2). The chunks and their
 * folds are the same either way, so the choice never changes a bit.
 * KILN_CUDA_AD_W=2|4 forces it. The FP8 cache always takes 4 warps: its
 * CTAs (two e4m3 stages a warp) fit two an SM at 4 warps (94 KB) and three
 * at 2 (56 KB), so 2 warps would give more CTAs an SM but fewer warps (6
 * against 8), and the FP8 kernel is bound by its warps' instruction latency
 * (Llama-3.1-8B on an H100, 64 sequences: 4 warps 5,122 tok/s against
 * 4,167 at context 4096, 10,147 against 9,984 at 128). */
static int ad_warps_for(struct cuda_ctx *c, const struct ad_args &a, long rows, bool f8) {
    if (c->ad_warps == 2 || c->ad_warps == 4) return c->ad_warps;
    if (f8) return 4;
    if (!c->ad_occ4) { /* shared memory bound, the same for every O */
        using C = ad_cfg<128, AD_BN_D128, 4, false>;
        CUDA_CHECK(cudaFuncSetAttribute(ad_kernel<128, AD_BN_D128, 4, float, false>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &c->ad_occ4, ad_kernel<128, AD_BN_D128, 4, float, false>, C::THREADS, C::SMEM));
        if (c->ad_occ4 < 1) c->ad_occ4 = 1;
    }
    long units = rows * a.n_kv_heads * (long)a.hblocks;
    return units > (long)c->ad_occ4 * c->n_sm ? 2 : 4;
}

template <bool F8>
static void ad_dispatch_t(struct cuda_ctx *c, const struct ad_args &a, enum dtype odt, long rows,
                          int d, bool dflt) {
    if (!dflt) { /* dev/attention's other tile widths: the bf16 cache */
        CUDA_ASSERT(!F8 && odt == DTYPE_F32);
        if constexpr (!F8) {
            if (d == 64) ad_launch<64, 32, AD_W_D64, float, false>(c, a, rows);
            else ad_launch<128, 64, 4, float, false>(c, a, rows);
        }
    } else if (d == 64) {
        if (odt == DTYPE_F32) ad_launch<64, AD_BN_D64, AD_W_D64, float, F8>(c, a, rows);
        else if (odt == DTYPE_BF16) ad_launch<64, AD_BN_D64, AD_W_D64, __nv_bfloat16, F8>(c, a, rows);
        else ad_launch<64, AD_BN_D64, AD_W_D64, __half, F8>(c, a, rows);
    } else if (ad_warps_for(c, a, rows, F8) == 4) {
        if (odt == DTYPE_F32) ad_launch<128, AD_BN_D128, 4, float, F8>(c, a, rows);
        else if (odt == DTYPE_BF16) ad_launch<128, AD_BN_D128, 4, __nv_bfloat16, F8>(c, a, rows);
        else ad_launch<128, AD_BN_D128, 4, __half, F8>(c, a, rows);
    } else {
        if (odt == DTYPE_F32) ad_launch<128, AD_BN_D128, 2, float, F8>(c, a, rows);
        else if (odt == DTYPE_BF16) ad_launch<128, AD_BN_D128, 2, __nv_bfloat16, F8>(c, a, rows);
        else ad_launch<128, AD_BN_D128, 2, __half, F8>(c, a, rows);
    }
}

/* bn: positions per warp per chunk (32 or 64; the lab compares both);
 * odt: the output's type (DTYPE_F32, or DTYPE_BF16 / DTYPE_F16 for the
 * 16-bit operand of the output projection, at the default bn). */
static void ad_dispatch(struct cuda_ctx *c, void *out, enum dtype odt, long ldo, const float *q,
                        long ldq, const void *k_cache, const void *v_cache,
                        const struct attn_params *p, const struct backend_batch *b, int bn) {
    CUDA_ASSERT(p->dk == p->dv && (p->dk == 64 || p->dk == 128));
    /* the FP8 cache (e4m3 K/V, scales folded: k_scale into the scores,
     * v_scale into the output); its MHA-form fp32 caches never come here */
    const bool f8 = c->kv_fp8 && !p->f32_cache;
    const long al = f8 ? 16 : 8; /* elements of a 16-byte copy */
    CUDA_ASSERT(p->k_stride % al == 0 && p->v_stride % al == 0 && (uintptr_t)k_cache % 16 == 0 &&
                (uintptr_t)v_cache % 16 == 0 && ldq % 2 == 0 && (uintptr_t)q % 8 == 0);
    int group = p->n_heads / p->n_kv_heads;
    float ks = f8 ? p->scale * p->k_scale : p->scale;
    struct ad_args a = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride, p->v_stride, p->n_heads,
                        p->n_kv_heads, group, (group + AD_HB - 1) / AD_HB,
                        ks * 1.4426950408889634f, b->page_size, b->positions, b->q_start,
                        b->kv_page_start, b->kv_pages, 0, NULL, NULL, p->window, p->sinks,
                        f8 ? p->v_scale : 1.0f};
    long rows = b->n_seqs;
    const bool dflt = bn == (p->dk == 64 ? AD_BN_D64 : AD_BN_D128);
    CUDA_ASSERT(odt == DTYPE_F32 || odt == DTYPE_BF16 || odt == DTYPE_F16);
    CUDA_ASSERT(dflt || odt == DTYPE_F32);
    if (f8) ad_dispatch_t<true>(c, a, odt, rows, p->dk, dflt);
    else ad_dispatch_t<false>(c, a, odt, rows, p->dk, dflt);
}

extern "C" void cuda_attn_decode(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                                 const void *k_cache, const void *v_cache,
                                 const struct attn_params *p, const struct backend_batch *b) {
    ad_dispatch(c, out, DTYPE_F32, ldo, q, ldq, k_cache, v_cache, p, b,
                p->dk == 64 ? AD_BN_D64 : AD_BN_D128);
}

extern "C" void cuda_attn_decode16(struct cuda_ctx *c, void *out16, enum dtype dt, long ldo,
                                   const float *q, long ldq, const void *k_cache,
                                   const void *v_cache, const struct attn_params *p,
                                   const struct backend_batch *b) {
    ad_dispatch(c, out16, dt, ldo, q, ldq, k_cache, v_cache, p, b,
                p->dk == 64 ? AD_BN_D64 : AD_BN_D128);
}
