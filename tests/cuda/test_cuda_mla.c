/* test_cuda_mla.c — the absorbed-MLA operations on the GPU: matmul_heads
 * (every head's product in one operation) and the MLA decode attention
 * kernel (cuda_attn_mla.cu), against the CPU backend and against
 * themselves (per-head products, other batches, graph replays). Random
 * inputs, fresh per run (KILN_TEST_SEED repeats one); outputs poisoned with
 * NaN first, so an element a kernel forgot to write fails.
 *
 * matmul_heads at DeepSeek's shapes (q_nope·W_UK: [128] → [512] per head,
 * rows written into 576-wide heads; att·W_UV: [512] → [128] per head,
 * W_UV a strided view into kv_b_proj), 16 and 128 heads:
 *   - against one cuda matmul per head: bit for bit on the GEMV rows (n ≤ 8),
 *     in --deterministic mode (every n) and in bf16x2 mode at GEMV rows;
 *     above the GEMV the batched cuBLAS product has the same 16-bit
 *     operands and fp32 sums in its own order: within 1e-5 relative;
 *   - against the CPU: 1e-5 where the activations stay fp32 (GEMV, bf16x2),
 *     1e-2 where they are rounded to bf16 (2^-9 per element; the budget
 *     test_cuda_ops gives cuBLAS);
 *   - the columns between heads (q2's rope part) stay untouched;
 *   - fp32 weights (kv_b_proj of an FP8 checkpoint, dequantized at load):
 *     one strided-batched fp32 cuBLAS product, within 1e-5 of the per-head
 *     products and of the CPU.
 *
 * MLA decode attention (dk 576, dv 512, V inside K, one KV head, bf16
 * cache; the CPU gets the same rounded cache): q (pre-scaled) and p are
 * rounded to bf16, each a relative 2^-9 = 2e-3 per element with fp32 sums.
 * The output is Σ p̃_j v_j / Σ p̃_j with p̃ within 2^-8 of exact (p's
 * rounding plus the scores' shift from q's), so it moves by a random walk
 * of those relative errors over V rows of unit size: ~1e-3 of ‖o‖
 * expected, 1e-2 allowed (as test_cuda_ops allows any bf16 attention; a
 * wrong head, position, page or column gives errors near 1). Rows of
 * multi-token sequences in the same batch keep the fp32 split kernel: 1e-5.
 * Bit for bit: a decode row alone against the same row in batches of 1 to
 * 64 sequences of other contexts (slots and the split change with the
 * batch), page sizes 1 and 16, contexts across tile (64) and chunk (256)
 * edges up to 8000; and graph replays against eager runs.
 *
 * Label gpu; fails without a GPU. */
#include <math.h>
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
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

enum { MAX_TOKENS = 512, MAX_CONTEXT = 8192, MAX_HEADS = 128, DK = 576, DV = 512 };

static struct backend gpu_det;   /* backend_options.deterministic */
static struct backend gpu_split; /* KILN_CUDA_MATMUL=bf16x2 */

static float *fetch(const struct backend *be, const struct pair *p) {
    float *g = xmalloc(p->bytes + 4);
    be->ops->download(be->ctx, g, p->d, p->bytes);
    return g;
}

/* ‖a − b‖ / ‖b‖ over rows of H heads of `width` floats at head stride hs
 * (row stride H·hs); NaN fails. */
static double heads_err(const float *a, const float *b, long n, int H, long hs, long width) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++)
        for (int h = 0; h < H; h++)
            for (long k = 0; k < width; k++) {
                long at = (i * H + h) * hs + k;
                if (isnan(a[at]) || isnan(b[at])) fail_msg("NaN at row %ld head %d col %ld", i, h, k);
                num += ((double)a[at] - b[at]) * ((double)a[at] - b[at]);
                den += (double)b[at] * b[at];
            }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- matmul_heads ---------------------------------------------------------- */

/* H heads of [rows][cols], the head's matrix `head_rows` rows apart in a
 * [H·head_rows][cols] tensor, starting off_rows rows in (W_UV inside
 * kv_b_proj); x head stride hx, y head stride hy (≥ rows). */
static void check_heads(struct backend *be, const char *mode, int H, long rows, long cols,
                        long head_rows, long off_rows, long hx, long hy, long n, enum dtype dt) {
    struct wpair w = weight_rand(dt, H * head_rows, cols, 1.0f / sqrtf((float)cols));
    const size_t es = dtype_size(dt), off = (size_t)(off_rows * cols) * es;
    struct backend_weight wc = {.data = (const char *)w.c.data + off, .dtype = dt, .rows = rows, .cols = cols},
                          wg = {.data = (const char *)w.g.data + off, .dtype = dt, .rows = rows, .cols = cols};
    long w_stride = head_rows * cols, ldx = H * hx, ldy = H * hy;
    struct pair x = pair_rand((size_t)(n * ldx), 1.0f), y = pair_poison((size_t)(n * ldy)),
                y1 = pair_poison((size_t)(n * ldy));
    be->ops->matmul_heads(be->ctx, y.d, ldy, hy, x.d, ldx, hx, &wg, w_stride, H, n);
    for (int h = 0; h < H; h++) { /* the per-head reference on the same backend */
        struct backend_weight wh = wg;
        wh.data = (const char *)wg.data + (size_t)(h * w_stride) * es;
        be->ops->matmul(be->ctx, (float *)y1.d + h * hy, ldy, (const float *)x.d + h * hx, ldx, &wh,
                        NULL, n);
    }
    cpu.ops->matmul_heads(cpu.ctx, y.h, ldy, hy, x.h, ldx, hx, &wc, w_stride, H, n);
    be->ops->synchronize(be->ctx);
    float *g = fetch(be, &y), *g1 = fetch(be, &y1);
    struct cuda_ctx *c = be->ctx;
    int f32 = dt == DTYPE_F32, gemv = !f32 && n <= c->gemv_max_rows, det = c->deterministic,
        x2 = c->split_act;
    int exact = gemv || det;
    double e_self = heads_err(g, g1, n, H, hy, rows), e_cpu = heads_err(g, y.h, n, H, hy, rows);
    /* fp32 activations (the GEMV, bf16x2, fp32 weights on cuBLAS's fp32
     * product) are fp32-grade; the deterministic kernel and cuBLAS on
     * 16-bit weights round the activations to bf16 */
    double tol_cpu = (gemv && !det) || x2 || (f32 && !det) ? 1e-5 : 1e-2;
    printf("  matmul_heads %-13s %s H=%3d %4ldx%-4ld n=%3ld: vs per-head %s %.3g, vs CPU %.3g (tol %.0e)\n",
           mode, f32 ? "f32 " : "bf16", H, rows, cols, n, exact ? "(bitwise)" : "", e_self, e_cpu, tol_cpu);
    if (exact) assert_memory_equal(g, g1, (size_t)(n * ldy) * 4);
    else assert_true(e_self <= 1e-5);
    assert_true(e_cpu <= tol_cpu);
    for (long i = 0; i < n; i++) /* between heads: untouched */
        for (int h = 0; h < H; h++)
            for (long k = rows; k < hy; k++) assert_true(isnan(g[(i * H + h) * hy + k]));
    free(g), free(g1);
    pair_free(&x), pair_free(&y), pair_free(&y1);
    weight_free(&w);
}

static void test_matmul_heads(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const long ns[] = {1, 2, 5, 8, 9, 33, 64, 200};
    struct {
        struct backend *be;
        const char *name;
    } modes[] = {{&gpu, "default"}, {&gpu_det, "deterministic"}, {&gpu_split, "bf16x2"}};
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < 8; i++) {
            int H = i == 3 ? 128 : 16;
            /* q_nope [128] → latent [512] into heads of 576 (q2), x heads of 192 */
            check_heads(modes[m].be, modes[m].name, H, 512, 128, 512, 0, 192, 576, ns[i], DTYPE_BF16);
            /* latent [512] → v [128]: W_UV rows 128..255 of each head's 256 */
            check_heads(modes[m].be, modes[m].name, H, 128, 512, 256, 128, 512, 128, ns[i], DTYPE_BF16);
            /* fp32 weights: kv_b_proj of an FP8 checkpoint (model/deepseek.c) */
            if (i % 2 == 0) {
                check_heads(modes[m].be, modes[m].name, H, 512, 128, 512, 0, 192, 576, ns[i], DTYPE_F32);
                check_heads(modes[m].be, modes[m].name, H, 128, 512, 256, 128, 512, 128, ns[i], DTYPE_F32);
            }
        }
}

/* ---- MLA decode attention --------------------------------------------------- */

/* A batch of n_seqs sequences (len[s] positions, the last nw[s] new) over
 * a shuffled pool of pages; random q (row stride ldq). */
struct mla_case {
    int H, page_size, n_seqs, n_tokens;
    long ldq, ldo;
    struct pair kc, q, o, pos, qs, pst, pages;
    int32_t *h_qs;
};

static void mla_case_make(struct mla_case *mc, int H, int page_size, const int *len, const int *nw,
                          int n_seqs, long ldq_pad) {
    memset(mc, 0, sizeof *mc);
    int n_tokens = 0, total = 0;
    for (int s = 0; s < n_seqs; s++) n_tokens += nw[s], total += (len[s] + page_size - 1) / page_size;
    int pool = total + 5;
    /* the cache: bf16 on the GPU, the same rounded values on the CPU */
    size_t elems = (size_t)pool * page_size * DK;
    float *v = rand_floats(elems, 1.0f);
    uint16_t *b = xmalloc(elems * 2 + 2);
    for (size_t i = 0; i < elems; i++) b[i] = f32_to_bf16(v[i]), v[i] = bf16_to_f32(b[i]);
    mc->kc = (struct pair){v, gpu.ops->alloc(gpu.ctx, elems * 2), elems * 2};
    assert_non_null(mc->kc.d);
    gpu.ops->upload(gpu.ctx, mc->kc.d, b, elems * 2);
    gpu.ops->synchronize(gpu.ctx);
    free(b);
    int32_t *perm = xmalloc((size_t)pool * 4), *pos = xmalloc((size_t)n_tokens * 4),
            *qs = xmalloc((size_t)(n_seqs + 1) * 4), *pst = xmalloc((size_t)(n_seqs + 1) * 4);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int t = 0, pg = 0;
    for (int s = 0; s < n_seqs; s++) {
        qs[s] = t, pst[s] = pg;
        pg += (len[s] + page_size - 1) / page_size;
        for (int p = len[s] - nw[s]; p < len[s]; p++) pos[t++] = p;
    }
    qs[n_seqs] = t, pst[n_seqs] = pg;
    mc->H = H, mc->page_size = page_size, mc->n_seqs = n_seqs, mc->n_tokens = n_tokens;
    mc->ldq = (long)H * DK + ldq_pad, mc->ldo = (long)H * DV + (ldq_pad ? 2 : 0);
    mc->pos = pair_from(pos, (size_t)n_tokens * 4);
    mc->qs = pair_from(qs, (size_t)(n_seqs + 1) * 4);
    mc->pst = pair_from(pst, (size_t)(n_seqs + 1) * 4);
    mc->pages = pair_from(perm, (size_t)pg * 4);
    mc->q = pair_rand((size_t)(n_tokens * mc->ldq), 1.0f);
    mc->o = pair_poison((size_t)(n_tokens * mc->ldo));
    mc->h_qs = qs;
    free(perm), free(pos), free(pst);
}

static void mla_case_free(struct mla_case *mc) {
    struct pair *all[] = {&mc->kc, &mc->q, &mc->o, &mc->pos, &mc->qs, &mc->pst, &mc->pages};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    free(mc->h_qs);
}

static struct attn_params mla_params(int H) {
    /* DeepSeek's scale: 1/sqrt(qk_nope + rope) = 1/sqrt(192) */
    return (struct attn_params){.n_heads = H, .n_kv_heads = 1, .dk = DK, .dv = DV, .k_stride = DK,
                                .v_stride = DK, .scale = 1.0f / sqrtf(192.0f)};
}

static struct backend_batch mla_batch(const struct mla_case *mc, int on_gpu) {
    return on_gpu ? (struct backend_batch){mc->n_tokens, mc->n_seqs, mc->page_size, mc->pos.d,
                                           mc->qs.d, mc->pst.d, mc->pages.d}
                  : (struct backend_batch){mc->n_tokens, mc->n_seqs, mc->page_size,
                                           (int32_t *)mc->pos.h, (int32_t *)mc->qs.h,
                                           (int32_t *)mc->pst.h, (int32_t *)mc->pages.h};
}

static void check_mla(int H, int page_size, const int *len, const int *nw, int n_seqs, long ldq_pad) {
    struct mla_case mc;
    mla_case_make(&mc, H, page_size, len, nw, n_seqs, ldq_pad);
    struct attn_params p = mla_params(H);
    struct backend_batch bc = mla_batch(&mc, 0), bg = mla_batch(&mc, 1);
    struct cuda_ctx *c = gpu.ctx;
    long calls = c->mla_decode_calls;
    cpu.ops->attention(cpu.ctx, mc.o.h, mc.ldo, mc.q.h, mc.ldq, mc.kc.h, mc.kc.h, &p, &bc);
    gpu.ops->attention(gpu.ctx, mc.o.d, mc.ldo, mc.q.d, mc.ldq, mc.kc.d, mc.kc.d, &p, &bg);
    gpu.ops->synchronize(gpu.ctx);
    float *g = fetch(&gpu, &mc.o);
    double num[2] = {0, 0}, den[2] = {0, 0};
    int rows[2] = {0, 0};
    for (int s = 0; s < n_seqs; s++) {
        int dec = nw[s] == 1;
        rows[dec] += nw[s];
        for (int t = mc.h_qs[s]; t < mc.h_qs[s + 1]; t++)
            for (long k = 0; k < (long)H * DV; k++) {
                double a = g[t * mc.ldo + k], b = mc.o.h[t * mc.ldo + k];
                if (isnan(a)) fail_msg("NaN at token %d col %ld", t, k);
                num[dec] += (a - b) * (a - b), den[dec] += b * b;
            }
    }
    double e_dec = rows[1] ? sqrt(num[1] / den[1]) : 0, e_pre = rows[0] ? sqrt(num[0] / den[0]) : 0;
    printf("  mla H=%3d page=%2d seqs=%2d: %3d decode rows rel err %.3g (tol 1e-2), %3d prefill rows "
           "%.3g (tol 1e-5)\n",
           H, page_size, n_seqs, rows[1], e_dec, rows[0], e_pre);
    assert_true(e_dec <= 1e-2);
    assert_true(e_pre <= 1e-5);
    assert_int_equal(c->mla_decode_calls - calls, rows[1] && !(n_seqs == 1 && mc.n_tokens > 1) ? 1 : 0);
    free(g);
    mla_case_free(&mc);
}

static void test_mla_decode(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    assert_int_equal(backend_kv_dtype(&gpu), DTYPE_BF16);
    /* contexts around the 64-position tiles and 256-position chunks */
    int len[] = {1, 2, 63, 64, 65, 255, 256, 257, 511, 513, 1000, 4097, 8000};
    int nw[13];
    for (int i = 0; i < 13; i++) nw[i] = 1;
    int pss[] = {1, 7, 16, 64};
    for (int i = 0; i < 4; i++) check_mla(16, pss[i], len, nw, 13, 0);
    check_mla(128, 16, len, nw, 13, 4); /* V3: 8 head blocks; padded rows */
    check_mla(20, 16, len, nw, 13, 0);  /* a partial head block */
    /* decode rows mixed with prompt chunks (the split kernel's rows) */
    int mlen[] = {40, 300, 7, 1, 150, 2000}, mnw[] = {40, 1, 3, 1, 20, 1};
    check_mla(16, 16, mlen, mnw, 6, 0);
    int plen[] = {70}, pnw[] = {70}; /* one prompt: no decode rows */
    check_mla(16, 1, plen, pnw, 1, 0);
    /* 64 rows (one wave: no split) of random contexts */
    int blen[64], bnw[64];
    for (int i = 0; i < 64; i++) blen[i] = 1 + irand(MAX_CONTEXT / 2), bnw[i] = 1;
    check_mla(16, 16, blen, bnw, 64, 0);
}

/* A decode row alone against the same row (same pages, same q) as row
 * `who` of n sequences of other contexts. */
static void check_mla_invariance(int H, int page_size, int target, int n) {
    int pool_pages = 2048 / page_size + 64, maxp = (MAX_CONTEXT + page_size - 1) / page_size;
    int who = irand(n);
    long ldq = (long)H * DK, ldo = (long)H * DV;
    size_t elems = (size_t)pool_pages * page_size * DK;
    uint16_t *b = xmalloc(elems * 2);
    for (size_t i = 0; i < elems; i++) b[i] = f32_to_bf16(frand(1.0f));
    void *kc = gpu.ops->alloc(gpu.ctx, elems * 2);
    gpu.ops->upload(gpu.ctx, kc, b, elems * 2);
    int32_t *pos = xmalloc((size_t)n * 4), *qs = xmalloc((size_t)(n + 1) * 4),
            *pst = xmalloc((size_t)(n + 1) * 4), *pages = xmalloc((size_t)n * maxp * 4);
    int pg = 0;
    for (int s = 0; s < n; s++) {
        int len = s == who ? target : 1 + irand(MAX_CONTEXT);
        qs[s] = s, pos[s] = len - 1, pst[s] = pg;
        for (int i = 0; i < (len + page_size - 1) / page_size; i++) pages[pg++] = irand(pool_pages);
    }
    qs[n] = n, pst[n] = pg;
    struct pair pp = pair_from(pos, (size_t)n * 4), pq = pair_from(qs, (size_t)(n + 1) * 4),
                pps = pair_from(pst, (size_t)(n + 1) * 4), ppg = pair_from(pages, (size_t)pg * 4);
    int32_t one_pos = pos[who], one_qs[2] = {0, 1}, one_ps[2] = {0, pst[who + 1] - pst[who]};
    struct pair op = pair_from(&one_pos, 4), oq = pair_from(one_qs, 8), ops = pair_from(one_ps, 8),
                opg = pair_from(pages + pst[who], (size_t)one_ps[1] * 4);
    struct pair q = pair_rand((size_t)(n * ldq), 1.0f), o = pair_poison((size_t)(n * ldo)),
                o1 = pair_poison((size_t)ldo);
    struct attn_params p = mla_params(H);
    struct backend_batch bn = {n, n, page_size, pp.d, pq.d, pps.d, ppg.d},
                         b1 = {1, 1, page_size, op.d, oq.d, ops.d, opg.d};
    gpu.ops->attention(gpu.ctx, o.d, ldo, q.d, ldq, kc, kc, &p, &bn);
    gpu.ops->attention(gpu.ctx, o1.d, ldo, (float *)q.d + who * ldq, ldq, kc, kc, &p, &b1);
    float *gn = fetch(&gpu, &o), *g1 = fetch(&gpu, &o1);
    for (long e = 0; e < ldo; e++) assert_false(isnan(g1[e]));
    if (memcmp(gn + who * ldo, g1, (size_t)ldo * 4))
        fail_msg("H=%d page=%d context %d: alone differs from row %d of %d", H, page_size, target, who, n);
    free(gn), free(g1), free(pos), free(qs), free(pst), free(pages), free(b);
    gpu.ops->free(gpu.ctx, kc);
    struct pair *all[] = {&pp, &pq, &pps, &ppg, &op, &oq, &ops, &opg, &q, &o, &o1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

static void test_mla_decode_invariance(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const int targets[] = {1, 64, 257, 3001, 8000};
    const int pss[] = {1, 16};
    int runs = 0;
    for (int t = 0; t < 5; t++)
        for (int k = 0; k < 2; k++)
            for (int n = 1; n <= 64; n += (n < 8 ? 1 : 7)) {
                check_mla_invariance(16, pss[k], targets[t], n);
                runs++;
            }
    for (int n = 1; n <= 64; n += 21) check_mla_invariance(128, 16, 3001, n), runs++;
    printf("  mla decode: %d batches, a row's bits the same alone and in each\n", runs);
}

/* Recorded once, replayed with new q: the eager run's bits each time (the
 * split path's arrival counters are zero again after every launch). */
static void test_mla_graph_replay(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const int sizes[] = {1, 5, 64};
    for (int i = 0; i < 3; i++) {
        int n = sizes[i], len[64], nw[64];
        for (int s = 0; s < n; s++) len[s] = 1 + irand(MAX_CONTEXT), nw[s] = 1;
        struct mla_case mc;
        mla_case_make(&mc, 16, 16, len, nw, n, 0);
        struct attn_params p = mla_params(16);
        struct backend_batch bg = mla_batch(&mc, 1);
        size_t qbytes = mc.q.bytes, obytes = mc.o.bytes;
        gpu.ops->graph_begin(gpu.ctx);
        gpu.ops->attention(gpu.ctx, mc.o.d, mc.ldo, mc.q.d, mc.ldq, mc.kc.d, mc.kc.d, &p, &bg);
        void *graph = gpu.ops->graph_end(gpu.ctx);
        assert_non_null(graph);
        for (int r = 0; r < 3; r++) {
            float *qn = rand_floats(qbytes / 4, 1.0f);
            gpu.ops->upload(gpu.ctx, mc.q.d, qn, qbytes);
            assert_int_equal(gpu.ops->graph_launch(gpu.ctx, graph), 0);
            float *gr = fetch(&gpu, &mc.o);
            gpu.ops->attention(gpu.ctx, mc.o.d, mc.ldo, mc.q.d, mc.ldq, mc.kc.d, mc.kc.d, &p, &bg);
            float *ge = fetch(&gpu, &mc.o);
            for (size_t e = 0; e < obytes / 4; e++) assert_false(isnan(ge[e]));
            assert_memory_equal(gr, ge, obytes);
            free(qn), free(gr), free(ge);
        }
        printf("  mla graph n=%d: 3 replays, the eager bits each time\n", n);
        gpu.ops->graph_destroy(gpu.ctx, graph);
        mla_case_free(&mc);
    }
}

int main(void) {
    rng_seed("test_cuda_mla");
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    setenv("KILN_CUDA_GEMV_MAX_ROWS", "8", 0); /* the GEMV up to its design limit */
    knob_reload(NULL);
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_cuda_mla: %s; the tests below fail\n", err.msg);
    } else {
        struct backend_options bd = {.deterministic = 1};
        if (backend_create(&gpu_det, "cuda", &bd, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        setenv("KILN_CUDA_MATMUL", "bf16x2", 1);
        knob_reload(NULL);
        if (backend_create(&gpu_split, "cuda", &bo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        unsetenv("KILN_CUDA_MATMUL");
        knob_reload(NULL);
        struct backend *all[] = {&cpu, &gpu, &gpu_det, &gpu_split};
        for (int i = 0; i < 4; i++)
            if (all[i]->ops->reserve(all[i]->ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
                return fprintf(stderr, "reserve: %s\n", err.msg), 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_heads),
        cmocka_unit_test(test_mla_decode),
        cmocka_unit_test(test_mla_decode_invariance),
        cmocka_unit_test(test_mla_graph_replay),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) {
        backend_destroy(&gpu_split);
        backend_destroy(&gpu_det);
        backend_destroy(&gpu);
    }
    backend_destroy(&cpu);
    return rc;
}
