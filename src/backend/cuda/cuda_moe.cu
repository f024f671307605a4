/* cuda_moe.cu — mixture-of-experts routing and expert MLPs.
 *
 * Routing: one warp per token row, scores and choices in shared memory.
 * The selection follows cpu_moe.c exactly, quirks included: top-k takes the
 * largest value with the lowest index winning ties; group-limited routing
 * scores a group by its best expert, noaux_tc (DeepSeek-V3) by the sum of
 * its two best biased scores; experts of unchosen groups are masked to 0.0
 * (not -inf), so a negative biased score can lose to a masked expert.
 *
 * Expert MLPs (a simple first version): the routing ids come back to the
 * host (one stream sync per MoE layer), rows are grouped by expert, and
 * each expert with rows runs gate/up/down through cuda_op_matmul on its
 * contiguous block of gathered rows. A final kernel sums each token's k
 * expert outputs in the token's own top-k order, as the CPU does.
 * Grouped GEMMs without the host round trip come next (docs/cuda.md). */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

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

/* ids[n][top_k], w[n][top_k] from logits[n][E]; one warp per row.
 * shared: scores[E], choice[E], gscore[n_group]. */
static __global__ void moe_route_kernel(int32_t *__restrict__ ids, float *__restrict__ weights,
                                        const float *__restrict__ logits,
                                        const float *__restrict__ bias, struct moe_route_params p,
                                        long n) {
    extern __shared__ float sh[];
    int E = p.n_experts, lane = threadIdx.x;
    float *scores = sh, *choice = sh + E, *gscore = sh + 2 * E;
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float *lg = logits + i * E;
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
        for (int e = lane; e < E; e += 32) choice[e] = scores[e] + (bias ? bias[e] : 0.0f);
        __syncwarp();
        if (p.method != MOE_ROUTE_GREEDY && p.n_group > 1) {
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
        int32_t *out_ids = ids + i * p.top_k;
        float *out_w = weights + i * p.top_k;
        for (int j = 0; j < p.top_k; j++) {
            int e = warp_argmax(choice, E);
            __syncwarp();
            if (lane == 0) {
                out_ids[j] = e;
                choice[e] = -INFINITY;
            }
            __syncwarp();
        }
        if (lane == 0) {
            float sum = 0.0f;
            for (int j = 0; j < p.top_k; j++) sum += out_w[j] = scores[out_ids[j]];
            if (p.renormalize) {
                float inv = 1.0f / (sum + 1e-20f);
                for (int j = 0; j < p.top_k; j++) out_w[j] *= inv;
            }
            if (!p.renormalize || p.scale_when_renormalized)
                for (int j = 0; j < p.top_k; j++) out_w[j] *= p.scaling;
        }
        __syncwarp();
    }
}

extern "C" void cuda_op_moe_route(void *ctx, int32_t *ids, float *weights, const float *logits,
                                  const float *bias, const struct moe_route_params *p, long n) {
    CUDA_ASSERT(p->n_experts <= MOE_MAX_EXPERTS && p->top_k <= p->n_experts && p->top_k >= 1);
    CUDA_ASSERT(p->method == MOE_ROUTE_GREEDY || p->n_group <= 1 ||
                (p->n_experts % p->n_group == 0 && p->topk_group <= p->n_group));
    if (n <= 0) return;
    size_t smem = (size_t)(2 * p->n_experts + (p->n_group > 0 ? p->n_group : 1)) * 4;
    moe_route_kernel<<<grid_for(n, 1), 32, smem, ctx_stream(ctx)>>>(ids, weights, logits, bias, *p,
                                                                    n);
    CUDA_CHECK_LAUNCH();
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

/* y[t][H] = Σ_j w[t][j] · out[where[t·k + j]][H], j in top-k order */
static __global__ void moe_combine_kernel(float *__restrict__ y, const float *__restrict__ out,
                                          const int32_t *__restrict__ where,
                                          const float *__restrict__ w, int top_k, long n, long H) {
    for (long t = blockIdx.x; t < n; t += gridDim.x) {
        for (long d = threadIdx.x; d < H; d += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < top_k; j++)
                acc += w[t * top_k + j] * out[(long)where[t * top_k + j] * H + d];
            y[t * H + d] = acc;
        }
    }
}

extern "C" void cuda_op_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids,
                                const float *weights, int top_k, const struct moe_experts *e,
                                long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    long rows = n * top_k, H = e->hidden, F = e->inter, E = e->n_experts;
    /* device scratch: xg [rows][H], g, u [rows][F], out [rows][H], order, where [rows] */
    size_t fl = (size_t)rows * (size_t)(2 * H + 2 * F);
    cuda_scratch_reserve(c, &c->moe_dev, fl * 4 + (size_t)rows * 8);
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
    /* counting sort of (token, j) rows by expert, stable in row order */
    long *start = (long *)calloc((size_t)E + 1, sizeof(long));
    CUDA_ASSERT_MSG(start, "out of host memory");
    for (long r = 0; r < rows; r++) {
        CUDA_ASSERT(hid[r] >= 0 && hid[r] < E);
        start[hid[r] + 1]++;
    }
    for (long ex = 0; ex < E; ex++) start[ex + 1] += start[ex];
    long *fill = (long *)malloc((size_t)E * sizeof(long));
    CUDA_ASSERT_MSG(fill, "out of host memory");
    for (long ex = 0; ex < E; ex++) fill[ex] = start[ex];
    for (long r = 0; r < rows; r++) {
        long at = fill[hid[r]]++;
        order[at] = (int32_t)r;
        where[r] = (int32_t)at;
    }
    free(fill);
    CUDA_CHECK(cudaMemcpyAsync(order_d, order, (size_t)rows * 8, cudaMemcpyHostToDevice,
                               c->stream));
    moe_gather_kernel<<<grid_for(rows, 1), 256, 0, c->stream>>>(xg, x, order_d, top_k, rows, H);
    CUDA_CHECK_LAUNCH();
    for (long ex = 0; ex < E; ex++) {
        long off = start[ex], cnt = start[ex + 1] - start[ex];
        if (!cnt) continue;
        cuda_op_matmul(c, g + off * F, F, xg + off * H, H, &e->gate[ex], NULL, cnt);
        cuda_op_matmul(c, u + off * F, F, xg + off * H, H, &e->up[ex], NULL, cnt);
        cuda_op_silu_mul(c, g + off * F, F, g + off * F, F, u + off * F, F, cnt, F);
        cuda_op_matmul(c, out + off * H, H, g + off * F, F, &e->down[ex], NULL, cnt);
    }
    free(start);
    moe_combine_kernel<<<grid_for(n, 1), 256, 0, c->stream>>>(y, out, where_d, weights, top_k, n,
                                                              H);
    CUDA_CHECK_LAUNCH();
}
