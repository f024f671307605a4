/* cuda_attention.cu — causal attention over the paged KV cache.
 *
 * One block of ATT_THREADS threads per (query token, query head), and for
 * decode-sized batches also per slice of the context (split-KV, below).
 * A block walks its token's positions lo..hi in tiles of ATT_TILE:
 *   1. the tile's cache slots are looked up in the page table;
 *   2. each warp takes positions of the tile and computes q·k with its
 *      lanes splitting dk (coalesced K rows), scaled, into shared memory;
 *   3. online softmax: the running max m and sum l are rescaled by the new
 *      tile's maximum, the tile's probabilities written back;
 *   4. every thread owns dims d = tid + i·ATT_THREADS of the output and
 *      accumulates p_j · v_j[d] over the tile (coalesced V rows).
 * Everything accumulates in fp32. Heads map to KV heads by h / (H / KVH)
 * (GQA); dk and dv are free, and V may live inside K's row (MLA: dk =
 * kv_lora + rope, dv = kv_lora, v_cache == k_cache).
 *
 * Split-KV: when (tokens × heads) is too small to fill the GPU (decode), the
 * positions are cut into `splits` slices of `chunk` positions (aligned to
 * tiles, sized from the reserved max context); each block writes its
 * unnormalised output with its (m, l), and a combine kernel merges the
 * slices. Slices past a token's position are empty and cost one launch
 * slot each. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"

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
    const float *k_cache, *v_cache;
    long k_stride, v_stride;
    int n_heads, group, dk, dv;
    float scale;
    int n_seqs, page_size;
    const int32_t *positions, *q_start, *kv_page_start, *kv_pages;
    int splits, chunk;
    float *partial; /* [tokens·heads][splits][dv + 2] when splits > 1 */
};

static __device__ int seq_of_token(const int32_t *q_start, int n_seqs, long t) {
    int lo = 0, hi = n_seqs - 1; /* last s with q_start[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

template <bool VEC>
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
    int lo = split * a.chunk, hi = min(len, lo + a.chunk);
    const int32_t *pages = a.kv_pages + a.kv_page_start[s];
    int g = h / a.group;
    const float *qr = a.q + t * a.ldq + (long)h * a.dk;
    for (int d = tid; d < a.dk; d += ATT_THREADS) q_s[d] = qr[d];
    const float *kbase = a.k_cache + (long)g * a.dk;
    const float *vbase = a.v_cache + (long)g * a.dv;

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
            const float *kr = kbase + slot_s[j] * a.k_stride;
            float part = 0.0f;
            if (VEC) {
                for (int d = lane * 4; d < a.dk; d += 128) {
                    float4 kv = *(const float4 *)(kr + d);
                    float4 qv = *(const float4 *)(q_s + d);
                    part += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
                }
            } else {
                for (int d = lane; d < a.dk; d += 32) part += kr[d] * q_s[d];
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
            const float *vr = vbase + slot_s[j] * a.v_stride;
            l += pj;
#pragma unroll
            for (int i = 0; i < ATT_DV_PER_THREAD; i++) {
                int d = tid + i * ATT_THREADS;
                if (d < a.dv) acc[i] = fmaf(pj, vr[d], acc[i]);
            }
        }
        m = m_new;
        __syncthreads(); /* s_s and slot_s are rewritten by the next tile */
    }

    if (a.splits == 1) {
        float inv = 1.0f / l;
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
    float inv = 1.0f / L;
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

/* The split-KV scratch: at most 6 blocks' worth of partial rows per SM
 * (see the split choice below), each of dv + 2 floats, dv ≤ 1024. */
extern "C" size_t cuda_attention_scratch_bytes(const struct cuda_ctx *c) {
    return (size_t)8 * (size_t)c->n_sm * (size_t)(ATT_DV_PER_THREAD * ATT_THREADS + 2) * 4;
}

extern "C" void cuda_op_attention(void *ctx, float *out, long ldo, const float *q, long ldq,
                                  const float *k_cache, const float *v_cache,
                                  const struct attn_params *p, const struct backend_batch *b) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (b->n_tokens <= 0) return;
    CUDA_ASSERT(p->n_heads % p->n_kv_heads == 0);
    CUDA_ASSERT_MSG(p->dv <= ATT_DV_PER_THREAD * ATT_THREADS, "attention: dv above 1024");
    CUDA_ASSERT_MSG(c->max_context > 0, "cuda backend: reserve() was not called");
    long rows = (long)b->n_tokens * p->n_heads;
    CUDA_ASSERT(rows < (1l << 31));

    struct attn_args a = {out, ldo, q, ldq, k_cache, v_cache, p->k_stride, p->v_stride,
                          p->n_heads, p->n_heads / p->n_kv_heads, p->dk, p->dv, p->scale,
                          b->n_seqs, b->page_size, b->positions, b->q_start, b->kv_page_start,
                          b->kv_pages, 1, 1 << 30, (float *)c->attn.p};
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
            CUDA_ASSERT((size_t)(rows * splits * (p->dv + 2)) * 4 <= c->attn.bytes);
            a.splits = (int)splits;
            a.chunk = (int)chunk;
        }
    }
    bool vec = p->dk % 4 == 0 && p->k_stride % 4 == 0 && ldq % 4 == 0 &&
               (uintptr_t)k_cache % 16 == 0;
    size_t smem = (size_t)((p->dk + 3) & ~3) * 4 + ATT_TILE * 4 + ATT_TILE * sizeof(long);
    CUDA_ASSERT_MSG(smem <= 48 * 1024, "attention: head too wide for shared memory");
    dim3 grid((unsigned)rows, (unsigned)a.splits);
    if (vec) attention_kernel<true><<<grid, ATT_THREADS, smem, c->stream>>>(a);
    else attention_kernel<false><<<grid, ATT_THREADS, smem, c->stream>>>(a);
    CUDA_CHECK_LAUNCH();
    if (a.splits > 1) {
        attention_combine_kernel<<<(unsigned)rows, 128, 0, c->stream>>>(a);
        CUDA_CHECK_LAUNCH();
    }
}
