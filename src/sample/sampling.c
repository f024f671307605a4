/* sampling.c — the CPU sampler: penalties, temperature, top-k / top-p /
 * min-p truncation and the draw, over one row of logits.
 *
 * Speed on a 150k vocabulary comes from never sorting the vocabulary and
 * from vectorised passes over it (max, exp-and-sum). top_k: the k-th
 * largest of the maxima of blocks of 256 (or 16) logits bounds the k-th
 * largest logit from below, so only the few logits above it are looked at,
 * and an exact quickselect on the key (logit desc, id asc) picks k of them.
 * top_p: a histogram of probability mass over logit bins (tokens too small
 * to matter are skipped); whole bins above the cut are in, and the one bin
 * the cut falls into is split by a weighted quickselect on the same key.
 * The draw is an inverse-CDF walk that skips whole blocks by their sums.
 *
 * Scratch layout (2 * vocab floats, from the caller):
 *   [0, vocab)        candidate ids stored as floats (exact below 2^24;
 *                     floats rather than int32 so the caller's float buffer
 *                     is never accessed through another type), or, when no
 *                     truncation applies, the unnormalised weights;
 *   [vocab, 2*vocab)  a copy of the raw logits, only when logprobs are asked
 *                     and bias/penalties are about to change the row.
 */
#include "sample/sampling.h"

#include <math.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tensor/backend.h"

/* See the header: cumulative top_p mass within this fraction counts as reached. */
static const double TOP_P_SLACK = 1e-6;

void sampling_params_default(struct sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
}

void sampling_params_take(struct sampling_params *to, const struct sampling_params *from, unsigned mask) {
    if (mask & SAMPLING_FIELD_TEMPERATURE) to->temperature = from->temperature;
    if (mask & SAMPLING_FIELD_TOP_P) to->top_p = from->top_p;
    if (mask & SAMPLING_FIELD_TOP_K) to->top_k = from->top_k;
    if (mask & SAMPLING_FIELD_MIN_P) to->min_p = from->min_p;
    if (mask & SAMPLING_FIELD_REPETITION_PENALTY) to->repetition_penalty = from->repetition_penalty;
}

int sampling_params_validate(const struct sampling_params *p, int vocab, struct kiln_error *err) {
    /* Written as !(in range) so that NaN is rejected too. */
    if (!(p->temperature >= 0.0f && p->temperature <= 1e6f))
        return kiln_errorf(err, "temperature must be >= 0, got %g", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kiln_errorf(err, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kiln_errorf(err, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return kiln_errorf(err, "repetition_penalty must be > 0, got %g",
                           (double)p->repetition_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kiln_errorf(err, "frequency_penalty must be in [-2, 2], got %g",
                           (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kiln_errorf(err, "presence_penalty must be in [-2, 2], got %g",
                           (double)p->presence_penalty);
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLING_MAX_TOP_LOGPROBS)
        return kiln_errorf(err, "top_logprobs must be in 0..%d, got %d",
                           SAMPLING_MAX_TOP_LOGPROBS, p->top_logprobs);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return kiln_errorf(err, "logit_bias: bad entry count %d", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const struct logit_bias_entry *e = &p->logit_bias[i];
        if (e->id < 0 || e->id >= vocab)
            return kiln_errorf(err, "logit_bias: token id %d is outside the vocabulary [0, %d)",
                               (int)e->id, vocab);
        if (!(e->bias >= -100.0f && e->bias <= 100.0f))
            return kiln_errorf(err, "logit_bias: bias for token %d must be in [-100, 100], got %g",
                               (int)e->id, (double)e->bias);
    }
    return 0;
}

/* ---- per-request penalty state ------------------------------------------ */

/* The state is sparse on purpose: a dense count array would cost 600 KB per
 * running request at a 150k vocabulary. Prompt and output ids live in a bit
 * set plus a list of distinct ids (what repetition_penalty walks); output
 * counts in a small open-addressing table (what frequency/presence walk). */
struct sampler_state {
    int vocab;
    uint64_t *seen_bits;  /* (vocab + 63) / 64: token in prompt or output */
    int32_t *seen;        /* (cap_seen) distinct ids of prompt and output */
    int n_seen, cap_seen;
    int32_t *out_ids;     /* (cap_out) hash keys, -1 = empty */
    int32_t *out_counts;  /* (cap_out) */
    int n_out, cap_out;   /* cap_out is a power of two, load <= 1/2 */
};

static void seen_add(struct sampler_state *s, int32_t id) {
    uint64_t bit = (uint64_t)1 << (id & 63);
    if (s->seen_bits[id >> 6] & bit) return;
    s->seen_bits[id >> 6] |= bit;
    if (s->n_seen == s->cap_seen) {
        s->cap_seen = s->cap_seen ? 2 * s->cap_seen : 64;
        s->seen = xrealloc(s->seen, (size_t)s->cap_seen * sizeof *s->seen);
    }
    s->seen[s->n_seen++] = id;
}

static uint32_t id_hash(int32_t id) { return (uint32_t)id * 2654435761u; }

static void out_table_alloc(struct sampler_state *s, int cap) {
    s->cap_out = cap;
    s->out_ids = xmalloc((size_t)cap * sizeof *s->out_ids);
    s->out_counts = xcalloc((size_t)cap, sizeof *s->out_counts);
    for (int i = 0; i < cap; i++) s->out_ids[i] = -1;
}

static void out_insert(struct sampler_state *s, int32_t id, int32_t add) {
    uint32_t mask = (uint32_t)s->cap_out - 1;
    for (uint32_t h = id_hash(id) & mask;; h = (h + 1) & mask) {
        if (s->out_ids[h] == id) {
            s->out_counts[h] += add;
            return;
        }
        if (s->out_ids[h] < 0) {
            s->out_ids[h] = id;
            s->out_counts[h] = add;
            s->n_out++;
            return;
        }
    }
}

struct sampler_state *sampler_state_create(int vocab_size, const int32_t *prompt, int n_prompt) {
    KILN_ASSERT(vocab_size > 0 && n_prompt >= 0);
    struct sampler_state *s = xcalloc(1, sizeof *s);
    s->vocab = vocab_size;
    s->seen_bits = xcalloc(((size_t)vocab_size + 63) / 64, sizeof *s->seen_bits);
    for (int i = 0; i < n_prompt; i++) {
        KILN_ASSERT_MSG(prompt[i] >= 0 && prompt[i] < vocab_size, "prompt token outside vocab");
        seen_add(s, prompt[i]);
    }
    out_table_alloc(s, 64);
    return s;
}

void sampler_state_free(struct sampler_state *s) {
    if (!s) return;
    free(s->seen_bits);
    free(s->seen);
    free(s->out_ids);
    free(s->out_counts);
    free(s);
}

void sampler_state_accept(struct sampler_state *s, int32_t token) {
    KILN_ASSERT_MSG(token >= 0 && token < s->vocab, "accepted token outside vocab");
    seen_add(s, token);
    if (2 * (s->n_out + 1) > s->cap_out) {
        int32_t *ids = s->out_ids, *counts = s->out_counts;
        int cap = s->cap_out;
        s->n_out = 0;
        out_table_alloc(s, 2 * cap);
        for (int i = 0; i < cap; i++)
            if (ids[i] >= 0) out_insert(s, ids[i], counts[i]);
        free(ids);
        free(counts);
    }
    out_insert(s, token, 1);
}

/* ---- vector helpers ------------------------------------------------------ */

/* GNU vector extensions (gcc and clang, any target). The hot loops are
 * reductions (max, sums of exp), which compilers do not vectorise without
 * -ffast-math; with explicit lanes they do, and the summation order is
 * fixed by the code, so a given row always gives the same weights. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

enum {
    W_BLOCK = 256, /* weights are summed per block in float, blocks in double */
    GROUP = 16,    /* elements per skip test in the weight and top_p passes */
};

static inline v4f v4_load(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v4_store(float *p, v4f v) { memcpy(p, &v, sizeof v); }
static inline v4f v4_splat(float x) { return (v4f){x, x, x, x}; }
static inline v4f v4_select(v4i mask, v4f a, v4f b) {
    return (v4f)(((v4i)a & mask) | ((v4i)b & ~mask));
}
/* a > b ? a : b per lane, so a NaN in a is ignored (MAXPS does exactly this). */
static inline v4f v4_max(v4f a, v4f b) {
#if defined(__SSE__)
    return (v4f)_mm_max_ps((__m128)a, (__m128)b);
#else
    return v4_select(a > b, a, b);
#endif
}

/* Weights below exp(W_CUT) = 2^-40 of the top token's are taken as 0: such
 * a token is never drawn in practice, the row's total moves by at most
 * vocab * 2^-40 (1.4e-7 at 150k, float rounding level), and whole groups of
 * the long tail then cost a comparison instead of an exp. */
static const float W_CUT = -27.7f;

/* exp(x) for the x <= 0 the sampler needs (argument reduction to
 * [-ln2/2, ln2/2], degree-6 Taylor polynomial). Relative error about 2e-7;
 * exactly 1 at 0 and exactly 0 at or below W_CUT (also for -inf and NaN), so
 * the top token has weight 1 and a masked token weight 0. */
static inline v4f exp_neg_v(v4f x) {
    const v4f round_magic = v4_splat(12582912.0f); /* 1.5 * 2^23: x + it - it rounds */
    v4i in_range = x > v4_splat(W_CUT);
    v4f xc = v4_select(in_range, x, v4_splat(W_CUT));
    v4f n = (xc * v4_splat(1.44269504f) + round_magic) - round_magic;
    v4f f = (xc - n * v4_splat(0.693145752f)) - n * v4_splat(1.42860677e-6f);
    v4f p = v4_splat(1.0f / 720);
    p = p * f + v4_splat(1.0f / 120);
    p = p * f + v4_splat(1.0f / 24);
    p = p * f + v4_splat(1.0f / 6);
    p = p * f + v4_splat(0.5f);
    p = p * f + v4_splat(1.0f);
    p = p * f + v4_splat(1.0f);
    v4i bits = (__builtin_convertvector(n, v4i) + 127) << 23; /* 2^n, n >= -126 */
    return (v4f)((v4i)(p * (v4f)bits) & in_range);
}

/* The scalar form is the vector one, so both give identical weights. */
static inline float exp_neg(float x) { return exp_neg_v(v4_splat(x))[0]; }

/* True when some lane of l[0, 16) is above `cut` (NaN is not). */
static inline int any16_above(const float *l, float cut) {
    v4f c = v4_splat(cut);
    v4i a = (v4_load(l) > c) | (v4_load(l + 4) > c) | (v4_load(l + 8) > c) | (v4_load(l + 12) > c);
    return (a[0] | a[1] | a[2] | a[3]) != 0;
}

/* w[i] = exp((l[i] - m) * inv_t), zeroed below min_p. */
static void weights(const float *l, int n, float m, float inv_t, float min_p, float *w) {
    /* Groups entirely at or below the cut are all zero, exactly as the
     * per-element rule in exp_neg_v would make them. */
    float cut = m + W_CUT / inv_t;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        if ((i & 15) == 0 && i + 16 <= n && !any16_above(l + i, cut)) {
            memset(w + i, 0, 16 * sizeof *w);
            i += 12;
            continue;
        }
        v4f x = exp_neg_v((v4_load(l + i) - v4_splat(m)) * v4_splat(inv_t));
        v4_store(w + i, (v4f)((v4i)x & (x >= v4_splat(min_p))));
    }
    for (; i < n; i++) {
        float x = exp_neg((l[i] - m) * inv_t);
        w[i] = x >= min_p ? x : 0.0f;
    }
}

/* Sum of at most W_BLOCK weights in a fixed order. */
static float block_sum(const float *w, int n) {
    v4f a0 = v4_splat(0), a1 = v4_splat(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += v4_load(w + i);
        a1 += v4_load(w + i + 4);
    }
    v4f a = a0 + a1;
    float s = (a[0] + a[1]) + (a[2] + a[3]);
    for (; i < n; i++) s += w[i];
    return s;
}

/* Sum of the weights of the row; the weights go to w_out when given. */
static double weights_total(const float *l, int n, float m, float inv_t, float min_p,
                            float *w_out) {
    float tmp[W_BLOCK];
    double z = 0;
    for (int b = 0; b < n; b += W_BLOCK) {
        int nb = n - b < W_BLOCK ? n - b : W_BLOCK;
        float *w = w_out ? w_out + b : tmp;
        weights(l + b, nb, m, inv_t, min_p, w);
        z += block_sum(w, nb);
    }
    return z;
}

/* Largest value of p[0, len), NaN ignored; -inf when there is none. */
static float span_max(const float *p, int len) {
    v4f a = v4_splat(-INFINITY);
    int i = 0;
    for (; i + 4 <= len; i += 4) a = v4_max(v4_load(p + i), a);
    float m = -INFINITY;
    for (int j = 0; j < 4; j++) m = a[j] > m ? a[j] : m;
    for (; i < len; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* True when some element of p[0, len) is >= t (NaN is not). */
static int span_any_ge(const float *p, int len, float t) {
    v4i a = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= len; i += 4) a |= v4_load(p + i) >= v4_splat(t);
    if (a[0] | a[1] | a[2] | a[3]) return 1;
    for (; i < len; i++)
        if (p[i] >= t) return 1;
    return 0;
}

/* First index of the largest logit; NaN is skipped. -1 when all are NaN. */
static int argmax_first(const float *l, int n) {
    float m = -INFINITY;
    int best_g = -1;
    for (int g = 0; g < n; g += 64) {
        float gm = span_max(l + g, n - g < 64 ? n - g : 64);
        if (gm > m) m = gm, best_g = g;
    }
    if (best_g < 0) { /* every logit -inf or NaN */
        for (int i = 0; i < n; i++)
            if (l[i] == l[i]) return i;
        return -1;
    }
    for (int i = best_g;; i++)
        if (l[i] == m) return i;
}

/* Counter-based random numbers: one SplitMix64 finaliser over the seed and
 * another over the step, so draw `step` of a request is a pure function of
 * (seed, step) and nothing needs to be stored between steps. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t seed, uint64_t step) {
    uint64_t h = mix64(seed ^ mix64(step + 0x9e3779b97f4a7c15ULL));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0); /* 53 bits in [0, 1) */
}

/* ---- logprobs ------------------------------------------------------------ */

/* log-sum-exp of the raw row and its n most likely tokens. The top list is
 * kept sorted (logit desc, id asc); scanning ids upwards and inserting only
 * on a strictly larger logit keeps ties in id order; groups whose maximum
 * cannot enter a full list are skipped. */
static double raw_logprobs(const float *l, int vocab, int n_top, struct sample_result *out) {
    int im = argmax_first(l, vocab);
    if (im < 0 || isinf(l[im])) return (double)(im < 0 ? NAN : l[im]);
    double lse = (double)l[im] + log(weights_total(l, vocab, l[im], 1.0f, 0.0f, NULL));
    int k = 0;
    for (int g = 0; g < vocab && n_top > 0; g += 64) {
        int len = vocab - g < 64 ? vocab - g : 64;
        if (k == n_top && !(span_max(l + g, len) > out->top_logprobs[k - 1])) continue;
        for (int i = g; i < g + len; i++) {
            float x = l[i];
            if (!(x == x) || (k == n_top && !(x > out->top_logprobs[k - 1]))) continue;
            int j = k < n_top ? k++ : k - 1;
            for (; j > 0 && x > out->top_logprobs[j - 1]; j--) {
                out->top_logprobs[j] = out->top_logprobs[j - 1];
                out->top_ids[j] = out->top_ids[j - 1];
            }
            out->top_logprobs[j] = x;
            out->top_ids[j] = i;
        }
    }
    out->n_top = k;
    for (int j = 0; j < k; j++) out->top_logprobs[j] = (float)((double)out->top_logprobs[j] - lse);
    return lse;
}

void sampler_logprob_of(const float *logits, int vocab, int32_t token, int n_top,
                        struct sample_result *out) {
    memset(out, 0, sizeof *out);
    if (n_top < 0) n_top = 0;
    if (n_top > SAMPLING_MAX_TOP_LOGPROBS) n_top = SAMPLING_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    double lse = raw_logprobs(logits, vocab, n_top, out);
    out->token = token;
    out->logprob = token >= 0 && token < vocab ? (float)((double)logits[token] - lse) : -INFINITY;
}

/* ---- bias and penalties -------------------------------------------------- */

static int row_will_change(const struct sampling_params *p, const struct sampler_state *s) {
    if (p->n_logit_bias > 0) return 1;
    if (!s) return 0;
    if (p->repetition_penalty != 1.0f && s->n_seen > 0) return 1;
    return (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && s->n_out > 0;
}

void sampler_process_logits(const struct sampling_params *p, const struct sampler_state *s,
                            float *l, int vocab) {
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t id = p->logit_bias[i].id;
        KILN_ASSERT_MSG(id >= 0 && id < vocab, "logit_bias id outside vocab (validate first)");
        l[id] += p->logit_bias[i].bias;
    }
    if (!s) return;
    KILN_ASSERT(s->vocab == vocab);
    float rp = p->repetition_penalty;
    if (rp != 1.0f)
        for (int i = 0; i < s->n_seen; i++) {
            float *x = &l[s->seen[i]];
            *x = *x > 0 ? *x / rp : *x * rp;
        }
    float fp = p->frequency_penalty, pp = p->presence_penalty;
    if (fp != 0.0f || pp != 0.0f)
        for (int h = 0; h < s->cap_out; h++)
            if (s->out_ids[h] >= 0) l[s->out_ids[h]] -= fp * (float)s->out_counts[h] + pp;
}

/* ---- exact selection on the key (logit desc, id asc) ---------------------- */

/* The candidate view: ids as floats in `ids`, logits in `l`. */
struct cand {
    const float *l;
    float *ids;
    float m, inv_t; /* weight of id = exp((l[id] - m) * inv_t) */
};

static inline int cid(const struct cand *c, int i) { return (int)c->ids[i]; }

/* Weights of candidates [b, b + nb), nb <= W_BLOCK, into w. */
static void cand_weights(const struct cand *c, int b, int nb, float min_p, float *w) {
    float lv[W_BLOCK];
    for (int i = 0; i < nb; i++) lv[i] = c->l[cid(c, b + i)];
    weights(lv, nb, c->m, c->inv_t, min_p, w);
}

static double cand_sum(const struct cand *c, int lo, int hi, float min_p) {
    float w[W_BLOCK];
    double z = 0;
    for (int b = lo; b < hi; b += W_BLOCK) {
        int nb = hi - b < W_BLOCK ? hi - b : W_BLOCK;
        cand_weights(c, b, nb, min_p, w);
        z += block_sum(w, nb);
    }
    return z;
}

/* a ranks before b: larger logit, or equal logit and lower id. */
static inline int key_before(const struct cand *c, int a, int b) {
    float la = c->l[a], lb = c->l[b];
    return la > lb || (la == lb && a < b);
}

static inline void cswap(struct cand *c, int i, int j) {
    float t = c->ids[i];
    c->ids[i] = c->ids[j];
    c->ids[j] = t;
}

/* Partitions ids[lo, hi) around a median-of-three pivot: ids ranking before
 * it first, then the pivot (its index returned), then the rest. Keys are all
 * distinct (the id breaks ties), so the result does not depend on the
 * pivot choice; only the running time does. */
static int partition(struct cand *c, int lo, int hi) {
    int mid = lo + (hi - lo) / 2, a = lo, b = mid, d = hi - 1;
    if (key_before(c, cid(c, b), cid(c, a))) {
        int t = a;
        a = b;
        b = t;
    }
    if (key_before(c, cid(c, d), cid(c, b))) {
        b = d;
        if (key_before(c, cid(c, b), cid(c, a))) b = a;
    }
    cswap(c, b, hi - 1);
    int pivot = cid(c, hi - 1), store = lo;
    for (int i = lo; i < hi - 1; i++)
        if (key_before(c, cid(c, i), pivot)) cswap(c, i, store++);
    cswap(c, store, hi - 1);
    return store;
}

/* Moves the k best of ids[0, n) to the front (in any order). */
static void select_count(struct cand *c, int n, int k) {
    int lo = 0, hi = n;
    while (hi - lo > 1 && k > lo && k < hi) {
        int j = partition(c, lo, hi);
        if (j == k || j + 1 == k) return;
        if (j > k) hi = j;
        else lo = j + 1;
    }
}

/* Moves to the front the shortest run of ids[0, n), in key order, whose
 * weight reaches `need` (at least one id), and returns its length. */
static int select_mass(struct cand *c, int n, double need) {
    if (n == 0) return 0;
    if (need <= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (key_before(c, cid(c, i), cid(c, best))) best = i;
        cswap(c, 0, best);
        return 1;
    }
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int j = partition(c, lo, hi);
        double before = cand_sum(c, lo, j, 0.0f);
        if (before >= need) {
            hi = j;
        } else {
            double w = cand_sum(c, j, j + 1, 0.0f);
            if (before + w >= need) return j + 1;
            need -= before + w;
            lo = j + 1;
        }
    }
    return hi; /* one id left (it is the one), or the mass ran out by rounding: all */
}

/* Three-way quickselect: the k-th largest (1-based) of v[0, n), no NaN. */
static float kth_largest(float *v, int n, int k) {
    int lo = 0, hi = n;
    for (;;) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], d = v[hi - 1];
        float pivot = a < b ? (b < d ? b : (a < d ? d : a)) : (a < d ? a : (b < d ? d : b));
        int lt = lo, i = lo, gt = hi; /* [lo,lt) > pivot, [lt,gt) == pivot, [gt,hi) < pivot */
        while (i < gt) {
            float x = v[i];
            if (x > pivot) v[i++] = v[lt], v[lt++] = x;
            else if (x < pivot) v[i] = v[--gt], v[gt] = x;
            else i++;
        }
        if (k - 1 < lt) hi = lt;
        else if (k - 1 < gt) return pivot;
        else lo = gt;
    }
}

/* ---- top_k: threshold from block maxima ---------------------------------- */

/* The exact top k (key order) of the row into c->ids[0, k); returns k, or
 * fewer when the row has fewer non-NaN logits. With the row cut into B
 * blocks (k <= B), the k-th largest block maximum t is a lower bound of the
 * k-th largest logit (k blocks each hold a logit >= t), so only logits >= t
 * are candidates: about k of them for a 150k row. The blocks are as large as
 * k allows, to keep the quickselect over their maxima short. */
static int top_k_set(struct cand *c, int n, int k) {
    int bs = k <= n / 256 ? 256 : k <= n / 16 ? 16 : 0, cnt = 0;
    float t = -INFINITY;
    if (bs) {
        int nb = (n + bs - 1) / bs;
        float *bmax = c->ids; /* free until the candidates are written */
        for (int b = 0; b < nb; b++) {
            int len = n - b * bs < bs ? n - b * bs : bs;
            bmax[b] = span_max(c->l + b * bs, len);
        }
        t = kth_largest(bmax, nb, k);
    } else {
        bs = n;
    }
    for (int b = 0; b < n; b += bs) {
        int len = n - b < bs ? n - b : bs;
        if (!span_any_ge(c->l + b, len, t)) continue;
        for (int i = b; i < b + len; i++)
            if (c->l[i] >= t) c->ids[cnt++] = (float)i;
    }
    if (cnt <= k) return cnt;
    select_count(c, cnt, k);
    return k;
}

/* ---- top_p: histogram of probability mass -------------------------------- */

enum { HIST_BINS = 2048 };

static inline int group_len(int n, int g) { return n - g < GROUP ? n - g : GROUP; }

struct hist {
    float m, inv_width; /* bin of x = (m - x) * inv_width, clamped to the last bin */
    int32_t count[HIST_BINS];
    double mass[HIST_BINS];
};

static inline int hist_bin(const struct hist *h, float x) {
    float t = (h->m - x) * h->inv_width;
    return t < (float)(HIST_BINS - 1) ? (int)t : HIST_BINS - 1;
}

/* The top_p nucleus of the whole row into c->ids; returns its size. One
 * pass computes the weights, their total z and the histogram. The total is
 * at least 1 (the top token's weight), so the tokens below `floor` (weight
 * < (1 - top_p) / 2n) together weigh less than the (1 - top_p) z left
 * outside the nucleus and are never binned; on a peaked row that skips most
 * of the vocabulary. Whole bins before the cut bin are in; the cut bin is
 * split exactly. */
static int top_p_set(struct cand *c, int n, float top_p) {
    double w_floor = (1.0 - (double)top_p) / (2.0 * n);
    float floor = (float)((double)c->m + log(w_floor) / (double)c->inv_t);
    if (!(floor < c->m)) floor = -INFINITY;
    struct hist h;
    h.m = c->m;
    float lo = floor;
    if (!isfinite(lo)) { /* bins from the smallest finite logit */
        lo = c->m;
        for (int i = 0; i < n; i++)
            if (c->l[i] < lo && isfinite(c->l[i])) lo = c->l[i];
    }
    float range = c->m - lo;
    h.inv_width = range > 0 && isfinite(range) ? (float)HIST_BINS / range : 0.0f;
    memset(h.count, 0, sizeof h.count);
    memset(h.mass, 0, sizeof h.mass);
    float w[W_BLOCK];
    double z = 0;
    for (int b = 0; b < n; b += W_BLOCK) {
        int nb = n - b < W_BLOCK ? n - b : W_BLOCK;
        const float *l = c->l + b;
        weights(l, nb, c->m, c->inv_t, 0.0f, w);
        z += block_sum(w, nb);
        for (int g = 0; g < nb; g += GROUP) {
            int len = group_len(nb, g);
            if (!span_any_ge(l + g, len, floor)) continue;
            for (int j = g; j < g + len; j++) {
                if (!(l[j] >= floor)) continue;
                int bin = hist_bin(&h, l[j]);
                h.count[bin]++;
                h.mass[bin] += w[j];
            }
        }
    }
    double need = ((double)top_p - TOP_P_SLACK) * z;
    double cum = 0;
    int cut = 0, n_in = 0;
    while (cut < HIST_BINS - 1 && cum + h.mass[cut] < need) n_in += h.count[cut], cum += h.mass[cut++];
    /* Collect bins before the cut at the front and the cut bin after them. */
    int in = 0, edge = n_in;
    for (int g = 0; g < n; g += GROUP) {
        int len = group_len(n, g);
        float gm = span_max(c->l + g, len);
        if (!(gm >= floor) || hist_bin(&h, gm) > cut) continue; /* bins grow as logits fall */
        for (int i = g; i < g + len; i++) {
            float x = c->l[i];
            if (!(x >= floor)) continue;
            int b = hist_bin(&h, x);
            if (b < cut) c->ids[in++] = (float)i;
            else if (b == cut) c->ids[edge++] = (float)i;
        }
    }
    KILN_ASSERT(in == n_in);
    /* need - cum > 0 unless the cut is the first non-empty bin and top_p is
     * below the slack; select_mass then keeps just the top id. */
    struct cand e = *c;
    e.ids = c->ids + n_in;
    return n_in + select_mass(&e, edge - n_in, need - cum);
}

/* ---- the draw ------------------------------------------------------------ */

/* Where the weights of a draw come from: stored per token, or computed for
 * candidate ids. Both are read in blocks of W_BLOCK so that the total and
 * the walk add the same block sums. */
struct weight_src {
    const float *w;        /* stored weights, or NULL */
    const struct cand *c;  /* candidates when w is NULL */
    float min_p;
};

static const float *src_block(const struct weight_src *s, int b, int nb, float *buf) {
    if (s->w) return s->w + b;
    cand_weights(s->c, b, nb, s->min_p, buf);
    return buf;
}

/* Inverse-CDF draw over positions [0, n) in array order (a deterministic
 * function of the inputs): whole blocks are skipped by their sums, then the
 * block holding u * z is walked. Returns a position of positive weight, or
 * -1 when every weight is 0. */
static int draw_walk(const struct weight_src *s, int n, double u) {
    float buf[W_BLOCK];
    double z = 0;
    for (int b = 0; b < n; b += W_BLOCK) {
        int nb = n - b < W_BLOCK ? n - b : W_BLOCK;
        z += block_sum(src_block(s, b, nb, buf), nb);
    }
    double target = u * z, cum = 0;
    int last_block = -1;
    for (int b = 0; b < n; b += W_BLOCK) {
        int nb = n - b < W_BLOCK ? n - b : W_BLOCK;
        const float *w = src_block(s, b, nb, buf);
        float bs = block_sum(w, nb);
        if (!(bs > 0)) continue;
        last_block = b;
        if (!(target < cum + bs) && b + nb < n) {
            cum += bs;
            continue;
        }
        int last = -1;
        for (int i = 0; i < nb; i++) {
            if (!(w[i] > 0)) continue;
            cum += w[i];
            last = b + i;
            if (target < cum) break;
        }
        return last; /* bs > 0, so some weight here is positive */
    }
    if (last_block < 0) return -1;
    /* Rounding left target beyond the last block's end: its last positive. */
    int nb = n - last_block < W_BLOCK ? n - last_block : W_BLOCK;
    const float *w = src_block(s, last_block, nb, buf);
    int last = last_block;
    for (int i = 0; i < nb; i++)
        if (w[i] > 0) last = last_block + i;
    return last;
}

/* What a draw picks from: every token, with its weight in scratch[0,
 * vocab) (no top_k / top_p), or the candidates d->c.ids[0, d->n) whose
 * weights cand_weights computes with d->min_p. Returns 0 for a greedy
 * configuration (nothing to draw). */
struct draw_set {
    int all, n;
    struct cand c;
    float min_p;
};

static int draw_set_build(const struct sampling_params *p, const float *logits, int vocab, int im,
                          float *scratch, struct draw_set *d) {
    float t = p->temperature;
    if (!(t > 0) || p->top_k == 1 || !(p->top_p > 0) || im < 0 || !isfinite(logits[im])) return 0;
    d->c = (struct cand){.l = logits, .ids = scratch, .m = logits[im], .inv_t = 1.0f / t};
    d->min_p = p->min_p > 0 ? p->min_p : 0.0f;
    int use_k = p->top_k > 0 && p->top_k < vocab, use_p = p->top_p < 1.0f;
    d->all = !use_k && !use_p;
    if (d->all) {
        weights_total(logits, vocab, d->c.m, d->c.inv_t, d->min_p, scratch);
        d->n = vocab;
    } else if (use_k) {
        d->n = top_k_set(&d->c, vocab, p->top_k);
        if (use_p) {
            double z = cand_sum(&d->c, 0, d->n, 0.0f);
            d->n = select_mass(&d->c, d->n, ((double)p->top_p - TOP_P_SLACK) * z);
        }
    } else {
        d->n = top_p_set(&d->c, vocab, p->top_p);
    }
    return 1;
}

void sampler_sample(const struct sampling_params *p, struct sampler_state *s, float *logits,
                    int vocab, uint64_t step, float *scratch, struct sample_result *out) {
    KILN_ASSERT(vocab > 0 && vocab <= (1 << 24)); /* ids are stored as floats */
    memset(out, 0, sizeof *out);
    int want_lp = p->logprobs || p->top_logprobs > 0;
    int n_top = p->top_logprobs < 0 ? 0 : p->top_logprobs;
    if (n_top > SAMPLING_MAX_TOP_LOGPROBS) n_top = SAMPLING_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    double lse = 0;
    const float *raw = logits;
    if (want_lp) {
        lse = raw_logprobs(logits, vocab, n_top, out);
        if (row_will_change(p, s)) {
            memcpy(scratch + vocab, logits, (size_t)vocab * sizeof *logits);
            raw = scratch + vocab;
        }
    }
    sampler_process_logits(p, s, logits, vocab);

    int im = argmax_first(logits, vocab);
    int token = im < 0 ? 0 : im;
    struct draw_set d;
    if (draw_set_build(p, logits, vocab, im, scratch, &d)) {
        double u = uniform01(p->seed, step);
        int drawn;
        if (d.all) {
            struct weight_src src = {.w = scratch};
            drawn = draw_walk(&src, vocab, u);
        } else {
            struct weight_src src = {.c = &d.c, .min_p = d.min_p};
            drawn = draw_walk(&src, d.n, u);
            drawn = drawn < 0 ? -1 : cid(&d.c, drawn);
        }
        token = drawn < 0 ? im : drawn;
    }
    out->token = token;
    if (want_lp) out->logprob = (float)((double)raw[token] - lse);
}

int sampler_kept_set(const struct sampling_params *p, const float *logits, int vocab,
                     float *scratch, float *weights) {
    KILN_ASSERT(vocab > 0 && vocab <= (1 << 24));
    memset(weights, 0, (size_t)vocab * sizeof *weights);
    int im = argmax_first(logits, vocab);
    struct draw_set d;
    if (!draw_set_build(p, logits, vocab, im, scratch, &d)) {
        weights[im < 0 ? 0 : im] = 1.0f;
        return 1;
    }
    int kept = 0;
    if (d.all) {
        for (int i = 0; i < vocab; i++)
            if (scratch[i] > 0) weights[i] = scratch[i], kept++;
        return kept;
    }
    float w[W_BLOCK];
    for (int b = 0; b < d.n; b += W_BLOCK) {
        int nb = d.n - b < W_BLOCK ? d.n - b : W_BLOCK;
        cand_weights(&d.c, b, nb, d.min_p, w);
        for (int i = 0; i < nb; i++)
            if (w[i] > 0) weights[cid(&d.c, b + i)] = w[i], kept++;
    }
    return kept;
}

/* ---- the engine's device sampling: parameters and adjustments ------------- */

void sampler_row_params(const struct sampling_params *p, uint64_t step,
                        struct backend_sample_row *row) {
    memset(row, 0, sizeof *row);
    row->temperature = p->temperature;
    row->top_k = p->top_k;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->seed = p->seed;
    row->step = step;
}

/* Entry of token id in out[0, n), created on first use through slot[]. */
static struct backend_sample_adj *adj_entry(struct backend_sample_adj *out, int *n, int cap,
                                            int32_t *slot, int32_t id) {
    if (slot[id] >= 0) return &out[slot[id]];
    if (*n == cap) return NULL;
    slot[id] = *n;
    struct backend_sample_adj *a = &out[(*n)++];
    memset(a, 0, sizeof *a);
    a->id = id;
    return a;
}

int sampler_build_adjustments(const struct sampling_params *p, const struct sampler_state *s,
                              const int32_t *mask_ids, int n_mask, int vocab,
                              struct backend_sample_adj *out, int cap, int32_t *slot) {
    int n = 0, ok = 1;
    struct backend_sample_adj *a;
    for (int i = 0; i < n_mask && ok; i++) {
        if (mask_ids[i] < 0 || mask_ids[i] >= vocab) continue;
        if ((ok = (a = adj_entry(out, &n, cap, slot, mask_ids[i])) != NULL)) a->flags |= BACKEND_ADJ_MASK;
    }
    for (int i = 0; i < p->n_logit_bias && ok; i++) {
        int32_t id = p->logit_bias[i].id;
        KILN_ASSERT_MSG(id >= 0 && id < vocab, "logit_bias id outside vocab (validate first)");
        /* a repeated id is added twice on the CPU, in float: not one entry */
        if ((ok = (a = adj_entry(out, &n, cap, slot, id)) != NULL && !(a->flags & BACKEND_ADJ_BIAS))) {
            a->flags |= BACKEND_ADJ_BIAS;
            a->bias = p->logit_bias[i].bias;
        }
    }
    if (s && ok) {
        KILN_ASSERT(s->vocab == vocab);
        float rp = p->repetition_penalty;
        if (rp != 1.0f)
            for (int i = 0; i < s->n_seen && ok; i++)
                if ((ok = (a = adj_entry(out, &n, cap, slot, s->seen[i])) != NULL)) {
                    a->flags |= BACKEND_ADJ_REP;
                    a->rep = rp;
                }
        float fp = p->frequency_penalty, pp = p->presence_penalty;
        if (fp != 0.0f || pp != 0.0f)
            for (int h = 0; h < s->cap_out && ok; h++)
                if (s->out_ids[h] >= 0 && (ok = (a = adj_entry(out, &n, cap, slot, s->out_ids[h])) != NULL)) {
                    a->flags |= BACKEND_ADJ_SUB;
                    /* the expression sampler_process_logits subtracts */
                    a->sub = fp * (float)s->out_counts[h] + pp;
                }
    }
    for (int i = 0; i < n; i++) slot[out[i].id] = -1;
    return ok ? n : -1;
}

/* ---- warm-up ------------------------------------------------------------- */

double sampler_warmup(int vocab, const int *batch_sizes, int n_batch_sizes) {
    double t0 = time_now();
    if (vocab <= 0) return 0;
    /* The CPU sampler works row by row and keeps nothing between calls, so
     * rows beyond the first few exercise no new path; the cap bounds the
     * start-up time for large buckets. */
    enum { MAX_ROWS = 4, N_CONFIGS = 6 };
    float *pristine = xmalloc((size_t)vocab * sizeof *pristine);
    float *row = xmalloc((size_t)vocab * sizeof *row);
    float *scratch = xmalloc(2 * (size_t)vocab * sizeof *scratch);
    for (int i = 0; i < vocab; i++) /* like a model's row: a broad bulk and a few peaks */
        pristine[i] = (float)(uniform01(0x5eed, (uint64_t)i) * 8.0 - 4.0) + (i % 4099 == 0 ? 15.0f : 0);
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((i * 7919) % vocab);
    struct sampler_state *st = sampler_state_create(vocab, prompt, 8);
    sampler_state_accept(st, prompt[0]);

    struct sampling_params cfg[N_CONFIGS];
    for (int i = 0; i < N_CONFIGS; i++) sampling_params_default(&cfg[i]);
    cfg[0].temperature = 0;
    cfg[1].temperature = 0.7f, cfg[1].top_p = 0.9f;
    cfg[2].temperature = 1.0f, cfg[2].top_k = 50;
    cfg[3].temperature = 0.8f, cfg[3].top_p = 0.95f, cfg[3].top_k = 40;
    cfg[4].temperature = 1.2f, cfg[4].min_p = 0.05f;
    cfg[5].temperature = 0.6f, cfg[5].top_p = 0.8f, cfg[5].top_k = 20;
    cfg[5].repetition_penalty = 1.1f;
    cfg[5].logprobs = 1, cfg[5].top_logprobs = 5;

    /* Batch sizes 0 and 1, then the caller's buckets; each configuration is
     * run at a batch size and again right after switching to the next one. */
    int n_sizes = n_batch_sizes + 2;
    struct sample_result res;
    for (int c = 0; c < N_CONFIGS; c++)
        for (int b = 0; b < n_sizes; b++)
            for (int change = 0; change < 2; change++) {
                int bi = b + change < n_sizes ? b + change : b;
                int bs = bi < 2 ? bi : batch_sizes[bi - 2];
                if (bs > MAX_ROWS) bs = MAX_ROWS;
                for (int r = 0; r < bs; r++) {
                    memcpy(row, pristine, (size_t)vocab * sizeof *row);
                    cfg[c].seed = (uint64_t)r;
                    sampler_sample(&cfg[c], st, row, vocab, (uint64_t)b, scratch, &res);
                }
            }
    sampler_state_free(st);
    free(pristine);
    free(row);
    free(scratch);
    return time_now() - t0;
}
