/* cpu_moe.c — mixture-of-experts routing and expert MLPs on the CPU.
 *
 * Routing follows the reference models exactly, including their quirks:
 * DeepSeek-V3 masks the experts of unchosen groups to 0.0 (not -inf) before
 * its top-k, so an expert whose biased score is negative can lose to a
 * masked one. The expert MLPs gather each expert's rows, run them through
 * the shared matrix kernel, and sum the k expert outputs of a row in the
 * row's own top-k order, so results do not depend on the rest of the batch.
 * Experts may have biases and gpt-oss's clamped SwiGLU (moe_experts.act).
 * Under expert parallel the experts of a call are a range of the routed
 * ones (moe_experts.first): slots routed outside it are skipped.
 * Benchmarks may route at random instead (moe_route_params.uniform, the
 * draw of tensor/route_uniform.h) and count the experts each call touches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/mem.h"
#include "tensor/route_uniform.h"

#define MOE_MAX_EXPERTS 1024

/* Indices of the k largest values (first index wins ties), largest first. */
static void top_k(const float *v, int n, int k, int32_t *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= out[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        out[j] = best;
    }
}

/* Row i's uniform draw (route_uniform.h) as its logits. */
static void uniform_logits(const struct moe_route_params *p, long i, float *out) {
    uint64_t row = route_uniform_row(p->key_slot[i], p->key_pos[i], p->layer);
    for (int e = 0; e < p->n_experts; e++) out[e] = route_uniform_score(row, e);
}

/* uniform: logits are the row's random scores, which also choose (exact
 * floats: the same experts on every backend); no bias, no group limit. */
static void route_row(const float *logits, const float *bias, const struct moe_route_params *p,
                      int uniform, int32_t *ids, float *w) {
    int E = p->n_experts;
    float scores[MOE_MAX_EXPERTS], choice[MOE_MAX_EXPERTS];
    if (uniform) {
        for (int e = 0; e < E; e++) choice[e] = logits[e];
        bias = NULL;
    }
    if (p->scoring == MOE_ROUTE_SOFTMAX) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
        for (int e = 0; e < E; e++) sum += scores[e] = expf(logits[e] - mx);
        for (int e = 0; e < E; e++) scores[e] /= sum;
    } else {
        for (int e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-logits[e]));
    }
    if (!uniform)
        for (int e = 0; e < E; e++) choice[e] = scores[e] + (bias ? bias[e] : 0.0f);

    if (!uniform && p->method != MOE_ROUTE_GREEDY && p->n_group > 1) {
        int per = E / p->n_group;
        float gscore[MOE_MAX_EXPERTS];
        for (int g = 0; g < p->n_group; g++) {
            const float *c = choice + g * per;
            if (p->method == MOE_ROUTE_GROUP_LIMITED) {
                float mx = -INFINITY;
                for (int i = 0; i < per; i++) mx = fmaxf(mx, c[i]);
                gscore[g] = mx;
            } else { /* sum of the two best */
                int32_t two[2];
                top_k(c, per, 2, two);
                gscore[g] = c[two[0]] + c[two[1]];
            }
        }
        int32_t keep[MOE_MAX_EXPERTS];
        top_k(gscore, p->n_group, p->topk_group, keep);
        for (int g = 0; g < p->n_group; g++) {
            int kept = 0;
            for (int i = 0; i < p->topk_group; i++) kept |= keep[i] == g;
            if (!kept)
                for (int i = 0; i < per; i++) choice[g * per + i] = 0.0f;
        }
    }
    top_k(choice, E, p->top_k, ids);
    float sum = 0.0f;
    for (int j = 0; j < p->top_k; j++) sum += w[j] = scores[ids[j]];
    if (p->renormalize) {
        float inv = 1.0f / (sum + 1e-20f);
        for (int j = 0; j < p->top_k; j++) w[j] *= inv;
    }
    if (!p->renormalize || p->scale_when_renormalized)
        for (int j = 0; j < p->top_k; j++) w[j] *= p->scaling;
}

/* Adds this call's distinct routed experts to the count record (the flags
 * after it are the set; cleared again for the next call). */
static void count_call(struct moe_route_count *c, const int32_t *ids, int w, int top_k, int E, long n) {
    if (!c->enabled || n <= 0) return;
    int32_t *touched = (int32_t *)(c + 1);
    int distinct = 0;
    for (long i = 0; i < n; i++)
        for (int j = 0; j < top_k; j++) {
            int e = ids[i * w + j];
            if (e >= 0 && e < E && !touched[e]) touched[e] = 1, distinct++;
        }
    for (int e = 0; e < E; e++) touched[e] = 0;
    if (!c->calls || distinct < c->min) c->min = distinct;
    if (!c->calls || distinct > c->max) c->max = distinct;
    c->calls++;
    c->sum += distinct;
    c->rows += n;
}

void cpu_moe_route(void *ctx, int32_t *ids, float *weights, const float *logits, const float *bias,
                   const struct moe_route_params *p, long n) {
    KILN_ASSERT(p->n_experts <= MOE_MAX_EXPERTS && p->top_k <= p->n_experts && p->n_fused >= 0);
    KILN_ASSERT(!p->uniform || (p->key_slot && p->key_pos));
    int w = p->top_k + p->n_fused;
    float draw[MOE_MAX_EXPERTS];
    for (long i = 0; i < n; i++) {
        const float *lg = logits + i * p->n_experts;
        if (p->uniform) uniform_logits(p, i, draw), lg = draw;
        route_row(lg, bias, p, p->uniform, ids + i * w, weights + i * w);
        for (int j = 0; j < p->n_fused; j++) ids[i * w + p->top_k + j] = p->n_experts + j, weights[i * w + p->top_k + j] = 1.0f;
    }
    if (p->count) count_call(p->count, ids, w, p->top_k, p->n_experts, n);
}

/* gpt-oss's activation over n elements, into g (moe_act). */
static void swiglu_clamp(float *g, const float *u, long n, float alpha, float limit) {
    for (long i = 0; i < n; i++) {
        float gi = fminf(g[i], limit), ui = fminf(fmaxf(u[i], -limit), limit);
        g[i] = (ui + 1.0f) * (gi / (1.0f + expf(-alpha * gi)));
    }
}

/* One chunk of n tokens (rows = n * top_k (token, slot) rows). */
static void moe_ffn_chunk(struct cpu_ctx *c, float *y, const float *x, const int32_t *ids,
                          const float *weights, int top_k, const struct moe_experts *e, long n) {
    long rows = n * top_k, H = e->hidden, F = e->inter;
    float *xg = c->moe_buf, *g = xg + rows * H, *u = g + rows * F, *out = u + rows * F;
    int32_t *which = c->moe_idx; /* gathered row r came from (token, j) = which[r] */
    for (int ex = 0; ex < e->n_experts; ex++) {
        long cnt = 0;
        for (long r = 0; r < rows; r++) {
            if (ids[r] != e->first + ex) continue;
            memcpy(xg + cnt * H, x + (r / top_k) * H, (size_t)H * 4);
            which[cnt++] = (int32_t)r;
        }
        if (!cnt) continue;
        cpu_matmul_op(c, g, F, xg, H, &e->gate[ex], e->gate_bias ? e->gate_bias + ex * F : NULL, cnt);
        cpu_matmul_op(c, u, F, xg, H, &e->up[ex], e->up_bias ? e->up_bias + ex * F : NULL, cnt);
        if (e->act == MOE_ACT_SWIGLU_CLAMP) swiglu_clamp(g, u, cnt * F, e->alpha, e->limit);
        else cpu_silu_mul(c, g, F, g, F, u, F, cnt, F);
        cpu_matmul_op(c, xg, H, g, F, &e->down[ex], e->down_bias ? e->down_bias + ex * H : NULL, cnt);
        for (long i = 0; i < cnt; i++) memcpy(out + (long)which[i] * H, xg + i * H, (size_t)H * 4);
    }
    for (long t = 0; t < n; t++) {
        float *yt = y + t * H;
        for (long d = 0; d < H; d++) yt[d] = 0.0f;
        for (int j = 0; j < top_k; j++) {
            int id = ids[t * top_k + j];
            if (id < e->first || id >= e->first + e->n_experts) continue; /* another rank's */
            float wj = weights[t * top_k + j];
            const float *o = out + (t * top_k + j) * H;
            for (long d = 0; d < H; d++) yt[d] += wj * o[d];
        }
    }
}

/* Scratch of a chunk of `rows` (token, slot) rows: gathered x [rows][H],
 * gate and up [rows][F], expert outputs [rows][H], and the row list. */
size_t cpu_moe_scratch_bytes(long rows, long hidden, long inter) {
    return (size_t)rows * (size_t)(2 * hidden + 2 * inter) * 4 + (size_t)rows * 4;
}

void cpu_moe_ffn(void *ctx, float *y, const float *x, const int32_t *ids, const float *weights,
                 int top_k, const struct moe_experts *e, long n) {
    struct cpu_ctx *c = ctx;
    if (n <= 0) return;
    /* chunks of tokens (backend_moe_chunk_rows): the scratch holds one
     * chunk, and rows are independent, so chunking changes no bit */
    long per = backend_moe_chunk_tokens(top_k);
    long chunks = (n + per - 1) / per, tok = (n + chunks - 1) / chunks;
    long rows = tok * top_k, H = e->hidden, F = e->inter;
    size_t need = (size_t)rows * (size_t)(2 * H + 2 * F);
    if (need > c->moe_buf_floats) {
        free(c->moe_buf);
        c->moe_buf = xaligned_alloc(need * 4);
        c->moe_buf_floats = need;
    }
    if ((size_t)rows > c->moe_idx_count) {
        free(c->moe_idx);
        c->moe_idx = xmalloc((size_t)rows * sizeof *c->moe_idx);
        c->moe_idx_count = (size_t)rows;
    }
    for (long t0 = 0; t0 < n; t0 += tok) {
        long m = n - t0 < tok ? n - t0 : tok;
        moe_ffn_chunk(c, y + t0 * H, x + t0 * H, ids + t0 * top_k, weights + t0 * top_k, top_k, e, m);
    }
}
