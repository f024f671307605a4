/* cuda_attn_mla.cu — MLA decode attention in the absorbed form: the rows of
 * sequences with one new token over the paged bf16 latent cache (a row per
 * position: [c_kv (kv_lora = 512) | k_rope (64)] = 576 elements), one KV
 * head shared by every query head, q [H][576] (q_nope·W_UK | q_rope), V the
 * first 512 columns of the same rows. cuda_attention.cu routes these rows
 * here (DeepSeek-V2/V3, Kimi shapes); other rows keep its kernels.
 *
 * Why this shape (FlashMLA's idea, on mma.sync). Every head of a token
 * reads the same latent rows, so a CTA takes a token and a block of
 * MLA_HB = 16 heads — the M dimension of mma.sync.m16n8k16 — and one pass
 * over a tile of latent rows serves all of them for both products:
 *
 *  - a tile of MLA_BN = 64 positions × 576 bf16 (72 KB, rows padded by 16
 *    bytes for conflict-free ldmatrix) lands in shared memory with 16-byte
 *    cp.async; two stages, the next tile's copy in flight while the current
 *    one computes (1 CTA of 4 warps an SM: 72 KB in flight per SM);
 *  - S = Q·Kᵀ [16 heads][64]: warp w takes positions 16w..16w+15 over the
 *    36 k-steps of 576; Q (pre-scaled by scale·log2 e, rounded to bf16 once)
 *    stays in shared memory;
 *  - the tile's row maxima and exp-sums go across the warps through shared
 *    memory (fixed order), P is rounded to bf16 into shared memory;
 *  - O += P·V [16][512]: warp w owns output columns 128w..128w+127, V read
 *    (ldmatrix.trans) from the same tile as K.
 * q and p are rounded to bf16 (relative 2^-9 each; K/V are exactly bf16 and
 * every sum is fp32); l sums the rounded p, so the output is a convex
 * combination of V rows with weights within 2^-8 relative of the exact
 * softmax (test_cuda_mla bounds the error against the CPU's fp32).
 *
 * Work decomposition and batch invariance, as cuda_attn_decode.cu: the
 * context is cut into chunks of MLA_CHUNK = 4 tiles = 256 positions
 * aligned to position 0 — a constant, never derived from the batch. A
 * chunk's state (m, l, acc[16][512]) is the online softmax over its tiles
 * in order, always computed by one CTA the same way; the row's result is
 * the chunk states folded in chunk order from the empty state (mla_merge,
 * roundings spelled out). Unsplit, a CTA walks the row's chunks and folds
 * as it goes; split (fewer CTAs than one wave), slot y takes chunks y, y +
 * slots, … and writes the chunk states to scratch, and mla_combine_kernel
 * (launched after it) folds them, a thread per (row, head, 4 columns), so
 * the fold of a long context's states spreads over the GPU (a single CTA
 * folding 128 states of 16 × 512 was most of a layer's time at 32k
 * positions on an H100).
 * The choice depends on the number of rows and max_context only (fixed
 * launch shapes per batch size: graph-capturable), and both ways give the
 * same bits, so a row's result does not depend on its batch.
 *
 * Programmatic dependent launch (cuda_pdl.cuh): the page-table lookups of
 * a CTA's first tile and, when that tile ends before this step's token,
 * its copies, go out before pdl_wait; q, the step's cache row and scratch
 * are touched after it. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_pdl.cuh"

enum {
    MLA_DK = 576,
    MLA_DV = 512,
    MLA_HB = 16,  /* heads per CTA: the mma M rows */
    MLA_BN = 64,  /* positions per tile */
    MLA_TPC = 4,  /* tiles per chunk */
    MLA_CHUNK = MLA_BN * MLA_TPC,
    MLA_W = 4,    /* warps */
    MLA_THREADS = MLA_W * 32,
    MLA_LDK = MLA_DK + 8,     /* bf16 row stride of K tiles and Q (16-byte pad) */
    MLA_LDP = MLA_BN + 8,     /* bf16 row stride of P */
    MLA_DS = MLA_DV + 4,      /* chunk state stride: acc[512], m, l, pad */
    MLA_COLS = MLA_DV / MLA_W, /* output columns per warp */
    MLA_DT = MLA_COLS / 8,     /* 8-column mma tiles per warp */
    MLA_C16 = MLA_DK / 8,      /* 16-byte pieces per cache row */
    MLA_QL = MLA_HB * (MLA_DK / 4) / MLA_THREADS, /* float4 loads of Q per thread */
};
static_assert(MLA_HB * (MLA_DK / 4) % MLA_THREADS == 0, "Q loads divide over the threads");

static constexpr size_t MLA_TILE = (size_t)MLA_BN * MLA_LDK; /* elements */
static constexpr size_t MLA_SMEM = 2 * MLA_TILE * 2 + (size_t)MLA_HB * MLA_LDK * 2 +
                                   (size_t)MLA_HB * MLA_LDP * 2 + (size_t)2 * MLA_W * MLA_HB * 4 +
                                   (size_t)2 * MLA_BN * 8;

struct mla_args {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const __nv_bfloat16 *kv;
    long stride;
    int n_heads, hblocks;
    float scale_log2;
    int page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int max_chunks;     /* chunk states per (row, head) in partial; 0: no split */
    float *partial;     /* [rows][n_heads][max_chunks][MLA_DS] */
};

/* Folds (mc, lc, oc) into (m, l, o), log2 domain; (m, l, o) may be empty. */
static __device__ __forceinline__ void mla_factors(float m, float mc, float *mn, float *fa,
                                                   float *fc) {
    *mn = fmaxf(m, mc);
    *fa = exp2f(m - *mn); /* 0 from the empty state */
    *fc = exp2f(mc - *mn);
}
static __device__ __forceinline__ float mla_fold(float o, float fa, float oc, float fc) {
    return __fmaf_rn(o, fa, __fmul_rn(oc, fc));
}

static __device__ __forceinline__ uint32_t mla_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

static __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_kernel(const struct mla_args a) {
    extern __shared__ float4 mla_smem4[];
    __nv_bfloat16 *stage = (__nv_bfloat16 *)mla_smem4;          /* [2][BN][LDK] */
    __nv_bfloat16 *qs = stage + 2 * MLA_TILE;                    /* [HB][LDK] */
    __nv_bfloat16 *ps = qs + MLA_HB * MLA_LDK;                   /* [HB][LDP] */
    float *red_m = (float *)(ps + MLA_HB * MLA_LDP);             /* [W][HB] */
    float *red_l = red_m + MLA_W * MLA_HB;                       /* [W][HB] */
    long long *slot_s = (long long *)(red_l + MLA_W * MLA_HB);   /* [2][BN] */
    pdl_trigger();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hr = lane >> 2, tq = lane & 3, mi = lane >> 3;
    const long unit = blockIdx.x;
    const int hb = (int)(unit % a.hblocks);
    const long row = unit / a.hblocks; /* = the sequence */
    const long t = a.q_start[row];
    const int32_t *pages = a.kv_pages + a.kv_page_start[row];
    if (a.q_start[row + 1] - t != 1) { /* not a decode row */
        pdl_wait();
        return;
    }
    const int len = a.positions[t] + 1;
    const int nch = (len + MLA_CHUNK - 1) / MLA_CHUNK;
    const bool split = gridDim.y > 1 && nch > 1 && nch <= a.max_chunks;
    if (split ? (int)blockIdx.y >= nch : blockIdx.y != 0) {
        pdl_wait();
        return;
    }
    const int step = split ? (int)gridDim.y : 1;
    const int h0 = hb * MLA_HB, nh = min(MLA_HB, a.n_heads - h0);
    const uint64_t policy = ptx_policy_evict_first();

    auto lookup = [&](int p0, long long *dst) { /* slots of a tile's positions, -1 past the end */
        if (tid < MLA_BN) {
            int p = p0 + tid;
            dst[tid] = p < len ? (long long)pages[p / a.page_size] * a.page_size + p % a.page_size : -1;
        }
    };
    auto load = [&](__nv_bfloat16 *dst, const long long *sl) {
#pragma unroll 4
        for (int i = tid; i < MLA_BN * MLA_C16; i += MLA_THREADS) {
            int r = i / MLA_C16, c8 = i % MLA_C16;
            long long s = sl[r];
            bool valid = s >= 0;
            ptx_cp_async16_zfill_hint(dst + r * MLA_LDK + c8 * 8, a.kv + (valid ? s : 0) * a.stride + c8 * 8,
                                      valid, policy);
        }
        ptx_cp_async_commit();
    };

    /* the first item: tile 0 of chunk blockIdx.y (never empty) */
    int c = blockIdx.y, tile = 0, buf = 0;
    lookup(c * MLA_CHUNK, slot_s);
    __syncthreads();
    /* a tile that ends before this step's token holds only rows written by
     * earlier steps: its copies may go out before the wait (rule 2) */
    const bool early = c * MLA_CHUNK + MLA_BN < len;
    if (early) load(stage, slot_s);
    pdl_wait();
    if (!early) load(stage, slot_s);

    /* Q of the block's heads, pre-scaled, as bf16; heads past H are zeros.
     * Every load of the thread is issued before the first is used: one
     * round trip to L2 instead of MLA_QL in a row (a short context's whole
     * kernel was mostly these waits). */
    {
        float4 v[MLA_QL];
#pragma unroll
        for (int j = 0; j < MLA_QL; j++) {
            int i = tid + j * MLA_THREADS, h = i / (MLA_DK / 4), d = (i % (MLA_DK / 4)) * 4;
            v[j] = h < nh ? __ldcg((const float4 *)(a.q + t * a.ldq + (long)(h0 + h) * MLA_DK + d))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < MLA_QL; j++) {
            int i = tid + j * MLA_THREADS, h = i / (MLA_DK / 4), d = (i % (MLA_DK / 4)) * 4;
            uint2 pk = make_uint2(mla_pack(__fmul_rn(v[j].x, a.scale_log2), __fmul_rn(v[j].y, a.scale_log2)),
                                  mla_pack(__fmul_rn(v[j].z, a.scale_log2), __fmul_rn(v[j].w, a.scale_log2)));
            *(uint2 *)(qs + h * MLA_LDK + d) = pk;
        }
    }

    /* this thread's rows hr and hr + 8; columns col0 + 8j + 2tq (+1) */
    const int col0 = warp * MLA_COLS;
    float cm[2] = {-INFINITY, -INFINITY}, cl[2] = {0.0f, 0.0f}; /* chunk state */
    float oacc[MLA_DT][4];
    float rm[2] = {-INFINITY, -INFINITY}, rl[2] = {0.0f, 0.0f}; /* row state (unsplit) */
    float ro[MLA_DT][4];
#pragma unroll
    for (int j = 0; j < MLA_DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[j][e] = ro[j][e] = 0.0f;

    for (;;) {
        const int p0 = c * MLA_CHUNK + tile * MLA_BN;
        /* the next item: the chunk's next tile, or tile 0 of the next chunk */
        int cn = c, tn = tile + 1;
        if (tn == MLA_TPC || cn * MLA_CHUNK + tn * MLA_BN >= len) cn = c + step, tn = 0;
        const bool next = cn < nch;
        if (next) lookup(cn * MLA_CHUNK + tn * MLA_BN, slot_s + (buf ^ 1) * MLA_BN);
        ptx_cp_async_wait<0>();
        __syncthreads(); /* this tile, Q and the next slots are visible; the other stage is free */
        if (next) load(stage + (buf ^ 1) * MLA_TILE, slot_s + (buf ^ 1) * MLA_BN);
        const __nv_bfloat16 *kt = stage + buf * MLA_TILE;

        /* S = Q·Kᵀ for positions 16·warp .. +15 of the tile */
        float sacc[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
#pragma unroll 4
        for (int ks = 0; ks < MLA_DK / 16; ks++) {
            uint32_t af[4], bf[4];
            ptx_ldmatrix_x4(af, qs + ((lane & 7) + (mi & 1) * 8) * MLA_LDK + ks * 16 + (mi >> 1) * 8);
            ptx_ldmatrix_x4(bf, kt + (warp * 16 + (lane & 7) + (mi >> 1) * 8) * MLA_LDK + ks * 16 + (mi & 1) * 8);
            ptx_mma_m16n8k16<__nv_bfloat16>(sacc[0], af, bf[0], bf[1]);
            ptx_mma_m16n8k16<__nv_bfloat16>(sacc[1], af, bf[2], bf[3]);
        }
        /* the tile's row maxima across the warps */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int p = p0 + warp * 16 + nt * 8 + 2 * tq + (e & 1);
                if (p >= len) sacc[nt][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], sacc[nt][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (tq == 0) red_m[warp * MLA_HB + hr] = mx[0], red_m[warp * MLA_HB + hr + 8] = mx[1];
        __syncthreads();
        float mn[2], corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float m = cm[r];
#pragma unroll
            for (int w = 0; w < MLA_W; w++) m = fmaxf(m, red_m[w * MLA_HB + hr + 8 * r]);
            mn[r] = m;
            corr[r] = exp2f(cm[r] - m); /* 0 on the chunk's first tile */
            cm[r] = m;
        }
        /* P (bf16) and the sums of the rounded values */
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                __nv_bfloat162 pv = __floats2bfloat162_rn(exp2f(sacc[nt][2 * r] - mn[r]),
                                                          exp2f(sacc[nt][2 * r + 1] - mn[r]));
                float2 pf = __bfloat1622float2(pv);
                sum[r] = __fadd_rn(__fadd_rn(sum[r], pf.x), pf.y);
                *(__nv_bfloat162 *)(ps + (hr + 8 * r) * MLA_LDP + warp * 16 + nt * 8 + 2 * tq) = pv;
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 1));
            sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 2));
        }
        if (tq == 0) red_l[warp * MLA_HB + hr] = sum[0], red_l[warp * MLA_HB + hr + 8] = sum[1];
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s = red_l[hr + 8 * r];
#pragma unroll
            for (int w = 1; w < MLA_W; w++) s = __fadd_rn(s, red_l[w * MLA_HB + hr + 8 * r]);
            cl[r] = __fmaf_rn(cl[r], corr[r], s);
        }
#pragma unroll
        for (int j = 0; j < MLA_DT; j++) {
            oacc[j][0] = __fmul_rn(oacc[j][0], corr[0]), oacc[j][1] = __fmul_rn(oacc[j][1], corr[0]);
            oacc[j][2] = __fmul_rn(oacc[j][2], corr[1]), oacc[j][3] = __fmul_rn(oacc[j][3], corr[1]);
        }
        /* O += P·V over the warp's 128 columns */
#pragma unroll
        for (int kk = 0; kk < MLA_BN / 16; kk++) {
            uint32_t pf[4];
            ptx_ldmatrix_x4(pf, ps + ((lane & 7) + (mi & 1) * 8) * MLA_LDP + kk * 16 + (mi >> 1) * 8);
#pragma unroll
            for (int dp = 0; dp < MLA_DT / 2; dp++) {
                uint32_t b[4];
                ptx_ldmatrix_x4_trans(b, kt + (kk * 16 + (lane & 7) + (mi & 1) * 8) * MLA_LDK + col0 +
                                             dp * 16 + (mi >> 1) * 8);
                ptx_mma_m16n8k16<__nv_bfloat16>(oacc[2 * dp], pf, b[0], b[1]);
                ptx_mma_m16n8k16<__nv_bfloat16>(oacc[2 * dp + 1], pf, b[2], b[3]);
            }
        }

        if (cn != c || !next) { /* the chunk is complete: fold or store its state */
            if (split) {
                float *st0 = a.partial + ((row * a.n_heads + h0 + hr) * (long)a.max_chunks + c) * MLA_DS;
                float *st1 = st0 + 8l * a.max_chunks * MLA_DS;
#pragma unroll
                for (int j = 0; j < MLA_DT; j++) {
                    int d = col0 + j * 8 + 2 * tq;
                    if (hr < nh) *(float2 *)(st0 + d) = make_float2(oacc[j][0], oacc[j][1]);
                    if (hr + 8 < nh) *(float2 *)(st1 + d) = make_float2(oacc[j][2], oacc[j][3]);
                }
                if (warp == 0 && tq == 0) {
                    if (hr < nh) *(float2 *)(st0 + MLA_DV) = make_float2(cm[0], cl[0]);
                    if (hr + 8 < nh) *(float2 *)(st1 + MLA_DV) = make_float2(cm[1], cl[1]);
                }
            } else {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float m2, fa, fc;
                    mla_factors(rm[r], cm[r], &m2, &fa, &fc);
                    rm[r] = m2;
                    rl[r] = mla_fold(rl[r], fa, cl[r], fc);
#pragma unroll
                    for (int j = 0; j < MLA_DT; j++) {
                        ro[j][2 * r] = mla_fold(ro[j][2 * r], fa, oacc[j][2 * r], fc);
                        ro[j][2 * r + 1] = mla_fold(ro[j][2 * r + 1], fa, oacc[j][2 * r + 1], fc);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < MLA_DT; j++) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.0f;
            cm[0] = cm[1] = -INFINITY;
            cl[0] = cl[1] = 0.0f;
        }
        if (!next) break;
        c = cn, tile = tn, buf ^= 1;
    }

    if (split) return; /* mla_combine_kernel folds the chunk states */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int h = hr + 8 * r;
        if (h >= nh) continue;
        float inv = 1.0f / rl[r];
        float *o = a.out + t * a.ldo + (long)(h0 + h) * MLA_DV + col0 + 2 * tq;
#pragma unroll
        for (int j = 0; j < MLA_DT; j++)
            *(float2 *)(o + j * 8) = make_float2(__fmul_rn(ro[j][2 * r], inv), __fmul_rn(ro[j][2 * r + 1], inv));
    }
}

/* The split rows' results: the chunk states of (row, head) folded in chunk
 * order from the empty state, each thread its 4 columns — the unsplit
 * fold's operations in its order, so the same bits. grid (units, MLA_HB),
 * MLA_DV / 4 threads. */
static __global__ void __launch_bounds__(MLA_DV / 4) mla_combine_kernel(const struct mla_args a) {
    pdl_trigger();
    pdl_wait();
    const long unit = blockIdx.x;
    const int hb = (int)(unit % a.hblocks), h = hb * MLA_HB + (int)blockIdx.y;
    const long row = unit / a.hblocks;
    const long t = a.q_start[row];
    if (h >= a.n_heads || a.q_start[row + 1] - t != 1) return;
    const int nch = (a.positions[t] + MLA_CHUNK) / MLA_CHUNK;
    if (nch <= 1 || nch > a.max_chunks) return; /* the decode kernel wrote it */
    const int d = threadIdx.x * 4;
    const float *st = a.partial + (row * a.n_heads + h) * (long)a.max_chunks * MLA_DS;
    float rm = -INFINITY, rl = 0.0f, ro[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c = 0; c < nch; c++, st += MLA_DS) {
        float2 ml = *(const float2 *)(st + MLA_DV);
        float4 v = *(const float4 *)(st + d);
        float m2, fa, fc;
        mla_factors(rm, ml.x, &m2, &fa, &fc);
        rm = m2;
        rl = mla_fold(rl, fa, ml.y, fc);
        ro[0] = mla_fold(ro[0], fa, v.x, fc);
        ro[1] = mla_fold(ro[1], fa, v.y, fc);
        ro[2] = mla_fold(ro[2], fa, v.z, fc);
        ro[3] = mla_fold(ro[3], fa, v.w, fc);
    }
    float inv = 1.0f / rl;
    float *o = a.out + t * a.ldo + (long)h * MLA_DV + d; /* 8-byte aligned */
    *(float2 *)o = make_float2(__fmul_rn(ro[0], inv), __fmul_rn(ro[1], inv));
    *(float2 *)(o + 2) = make_float2(__fmul_rn(ro[2], inv), __fmul_rn(ro[3], inv));
}

extern "C" int cuda_attn_mla_ok(const struct cuda_ctx *c, const float *out, long ldo,
                                const float *q, long ldq, const void *k_cache,
                                const void *v_cache, const struct attn_params *p) {
    /* FP8 caches, windows and sinks take the split kernel (cuda_attention.cu) */
    return c->attn_impl == CUDA_ATTN_AUTO && c->kv_bf16 && !c->split_act && p->n_kv_heads == 1 &&
           !p->window && !p->sinks &&
           p->dk == MLA_DK && p->dv == MLA_DV && k_cache == v_cache &&
           p->k_stride == p->v_stride && p->k_stride % 8 == 0 && (uintptr_t)k_cache % 16 == 0 &&
           ldq % 4 == 0 && (uintptr_t)q % 16 == 0 && ldo % 2 == 0 && (uintptr_t)out % 8 == 0;
}

/* Slots per row as cuda_attn_decode.cu's: when the (row, head block) CTAs
 * are fewer than one wave, up to ⌊wave / CTAs⌋ per row (at most the chunks
 * at max_context, and what the scratch holds). Rows and max_context only. */
extern "C" void cuda_attn_mla(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                              const void *k_cache, const struct attn_params *p,
                              const struct backend_batch *b) {
    CUDA_ASSERT(cuda_attn_mla_ok(c, out, ldo, q, ldq, k_cache, k_cache, p));
    long rows = b->n_seqs;
    if (rows <= 0) return;
    int hblocks = (p->n_heads + MLA_HB - 1) / MLA_HB;
    struct mla_args a = {out, ldo, q, ldq, (const __nv_bfloat16 *)k_cache, p->k_stride, p->n_heads,
                         hblocks, p->scale * 1.4426950408889634f, b->page_size, b->positions,
                         b->q_start, b->kv_page_start, b->kv_pages, 0, cuda_attn_states(c)};
    long units = rows * hblocks;
    CUDA_ASSERT(units < (1l << 31));
    if (!c->mla_occ) { /* once per device: the shared-memory limit and the occupancy it allows */
        CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)MLA_SMEM));
        int occ = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mla_decode_kernel, MLA_THREADS,
                                                                 MLA_SMEM));
        c->mla_occ = occ < 1 ? 1 : occ;
    }
    long wave = (long)c->mla_occ * c->n_sm;
    long chunks = (c->max_context + MLA_CHUNK - 1) / MLA_CHUNK;
    long slots = 1;
    if (units < wave && chunks > 1) {
        long per_chunk = rows * p->n_heads * (long)MLA_DS * 4;
        long cap = (long)(cuda_attn_states_bytes(c) / (size_t)per_chunk);
        if (cap > chunks) cap = chunks;
        slots = wave / units;
        if (slots > cap) slots = cap;
        if (slots > 65535) slots = 65535;
        if (slots >= 2) a.max_chunks = (int)cap;
        else slots = 1;
    }
    pdl_launch(c, mla_decode_kernel, dim3((unsigned)units, (unsigned)slots), dim3(MLA_THREADS),
               MLA_SMEM, a);
    if (a.max_chunks)
        pdl_launch(c, mla_combine_kernel, dim3((unsigned)units, MLA_HB), dim3(MLA_DV / 4), 0, a);
    c->mla_decode_calls++;
}
