/* test_attn_features.c — the CUDA attention features against the CPU
 * backend (src/backend/cpu/cpu_attention.c, which implements each one):
 *   - the FP8 (e4m3) KV cache: kv_store / qk_rope_store / kv_gather
 *     against the CPU's bytes and values, and every attention path reading
 *     it (decode and prefill, page sizes 1 and 16, GQA, the MLA latent
 *     cache with V inside K's row), the CPU reading the same bytes;
 *   - sliding windows smaller than, equal to and larger than the context,
 *     chunked prefill whose chunk crosses the window's edge, on the bf16
 *     and FP8 caches;
 *   - attention sinks, with the split-KV decode paths at long context
 *     (several slots per row fold their chunk states; the sink joins once);
 *   - the q|k|v wgmma product's rope + K/V store epilogue on the FP8 cache
 *     (Hopper) against the same backend's product + qk_rope_store;
 *   - Gemma's gelu_tanh_mul and scale.
 * Each attention case runs on the default kernels (tensor cores where the
 * shape allows) and on the KILN_CUDA_ATTN=split and =scalar families.
 *
 * Tolerances (per output row, ‖gpu − cpu‖ / ‖cpu‖): the CPU reads the same
 * cache elements (the bf16-rounded values, or the same e4m3 bytes), so
 * only the kernels' arithmetic differs. Rows of multi-token sequences on
 * the tensor-core prefill kernels round q and the probabilities to bf16
 * (unit roundoff 2^-9 ≈ 2e-3; test_attn_prefill's argument): 1e-2. Every
 * other path is fp32-grade (the decode kernel's hi/lo split carries q and
 * p to 2^-17; the split and scalar kernels are fp32): 1e-4. A window or
 * sink bug moves a row by far more (a missing or extra key changes its
 * softmax weights by O(1/window)). Outputs are poisoned with NaN first.
 * The seed is printed (KILN_TEST_SEED to repeat). */
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
#include "cuda_test_attn.h"
#include "cuda_test_rng.h"

enum { MAX_TOKENS = 1024, MAX_CONTEXT = 4096, MAX_HEADS = 32 };

/* [fp8][family]: family 0 default, 1 KILN_CUDA_ATTN=split, 2 =scalar */
static struct backend cpu[2], gpu[2][3];
static struct backend gpu8w; /* FP8 cache, the wgmma product for any size and row count */
static int have_wgmma;
static int have_gpu;
static const char *const fam_name[3] = {"auto", "split", "scalar"};

struct acase {
    const char *name;
    int H, KVH, dk, dv, page_size, n_seqs;
    const int *len, *nw; /* context length after the step, new tokens */
    int window, sinks, mla; /* mla: V inside K's row (v_cache = k_cache), KVH 1 */
};

/* e4m3 decoding for the host-side expectations */
static float fp8_val(uint8_t q, float scale) { return fp8_e4m3_to_f32(q) * scale; }

static void check_rows(const char *what, const float *g, const float *c, long rows, long width,
                       long ld, double tol) {
    double worst = 0;
    for (long r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (long k = 0; k < width; k++) {
            double a = g[r * ld + k], b = c[r * ld + k];
            if (isnan(a) || isnan(b)) fail_msg("%s: NaN at row %ld col %ld (gpu %g cpu %g)", what, r, k, a, b);
            num += (a - b) * (a - b), den += b * b;
        }
        double e = sqrt(num / (den > 0 ? den : 1e-30));
        if (e > worst) worst = e;
        if (e > tol) fail_msg("%s: row %ld relative error %.3g > %.1g", what, r, e, tol);
    }
    printf("    %s: %ld rows, worst row %.3g, overall %.3g (tol %.0e)\n", what, rows, worst,
           rel_err(g, c, rows, width, ld), tol);
}

static void run_case(const struct acase *ac, int fp8) {
    int H = ac->H, KVH = ac->KVH, dk = ac->dk, dv = ac->dv, ps = ac->page_size, S = ac->n_seqs;
    int total = 0, n_tokens = 0, has_prefill = 0;
    int *np = xmalloc((size_t)S * sizeof(int)), *first = xmalloc((size_t)S * sizeof(int));
    for (int s = 0; s < S; s++) {
        np[s] = (ac->len[s] + ps - 1) / ps;
        total += np[s], n_tokens += ac->nw[s], first[s] = ac->len[s] - ac->nw[s];
        if (ac->nw[s] > 1) has_prefill = 1;
    }
    int pool = total + 7;
    int32_t *perm = xmalloc((size_t)pool * 4);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int32_t **sp = xmalloc((size_t)S * sizeof *sp);
    for (int s = 0, pg = 0; s < S; pg += np[s], s++) sp[s] = perm + pg;

    /* caches: K rows of KVH·dk, V rows of KVH·dv (MLA: V is K's first dv) */
    long ks = (long)KVH * dk, vs = ac->mla ? ks : (long)KVH * dv, slots = (long)pool * ps;
    size_t nk = (size_t)(slots * ks), nv = ac->mla ? 0 : (size_t)(slots * vs);
    float k_scale = fp8 ? 0.37f : 1.0f, v_scale = fp8 ? (ac->mla ? k_scale : 0.0125f) : 1.0f;
    void *kc_h, *vc_h, *kd, *vd;
    if (fp8) { /* the CPU reads the same bytes */
        uint8_t *k8 = xmalloc(nk + 1), *v8 = xmalloc(nv + 1);
        for (size_t i = 0; i < nk; i++) k8[i] = f32_to_fp8_e4m3(frand(1.0f) / k_scale);
        for (size_t i = 0; i < nv; i++) v8[i] = f32_to_fp8_e4m3(frand(1.0f) / v_scale);
        kd = dev_from(&gpu[1][0], k8, nk + 1), vd = ac->mla ? kd : dev_from(&gpu[1][0], v8, nv + 1);
        kc_h = k8, vc_h = ac->mla ? (void *)k8 : (void *)v8;
        if (ac->mla) free(v8);
    } else { /* bf16 on the GPU, its values in fp32 on the CPU */
        uint16_t *kb = xmalloc(nk * 2 + 2), *vb = xmalloc(nv * 2 + 2);
        float *kf = xmalloc(nk * 4 + 4), *vf = xmalloc(nv * 4 + 4);
        for (size_t i = 0; i < nk; i++) kb[i] = f32_to_bf16(frand(1.0f)), kf[i] = bf16_to_f32(kb[i]);
        for (size_t i = 0; i < nv; i++) vb[i] = f32_to_bf16(frand(1.0f)), vf[i] = bf16_to_f32(vb[i]);
        kd = dev_from(&gpu[0][0], kb, nk * 2 + 2);
        vd = ac->mla ? kd : dev_from(&gpu[0][0], vb, nv * 2 + 2);
        free(kb), free(vb);
        kc_h = kf, vc_h = ac->mla ? (void *)kf : (void *)vf;
        if (ac->mla) free(vf);
    }
    struct backend *dev = &gpu[fp8][0];
    long ldq = (long)H * dk + 4, ldo = (long)H * dv + 2;
    size_t nq = (size_t)n_tokens * (size_t)ldq;
    float *qh = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) qh[i] = frand(1.0f);
    float *dq = dev_from(dev, qh, nq * 4);
    float sinks_h[MAX_HEADS];
    for (int h = 0; h < H; h++) sinks_h[h] = frand(2.0f);
    float *dsinks = dev_from(dev, sinks_h, sizeof sinks_h);

    struct batch b;
    batch_make(dev, &b, ps, S, first, ac->nw, sp, np);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = dk, .dv = dv, .k_stride = ks,
                            .v_stride = vs, .scale = 1.0f / sqrtf((float)dk), .k_scale = k_scale,
                            .v_scale = v_scale, .window = ac->window,
                            .sinks = ac->sinks ? sinks_h : NULL};
    size_t no = (size_t)n_tokens * (size_t)ldo;
    float *ref = xmalloc(no * 4);
    for (size_t i = 0; i < no; i++) ref[i] = 0.0f;
    cpu[fp8].ops->attention(cpu[fp8].ctx, ref, ldo, qh, ldq, kc_h, vc_h, &p, &b.hb);
    p.sinks = ac->sinks ? dsinks : NULL;
    for (int f = 0; f < 3; f++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s page %d window %d%s [%s]", ac->name,
                 fp8 ? "fp8" : "bf16", ps, ac->window, ac->sinks ? " sinks" : "", fam_name[f]);
        float *out = run_gpu(dev, &gpu[fp8][f], &b, dq, ldq, ldo, kd, vd, &p);
        check_rows(what, out, ref, n_tokens, (long)H * dv, ldo, f == 0 && has_prefill ? 1e-2 : 1e-4);
        if (!has_prefill && S > 1 && f < 2) {
            /* decode batch invariance (the fixed chunking and fold order,
             * windows and sinks included): the last sequence alone gives
             * its row's bits in the batch, though the split differs */
            struct batch b1;
            int f1 = first[S - 1], n1 = 1;
            batch_make(dev, &b1, ps, 1, &f1, &n1, &sp[S - 1], &np[S - 1]);
            float *o1 = run_gpu(dev, &gpu[fp8][f], &b1, dq + (long)(n_tokens - 1) * ldq, ldq, ldo,
                                kd, vd, &p);
            char w1[200];
            snprintf(w1, sizeof w1, "%s: last row alone", what);
            expect_same_bits(w1, out + (long)(n_tokens - 1) * ldo, ldo, o1, ldo, 1, (long)H * dv);
            batch_free(dev, &b1);
            free(o1);
        }
        free(out);
    }
    batch_free(dev, &b);
    dev->ops->free(dev->ctx, dq), dev->ops->free(dev->ctx, dsinks);
    dev->ops->free(dev->ctx, kd);
    if (!ac->mla) dev->ops->free(dev->ctx, vd);
    free(kc_h);
    if (!ac->mla) free(vc_h);
    free(qh), free(ref), free(perm), free(sp), free(np), free(first);
}

/* the cases of one feature set, at page sizes 1 and 16 */
static void run_all(const struct acase *cases, int n, int fp8) {
    for (int i = 0; i < n; i++)
        for (int ps = 1; ps <= 16; ps += 15) {
            struct acase c = cases[i];
            c.page_size = ps;
            run_case(&c, fp8);
        }
}

/* decode rows (one new token) at short and long contexts; prefill chunks
 * after cached prefixes beside decode rows; GQA groups 1, 4 and 8 */
static const int dec_len[] = {1, 37, 300, 2100}, dec_nw[] = {1, 1, 1, 1};
static const int pre_len[] = {100, 333, 520, 64}, pre_nw[] = {100, 50, 1, 64};
static const int long_len[] = {3900}, long_nw[] = {1};
/* 40 decode rows x 4 KV heads: more CTAs than an SM count of 132 holds at
 * one an SM, so head size 128 takes the decode kernel's 2-warp variant */
static const int many_len[40] = {1, 9, 17, 33, 64, 65, 100, 127, 128, 129, 130, 200, 255, 256,
                                 257, 300, 301, 333, 400, 511, 512, 513, 600, 640, 700, 777,
                                 800, 900, 1000, 1023, 1024, 1025, 1100, 1200, 1300, 1400,
                                 1500, 1600, 1700, 1800};
static const int many_nw[40] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

static void test_fp8_attention(void **state) {
    (void)state;
    assert_true(have_gpu);
    const struct acase cases[] = {
        {"decode d128 gqa4", 8, 2, 128, 128, 0, 4, dec_len, dec_nw, 0, 0, 0},
        {"decode d64 mha", 4, 4, 64, 64, 0, 4, dec_len, dec_nw, 0, 0, 0},
        {"prefill d128 gqa8", 8, 1, 128, 128, 0, 4, pre_len, pre_nw, 0, 0, 0},
        {"prefill d64 gqa2", 4, 2, 64, 64, 0, 4, pre_len, pre_nw, 0, 0, 0},
        {"decode long d128", 8, 2, 128, 128, 0, 1, long_len, long_nw, 0, 0, 0},
        {"decode many d128", 8, 4, 128, 128, 0, 40, many_len, many_nw, 0, 0, 0},
        {"mla latent decode", 16, 1, 576, 512, 0, 4, dec_len, dec_nw, 0, 0, 1},
        {"mla latent prefill", 16, 1, 576, 512, 0, 4, pre_len, pre_nw, 0, 0, 1},
        {"head 256", 4, 2, 256, 256, 0, 4, pre_len, pre_nw, 0, 0, 0},
    };
    run_all(cases, (int)(sizeof cases / sizeof *cases), 1);
}

/* windows smaller than, equal to (eq_len: contexts of exactly the
 * window) and larger than the contexts; chunked prefill whose chunk
 * crosses the edge (333 − 50 = 283 positions cached, window 64: the
 * chunk's first rows still see part of the prefix, its later rows only
 * the chunk) */
static void test_window(void **state) {
    (void)state;
    assert_true(have_gpu);
    static const int eq_len[] = {300, 300}, eq_nw[] = {1, 300};
    for (int fp8 = 0; fp8 < 2; fp8++) {
        const struct acase cases[] = {
            {"decode d128 win 64", 8, 2, 128, 128, 0, 4, dec_len, dec_nw, 64, 0, 0},
            {"decode d64 win 200", 4, 4, 64, 64, 0, 4, dec_len, dec_nw, 200, 0, 0},
            {"decode d128 win 5000", 8, 2, 128, 128, 0, 4, dec_len, dec_nw, 5000, 0, 0},
            {"prefill d128 win 64", 8, 2, 128, 128, 0, 4, pre_len, pre_nw, 64, 0, 0},
            {"prefill d64 win 8", 4, 2, 64, 64, 0, 4, pre_len, pre_nw, 8, 0, 0},
            {"prefill d128 win 1", 4, 1, 128, 128, 0, 4, pre_len, pre_nw, 1, 0, 0},
            {"equal d128 win 300", 8, 2, 128, 128, 0, 2, eq_len, eq_nw, 300, 0, 0},
            {"long d128 win 1000", 8, 2, 128, 128, 0, 1, long_len, long_nw, 1000, 0, 0},
            {"many d128 win 300 sinks", 8, 4, 128, 128, 0, 40, many_len, many_nw, 300, 1, 0},
            {"head 32 win 8", 4, 2, 32, 32, 0, 4, pre_len, pre_nw, 8, 0, 0},
        };
        run_all(cases, (int)(sizeof cases / sizeof *cases), fp8);
    }
}

static void test_sinks(void **state) {
    (void)state;
    assert_true(have_gpu);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        const struct acase cases[] = {
            {"decode d64 sinks", 8, 1, 64, 64, 0, 4, dec_len, dec_nw, 0, 1, 0},
            {"long decode d128 sinks", 8, 2, 128, 128, 0, 1, long_len, long_nw, 0, 1, 0},
            {"long decode d64 sinks", 8, 8, 64, 64, 0, 1, long_len, long_nw, 0, 1, 0},
            {"prefill d64 sinks", 8, 1, 64, 64, 0, 4, pre_len, pre_nw, 0, 1, 0},
            {"prefill d128 win 128 sinks", 8, 2, 128, 128, 0, 4, pre_len, pre_nw, 128, 1, 0},
            {"long d64 win 128 sinks", 8, 1, 64, 64, 0, 1, long_len, long_nw, 128, 1, 0},
            {"mla sinks", 16, 1, 576, 512, 0, 4, pre_len, pre_nw, 0, 1, 1},
        };
        run_all(cases, (int)(sizeof cases / sizeof *cases), fp8);
    }
}

/* kv_store: the e4m3 bytes of x / scale, exactly the CPU's (host
 * f32_to_fp8_e4m3); kv_gather: fp8 · scale exactly; qk_rope_store: keys
 * and values within one e4m3 step of the CPU's (the rotation's fp32
 * roundings may differ in the last bit and move a tie) */
static void test_fp8_store(void **state) {
    (void)state;
    assert_true(have_gpu);
    struct backend *g = &gpu[1][0], *c = &cpu[1];
    enum { N = 37, W = 576, SLOTS = 64 };
    float *src = xmalloc(N * W * 4);
    for (int i = 0; i < N * W; i++) src[i] = frand(i % 7 == 0 ? 2000.0f : 3.0f); /* some saturate */
    src[5] = 0.0f, src[6] = 1e-6f, src[7] = -448.0f * 0.5f;
    int32_t slot_h[N];
    for (int i = 0; i < N; i++) slot_h[i] = (i * 7 + 3) % SLOTS;
    float scale = 0.75f;
    uint8_t *cache = xmalloc(SLOTS * W);
    memset(cache, 0, SLOTS * W);
    void *dcache = dev_from(g, cache, SLOTS * W);
    float *dsrc = dev_from(g, src, N * W * 4);
    int32_t *dslot = dev_from(g, slot_h, sizeof slot_h);
    g->ops->kv_store(g->ctx, dcache, W, dsrc, W, W, dslot, N, scale);
    g->ops->synchronize(g->ctx);
    uint8_t *got = xmalloc(SLOTS * W);
    g->ops->download(g->ctx, got, dcache, SLOTS * W);
    c->ops->kv_store(c->ctx, cache, W, src, W, W, slot_h, N, scale);
    for (int i = 0; i < SLOTS * W; i++)
        if (got[i] != cache[i])
            fail_msg("kv_store fp8: byte %d gpu %#x cpu %#x", i, got[i], cache[i]);
    printf("    kv_store fp8: %d rows, same bytes as the CPU\n", N);

    /* kv_gather of positions 3.. of a page list */
    int32_t pages_h[SLOTS / 4];
    for (int i = 0; i < SLOTS / 4; i++) pages_h[i] = (i * 5 + 2) % (SLOTS / 4);
    int32_t *dpages = dev_from(g, pages_h, sizeof pages_h);
    long n = 40;
    float *gg = xmalloc((size_t)n * W * 4);
    for (long i = 0; i < n * W; i++) gg[i] = NAN;
    float *dg = dev_from(g, gg, (size_t)n * W * 4);
    g->ops->kv_gather(g->ctx, dg, W, dcache, W, W, dpages, 4, 3, n, scale);
    g->ops->synchronize(g->ctx);
    g->ops->download(g->ctx, gg, dg, (size_t)n * W * 4);
    for (long i = 0; i < n; i++) {
        long p = 3 + i, slot = (long)pages_h[p / 4] * 4 + p % 4;
        for (int k = 0; k < W; k++) {
            float want = fp8_val(cache[slot * W + k], scale);
            if (memcmp(&want, &gg[i * W + k], 4))
                fail_msg("kv_gather fp8: row %ld col %d gpu %g want %g", i, k, gg[i * W + k], want);
        }
    }
    printf("    kv_gather fp8: %ld rows exact\n", n);

    /* qk_rope_store: Llama shape, 4 heads, 2 KV heads of 64 */
    enum { T = 9, HQ = 4, HK = 2, HD = 64 };
    long ld = (HQ + 2 * HK) * HD;
    float *qkv = xmalloc(T * ld * 4), *cos_sin = xmalloc(64 * (HD / 2) * 2 * 4);
    for (long i = 0; i < T * ld; i++) qkv[i] = frand(4.0f);
    for (int pp = 0; pp < 64; pp++)
        for (int d = 0; d < HD / 2; d++) {
            float th = (float)pp * powf(10000.0f, -2.0f * d / HD);
            cos_sin[(pp * (HD / 2) + d) * 2] = cosf(th), cos_sin[(pp * (HD / 2) + d) * 2 + 1] = sinf(th);
        }
    int32_t pos_h[T], rs_h[T];
    for (int i = 0; i < T; i++) pos_h[i] = 5 * i + 1, rs_h[i] = (3 * i + 1) % 16;
    long kvw = HK * HD;
    uint8_t *kc = xmalloc(16 * kvw), *vc = xmalloc(16 * kvw), *kg = xmalloc(16 * kvw), *vg = xmalloc(16 * kvw);
    memset(kc, 0, 16 * kvw), memset(vc, 0, 16 * kvw);
    void *dkc = dev_from(g, kc, 16 * kvw), *dvc = dev_from(g, vc, 16 * kvw);
    float *dqkv = dev_from(g, qkv, T * ld * 4), *dcs = dev_from(g, cos_sin, 64 * HD * 4);
    int32_t *dpos = dev_from(g, pos_h, sizeof pos_h), *drs = dev_from(g, rs_h, sizeof rs_h);
    struct backend_rope_store r = {HQ, HK, HD, NULL, NULL, 1e-6f, HD, dpos, dcs, 0, dkc, dvc, kvw,
                                   drs, 0.5f, 0.02f};
    g->ops->qk_rope_store(g->ctx, dqkv, dqkv + HQ * HD, dqkv + (HQ + HK) * HD, ld, T, &r);
    g->ops->synchronize(g->ctx);
    g->ops->download(g->ctx, kg, dkc, 16 * kvw), g->ops->download(g->ctx, vg, dvc, 16 * kvw);
    struct backend_rope_store rc = r;
    rc.pos = pos_h, rc.cos_sin = cos_sin, rc.k_cache = kc, rc.v_cache = vc, rc.slots = rs_h;
    c->ops->qk_rope_store(c->ctx, qkv, qkv + HQ * HD, qkv + (HQ + HK) * HD, ld, T, &rc);
    for (long i = 0; i < 16 * kvw; i++) {
        /* one e4m3 step: 2^-3 of the magnitude (normals), 2^-9 (subnormals) */
        double a = fp8_val(kg[i], 0.5f), e = fp8_val(kc[i], 0.5f);
        if (fabs(a - e) > fmax(fabs(a), fabs(e)) * 0.125 + 0.5 * 0x1p-9)
            fail_msg("qk_rope_store fp8 K: element %ld gpu %#x cpu %#x", i, kg[i], kc[i]);
        if (vg[i] != vc[i]) fail_msg("qk_rope_store fp8 V: element %ld gpu %#x cpu %#x", i, vg[i], vc[i]);
    }
    printf("    qk_rope_store fp8: keys within one e4m3 step, values the same bytes\n");

    g->ops->free(g->ctx, dcache), g->ops->free(g->ctx, dsrc), g->ops->free(g->ctx, dslot);
    g->ops->free(g->ctx, dpages), g->ops->free(g->ctx, dg), g->ops->free(g->ctx, dkc);
    g->ops->free(g->ctx, dvc), g->ops->free(g->ctx, dqkv), g->ops->free(g->ctx, dcs);
    g->ops->free(g->ctx, dpos), g->ops->free(g->ctx, drs);
    free(src), free(cache), free(got), free(gg), free(qkv), free(cos_sin);
    free(kc), free(vc), free(kg), free(vg);
}

/* norm_matmul_rope through the wgmma epilogue (head size 128, 13 rows,
 * q|k|v bias) against norm_matmul + qk_rope_store on the same backend:
 * values the same e4m3 bytes (the same sums, the same conversion), keys
 * within one e4m3 step (the rotation's roundings are spelled out in both
 * but may differ in the last bit), queries within 1e-6. */
static void test_fp8_rope_epilogue(void **state) {
    (void)state;
    assert_true(have_gpu);
    if (!have_wgmma) fail_msg("the wgmma product is off here (it needs compute capability 9.0 and a Hopper build)");
    struct backend *be = &gpu8w;
    const struct backend_ops *ops = be->ops;
    struct cuda_ctx *cc = be->ctx;
    enum { n = 13, H = 8, KH = 2, hd = 128, d = 1024, slots = 64, maxpos = 256 };
    const long N = (long)(H + 2 * KH) * hd, kw = KH * hd;
    uint16_t *w = xmalloc((size_t)(N * d) * 2);
    for (long i = 0; i < N * d; i++) w[i] = f32_to_bf16(frand(1.0f / 32.0f));
    float *h = xmalloc(n * d * 4), *nw = xmalloc(d * 4), *bias = xmalloc((size_t)N * 4),
          *cs = xmalloc(maxpos * 64 * 2 * 4);
    for (long i = 0; i < n * d; i++) h[i] = frand(2.0f);
    for (long i = 0; i < d; i++) nw[i] = 1.0f + frand(0.3f);
    for (long i = 0; i < N; i++) bias[i] = frand(0.5f);
    for (int p = 0; p < maxpos; p++)
        for (int i = 0; i < 64; i++) {
            double th = p * pow(500000.0, -2.0 * i / 128.0);
            cs[(p * 64 + i) * 2] = (float)cos(th), cs[(p * 64 + i) * 2 + 1] = (float)sin(th);
        }
    int32_t pos[n], slot[n];
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(rng_next() % maxpos), slot[i] = (i * 37 + 5) % slots;
    struct backend_weight bw = {.data = ops->weight_upload(be->ctx, w, (size_t)(N * d) * 2),
                                .dtype = DTYPE_BF16, .rows = N, .cols = d};
    float *dh = dev_from(be, h, n * d * 4), *dnw = dev_from(be, nw, d * 4);
    float *db = dev_from(be, bias, (size_t)N * 4), *dcs = dev_from(be, cs, maxpos * 64 * 2 * 4);
    float *dx = ops->alloc(be->ctx, n * d * 4);
    int32_t *dpos = dev_from(be, pos, sizeof pos), *dslot = dev_from(be, slot, sizeof slot);
    size_t cb = (size_t)(slots * kw);
    float *y[2];
    void *kc[2], *vc[2];
    for (int k = 0; k < 2; k++) {
        y[k] = ops->alloc(be->ctx, (size_t)(n * N) * 4);
        kc[k] = ops->alloc(be->ctx, cb), vc[k] = ops->alloc(be->ctx, cb);
    }
    struct backend_norm nm = {.h = dh, .delta = NULL, .x = dx, .w = dnw, .dim = d, .eps = 1e-5f};
    struct backend_rope_store r = {.n_heads = H, .n_kv_heads = KH, .head_dim = hd, .eps = 1e-6f,
                                   .rot_dim = hd, .pos = dpos, .cos_sin = dcs, .kv_stride = kw,
                                   .slots = dslot, .k_scale = 0.25f, .v_scale = 0.05f};
    long f0 = cc->rope_fused;
    r.k_cache = kc[0], r.v_cache = vc[0];
    ops->norm_matmul_rope(be->ctx, &nm, y[0], N, &(struct backend_stack){.cat = bw}, db, n, &r);
    long ran = cc->rope_fused - f0;
    ops->norm_matmul(be->ctx, &nm, y[1], N, &bw, db, n);
    r.k_cache = kc[1], r.v_cache = vc[1];
    ops->qk_rope_store(be->ctx, y[1], y[1] + H * hd, y[1] + H * hd + kw, N, n, &r);
    float *yh[2];
    uint8_t *kh[2], *vh[2];
    for (int k = 0; k < 2; k++) {
        yh[k] = xmalloc((size_t)(n * N) * 4), kh[k] = xmalloc(cb), vh[k] = xmalloc(cb);
        ops->download(be->ctx, yh[k], y[k], (size_t)(n * N) * 4);
        ops->download(be->ctx, kh[k], kc[k], cb), ops->download(be->ctx, vh[k], vc[k], cb);
    }
    assert_int_equal(ran, 1);
    double num = 0, den = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < H * hd; j++) {
            double a = yh[0][i * N + j], e = yh[1][i * N + j];
            num += (a - e) * (a - e), den += e * e;
        }
    assert_true(sqrt(num / den) < 1e-6);
    for (int i = 0; i < n; i++)
        for (long j = 0; j < kw; j++) {
            long e = (long)slot[i] * kw + j;
            double a = fp8_val(kh[0][e], 0.25f), b = fp8_val(kh[1][e], 0.25f);
            if (fabs(a - b) > fmax(fabs(a), fabs(b)) * 0.125 + 0.25 * 0x1p-9)
                fail_msg("epilogue K slot %d col %ld: %#x, the two ops %#x", slot[i], j, kh[0][e], kh[1][e]);
            if (vh[0][e] != vh[1][e])
                fail_msg("epilogue V slot %d col %ld: %#x, the two ops %#x", slot[i], j, vh[0][e], vh[1][e]);
        }
    printf("    wgmma rope epilogue on the FP8 cache: %d rows, q rel diff %.2e\n", n, sqrt(num / den));
    for (int k = 0; k < 2; k++) {
        ops->free(be->ctx, y[k]), ops->free(be->ctx, kc[k]), ops->free(be->ctx, vc[k]);
        free(yh[k]), free(kh[k]), free(vh[k]);
    }
    ops->weight_release(be->ctx, bw.data);
    void *ds[] = {dh, dnw, db, dcs, dx, dpos, dslot};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ops->free(be->ctx, ds[i]);
    free(w), free(h), free(nw), free(bias), free(cs);
}

/* gelu_tanh_mul (in place, as gemma3.c calls it, and strided) and scale */
static void test_gemma_ops(void **state) {
    (void)state;
    assert_true(have_gpu);
    struct backend *g = &gpu[0][0], *c = &cpu[0];
    enum { N = 13, DIM = 300, LD = 2 * DIM + 8 };
    float *x = xmalloc(N * LD * 4), *y = xmalloc(N * LD * 4), *x0 = xmalloc(N * LD * 4);
    for (int i = 0; i < N * LD; i++) x[i] = frand(6.0f);
    memcpy(x0, x, N * LD * 4);
    float *dx = dev_from(g, x, N * LD * 4);
    float *dz = dev_from(g, x, N * LD * 4);
    g->ops->gelu_tanh_mul(g->ctx, dx, LD, dx, LD, dx + DIM, LD, N, DIM);
    g->ops->scale(g->ctx, dz + 1, N * LD - 1, 8.0f); /* sqrt(64), Gemma's √hidden */
    g->ops->synchronize(g->ctx);
    g->ops->download(g->ctx, y, dx, N * LD * 4);
    float *z = xmalloc(N * LD * 4), *zc = xmalloc(N * LD * 4);
    g->ops->download(g->ctx, z, dz, N * LD * 4);
    memcpy(zc, x0, N * LD * 4);
    c->ops->gelu_tanh_mul(c->ctx, x, LD, x, LD, x + DIM, LD, N, DIM);
    c->ops->scale(c->ctx, zc + 1, N * LD - 1, 8.0f);
    if (memcmp(z, zc, N * LD * 4)) fail_msg("scale: not the CPU's bits (element 0 must stay)");
    for (int i = 0; i < N * LD; i++) {
        /* tanhf may differ by an ulp or two between the libraries, which
         * 1 + tanh near 0 (g ≈ −3) turns into a larger relative error of
         * y: bound it by 1e-6 · |g·u| besides 1e-6 · |y|; the columns
         * past DIM are u, untouched */
        int r = i / LD, k = i % LD;
        double a = y[i], b = x[i];
        double gu = k < DIM ? fabs((double)x0[r * LD + k] * x0[r * LD + DIM + k]) : 0.0;
        if (!(fabs(a - b) <= 1e-6 * fabs(b) + 1e-6 * gu))
            fail_msg("gelu_tanh_mul: element %d gpu %.9g cpu %.9g", i, a, b);
    }
    printf("    gelu_tanh_mul: %d rows in place; scale: the CPU's bits\n", N);
    g->ops->free(g->ctx, dx), g->ops->free(g->ctx, dz);
    free(x), free(y), free(x0), free(z), free(zc);
}

int main(void) {
    rng_seed("test_attn_features");
    struct kiln_error err = {0};
    static const char *const fam_env[3] = {"auto", "split", "scalar"};
    for (int fp8 = 0; fp8 < 2; fp8++) {
        struct backend_options bo = {.n_threads = 0, .device = 0, .kv_fp8 = fp8};
        if (backend_create(&cpu[fp8], "cpu", &bo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        if (cpu[fp8].ops->reserve(cpu[fp8].ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
            return fprintf(stderr, "reserve: %s\n", err.msg), 1;
    }
    have_gpu = 1;
    for (int fp8 = 0; fp8 < 2 && have_gpu; fp8++)
        for (int f = 0; f < 3 && have_gpu; f++) {
            struct backend_options bo = {.n_threads = 0, .device = 0, .kv_fp8 = fp8};
            setenv("KILN_CUDA_ATTN", fam_env[f], 1);
            knob_reload(NULL); /* knobs are read once per backend; this test compares settings */
            if (backend_create(&gpu[fp8][f], "cuda", &bo, &err)) {
                printf("test_attn_features: %s; the tests below fail\n", err.msg);
                have_gpu = 0;
                break;
            }
            if (gpu[fp8][f].ops->reserve(gpu[fp8][f].ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
                return fprintf(stderr, "reserve: %s\n", err.msg), 1;
            enum dtype want = fp8 ? DTYPE_F8_E4M3 : DTYPE_BF16;
            if (backend_kv_dtype(&gpu[fp8][f]) != want)
                return fprintf(stderr, "cuda kv dtype %d, expected %d\n",
                               (int)backend_kv_dtype(&gpu[fp8][f]), (int)want), 1;
        }
    unsetenv("KILN_CUDA_ATTN");
    if (have_gpu) {
        struct backend_options bo = {.n_threads = 0, .device = 0, .kv_fp8 = 1};
        setenv("KILN_CUDA_GEMV_MAX_ROWS", "0", 1);
        setenv("KILN_CUDA_WGMMA", "1", 1);
        setenv("KILN_CUDA_WGMMA_MIN_MB", "0", 1);
        knob_reload(NULL);
        if (backend_create(&gpu8w, "cuda", &bo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        if (gpu8w.ops->reserve(gpu8w.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
            return fprintf(stderr, "reserve: %s\n", err.msg), 1;
        have_wgmma = ((struct cuda_ctx *)gpu8w.ctx)->wgmma;
        unsetenv("KILN_CUDA_GEMV_MAX_ROWS"), unsetenv("KILN_CUDA_WGMMA"), unsetenv("KILN_CUDA_WGMMA_MIN_MB");
    }
    knob_reload(NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_store), cmocka_unit_test(test_fp8_attention),
        cmocka_unit_test(test_window),    cmocka_unit_test(test_sinks),
        cmocka_unit_test(test_fp8_rope_epilogue), cmocka_unit_test(test_gemma_ops),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    backend_destroy(&gpu8w);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        for (int f = 0; f < 3; f++) backend_destroy(&gpu[fp8][f]);
        backend_destroy(&cpu[fp8]);
    }
    return rc;
}
