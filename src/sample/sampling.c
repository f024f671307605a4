/* sampling.c — the CPU sampler: penalties, temperature, top-k / top-p /
 * min-p truncation and the draw, over one row of logits.
 *
 * Speed on a 150k vocabulary comes from never sorting the vocabulary. The
 * candidates of top_k / top_p are found with a histogram of the logits
 * (bins of equal width between the smallest and the largest logit): whole
 * bins above the cut are in, and only the one bin the cut falls into is
 * ordered exactly, by quickselect on the key (logit desc, id asc). For
 * top_p the histogram also carries each bin's probability mass, and the
 * boundary bin is split by a weighted quickselect. Both are O(vocab).
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
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

#define HIST_BINS 2048
/* See the header: cumulative top_p mass within this fraction counts as reached. */
#define TOP_P_SLACK 1e-6

void sampling_params_default(struct sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
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

/* ---- numeric helpers ----------------------------------------------------- */

/* exp(x) for the x <= 0 the sampler needs, written branch-free so that the
 * compiler vectorises the loops that call it (libm's expf is a call per
 * element). Relative error about 2e-7; exactly 1 at 0 and exactly 0 below
 * -87.3, so the top token has weight 1 and -inf weight 0. */
static inline float exp_neg(float x) {
    const float log2e = 1.44269504f, ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x > -87.3f ? x : -87.3f;    /* also maps NaN and -inf into range */
    float n = (xc * log2e + round_magic) - round_magic;
    float f = (xc - n * ln2_hi) - n * ln2_lo; /* |f| <= ln2 / 2 */
    float p = 1.0f / 720;
    p = p * f + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x > -87.3f ? p * scale : 0.0f;
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

/* First index of the largest logit; NaN is skipped. -1 when every logit is NaN. */
static int argmax_first(const float *l, int n) {
    int best = -1;
    float m = 0;
    for (int i = 0; i < n; i++)
        if (best < 0 ? l[i] == l[i] : l[i] > m) m = l[i], best = i;
    return best;
}

/* ---- logprobs ------------------------------------------------------------ */

/* log-sum-exp of the raw row and its n most likely tokens, in one pass.
 * The top list is kept sorted (logit desc, id asc); scanning ids upwards and
 * inserting only on a strictly larger logit keeps ties in id order. */
static double raw_logprobs(const float *l, int vocab, int n_top, struct sample_result *out) {
    int im = argmax_first(l, vocab);
    if (im < 0 || isinf(l[im])) return (double)(im < 0 ? NAN : l[im]);
    float m = l[im];
    double z = 0;
    int k = 0;
    for (int i = 0; i < vocab; i++) {
        float x = l[i];
        z += exp_neg(x - m);
        if (n_top == 0 || !(x == x)) continue;
        if (k == n_top && !(x > out->top_logprobs[k - 1])) continue;
        int j = k < n_top ? k++ : k - 1;
        for (; j > 0 && x > out->top_logprobs[j - 1]; j--) {
            out->top_logprobs[j] = out->top_logprobs[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
        }
        out->top_logprobs[j] = x;
        out->top_ids[j] = i;
    }
    double lse = (double)m + log(z);
    out->n_top = k;
    for (int j = 0; j < k; j++) out->top_logprobs[j] = (float)((double)out->top_logprobs[j] - lse);
    return lse;
}

/* ---- bias and penalties -------------------------------------------------- */

static int row_will_change(const struct sampling_params *p, const struct sampler_state *s) {
    if (p->n_logit_bias > 0) return 1;
    if (!s) return 0;
    if (p->repetition_penalty != 1.0f && s->n_seen > 0) return 1;
    return (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && s->n_out > 0;
}

static void apply_bias_penalties(const struct sampling_params *p, const struct sampler_state *s,
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

static inline float cweight(const struct cand *c, int i) {
    return exp_neg((c->l[cid(c, i)] - c->m) * c->inv_t);
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
    if (key_before(c, cid(c, b), cid(c, a))) { int t = a; a = b; b = t; }
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
        double before = 0;
        for (int i = lo; i < j; i++) before += cweight(c, i);
        if (before >= need) {
            hi = j;
        } else {
            double w = cweight(c, j);
            if (before + w >= need) return j + 1;
            need -= before + w;
            lo = j + 1;
        }
    }
    return hi; /* one id left (it is the one), or the mass ran out by rounding: all */
}

/* ---- candidate sets through a histogram ---------------------------------- */

struct hist {
    float m, inv_width; /* bin of x = (m - x) * inv_width, clamped to the last bin */
    int32_t count[HIST_BINS];
    double mass[HIST_BINS];
};

static inline int hist_bin(const struct hist *h, float x) {
    float t = (h->m - x) * h->inv_width;
    return t < (float)(HIST_BINS - 1) ? (int)t : HIST_BINS - 1; /* also NaN, inf */
}

static void hist_init(struct hist *h, const float *l, int n, float m) {
    float lo = m;
    for (int i = 0; i < n; i++)
        if (l[i] < lo && isfinite(l[i])) lo = l[i];
    h->m = m;
    float range = m - lo; /* may be inf for absurd biases: then one bin, exact select */
    h->inv_width = range > 0 && isfinite(range) ? (float)HIST_BINS / range : 0.0f;
    memset(h->count, 0, sizeof h->count);
    memset(h->mass, 0, sizeof h->mass);
}

/* Writes ids of bins before `cut` to ids[0, *n_in) and of bin `cut` after
 * them; NaN logits are left out. Returns the total written. */
static int hist_collect(const struct hist *h, const float *l, int n, int cut, float *ids,
                        int *n_in) {
    int a = 0;
    for (int b = 0; b < cut; b++) a += h->count[b];
    int in = 0, edge = a;
    for (int i = 0; i < n; i++) {
        if (!(l[i] == l[i])) continue;
        int b = hist_bin(h, l[i]);
        if (b < cut) ids[in++] = (float)i;
        else if (b == cut) ids[edge++] = (float)i;
    }
    KILN_ASSERT(in == a);
    *n_in = in;
    return edge;
}

/* The exact top k (key order) of the row into c->ids[0, k); returns k, or
 * fewer when the row has fewer non-NaN logits. */
static int top_k_set(struct cand *c, int n, int k) {
    struct hist h;
    hist_init(&h, c->l, n, c->m);
    for (int i = 0; i < n; i++)
        if (c->l[i] == c->l[i]) h.count[hist_bin(&h, c->l[i])]++;
    int cut = 0, cum = 0;
    while (cut < HIST_BINS - 1 && cum + h.count[cut] < k) cum += h.count[cut++];
    int n_in, total = hist_collect(&h, c->l, n, cut, c->ids, &n_in);
    if (total <= k) return total;
    struct cand edge = *c;
    edge.ids = c->ids + n_in;
    select_count(&edge, total - n_in, k - n_in);
    return k;
}

/* The top_p nucleus of the whole row into c->ids; returns its size. */
static int top_p_set(struct cand *c, int n, float top_p) {
    struct hist h;
    hist_init(&h, c->l, n, c->m);
    for (int i = 0; i < n; i++) {
        float x = c->l[i];
        if (!(x == x)) continue;
        int b = hist_bin(&h, x);
        h.count[b]++;
        h.mass[b] += exp_neg((x - c->m) * c->inv_t);
    }
    double z = 0;
    for (int b = 0; b < HIST_BINS; b++) z += h.mass[b];
    double need = ((double)top_p - TOP_P_SLACK) * z, cum = 0;
    int cut = 0;
    while (cut < HIST_BINS - 1 && cum + h.mass[cut] < need) cum += h.mass[cut++];
    int n_in, total = hist_collect(&h, c->l, n, cut, c->ids, &n_in);
    /* need - cum > 0 unless the cut is the first non-empty bin and top_p is
     * below the slack; select_mass then keeps just the top id. */
    struct cand edge = *c;
    edge.ids = c->ids + n_in;
    return n_in + select_mass(&edge, total - n_in, need - cum);
}

/* ---- the draw ------------------------------------------------------------ */

/* Draws from ids[0, n) with weights above min_p (relative to the top token,
 * whose weight is 1). The walk runs in the order of the array, which is a
 * deterministic function of the inputs. */
static int draw_candidates(const struct cand *c, int n, float min_p, double u) {
    double z = 0;
    for (int i = 0; i < n; i++) {
        float w = cweight(c, i);
        z += w >= min_p ? w : 0.0f;
    }
    double target = u * z, cum = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        float w = cweight(c, i);
        if (!(w >= min_p) || w <= 0) continue;
        cum += w;
        last = i;
        if (target < cum) break;
    }
    return last < 0 ? -1 : cid(c, last);
}

/* No truncation but min_p: weights of the whole row go to scratch once. */
static int draw_all(const float *l, int n, float m, float inv_t, float min_p, float *w,
                    double u) {
    double z = 0;
    for (int i = 0; i < n; i++) {
        float x = exp_neg((l[i] - m) * inv_t);
        x = x >= min_p ? x : 0.0f;
        w[i] = x;
        z += x;
    }
    double target = u * z, cum = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        cum += w[i];
        last = i;
        if (target < cum) break;
    }
    return last;
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
    apply_bias_penalties(p, s, logits, vocab);

    int im = argmax_first(logits, vocab);
    int token = im < 0 ? 0 : im;
    float t = p->temperature;
    int greedy = !(t > 0) || p->top_k == 1 || !(p->top_p > 0) || im < 0 || !isfinite(logits[im]);
    if (!greedy) {
        struct cand c = {.l = logits, .ids = scratch, .m = logits[im], .inv_t = 1.0f / t};
        double u = uniform01(p->seed, step);
        float min_p = p->min_p > 0 ? p->min_p : 0.0f;
        int use_k = p->top_k > 0 && p->top_k < vocab, use_p = p->top_p < 1.0f;
        int drawn;
        if (!use_k && !use_p) {
            drawn = draw_all(logits, vocab, c.m, c.inv_t, min_p, scratch, u);
        } else {
            int n;
            if (use_k) {
                n = top_k_set(&c, vocab, p->top_k);
                if (use_p) {
                    double z = 0;
                    for (int i = 0; i < n; i++) z += cweight(&c, i);
                    n = select_mass(&c, n, ((double)p->top_p - TOP_P_SLACK) * z);
                }
            } else {
                n = top_p_set(&c, vocab, p->top_p);
            }
            drawn = draw_candidates(&c, n, min_p, u);
        }
        token = drawn < 0 ? im : drawn;
    }
    out->token = token;
    if (want_lp) out->logprob = (float)((double)raw[token] - lse);
}

/* ---- warm-up ------------------------------------------------------------- */

double sampler_warmup(int vocab, const int *batch_sizes, int n_batch_sizes) {
    double t0 = time_now();
    if (vocab <= 0) return 0;
    /* The CPU sampler works row by row and keeps nothing between calls, so
     * rows beyond the first few exercise no new path; the cap bounds the
     * start-up time for large buckets. */
    enum { MAX_ROWS = 16, N_CONFIGS = 6 };
    float *pristine = xmalloc((size_t)vocab * sizeof *pristine);
    float *row = xmalloc((size_t)vocab * sizeof *row);
    float *scratch = xmalloc(2 * (size_t)vocab * sizeof *scratch);
    for (int i = 0; i < vocab; i++) /* a spread like a model's: a peak and a long tail */
        pristine[i] = (float)(uniform01(0x5eed, (uint64_t)i) * 8.0 - 4.0) + (i % 97 == 0 ? 6.0f : 0);
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
