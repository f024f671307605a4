/* test_cuda_ops.c — every CUDA operation against the CPU backend, both
 * called through struct backend_ops with the same random inputs (fresh per
 * run: the seed comes from the clock unless KILN_TEST_SEED is set, and is
 * printed). Outputs are poisoned with NaN first, so an element the kernel
 * forgot to write fails the comparison.
 *
 * The GPU's KV cache is bf16 by default (the CPU's stays fp32): cache
 * contents are compared with the CPU's values rounded to bf16, and the
 * attention checks give the CPU the same rounded cache (plus a few cases
 * against the unrounded one, 1e-2: see test_attention) and run again on a
 * KILN_CUDA_KV=f32 backend.
 *
 * Tolerances, as ‖gpu − cpu‖ / ‖cpu‖ over the whole output:
 *   - attention rows of the tensor-core prefill kernel (head sizes 64 and
 *     128, sequences with several new tokens): q, k, p, v rounded to bf16,
 *     fp32 sums: 1e-2 (measured 2e-3, as any bf16 attention).
 *   - fp32 arithmetic on both sides (norms, rope, element-wise, attention,
 *     routing weights, the GEMV path, F32-weight GEMMs): 1e-5. Both sides
 *     round every operation to fp32 (unit roundoff 6e-8) but sum in
 *     different orders and use different expf/rsqrtf (≤ 2 ulp); over the
 *     few thousand terms of these sizes that stays near 1e-6.
 *   - cuBLAS on bf16 weights: the activations are rounded to bf16 (unit
 *     roundoff 2^-9 = 2e-3) before the product; with independent rounding
 *     errors the relative error of a dot product is about 2e-3 / sqrt(1)..
 *     ≈ 1e-3 in norm; 1e-2 leaves a 5-10× margin and still catches any
 *     indexing or transposition bug (those give errors near 1).
 *   - cuBLAS on f16 weights: f16 has 2^-11 = 5e-4 unit roundoff: 3e-3.
 * Routing ids must match exactly (random inputs make exact ties unlikely).
 *
 * Label gpu; fails without a GPU (run it with ctest -L gpu on the GPU machine). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_pairs.h"

enum { MAX_TOKENS = 512, MAX_CONTEXT = 4096, MAX_HEADS = 16 };

/* cpu, gpu: cuda_test_pairs.h */
static struct backend gpu_split; /* KILN_CUDA_MATMUL=bf16x2 */
static struct backend gpu_det;   /* backend_options.deterministic */
static struct backend gpu_kvf32; /* KILN_CUDA_KV=f32: the fp32 KV cache kernels */
/* the product path's switches (docs/cuda-decode.md): */
static struct backend gpu_nopdl; /* KILN_CUDA_PDL=0: ordinary launches, else as gpu */
static struct backend gpu_old;   /* PDL, fusion, cuBLASLt off and GEMV K split 1: the old path */
static struct backend gpu_ks4;   /* KILN_CUDA_GEMV_KS=4: every GEMV split over K in 4 */

/* A KV cache on both backends: h holds fp32 for the CPU, d the same values
 * in the device backend's KV dtype (bf16 by default: rounded to nearest
 * even). round: h is rounded to that dtype too, so that a comparison
 * measures the kernel and not the storage; else h keeps the fp32 values
 * (the end-to-end error of a bf16 cache against the CPU's fp32 one). */
static struct pair kv_from(const struct backend *be, float *vals, size_t n, int round) {
    enum dtype kt = backend_kv_dtype(be);
    size_t bytes = n * dtype_size(kt);
    struct pair p = {xmalloc(n * 4 + 4), gpu.ops->alloc(gpu.ctx, bytes), bytes};
    assert_non_null(p.d);
    if (kt == DTYPE_BF16) {
        uint16_t *b = xmalloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) {
            b[i] = f32_to_bf16(vals[i]);
            if (round) vals[i] = bf16_to_f32(b[i]);
        }
        gpu.ops->upload(gpu.ctx, p.d, b, bytes);
        gpu.ops->synchronize(gpu.ctx);
        free(b);
    } else {
        gpu.ops->upload(gpu.ctx, p.d, vals, bytes);
    }
    memcpy(p.h, vals, n * 4);
    return p;
}
static struct pair kv_rand(const struct backend *be, size_t n, float scale, int round) {
    float *v = rand_floats(n, scale);
    struct pair p = kv_from(be, v, n, round);
    free(v);
    return p;
}
static struct pair kv_poison(const struct backend *be, size_t n) {
    float *v = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) v[i] = NAN;
    struct pair p = kv_from(be, v, n, 1);
    free(v);
    return p;
}
/* Elements [off, off + n) of a device KV cache, widened to fp32. */
static float *kv_fetch(const struct backend *be, const struct pair *p, size_t off, size_t n) {
    enum dtype kt = backend_kv_dtype(be);
    size_t es = dtype_size(kt);
    float *f = xmalloc(n * 4 + 4);
    if (kt == DTYPE_BF16) {
        uint16_t *b = xmalloc(n * 2 + 2);
        gpu.ops->download(gpu.ctx, b, (char *)p->d + off * es, n * 2);
        for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(b[i]);
        free(b);
    } else {
        gpu.ops->download(gpu.ctx, f, (char *)p->d + off * es, n * 4);
    }
    return f;
}
/* ‖a − b‖ / ‖b‖ */
static double vec_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}


/* ---- tests --------------------------------------------------------------- */

static void test_embed(void **state) {
    SKIP_WITHOUT_GPU();
    /* 16-bit rows of whole 16-byte groups take the vector kernel (96,
     * 4096), others (100) and fp32 the scalar one */
    enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    const long dims[] = {96, 4096, 100};
    for (int t = 0; t < 9; t++) {
        long V = 300, d = dims[t / 3], n = 37;
        struct wpair w = weight_rand(dts[t % 3], V, d, 1.0f);
        int32_t ids[37];
        for (int i = 0; i < n; i++) ids[i] = irand((int)V);
        struct pair pid = pair_from(ids, sizeof ids), y = pair_poison((size_t)(n * d));
        cpu.ops->embed(cpu.ctx, y.h, &w.c, (int32_t *)pid.h, n);
        gpu.ops->embed(gpu.ctx, y.d, &w.g, pid.d, n);
        expect_close(&y, n, d, d, 0.0); /* a copy: exact */
        pair_free(&pid), pair_free(&y), weight_free(&w);
    }
}

static void test_rmsnorm(void **state) {
    SKIP_WITHOUT_GPU();
    long dims[] = {64, 128, 1000, 4096};
    for (int t = 0; t < 4; t++) {
        long d = dims[t], n = 19, ld = d + 5;
        struct pair x = pair_rand((size_t)(n * ld), 2.0f), w = pair_rand((size_t)d, 1.0f),
                    y = pair_poison((size_t)(n * ld));
        cpu.ops->rmsnorm(cpu.ctx, y.h, ld, x.h, ld, w.h, n, d, 1e-6f);
        gpu.ops->rmsnorm(gpu.ctx, y.d, ld, x.d, ld, w.d, n, d, 1e-6f);
        expect_close(&y, n, d, ld, 1e-5);
        /* in place, as the per-head q/k norms run */
        cpu.ops->rmsnorm(cpu.ctx, x.h, ld, x.h, ld, w.h, n, d, 1e-6f);
        gpu.ops->rmsnorm(gpu.ctx, x.d, ld, x.d, ld, w.d, n, d, 1e-6f);
        expect_close(&x, n, d, ld, 1e-5);
        pair_free(&x), pair_free(&w), pair_free(&y);
    }
}

static void test_add_rmsnorm(void **state) {
    SKIP_WITHOUT_GPU();
    /* 64: the scalar kernels; the rest the float4 kernel with 1 to 4 float4
     * per thread (4100: 1025 float4 over 544 threads, 9000 and 16384: 3 and
     * 4 per thread), one row (decode) and several */
    long dims[] = {64, 2048, 1000, 4100, 9000, 16384}, rows[] = {23, 1};
    for (int t = 0; t < 12; t++) {
        long d = dims[t % 6], n = rows[t / 6];
        printf("  add_rmsnorm n=%ld dim=%ld\n", n, d);
        struct pair h = pair_rand((size_t)(n * d), 3.0f), dl = pair_rand((size_t)(n * d), 1.0f),
                    w = pair_rand((size_t)d, 1.0f), y = pair_poison((size_t)(n * d));
        cpu.ops->add_rmsnorm(cpu.ctx, h.h, dl.h, y.h, w.h, n, d, 1e-5f);
        gpu.ops->add_rmsnorm(gpu.ctx, h.d, dl.d, y.d, w.d, n, d, 1e-5f);
        expect_close(&h, n, d, d, 1e-6);
        expect_close(&y, n, d, d, 1e-5);
        /* no delta */
        cpu.ops->add_rmsnorm(cpu.ctx, h.h, NULL, y.h, w.h, n, d, 1e-5f);
        gpu.ops->add_rmsnorm(gpu.ctx, h.d, NULL, y.d, w.d, n, d, 1e-5f);
        expect_close(&y, n, d, d, 1e-5);
        /* y aliasing h, as the final norm does */
        cpu.ops->add_rmsnorm(cpu.ctx, h.h, dl.h, h.h, w.h, n, d, 1e-5f);
        gpu.ops->add_rmsnorm(gpu.ctx, h.d, dl.d, h.d, w.d, n, d, 1e-5f);
        expect_close(&h, n, d, d, 1e-5);
        pair_free(&h), pair_free(&dl), pair_free(&w), pair_free(&y);
    }
}

static void test_rope(void **state) {
    SKIP_WITHOUT_GPU();
    for (int inter = 0; inter < 2; inter++) {
        long n = 21, heads = 5, hs = 40, rot = 32, ld = heads * hs + 8, maxpos = 100;
        struct pair x = pair_rand((size_t)(n * ld), 1.0f);
        float *cs = xmalloc((size_t)(maxpos * rot) * 4);
        for (long p = 0; p < maxpos; p++)
            for (long i = 0; i < rot / 2; i++) {
                float a = (float)p * powf(10000.0f, -2.0f * (float)i / (float)rot);
                cs[p * rot + 2 * i] = cosf(a), cs[p * rot + 2 * i + 1] = sinf(a);
            }
        int32_t pos[21];
        for (int i = 0; i < n; i++) pos[i] = irand((int)maxpos);
        struct pair pc = pair_from(cs, (size_t)(maxpos * rot) * 4), pp = pair_from(pos, sizeof pos);
        cpu.ops->rope(cpu.ctx, x.h, ld, n, (int)heads, hs, (int)rot, (int32_t *)pp.h, pc.h, inter);
        gpu.ops->rope(gpu.ctx, x.d, ld, n, (int)heads, hs, (int)rot, pp.d, pc.d, inter);
        expect_close(&x, n, ld, ld, 1e-6); /* untouched dims must stay equal too */
        free(cs), pair_free(&x), pair_free(&pc), pair_free(&pp);
    }
}

/* The fused q/k norm + rope + K/V store against the CPU's separate ops,
 * on rows of q | k | v with stride ld, as mha_forward lays them out. */
static void test_qk_rope_store(void **state) {
    SKIP_WITHOUT_GPU();
    for (int variant = 0; variant < 3; variant++) {
        int norm = variant != 1, inter = variant == 2;
        long n = 13, H = 6, KH = 2, hd = 64, rot = variant == 2 ? 32 : 64, maxpos = 100;
        long qw = H * hd, kw = KH * hd, ld = qw + 2 * kw + 4, slots = 40;
        struct pair x = pair_rand((size_t)(n * ld), 1.0f), qn = pair_rand((size_t)hd, 1.0f),
                    kn = pair_rand((size_t)hd, 1.0f), kc = kv_poison(&gpu, (size_t)(slots * kw)),
                    vc = kv_poison(&gpu, (size_t)(slots * kw));
        float *cs = xmalloc((size_t)(maxpos * rot) * 4);
        for (long p = 0; p < maxpos; p++)
            for (long i = 0; i < rot / 2; i++) {
                float a = (float)p * powf(10000.0f, -2.0f * (float)i / (float)rot);
                cs[p * rot + 2 * i] = cosf(a), cs[p * rot + 2 * i + 1] = sinf(a);
            }
        int32_t pos[13], slot[13];
        for (int i = 0; i < n; i++) pos[i] = irand((int)maxpos), slot[i] = (int)(3 * i + 1);
        struct pair pc = pair_from(cs, (size_t)(maxpos * rot) * 4), pp = pair_from(pos, sizeof pos),
                    ps = pair_from(slot, sizeof slot);
        float *q = x.h, *k = x.h + qw, *v = x.h + qw + kw;
        if (norm) {
            for (long h = 0; h < H; h++)
                cpu.ops->rmsnorm(cpu.ctx, q + h * hd, ld, q + h * hd, ld, qn.h, n, hd, 1e-6f);
            for (long h = 0; h < KH; h++)
                cpu.ops->rmsnorm(cpu.ctx, k + h * hd, ld, k + h * hd, ld, kn.h, n, hd, 1e-6f);
        }
        cpu.ops->rope(cpu.ctx, q, ld, n, (int)H, hd, (int)rot, (int32_t *)pp.h, pc.h, inter);
        cpu.ops->rope(cpu.ctx, k, ld, n, (int)KH, hd, (int)rot, (int32_t *)pp.h, pc.h, inter);
        cpu.ops->kv_store(cpu.ctx, kc.h, kw, k, ld, kw, (int32_t *)ps.h, n, 1.0f);
        cpu.ops->kv_store(cpu.ctx, vc.h, kw, v, ld, kw, (int32_t *)ps.h, n, 1.0f);
        float *qd = x.d;
        struct backend_rope_store r = {.n_heads = (int)H, .n_kv_heads = (int)KH, .head_dim = (int)hd,
                                       .q_norm = norm ? qn.d : NULL, .k_norm = norm ? kn.d : NULL,
                                       .eps = 1e-6f, .rot_dim = (int)rot, .pos = pp.d, .cos_sin = pc.d,
                                       .interleaved = inter, .k_cache = kc.d, .v_cache = vc.d,
                                       .kv_stride = kw, .slots = ps.d};
        gpu.ops->qk_rope_store(gpu.ctx, qd, qd + qw, qd + qw + kw, ld, n, &r);
        printf("  qk_rope_store norm=%d interleaved=%d rot=%ld\n", norm, inter, rot);
        expect_close(&x, n, qw + 2 * kw, ld, 1e-5);
        /* only the written slots: the rest stay NaN on both sides. The GPU
         * cache holds the fp32 results rounded to the KV dtype: V exactly
         * the rounding of the CPU's value; K within the fp32 tolerance plus
         * bf16's half ulp (2^-9 relative, 2e-3). */
        int bf = backend_kv_dtype(&gpu) == DTYPE_BF16;
        for (int i = 0; i < n; i++) {
            float *gk = kv_fetch(&gpu, &kc, (size_t)slot[i] * kw, (size_t)kw),
                  *gv = kv_fetch(&gpu, &vc, (size_t)slot[i] * kw, (size_t)kw);
            const float *hk = kc.h + (size_t)slot[i] * kw, *hv = vc.h + (size_t)slot[i] * kw;
            float *rv = xmalloc((size_t)kw * 4);
            for (long e = 0; e < kw; e++) rv[e] = bf ? bf16_to_f32(f32_to_bf16(hv[e])) : hv[e];
            double ek = vec_err(gk, hk, (size_t)kw), ev = vec_err(gv, rv, (size_t)kw);
            if (!(ek <= (bf ? 3e-3 : 1e-5) && ev == 0.0)) fail_msg("cache row %d: k %.3g v %.3g", i, ek, ev);
            free(gk), free(gv), free(rv);
        }
        free(cs), pair_free(&x), pair_free(&qn), pair_free(&kn), pair_free(&kc), pair_free(&vc);
        pair_free(&pc), pair_free(&pp), pair_free(&ps);
    }
}

static void test_elementwise(void **state) {
    SKIP_WITHOUT_GPU();
    long n = 33, d = 301, ld = 320;
    struct pair g = pair_rand((size_t)(n * ld), 4.0f), u = pair_rand((size_t)(n * ld), 1.0f),
                y = pair_poison((size_t)(n * ld));
    cpu.ops->silu_mul(cpu.ctx, y.h, ld, g.h, ld, u.h, ld, n, d);
    gpu.ops->silu_mul(gpu.ctx, y.d, ld, g.d, ld, u.d, ld, n, d);
    expect_close(&y, n, d, ld, 1e-6);

    cpu.ops->add(cpu.ctx, g.h, u.h, n * ld);
    gpu.ops->add(gpu.ctx, g.d, u.d, n * ld);
    expect_close(&g, n, ld, ld, 1e-7);

    struct pair gate = pair_rand((size_t)(n * 3), 3.0f), a = pair_rand((size_t)(n * d), 1.0f),
                b = pair_rand((size_t)(n * d), 1.0f);
    cpu.ops->gated_add(cpu.ctx, a.h, b.h, gate.h, 3, n, d);
    gpu.ops->gated_add(gpu.ctx, a.d, b.d, gate.d, 3, n, d);
    expect_close(&a, n, d, d, 1e-6);

    int32_t rows[17];
    for (int i = 0; i < 17; i++) rows[i] = irand((int)n);
    struct pair pr = pair_from(rows, sizeof rows), dst = pair_poison((size_t)(17 * d));
    cpu.ops->gather_rows(cpu.ctx, dst.h, b.h, d, (int32_t *)pr.h, 17);
    gpu.ops->gather_rows(gpu.ctx, dst.d, b.d, d, pr.d, 17);
    expect_close(&dst, 17, d, d, 0.0);

    struct pair c2 = pair_poison((size_t)(n * ld));
    cpu.ops->copy_rows(cpu.ctx, c2.h, ld, b.h, d, n, 100);
    gpu.ops->copy_rows(gpu.ctx, c2.d, ld, b.d, d, n, 100);
    expect_close(&c2, n, 100, ld, 0.0);

    /* kv_store into distinct random slots of a poisoned cache */
    long slots = 200, width = 48, stride = 64;
    struct pair cache = kv_poison(&gpu, (size_t)(slots * stride));
    int32_t sl[40];
    for (int i = 0; i < 40; i++) {
        int s, dup;
        do {
            s = irand((int)slots);
            dup = 0;
            for (int j = 0; j < i; j++) dup |= sl[j] == s;
        } while (dup);
        sl[i] = s;
    }
    struct pair psl = pair_from(sl, sizeof sl), src = pair_rand((size_t)(40 * 50), 1.0f);
    cpu.ops->kv_store(cpu.ctx, cache.h, stride, src.h, 50, width, (int32_t *)psl.h, 40, 1.0f);
    gpu.ops->kv_store(gpu.ctx, cache.d, stride, src.d, 50, width, psl.d, 40, 1.0f);
    /* the GPU's copy is the CPU's rounded to the KV dtype, bit for bit */
    float *gc = kv_fetch(&gpu, &cache, 0, (size_t)(slots * stride));
    for (int i = 0; i < 40; i++) {
        float *row = cache.h + (long)sl[i] * stride;
        if (backend_kv_dtype(&gpu) == DTYPE_BF16)
            for (long e = 0; e < width; e++) row[e] = bf16_to_f32(f32_to_bf16(row[e]));
        assert_memory_equal(gc + (long)sl[i] * stride, row, (size_t)width * 4);
    }
    free(gc);
    pair_free(&g), pair_free(&u), pair_free(&y), pair_free(&gate), pair_free(&a), pair_free(&b);
    pair_free(&pr), pair_free(&dst), pair_free(&c2), pair_free(&cache), pair_free(&psl),
        pair_free(&src);
}

static void check_matmul_on(struct backend *be, enum dtype dt, long n, long rows, long cols,
                            int bias, int strided, double tol) {
    long ldx = strided ? cols + 3 : cols, ldy = strided ? rows + 5 : rows;
    struct wpair w = weight_rand(dt, rows, cols, 1.0f / sqrtf((float)cols));
    struct pair x = pair_rand((size_t)(n * ldx), 1.0f), y = pair_poison((size_t)(n * ldy)),
                b = pair_rand((size_t)rows, 0.5f);
    cpu.ops->matmul(cpu.ctx, y.h, ldy, x.h, ldx, &w.c, bias ? b.h : NULL, n);
    /* buffers were filled on gpu's stream; another backend has its own */
    if (be != &gpu) gpu.ops->synchronize(gpu.ctx);
    be->ops->matmul(be->ctx, y.d, ldy, x.d, ldx, &w.g, bias ? b.d : NULL, n);
    be->ops->synchronize(be->ctx);
    printf("  matmul %s n=%ld %ldx%ld bias=%d strided=%d%s\n", dtype_name(dt), n, rows, cols, bias,
           strided, be == &gpu_split ? " bf16x2" : be == &gpu_det ? " deterministic" : "");
    expect_close(&y, n, rows, ldy, tol);
    pair_free(&x), pair_free(&y), pair_free(&b), weight_free(&w);
}

static void check_matmul(enum dtype dt, long n, long rows, long cols, int bias, int strided,
                         double tol) {
    check_matmul_on(&gpu, dt, n, rows, cols, bias, strided, tol);
}

static void test_matmul(void **state) {
    SKIP_WITHOUT_GPU();
    /* GEMV path (n ≤ 8): fp32 activations, fp32 accumulation */
    check_matmul(DTYPE_BF16, 1, 1000, 512, 0, 0, 1e-5);
    check_matmul(DTYPE_BF16, 3, 257, 1024, 1, 1, 1e-5);
    check_matmul(DTYPE_F16, 8, 300, 256, 1, 0, 1e-5);
    /* GEMV with 1, 2 and 4 rows per warp, column counts that leave a tail
     * after the unrolled steps, and rows not a multiple of the block's */
    check_matmul(DTYPE_BF16, 2, 8191, 1000, 1, 0, 1e-5);
    check_matmul(DTYPE_BF16, 5, 6007, 2056, 0, 1, 1e-5);
    check_matmul(DTYPE_BF16, 8, 2050, 4104, 1, 1, 1e-5);
    check_matmul(DTYPE_F16, 4, 70000, 64, 1, 0, 1e-5);
    /* cuBLAS: activations rounded to the weights' 16-bit type */
    check_matmul(DTYPE_BF16, 37, 1000, 512, 1, 0, 1e-2);
    check_matmul(DTYPE_BF16, 130, 96, 200, 0, 1, 1e-2);
    check_matmul(DTYPE_F16, 64, 256, 384, 1, 1, 3e-3);
    /* GEMV preconditions unmet (cols % 8 != 0): cuBLAS even for one row */
    check_matmul(DTYPE_BF16, 2, 64, 100, 0, 0, 1e-2);
    /* F32 weights: plain fp32 GEMM */
    check_matmul(DTYPE_F32, 1, 128, 256, 1, 0, 1e-5);
    check_matmul(DTYPE_F32, 50, 200, 300, 0, 1, 1e-5);
    /* bf16x2: hi + lo halves of the activations, fp32-grade. The lo half
     * keeps 16 more bits: 2^-17 relative per element before summation;
     * f16 (11-bit halves) keeps 22 bits. */
    check_matmul_on(&gpu_split, DTYPE_BF16, 37, 1000, 512, 1, 0, 2e-5);
    check_matmul_on(&gpu_split, DTYPE_BF16, 130, 96, 200, 0, 1, 2e-5);
    check_matmul_on(&gpu_split, DTYPE_F16, 64, 256, 384, 1, 1, 2e-5);
    /* deterministic mode: one tensor-core kernel for every n (bf16/f16
     * activations, like cuBLAS), a plain fp32 loop for F32 weights */
    check_matmul_on(&gpu_det, DTYPE_BF16, 1, 1000, 512, 1, 0, 1e-2);
    check_matmul_on(&gpu_det, DTYPE_BF16, 200, 300, 512, 1, 0, 1e-2);
    check_matmul_on(&gpu_det, DTYPE_BF16, 130, 96, 200, 0, 1, 1e-5); /* strided: fp32 loop */
    check_matmul_on(&gpu_det, DTYPE_F16, 64, 256, 384, 1, 0, 3e-3);
    check_matmul_on(&gpu_det, DTYPE_F32, 9, 100, 36, 0, 1, 1e-5);
    /* GEMV split over K in 4 parts of whole 32-piece steps: uneven parts
     * (125 pieces), an empty last part (257 pieces: 96 + 96 + 65 + 0), one
     * part holding everything (8 pieces), SwiGLU-sized rows */
    check_matmul_on(&gpu_ks4, DTYPE_BF16, 1, 1000, 1000, 1, 0, 1e-5);
    check_matmul_on(&gpu_ks4, DTYPE_BF16, 2, 4099, 2056, 0, 1, 1e-5);
    check_matmul_on(&gpu_ks4, DTYPE_F16, 8, 300, 64, 1, 0, 1e-5);
    check_matmul_on(&gpu_ks4, DTYPE_BF16, 5, 2050, 4104, 1, 1, 1e-5);
    /* cublasGemmEx + bias kernel (KILN_CUDA_LT=0) */
    check_matmul_on(&gpu_old, DTYPE_BF16, 37, 1000, 512, 1, 0, 1e-2);
    check_matmul_on(&gpu_old, DTYPE_F16, 64, 256, 384, 1, 1, 3e-3);
    check_matmul_on(&gpu_old, DTYPE_BF16, 2, 8191, 1000, 1, 0, 1e-5);
}

static float *fetch_pair(const struct backend *be, const struct pair *p) {
    float *g = xmalloc(p->bytes + 4);
    be->ops->download(be->ctx, g, p->d, p->bytes);
    return g;
}

/* The device copies of a and b hold the same bits. */
static void expect_same_bits(const struct backend *be, const struct pair *a, const struct pair *b,
                             const char *what) {
    float *x = fetch_pair(be, a), *y = fetch_pair(be, b);
    size_t n = a->bytes / 4, differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&x[i], &y[i], 4) != 0;
    free(x), free(y);
    if (differ) fail_msg("%s: %zu of %zu floats differ from the plain ops", what, differ, n);
}

/* norm_matmul and norm_swiglu_mlp on `be` against the CPU's add_rmsnorm +
 * matmul (+ silu_mul + matmul), and bit for bit against `be`'s own plain
 * ops in the same order (the fused paths promise the same bits: the same
 * sums, the same rounding to 16 bits, the same cuBLAS plan).
 * tol: of the products (1e-5 on the fp32 GEMV, 1e-2 with bf16 operands). */
static void check_fused_on(struct backend *be, long n, long d, long inter, long qrows,
                           int with_delta, int bias, double tol) {
    const float eps = 1e-5f;
    struct wpair wq = weight_rand(DTYPE_BF16, qrows, d, 1.0f / sqrtf((float)d)),
                 wgu = weight_rand(DTYPE_BF16, 2 * inter, d, 1.0f / sqrtf((float)d)),
                 wd = weight_rand(DTYPE_BF16, d, inter, 1.0f / sqrtf((float)inter));
    float *h0 = rand_floats((size_t)(n * d), 3.0f);
    struct pair h = pair_from(h0, (size_t)(n * d) * 4), h2 = pair_from(h0, (size_t)(n * d) * 4),
                dl = pair_rand((size_t)(n * d), 1.0f), lw = pair_rand((size_t)d, 1.0f),
                qb = pair_rand((size_t)qrows, 0.5f), xn = pair_poison((size_t)(n * d)),
                xn2 = pair_poison((size_t)(n * d)), y = pair_poison((size_t)(n * qrows)),
                y2 = pair_poison((size_t)(n * qrows)), gu = pair_poison((size_t)(n * 2 * inter)),
                gu2 = pair_poison((size_t)(n * 2 * inter)), o = pair_poison((size_t)(n * d)),
                o2 = pair_poison((size_t)(n * d));
    free(h0);
    const float *cd = with_delta ? dl.h : NULL;
    const float *gd = with_delta ? (const float *)dl.d : NULL;
    const float *bh = bias ? qb.h : NULL, *bd = bias ? (const float *)qb.d : NULL;
    printf("  fused n=%ld d=%ld inter=%ld qrows=%ld delta=%d bias=%d%s\n", n, d, inter, qrows,
           with_delta, bias,
           be == &gpu_det ? " deterministic" : be == &gpu_split ? " bf16x2" : be == &gpu_ks4 ? " ks4"
           : be == &gpu_old ? " old path" : be == &gpu_nopdl ? " no PDL" : "");
    /* attention input: norm + q|k|v-like product */
    cpu.ops->add_rmsnorm(cpu.ctx, h.h, cd, xn.h, lw.h, n, d, eps);
    cpu.ops->matmul(cpu.ctx, y.h, qrows, xn.h, d, &wq.c, bh, n);
    if (be != &gpu) gpu.ops->synchronize(gpu.ctx);
    struct backend_norm nm = {.h = h.d, .delta = gd, .x = xn.d, .w = lw.d, .dim = d, .eps = eps};
    be->ops->norm_matmul(be->ctx, &nm, y.d, qrows, &wq.g, bd, n);
    be->ops->add_rmsnorm(be->ctx, h2.d, gd, xn2.d, lw.d, n, d, eps);
    be->ops->matmul(be->ctx, y2.d, qrows, xn2.d, d, &wq.g, bd, n);
    be->ops->synchronize(be->ctx);
    /* nm.x is the fused ops' scratch (unwritten on the 16-bit handoff) */
    expect_close(&h, n, d, d, 1e-6);
    expect_close(&y, n, qrows, qrows, tol);
    expect_same_bits(be, &h, &h2, "norm_matmul h");
    expect_same_bits(be, &y, &y2, "norm_matmul y");
    /* MLP: norm (delta always), gate|up, silu·u, down */
    cpu.ops->add_rmsnorm(cpu.ctx, h.h, dl.h, xn.h, lw.h, n, d, eps);
    cpu.ops->matmul(cpu.ctx, gu.h, 2 * inter, xn.h, d, &wgu.c, NULL, n);
    cpu.ops->silu_mul(cpu.ctx, gu.h, 2 * inter, gu.h, 2 * inter, gu.h + inter, 2 * inter, n, inter);
    cpu.ops->matmul(cpu.ctx, o.h, d, gu.h, 2 * inter, &wd.c, NULL, n);
    struct backend_norm nm2 = {.h = h.d, .delta = dl.d, .x = xn.d, .w = lw.d, .dim = d, .eps = eps};
    be->ops->norm_swiglu_mlp(be->ctx, &nm2, o.d, d, &(struct backend_stack){.cat = wgu.g}, &wd.g, gu.d,
                             2 * inter, n);
    be->ops->add_rmsnorm(be->ctx, h2.d, dl.d, xn2.d, lw.d, n, d, eps);
    float *g2 = gu2.d;
    be->ops->matmul(be->ctx, g2, 2 * inter, xn2.d, d, &wgu.g, NULL, n);
    be->ops->silu_mul(be->ctx, g2, 2 * inter, g2, 2 * inter, g2 + inter, 2 * inter, n, inter);
    be->ops->matmul(be->ctx, o2.d, d, g2, 2 * inter, &wd.g, NULL, n);
    be->ops->synchronize(be->ctx);
    expect_close(&h, n, d, d, 1e-6);
    expect_close(&o, n, d, d, tol);
    expect_same_bits(be, &h, &h2, "norm_swiglu_mlp h");
    expect_same_bits(be, &o, &o2, "norm_swiglu_mlp y");
    weight_free(&wq), weight_free(&wgu), weight_free(&wd);
    struct pair *ps[] = {&h, &h2, &dl, &lw, &qb, &xn, &xn2, &y, &y2, &gu, &gu2, &o, &o2};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) pair_free(ps[i]);
}

static void test_fused(void **state) {
    SKIP_WITHOUT_GPU();
    /* GEMV rows (≤ 8 here): norm + GEMV, norm + SwiGLU GEMV + GEMV */
    long ns[] = {1, 2, 5, 37, 130};
    for (int i = 0; i < 5; i++) {
        double tol = ns[i] <= 8 ? 1e-5 : 1e-2;
        check_fused_on(&gpu, ns[i], 640, 704, 1000, 1, 1, tol);
        check_fused_on(&gpu, ns[i], 640, 704, 1000, 0, 0, tol); /* the first layer: no delta */
        check_fused_on(&gpu, ns[i], 256, 1000, 72, 0, 1, tol);  /* narrow rows without delta: plain norm */
    }
    check_fused_on(&gpu, 40, 2048, 1408, 1000, 1, 0, 1e-2);
    /* the switches: each must still compute the same thing */
    check_fused_on(&gpu_ks4, 2, 640, 704, 1000, 1, 1, 1e-5);
    check_fused_on(&gpu_ks4, 7, 1032, 2056, 600, 1, 0, 1e-5);
    check_fused_on(&gpu_nopdl, 1, 640, 704, 1000, 1, 1, 1e-5);
    check_fused_on(&gpu_nopdl, 37, 640, 704, 1000, 1, 1, 1e-2);
    check_fused_on(&gpu_old, 1, 640, 704, 1000, 1, 1, 1e-5);
    check_fused_on(&gpu_old, 37, 640, 704, 1000, 1, 1, 1e-2);
    /* deterministic: the plain sequence with cuda_matmul_det (bf16 operands) */
    check_fused_on(&gpu_det, 1, 640, 704, 1000, 1, 1, 1e-2);
    check_fused_on(&gpu_det, 37, 640, 704, 1000, 1, 1, 1e-2);
    /* bf16x2: the plain sequence, fp32-grade */
    check_fused_on(&gpu_split, 2, 640, 704, 1000, 1, 1, 1e-5);
    check_fused_on(&gpu_split, 37, 640, 704, 1000, 1, 1, 2e-5);
}

/* A decode-shaped stack of layers (norm_matmul, o_proj matmul,
 * norm_swiglu_mlp; weights of tens of MB so that the GEMVs span several
 * waves and overlap their neighbours under programmatic dependent launch)
 * run three ways on the default backend — eager, recorded into a graph and
 * replayed — and on the KILN_CUDA_PDL=0 backend. A missing wait anywhere
 * in the chain would let a kernel read a half-written input: the results
 * must agree bit for bit, and with the CPU within the products' tolerance. */
struct chain_w {
    struct wpair q, o, gu, dn;
    struct pair ln1, ln2;
};

static void run_chain(struct backend *be, const struct chain_w *w, int cpu_side, struct pair *h,
                      struct pair *delta, struct pair *xn, struct pair *q, struct pair *gu, long n,
                      long d, long inter, long qr, int layers) {
    const float eps = 1e-5f;
    for (int l = 0; l < layers; l++) {
        if (cpu_side) {
            cpu.ops->add_rmsnorm(cpu.ctx, h->h, l ? delta->h : NULL, xn->h, w->ln1.h, n, d, eps);
            cpu.ops->matmul(cpu.ctx, q->h, qr, xn->h, d, &w->q.c, NULL, n);
            cpu.ops->matmul(cpu.ctx, delta->h, d, q->h, qr, &w->o.c, NULL, n);
            cpu.ops->add_rmsnorm(cpu.ctx, h->h, delta->h, xn->h, w->ln2.h, n, d, eps);
            cpu.ops->matmul(cpu.ctx, gu->h, 2 * inter, xn->h, d, &w->gu.c, NULL, n);
            cpu.ops->silu_mul(cpu.ctx, gu->h, 2 * inter, gu->h, 2 * inter, gu->h + inter,
                              2 * inter, n, inter);
            cpu.ops->matmul(cpu.ctx, delta->h, d, gu->h, 2 * inter, &w->dn.c, NULL, n);
            continue;
        }
        struct backend_norm nm = {.h = h->d, .delta = l ? (const float *)delta->d : NULL,
                                  .x = xn->d, .w = w->ln1.d, .dim = d, .eps = eps};
        be->ops->norm_matmul(be->ctx, &nm, q->d, qr, &w->q.g, NULL, n);
        be->ops->matmul(be->ctx, delta->d, d, q->d, qr, &w->o.g, NULL, n);
        nm.delta = delta->d;
        nm.w = w->ln2.d;
        be->ops->norm_swiglu_mlp(be->ctx, &nm, delta->d, d, &(struct backend_stack){.cat = w->gu.g},
                                 &w->dn.g, gu->d, 2 * inter, n);
    }
    if (cpu_side) cpu.ops->add_rmsnorm(cpu.ctx, h->h, delta->h, xn->h, w->ln1.h, n, d, eps);
    else be->ops->add_rmsnorm(be->ctx, h->d, delta->d, xn->d, w->ln1.d, n, d, eps);
}

static void test_pdl_chain(void **state) {
    SKIP_WITHOUT_GPU();
    long d = 2048, inter = 5632, qr = 3072;
    int layers = 6;
    struct chain_w w = {weight_rand(DTYPE_BF16, qr, d, 1.0f / sqrtf((float)d)),
                        weight_rand(DTYPE_BF16, d, qr, 0.5f / sqrtf((float)qr)),
                        weight_rand(DTYPE_BF16, 2 * inter, d, 1.0f / sqrtf((float)d)),
                        weight_rand(DTYPE_BF16, d, inter, 0.5f / sqrtf((float)inter)),
                        pair_rand((size_t)d, 1.0f), pair_rand((size_t)d, 1.0f)};
    for (int i = 0; i < d; i++) w.ln1.h[i] = w.ln1.h[i] * 0.5f + 1.0f, w.ln2.h[i] = w.ln2.h[i] * 0.5f + 1.0f;
    gpu.ops->upload(gpu.ctx, w.ln1.d, w.ln1.h, (size_t)d * 4);
    gpu.ops->upload(gpu.ctx, w.ln2.d, w.ln2.h, (size_t)d * 4);
    long ns[] = {1, 2, 40};
    for (int t = 0; t < 3; t++) {
        long n = ns[t];
        float *h0 = rand_floats((size_t)(n * d), 1.0f);
        struct pair h = pair_from(h0, (size_t)(n * d) * 4), delta = pair_poison((size_t)(n * d)),
                    xn = pair_poison((size_t)(n * d)), q = pair_poison((size_t)(n * qr)),
                    gu = pair_poison((size_t)(n * 2 * inter));
        float *res[3];
        struct backend *bes[3] = {&gpu, &gpu_nopdl, &gpu};
        for (int k = 0; k < 3; k++) {
            gpu.ops->upload(gpu.ctx, h.d, h0, (size_t)(n * d) * 4);
            gpu.ops->synchronize(gpu.ctx);
            struct backend *be = bes[k];
            if (k == 2) { /* recorded, then replayed twice (scratch sized by run 0) */
                be->ops->graph_begin(be->ctx);
                run_chain(be, &w, 0, &h, &delta, &xn, &q, &gu, n, d, inter, qr, layers);
                void *g = be->ops->graph_end(be->ctx);
                assert_non_null(g);
                for (int r = 0; r < 2; r++) {
                    be->ops->upload(be->ctx, h.d, h0, (size_t)(n * d) * 4);
                    assert_int_equal(be->ops->graph_launch(be->ctx, g), 0);
                }
                be->ops->synchronize(be->ctx);
                be->ops->graph_destroy(be->ctx, g);
            } else {
                run_chain(be, &w, 0, &h, &delta, &xn, &q, &gu, n, d, inter, qr, layers);
                be->ops->synchronize(be->ctx);
            }
            res[k] = fetch_pair(be, &xn);
        }
        run_chain(&cpu, &w, 1, &h, &delta, &xn, &q, &gu, n, d, inter, qr, layers);
        double tol = n <= 2 ? 1e-4 : 5e-2; /* 6 layers; bf16 operands past the GEMV */
        printf("  chain n=%ld: %d layers, d=%ld inter=%ld\n", n, layers, d, inter);
        expect_close(&xn, n, d, d, tol);
        size_t cnt = (size_t)(n * d), d1 = 0, d2 = 0;
        for (size_t i = 0; i < cnt; i++) {
            d1 += memcmp(&res[0][i], &res[1][i], 4) != 0;
            d2 += memcmp(&res[0][i], &res[2][i], 4) != 0;
        }
        printf("  chain n=%ld: PDL vs ordinary launches: %zu of %zu differ; graph replay: %zu\n", n,
               d1, cnt, d2);
        if (d1 || d2) fail_msg("chain n=%ld: results depend on the launch mode", n);
        for (int k = 0; k < 3; k++) free(res[k]);
        free(h0);
        pair_free(&h), pair_free(&delta), pair_free(&xn), pair_free(&q), pair_free(&gu);
    }
    weight_free(&w.q), weight_free(&w.o), weight_free(&w.gu), weight_free(&w.dn);
    pair_free(&w.ln1), pair_free(&w.ln2);
}

/* A ragged batch over a shuffled page pool: sequences with prompt chunks
 * and single decode rows, mixed. */
/* be: the GPU backend under test (its KV dtype); round: the CPU's cache
 * holds the same (rounded) values as the device's, else the fp32 originals. */
static void check_attention_on(struct backend *be, int round, int H, int KVH, int dk, int dv,
                               int v_in_k, int page_size, const int *seq_len, const int *seq_new,
                               int n_seqs, double tol) {
    int n_tokens = 0, total_pages = 0;
    for (int s = 0; s < n_seqs; s++) {
        n_tokens += seq_new[s];
        total_pages += (seq_len[s] + page_size - 1) / page_size;
    }
    int pool_pages = total_pages + 7;
    long k_stride = v_in_k ? dk : (long)KVH * dk, v_stride = v_in_k ? dk : (long)KVH * dv;
    long slots = (long)pool_pages * page_size;
    struct pair kc = kv_rand(be, (size_t)(slots * k_stride), 1.0f, round);
    struct pair vc = v_in_k ? kc : kv_rand(be, (size_t)(slots * v_stride), 1.0f, round);
    int32_t *perm = xmalloc((size_t)pool_pages * 4);
    for (int i = 0; i < pool_pages; i++) perm[i] = i;
    for (int i = pool_pages - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *pos = xmalloc((size_t)n_tokens * 4), *q_start = xmalloc((size_t)(n_seqs + 1) * 4),
            *page_start = xmalloc((size_t)(n_seqs + 1) * 4);
    int t = 0, pg = 0;
    for (int s = 0; s < n_seqs; s++) {
        q_start[s] = t;
        page_start[s] = pg;
        pg += (seq_len[s] + page_size - 1) / page_size;
        for (int p = seq_len[s] - seq_new[s]; p < seq_len[s]; p++) pos[t++] = p;
    }
    q_start[n_seqs] = t;
    page_start[n_seqs] = pg;
    struct pair pp = pair_from(pos, (size_t)n_tokens * 4),
                pq = pair_from(q_start, (size_t)(n_seqs + 1) * 4),
                pps = pair_from(page_start, (size_t)(n_seqs + 1) * 4),
                ppg = pair_from(perm, (size_t)pg * 4);
    long ldq = (long)H * dk + 4, ldo = (long)H * dv + 2;
    struct pair q = pair_rand((size_t)(n_tokens * ldq), 1.0f),
                o = pair_poison((size_t)(n_tokens * ldo));
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = dk, .dv = dv,
                            .k_stride = k_stride, .v_stride = v_stride,
                            .scale = 1.0f / sqrtf((float)dk)};
    struct backend_batch bc = {n_tokens, n_seqs, page_size, (int32_t *)pp.h, (int32_t *)pq.h,
                               (int32_t *)pps.h, (int32_t *)ppg.h};
    struct backend_batch bg = {n_tokens, n_seqs, page_size, pp.d, pq.d, pps.d, ppg.d};
    cpu.ops->attention(cpu.ctx, o.h, ldo, q.h, ldq, kc.h, vc.h, &p, &bc);
    if (be != &gpu) gpu.ops->synchronize(gpu.ctx);
    be->ops->attention(be->ctx, o.d, ldo, q.d, ldq, kc.d, vc.d, &p, &bg);
    be->ops->synchronize(be->ctx);
    printf("  attention H=%d KVH=%d dk=%d dv=%d v_in_k=%d page=%d tokens=%d kv=%s%s\n", H, KVH,
           dk, dv, v_in_k, page_size, n_tokens, dtype_name(backend_kv_dtype(be)),
           round ? "" : " (cpu cache fp32)");
    expect_close(&o, n_tokens, (long)H * dv, ldo, tol);
    pair_free(&kc);
    if (!v_in_k) pair_free(&vc);
    pair_free(&pp), pair_free(&pq), pair_free(&pps), pair_free(&ppg), pair_free(&q), pair_free(&o);
    free(perm), free(pos), free(q_start), free(page_start);
}

static void check_attention(int H, int KVH, int dk, int dv, int v_in_k, int page_size,
                            const int *seq_len, const int *seq_new, int n_seqs, double tol) {
    check_attention_on(&gpu, 1, H, KVH, dk, dv, v_in_k, page_size, seq_len, seq_new, n_seqs, tol);
    check_attention_on(&gpu_kvf32, 1, H, KVH, dk, dv, v_in_k, page_size, seq_len, seq_new, n_seqs,
                       tol);
}

static void test_attention(void **state) {
    SKIP_WITHOUT_GPU();
    /* The default GPU cache is bf16 (bf16x2 mode keeps fp32 for its
     * fp32-grade checks). check_attention runs each case on both caches,
     * with the CPU's cache holding the same values: the kernels' error
     * alone, so the fp32-math tolerances below hold for both. */
    if (!getenv("KILN_CUDA_KV")) assert_int_equal(backend_kv_dtype(&gpu), DTYPE_BF16);
    assert_int_equal(backend_kv_dtype(&gpu_split), DTYPE_F32);
    assert_int_equal(backend_kv_dtype(&gpu_kvf32), DTYPE_F32);
    int len[] = {40, 300, 7, 1, 150}, nw[] = {40, 1, 3, 1, 20};
    int page_sizes[] = {1, 16, 7, 64};
    /* Head sizes 64 and 128 take the tensor-core prefill kernel for the
     * multi-token sequences: q, k, p and v rounded to bf16 (2^-9), fp32
     * sums; measured 2e-3 – 4e-3 relative, as any bf16 attention. The
     * other shapes and every decode row stay fp32: 1e-5. */
    for (int i = 0; i < 4; i++) {
        check_attention(8, 2, 64, 64, 0, page_sizes[i], len, nw, 5, 1e-2);   /* GQA */
        check_attention(4, 1, 40, 32, 1, page_sizes[i], len, nw, 5, 1e-5);   /* MLA-like, V in K */
        check_attention(2, 2, 128, 128, 0, page_sizes[i], len, nw, 5, 1e-2); /* MHA, wide heads */
    }
    /* decode rows deep into the context: exercises split-KV */
    int dlen[] = {3000, 1234}, dnew[] = {1, 1};
    check_attention(8, 2, 64, 64, 0, 16, dlen, dnew, 2, 1e-5);
    /* DeepSeek-sized latent heads: fp32 on the fp32 cache; on the bf16 cache
     * the decode rows take the MLA kernel (q and p in bf16: test_cuda_mla) */
    check_attention_on(&gpu_kvf32, 1, 16, 1, 576, 512, 1, 1, dlen, dnew, 2, 1e-5);
    check_attention_on(&gpu, 1, 16, 1, 576, 512, 1, 1, dlen, dnew, 2, 1e-2);
    int one[] = {4000}, onew[] = {1};
    check_attention(1, 1, 128, 128, 0, 1, one, onew, 1, 1e-5);
    /* prompt chunks with a cached context, and a long prompt (several
     * query tiles, causal masking on the diagonal tiles only) */
    int clen[] = {1500, 700, 2}, cnew[] = {300, 700, 2};
    check_attention(16, 8, 128, 128, 0, 16, clen, cnew, 3, 1e-2);
    check_attention(32, 8, 64, 64, 0, 1, clen, cnew, 3, 1e-2);
    /* End to end: the GPU's bf16 cache against the CPU's fp32 one. K and V
     * carry bf16's half ulp (2^-9 = 2e-3 relative per element); the scores
     * (|q·k| up to a few units here) move by about 2e-3 of their size and
     * the output, a convex combination of V rows, by about the same:
     * measured ~3e-3; 1e-2 still catches any layout bug (errors near 1). */
    if (backend_kv_dtype(&gpu) == DTYPE_BF16) {
        check_attention_on(&gpu, 0, 8, 2, 64, 64, 0, 16, dlen, dnew, 2, 1e-2);
        check_attention_on(&gpu, 0, 16, 1, 576, 512, 1, 1, dlen, dnew, 2, 1e-2);
        check_attention_on(&gpu, 0, 8, 2, 64, 64, 0, 7, len, nw, 5, 1e-2);
        check_attention_on(&gpu, 0, 16, 8, 128, 128, 0, 16, clen, cnew, 3, 1e-2);
    }
}

/* Decode rows on the bf16 cache: cuda_attn_decode (tensor cores; q and p
 * carried as bf16 hi + lo, so the arithmetic is fp32-grade: the CPU gets
 * the same rounded cache and the tolerance is the fp32 one, 1e-5; dev/
 * attention measures 1e-6-ish against float64). Contexts 1 .. MAX_CONTEXT
 * around the 32/64/128-position tile and chunk boundaries, page sizes 1, 7,
 * 16 and 64, group sizes 1, 2, 4, 6, 8, 12 (two head blocks, the second
 * partial) and 16, head sizes 64 and 128. 13 rows split their chunks over
 * several CTAs (states folded by the last CTA of a row); 64 rows with 8 KV
 * heads fill the GPU and run unsplit. */
static void test_attention_decode(void **state) {
    SKIP_WITHOUT_GPU();
    if (backend_kv_dtype(&gpu) != DTYPE_BF16) fail_msg("the decode kernel needs the bf16 cache (KILN_CUDA_KV set?)");
    int len[] = {1, 2, 33, 64, 65, 127, 128, 129, 255, 256, 257, 1000, MAX_CONTEXT};
    int nw[13];
    for (int i = 0; i < 13; i++) nw[i] = 1;
    static const int shapes[][3] = {{4, 4, 64},  {16, 8, 128}, {16, 4, 128}, {12, 2, 64},
                                    {16, 2, 64}, {12, 1, 128}, {16, 1, 64}};
    int page_sizes[] = {1, 7, 16, 64};
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 4; j++)
            check_attention_on(&gpu, 1, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][2], 0,
                               page_sizes[j], len, nw, 13, 1e-5);
    int blen[64], bnw[64];
    for (int i = 0; i < 64; i++) blen[i] = 1 + irand(MAX_CONTEXT), bnw[i] = 1;
    check_attention_on(&gpu, 1, 16, 8, 128, 128, 0, 16, blen, bnw, 64, 1e-5);
    check_attention_on(&gpu, 1, 16, 8, 64, 64, 0, 1, blen, bnw, 64, 1e-5);
    /* the bf16 cache against the CPU's fp32 one (storage rounding, as above) */
    check_attention_on(&gpu, 0, 16, 8, 128, 128, 0, 16, len, nw, 13, 1e-2);
}

/* A decode row's output bits do not depend on the batch: one sequence
 * alone (its chunks split over many CTAs) and as row 37 of n sequences
 * (the GPU filled: fewer slots or none), on the same pages. */
static void check_decode_invariance(int H, int KVH, int d, int n) {
    int ps = 16, maxp = MAX_CONTEXT / ps, who = 37, pool = 1024; /* pages, shared at random */
    long stride = (long)KVH * d, ldq = (long)H * d, ldo = (long)H * d;
    long slots = (long)pool * ps;
    struct pair kc = kv_rand(&gpu, (size_t)(slots * stride), 1.0f, 1),
                vc = kv_rand(&gpu, (size_t)(slots * stride), 1.0f, 1);
    int32_t *pos = xmalloc((size_t)n * 4), *q_start = xmalloc((size_t)(n + 1) * 4),
            *page_start = xmalloc((size_t)(n + 1) * 4), *pages = xmalloc((size_t)n * maxp * 4);
    int pg = 0;
    for (int s = 0; s < n; s++) {
        int len = s == who ? 3001 : 1 + irand(MAX_CONTEXT);
        q_start[s] = s, pos[s] = len - 1, page_start[s] = pg;
        for (int i = 0; i < (len + ps - 1) / ps; i++) pages[pg++] = irand(pool);
    }
    q_start[n] = n, page_start[n] = pg;
    struct pair pp = pair_from(pos, (size_t)n * 4), pq = pair_from(q_start, (size_t)(n + 1) * 4),
                pps = pair_from(page_start, (size_t)(n + 1) * 4), ppg = pair_from(pages, (size_t)pg * 4);
    int32_t one_pos = pos[who], one_qs[2] = {0, 1}, one_ps[2] = {0, page_start[who + 1] - page_start[who]};
    struct pair op = pair_from(&one_pos, 4), oq = pair_from(one_qs, 8), ops = pair_from(one_ps, 8),
                opg = pair_from(pages + page_start[who], (size_t)one_ps[1] * 4);
    struct pair q = pair_rand((size_t)(n * ldq), 1.0f), o = pair_poison((size_t)(n * ldo)),
                o1 = pair_poison((size_t)ldo);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = d, .dv = d, .k_stride = stride,
                            .v_stride = stride, .scale = 1.0f / sqrtf((float)d)};
    struct backend_batch bn = {n, n, ps, pp.d, pq.d, pps.d, ppg.d}, b1 = {1, 1, ps, op.d, oq.d, ops.d, opg.d};
    gpu.ops->attention(gpu.ctx, o.d, ldo, q.d, ldq, kc.d, vc.d, &p, &bn);
    gpu.ops->attention(gpu.ctx, o1.d, ldo, (float *)q.d + who * ldq, ldq, kc.d, vc.d, &p, &b1);
    float *gn = xmalloc((size_t)(n * ldo) * 4), *g1 = xmalloc((size_t)ldo * 4);
    gpu.ops->download(gpu.ctx, gn, o.d, (size_t)(n * ldo) * 4);
    gpu.ops->download(gpu.ctx, g1, o1.d, (size_t)ldo * 4);
    printf("  decode invariance H=%d KVH=%d d=%d: alone vs row %d of %d\n", H, KVH, d, who, n);
    for (long e = 0; e < ldo; e++) assert_false(isnan(g1[e]));
    assert_memory_equal(gn + who * ldo, g1, (size_t)ldo * 4);
    free(gn), free(g1), free(pos), free(q_start), free(page_start), free(pages);
    pair_free(&kc), pair_free(&vc), pair_free(&pp), pair_free(&pq), pair_free(&pps), pair_free(&ppg);
    pair_free(&op), pair_free(&oq), pair_free(&ops), pair_free(&opg), pair_free(&q), pair_free(&o),
        pair_free(&o1);
}

static void test_attention_decode_invariance(void **state) {
    SKIP_WITHOUT_GPU();
    check_decode_invariance(16, 8, 64, 80);
    check_decode_invariance(32, 8, 128, 48);
    check_decode_invariance(24, 2, 128, 96); /* group 12: two head blocks */
}

/* attention_matmul (attention, then the output projection) on a batch of
 * n decode rows (H = 16, 8 KV heads, head size 128, contexts of 1..1024,
 * page size 16) against the CPU's attention + matmul (1e-2:
 * bf16 product operands), and against the GPU's own attention + matmul:
 * bit for bit where both take the same product (a 4 MiB weight: cuBLAS; at
 * 16 MiB the fused op takes the wgmma kernel on Hopper, the plain matmul
 * cuBLAS: 1e-5). Past the GEMV's rows the fused op hands the product the
 * attention kernel's 16-bit output and leaves `att` unwritten (checked: the
 * poison stays); at GEMV rows it runs the plain pair and writes it. */
static void check_attention_matmul(long n, long orows) {
    const int H = 16, KVH = 8, d = 128, ps = 16;
    long stride = (long)KVH * d, ldq = (long)H * d + 4, qw = (long)H * d;
    int32_t *pos = xmalloc((size_t)n * 4), *qs = xmalloc((size_t)(n + 1) * 4),
            *pst = xmalloc((size_t)(n + 1) * 4);
    int pg = 0;
    for (long r = 0; r < n; r++) {
        int len = 1 + irand(1024);
        qs[r] = (int32_t)r, pos[r] = len - 1, pst[r] = pg;
        pg += (len + ps - 1) / ps;
    }
    qs[n] = (int32_t)n, pst[n] = pg;
    int32_t *pages = xmalloc((size_t)pg * 4);
    for (int i = 0; i < pg; i++) pages[i] = pg - 1 - i; /* pages out of order */
    struct pair kc = kv_rand(&gpu, (size_t)((long)pg * ps * stride), 1.0f, 1),
                vc = kv_rand(&gpu, (size_t)((long)pg * ps * stride), 1.0f, 1);
    struct pair pp = pair_from(pos, (size_t)n * 4), pq = pair_from(qs, (size_t)(n + 1) * 4),
                pps = pair_from(pst, (size_t)(n + 1) * 4), ppg = pair_from(pages, (size_t)pg * 4);
    struct wpair wo = weight_rand(DTYPE_BF16, orows, qw, 1.0f / sqrtf((float)qw));
    struct pair q = pair_rand((size_t)(n * ldq), 1.0f), att = pair_poison((size_t)(n * qw)),
                att2 = pair_poison((size_t)(n * qw)), y = pair_poison((size_t)(n * orows)),
                y2 = pair_poison((size_t)(n * orows)), bias = pair_rand((size_t)orows, 0.5f);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = d, .dv = d, .k_stride = stride,
                            .v_stride = stride, .scale = 1.0f / sqrtf((float)d)};
    struct backend_batch bc = {(int)n, (int)n, ps, pos, qs, pst, pages},
                         bg = {(int)n, (int)n, ps, pp.d, pq.d, pps.d, ppg.d};
    cpu.ops->attention(cpu.ctx, att.h, qw, q.h, ldq, kc.h, vc.h, &p, &bc);
    cpu.ops->matmul(cpu.ctx, y.h, orows, att.h, qw, &wo.c, bias.h, n);
    gpu.ops->attention_matmul(gpu.ctx, y.d, orows, att.d, qw, q.d, ldq, kc.d, vc.d, &p, &bg, &wo.g,
                              bias.d, n);
    gpu.ops->attention(gpu.ctx, att2.d, qw, q.d, ldq, kc.d, vc.d, &p, &bg);
    gpu.ops->matmul(gpu.ctx, y2.d, orows, att2.d, qw, &wo.g, bias.d, n);
    gpu.ops->synchronize(gpu.ctx);
    const char *gm = getenv("KILN_CUDA_GEMV_MAX_ROWS"); /* the test backend's (main: 8) */
    int gemv = n <= (gm ? atol(gm) : 8);
    printf("  attention_matmul n=%ld o_proj %ldx%ld (%s)\n", n, orows, qw,
           gemv ? "GEMV rows: the plain pair" : "16-bit handoff");
    expect_close(&y, n, orows, orows, 1e-2);
    float *a = fetch_pair(&gpu, &att);
    size_t written = 0;
    for (long i = 0; i < n * qw; i++) written += !isnan(a[i]);
    free(a);
    if (gemv) assert_int_equal(written, (size_t)(n * qw));
    else assert_int_equal(written, 0);
    if (gemv || (long)orows * qw * 2 < (16l << 20)) {
        expect_same_bits(&gpu, &y, &y2, "attention_matmul");
    } else { /* another product kernel on the same operands: the sums' order */
        float *g = fetch_pair(&gpu, &y), *g2 = fetch_pair(&gpu, &y2);
        double num = 0, den = 0;
        for (long i = 0; i < n * orows; i++)
            num += ((double)g[i] - g2[i]) * ((double)g[i] - g2[i]), den += (double)g2[i] * g2[i];
        free(g), free(g2);
        assert_true(sqrt(num / den) < 1e-5);
    }
    weight_free(&wo);
    struct pair *all[] = {&kc, &vc, &pp, &pq, &pps, &ppg, &q, &att, &att2, &y, &y2, &bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    free(pos), free(qs), free(pst), free(pages);
}

static void test_attention_matmul(void **state) {
    SKIP_WITHOUT_GPU();
    if (backend_kv_dtype(&gpu) != DTYPE_BF16) fail_msg("the decode kernel needs the bf16 cache (KILN_CUDA_KV set?)");
    check_attention_matmul(1, 1024);
    check_attention_matmul(5, 1024);
    check_attention_matmul(24, 1024);
    check_attention_matmul(64, 1024);  /* 2-warp attention CTAs (one wave) */
    check_attention_matmul(64, 4096);  /* 16 MiB: the wgmma kernel on Hopper */
}

int main(void) {
    rng_seed("test_cuda_ops");
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    /* The GEMV serves up to 2 rows by default (measured faster than cuBLAS
     * only there); these tests exercise it up to 8 rows, its design limit. */
    setenv("KILN_CUDA_GEMV_MAX_ROWS", "8", 0);
    knob_reload(NULL); /* knobs are read once; this test compares settings */
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_cuda_ops: %s; the tests below fail\n", err.msg);
    } else {
        setenv("KILN_CUDA_MATMUL", "bf16x2", 1);
        knob_reload(NULL);
        if (backend_create(&gpu_split, "cuda", &bo, &err)) {
            fprintf(stderr, "cuda backend (bf16x2): %s\n", err.msg);
            return 1;
        }
        unsetenv("KILN_CUDA_MATMUL");
        setenv("KILN_CUDA_KV", "f32", 1);
        knob_reload(NULL);
        if (backend_create(&gpu_kvf32, "cuda", &bo, &err)) {
            fprintf(stderr, "cuda backend (fp32 KV): %s\n", err.msg);
            return 1;
        }
        unsetenv("KILN_CUDA_KV");
        knob_reload(NULL);
        struct backend_options bd = {.deterministic = 1};
        if (backend_create(&gpu_det, "cuda", &bd, &err)) {
            fprintf(stderr, "cuda backend (deterministic): %s\n", err.msg);
            return 1;
        }
        /* the product path's switches, one backend each */
        static const char *const vars[3][4] = {
            {"KILN_CUDA_PDL", NULL},
            {"KILN_CUDA_PDL", "KILN_CUDA_FUSE", "KILN_CUDA_LT", NULL},
            {NULL},
        };
        struct backend *vb[3] = {&gpu_nopdl, &gpu_old, &gpu_ks4};
        for (int i = 0; i < 3; i++) {
            for (int j = 0; vars[i][j]; j++) setenv(vars[i][j], "0", 1);
            if (i == 1) setenv("KILN_CUDA_GEMV_KS", "1", 1);
            if (i == 2) setenv("KILN_CUDA_GEMV_KS", "4", 1);
            knob_reload(NULL);
            int rc = backend_create(vb[i], "cuda", &bo, &err);
            for (int j = 0; vars[i][j]; j++) unsetenv(vars[i][j]);
            unsetenv("KILN_CUDA_GEMV_KS");
            knob_reload(NULL);
            if (rc) {
                fprintf(stderr, "cuda backend (variant %d): %s\n", i, err.msg);
                return 1;
            }
        }
        if (cpu.ops->reserve(cpu.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu.ops->reserve(gpu.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_split.ops->reserve(gpu_split.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_det.ops->reserve(gpu_det.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_kvf32.ops->reserve(gpu_kvf32.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_nopdl.ops->reserve(gpu_nopdl.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_old.ops->reserve(gpu_old.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err) ||
            gpu_ks4.ops->reserve(gpu_ks4.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err)) {
            fprintf(stderr, "reserve: %s\n", err.msg);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),      cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_qk_rope_store),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention),  cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_attention_decode_invariance),
        cmocka_unit_test(test_attention_matmul),
        cmocka_unit_test(test_fused),      cmocka_unit_test(test_pdl_chain),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu)
        backend_destroy(&gpu), backend_destroy(&gpu_split), backend_destroy(&gpu_det),
            backend_destroy(&gpu_kvf32), backend_destroy(&gpu_nopdl), backend_destroy(&gpu_old),
            backend_destroy(&gpu_ks4);
    backend_destroy(&cpu);
    return rc;
}
