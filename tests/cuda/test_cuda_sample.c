/* test_cuda_sample.c — sampling on the GPU (backend_ops.sample,
 * cuda_sample.cu) against the CPU sampler (src/sample) on the same rows.
 *
 *  - greedy: identical tokens (random rows, ties, NaN, -inf, +inf rows,
 *    non-finite maxima under random parameters, all-NaN rows -> 0);
 *  - adjustments: the processed row equals sampler_process_logits after
 *    the engine's stop mask, bitwise (logit_bias, repetition, frequency,
 *    presence; NaN and -inf among the adjusted logits);
 *  - kept sets: the test hook cuda_sample_kept against sampler_kept_set for
 *    top_k / top_p / min_p / temperature and combinations, four row shapes,
 *    vocab sizes 151936, 128256, 1003 (scalar loads) and 7. They must be
 *    identical, except for a token that sits on a rounding boundary the two
 *    implementations may resolve differently, which the test names and
 *    accepts: (a) its weight argument within 1e-3 of the 2^-40 cut (the
 *    CPU zeroes whole groups of 16 below the cut by a test on the logit,
 *    the GPU tests each token); (b) top_p: the exact (double) mass before
 *    it within 2e-6 of the top_p target (the CPU sums in float blocks, the
 *    GPU in exact fixed point); (c) min_p: its weight within 1e-6 of min_p.
 *    At most 2 such tokens per row, and the GPU's token is always kept by
 *    the CPU set;
 *  - the draw: chi-square of 16384 draws per configuration ((seed, step)
 *    fixed, so the outcome is reproducible) against the CPU's kept
 *    probabilities, bins with expected count < 5 merged; fails when the
 *    p-value is below 1e-4 (Wilson-Hilferty quantile);
 *  - batch invariance: each of 64 rows (own parameters, adjustments) gives
 *    the same token alone and inside batches of 2..64 at any position;
 *  - grammar masks (backend_sample_row.mask): processed rows bitwise as
 *    the CPU's masking, greedy identical, draws inside the mask.
 * test_cuda_sample_model.c runs the sampler inside the model and the
 * engine. Without a GPU every test fails (gpu-labelled tests run on the GPU
 * machine). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "model/model.h"
#include "runner/runner.h"
#include "sample/sampling.h"
#include "scheduler/engine.h"
#include "tensor/backend.h"

#include "cuda_test_gpu.h"


/* ---- random rows --------------------------------------------------------- */

static uint64_t rs = 0x1234567887654321ull;
static uint64_t rnext(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static double runif(void) { return (double)(rnext() >> 11) * (1.0 / 9007199254740992.0); }
static double rgauss(void) {
    double u = runif() + 1e-300, v = runif();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

enum { ROW_PEAKED, ROW_FLAT, ROW_TIES, ROW_WIDE, ROW_KINDS };
static const char *row_name[] = {"peaked", "flat", "ties", "wide"};

/* peaked: a model-like bulk N(0, 2.5) and 32 peaks at 14..20; flat:
 * N(0, 0.5) (huge nuclei); ties: values on a 0.25 grid (many equal
 * logits at every boundary); wide: N(0, 8) (the 2^-40 cut inside the bulk). */
static void gen_row(float *l, long V, int kind) {
    for (long i = 0; i < V; i++) {
        double g = rgauss();
        switch (kind) {
        case ROW_PEAKED: l[i] = (float)(2.5 * g); break;
        case ROW_FLAT: l[i] = (float)(0.5 * g); break;
        case ROW_TIES: l[i] = (float)(floor(2.0 * g * 4.0) / 4.0); break;
        default: l[i] = (float)(8.0 * g); break;
        }
    }
    if (kind == ROW_PEAKED || kind == ROW_TIES)
        for (int j = 0; j < 32 && j < V; j++) {
            float v = (float)(14.0 + 6.0 * runif());
            if (kind == ROW_TIES) v = floorf(v * 4.0f) / 4.0f;
            l[rnext() % (uint64_t)V] = v;
        }
}

/* ---- running the device sampler ------------------------------------------- */

/* Samples n rows (host rows[n][ld]) on the GPU backend be; tokens[n];
 * optionally the kept masks kept[n][V] (test hook) and the processed rows. */
static void dev_sample(struct backend *be, const float *rows, long ld, long n, long V,
                       const struct backend_sample_row *params, const struct backend_sample_adj *adj,
                       int n_adj, int32_t *tokens, unsigned char *kept, float *processed) {
    const struct backend_ops *o = be->ops;
    float *dl = o->alloc(be->ctx, (size_t)(n * ld) * 4);
    int32_t *dt = o->alloc(be->ctx, (size_t)n * 4);
    struct backend_sample_row *dr = o->alloc(be->ctx, (size_t)n * sizeof *dr);
    struct backend_sample_adj *da = o->alloc(be->ctx, (size_t)(n_adj ? n_adj : 1) * sizeof *da);
    unsigned char *dk = kept ? o->alloc(be->ctx, (size_t)(n * V)) : NULL;
    assert_non_null(dl), assert_non_null(dt), assert_non_null(dr), assert_non_null(da);
    o->upload(be->ctx, dl, rows, (size_t)(n * ld) * 4);
    o->upload(be->ctx, dr, params, (size_t)n * sizeof *dr);
    if (n_adj) o->upload(be->ctx, da, adj, (size_t)n_adj * sizeof *da);
    for (long i = 0; i < n; i++) tokens[i] = -7;
    o->upload(be->ctx, dt, tokens, (size_t)n * 4); /* poison */
    if (kept) cuda_sample_kept(be->ctx, dk, dt, dl, ld, n, V, dr, da);
    else o->sample(be->ctx, dt, dl, ld, n, V, dr, da);
    o->download(be->ctx, tokens, dt, (size_t)n * 4);
    if (kept) o->download(be->ctx, kept, dk, (size_t)(n * V));
    if (processed) o->download(be->ctx, processed, dl, (size_t)(n * ld) * 4);
    o->free(be->ctx, dl), o->free(be->ctx, dt), o->free(be->ctx, dr), o->free(be->ctx, da);
    if (dk) o->free(be->ctx, dk);
}

static void params_of(const struct sampling_params *p, uint64_t step, struct backend_sample_row *r) {
    sampler_row_params(p, step, r);
}

/* The CPU sampler's token for an already processed row (no state). */
static int cpu_token(const struct sampling_params *p, const float *l, long V, uint64_t step) {
    float *row = xmalloc((size_t)V * 4), *scratch = xmalloc((size_t)V * 8);
    memcpy(row, l, (size_t)V * 4);
    struct sample_result res;
    sampler_sample(p, NULL, row, (int)V, step, scratch, &res);
    free(row), free(scratch);
    return res.token;
}

/* ---- greedy -------------------------------------------------------------- */

static void test_greedy(void **state) {
    (void)state;
    NEED_GPU();
    const long vocabs[] = {151936, 128256, 1003, 1000, 7};
    int checked = 0;
    for (int vi = 0; vi < 5; vi++) {
        long V = vocabs[vi];
        enum { CASES = 14 };
        float *rows = xmalloc((size_t)(CASES * V) * 4);
        struct backend_sample_row pr[CASES];
        struct sampling_params sp[CASES];
        for (int c = 0; c < CASES; c++) {
            float *l = rows + c * V;
            gen_row(l, V, c % ROW_KINDS);
            sampling_params_default(&sp[c]);
            sp[c].temperature = 0;
            long a = (long)(rnext() % (uint64_t)V), b = (long)(rnext() % (uint64_t)V);
            switch (c) {
            case 4: /* ties at the maximum: the lower id */
                l[a] = l[b] = 1e4f;
                break;
            case 5: /* constant row */
                for (long i = 0; i < V; i++) l[i] = 0.5f;
                break;
            case 6: /* NaNs everywhere but never chosen, one at the would-be max */
                for (long i = 0; i < V; i += 3) l[i] = NAN;
                l[a] = NAN;
                break;
            case 7: /* all NaN: token 0 */
                for (long i = 0; i < V; i++) l[i] = NAN;
                break;
            case 8: /* all -inf but NaN first: the first non-NaN */
                for (long i = 0; i < V; i++) l[i] = -INFINITY;
                l[0] = NAN;
                break;
            case 9: /* +inf twice: the first; random parameters fall back to greedy */
                l[a] = l[b] = INFINITY;
                sp[c].temperature = 0.9f, sp[c].top_p = 0.9f;
                break;
            case 10: /* top_k = 1 is greedy at any temperature */
                sp[c].temperature = 1.3f, sp[c].top_k = 1;
                break;
            case 11: /* -0 and +0 tie */
                for (long i = 0; i < V; i++) l[i] = -1.0f;
                l[a] = -0.0f, l[b] = 0.0f;
                break;
            case 12: /* -inf mixed in, max finite */
                for (long i = 0; i < V; i += 2) l[i] = -INFINITY;
                break;
            case 13: /* one NaN, rest -inf: first -inf */
                for (long i = 0; i < V; i++) l[i] = -INFINITY;
                l[a] = NAN;
                sp[c].temperature = 1.0f;
                break;
            default: break;
            }
            params_of(&sp[c], 3, &pr[c]);
        }
        int32_t tok[CASES];
        dev_sample(&gpu, rows, V, CASES, V, pr, NULL, 0, tok, NULL, NULL);
        for (int c = 0; c < CASES; c++) {
            int want = cpu_token(&sp[c], rows + c * V, V, 3);
            if (tok[c] != want) fail_msg("greedy V=%ld case %d: gpu %d, cpu %d", V, c, tok[c], want);
            checked++;
        }
        free(rows);
    }
    printf("  greedy: %d rows identical (5 vocab sizes, ties / NaN / -inf / +inf / +-0 rows)\n", checked);
}

/* ---- adjustments ----------------------------------------------------------- */

static void test_adjustments(void **state) {
    (void)state;
    NEED_GPU();
    const long vocabs[] = {151936, 1000, 7};
    for (int vi = 0; vi < 3; vi++) {
        long V = vocabs[vi];
        enum { N = 6 };
        float *rows = xmalloc((size_t)(N * V) * 4), *want = xmalloc((size_t)(N * V) * 4);
        float *got = xmalloc((size_t)(N * V) * 4);
        struct backend_sample_row pr[N];
        struct backend_sample_adj *adj = xmalloc((size_t)N * 8192 * sizeof *adj);
        int32_t *slot = xmalloc((size_t)V * 4);
        for (long i = 0; i < V; i++) slot[i] = -1;
        int n_adj = 0;
        for (int r = 0; r < N; r++) {
            float *l = rows + r * V;
            gen_row(l, V, r % ROW_KINDS);
            struct sampling_params sp;
            sampling_params_default(&sp);
            sp.temperature = 0; /* the processed row is what matters here */
            sp.repetition_penalty = r % 3 == 0 ? 1.0f : 1.0f + 0.15f * (float)r;
            sp.frequency_penalty = r % 2 ? 0.4f : 0.0f;
            sp.presence_penalty = r % 4 == 1 ? -0.7f : 0.25f * (float)(r % 3);
            struct logit_bias_entry bias[8];
            for (int k = 0; k < 8; k++) {
                bias[k].id = (int32_t)((k * 7919 + r * 31) % V);
                bias[k].bias = (float)(runif() * 40.0 - 20.0);
            }
            int nb = V >= 8 ? 8 : 1;
            sp.n_logit_bias = r == 5 ? 0 : nb, sp.logit_bias = bias;
            int32_t prompt[300];
            int np = V > 300 ? 300 : (int)V;
            for (int k = 0; k < np; k++) prompt[k] = (int32_t)(rnext() % (uint64_t)V);
            struct sampler_state *st = sampler_state_create((int)V, prompt, np);
            for (int k = 0; k < 200; k++) sampler_state_accept(st, (int32_t)(rnext() % (uint64_t)(V < 50 ? V : 50)));
            /* non-finite logits among the adjusted ones */
            l[prompt[0]] = NAN, l[prompt[1 % np]] = -INFINITY, l[bias[0].id] = INFINITY;
            int32_t mask[3] = {(int32_t)(V - 1), 0, (int32_t)V + 5 /* out of range: ignored */};
            int nm = r % 2 ? 3 : 0;
            int k = sampler_build_adjustments(&sp, st, mask, nm, (int)V, adj + n_adj, 8192, slot);
            assert_true(k >= 0);
            params_of(&sp, 0, &pr[r]);
            pr[r].adj_start = n_adj, pr[r].n_adj = k;
            n_adj += k;
            /* the CPU: the engine's mask_stops, then sampler_process_logits */
            float *w = want + r * V;
            memcpy(w, l, (size_t)V * 4);
            for (int q = 0; q < nm; q++)
                if (mask[q] >= 0 && mask[q] < V) w[mask[q]] = -INFINITY;
            sampler_process_logits(&sp, st, w, (int)V);
            if (r == 0 && V > 8) {
                /* an id given twice cannot be one entry: the row falls back */
                struct logit_bias_entry dup[2] = {{3, 1.0f}, {3, 2.0f}};
                struct sampling_params d = sp;
                d.n_logit_bias = 2, d.logit_bias = dup;
                assert_int_equal(sampler_build_adjustments(&d, st, NULL, 0, (int)V, adj + n_adj, 64, slot), -1);
                assert_int_equal(sampler_build_adjustments(&sp, st, mask, nm, (int)V, adj + n_adj, 2, slot), -1);
                for (long i = 0; i < V; i++) assert_int_equal(slot[i], -1);
            }
            sampler_state_free(st);
        }
        int32_t tok[N];
        dev_sample(&gpu, rows, V, N, V, pr, adj, n_adj, tok, NULL, got);
        long differ = 0;
        for (long i = 0; i < N * V; i++) {
            int same = memcmp(&got[i], &want[i], 4) == 0 || (isnan(got[i]) && isnan(want[i]));
            if (!same && differ++ < 5)
                printf("  V=%ld row %ld id %ld: gpu %.9g cpu %.9g (raw %.9g)\n", V, i / V, i % V,
                       (double)got[i], (double)want[i], (double)rows[i]);
        }
        printf("  adjustments V=%ld: %d entries over %d rows, %ld of %ld logits differ\n", V, n_adj, N,
               differ, N * V);
        if (differ) fail_msg("processed logits differ from sampler_process_logits");
        for (int r = 0; r < N; r++) /* greedy on the processed rows */
            assert_int_equal(tok[r], cpu_token(&(struct sampling_params){.temperature = 0, .top_p = 1},
                                               want + r * V, V, 0));
        free(rows), free(want), free(got), free(adj), free(slot);
    }
}

/* ---- grammar masks ------------------------------------------------------------ */


/* Rows with a grammar bitmask (backend_sample_row.mask): the processed row
 * equals the CPU's (masked tokens -inf first, then the stop mask and
 * sampler_process_logits), greedy tokens are identical, and a sampled
 * token always has its bit set. Masks of every density (one token, a few,
 * half, all but one, none set but the last id), vocabularies that are and
 * are not multiples of 32 and of the argmax chunk. */
static void test_grammar_mask(void **state) {
    (void)state;
    NEED_GPU();
    const long vocabs[] = {151936, 128256, 1003, 7};
    int checked = 0;
    for (int vi = 0; vi < 4; vi++) {
        long V = vocabs[vi], W = (V + 31) / 32;
        enum { N = 24 };
        float *rows = xmalloc((size_t)(N * V) * 4), *want = xmalloc((size_t)(N * V) * 4);
        float *got = xmalloc((size_t)(N * V) * 4);
        uint32_t *masks = xcalloc((size_t)(N * W), 4);
        struct backend_sample_row pr[N];
        struct sampling_params sp[N];
        struct backend_sample_adj adj[N * 4];
        int n_adj = 0;
        for (int r = 0; r < N; r++) {
            float *l = rows + r * V;
            uint32_t *m = masks + r * W;
            gen_row(l, V, r % ROW_KINDS);
            switch (r % 6) {
            case 0: m[(V - 1) / 32] |= 1u << ((V - 1) & 31); break; /* only the last id */
            case 1: /* a few random ids */
                for (int k = 0; k < 5; k++) {
                    long i = (long)(rnext() % (uint64_t)V);
                    m[i / 32] |= 1u << (i & 31);
                }
                break;
            case 2: /* about half */
                for (long w = 0; w < W; w++) m[w] = (uint32_t)rnext();
                break;
            case 3: /* all but the row's argmax */
                for (long w = 0; w < W; w++) m[w] = 0xffffffffu;
                m[argmax_first(l, V) / 32] &= ~(1u << (argmax_first(l, V) & 31));
                break;
            case 4: /* every 37th id */
                for (long i = 0; i < V; i += 37) m[i / 32] |= 1u << (i & 31);
                break;
            default: /* a run across word boundaries */
                for (long i = V / 3; i < V / 3 + 70 && i < V; i++) m[i / 32] |= 1u << (i & 31);
                break;
            }
            if (!(m[0] | m[(V - 1) / 32])) m[0] |= 1; /* never empty */
            sampling_params_default(&sp[r]);
            sp[r].temperature = r < N / 2 ? 0.0f : 1.0f;
            if (r >= N / 2) sp[r].top_p = r % 3 ? 0.9f : 1.0f, sp[r].top_k = r % 4 ? 0 : 20;
            params_of(&sp[r], (uint64_t)r * 7, &pr[r]);
            /* a bias on a masked id must not bring it back */
            if (r % 2) {
                adj[n_adj] = (struct backend_sample_adj){.id = (int32_t)((r * 977) % V),
                                                         .flags = BACKEND_ADJ_BIAS, .bias = 50.0f};
                pr[r].adj_start = n_adj++, pr[r].n_adj = 1;
            }
            float *w = want + r * V;
            memcpy(w, l, (size_t)V * 4);
            for (long i = 0; i < V; i++)
                if (!(m[i / 32] >> (i & 31) & 1)) w[i] = -INFINITY;
            if (r % 2) w[adj[n_adj - 1].id] += 50.0f;
        }
        const struct backend_ops *o = gpu.ops;
        uint32_t *dm = o->alloc(gpu.ctx, (size_t)(N * W) * 4);
        assert_non_null(dm);
        o->upload(gpu.ctx, dm, masks, (size_t)(N * W) * 4);
        for (int r = 0; r < N; r++) pr[r].mask = r == N - 1 ? NULL : dm + r * W;
        /* the last row has no mask: its row is the raw one (bias aside) */
        memcpy(want + (N - 1) * V, rows + (N - 1) * V, (size_t)V * 4);
        if ((N - 1) % 2) want[(N - 1) * V + adj[n_adj - 1].id] += 50.0f;
        int32_t tok[N];
        dev_sample(&gpu, rows, V, N, V, pr, adj, n_adj, tok, NULL, got);
        o->free(gpu.ctx, dm);
        for (long i = 0; i < N * V; i++)
            if (memcmp(&got[i], &want[i], 4) && !(isnan(got[i]) && isnan(want[i])))
                fail_msg("mask V=%ld row %ld id %ld: gpu %g, cpu %g", V, i / V, i % V, (double)got[i],
                         (double)want[i]);
        for (int r = 0; r < N; r++) {
            const uint32_t *m = masks + r * W;
            if (r < N - 1 && !(m[tok[r] / 32] >> (tok[r] & 31) & 1))
                fail_msg("mask V=%ld row %d: token %d is masked out", V, r, tok[r]);
            if (sp[r].temperature == 0) {
                int c = cpu_token(&sp[r], want + r * V, V, (uint64_t)r * 7);
                if (tok[r] != c) fail_msg("mask V=%ld greedy row %d: gpu %d, cpu %d", V, r, tok[r], c);
            }
            checked++;
        }
        free(rows), free(want), free(got), free(masks);
    }
    printf("  grammar masks: %d rows (processed rows bitwise, greedy identical, draws inside the mask)\n", checked);
}

/* ---- kept sets ------------------------------------------------------------- */

/* The CPU's key order: larger logit first, then lower id. */
static const float *g_keyrow;
static int cmp_key(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_keyrow[i], y = g_keyrow[j];
    if (x != x) return y != y ? (i < j ? -1 : 1) : 1;
    if (y != y) return -1;
    if (x > y) return -1;
    if (x < y) return 1;
    return i < j ? -1 : 1;
}

/* Is token i's membership a rounding boundary (see the top comment)? */
static const char *boundary(const struct sampling_params *p, const float *l, long V, long i,
                            const int32_t *order) {
    float m = -INFINITY;
    for (long j = 0; j < V; j++)
        if (l[j] > m) m = l[j];
    float inv_t = 1.0f / p->temperature;
    float x = (l[i] - m) * inv_t;
    if (fabsf(x - (-27.7f)) < 1e-3f) return "the 2^-40 cut";
    if (p->min_p > 0 && fabs(exp((double)x) - p->min_p) < 1e-6) return "min_p";
    if (p->top_p < 1.0f) {
        long k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
        double z = 0, before = 0;
        int seen = 0;
        for (long r = 0; r < k; r++) {
            int32_t j = order[r];
            double xj = ((double)l[j] - m) * inv_t;
            double w = xj > -27.7 ? exp(xj) : 0.0;
            z += w;
            if (j == i) seen = 1;
            if (!seen) before += w;
        }
        double need = ((double)p->top_p - 1e-6) * z;
        if (seen && fabs(before - need) <= 2e-6 * z) return "top_p mass";
    }
    return NULL;
}

struct kept_cfg {
    float t;
    int k;
    float p, min_p;
};

static void test_kept_sets(void **state) {
    (void)state;
    NEED_GPU();
    const struct kept_cfg cfgs[] = {
        {1.0f, 0, 1, 0},       {0.7f, 0, 1, 0},       {1.5f, 0, 1, 0},      /* temperature only */
        {1.0f, 2, 1, 0},       {0.8f, 5, 1, 0},       {1.0f, 50, 1, 0},     /* top_k */
        {1.0f, 1000, 1, 0},    {1.2f, 6000, 1, 0},    {0.5f, 20000, 1, 0},
        {1.0f, 0, 0.1f, 0},    {0.7f, 0, 0.5f, 0},    {1.0f, 0, 0.9f, 0},   /* top_p */
        {1.3f, 0, 0.99f, 0},   {1.0f, 0, 0.999f, 0},
        {1.0f, 0, 1, 0.01f},   {0.6f, 0, 1, 0.1f},    {1.0f, 0, 1, 0.5f},   /* min_p */
        {0.8f, 40, 0.95f, 0},  {1.0f, 2000, 0.9f, 0}, {1.0f, 50, 0.9f, 0.05f}, /* combos */
        {1.1f, 0, 0.8f, 0.1f}, {0.9f, 20, 1, 0.2f},   {1.0f, 8000, 0.5f, 0.02f},
    };
    const int n_cfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    const long vocabs[] = {151936, 128256, 1003, 7};
    long total_rows = 0, accepted = 0;
    for (int vi = 0; vi < 4; vi++) {
        long V = vocabs[vi], ld = V == 1003 ? V + 3 : V; /* ld > V: rows not 16-byte aligned */
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            float *rows = xmalloc((size_t)(n_cfg * ld) * 4);
            struct backend_sample_row pr[64];
            struct sampling_params sp[64];
            for (int c = 0; c < n_cfg; c++) {
                gen_row(rows + c * ld, V, kind);
                sampling_params_default(&sp[c]);
                sp[c].temperature = cfgs[c].t, sp[c].top_k = cfgs[c].k, sp[c].top_p = cfgs[c].p;
                sp[c].min_p = cfgs[c].min_p, sp[c].seed = (uint64_t)(c * 977 + kind), sp[c].has_seed = 1;
                params_of(&sp[c], (uint64_t)c, &pr[c]);
            }
            int32_t tok[64];
            unsigned char *kept = xmalloc((size_t)(n_cfg * V));
            dev_sample(&gpu, rows, ld, n_cfg, V, pr, NULL, 0, tok, kept, NULL);
            float *w = xmalloc((size_t)V * 4), *scratch = xmalloc((size_t)V * 8);
            int32_t *order = xmalloc((size_t)V * 4);
            for (int c = 0; c < n_cfg; c++) {
                const float *l = rows + c * ld;
                int n_kept = sampler_kept_set(&sp[c], l, (int)V, scratch, w);
                const unsigned char *kg = kept + c * V;
                long diff = 0, gpu_n = 0;
                int sorted = 0;
                for (long i = 0; i < V; i++) {
                    gpu_n += kg[i];
                    if ((w[i] > 0) == (kg[i] != 0)) continue;
                    if (!sorted) {
                        for (long j = 0; j < V; j++) order[j] = (int32_t)j;
                        g_keyrow = l;
                        qsort(order, (size_t)V, 4, cmp_key);
                        sorted = 1;
                    }
                    const char *why = boundary(&sp[c], l, V, i, order);
                    printf("  V=%ld %s cfg %d (t %.2g k %d p %.3g min_p %.2g): token %ld kept by %s only%s%s\n",
                           V, row_name[kind], c, (double)cfgs[c].t, cfgs[c].k, (double)cfgs[c].p,
                           (double)cfgs[c].min_p, i, w[i] > 0 ? "cpu" : "gpu",
                           why ? ": accepted, rounding boundary of " : ": UNEXPLAINED", why ? why : "");
                    if (!why) fail_msg("kept sets differ");
                    diff++;
                }
                if (diff > 2) fail_msg("kept sets differ in %ld tokens", diff);
                accepted += diff;
                if (tok[c] < 0 || tok[c] >= V || !(w[tok[c]] > 0))
                    fail_msg("V=%ld %s cfg %d: the GPU drew %d, not in the CPU's kept set (%d tokens)", V,
                             row_name[kind], c, tok[c], n_kept);
                (void)gpu_n;
                total_rows++;
            }
            free(rows), free(kept), free(w), free(scratch), free(order);
        }
    }
    printf("  kept sets: %ld rows (%d configurations x 4 row shapes x 4 vocab sizes), %ld boundary "
           "tokens accepted\n", total_rows, n_cfg, accepted);
}

/* ---- the draw's distribution ------------------------------------------------- */

/* Upper quantile of chi-square with df degrees of freedom at tail p, by
 * Wilson-Hilferty (z = the normal quantile). */
static double chi2_crit(int df, double z) {
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

static int cmp_desc_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

static void test_distribution(void **state) {
    (void)state;
    NEED_GPU();
    struct {
        long V;
        int kind;
        struct kept_cfg c;
        const char *what;
    } cases[] = {
        {1000, ROW_PEAKED, {1.0f, 8, 1, 0}, "top_k 8 (list)"},
        {1000, ROW_PEAKED, {0.7f, 0, 0.8f, 0}, "top_p 0.8 (list)"},
        {1000, ROW_PEAKED, {1.0f, 0, 1, 0.1f}, "min_p 0.1 (row walk)"},
        {1000, ROW_PEAKED, {2.0f, 0, 1, 0}, "temperature 2 (row walk)"},
        {151936, ROW_PEAKED, {1.0f, 30, 0.95f, 0}, "top_k 30 + top_p 0.95, vocab 151936"},
        {151936, ROW_PEAKED, {1.5f, 0, 1, 0.02f}, "min_p 0.02, vocab 151936 (row walk)"},
        {128256, ROW_TIES, {1.0f, 0, 0.7f, 0}, "top_p 0.7 on a row of ties, vocab 128256"},
    };
    enum { DRAWS = 16384, PER = 256 };
    const double z4 = 3.719; /* one-sided normal quantile for p = 1e-4 */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        long V = cases[ci].V;
        float *l = xmalloc((size_t)V * 4), *w = xmalloc((size_t)V * 4), *scratch = xmalloc((size_t)V * 8);
        gen_row(l, V, cases[ci].kind);
        if (ci == 3) /* ten dominant tokens and a tail that still has weight */
            for (long i = 0; i < V; i++) l[i] = i < 10 ? (float)(5.0 + runif()) : -20.0f;
        struct sampling_params sp;
        sampling_params_default(&sp);
        sp.temperature = cases[ci].c.t, sp.top_k = cases[ci].c.k, sp.top_p = cases[ci].c.p;
        sp.min_p = cases[ci].c.min_p;
        sampler_kept_set(&sp, l, (int)V, scratch, w);
        double z = 0;
        for (long i = 0; i < V; i++) z += w[i];
        /* PER copies of the row stay on the device (no adjustments: the
         * sampler leaves them as they are); each launch draws PER more */
        const struct backend_ops *o = gpu.ops;
        float *dl = o->alloc(gpu.ctx, (size_t)(PER * V) * 4);
        int32_t *dt = o->alloc(gpu.ctx, PER * 4);
        struct backend_sample_row *dr = o->alloc(gpu.ctx, PER * sizeof *dr);
        struct backend_sample_adj *da = o->alloc(gpu.ctx, sizeof *da);
        assert_non_null(dl), assert_non_null(dt), assert_non_null(dr), assert_non_null(da);
        for (int r = 0; r < PER; r++) o->upload(gpu.ctx, dl + (long)r * V, l, (size_t)V * 4);
        long *count = xcalloc((size_t)V, sizeof *count);
        struct backend_sample_row pr[PER];
        int32_t tok[PER];
        for (int d = 0; d < DRAWS; d += PER) {
            for (int r = 0; r < PER; r++) {
                sp.seed = 0xC0FFEEull + (uint64_t)ci;
                params_of(&sp, (uint64_t)(d + r), &pr[r]);
                tok[r] = -7;
            }
            o->upload(gpu.ctx, dr, pr, sizeof pr);
            o->upload(gpu.ctx, dt, tok, sizeof tok);
            o->sample(gpu.ctx, dt, dl, V, PER, V, dr, da);
            o->download(gpu.ctx, tok, dt, sizeof tok);
            for (int r = 0; r < PER; r++) {
                if (tok[r] < 0 || tok[r] >= V || !(w[tok[r]] > 0))
                    fail_msg("%s: drew %d, outside the kept set", cases[ci].what, tok[r]);
                count[tok[r]]++;
            }
        }
        /* bins: tokens with expected >= 5 alone, the rest together */
        double chi = 0, rest_e = 0, rest_o = 0;
        int bins = 0;
        for (long i = 0; i < V; i++) {
            if (!(w[i] > 0)) continue;
            double e = DRAWS * (double)w[i] / z;
            if (e >= 5) {
                chi += (count[i] - e) * (count[i] - e) / e;
                bins++;
            } else {
                rest_e += e, rest_o += (double)count[i];
            }
        }
        if (rest_e >= 5) {
            chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
            bins++;
        } else if (rest_o > 3 * rest_e + 10) {
            fail_msg("%s: %g draws in tokens expected %g times", cases[ci].what, rest_o, rest_e);
        }
        int df = bins - 1;
        double crit = df > 0 ? chi2_crit(df, z4) : 0;
        /* the most likely token, for the log */
        double *ps = xmalloc((size_t)V * sizeof *ps);
        long nk = 0;
        for (long i = 0; i < V; i++)
            if (w[i] > 0) ps[nk++] = (double)w[i] / z;
        qsort(ps, (size_t)nk, sizeof *ps, cmp_desc_d);
        printf("  draw %s: %d draws over %ld kept tokens (top p %.3f), %d bins, chi2 %.1f (df %d, "
               "p=1e-4 bound %.1f)\n", cases[ci].what, DRAWS, nk, nk ? ps[0] : 0.0, bins, chi, df, crit);
        if (df > 0 && chi > crit) fail_msg("%s: chi-square %.1f above %.1f", cases[ci].what, chi, crit);
        o->free(gpu.ctx, dl), o->free(gpu.ctx, dt), o->free(gpu.ctx, dr), o->free(gpu.ctx, da);
        free(l), free(w), free(scratch), free(count), free(ps);
    }
}

/* ---- batch invariance ---------------------------------------------------------- */

static void test_batch_invariance(void **state) {
    (void)state;
    NEED_GPU();
    enum { N = 64 };
    const long V = 151936;
    float *rows = xmalloc((size_t)(N * V) * 4), *batch = xmalloc((size_t)(N * V) * 4);
    struct backend_sample_row pr[N], bp[N];
    struct backend_sample_adj *adj = xmalloc((size_t)N * 64 * sizeof *adj), *badj = xmalloc((size_t)N * 64 * sizeof *badj);
    int32_t *slot = xmalloc((size_t)V * 4);
    for (long i = 0; i < V; i++) slot[i] = -1;
    int32_t alone[N], tok[N];
    int n_adj = 0;
    for (int r = 0; r < N; r++) {
        gen_row(rows + r * V, V, r % ROW_KINDS);
        struct sampling_params sp;
        sampling_params_default(&sp);
        const struct kept_cfg c = {(float)(0.5 + (r % 5) * 0.3), (int[]){0, 40, 0, 2000, 5}[r % 5],
                                   (float[]){1, 0.9f, 0.5f, 1, 0.95f}[r % 5], r % 3 == 2 ? 0.05f : 0};
        sp.temperature = r % 9 == 0 ? 0 : c.t, sp.top_k = c.k, sp.top_p = c.p, sp.min_p = c.min_p;
        sp.seed = (uint64_t)r * 0x9e3779b9ull, sp.repetition_penalty = r % 4 == 0 ? 1.2f : 1.0f;
        int32_t prompt[16];
        for (int k = 0; k < 16; k++) prompt[k] = (int32_t)(rnext() % (uint64_t)V);
        struct sampler_state *st = sampler_state_create((int)V, prompt, 16);
        int k = sampler_build_adjustments(&sp, st, NULL, 0, (int)V, adj + n_adj, 64, slot);
        assert_true(k >= 0);
        params_of(&sp, (uint64_t)(r * 3), &pr[r]);
        pr[r].adj_start = n_adj, pr[r].n_adj = k;
        n_adj += k;
        sampler_state_free(st);
        /* alone (its adjustments at offset 0) */
        struct backend_sample_row one = pr[r];
        one.adj_start = 0;
        dev_sample(&gpu, rows + r * V, V, 1, V, &one, adj + pr[r].adj_start, k, &alone[r], NULL, NULL);
    }
    const int sizes[] = {2, 3, 7, 16, 33, 64};
    long compared = 0;
    for (int si = 0; si < 6; si++) {
        int n = sizes[si];
        for (int rep = 0; rep < 3; rep++) {
            /* a random selection of rows at random positions */
            int pick[N], nb = 0;
            for (int i = 0; i < n; i++) pick[i] = (int)(rnext() % N);
            if (n == N)
                for (int i = 0; i < N; i++) pick[i] = (i * 37 + rep * 11) % N;
            for (int i = 0; i < n; i++) {
                memcpy(batch + (long)i * V, rows + (long)pick[i] * V, (size_t)V * 4);
                bp[i] = pr[pick[i]];
                bp[i].adj_start = nb;
                memcpy(badj + nb, adj + pr[pick[i]].adj_start, (size_t)pr[pick[i]].n_adj * sizeof *adj);
                nb += pr[pick[i]].n_adj;
            }
            dev_sample(&gpu, batch, V, n, V, bp, badj, nb, tok, NULL, NULL);
            for (int i = 0; i < n; i++) {
                if (tok[i] != alone[pick[i]])
                    fail_msg("row %d at position %d of %d: %d, alone %d", pick[i], i, n, tok[i], alone[pick[i]]);
                compared++;
            }
        }
    }
    printf("  batch invariance: %ld placements of 64 rows in batches of 2..64 gave their tokens alone\n",
           compared);
    free(rows), free(batch), free(adj), free(badj), free(slot);
}

int main(void) {
    gpu_open("test_cuda_sample");
    const char *seed = getenv("KILN_TEST_SEED");
    if (seed) rs = strtoull(seed, NULL, 0) | 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),    cmocka_unit_test(test_adjustments),
        cmocka_unit_test(test_kept_sets), cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_grammar_mask),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_close();
    return rc;
}
