/* cuda_attention.cu — causal attention over the paged KV cache (K/V in
 * bf16 by default, fp32 with KILN_CUDA_KV=f32 or KILN_CUDA_MATMUL=bf16x2,
 * e4m3 with --kv-cache-dtype fp8_e4m3; every kernel is a template on the
 * element type T and computes in fp32). Sliding windows start each row's
 * scan at its window (whole chunks before it skipped); attention sinks
 * join each row's sum once, where it is normalised (cuda_attn_common.cuh).
 *
 * Three kernels behind the one `attention` operation:
 *
 *  - fa_prefill_kernel (cuda_attn_prefill.cu: tensor cores,
 *    FlashAttention-2 style) for the rows of sequences with more than one
 *    new token, when dk == dv ∈ {64, 128}; on Hopper the wgmma kernel
 *    (hopper/attn_prefill.cu) takes them on the bf16 cache at head size
 *    128 (and MLA's MHA form, dk 192 / dv 128).
 *
 *  - split_kernel (fp32, CUDA cores) for decode rows (sequences with one new
 *    token) that cuda_attn_decode.cu and cuda_attn_mla.cu do not take (fp32
 *    cache, other head sizes) and, as the generic fallback, for every row
 *    when the tensor-core kernel does not apply (MLA dk 576 / dv 512 — on
 *    the bf16 cache only its prefill rows, its decode rows going to
 *    cuda_attn_mla.cu —, odd head sizes, the bf16x2 accuracy mode). One CTA per (row, KV head, block of NH query heads of
 *    that KV head's group, slot): K/V rows are read once for all NH heads.
 *    The context is cut into chunks of SPLIT_CHUNK = 256 positions aligned
 *    to absolute positions — a FIXED size, never derived from the batch.
 *    Each chunk gives a partial state (m, l, acc[dv]) computed the same way
 *    whoever computes it; chunk states are merged strictly in chunk order by
 *    merge_state(). Slot y of a row handles chunks y, y + slots, ... When
 *    there are several slots (small batches: more CTAs to fill the GPU) the
 *    chunk states go to scratch and split_combine_kernel merges them; with
 *    one slot the CTA merges them itself as it goes. Both run the same
 *    merge_state in the same order, so the result is bitwise the same either
 *    way: decode attention is batch-invariant (the same bits in any batch).
 *
 *  - attention_kernel (the first version, scalar; one block per (token,
 *    head)) for KILN_CUDA_ATTN=scalar and for layouts the others cannot load
 *    with 16-byte accesses.
 *
 * Which kernel a row takes depends only on its own sequence (one new token
 * or more) and on the layer's shapes, never on the rest of the batch.
 * Everything accumulates in fp32. Heads map to KV heads by h / (H / KVH)
 * (GQA); V may live inside K's row (MLA: dk = kv_lora + rope, dv = kv_lora,
 * v_cache == k_cache). */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_attn_common.cuh"
#ifdef KILN_CUDA_HOPPER
#include "backend/cuda/hopper/attn_prefill.h"
#endif

enum {
    ATT_THREADS = 128,
    ATT_TILE = ATT_THREADS, /* one score per thread in the softmax step */
    ATT_WARPS = ATT_THREADS / 32,
    ATT_DV_PER_THREAD = 8, /* dv ≤ 1024 */
    ATT_MAX_SPLITS = 64,
};

struct attn_args {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const void *k_cache, *v_cache; /* elements of T (the kernels' template type) */
    long k_stride, v_stride;
    int n_heads, group, dk, dv;
    float scale;
    int n_seqs, page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int splits, chunk;
    float *partial; /* [tokens·heads][splits][dv + 2] when splits > 1 */
    float vscale;       /* V's scale (FP8 cache; K's is in `scale`), else 1 */
    int window;         /* attn_params.window */
    const float *sinks; /* attn_params.sinks */
};

static __device__ __forceinline__ int seq_of_token(const int32_t *q_start, int n_seqs, long t) {
    int lo = 0, hi = n_seqs - 1; /* last s with q_start[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

template <typename T, bool VEC>
static __global__ void __launch_bounds__(ATT_THREADS) attention_kernel(struct attn_args a) {
    extern __shared__ float smem[];
    float *q_s = smem;                          /* [dk] */
    float *s_s = q_s + ((a.dk + 3) & ~3);        /* [ATT_TILE] scores, then probabilities */
    long *slot_s = (long *)(s_s + ATT_TILE);     /* [ATT_TILE] */
    __shared__ float red[32];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long th = blockIdx.x;
    int h = (int)(th % a.n_heads);
    long t = th / a.n_heads;
    int split = blockIdx.y;
    int s = seq_of_token(a.q_start, a.n_seqs, t);
    int len = a.positions[t] + 1;
    int lo = window_first(a.window, len) + split * a.chunk, hi = min(len, lo + a.chunk);
    const int32_t *pages = a.kv_pages + a.kv_page_start[s];
    int g = h / a.group;
    const float *qr = a.q + t * a.ldq + (long)h * a.dk;
    for (int d = tid; d < a.dk; d += ATT_THREADS) q_s[d] = qr[d];
    const T *kbase = (const T *)a.k_cache + (long)g * a.dk;
    const T *vbase = (const T *)a.v_cache + (long)g * a.dv;

    float m = -INFINITY, l = 0.0f, acc[ATT_DV_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ATT_DV_PER_THREAD; i++) acc[i] = 0.0f;
    __syncthreads();

    for (int t0 = lo; t0 < hi; t0 += ATT_TILE) {
        int cnt = min(ATT_TILE, hi - t0);
        if (tid < cnt) {
            int p = t0 + tid;
            slot_s[tid] = (long)pages[p / a.page_size] * a.page_size + p % a.page_size;
        }
        __syncthreads();
        for (int j = warp; j < cnt; j += ATT_WARPS) {
            const T *kr = kbase + slot_s[j] * a.k_stride;
            float part = 0.0f;
            if (VEC) {
                for (int d = lane * 4; d < a.dk; d += 128) {
                    float4 kv = kv_get4(kr + d);
                    float4 qv = *(const float4 *)(q_s + d);
                    part += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
                }
            } else {
                for (int d = lane; d < a.dk; d += 32) part += kv_get(kr + d) * q_s[d];
            }
            part = warp_sum(part);
            if (lane == 0) s_s[j] = part * a.scale;
        }
        __syncthreads();
        float mine = tid < cnt ? s_s[tid] : -INFINITY;
        float m_new = fmaxf(m, block_max(mine, red));
        float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
        float p = tid < cnt ? expf(mine - m_new) : 0.0f;
        __syncthreads(); /* all reads of s_s and red are done */
        if (tid < cnt) s_s[tid] = p;
        __syncthreads();
        l *= corr;
#pragma unroll
        for (int i = 0; i < ATT_DV_PER_THREAD; i++) acc[i] *= corr;
        for (int j = 0; j < cnt; j++) {
            float pj = s_s[j];
            const T *vr = vbase + slot_s[j] * a.v_stride;
            l += pj;
#pragma unroll
            for (int i = 0; i < ATT_DV_PER_THREAD; i++) {
                int d = tid + i * ATT_THREADS;
                if (d < a.dv) acc[i] = fmaf(pj, kv_get(vr + d), acc[i]);
            }
        }
        m = m_new;
        __syncthreads(); /* s_s and slot_s are rewritten by the next tile */
    }

    if (a.splits == 1) {
        float inv = a.vscale / (l + sink_share(a.sinks, h, m, false));
        float *o = a.out + t * a.ldo + (long)h * a.dv;
#pragma unroll
        for (int i = 0; i < ATT_DV_PER_THREAD; i++) {
            int d = tid + i * ATT_THREADS;
            if (d < a.dv) o[d] = acc[i] * inv;
        }
    } else {
        float *o = a.partial + (th * a.splits + split) * (long)(a.dv + 2);
#pragma unroll
        for (int i = 0; i < ATT_DV_PER_THREAD; i++) {
            int d = tid + i * ATT_THREADS;
            if (d < a.dv) o[d] = acc[i];
        }
        if (tid == 0) {
            o[a.dv] = m;
            o[a.dv + 1] = l;
        }
    }
}

/* out[t][h·dv + d] = Σ_s acc_s[d]·e^(m_s − M) / Σ_s l_s·e^(m_s − M) */
static __global__ void attention_combine_kernel(struct attn_args a) {
    long th = blockIdx.x;
    int h = (int)(th % a.n_heads);
    long t = th / a.n_heads;
    const float *part = a.partial + th * a.splits * (long)(a.dv + 2);
    float M = -INFINITY;
    for (int s = 0; s < a.splits; s++) M = fmaxf(M, part[s * (a.dv + 2) + a.dv]);
    float L = 0.0f;
    for (int s = 0; s < a.splits; s++) {
        const float *ps = part + s * (a.dv + 2);
        if (ps[a.dv + 1] > 0.0f) L += ps[a.dv + 1] * expf(ps[a.dv] - M);
    }
    float inv = a.vscale / (L + sink_share(a.sinks, h, M, false));
    float *o = a.out + t * a.ldo + (long)h * a.dv;
    for (int d = threadIdx.x; d < a.dv; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < a.splits; s++) {
            const float *ps = part + s * (a.dv + 2);
            if (ps[a.dv + 1] > 0.0f) v += ps[d] * expf(ps[a.dv] - M);
        }
        o[d] = v * inv;
    }
}

/* ------------------------------------------------------------------ */
/* Split-KV kernel (decode rows; fp32 fallback for every row)           */
/* ------------------------------------------------------------------ */

enum {
    SPLIT_CHUNK = 256, /* positions per chunk: fixed, aligned to position 0 */
    SPLIT_THREADS = 128,
    SPLIT_WARPS = SPLIT_THREADS / 32,
    SPLIT_SCRATCH_BYTES = 64 << 20, /* chunk states of small batches */
};

struct split_args {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const void *k_cache, *v_cache; /* elements of T */
    long k_stride, v_stride;
    int n_heads, n_kv_heads, group, dk, dv;
    float scale;
    int n_seqs, page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int by_seq;     /* 1: row r is sequence r if it has exactly one new token (else skipped);
                       0: row r is token r; 2: row r is token r unless its sequence has
                       exactly one new token (those go to cuda_attn_mla) */
    int hblocks;    /* query-head blocks per KV head (group / NH) */
    int max_chunks; /* chunk states per (row, head) in `partial`; rows with more run unsplit */
    float *partial; /* [rows][n_heads][max_chunks][dv + 2] (acc, m, l) when gridDim.y > 1,
                       chunk states counted from the window's first chunk */
    float vscale;       /* V's scale (FP8 cache; K's is in `scale`), else 1 */
    int window;         /* attn_params.window */
    const float *sinks; /* attn_params.sinks */
};

/* out = acc · split_out_factor: V's scale over the sum with the sink's
 * share (the one place the sink joins a row, unsplit or at the combine) */
static __device__ __forceinline__ float split_out_factor(const struct split_args &a, int h, float m,
                                                         float l) {
    return a.vscale / (l + sink_share(a.sinks, h, m, false));
}

/* Merges a chunk's state (mc, lc, ac) into the running (m, l, a), in fp32
 * with the roundings spelled out, so that the in-kernel merge and the
 * combine kernel give the same bits. The factors come from merge_factors. */
static __device__ __forceinline__ void merge_factors(float m, float mc, float *mn, float *fa,
                                                     float *fc) {
    *mn = fmaxf(m, mc);
    *fa = expf(m - *mn); /* 0 for the empty state (m = -inf) */
    *fc = expf(mc - *mn);
}
static __device__ __forceinline__ float merge_value(float a, float fa, float ac, float fc) {
    return __fmaf_rn(a, fa, __fmul_rn(ac, fc));
}

/* Finds the row's token and sequence; false when the row has nothing to do. */
static __device__ __forceinline__ bool split_row(const struct split_args &a, long row, long *t,
                                                 int *s) {
    if (a.by_seq == 1) {
        *s = (int)row;
        *t = a.q_start[row];
        return a.q_start[row + 1] - *t == 1;
    }
    *t = row;
    *s = seq_of_token(a.q_start, a.n_seqs, row);
    return a.by_seq == 0 || a.q_start[*s + 1] - a.q_start[*s] != 1;
}

static __device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

/* NH query heads per CTA; DVI = ⌈dv / 128⌉ (each lane covers 4 dims of
 * every 128). dk, dv multiples of 4 and all rows 16-byte aligned. */
template <typename T, int NH, int DVI>
static __global__ void __launch_bounds__(SPLIT_THREADS) split_kernel(struct split_args a) {
    extern __shared__ float4 split_smem4[];
    float *q_s = (float *)split_smem4;             /* [NH][dk] */
    float *red_s = q_s + NH * a.dk;                /* [SPLIT_WARPS][NH][dv] */
    float *s_s = red_s + SPLIT_WARPS * NH * a.dv;  /* [NH][SPLIT_CHUNK] */
    long *slot_s = (long *)(s_s + NH * SPLIT_CHUNK); /* [SPLIT_CHUNK] */
    __shared__ float ml_s[NH][2];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long bx = blockIdx.x;
    int hb = (int)(bx % a.hblocks);
    long rg = bx / a.hblocks;
    int g = (int)(rg % a.n_kv_heads);
    long row = rg / a.n_kv_heads, t;
    int s;
    if (!split_row(a, row, &t, &s)) return;
    int len = a.positions[t] + 1;
    /* the window's chunks: c0 .. c0 + nch − 1 (positions before `first`
     * in chunk c0 are masked and never loaded; earlier chunks skipped) */
    const int first = window_first(a.window, len), c0 = first / SPLIT_CHUNK;
    int nch = (len + SPLIT_CHUNK - 1) / SPLIT_CHUNK - c0;
    bool split = gridDim.y > 1 && nch <= a.max_chunks;
    if (split ? (int)blockIdx.y >= nch : blockIdx.y != 0) return;
    int step = split ? (int)gridDim.y : 1;
    int h0 = g * a.group + hb * NH;
    const int32_t *pages = a.kv_pages + a.kv_page_start[s];
    const T *kbase = (const T *)a.k_cache + (long)g * a.dk;
    const T *vbase = (const T *)a.v_cache + (long)g * a.dv;
    int dk4 = a.dk / 4;
    for (int i = tid; i < NH * dk4; i += SPLIT_THREADS) {
        int h = i / dk4, d4 = i % dk4;
        ((float4 *)q_s)[i] = *(const float4 *)(a.q + t * a.ldq + (long)(h0 + h) * a.dk + d4 * 4);
    }
    float run_m[NH], run_l[NH], run_a[NH][DVI];
#pragma unroll
    for (int h = 0; h < NH; h++) {
        run_m[h] = -INFINITY;
        run_l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < DVI; e++) run_a[h][e] = 0.0f;
    }
    __syncthreads();

    for (int ci = blockIdx.y; ci < nch; ci += step) {
        int lo = (c0 + ci) * SPLIT_CHUNK, cnt = min(SPLIT_CHUNK, len - lo);
        const int jlo = max(0, first - lo); /* positions j < jlo are before the window */
        for (int j = tid; j < cnt; j += SPLIT_THREADS) {
            int p = lo + j;
            slot_s[j] = j < jlo ? 0 : (long)pages[p / a.page_size] * a.page_size + p % a.page_size;
        }
        __syncthreads();
        /* 1. scores: each warp takes 4 consecutive positions at a time, the
         *    lanes split dk (16-byte loads, 4 rows in flight per lane). */
        for (int j0 = warp * 4; j0 < cnt; j0 += SPLIT_WARPS * 4) {
            float part[4][NH];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int h = 0; h < NH; h++) part[u][h] = 0.0f;
            for (int d = lane * 4; d < a.dk; d += 128) {
                float4 kv[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    kv[u] = j0 + u < cnt && j0 + u >= jlo
                                ? kv_get4(kbase + slot_s[j0 + u] * a.k_stride + d)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int h = 0; h < NH; h++) {
                    float4 qv = *(const float4 *)(q_s + h * a.dk + d);
#pragma unroll
                    for (int u = 0; u < 4; u++) part[u][h] += dot4(kv[u], qv);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int h = 0; h < NH; h++) {
                    float v = warp_sum(part[u][h]);
                    if (lane == 0 && j0 + u < cnt) s_s[h * SPLIT_CHUNK + j0 + u] = v * a.scale;
                }
        }
        __syncthreads();
        /* 2. the chunk's max and exp-sum per head (a warp per head) */
        for (int h = warp; h < NH; h += SPLIT_WARPS) {
            float *sh = s_s + h * SPLIT_CHUNK, v[SPLIT_CHUNK / 32], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < SPLIT_CHUNK / 32; i++) {
                int j = lane + 32 * i;
                v[i] = j < cnt && j >= jlo ? sh[j] : -INFINITY;
                mx = fmaxf(mx, v[i]);
            }
            mx = warp_max(mx);
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < SPLIT_CHUNK / 32; i++) {
                int j = lane + 32 * i;
                float p = j < cnt && j >= jlo ? expf(v[i] - mx) : 0.0f;
                if (j < cnt) sh[j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) ml_s[h][0] = mx, ml_s[h][1] = sum;
        }
        __syncthreads();
        /* 3. acc[h][d] = Σ_j p[h][j] · v_j[d]: warp w takes positions j ≡ w
         *    (mod 4), lanes 4 dims of every 128 (16-byte loads). */
        float acc[NH][DVI][4];
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int e = 0; e < DVI; e++) acc[h][e][0] = acc[h][e][1] = acc[h][e][2] = acc[h][e][3] = 0.0f;
#pragma unroll 2
        for (int j = warp; j < cnt; j += SPLIT_WARPS) {
            if (j < jlo) continue; /* p = 0: before the window */
            const T *vr = vbase + slot_s[j] * a.v_stride;
            float4 vv[DVI];
#pragma unroll
            for (int e = 0; e < DVI; e++) {
                int d = lane * 4 + 128 * e;
                vv[e] = d < a.dv ? kv_get4(vr + d) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int h = 0; h < NH; h++) {
                float p = s_s[h * SPLIT_CHUNK + j];
#pragma unroll
                for (int e = 0; e < DVI; e++) {
                    acc[h][e][0] = fmaf(p, vv[e].x, acc[h][e][0]);
                    acc[h][e][1] = fmaf(p, vv[e].y, acc[h][e][1]);
                    acc[h][e][2] = fmaf(p, vv[e].z, acc[h][e][2]);
                    acc[h][e][3] = fmaf(p, vv[e].w, acc[h][e][3]);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int e = 0; e < DVI; e++) {
                int d = lane * 4 + 128 * e;
                if (d < a.dv)
                    *(float4 *)(red_s + (warp * NH + h) * a.dv + d) =
                        make_float4(acc[h][e][0], acc[h][e][1], acc[h][e][2], acc[h][e][3]);
            }
        __syncthreads();
        /* 4. sum the warps in a fixed order; merge or store the chunk state */
#pragma unroll
        for (int h = 0; h < NH; h++) {
            float mc = ml_s[h][0], lc = ml_s[h][1], mn, fa, fc;
            if (!split) {
                merge_factors(run_m[h], mc, &mn, &fa, &fc);
                run_m[h] = mn;
                run_l[h] = merge_value(run_l[h], fa, lc, fc);
            }
            float *pst = split ? a.partial + (((row * a.n_heads + h0 + h) * (long)a.max_chunks + ci) *
                                              (long)(a.dv + 2))
                               : NULL;
#pragma unroll
            for (int e = 0; e < DVI; e++) {
                int d = tid + 128 * e;
                if (d < a.dv) {
                    float v = red_s[(0 * NH + h) * a.dv + d];
#pragma unroll
                    for (int w = 1; w < SPLIT_WARPS; w++) v += red_s[(w * NH + h) * a.dv + d];
                    if (split) pst[d] = v;
                    else run_a[h][e] = merge_value(run_a[h][e], fa, v, fc);
                }
            }
            if (split && tid == 0) pst[a.dv] = mc, pst[a.dv + 1] = lc;
        }
        __syncthreads(); /* slot_s, s_s, red_s, ml_s are rewritten by the next chunk */
    }
    if (!split) {
#pragma unroll
        for (int h = 0; h < NH; h++) {
            float inv = split_out_factor(a, h0 + h, run_m[h], run_l[h]);
            float *o = a.out + t * a.ldo + (long)(h0 + h) * a.dv;
#pragma unroll
            for (int e = 0; e < DVI; e++) {
                int d = tid + 128 * e;
                if (d < a.dv) o[d] = run_a[h][e] * inv;
            }
        }
    }
}

/* Merges the chunk states of the rows that were split, in chunk order. */
static __global__ void __launch_bounds__(128) split_combine_kernel(struct split_args a) {
    long row = blockIdx.x / a.n_heads, t;
    int h = (int)(blockIdx.x % a.n_heads), s;
    if (!split_row(a, row, &t, &s)) return;
    int len = a.positions[t] + 1;
    int nch = (len + SPLIT_CHUNK - 1) / SPLIT_CHUNK - window_first(a.window, len) / SPLIT_CHUNK;
    if (nch > a.max_chunks) return; /* done unsplit by split_kernel */
    const float *part = a.partial + (row * a.n_heads + h) * (long)a.max_chunks * (a.dv + 2);
    float *o = a.out + t * a.ldo + (long)h * a.dv;
    for (int d = threadIdx.x; d < a.dv; d += blockDim.x) {
        float m = -INFINITY, l = 0.0f, acc = 0.0f, mn, fa, fc;
        for (int c = 0; c < nch; c++) {
            const float *pc = part + (long)c * (a.dv + 2);
            merge_factors(m, pc[a.dv], &mn, &fa, &fc);
            m = mn;
            l = merge_value(l, fa, pc[a.dv + 1], fc);
            acc = merge_value(acc, fa, pc[d], fc);
        }
        o[d] = acc * split_out_factor(a, h, m, l);
    }
}

/* ------------------------------------------------------------------ */
/* Entry points                                                          */
/* ------------------------------------------------------------------ */

/* Scratch for split-KV: the decode kernel's arrival counters, then the
 * scalar kernel's partial rows (at most 6 blocks per SM of dv ≤ 1024) or
 * the split kernels' chunk states, whichever is larger. */
extern "C" size_t cuda_attention_scratch_bytes(const struct cuda_ctx *c) {
    size_t scalar = (size_t)8 * (size_t)c->n_sm * (size_t)(ATT_DV_PER_THREAD * ATT_THREADS + 2) * 4;
    return (size_t)CUDA_ATTN_COUNTER_BYTES +
           (scalar > (size_t)SPLIT_SCRATCH_BYTES ? scalar : (size_t)SPLIT_SCRATCH_BYTES);
}

/* The first kernel: one block per (token, head), splits from max_context. */
static void attention_scalar(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                             const void *k_cache, const void *v_cache,
                             const struct attn_params *p, const struct backend_batch *b) {
    CUDA_ASSERT_MSG(p->dv <= ATT_DV_PER_THREAD * ATT_THREADS, "attention: dv above 1024");
    long rows = (long)b->n_tokens * p->n_heads;
    struct attn_args a = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride, p->v_stride,
                          p->n_heads, p->n_heads / p->n_kv_heads, p->dk, p->dv,
                          k_scale_of(c, p), b->n_seqs, b->page_size, b->positions, b->q_start,
                          b->kv_page_start, b->kv_pages, 1, 1 << 30, cuda_attn_states(c),
                          v_scale_of(c, p), p->window, p->sinks};
    /* Split the context when there are too few (token, head) blocks to
     * fill the GPU: aim at about 4 blocks per SM, each slice at least one
     * tile. rows < 2·SMs and splits ≤ ⌈4·SMs / rows⌉ keep rows·splits
     * under 6·SMs, inside the reserved scratch. */
    if (rows < 2l * c->n_sm && c->max_context > 2 * ATT_TILE) {
        long want = (4l * c->n_sm + rows - 1) / rows;
        long tiles = (c->max_context + ATT_TILE - 1) / ATT_TILE;
        long splits = want < tiles ? want : tiles;
        if (splits > ATT_MAX_SPLITS) splits = ATT_MAX_SPLITS;
        if (splits > 1) {
            long chunk = (tiles + splits - 1) / splits * ATT_TILE;
            splits = (c->max_context + chunk - 1) / chunk;
            CUDA_ASSERT((size_t)(rows * splits * (p->dv + 2)) * 4 <= cuda_attn_states_bytes(c));
            a.splits = (int)splits;
            a.chunk = (int)chunk;
        }
    }
    bool vec = p->dk % 4 == 0 && p->k_stride % 4 == 0 && ldq % 4 == 0 &&
               (uintptr_t)k_cache % 16 == 0;
    size_t smem = (size_t)((p->dk + 3) & ~3) * 4 + ATT_TILE * 4 + ATT_TILE * sizeof(long);
    CUDA_ASSERT_MSG(smem <= 48 * 1024, "attention: head too wide for shared memory");
    dim3 grid((unsigned)rows, (unsigned)a.splits);
    int kt = kv_type(c, p);
    if (kt == KV_BF16) {
        if (vec) attention_kernel<__nv_bfloat16, true><<<grid, ATT_THREADS, smem, c->stream>>>(a);
        else attention_kernel<__nv_bfloat16, false><<<grid, ATT_THREADS, smem, c->stream>>>(a);
    } else if (kt == KV_FP8) {
        if (vec) attention_kernel<kv_fp8_t, true><<<grid, ATT_THREADS, smem, c->stream>>>(a);
        else attention_kernel<kv_fp8_t, false><<<grid, ATT_THREADS, smem, c->stream>>>(a);
    } else {
        if (vec) attention_kernel<float, true><<<grid, ATT_THREADS, smem, c->stream>>>(a);
        else attention_kernel<float, false><<<grid, ATT_THREADS, smem, c->stream>>>(a);
    }
    CUDA_CHECK_LAUNCH();
    if (a.splits > 1) {
        attention_combine_kernel<<<(unsigned)rows, 128, 0, c->stream>>>(a);
        CUDA_CHECK_LAUNCH();
    }
}

template <typename T, int NH, int DVI>
static void launch_split_t(struct cuda_ctx *c, const struct split_args &a, dim3 grid) {
    size_t smem = ((size_t)NH * a.dk + (size_t)SPLIT_WARPS * NH * a.dv + (size_t)NH * SPLIT_CHUNK) * 4 +
                  SPLIT_CHUNK * sizeof(long);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(split_kernel<T, NH, DVI>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    split_kernel<T, NH, DVI><<<grid, SPLIT_THREADS, smem, c->stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

/* NH·DVI ≤ 16 keeps the accumulators in registers. */
static void launch_split(struct cuda_ctx *c, const struct split_args &a, int kt, int nh, int dvi,
                         dim3 grid) {
#define SPLIT_CASE(N, V)                                                            \
    if (nh == N && dvi == V)                                                        \
        return kt == KV_BF16  ? launch_split_t<__nv_bfloat16, N, V>(c, a, grid)     \
               : kt == KV_FP8 ? launch_split_t<kv_fp8_t, N, V>(c, a, grid)          \
                              : launch_split_t<float, N, V>(c, a, grid);
    SPLIT_CASE(1, 1) SPLIT_CASE(2, 1) SPLIT_CASE(4, 1) SPLIT_CASE(8, 1)
    SPLIT_CASE(1, 2) SPLIT_CASE(2, 2) SPLIT_CASE(4, 2) SPLIT_CASE(8, 2)
    SPLIT_CASE(1, 4) SPLIT_CASE(2, 4) SPLIT_CASE(4, 4)
    SPLIT_CASE(1, 8) SPLIT_CASE(2, 8)
#undef SPLIT_CASE
    CUDA_ASSERT_MSG(0, "attention: no split kernel for this head shape");
}

/* The split-KV kernel over `rows` rows (sequences with one new token when
 * by_seq, else every token). Slots per row: enough CTAs to fill the GPU
 * about 4 times over, when the chunk states fit in the scratch. */
static void attention_split(struct cuda_ctx *c, float *out, long ldo, const float *q, long ldq,
                            const void *k_cache, const void *v_cache,
                            const struct attn_params *p, const struct backend_batch *b, int by_seq) {
    int group = p->n_heads / p->n_kv_heads;
    int dvi = (p->dv + 127) / 128;
    CUDA_ASSERT_MSG(dvi <= 8, "attention: dv above 1024");
    int dvi_t = dvi <= 1 ? 1 : dvi <= 2 ? 2 : dvi <= 4 ? 4 : 8;
    int nh = 1; /* query heads per CTA: a power of two dividing the group */
    while (nh < 8 && group % (nh * 2) == 0 && nh * 2 * dvi_t <= 16) nh *= 2;
    long rows = by_seq == 1 ? b->n_seqs : b->n_tokens;
    struct split_args a = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride, p->v_stride,
                           p->n_heads, p->n_kv_heads, group, p->dk, p->dv, k_scale_of(c, p),
                           b->n_seqs, b->page_size, b->positions, b->q_start, b->kv_page_start,
                           b->kv_pages, by_seq, group / nh, 0, cuda_attn_states(c),
                           v_scale_of(c, p), p->window, p->sinks};
    long ctas = rows * p->n_kv_heads * a.hblocks;
    CUDA_ASSERT(ctas < (1l << 31));
    long chunks = (c->max_context + SPLIT_CHUNK - 1) / SPLIT_CHUNK;
    long slots = 1;
    if (ctas < 2l * c->n_sm && chunks > 1) {
        long per_chunk = rows * p->n_heads * (long)(p->dv + 2) * 4;
        long fit = (long)(cuda_attn_states_bytes(c) / (size_t)per_chunk);
        long cap = fit < chunks ? fit : chunks;
        if (cap >= 2) {
            slots = (4l * c->n_sm + ctas - 1) / ctas;
            if (slots > cap) slots = cap;
            if (slots > 65535) slots = 65535;
            a.max_chunks = (int)cap;
        }
    }
    if (slots < 2) a.max_chunks = 0;
    launch_split(c, a, kv_type(c, p), nh, dvi_t, dim3((unsigned)ctas, (unsigned)slots));
    if (slots > 1) {
        split_combine_kernel<<<(unsigned)(rows * p->n_heads), 128, 0, c->stream>>>(a);
        CUDA_CHECK_LAUNCH();
    }
}

/* The routing of cuda_op_attention (past the scalar override): 16-byte
 * loads of q, K and V rows and shapes the split kernel holds, else the
 * scalar kernel ... */
static bool vec_ok(const float *q, long ldq, const void *k_cache, const void *v_cache,
                   const struct attn_params *p) {
    size_t split_smem = ((size_t)8 * p->dk + (size_t)SPLIT_WARPS * 8 * p->dv + 8 * SPLIT_CHUNK) * 4;
    return p->dk % 4 == 0 && p->dv % 4 == 0 && ldq % 4 == 0 && p->k_stride % 4 == 0 &&
           p->v_stride % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)k_cache % 16 == 0 &&
           (uintptr_t)v_cache % 16 == 0 && p->dv <= 1024 && split_smem <= 200 * 1024;
}

/* ... then tensor cores (prefill kernels for multi-token sequences, the
 * decode kernel on the bf16 cache), else the split kernel for every row;
 * bf16x2 mode (fp32-grade checks) keeps every row in fp32. */
static bool tc_ok(const struct cuda_ctx *c, const void *out, long ldo,
                  const struct attn_params *p) {
    return p->dk == p->dv && (p->dk == 64 || p->dk == 128) && ldo % 2 == 0 &&
           (uintptr_t)out % 8 == 0 && !c->split_act && c->attn_impl != CUDA_ATTN_SPLIT &&
           (kv_type(c, p) == KV_F32 ||
            (kv_type(c, p) == KV_BF16 && p->k_stride % 8 == 0 && p->v_stride % 8 == 0) ||
            (kv_type(c, p) == KV_FP8 && p->k_stride % 16 == 0 && p->v_stride % 16 == 0)); /* 16-byte cp.async */
}

extern "C" int cuda_attn_decode_all(const struct cuda_ctx *c, const void *out, long ldo,
                                    const float *q, long ldq, const void *k_cache,
                                    const void *v_cache, const struct attn_params *p,
                                    const struct backend_batch *b) {
    return c->attn_impl == CUDA_ATTN_AUTO && (c->kv_bf16 || kv_type(c, p) == KV_FP8) &&
           b->n_tokens == b->n_seqs &&
           vec_ok(q, ldq, k_cache, v_cache, p) && tc_ok(c, out, ldo, p);
}

extern "C" void cuda_op_attention(void *ctx, float *out, long ldo, const float *q, long ldq,
                                  const void *k_cache, const void *v_cache,
                                  const struct attn_params *p, const struct backend_batch *b) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (b->n_tokens <= 0) return;
    CUDA_ASSERT(p->n_heads % p->n_kv_heads == 0);
    CUDA_ASSERT_MSG(c->max_context > 0, "cuda backend: reserve() was not called");
    CUDA_ASSERT((long)b->n_tokens * p->n_heads < (1l << 31));
    if (c->attn_impl == CUDA_ATTN_SCALAR)
        return attention_scalar(c, out, ldo, q, ldq, k_cache, v_cache, p, b);

    if (!vec_ok(q, ldq, k_cache, v_cache, p))
        return attention_scalar(c, out, ldo, q, ldq, k_cache, v_cache, p, b);
#ifdef KILN_CUDA_HOPPER
    /* MLA in the MHA form (dk 192, dv 128; model/deepseek_mha.c): the wgmma
     * kernel for the rows of multi-token sequences, the split kernel for
     * one-token ones (a choice by the row's own sequence, as below) */
    if (p->dk != p->dv && c->fa_hopper && c->kv_bf16 && !c->split_act &&
        c->attn_impl == CUDA_ATTN_AUTO && cuda_hopper_attn_prefill_shape(p->dk, p->dv) &&
        ldo % 2 == 0 && (uintptr_t)out % 8 == 0 && p->k_stride % 8 == 0 && p->v_stride % 8 == 0) {
        if (b->n_tokens > b->n_seqs) {
            struct hopper_attn_args ha = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride,
                                          p->v_stride, p->n_heads, p->n_heads / p->n_kv_heads,
                                          p->scale * 1.4426950408889634f, b->n_seqs, b->page_size,
                                          b->positions, b->q_start, b->kv_page_start, b->kv_pages,
                                          p->dk, p->dv, p->window, p->sinks};
            cuda_hopper_attn_prefill(&ha, b->n_tokens, c->stream);
        }
        if (!(b->n_seqs == 1 && b->n_tokens > 1))
            attention_split(c, out, ldo, q, ldq, k_cache, v_cache, p, b, 1);
        return;
    }
#endif
    /* MLA on the bf16 latent cache: decode rows on cuda_attn_mla.cu's
     * tensor-core kernel, the rows of multi-token sequences here */
    if (cuda_attn_mla_ok(c, out, ldo, q, ldq, k_cache, v_cache, p)) {
        if (b->n_tokens > b->n_seqs) attention_split(c, out, ldo, q, ldq, k_cache, v_cache, p, b, 2);
        if (!(b->n_seqs == 1 && b->n_tokens > 1)) cuda_attn_mla(c, out, ldo, q, ldq, k_cache, p, b);
        return;
    }
    if (!tc_ok(c, out, ldo, p)) return attention_split(c, out, ldo, q, ldq, k_cache, v_cache, p, b, 0);
    if (b->n_tokens > b->n_seqs) {
#ifdef KILN_CUDA_HOPPER
        /* Hopper: the wgmma kernel (hopper/attn_prefill.cu; fa_hopper is
         * set only on compute capability 9.0 with the sm_90a code built)
         * on the bf16 cache */
        if (c->kv_bf16 && p->dk == 128 && c->fa_hopper) {
            struct hopper_attn_args ha = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride,
                                          p->v_stride, p->n_heads, p->n_heads / p->n_kv_heads,
                                          p->scale * 1.4426950408889634f, b->n_seqs, b->page_size,
                                          b->positions, b->q_start, b->kv_page_start,
                                          b->kv_pages, 128, 128, p->window, p->sinks};
            cuda_hopper_attn_prefill(&ha, b->n_tokens, c->stream);
        } else
#endif
            cuda_attn_fa_prefill(c, out, ldo, q, ldq, k_cache, v_cache, p, b);
    }
    /* decode rows: none when one sequence brings several tokens; on the
     * bf16 cache the tensor-core decode kernel (same conditions as the
     * prefill kernel's: dk = dv ∈ {64, 128}, 16-byte rows) */
    if (!(b->n_seqs == 1 && b->n_tokens > 1)) {
        if ((c->kv_bf16 || kv_type(c, p) == KV_FP8) && c->attn_impl == CUDA_ATTN_AUTO)
            cuda_attn_decode(c, out, ldo, q, ldq, k_cache, v_cache, p, b);
        else
            attention_split(c, out, ldo, q, ldq, k_cache, v_cache, p, b, 1);
    }
}
