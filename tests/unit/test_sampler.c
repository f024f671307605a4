/* test_sampler.c — the CPU sampler against references computed here in
 * double precision: greedy and ties, the temperature limit, seeded
 * determinism, the drawn distribution (chi-square), top_k / top_p / min_p
 * sets and boundaries, each penalty and logit_bias by hand, raw logprobs and
 * top_logprobs, vocabularies of 1, 2 and 151936, non-finite logits, warm-up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/mem.h"
#include "sample/sampling.h"

#define BIG_VOCAB 151936

/* One draw from a fresh copy of `logits` (the sampler writes to its row). */
static struct sample_result draw(const struct sampling_params *p, struct sampler_state *s,
                                 const float *logits, int vocab, uint64_t step) {
    float *row = xmalloc((size_t)vocab * sizeof *row);
    float *scratch = xmalloc(2 * (size_t)vocab * sizeof *scratch);
    memcpy(row, logits, (size_t)vocab * sizeof *row);
    struct sample_result r;
    sampler_sample(p, s, row, vocab, step, scratch, &r);
    free(row);
    free(scratch);
    return r;
}

/* counts[token] over steps 0..n-1 (buffers reused: this is the hot test loop). */
static void histogram(const struct sampling_params *p, const float *logits, int vocab, int n,
                      int *counts) {
    float *row = xmalloc((size_t)vocab * sizeof *row);
    float *scratch = xmalloc(2 * (size_t)vocab * sizeof *scratch);
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int i = 0; i < n; i++) {
        memcpy(row, logits, (size_t)vocab * sizeof *row);
        struct sample_result r;
        sampler_sample(p, NULL, row, vocab, (uint64_t)i, scratch, &r);
        assert_true(r.token >= 0 && r.token < vocab);
        counts[r.token]++;
    }
    free(row);
    free(scratch);
}

/* softmax(logits / t) in double, restricted to keep[] (NULL = all). */
static void softmax_ref(const float *logits, int n, double t, const int *keep, double *prob) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if ((!keep || keep[i]) && logits[i] > m) m = logits[i];
    for (int i = 0; i < n; i++) {
        prob[i] = (!keep || keep[i]) ? exp(((double)logits[i] - m) / t) : 0;
        z += prob[i];
    }
    for (int i = 0; i < n; i++) prob[i] /= z;
}

/* Pearson chi-square of counts against prob; cells with expectation < 5 are
 * pooled. Returns the statistic and the degrees of freedom. A token with
 * prob 0 that was drawn fails at once. */
static double chi_square(const int *counts, const double *prob, int n, int draws, int *dof) {
    double stat = 0, pool_e = 0, pool_o = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        if (prob[i] == 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = prob[i] * draws;
        if (e < 5) {
            pool_e += e, pool_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        cells++;
    }
    if (pool_e > 0) stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, cells++;
    *dof = cells - 1;
    return stat;
}

/* 99.9% quantile of chi-square with d degrees of freedom (Wilson-Hilferty). */
static double chi_square_limit(int d) {
    double z = 3.09, a = 2.0 / (9.0 * d);
    double c = 1 - a + z * sqrt(a);
    return d * c * c * c;
}

static void expect_distribution(const struct sampling_params *p, const float *logits, int n,
                                const int *keep) {
    enum { DRAWS = 20000 };
    int counts[64];
    double prob[64];
    assert_true(n <= 64);
    histogram(p, logits, n, DRAWS, counts);
    softmax_ref(logits, n, p->temperature, keep, prob);
    int dof;
    double stat = chi_square(counts, prob, n, DRAWS, &dof);
    if (dof > 0 && stat > chi_square_limit(dof))
        fail_msg("chi-square %.2f over %d dof exceeds %.2f", stat, dof, chi_square_limit(dof));
}

static const float LOGITS8[8] = {1.0f, 2.5f, -0.5f, 2.0f, 0.0f, 1.5f, -2.0f, 0.7f};

static void fill_random(float *l, int n, uint64_t seed, double scale) {
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        l[i] = (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * scale);
    }
}

/* ---- greedy -------------------------------------------------------------- */

static void test_greedy_argmax_and_ties(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    assert_int_equal(draw(&p, NULL, LOGITS8, 8, 0).token, 1);
    float ties[6] = {0.5f, 3.0f, -1.0f, 3.0f, 3.0f, 2.0f};
    for (uint64_t step = 0; step < 5; step++) assert_int_equal(draw(&p, NULL, ties, 6, step).token, 1);
    /* top_k == 1 is greedy whatever the temperature */
    sampling_params_default(&p);
    p.top_k = 1;
    p.temperature = 5.0f;
    for (uint64_t step = 0; step < 20; step++) assert_int_equal(draw(&p, NULL, ties, 6, step).token, 1);
    /* the tie at the maximum also resolves to the lowest id on a big row */
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    fill_random(big, BIG_VOCAB, 7, 10.0);
    big[100000] = 50.0f, big[140000] = 50.0f, big[99999] = 49.0f;
    p.temperature = 0;
    assert_int_equal(draw(&p, NULL, big, BIG_VOCAB, 0).token, 100000);
    free(big);
}

static void test_temperature_limit(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 1e-3f; /* the next logit is 500 temperatures below: never drawn */
    for (uint64_t step = 0; step < 500; step++) assert_int_equal(draw(&p, NULL, LOGITS8, 8, step).token, 1);
    p.temperature = 1e-38f; /* 1 / t overflows: must still be the argmax */
    for (uint64_t step = 0; step < 50; step++) assert_int_equal(draw(&p, NULL, LOGITS8, 8, step).token, 1);
    p.temperature = 0.05f; /* 0.5 / 0.05 = 10: the second token gets ~4.5e-5 */
    int counts[8];
    histogram(&p, LOGITS8, 8, 2000, counts);
    assert_true(counts[1] >= 1990);
}

/* ---- randomness ---------------------------------------------------------- */

static void test_seeded_determinism(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.has_seed = 1;
    p.seed = 1234;
    int seen[8] = {0};
    for (uint64_t step = 0; step < 200; step++) {
        int a = draw(&p, NULL, LOGITS8, 8, step).token;
        int b = draw(&p, NULL, LOGITS8, 8, step).token;
        assert_int_equal(a, b);
        seen[a]++;
    }
    int distinct = 0;
    for (int i = 0; i < 8; i++) distinct += seen[i] > 0;
    assert_true(distinct >= 6); /* steps give different draws */
    /* different seeds give different sequences */
    struct sampling_params q = p;
    q.seed = 1235;
    int same = 0;
    for (uint64_t step = 0; step < 200; step++)
        same += draw(&p, NULL, LOGITS8, 8, step).token == draw(&q, NULL, LOGITS8, 8, step).token;
    assert_true(same < 150);
    /* the same seed and step give the same token on a big row, every path */
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    fill_random(big, BIG_VOCAB, 11, 12.0);
    const float tps[4][3] = {{1.0f, 1.0f, 0}, {0.7f, 0.9f, 0}, {1.0f, 1.0f, 50}, {0.8f, 0.95f, 40}};
    for (int c = 0; c < 4; c++) {
        p.temperature = tps[c][0], p.top_p = tps[c][1], p.top_k = (int)tps[c][2];
        for (uint64_t step = 0; step < 5; step++)
            assert_int_equal(draw(&p, NULL, big, BIG_VOCAB, step).token,
                             draw(&p, NULL, big, BIG_VOCAB, step).token);
    }
    free(big);
}

static void test_distribution_matches_softmax(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.seed = 99;
    const float temps[3] = {1.0f, 0.8f, 1.7f};
    for (int i = 0; i < 3; i++) {
        p.temperature = temps[i];
        expect_distribution(&p, LOGITS8, 8, NULL);
    }
    /* a vocabulary of 2 */
    float two[2] = {0.3f, -0.4f};
    p.temperature = 1.0f;
    expect_distribution(&p, two, 2, NULL);
}

/* ---- truncation ---------------------------------------------------------- */

static void test_top_k(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.seed = 5;
    p.top_k = 3; /* keeps 1 (2.5), 3 (2.0), 5 (1.5), renormalised */
    int keep[8] = {0, 1, 0, 1, 0, 1, 0, 0};
    expect_distribution(&p, LOGITS8, 8, keep);
    /* ties at the k-th logit keep the lower ids, exactly k */
    float flat[6] = {1, 1, 1, 1, 1, 1};
    int counts[6];
    p.top_k = 3;
    histogram(&p, flat, 6, 3000, counts);
    for (int i = 0; i < 6; i++) assert_true(i < 3 ? counts[i] > 800 : counts[i] == 0);
    /* k >= vocab is off */
    p.top_k = 8;
    expect_distribution(&p, LOGITS8, 8, NULL);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_top_k_big_vocab(void **state) {
    (void)state;
    float *big = xmalloc(BIG_VOCAB * sizeof *big), *sorted = xmalloc(BIG_VOCAB * sizeof *sorted);
    fill_random(big, BIG_VOCAB, 3, 20.0);
    memcpy(sorted, big, BIG_VOCAB * sizeof *big);
    qsort(sorted, BIG_VOCAB, sizeof *sorted, cmp_desc);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 1000.0f; /* nearly uniform over what is kept: the set shows */
    /* one k per selection path: block maxima of 256, of 16, and a full select */
    const int ks[4] = {2, 50, 3000, 20000};
    for (int c = 0; c < 4; c++) {
        p.top_k = ks[c];
        float kth = sorted[ks[c] - 1];
        for (uint64_t step = 0; step < 200; step++) {
            int t = draw(&p, NULL, big, BIG_VOCAB, step).token;
            assert_true(big[t] >= kth);
        }
    }
    free(big);
    free(sorted);
}

/* logits with probabilities 1/2, 1/4, 1/8, 1/8 */
static const float HALVES[4] = {1.3862944f, 0.6931472f, 0.0f, 0.0f};

static void test_top_p(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.seed = 17;
    int counts[8];
    /* p = 1 keeps everything */
    p.top_p = 1.0f;
    expect_distribution(&p, LOGITS8, 8, NULL);
    /* a tiny p keeps the argmax only */
    p.top_p = 1e-9f;
    histogram(&p, LOGITS8, 8, 500, counts);
    assert_int_equal(counts[1], 500);
    /* exact boundaries: 0.5 reaches 0.5, 0.5 + 0.25 reaches 0.75 */
    p.top_p = 0.5f;
    histogram(&p, HALVES, 4, 500, counts);
    assert_int_equal(counts[0], 500);
    p.top_p = 0.75f;
    int keep2[4] = {1, 1, 0, 0};
    expect_distribution(&p, HALVES, 4, keep2);
    /* just above: the third token joins, and of the tied 2 and 3 the lower id */
    p.top_p = 0.76f;
    int keep3[4] = {1, 1, 1, 0};
    expect_distribution(&p, HALVES, 4, keep3);
    p.top_p = 0.9f;
    int keep4[4] = {1, 1, 1, 1};
    expect_distribution(&p, HALVES, 4, keep4);
    /* with temperature the nucleus is of the scaled distribution:
     * t = 0.5 squares the odds, 16:4:1:1 / 22, so 0.75 needs only token 0 */
    p.temperature = 0.5f;
    p.top_p = 0.72f;
    histogram(&p, HALVES, 4, 500, counts);
    assert_int_equal(counts[0], 500);
    /* top_k then top_p: k = 3 leaves 1/2, 1/4, 1/8, renormalised 4/7, 2/7,
     * 1/7; 6/7 = 0.857 reaches 0.85 (without top_k 0.75 would not) but not
     * 0.86 */
    p.temperature = 1.0f;
    p.top_k = 3;
    p.top_p = 0.85f;
    expect_distribution(&p, HALVES, 4, keep2);
    p.top_p = 0.86f;
    expect_distribution(&p, HALVES, 4, keep3);
    p.top_k = 2;
    p.top_p = 0.6f; /* 2/3, 1/3: token 0 alone reaches 0.6 */
    histogram(&p, HALVES, 4, 500, counts);
    assert_int_equal(counts[0], 500);
}

struct ranked {
    float l;
    int id;
};

static int cmp_ranked(const void *a, const void *b) {
    const struct ranked *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id - y->id;
}

static void test_top_p_big_vocab(void **state) {
    (void)state;
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    struct ranked *r = xmalloc(BIG_VOCAB * sizeof *r);
    int *in = xcalloc(BIG_VOCAB, sizeof *in);
    for (int shape = 0; shape < 2; shape++) {
        fill_random(big, BIG_VOCAB, 21 + shape, 8.0);
        if (shape == 1) /* peaked, like a trained model */
            for (int j = 0; j < 6; j++) big[j * 20011] = 14.0f + (float)j;
        const float ps[3] = {0.5f, 0.9f, 0.99f};
        for (int c = 0; c < 3; c++) {
            double t = 0.8;
            for (int i = 0; i < BIG_VOCAB; i++) r[i].l = big[i], r[i].id = i;
            qsort(r, BIG_VOCAB, sizeof *r, cmp_ranked);
            double z = 0, cum = 0;
            for (int i = 0; i < BIG_VOCAB; i++) z += exp(((double)r[i].l - r[0].l) / t);
            memset(in, 0, BIG_VOCAB * sizeof *in);
            /* the reference nucleus, one token wider for float rounding */
            int i = 0;
            for (; i < BIG_VOCAB && cum < ps[c] * z; i++) {
                cum += exp(((double)r[i].l - r[0].l) / t);
                in[r[i].id] = 1;
            }
            if (i < BIG_VOCAB) in[r[i].id] = 1;
            struct sampling_params p;
            sampling_params_default(&p);
            p.temperature = (float)t;
            p.top_p = ps[c];
            for (uint64_t step = 0; step < 100; step++)
                assert_true(in[draw(&p, NULL, big, BIG_VOCAB, step).token]);
        }
    }
    free(big);
    free(r);
    free(in);
}

static void test_min_p(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    p.seed = 3;
    p.min_p = 0.3f; /* keeps prob >= 0.15: 0.5 and 0.25 */
    int keep2[4] = {1, 1, 0, 0};
    expect_distribution(&p, HALVES, 4, keep2);
    p.min_p = 0.2f;
    expect_distribution(&p, HALVES, 4, NULL);
    p.min_p = 0.6f;
    int counts[4];
    histogram(&p, HALVES, 4, 300, counts);
    assert_int_equal(counts[0], 300);
    /* min_p is of the tempered distribution: t = 0.5 gives 16:4:1:1, and
     * 0.2 of the top keeps only the second besides it */
    p.temperature = 0.5f;
    p.min_p = 0.2f;
    expect_distribution(&p, HALVES, 4, keep2);
    /* min_p alone on a big row never draws below the threshold */
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    fill_random(big, BIG_VOCAB, 8, 16.0);
    float m = -INFINITY;
    for (int i = 0; i < BIG_VOCAB; i++) m = big[i] > m ? big[i] : m;
    p.temperature = 1.0f;
    p.min_p = 0.05f;
    for (uint64_t step = 0; step < 100; step++) {
        int t = draw(&p, NULL, big, BIG_VOCAB, step).token;
        assert_true(exp((double)big[t] - m) >= 0.05 * (1 - 1e-6));
    }
    free(big);
}

/* ---- penalties and bias -------------------------------------------------- */

static void assert_close(float got, double want) {
    if (fabs((double)got - want) > 1e-5 * (1 + fabs(want))) fail_msg("got %.7g, want %.7g", (double)got, want);
}

static void test_penalties_by_hand(void **state) {
    (void)state;
    const float base[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
    int32_t prompt[3] = {0, 1, 0};
    struct sampler_state *s = sampler_state_create(6, prompt, 3);
    sampler_state_accept(s, 2);
    sampler_state_accept(s, 2);
    sampler_state_accept(s, 3);
    struct sampling_params p;
    float l[6];

    /* repetition: prompt and output tokens 0..3; positive / p, negative * p */
    sampling_params_default(&p);
    p.repetition_penalty = 1.5f;
    memcpy(l, base, sizeof l);
    sampler_process_logits(&p, s, l, 6);
    const double rep[6] = {2.0 / 1.5, -1.5, 0.5 / 1.5, 2.0, -2.0, 1.0};
    for (int i = 0; i < 6; i++) assert_close(l[i], rep[i]);

    /* frequency: output counts only (2 twice, 3 once), not the prompt */
    sampling_params_default(&p);
    p.frequency_penalty = 0.5f;
    memcpy(l, base, sizeof l);
    sampler_process_logits(&p, s, l, 6);
    const double freq[6] = {2.0, -1.0, 0.5 - 1.0, 3.0 - 0.5, -2.0, 1.0};
    for (int i = 0; i < 6; i++) assert_close(l[i], freq[i]);

    /* presence: once per generated token, negative values reward */
    sampling_params_default(&p);
    p.presence_penalty = -0.25f;
    memcpy(l, base, sizeof l);
    sampler_process_logits(&p, s, l, 6);
    const double pres[6] = {2.0, -1.0, 0.75, 3.25, -2.0, 1.0};
    for (int i = 0; i < 6; i++) assert_close(l[i], pres[i]);

    /* all together, after the bias */
    struct logit_bias_entry bias[2] = {{4, 1.0f}, {1, 3.0f}};
    sampling_params_default(&p);
    p.repetition_penalty = 1.5f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.3f;
    p.n_logit_bias = 2, p.logit_bias = bias;
    memcpy(l, base, sizeof l);
    sampler_process_logits(&p, s, l, 6);
    const double all[6] = {2.0 / 1.5, 2.0 / 1.5, 0.5 / 1.5 - 1.3, 2.0 - 0.8, -1.0, 1.0};
    for (int i = 0; i < 6; i++) assert_close(l[i], all[i]);

    /* the sampler uses the processed row: greedy now picks token 0 */
    p.temperature = 0;
    assert_int_equal(draw(&p, s, base, 6, 0).token, 0);
    sampler_state_free(s);
}

static void test_penalty_state_growth(void **state) {
    (void)state;
    enum { V = 5000, N = 3000 };
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = (i * 37) % V;
    struct sampler_state *s = sampler_state_create(V, prompt, 100);
    static int counts[V], seen[V];
    memset(counts, 0, sizeof counts);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 100; i++) seen[prompt[i]] = 1;
    uint64_t x = 9;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int32_t t = (int32_t)((x >> 33) % (i < N / 2 ? V : 50)); /* many repeats later */
        sampler_state_accept(s, t);
        counts[t]++, seen[t] = 1;
    }
    struct sampling_params p;
    sampling_params_default(&p);
    p.repetition_penalty = 1.3f, p.frequency_penalty = 0.1f, p.presence_penalty = 0.2f;
    static float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i % 11) - 5) * 0.5f;
    sampler_process_logits(&p, s, l, V);
    for (int i = 0; i < V; i++) {
        double v = (double)((i % 11) - 5) * 0.5;
        if (seen[i]) v = v > 0 ? v / 1.3 : v * 1.3;
        if (counts[i]) v -= 0.1 * counts[i] + 0.2;
        assert_close(l[i], v);
    }
    sampler_state_free(s);
}

static void test_logit_bias(void **state) {
    (void)state;
    struct sampling_params p;
    sampling_params_default(&p);
    struct logit_bias_entry ban = {1, -100.0f}, force = {6, 100.0f};
    p.n_logit_bias = 1;
    p.logit_bias = &ban;
    int counts[8];
    histogram(&p, LOGITS8, 8, 3000, counts);
    assert_int_equal(counts[1], 0);
    p.temperature = 0;
    assert_int_equal(draw(&p, NULL, LOGITS8, 8, 0).token, 3);
    p.temperature = 1.0f;
    p.logit_bias = &force;
    histogram(&p, LOGITS8, 8, 3000, counts);
    assert_int_equal(counts[6], 3000);
    /* the logit arrays of a big row: bans hold there too */
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    for (int i = 0; i < BIG_VOCAB; i++) big[i] = 0;
    struct logit_bias_entry many[3] = {{0, 100.0f}, {151935, 100.0f}, {0, -100.0f}};
    p.n_logit_bias = 3;
    p.logit_bias = many; /* entries add up: 0 nets 0, 151935 is forced */
    for (uint64_t step = 0; step < 20; step++)
        assert_int_equal(draw(&p, NULL, big, BIG_VOCAB, step).token, 151935);
    free(big);
}

/* ---- logprobs ------------------------------------------------------------ */

static void log_softmax_ref(const float *l, int n, double *out) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++) z += exp((double)l[i] - m);
    for (int i = 0; i < n; i++) out[i] = (double)l[i] - m - log(z);
}

static void test_logprobs_raw(void **state) {
    (void)state;
    double ref[8];
    log_softmax_ref(LOGITS8, 8, ref);
    struct sampling_params p;
    sampling_params_default(&p);
    p.logprobs = 1;
    p.top_logprobs = 3;
    p.temperature = 0.5f; /* ignored by logprobs: they are of the raw logits */
    struct logit_bias_entry bias = {2, 5.0f};
    p.n_logit_bias = 1, p.logit_bias = &bias;
    int32_t prompt[1] = {1};
    struct sampler_state *s = sampler_state_create(8, prompt, 1);
    p.repetition_penalty = 2.0f;
    for (uint64_t step = 0; step < 50; step++) {
        struct sample_result r = draw(&p, s, LOGITS8, 8, step);
        assert_close(r.logprob, ref[r.token]);
        assert_int_equal(r.n_top, 3);
        const int order[3] = {1, 3, 5};
        for (int j = 0; j < 3; j++) {
            assert_int_equal(r.top_ids[j], order[j]);
            assert_close(r.top_logprobs[j], ref[order[j]]);
        }
    }
    sampler_state_free(s);

    /* ties in top_logprobs: by lower id; n capped at the vocabulary */
    float ties[5] = {1.0f, 2.0f, 1.0f, 2.0f, 0.5f};
    double tref[5];
    log_softmax_ref(ties, 5, tref);
    sampling_params_default(&p);
    p.temperature = 0;
    p.top_logprobs = SAMPLING_MAX_TOP_LOGPROBS;
    struct sample_result r = draw(&p, NULL, ties, 5, 0);
    assert_int_equal(r.token, 1);
    assert_int_equal(r.n_top, 5);
    const int order[5] = {1, 3, 0, 2, 4};
    for (int j = 0; j < 5; j++) {
        assert_int_equal(r.top_ids[j], order[j]);
        assert_close(r.top_logprobs[j], tref[order[j]]);
    }
    assert_close(r.logprob, tref[1]); /* top_logprobs alone also fills logprob */

    /* a big row */
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    double *bref = xmalloc(BIG_VOCAB * sizeof *bref);
    fill_random(big, BIG_VOCAB, 5, 30.0);
    log_softmax_ref(big, BIG_VOCAB, bref);
    sampling_params_default(&p);
    p.logprobs = 1, p.top_logprobs = 20, p.top_p = 0.9f;
    r = draw(&p, NULL, big, BIG_VOCAB, 1);
    assert_close(r.logprob, bref[r.token]);
    assert_int_equal(r.n_top, 20);
    for (int j = 0; j < 20; j++) {
        assert_close(r.top_logprobs[j], bref[r.top_ids[j]]);
        if (j) assert_true(r.top_logprobs[j] <= r.top_logprobs[j - 1]);
    }
    int better = 0; /* nothing outside the list beats its last entry */
    for (int i = 0; i < BIG_VOCAB; i++) better += big[i] > big[r.top_ids[19]];
    assert_int_equal(better, 19);
    free(big);
    free(bref);
}

/* ---- edges --------------------------------------------------------------- */

static void test_vocab_one(void **state) {
    (void)state;
    float one[1] = {-3.0f};
    struct sampling_params p;
    sampling_params_default(&p);
    p.logprobs = 1, p.top_logprobs = 5;
    const float cfg[5][4] = {{0, 1, 0, 0}, {1, 1, 0, 0}, {0.7f, 0.9f, 0, 0}, {1, 1, 50, 0},
                             {1.2f, 1, 0, 0.05f}};
    for (int c = 0; c < 5; c++) {
        p.temperature = cfg[c][0], p.top_p = cfg[c][1], p.top_k = (int)cfg[c][2], p.min_p = cfg[c][3];
        struct sample_result r = draw(&p, NULL, one, 1, (uint64_t)c);
        assert_int_equal(r.token, 0);
        assert_close(r.logprob, 0.0);
        assert_int_equal(r.n_top, 1);
    }
}

static void test_non_finite_logits(void **state) {
    (void)state;
    float l[6] = {NAN, -INFINITY, 1.0f, NAN, 0.5f, -INFINITY};
    struct sampling_params p;
    sampling_params_default(&p);
    int counts[6];
    histogram(&p, l, 6, 2000, counts);
    assert_int_equal(counts[0] + counts[1] + counts[3] + counts[5], 0);
    assert_true(counts[2] > counts[4] && counts[4] > 0);
    p.top_k = 4;
    histogram(&p, l, 6, 500, counts);
    assert_int_equal(counts[0] + counts[1] + counts[3] + counts[5], 0);
    p.top_k = 0, p.top_p = 0.99f;
    histogram(&p, l, 6, 500, counts);
    assert_int_equal(counts[0] + counts[1] + counts[3] + counts[5], 0);
    p.temperature = 0;
    assert_int_equal(draw(&p, NULL, l, 6, 0).token, 2);
}

static void test_warmup_changes_nothing(void **state) {
    (void)state;
    float *big = xmalloc(BIG_VOCAB * sizeof *big);
    fill_random(big, BIG_VOCAB, 13, 10.0);
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0.8f, p.top_p = 0.95f, p.top_k = 40, p.seed = 77;
    int before[10];
    for (int i = 0; i < 10; i++) before[i] = draw(&p, NULL, big, BIG_VOCAB, (uint64_t)i).token;
    const int buckets[4] = {1, 2, 4, 8};
    double secs = sampler_warmup(BIG_VOCAB, buckets, 4);
    assert_true(secs >= 0 && secs < 60);
    assert_true(sampler_warmup(1, NULL, 0) >= 0);
    for (int i = 0; i < 10; i++) assert_int_equal(draw(&p, NULL, big, BIG_VOCAB, (uint64_t)i).token, before[i]);
    free(big);
}

static void test_validate(void **state) {
    (void)state;
    struct sampling_params p;
    struct kiln_error err = {0};
    sampling_params_default(&p);
    assert_int_equal(sampling_params_validate(&p, 10, &err), 0);
    p.temperature = -1;
    assert_int_equal(sampling_params_validate(&p, 10, &err), -1);
    assert_non_null(strstr(err.msg, "temperature"));
    sampling_params_default(&p);
    p.top_p = 0;
    assert_int_equal(sampling_params_validate(&p, 10, &err), -1);
    assert_non_null(strstr(err.msg, "top_p"));
    sampling_params_default(&p);
    p.top_logprobs = 21;
    assert_int_equal(sampling_params_validate(&p, 10, &err), -1);
    sampling_params_default(&p);
    p.frequency_penalty = NAN;
    assert_int_equal(sampling_params_validate(&p, 10, &err), -1);
    struct logit_bias_entry b = {10, 1.0f};
    sampling_params_default(&p);
    p.n_logit_bias = 1, p.logit_bias = &b;
    assert_int_equal(sampling_params_validate(&p, 10, &err), -1);
    assert_non_null(strstr(err.msg, "token id 10"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_argmax_and_ties),
        cmocka_unit_test(test_temperature_limit),
        cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_k_big_vocab),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_top_p_big_vocab),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties_by_hand),
        cmocka_unit_test(test_penalty_state_growth),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs_raw),
        cmocka_unit_test(test_vocab_one),
        cmocka_unit_test(test_non_finite_logits),
        cmocka_unit_test(test_warmup_changes_nothing),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
