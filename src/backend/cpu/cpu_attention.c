/* cpu_attention.c — causal attention over the paged KV cache.
 *
 * One (token, head) pair at a time, split across threads. Each query row
 * scans its own sequence's positions 0..pos in order: scores, then a max, an
 * exp-sum and the weighted sum of values, all in position order. That order
 * depends only on the row's own position, never on the batch or on how the
 * prompt was chunked, so results are batch-invariant (docs/design.md, "On the
 * CPU"). With a sliding window (attn_params.window) the scan starts at
 * the window's first position instead of 0. Attention sinks
 * (attn_params.sinks) add one logit per head to the max and the
 * denominator.
 *
 * Where the CPU has AVX-512 (the family cpu_matmul uses), attn_one_avx512
 * performs the very same operations as attn_one, vectorised: eight keys'
 * 8-lane dot products at once (independent chains instead of one), and the
 * weighted sum of values held in registers across positions. Each lane does
 * the multiply and then the add that the scalar code does (the build is ISO
 * C, which does not contract them into an FMA), so the results are the same
 * bits.
 *
 * An FP8 cache (kv_dtype e4m3) is read row by row: each key or value row
 * is widened (fp8_e4m3_to_f32(q) * scale) into the thread's row buffer and
 * the fp32 code runs on it, so the result is the fp32 attention's over
 * the dequantized cache, bit for bit (test_cpu_attention checks it). */
#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "base/error.h"
#include "base/threadpool.h"

enum { ATTN_KEYS_MAX = 8 }; /* the most key rows a thread widens at once (ATTN_KEYS) */

struct attn_job {
    float *out;
    long ldo;
    const float *q;
    long ldq;
    const void *k_cache, *v_cache;
    const struct attn_params *p;
    const struct backend_batch *b;
    float *scratch; /* [nth][max_context] */
    long max_context;
    int fp8;        /* the caches hold e4m3 (p->k_scale, p->v_scale) */
    float *rows;    /* fp8: [nth][row_floats] widened K rows (ATTN_KEYS of dk) and a V chunk */
    long row_floats;
};

/* Row `off` (elements) of a cache, n elements: in place when fp32, else
 * widened into buf. */
static const float *kv_row(const void *cache, long off, int n, int fp8, float scale, float *buf) {
    if (!fp8) return (const float *)cache + off;
    cpu_fp8_widen(buf, (const uint8_t *)cache + off, n, scale);
    return buf;
}

static int seq_of_token(const struct backend_batch *b, long t) {
    int lo = 0, hi = b->n_seqs - 1; /* last s with q_start[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Walks a sequence's KV slots in position order without dividing by the
 * page size at every position (a division per key cost more than the dot
 * product of a short head). */
struct slot_iter {
    const int32_t *pages;
    long page_size, page, off;
};

static long slot_next(struct slot_iter *it) {
    long slot = (long)it->pages[it->page] * it->page_size + it->off;
    if (++it->off == it->page_size) {
        it->off = 0;
        it->page++;
    }
    return slot;
}

/* The iterator at position p0 of a sequence. */
static struct slot_iter slot_at(const int32_t *pages, long page_size, long p0) {
    return (struct slot_iter){pages, page_size, p0 / page_size, p0 % page_size};
}

/* The first position a query at pos sees (attn_params.window). */
static long window_start(const struct attn_params *p, int pos) {
    return p->window > 0 && pos >= p->window ? (long)pos - p->window + 1 : 0;
}

static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[k + l] * b[k + l];
    for (; k < n; k++) acc[k & 7] += a[k] * b[k];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* Attention sinks (attn_params.sinks): head h's sink logit joins the
 * softmax's max and denominator, with no value row. Raises *mx to the
 * sink where it is larger and returns the sink's share of the sum,
 * exp(sink - max); 0 without sinks. */
static float sink_term(const struct attn_params *p, int h, float *mx) {
    if (!p->sinks) return 0.0f;
    float s = p->sinks[h];
    if (s > *mx) *mx = s;
    return expf(s - *mx);
}

static void attn_one(const struct attn_job *j, long t, int h, float *scores, float *rows) {
    const struct attn_params *p = j->p;
    const struct backend_batch *b = j->b;
    int s = seq_of_token(b, t);
    int pos = b->positions[t];
    int group = p->n_heads / p->n_kv_heads, g = h / group;
    const int32_t *pages = b->kv_pages + b->kv_page_start[s];
    const float *q = j->q + t * j->ldq + (long)h * p->dk;
    long p0 = window_start(p, pos), n = (long)pos + 1 - p0;
    KILN_ASSERT(n <= j->max_context);
    float mx = -INFINITY;
    struct slot_iter ki = slot_at(pages, b->page_size, p0);
    for (long i = 0; i < n; i++) {
        long slot = slot_next(&ki);
        const float *k = kv_row(j->k_cache, slot * p->k_stride + (long)g * p->dk, p->dk, j->fp8,
                                p->k_scale, rows);
        float sc = dot(q, k, p->dk) * p->scale;
        scores[i] = sc;
        if (sc > mx) mx = sc;
    }
    float sum = sink_term(p, h, &mx);
    for (long i = 0; i < n; i++) {
        scores[i] = expf(scores[i] - mx);
        sum += scores[i];
    }
    float *o = j->out + t * j->ldo + (long)h * p->dv;
    for (int d = 0; d < p->dv; d++) o[d] = 0.0f;
    struct slot_iter vi = slot_at(pages, b->page_size, p0);
    for (long i = 0; i < n; i++) {
        long slot = slot_next(&vi);
        const float *v = kv_row(j->v_cache, slot * p->v_stride + (long)g * p->dv, p->dv, j->fp8,
                                p->v_scale, rows);
        float w = scores[i];
        for (int d = 0; d < p->dv; d++) o[d] += w * v[d];
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < p->dv; d++) o[d] *= inv;
}

#if defined(__x86_64__)
#define KILN_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

/* dot()'s reduction of its 8 lanes, in its order. */
static float reduce8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

enum { ATTN_KEYS = ATTN_KEYS_MAX }; /* keys whose dot products run side by side */

/* dot(q, k[c]) for cnt (1..ATTN_KEYS) keys; n is a multiple of 8. Each
 * key's sum is a chain of dependent adds: eight chains keep the adder busy
 * where one would wait on each add's latency. */
static KILN_AVX512 void dot_keys(const float *q, const float *const *k, int cnt, int n, float *out) {
    __m256 acc[ATTN_KEYS];
    for (int c = 0; c < ATTN_KEYS; c++) acc[c] = _mm256_setzero_ps();
    for (int d = 0; d < n; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        for (int c = 0; c < ATTN_KEYS; c++)
            if (c < cnt) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(qv, _mm256_loadu_ps(k[c] + d)));
    }
    for (int c = 0; c < cnt; c++) {
        float t[8];
        _mm256_storeu_ps(t, acc[c]);
        out[c] = reduce8(t);
    }
}

enum { ATTN_DV_CHUNK = 128 }; /* 8 zmm of output held across positions */

/* attn_one for dk % 8 == 0 and dv % ATTN_DV_CHUNK == 0. */
static KILN_AVX512 void attn_one_avx512(const struct attn_job *j, long t, int h, float *scores,
                                        float *rows) {
    const struct attn_params *p = j->p;
    const struct backend_batch *b = j->b;
    int s = seq_of_token(b, t);
    int pos = b->positions[t];
    int group = p->n_heads / p->n_kv_heads, g = h / group;
    const int32_t *pages = b->kv_pages + b->kv_page_start[s];
    const float *q = j->q + t * j->ldq + (long)h * p->dk;
    long p0 = window_start(p, pos), n = (long)pos + 1 - p0;
    KILN_ASSERT(n <= j->max_context);
    struct slot_iter ki = slot_at(pages, b->page_size, p0);
    for (long i0 = 0; i0 < n; i0 += ATTN_KEYS) {
        const float *k[ATTN_KEYS];
        int cnt = n - i0 < ATTN_KEYS ? (int)(n - i0) : ATTN_KEYS;
        for (int c = 0; c < cnt; c++)
            k[c] = kv_row(j->k_cache, slot_next(&ki) * p->k_stride + (long)g * p->dk, p->dk, j->fp8,
                          p->k_scale, rows + (long)c * p->dk);
        dot_keys(q, k, cnt, p->dk, scores + i0);
        for (int c = 0; c < cnt; c++) scores[i0 + c] *= p->scale;
    }
    float mx = -INFINITY;
    for (long i = 0; i < n; i++)
        if (scores[i] > mx) mx = scores[i];
    float sum = sink_term(p, h, &mx);
    for (long i = 0; i < n; i++) {
        scores[i] = expf(scores[i] - mx);
        sum += scores[i];
    }
    float *o = j->out + t * j->ldo + (long)h * p->dv;
    const __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int d0 = 0; d0 < p->dv; d0 += ATTN_DV_CHUNK) {
        __m512 acc[ATTN_DV_CHUNK / 16];
        for (int c = 0; c < ATTN_DV_CHUNK / 16; c++) acc[c] = _mm512_setzero_ps();
        struct slot_iter vi = slot_at(pages, b->page_size, p0);
        for (long i = 0; i < n; i++) {
            long slot = slot_next(&vi);
            const float *v = kv_row(j->v_cache, slot * p->v_stride + (long)g * p->dv + d0,
                                    ATTN_DV_CHUNK, j->fp8, p->v_scale, rows);
            __m512 w = _mm512_set1_ps(scores[i]);
            for (int c = 0; c < ATTN_DV_CHUNK / 16; c++)
                acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(w, _mm512_loadu_ps(v + 16 * c)));
        }
        for (int c = 0; c < ATTN_DV_CHUNK / 16; c++) _mm512_storeu_ps(o + d0 + 16 * c, _mm512_mul_ps(acc[c], inv));
    }
}
#endif

/* Threads take (token, head) pairs in turn rather than in contiguous
 * ranges: a causal prefill's later tokens attend to more positions, so
 * contiguous ranges left the first thread idle for half the time. Each pair
 * is computed the same way whichever thread takes it. */
static void attn_worker(void *arg, int ith, int nth) {
    const struct attn_job *j = arg;
    long total = (long)j->b->n_tokens * j->p->n_heads;
    float *scores = j->scratch + (long)ith * j->max_context;
    float *rows = j->rows ? j->rows + (long)ith * j->row_floats : NULL;
#if defined(__x86_64__)
    if (cpu_matmul_isa() >= CPU_MATMUL_AVX512 && j->p->dk % 8 == 0 && j->p->dv % ATTN_DV_CHUNK == 0) {
        for (long w = ith; w < total; w += nth)
            attn_one_avx512(j, w / j->p->n_heads, (int)(w % j->p->n_heads), scores, rows);
        return;
    }
#endif
    for (long w = ith; w < total; w += nth)
        attn_one(j, w / j->p->n_heads, (int)(w % j->p->n_heads), scores, rows);
}

void cpu_attention(void *ctx, float *out, long ldo, const float *q, long ldq, const void *k_cache,
                   const void *v_cache, const struct attn_params *p, const struct backend_batch *b) {
    struct cpu_ctx *c = ctx;
    KILN_ASSERT_MSG(c->attn_scratch, "cpu backend: reserve() was not called");
    struct attn_job j = {out, ldo, q, ldq, k_cache, v_cache, p, b, c->attn_scratch, c->max_context,
                         c->kv_fp8 && !p->f32_cache, NULL, 0};
    if (j.fp8) { /* ATTN_KEYS key rows (the vectorised path), or a value row */
        long kr = (long)ATTN_KEYS_MAX * p->dk;
        j.row_floats = kr > p->dv ? kr : p->dv;
        j.rows = malloc((size_t)c->n_threads * (size_t)j.row_floats * sizeof(float));
        KILN_ASSERT_MSG(j.rows, "cpu attention: out of memory for FP8 row buffers");
    }
    threadpool_run(c->tp, attn_worker, &j);
    free(j.rows);
}
