/* test_moe_uniform.c — uniform dummy routing and touched-expert counting in
 * the CPU backend's moe_route (moe_route_params.uniform / .count), the
 * benchmark tools of docs/bench.md.
 *
 * Uniform routing: over many rows with fixed keys (so nothing can flake),
 * every row holds top_k distinct experts, the top_k largest of its draws
 * (a reference selection by sorting); each expert is chosen close to
 * n·k/E times (Pearson's chi-square over the E experts stays well inside
 * what a uniform choice gives: between a quarter and twice E − 1, its
 * mean); rows whose keys differ only in the slot, the position or the
 * layer share k²/E experts on average, as independent draws do; the
 * logits are ignored; the weights follow the row's scores as the route
 * would from logits. Counting: the record's calls, sum, min, max and rows
 * equal a count made here from the ids the op returned, fused shared
 * experts left out, and nothing is counted while the record is disabled. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/route_uniform.h"

static struct backend cpu;

struct keys {
    int32_t *slot, *pos;
};

static struct keys keys_make(long n, int32_t slot0, int32_t slot_step, int32_t pos0, int32_t pos_step) {
    struct keys k = {xmalloc((size_t)n * 4), xmalloc((size_t)n * 4)};
    for (long i = 0; i < n; i++) k.slot[i] = slot0 + (int32_t)i * slot_step, k.pos[i] = pos0 + (int32_t)i * pos_step;
    return k;
}

static void keys_free(struct keys *k) { free(k->slot), free(k->pos); }

/* Routes n rows; ids[n][top_k + n_fused], weights likewise (caller frees). */
static void route(struct moe_route_params p, const struct keys *k, long n, int layer, int32_t **ids, float **w,
                  struct moe_route_count *count) {
    int W = p.top_k + p.n_fused;
    *ids = xmalloc((size_t)(n * W) * 4);
    *w = xmalloc((size_t)(n * W) * 4);
    float *logits = xmalloc((size_t)(n * p.n_experts) * 4);
    /* logits that would choose experts 0..k-1: uniform routing must ignore them */
    for (long i = 0; i < n * p.n_experts; i++) logits[i] = (float)(p.n_experts - i % p.n_experts);
    p.uniform = 1;
    p.layer = layer;
    p.key_slot = k->slot, p.key_pos = k->pos;
    p.count = count;
    cpu.ops->moe_route(cpu.ctx, *ids, *w, logits, NULL, &p, n);
    free(logits);
}

static int cmp_desc(const void *a, const void *b) {
    const float *x = a, *y = b;
    return x[0] < y[0] ? 1 : x[0] > y[0] ? -1 : (x[1] > y[1]) - (x[1] < y[1]);
}

static void check_uniform(int E, int K, enum moe_route_scoring sc, int renorm, int n_fused) {
    long n = 8192;
    int W = K + n_fused;
    struct moe_route_params p = {.n_experts = E, .top_k = K, .scoring = sc, .method = MOE_ROUTE_GREEDY,
                                 .n_group = 1, .topk_group = 1, .renormalize = renorm, .scaling = 2.5f,
                                 .scale_when_renormalized = 1, .n_fused = n_fused};
    struct keys k = keys_make(n, 17, 3, 5, 1);
    int32_t *ids;
    float *w;
    route(p, &k, n, 7, &ids, &w, NULL);
    long *hits = xcalloc((size_t)E, sizeof *hits);
    float (*ref)[2] = xmalloc((size_t)E * sizeof *ref);
    for (long i = 0; i < n; i++) {
        /* the reference selection: the row's draws sorted, lower index first on ties */
        uint64_t row = route_uniform_row(k.slot[i], k.pos[i], 7);
        double z = 0;
        for (int e = 0; e < E; e++) {
            ref[e][0] = route_uniform_score(row, e), ref[e][1] = (float)e;
            z += sc == MOE_ROUTE_SOFTMAX ? exp(ref[e][0]) : 0;
        }
        qsort(ref, (size_t)E, sizeof *ref, cmp_desc);
        double sum = 0, s[1024];
        for (int j = 0; j < K; j++) {
            int e = ids[i * W + j];
            assert_int_equal(e, (int)ref[j][1]);
            hits[e]++;
            for (int q = 0; q < j; q++) assert_int_not_equal(ids[i * W + q], e);
            s[j] = sc == MOE_ROUTE_SOFTMAX ? exp(ref[j][0]) / z : 1 / (1 + exp(-ref[j][0]));
            sum += s[j];
        }
        for (int j = 0; j < K; j++) {
            double want = (renorm ? s[j] / sum : s[j]) * 2.5;
            assert_true(fabs(w[i * W + j] - want) < 1e-5 * want + 1e-7);
        }
        for (int j = 0; j < n_fused; j++) {
            assert_int_equal(ids[i * W + K + j], E + j);
            assert_true(w[i * W + K + j] == 1.0f);
        }
    }
    double expect = (double)n * K / E, chi2 = 0;
    for (int e = 0; e < E; e++) chi2 += (hits[e] - expect) * (hits[e] - expect) / expect;
    printf("  E=%d K=%d: chi-square %.1f over %d degrees of freedom\n", E, K, chi2, E - 1);
    assert_true(chi2 < 2.0 * (E - 1) && chi2 > 0.25 * (E - 1));
    free(hits), free(ref), free(ids), free(w);
    keys_free(&k);
}

static void test_uniform_choices(void **state) {
    (void)state;
    check_uniform(64, 6, MOE_ROUTE_SOFTMAX, 0, 0);  /* deepseek-v2-lite */
    check_uniform(128, 8, MOE_ROUTE_SOFTMAX, 1, 0); /* qwen3-moe */
    check_uniform(256, 8, MOE_ROUTE_SIGMOID, 1, 1); /* deepseek-v3, shared expert fused */
    check_uniform(8, 2, MOE_ROUTE_SOFTMAX, 1, 0);   /* the oracle models */
}

/* Mean number of experts two routings of the same rows share. */
static double mean_overlap(const int32_t *a, const int32_t *b, long n, int K) {
    long shared = 0;
    for (long i = 0; i < n; i++)
        for (int j = 0; j < K; j++)
            for (int q = 0; q < K; q++) shared += a[i * K + j] == b[i * K + q];
    return (double)shared / (double)n;
}

static void test_uniform_keys(void **state) {
    (void)state;
    int E = 64, K = 6;
    long n = 4096;
    struct moe_route_params p = {.n_experts = E, .top_k = K, .n_group = 1, .topk_group = 1, .renormalize = 1,
                                 .scaling = 1.0f};
    struct keys base = keys_make(n, 100, 1, 40, 0), slot = keys_make(n, 100 + (int32_t)n, 1, 40, 0),
                pos = keys_make(n, 100, 1, 41, 0);
    int32_t *a, *a2, *b, *c, *d;
    float *wa, *wa2, *wb, *wc, *wd;
    route(p, &base, n, 3, &a, &wa, NULL);
    route(p, &base, n, 3, &a2, &wa2, NULL);
    route(p, &slot, n, 3, &b, &wb, NULL);
    route(p, &pos, n, 3, &c, &wc, NULL);
    route(p, &base, n, 4, &d, &wd, NULL);
    /* deterministic: the same keys give the same experts and weights */
    assert_memory_equal(a, a2, (size_t)(n * K) * 4);
    assert_memory_equal(wa, wa2, (size_t)(n * K) * 4);
    /* independent draws share k^2/E = 0.5625 experts per row on average
     * (standard error about 0.01 over 4096 rows) */
    double want = (double)K * K / E, ov[3] = {mean_overlap(a, b, n, K), mean_overlap(a, c, n, K),
                                              mean_overlap(a, d, n, K)};
    printf("  shared experts per row: other slot %.3f, other position %.3f, other layer %.3f (independent: %.3f)\n",
           ov[0], ov[1], ov[2], want);
    for (int i = 0; i < 3; i++) assert_true(fabs(ov[i] - want) < 0.1);
    /* consecutive rows of one step (slots s, s+1) are independent too */
    assert_true(fabs(mean_overlap(a, a + K, n - 1, K) - want) < 0.1);
    free(a), free(a2), free(b), free(c), free(d), free(wa), free(wa2), free(wb), free(wc), free(wd);
    keys_free(&base), keys_free(&slot), keys_free(&pos);
}

/* The count of one call made from its ids: distinct routed experts. */
static int host_distinct(const int32_t *ids, long n, int W, int K, int E) {
    char seen[1024] = {0};
    int d = 0;
    for (long i = 0; i < n; i++)
        for (int j = 0; j < K; j++) {
            int e = ids[i * W + j];
            assert_true(e >= 0 && e < E);
            if (!seen[e]) seen[e] = 1, d++;
        }
    return d;
}

static void check_count(int uniform) {
    int E = 32, K = 4, n_fused = 1, W = K + n_fused;
    size_t rec_bytes = sizeof(struct moe_route_count) + (size_t)(E + n_fused) * 4;
    struct moe_route_count *rec = xcalloc(1, rec_bytes);
    rec->enabled = 1;
    struct moe_route_params p = {.n_experts = E, .top_k = K, .n_group = 1, .topk_group = 1, .renormalize = 1,
                                 .scaling = 1.0f, .n_fused = n_fused};
    static const long sizes[] = {1, 3, 9, 64, 2, 200, 1};
    long calls = 0, sum = 0, rows = 0;
    int mn = 1 << 30, mx = -1;
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        long n = sizes[c];
        struct keys k = keys_make(n, (int32_t)(1000 * c), 1, (int32_t)c, 1);
        int32_t *ids;
        float *w;
        if (uniform) {
            route(p, &k, n, (int)c, &ids, &w, rec);
        } else { /* the router's own choice from random logits */
            ids = xmalloc((size_t)(n * W) * 4), w = xmalloc((size_t)(n * W) * 4);
            float *lg = xmalloc((size_t)(n * E) * 4);
            for (long i = 0; i < n * E; i++) lg[i] = (float)((i * 2654435761u + c * 97) % 1000) / 100.0f;
            p.count = rec;
            cpu.ops->moe_route(cpu.ctx, ids, w, lg, NULL, &p, n);
            free(lg);
        }
        int d = host_distinct(ids, n, W, K, E);
        calls++, sum += d, rows += n;
        if (d < mn) mn = d;
        if (d > mx) mx = d;
        assert_int_equal(rec->calls, calls);
        assert_int_equal(rec->sum, sum);
        assert_int_equal(rec->rows, rows);
        assert_int_equal(rec->min, mn);
        assert_int_equal(rec->max, mx);
        free(ids), free(w);
        keys_free(&k);
    }
    assert_int_equal(mn, K); /* a one-row call touches exactly its k experts */
    /* disabled: the same calls leave the record alone */
    rec->enabled = 0;
    struct moe_route_count before = *rec;
    struct keys k = keys_make(50, 7, 1, 7, 1);
    int32_t *ids;
    float *w;
    route(p, &k, 50, 0, &ids, &w, rec);
    assert_memory_equal(&before, rec, sizeof before);
    /* the flags after the record are scratch, zero between calls */
    const int32_t *flags = (const int32_t *)(rec + 1);
    for (int e = 0; e < E; e++) assert_int_equal(flags[e], 0);
    free(ids), free(w), free(rec);
    keys_free(&k);
}

static void test_count(void **state) {
    (void)state;
    check_count(1);
    check_count(0);
}

int main(void) {
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 1};
    if (backend_create(&cpu, "cpu", &bo, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_uniform_choices), cmocka_unit_test(test_uniform_keys),
                                       cmocka_unit_test(test_count)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    backend_destroy(&cpu);
    return rc;
}
