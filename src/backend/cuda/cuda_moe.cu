/* cuda_moe.cu — mixture-of-experts routing and expert MLPs.
 *
 * Routing: one warp per token row, scores and choices in shared memory.
 * The selection follows cpu_moe.c exactly, quirks included: top-k takes the
 * largest value with the lowest index winning ties; group-limited routing
 * scores a group by its best expert, noaux_tc (DeepSeek-V3) by the sum of
 * its two best biased scores; experts of unchosen groups are masked to 0.0
 * (not -inf), so a negative biased score can lose to a masked expert.
 * Benchmarks may route at random (p.uniform: the CPU's draw, to the bit)
 * and count the distinct experts each call touches (p.count: flags, then
 * the last block to finish adds them up; no host round trip, so counting
 * works inside a recorded graph).
 *
 * Expert MLPs, two paths; both end in a kernel that sums each token's k
 * expert outputs in the token's own top-k order, as the CPU does.
 *  - Device (batches of up to moe_device_max tokens, by default every
 *    step; 16-bit, FP8 or MXFP4 experts): one CTA counts the n·k (token, j) rows per expert,
 *    scans, scatters them into expert order and writes a list of tiles
 *    (expert, first row, up to 16 or 64 rows); gate|up then runs as one
 *    grouped product over the list with SwiGLU in its epilogue (16-bit
 *    output, reading the tokens' 16-bit rows through the order, no
 *    gather), and down as a second grouped product. Nothing comes back to
 *    the host, so a decode step with MoE layers records as a graph. The
 *    experts' weight pointers live in a device table per layer, built on
 *    the layer's first call (never inside a recording: the first step of
 *    every batch size runs eagerly). FP8 experts (e4m3 with block
 *    scales) and MXFP4 experts take the same sort and tile list with the
 *    products of cuda_moe_quant.cu, at every batch size, under --deterministic (one
 *    product kind per layer whatever the batch: each sums a row in one
 *    order) and in bf16x2 mode (the GEMV with fp32 activations).
 *  - Host (--deterministic, bf16x2, fp32 experts, or batches past
 *    KILN_CUDA_MOE_MAX; never quantized experts: the model refuses them
 *    at load with KILN_CUDA_MOE=host, cuda_op_moe_experts_refuse): the
 *    routing ids come back to the host
 *    (one stream sync per MoE layer and chunk), rows are grouped by
 *    expert, and each expert with rows runs gate/up/down through
 *    cuda_op_matmul (cuBLAS) on its contiguous block of gathered rows.
 * Both honour the experts' biases and the clamped SwiGLU (gpt-oss,
 * moe_experts.act): the device path in the products' epilogues
 * (cuda_moe_act.cuh), the host path through its products' bias and an
 * element-wise kernel for the activation.
 * Both run a long batch in equal chunks of at most backend_moe_chunk_rows
 * (token, slot) rows (tensor/backend.h), so the scratch is one chunk's,
 * whatever the prefill chunk size; every row's products are independent
 * of the others (the grouped products have no K split; cuBLAS is where
 * --deterministic makes it so), so on the device path, and on the host
 * path in deterministic mode, a token's result does not depend on the
 * chunk it falls in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe_act.cuh"
#include "tensor/route_uniform.h"

enum { MOE_MAX_EXPERTS = 1024 };

/* Index and value of the largest v[0..n) over the warp; ties go to the
 * lower index; v[i] == -inf marks an entry as taken. Result in all lanes. */
static __device__ int warp_argmax(const float *v, int n) {
    int lane = threadIdx.x & 31;
    float best = -INFINITY;
    int bi = -1;
    for (int e = lane; e < n; e += 32)
        if (bi < 0 || v[e] > best) best = v[e], bi = e;
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        bool take = oi >= 0 && (bi < 0 || ob > best || (ob == best && oi < bi));
        if (take) best = ob, bi = oi;
    }
    return bi;
}

/* The count record's update for one call: the last block to finish adds
 * the distinct experts the flags mark (the other blocks' flag stores are
 * visible to it after their fences) and clears them for the next call. */
static __device__ void route_count_finish(struct moe_route_count *c, int E, long n) {
    int lane = threadIdx.x, last = 1;
    if (gridDim.x > 1) { /* one block is last by itself */
        __threadfence();
        if (lane == 0) last = atomicAdd(&c->pending, 1) == (int)gridDim.x - 1;
        last = __shfl_sync(0xffffffffu, last, 0);
        if (!last) return;
        __threadfence();
    } else {
        __syncwarp(); /* the lanes' flag stores are visible to the lanes that read them */
    }
    volatile int32_t *touched = (volatile int32_t *)(c + 1);
    int d = 0;
    for (int e = lane; e < E; e += 32) {
        d += touched[e] != 0;
        touched[e] = 0;
    }
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) {
        if (!c->calls || d < c->min) c->min = d;
        if (!c->calls || d > c->max) c->max = d;
        c->calls++;
        c->sum += d;
        c->rows += n;
        c->pending = 0;
    }
}

/* ids[n][top_k (+ n_fused)], w likewise, from logits[n][E] (p.uniform: from
 * the rows' random draw, as cpu_moe.c); one warp per row.
 * shared: scores[E], choice[E], gscore[n_group]. */
static __global__ void moe_route_kernel(int32_t *__restrict__ ids, float *__restrict__ weights,
                                        const float *__restrict__ logits,
                                        const float *__restrict__ bias, struct moe_route_params p,
                                        long n) {
    extern __shared__ float sh[];
    int E = p.n_experts, lane = threadIdx.x;
    float *scores = sh, *choice = sh + E, *gscore = sh + 2 * E;
    int *sel = (int *)(gscore + (p.n_group > 0 ? p.n_group : 1)); /* [top_k] */
    pdl_trigger();
    pdl_wait();
    int counting = p.count && *(volatile int32_t *)&p.count->enabled;
    int32_t *touched = counting ? (int32_t *)(p.count + 1) : NULL;
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        /* the row's logits (or its uniform draw: the logits and the choice,
         * exact floats) in shared memory, read once */
        if (p.uniform) {
            uint64_t row = route_uniform_row(p.key_slot[i], p.key_pos[i], p.layer);
            for (int e = lane; e < E; e += 32) choice[e] = route_uniform_score(row, e);
        } else {
            for (int e = lane; e < E; e += 32) choice[e] = __ldcg(logits + i * E + e);
        }
        __syncwarp();
        const float *lg = choice;
        if (p.scoring == MOE_ROUTE_SOFTMAX) {
            float mx = -INFINITY;
            for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
            mx = warp_max(mx);
            float sum = 0.0f;
            for (int e = lane; e < E; e += 32) sum += scores[e] = expf(lg[e] - mx);
            sum = warp_sum(sum);
            for (int e = lane; e < E; e += 32) scores[e] /= sum;
        } else {
            for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-lg[e]));
        }
        if (!p.uniform)
            for (int e = lane; e < E; e += 32) choice[e] = scores[e] + (bias ? bias[e] : 0.0f);
        __syncwarp();
        if (!p.uniform && p.method != MOE_ROUTE_GREEDY && p.n_group > 1) {
            int per = E / p.n_group;
            for (int g = lane; g < p.n_group; g += 32) {
                const float *c = choice + g * per;
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int k = 0; k < per; k++) {
                    float v = c[k];
                    if (v > b1) b2 = b1, b1 = v;
                    else if (v > b2) b2 = v;
                }
                gscore[g] = p.method == MOE_ROUTE_GROUP_LIMITED ? b1 : b1 + b2;
            }
            __syncwarp();
            /* keep the topk_group best groups: mark them -inf in gscore,
             * then zero the choices of every group still finite */
            for (int j = 0; j < p.topk_group; j++) {
                int g = warp_argmax(gscore, p.n_group);
                __syncwarp();
                if (lane == 0) gscore[g] = -INFINITY;
                __syncwarp();
            }
            for (int e = lane; e < E; e += 32)
                if (gscore[e / per] != -INFINITY) choice[e] = 0.0f;
            __syncwarp();
        }
        /* the choices in shared memory, the weights' sum in order by one
         * lane, then every output written once (no global round trips) */
        for (int j = 0; j < p.top_k; j++) {
            int e = warp_argmax(choice, E);
            __syncwarp();
            if (lane == 0) sel[j] = e, choice[e] = -INFINITY;
            __syncwarp();
        }
        float inv = 1.0f, post = 1.0f;
        if (lane == 0) {
            float sum = 0.0f;
            for (int j = 0; j < p.top_k; j++) sum += scores[sel[j]];
            if (p.renormalize) inv = 1.0f / (sum + 1e-20f);
            if (!p.renormalize || p.scale_when_renormalized) post = p.scaling;
        }
        inv = __shfl_sync(0xffffffffu, inv, 0);
        post = __shfl_sync(0xffffffffu, post, 0);
        int32_t *out_ids = ids + i * (p.top_k + p.n_fused);
        float *out_w = weights + i * (p.top_k + p.n_fused);
        for (int j = lane; j < p.top_k + p.n_fused; j += 32) {
            if (j < p.top_k) {
                int e = sel[j];
                float w = scores[e];
                if (p.renormalize) w *= inv;
                out_ids[j] = e, out_w[j] = w * post;
                if (counting) touched[e] = 1;
            } else {
                out_ids[j] = E + (j - p.top_k), out_w[j] = 1.0f;
            }
        }
        __syncwarp();
    }
    if (counting) route_count_finish(p.count, E, n);
}

extern "C" void cuda_op_moe_route(void *ctx, int32_t *ids, float *weights, const float *logits,
                                  const float *bias, const struct moe_route_params *p, long n) {
    CUDA_ASSERT(p->n_experts <= MOE_MAX_EXPERTS && p->top_k <= p->n_experts && p->top_k >= 1 && p->n_fused >= 0);
    CUDA_ASSERT(p->method == MOE_ROUTE_GREEDY || p->n_group <= 1 ||
                (p->n_experts % p->n_group == 0 && p->topk_group <= p->n_group));
    CUDA_ASSERT(!p->uniform || (p->key_slot && p->key_pos));
    if (n <= 0) return;
    size_t smem = (size_t)(2 * p->n_experts + (p->n_group > 0 ? p->n_group : 1) + p->top_k) * 4;
    pdl_launch((const struct cuda_ctx *)ctx, moe_route_kernel, dim3(grid_for(n, 1)), dim3(32), smem, ids,
               weights, logits, bias, *p, n);
}

/* xg[i][H] = x[order[i] / top_k][H] */
static __global__ void moe_gather_kernel(float *__restrict__ xg, const float *__restrict__ x,
                                         const int32_t *__restrict__ order, int top_k, long rows,
                                         long H) {
    for (long i = blockIdx.x; i < rows; i += gridDim.x) {
        const float *src = x + (long)(order[i] / top_k) * H;
        for (long d = threadIdx.x; d < H; d += blockDim.x) xg[i * H + d] = src[d];
    }
}

/* y[t][H] = Σ_j w[t][j] · out[where[t·k + j]][H], j in top-k order.
 * A thread owns 4 columns of one token (COMBINE_THREADS·4 columns a CTA,
 * grid x over the columns, y over the tokens), so a single token still
 * spreads over several CTAs and every load of a thread (k weights, k row
 * indices, k column groups) is independent of the others. The sum of each
 * element runs in top-k order whatever the grid: the same bits as a
 * scalar loop. Rows of H % 4 == 0 floats are read 16 bytes at a time. */
enum { COMBINE_THREADS = 128, COMBINE_COLS = 4 * COMBINE_THREADS };

static __global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine_kernel(float *__restrict__ y, const float *__restrict__ out,
                   const int32_t *__restrict__ where, const float *__restrict__ w, int top_k,
                   long n, long H) {
    pdl_trigger();
    pdl_wait();
    long d = (long)blockIdx.x * COMBINE_COLS + threadIdx.x * 4;
    if (d >= H) return;
    const bool vec = H % 4 == 0;
    for (long t = blockIdx.y; t < n; t += gridDim.y) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < top_k; j++) {
            int p = where[t * top_k + j];
            if (p < 0) continue; /* another rank's expert (moe_experts.first) */
            float wj = w[t * top_k + j];
            const float *o = out + (long)p * H + d;
            if (vec) {
                float4 v = *(const float4 *)o;
                acc[0] += wj * v.x, acc[1] += wj * v.y, acc[2] += wj * v.z, acc[3] += wj * v.w;
            } else {
                for (int i = 0; i < 4 && d + i < H; i++) acc[i] += wj * o[i];
            }
        }
        if (vec) *(float4 *)(y + t * H + d) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else
            for (int i = 0; i < 4 && d + i < H; i++) y[t * H + d + i] = acc[i];
    }
}

static void moe_combine(struct cuda_ctx *c, bool pdl, float *y, const float *out, const int32_t *where,
                        const float *w, int top_k, long n, long H) {
    dim3 grid((unsigned)((H + COMBINE_COLS - 1) / COMBINE_COLS), (unsigned)(n < 65535 ? n : 65535));
    pdl_launch_on(c, pdl && c->pdl, moe_combine_kernel, grid, dim3(COMBINE_THREADS), 0, y, out, where, w,
                  top_k, n, H);
}

/* ---- device path ---------------------------------------------------------- */

enum { ALIGN_THREADS = 1024 };

/* Exclusive prefix sum of v over the block (ALIGN_THREADS threads); the
 * total in *total. */
static __device__ int block_exclusive_scan(int v, int *warp_sums, int *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = warp_sums[lane], wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            int t = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += t;
        }
        warp_sums[lane] = wi - w;
        if (lane == 31) warp_sums[32] = wi;
    }
    __syncthreads();
    int r = inc - v + warp_sums[warp];
    *total = warp_sums[32];
    __syncthreads();
    return r;
}

/* One CTA: rows r = t·k + j of ids grouped by expert. order[p] = the row at
 * sorted position p, where[r] = its position; tiles[] = (expert, first
 * position, rows <= bm, 0) for every expert's rows, *n_tiles of them.
 * Experts are ids - first; rows of other experts (expert parallel) are
 * dropped: where[r] = -1. */
static __global__ void __launch_bounds__(ALIGN_THREADS)
moe_align_kernel(const int32_t *__restrict__ ids, int rows, int E, int first, int bm,
                 int32_t *__restrict__ order, int32_t *__restrict__ where, int4 *__restrict__ tiles,
                 int *__restrict__ n_tiles) {
    extern __shared__ float sh[]; /* as ints: cnt [E], warp sums [33] */
    int *cnt = (int *)sh, *ws = cnt + E;
    pdl_trigger();
    pdl_wait();
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += ALIGN_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int r = tid; r < rows; r += ALIGN_THREADS)
        if ((unsigned)(ids[r] - first) < (unsigned)E) atomicAdd(&cnt[ids[r] - first], 1);
    __syncthreads();
    /* E <= ALIGN_THREADS: thread e owns expert e */
    int c = tid < E ? cnt[tid] : 0, total;
    int start = block_exclusive_scan(c, ws, &total);
    int tstart = block_exclusive_scan((c + bm - 1) / bm, ws, &total);
    if (tid < E) {
        for (int j = 0; j * bm < c; j++)
            tiles[tstart + j] = make_int4(tid, start + j * bm, min(bm, c - j * bm), 0);
        cnt[tid] = start; /* now the next free position of the expert */
    }
    if (tid == 0) *n_tiles = total;
    __syncthreads();
    for (int r = tid; r < rows; r += ALIGN_THREADS) {
        if ((unsigned)(ids[r] - first) >= (unsigned)E) {
            where[r] = -1;
            continue;
        }
        int p = atomicAdd(&cnt[ids[r] - first], 1);
        order[p] = r;
        where[r] = p;
    }
}

/* Device tables of the experts' weight pointers: [gate E][up E][down E]
 * then their scales likewise (FP8 block scales, MXFP4 exponents; NULL for
 * 16-bit experts), one per
 * layer, found by comparing the pointers themselves (a host copy is kept),
 * so that experts freed and others allocated at the same addresses never
 * meet a stale table. */
struct moe_table {
    long n;            /* 6 E */
    const void **host; /* [6 E] */
    void **dev;        /* [6 E] */
};
struct moe_tables {
    struct moe_table *t;
    int n, cap;
};

/* A weight's scales for the table: FP8 block scales, MXFP4 exponents. */
static const void *moe_scales(const struct backend_weight *w) {
    return w->dtype == DTYPE_MXFP4 ? (const void *)w->e8m0 : (const void *)w->scale;
}

static void moe_fill(const struct moe_experts *e, const void **h) {
    long E = e->n_experts;
    for (long i = 0; i < E; i++) {
        h[i] = e->gate[i].data, h[E + i] = e->up[i].data, h[2 * E + i] = e->down[i].data;
        h[3 * E + i] = moe_scales(&e->gate[i]), h[4 * E + i] = moe_scales(&e->up[i]);
        h[5 * E + i] = moe_scales(&e->down[i]);
    }
}

static void *const *moe_table_find(struct cuda_ctx *c, const struct moe_experts *e) {
    struct moe_tables *ts = (struct moe_tables *)c->moe_tables;
    if (!ts) {
        ts = (struct moe_tables *)calloc(1, sizeof *ts);
        CUDA_ASSERT_MSG(ts, "out of host memory");
        c->moe_tables = ts;
    }
    long n = 6L * e->n_experts, E = e->n_experts;
    for (int i = 0; i < ts->n; i++) {
        const struct moe_table *t = &ts->t[i];
        if (t->n != n) continue;
        long k = 0;
        for (; k < E && t->host[k] == e->gate[k].data && t->host[E + k] == e->up[k].data &&
               t->host[2 * E + k] == e->down[k].data && t->host[3 * E + k] == moe_scales(&e->gate[k]) &&
               t->host[4 * E + k] == moe_scales(&e->up[k]) && t->host[5 * E + k] == moe_scales(&e->down[k]);
             k++) {
        }
        if (k == E) return t->dev;
    }
    cudaStreamCaptureStatus cs;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    CUDA_ASSERT_MSG(cs == cudaStreamCaptureStatusNone,
                    "moe_ffn: a layer's first call is being recorded (run one step eagerly first)");
    if (ts->n == ts->cap) {
        ts->cap = ts->cap ? 2 * ts->cap : 64;
        ts->t = (struct moe_table *)realloc(ts->t, (size_t)ts->cap * sizeof *ts->t);
        CUDA_ASSERT_MSG(ts->t, "out of host memory");
    }
    const void **h = (const void **)malloc((size_t)n * sizeof *h);
    CUDA_ASSERT_MSG(h, "out of host memory");
    moe_fill(e, h);
    void **d = NULL;
    cudaError_t me = cudaMalloc((void **)&d, (size_t)n * sizeof *d);
    if (me == cudaErrorMemoryAllocation) {
        free(h);
        cuda_oom_record(c, (size_t)n * sizeof *d, "the expert table of a MoE layer");
        return NULL;
    }
    CUDA_CHECK(me);
    CUDA_CHECK(cudaMemcpyAsync(d, h, (size_t)n * sizeof *d, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    ts->t[ts->n++] = (struct moe_table){n, h, d};
    return d;
}

extern "C" void cuda_moe_release(struct cuda_ctx *c) {
    struct moe_tables *ts = (struct moe_tables *)c->moe_tables;
    if (!ts) return;
    for (int i = 0; i < ts->n; i++) (void)cudaFree(ts->t[i].dev), free(ts->t[i].host);
    free(ts->t);
    free(ts);
    c->moe_tables = NULL;
#ifdef KILN_CUDA_HOPPER
    cuda_moe_wgmma_forget(c);
#endif
}

/* Quantized experts (FP8 or MXFP4, moe_quantized): every weight of the
 * one format with its scales, shapes (and FP8 blocks) the quantized
 * products take (cuda_moe_quant.cu). NULL when they are, else why not. */
static int moe_quantized(const struct moe_experts *e) {
    return e->gate[0].dtype == DTYPE_F8_E4M3 || e->gate[0].dtype == DTYPE_MXFP4;
}
static const char *moe_quant_why(const struct moe_experts *e) {
    const struct backend_weight *w0 = &e->gate[0];
    const int mx = w0->dtype == DTYPE_MXFP4;
    if (!cuda_moe_quant_ok(w0->dtype, e->hidden, e->inter, w0->block_rows, w0->block_cols))
        return mx ? "hidden and inter must be multiples of 32"
                  : "hidden and inter must be multiples of 16 and the weight blocks of 16 columns";
    for (int i = 0; i < e->n_experts; i++) {
        const struct backend_weight *w[3] = {&e->gate[i], &e->up[i], &e->down[i]};
        for (int k = 0; k < 3; k++) {
            if (w[k]->dtype != w0->dtype) return "quantized and other experts mixed in one layer";
            if (!moe_scales(w[k])) return mx ? "an expert weight has no exponents" : "an expert weight has no block scales";
            if (!mx && (w[k]->block_rows != w0->block_rows || w[k]->block_cols != w0->block_cols))
                return "the experts' block sizes differ";
            if ((uintptr_t)w[k]->data & 15) return "an expert weight is not 16-byte aligned";
        }
    }
    return NULL;
}

/* The device path serves these experts for n tokens: 16-bit weights of
 * one type, shapes the grouped product takes, aligned rows; or quantized
 * experts (FP8, MXFP4), which run nowhere else (moe_ffn_host refuses
 * them): at any n
 * (in chunks), under --deterministic (one product kind per layer whatever
 * the batch, each with sums of one order per row) and in the fp32-grade
 * mode (the GEMV with fp32 activations), unless KILN_CUDA_MOE=host asks
 * for the host path. */
static int moe_device_ok(const struct cuda_ctx *c, const struct moe_experts *e, int top_k, long n) {
    int q = moe_quantized(e);
    if (n < 1 || c->moe_device_max <= 0) return 0;
    if (!q && (n > c->moe_device_max || c->deterministic || c->split_act)) return 0;
    /* the tile list of a chunk is the products' grid y (at most 65535 CTAs) */
    long tok = backend_moe_chunk_tokens(top_k);
    if (e->n_experts > ALIGN_THREADS || (n < tok ? n : tok) * top_k / 16 + e->n_experts > 65535) return 0;
    if (q) return !moe_quant_why(e);
    if (!cuda_gemm_small_grouped_ok(e->inter, e->hidden, 1) || !cuda_gemm_small_grouped_ok(e->hidden, e->inter, 0) ||
        e->hidden % 8 || e->inter % 8)
        return 0;
    enum dtype dt = e->gate[0].dtype;
    if (dt != DTYPE_BF16 && dt != DTYPE_F16) return 0;
    for (int i = 0; i < e->n_experts; i++) {
        const struct backend_weight *w[3] = {&e->gate[i], &e->up[i], &e->down[i]};
        for (int k = 0; k < 3; k++)
            if (w[k]->dtype != dt || ((uintptr_t)w[k]->data & 15)) return 0;
    }
    return 1;
}

extern "C" int cuda_op_moe_ffn_graphable(void *ctx, const struct moe_experts *e, int top_k, long n) {
    return moe_device_ok((const struct cuda_ctx *)ctx, e, top_k, n);
}

/* Quantized experts run on the device path only: refused at load where it
 * cannot take them (cuda_op_moe_ffn stops on any that get through). */
extern "C" const char *cuda_op_moe_experts_refuse(void *ctx, const struct moe_experts *e) {
    const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
    if (!moe_quantized(e)) return NULL;
    if (c->moe_device_max <= 0)
        return "quantized experts run on the MoE device path only, and KILN_CUDA_MOE=host is set (unset it)";
    if (e->n_experts > ALIGN_THREADS) return "more experts than the MoE device path's sort takes (1024)";
    return moe_quant_why(e);
}

/* Scratch of the device path for a chunk of `rows` (token, slot) rows:
 * h [rows][F] 16-bit (hs = 2; quantized experts in the fp32-grade mode: fp32,
 * hs = 4), out [rows][H] fp32, order, where [rows], the tiles (at most
 * max_tiles of 16 bytes) and their count. */
static size_t h_scratch_bytes(long rows, long F, int hs) { return ((size_t)rows * F * hs + 15) & ~(size_t)15; }
static size_t device_scratch_bytes(long rows, long H, long F, long E, int bm, int hs, long *max_tiles) {
    *max_tiles = (rows + bm - 1) / bm + (E < rows ? E : rows);
    size_t h_bytes = h_scratch_bytes(rows, F, hs);
    return h_bytes + (size_t)rows * H * 4 + (size_t)rows * 8 + (size_t)*max_tiles * 16 + 16;
}

/* Scratch of the host path for a chunk of `rows` rows: xg [rows][H], g, u
 * [rows][F], out [rows][H], order, where [rows]. */
static size_t host_scratch_bytes(long rows, long H, long F) {
    return (size_t)rows * (size_t)(2 * H + 2 * F) * 4 + (size_t)rows * 8;
}

/* Prefill-sized groups (on average MOE_WG_MIN_ROWS rows an expert and
 * more) take the wgmma products of hopper/moe_wgmma.cu where it serves
 * the experts: 128 × 256 tiles on the tensor cores' fast path instead of
 * the mma.sync kernel's 64 × 64. */
enum { MOE_WG_MIN_ROWS = 32 };

static int moe_wg_ok(const struct cuda_ctx *c, const struct moe_experts *e) {
#ifdef KILN_CUDA_HOPPER
    return cuda_moe_wgmma_ok(c, e);
#else
    (void)c, (void)e;
    return 0;
#endif
}

/* One chunk of n tokens on the device path. */
static void moe_ffn_device(struct cuda_ctx *c, float *y, const float *x, const int32_t *ids,
                           const float *weights, int top_k, const struct moe_experts *e, long n,
                           void *const *tab) {
    long rows = n * top_k, H = e->hidden, F = e->inter, E = e->n_experts;
    enum dtype dt = e->gate[0].dtype;
    /* quantized experts (FP8, MXFP4): bf16 activations (cuda_moe_quant.cu) */
    int quant = moe_quantized(e);
    enum dtype at = quant ? DTYPE_BF16 : dt;
    /* A few rows per expert: the grouped GEMV (cuda_moe_gemv.cu), tiles of
     * one row for one token (its experts are distinct), else of 8; more:
     * the mma.sync grouped product, 16-row tiles while the average expert
     * gets up to 16 rows, else 64. H100, dummy weights: Qwen3-30B-A3B
     * batch-1 decode 4.50 -> 3.86 ms/step with the GEMV; at 64 tokens with
     * skewed routing (a few experts take most rows) the GEMV's 8-row
     * tiles re-read the weights and lose (13.4 -> 30.3 ms/step), hence
     * the bound of two rows per expert on average. Measured and left
     * (H200, batch 1, uniform routing): the top-k sum folded into the down
     * product — a CTA per 4 output features and a warp per slot, or a warp
     * per feature over the slots with the k rows of h in shared memory —
     * and the router's product fused with the routing (its last CTA
     * routes) were each as slow or slower: Qwen3-30B-A3B 3.20 -> 3.30 /
     * 3.39 ms/step, DeepSeek-V2-Lite 2.54 -> 2.54 / 2.63 (the traced
     * routing of one token costs ~6 µs wherever it runs); one token's slots
     * taken as its tiles without the sort went both ways (Qwen3 3.19 ->
     * 3.24, DeepSeek 2.54 -> 2.49). (The scratch plan,
     * cuda_moe_scratch_bytes, counts 16-row tiles of the largest chunk,
     * which covers these smaller chunks.) */
    int gemv = cuda_moe_gemv_ok(H, F, x) && rows <= 2 * E;
    /* quantized: the GEMV in the fp32-grade mode (fp32 SwiGLU rows, h32)
     * and where the mma product cannot take the shapes; --deterministic
     * keeps one kind whatever the batch */
    int h32 = quant && c->split_act, mma = !quant || cuda_moe_quant_mma_ok(H, F);
    if (quant) gemv = h32 || !mma || (gemv && !c->deterministic);
    int wg = !quant && !gemv && rows >= MOE_WG_MIN_ROWS * E && moe_wg_ok(c, e);
    int bm = gemv ? (n == 1 ? 1 : 8) : wg ? 128 : rows <= 16 * E ? 16 : 64;
    long max_tiles;
    size_t bytes = device_scratch_bytes(rows, H, F, E, bm, h32 ? 4 : 2, &max_tiles);
    size_t h_bytes = h_scratch_bytes(rows, F, h32 ? 4 : 2);
    size_t xs_at = (bytes + 255) & ~(size_t)255;
    if (wg) bytes = xs_at + (size_t)rows * H * 2;
    if (cuda_scratch_reserve(c, &c->moe_dev, bytes, n)) return;
    char *p = (char *)c->moe_dev.p;
    void *h = p;
    float *out = (float *)(p + h_bytes);
    int4 *tiles = (int4 *)(out + rows * H);
    int32_t *order = (int32_t *)(tiles + max_tiles), *where = order + rows;
    int *n_tiles = (int *)(where + rows);
    const void *x16 = gemv || wg ? NULL : cuda_act16(c, x, H, n, H, at);
    if (!gemv && !wg && !x16) return;
    pdl_launch(c, moe_align_kernel, dim3(1), dim3(ALIGN_THREADS), (size_t)(E + 33) * 4, ids, (int)rows, (int)E,
               e->first, bm, order, where, tiles, n_tiles);
#ifdef KILN_CUDA_HOPPER
    if (wg) {
        void *xs16 = p + xs_at;
        cuda_moe_wgmma_gather(c, dt, xs16, x, H, order, top_k, tiles, n_tiles, max_tiles);
        cuda_moe_wgmma_ffn(c, e, h, out, xs16, rows, tiles, n_tiles, max_tiles);
        moe_combine(c, true, y, out, where, weights, top_k, n, H);
        return;
    }
#endif
    int br = e->gate[0].block_rows, bc = e->gate[0].block_cols;
    if (quant && gemv) {
        cuda_moe_quant_gemv(c, bm, h, out, x, H, F, order, top_k, tab, E, tiles, n_tiles, max_tiles, br, bc, h32, e);
    } else if (quant) {
        cuda_moe_quant_grouped(c, bm, h, out, x16, H, F, order, top_k, tab, E, tiles, n_tiles, max_tiles, br, bc, e);
    } else if (gemv) {
        cuda_moe_gemv(c, dt, bm, h, out, x, H, F, order, top_k, tab, E, tiles, n_tiles, max_tiles, e);
    } else {
        cuda_gemm_small_grouped(c, dt, bm, h, F, x16, H, order, top_k, (const void *const *)tab,
                                (const void *const *)(tab + E), tiles, n_tiles, max_tiles, F, H, e);
        cuda_gemm_small_grouped(c, dt, bm, out, H, h, F, NULL, 1, (const void *const *)(tab + 2 * E), NULL, tiles,
                                n_tiles, max_tiles, H, F, e);
    }
    moe_combine(c, true, y, out, where, weights, top_k, n, H);
}

/* ---- host path -------------------------------------------------------------- */

/* g[i] = the clamped SwiGLU of g[i] and u[i] (biases already added by
 * the products), i < count: MOE_ACT_SWIGLU_CLAMP on the host path. */
static __global__ void moe_swiglu_clamp_kernel(float *g, const float *u, long count, float alpha, float limit) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long)gridDim.x * blockDim.x)
        g[i] = swiglu_clamp_f32(g[i], u[i], alpha, limit);
}

/* One chunk of n tokens on the host path. */
static void moe_ffn_host(struct cuda_ctx *c, float *y, const float *x, const int32_t *ids,
                         const float *weights, int top_k, const struct moe_experts *e, long n) {
    long rows = n * top_k, H = e->hidden, F = e->inter, E = e->n_experts;
    if (cuda_scratch_reserve(c, &c->moe_dev, host_scratch_bytes(rows, H, F), n)) return;
    float *xg = (float *)c->moe_dev.p, *g = xg + rows * H, *u = g + rows * F, *out = u + rows * F;
    int32_t *order_d = (int32_t *)(out + rows * H), *where_d = order_d + rows;
    if ((size_t)rows > c->moe_host_rows) {
        free(c->moe_host_ids);
        free(c->moe_host_list);
        c->moe_host_ids = (int32_t *)malloc((size_t)rows * 4);
        c->moe_host_list = (int32_t *)malloc((size_t)rows * 8);
        CUDA_ASSERT_MSG(c->moe_host_ids && c->moe_host_list, "out of host memory");
        c->moe_host_rows = (size_t)rows;
    }
    int32_t *hid = c->moe_host_ids, *order = c->moe_host_list, *where = order + rows;
    CUDA_CHECK(cudaMemcpyAsync(hid, ids, (size_t)rows * 4, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    /* counting sort of (token, j) rows by expert, stable in row order;
     * rows of other ranks' experts (expert parallel) dropped */
    long *start = (long *)calloc((size_t)E + 1, sizeof(long));
    CUDA_ASSERT_MSG(start, "out of host memory");
    for (long r = 0; r < rows; r++) {
        CUDA_ASSERT(hid[r] >= 0);
        hid[r] -= e->first;
        if (hid[r] >= 0 && hid[r] < E) start[hid[r] + 1]++;
    }
    for (long ex = 0; ex < E; ex++) start[ex + 1] += start[ex];
    long *fill = (long *)malloc((size_t)E * sizeof(long));
    CUDA_ASSERT_MSG(fill, "out of host memory");
    for (long ex = 0; ex < E; ex++) fill[ex] = start[ex];
    for (long r = 0; r < rows; r++) {
        if (hid[r] < 0 || hid[r] >= E) {
            where[r] = -1;
            continue;
        }
        long at = fill[hid[r]]++;
        order[at] = (int32_t)r;
        where[r] = (int32_t)at;
    }
    free(fill);
    CUDA_CHECK(cudaMemcpyAsync(order_d, order, (size_t)rows * 8, cudaMemcpyHostToDevice,
                               c->stream));
    long kept = start[E];
    if (kept > 0) moe_gather_kernel<<<grid_for(kept, 1), 256, 0, c->stream>>>(xg, x, order_d, top_k, kept, H);
    CUDA_CHECK_LAUNCH();
    for (long ex = 0; ex < E; ex++) {
        long off = start[ex], cnt = start[ex + 1] - start[ex];
        if (!cnt) continue;
        cuda_op_matmul(c, g + off * F, F, xg + off * H, H, &e->gate[ex], e->gate_bias ? e->gate_bias + ex * F : NULL,
                       cnt);
        cuda_op_matmul(c, u + off * F, F, xg + off * H, H, &e->up[ex], e->up_bias ? e->up_bias + ex * F : NULL, cnt);
        if (e->act == MOE_ACT_SWIGLU_CLAMP) {
            moe_swiglu_clamp_kernel<<<grid_for(cnt * F, 256), 256, 0, c->stream>>>(g + off * F, u + off * F, cnt * F,
                                                                                  e->alpha, e->limit);
            CUDA_CHECK_LAUNCH();
        } else {
            cuda_op_silu_mul(c, g + off * F, F, g + off * F, F, u + off * F, F, cnt, F);
        }
        cuda_op_matmul(c, out + off * H, H, g + off * F, F, &e->down[ex], e->down_bias ? e->down_bias + ex * H : NULL,
                       cnt);
    }
    free(start);
    moe_combine(c, false, y, out, where_d, weights, top_k, n, H);
}

extern "C" void cuda_op_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids,
                                const float *weights, int top_k, const struct moe_experts *e,
                                long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    /* after an allocation failure in the step the routing ids may be
     * garbage, and both paths index with them (the host path asserts) */
    if (n <= 0 || c->oom.bytes) return;
    int device = moe_device_ok(c, e, top_k, n);
    if (!device && moe_quantized(e)) {
        const char *why = cuda_op_moe_experts_refuse(c, e); /* refused at load: unreachable from a model */
        fprintf(stderr,
                "kiln: moe_ffn: %s experts run on the MoE device path only (cuda_moe_quant.cu), which "
                "cannot take these: %s (%d experts of at most %d, hidden %d, inter %d, blocks %dx%d)\n",
                dtype_name(e->gate[0].dtype), why ? why : "too many experts", e->n_experts, ALIGN_THREADS,
                e->hidden, e->inter, e->gate[0].block_rows, e->gate[0].block_cols);
        abort();
    }
    void *const *tab = NULL;
    if (device && !(tab = moe_table_find(c, e))) return;
    /* equal chunks of at most backend_moe_chunk_tokens tokens: the
     * scratch holds one chunk's rows; a token's k outputs are summed in
     * its own order inside its chunk */
    long per = backend_moe_chunk_tokens(top_k), H = e->hidden;
    long chunks = (n + per - 1) / per, tok = (n + chunks - 1) / chunks;
    for (long t0 = 0; t0 < n && !c->oom.bytes; t0 += tok) {
        long m = n - t0 < tok ? n - t0 : tok;
        if (device)
            moe_ffn_device(c, y + t0 * H, x + t0 * H, ids + t0 * top_k, weights + t0 * top_k, top_k, e, m, tab);
        else
            moe_ffn_host(c, y + t0 * H, x + t0 * H, ids + t0 * top_k, weights + t0 * top_k, top_k, e, m);
    }
    if (device) c->moe_device_calls++;
}

extern "C" size_t cuda_moe_scratch_bytes(const struct cuda_ctx *c, const struct backend_step_shape *s) {
    if (s->moe_layers <= 0 || s->moe_slots <= 0) return 0;
    long per = backend_moe_chunk_tokens(s->moe_slots);
    long tok = s->max_tokens < per ? s->max_tokens : per;
    long rows = tok * s->moe_slots, H = s->moe_hidden, F = s->moe_inter, E = s->moe_experts, tiles;
    size_t host = host_scratch_bytes(rows, H, F), dev = 0;
    if (c->moe_device_max > 0) {
        long drows = (c->moe_device_max < tok ? c->moe_device_max : tok) * s->moe_slots;
        dev = device_scratch_bytes(drows, H, F, E, 8, 4, &tiles);
        /* the wgmma products' 16-bit copy of the sorted rows */
        if (c->moe_wg_state && c->moe_wgmma) dev = ((dev + 255) & ~(size_t)255) + (size_t)drows * H * 2;
    }
    size_t scratch = ((host > dev ? host : dev) + 255) & ~(size_t)255;
    /* the per-layer tables of expert pointers (moe_table) */
    return scratch + (size_t)s->moe_layers * (((size_t)6 * E * sizeof(void *) + 511) & ~(size_t)511);
}
