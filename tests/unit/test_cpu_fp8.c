/* test_cpu_fp8.c — float8 e4m3 on the CPU: the scalar conversions of
 * tensor/dtype.h against the e4m3fn definition, and products with
 * block-quantized FP8 weights (struct backend_weight's block scales).
 *
 * The products' claim is exactness: cpu_matmul on FP8 weights gives, bit
 * for bit, what it gives on an fp32 copy of the dequantized weights
 * (fp8 value * block scale, rounded to fp32 once, written here from the
 * definition), in every kernel family the CPU runs, every path (stream,
 * packed, k chunks), any thread count and batch split; and that product is
 * the right one (a double-precision reference). Block shapes: 128 x 128
 * (the checkpoints'), 32 x 32 and odd ones (3 x 5, 7 x 3, 1 x 8) with
 * partial edge blocks. Then the CPU backend's operations that take weights:
 * matmul, matmul_heads and moe_ffn with FP8 weights against the same
 * operations on the fp32 copies (bitwise), and the bf16 mode, which takes
 * FP8 weights through the f32 arithmetic. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/threadpool.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- the conversions -------------------------------------------------- */

/* e4m3fn by its definition: sign, 4 exponent bits (bias 7), 3 mantissa
 * bits; exponent field 0 is subnormal (m / 8 * 2^-6); S.1111.111 is NaN;
 * no infinities. */
static double ref_fp8(uint8_t v) {
    int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return sign ? -NAN : NAN;
    double a = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return sign ? -a : a;
}

static void test_fp8_widen_every_code(void **state) {
    for (int v = 0; v < 256; v++) {
        float got = fp8_e4m3_to_f32((uint8_t)v);
        double want = ref_fp8((uint8_t)v);
        if (isnan(want)) {
            assert_true(isnan(got));
            assert_int_equal(!!signbit(got), v >> 7);
            continue;
        }
        if ((double)got != want || !!signbit(got) != v >> 7)
            fail_msg("fp8 0x%02x: %a, want %a", v, (double)got, want);
    }
    assert_true(fp8_e4m3_to_f32(0x7e) == 448.0f && fp8_e4m3_to_f32(0x01) == 0x1p-9f);
}

/* The nearest e4m3 code to f by brute force over the finite codes (ties
 * to the even code), values past 448 saturated. */
static uint8_t ref_narrow(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (a > 448.0) return sign | 0x7e;
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        double d = fabs(ref_fp8((uint8_t)c) - a), db = fabs(ref_fp8((uint8_t)best) - a);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    return (uint8_t)(sign | best);
}

static void check_narrow(float f, uint8_t want) {
    uint8_t got = f32_to_fp8_e4m3(f);
    if (got != want) fail_msg("f32_to_fp8_e4m3(%a) = 0x%02x, want 0x%02x", (double)f, got, want);
}

static void test_fp8_narrow(void **state) {
    /* every finite code comes back as itself (-0 as -0) */
    for (int v = 0; v < 256; v++)
        if ((v & 0x7f) != 0x7f) check_narrow(fp8_e4m3_to_f32((uint8_t)v), (uint8_t)v);
    /* midpoints between neighbours go to the even code; a hair off them,
     * to the nearer one (both signs; the midpoints are exact in fp32) */
    for (int v = 0; v < 0x7e; v++) {
        float a = fp8_e4m3_to_f32((uint8_t)v), b = fp8_e4m3_to_f32((uint8_t)(v + 1));
        float mid = (float)(((double)a + b) / 2);
        assert_true((double)mid == ((double)a + b) / 2);
        uint8_t even = (uint8_t)(v & 1 ? v + 1 : v);
        for (int sg = 0; sg < 2; sg++) {
            float s = sg ? -1.0f : 1.0f;
            uint8_t sb = sg ? 0x80 : 0;
            check_narrow(s * mid, sb | even);
            check_narrow(s * nextafterf(mid, 0.0f), sb | v);
            check_narrow(s * nextafterf(mid, INFINITY), sb | (v + 1));
        }
    }
    /* saturation: 448 is the largest; everything beyond, infinity too */
    static const float big[] = {448.0f, 449.0f, 463.99f, 464.0f, 479.0f, 480.0f, 512.0f, 1e6f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        check_narrow(big[i], 0x7e);
        check_narrow(-big[i], 0xfe);
    }
    /* underflow: half the smallest subnormal (2^-10) is a tie to 0 */
    check_narrow(0x1p-10f, 0x00);
    check_narrow(nextafterf(0x1p-10f, 1.0f), 0x01);
    check_narrow(-0x1p-12f, 0x80);
    check_narrow(FLT_MIN / 4, 0x00);
    assert_int_equal(f32_to_fp8_e4m3(NAN) & 0x7f, 0x7f);
    /* random values over every binade e4m3 has and around it */
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf(rng_uniform(&s), (int)(rng_next(&s) % 24) - 12);
        check_narrow(f, ref_narrow(f));
    }
}

/* ---- products ------------------------------------------------------------ */

/* Block-quantized weights [m][k] with blocks br x bc, and their fp32 copy:
 * deq = (float)fp8 * scale, one rounding, from the definition above. */
struct fp8w {
    uint8_t *q;
    float *scale, *deq;
    long m, k;
    int br, bc;
};

enum { SCALE_NORMAL, SCALE_EXTREME };

static long nblocks(long m, long k, int br, int bc) { return ((m + br - 1) / br) * ((k + bc - 1) / bc); }

/* nan: NaN codes allowed among the random ones; extreme: scales of every
 * magnitude, subnormal ones and ones above 2^100 (the widening's scalar
 * path) included, and negative ones. */
static struct fp8w make_fp8(uint64_t *s, long m, long k, int br, int bc, int nan, int extreme) {
    struct fp8w w = {.m = m, .k = k, .br = br, .bc = bc};
    long nb = nblocks(m, k, br, bc), nbc = (k + bc - 1) / bc;
    w.q = malloc((size_t)(m * k) + 1);
    w.scale = malloc((size_t)nb * sizeof(float) + 4);
    w.deq = malloc((size_t)(m * k) * sizeof(float) + 4);
    for (long b = 0; b < nb; b++) {
        float mant = 0.5f + 0.5f * fabsf(rng_uniform(s));
        int e = -(int)(rng_next(s) % 10) - 3;
        if (extreme) {
            static const int es[] = {-140, -130, -100, -20, 0, 20, 101, 110, 125};
            e = es[rng_next(s) % 9];
            if (rng_next(s) & 1) mant = -mant;
        }
        w.scale[b] = ldexpf(mant, e);
    }
    for (long r = 0; r < m; r++)
        for (long c = 0; c < k; c++) {
            uint8_t v = (uint8_t)rng_next(s);
            if (!nan && (v & 0x7f) == 0x7f) v ^= 1;
            w.q[r * k + c] = v;
            volatile float f = (float)ref_fp8(v); /* exact */
            w.deq[r * k + c] = f * w.scale[(r / br) * nbc + c / bc];
        }
    return w;
}

static void free_fp8(struct fp8w *w) {
    free(w->q);
    free(w->scale);
    free(w->deq);
}

static struct backend_weight bw_fp8(const struct fp8w *w) {
    return (struct backend_weight){.data = w->q, .dtype = DTYPE_F8_E4M3, .rows = w->m, .cols = w->k,
                                   .scale = w->scale, .block_rows = w->br, .block_cols = w->bc};
}

static struct backend_weight bw_f32(const struct fp8w *w) {
    return (struct backend_weight){.data = w->deq, .dtype = DTYPE_F32, .rows = w->m, .cols = w->k};
}

static float *make_floats(uint64_t *s, size_t count) {
    float *p = malloc((count + 1) * sizeof(float));
    for (size_t i = 0; i < count + 1; i++) p[i] = rng_uniform(s);
    return p;
}

static float *make_nans(size_t count) {
    float *p = malloc((count + 1) * sizeof(float));
    for (size_t i = 0; i < count + 1; i++) p[i] = NAN;
    return p;
}

/* The kernel families this CPU runs (cpu_matmul's f32 arithmetic). */
static int families(enum cpu_matmul_isa *out) {
    int cnt = 0;
    for (enum cpu_matmul_isa isa = CPU_MATMUL_PORTABLE; isa <= CPU_MATMUL_AVX512; isa++)
        if (cpu_matmul_cap_isa(isa) == isa) out[cnt++] = isa;
        else print_message("      this CPU has no %s kernel: not tested\n", cpu_matmul_isa_name(isa));
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    return cnt;
}

static const int kBlocks[][2] = {{128, 128}, {32, 32}, {3, 5}, {7, 3}, {1, 8}};
#define NBLOCKS (int)(sizeof kBlocks / sizeof *kBlocks)

/* Against a double-precision product of the dequantized weights. */
static void check_accuracy(struct threadpool *tp, uint64_t *s, long n, long m, long k, int br, int bc) {
    struct fp8w w = make_fp8(s, m, k, br, bc, 0, 0);
    long ldx = k + (long)(rng_next(s) % 3), ldy = m + (long)(rng_next(s) % 3);
    float *x = make_floats(s, (size_t)(n * ldx));
    float *bias = rng_next(s) & 1 ? make_floats(s, (size_t)m) : NULL;
    float *y = make_nans((size_t)(n * ldy));
    struct backend_weight bw = bw_fp8(&w);
    cpu_matmul(tp, y, ldy, x, ldx, &bw, bias, n);
    for (long i = 0; i < n; i++)
        for (long j = 0; j < ldy; j++) {
            float got = y[i * ldy + j];
            if (j >= m) {
                assert_true(isnan(got)); /* the row padding is left alone */
                continue;
            }
            double ref = bias ? bias[j] : 0.0, mag = bias ? fabs(bias[j]) : 0.0;
            for (long c = 0; c < k; c++) {
                double p = (double)x[i * ldx + c] * w.deq[j * k + c];
                ref += p;
                mag += fabs(p);
            }
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30))
                fail_msg("%s n=%ld m=%ld k=%ld blocks %dx%d: y[%ld][%ld] = %.9g, want %.9g",
                         cpu_matmul_isa_name(cpu_matmul_isa()), n, m, k, br, bc, i, j, got, ref);
        }
    free_fp8(&w);
    free(x);
    free(bias);
    free(y);
}

static void test_fp8_matmul_accuracy(void **state) {
    static const long ns[] = {1, 2, 3, 5, 8, 9, 17, 64};
    static const long mk[][2] = {{1, 1}, {13, 29}, {40, 300}, {130, 260}, {257, 129}, {9, 1000}};
    enum cpu_matmul_isa fam[4];
    int nf = families(fam);
    struct threadpool *tp = threadpool_create(2);
    for (int f = 0; f < nf; f++) {
        cpu_matmul_cap_isa(fam[f]);
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof mk / sizeof *mk; b++)
                for (int c = 0; c < NBLOCKS; c++)
                    check_accuracy(tp, &s, ns[a], mk[b][0], mk[b][1], kBlocks[c][0], kBlocks[c][1]);
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    threadpool_destroy(tp);
}

/* Bitwise equal; with nan, NaN outputs need only both be NaN: which of two
 * NaNs an FMA passes on (so the sign of a NaN output) depends on the
 * instruction form the compiler chose for a tile shape, in the F32 kernels
 * as much as here. */
static int same(const float *a, const float *b, size_t count, int nan) {
    for (size_t i = 0; i < count; i++)
        if (memcmp(&a[i], &b[i], 4) && !(nan && isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

/* FP8 = F32 on the dequantized copy, bitwise: the whole batch with 1, 2 and
 * 3 threads, each row alone, chunks of rows, a shard of outputs starting on
 * a block row (its scales a view into the grid), and the bf16 mode. */
static void check_exact(struct threadpool **tps, uint64_t *s, long n, long m, long k, int br, int bc,
                        int nan, int extreme) {
    struct fp8w w = make_fp8(s, m, k, br, bc, nan, extreme);
    const long ldx = k + 1, ldy = m + 2;
    float *x = make_floats(s, (size_t)(n * ldx));
    float *bias = rng_next(s) & 1 ? make_floats(s, (size_t)m) : NULL;
    float *want = make_nans((size_t)(n * ldy)), *got = make_nans((size_t)(n * ldy));
    struct backend_weight b8 = bw_fp8(&w), b32 = bw_f32(&w);
    cpu_matmul(tps[0], want, ldy, x, ldx, &b32, bias, n);
    char what[160];
    snprintf(what, sizeof what, "%s n=%ld m=%ld k=%ld blocks %dx%d nan=%d extreme=%d",
             cpu_matmul_isa_name(cpu_matmul_isa()), n, m, k, br, bc, nan, extreme);
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < (size_t)(n * ldy); i++) got[i] = NAN;
        cpu_matmul(tps[t], got, ldy, x, ldx, &b8, bias, n);
        if (!same(want, got, (size_t)(n * ldy), nan)) fail_msg("fp8 != f32 copy, %d threads: %s", t + 1, what);
    }
    for (size_t i = 0; i < (size_t)(n * ldy); i++) got[i] = NAN;
    for (long i = 0; i < n; i++) cpu_matmul(tps[1], got + i * ldy, ldy, x + i * ldx, ldx, &b8, bias, 1);
    if (!same(want, got, (size_t)(n * ldy), nan)) fail_msg("fp8 row by row != batch: %s", what);
    for (size_t i = 0; i < (size_t)(n * ldy); i++) got[i] = NAN;
    for (long i = 0; i < n; i += 5)
        cpu_matmul(tps[2], got + i * ldy, ldy, x + i * ldx, ldx, &b8, bias, n - i < 5 ? n - i : 5);
    if (!same(want, got, (size_t)(n * ldy), nan)) fail_msg("fp8 in chunks of 5 != batch: %s", what);
    long j0 = (m / 2) / br * br; /* a shard starting on a block row */
    if (j0 > 0) {
        struct backend_weight sh = b8;
        sh.data = w.q + j0 * k;
        sh.rows = m - j0;
        sh.scale = w.scale + (j0 / br) * ((k + bc - 1) / bc);
        for (size_t i = 0; i < (size_t)(n * ldy); i++) got[i] = NAN;
        cpu_matmul(tps[1], got + j0, ldy, x, ldx, &sh, bias ? bias + j0 : NULL, n);
        for (long i = 0; i < n; i++)
            if (!same(want + i * ldy + j0, got + i * ldy + j0, (size_t)(m - j0), nan))
                fail_msg("fp8 shard from row %ld != whole: %s", j0, what);
    }
    /* the bf16 mode takes FP8 weights through the f32 arithmetic */
    for (size_t i = 0; i < (size_t)(n * ldy); i++) got[i] = NAN;
    cpu_matmul_bf16(tps[1], got, ldy, x, ldx, &b8, bias, n);
    if (!same(want, got, (size_t)(n * ldy), nan)) fail_msg("bf16 mode fp8 != f32 copy: %s", what);
    free_fp8(&w);
    free(x);
    free(bias);
    free(want);
    free(got);
}

static void test_fp8_matmul_exact(void **state) {
    static const long ns[] = {1, 2, 3, 4, 7, 8, 9, 13, 37};
    static const long mk[][2] = {{1, 7}, {8, 8}, {17, 9}, {67, 172}, {130, 1000}, {25, 3100}, {12, 4100}};
    enum cpu_matmul_isa fam[4];
    int nf = families(fam);
    struct threadpool *tps[3];
    for (int t = 0; t < 3; t++) tps[t] = threadpool_create(t + 1);
    for (int f = 0; f < nf; f++) {
        cpu_matmul_cap_isa(fam[f]);
        print_message("      %s kernel\n", cpu_matmul_isa_name(fam[f]));
        uint64_t s = 0x0123456789abcdefull;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof mk / sizeof *mk; b++) {
                int c = (int)(rng_next(&s) % NBLOCKS);
                check_exact(tps, &s, ns[a], mk[b][0], mk[b][1], kBlocks[c][0], kBlocks[c][1], 0, 0);
            }
        /* NaN codes, and scales of every magnitude: the vector widening's
         * special cases against the definition */
        for (int c = 0; c < NBLOCKS; c++) {
            check_exact(tps, &s, 1, 33, 301, kBlocks[c][0], kBlocks[c][1], 1, 0);
            check_exact(tps, &s, 5, 33, 301, kBlocks[c][0], kBlocks[c][1], 1, 0);
            check_exact(tps, &s, 3, 33, 301, kBlocks[c][0], kBlocks[c][1], 1, 1);
            check_exact(tps, &s, 20, 33, 301, kBlocks[c][0], kBlocks[c][1], 0, 1);
        }
        /* several threads' worth of outputs with the checkpoints' blocks */
        check_exact(tps, &s, 1, 300, 1100, 128, 128, 0, 0);
        check_exact(tps, &s, 64, 300, 1100, 128, 128, 0, 0);
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    for (int t = 0; t < 3; t++) threadpool_destroy(tps[t]);
}

/* Every code through each kernel's widening: y = x · wᵀ with x the
 * identity picks the weights out (fma(1, w, 0) and sums with zeros are w;
 * only a -0 comes out +0), for rows alone (stream) and all at once (packed),
 * each code at several scales, blocks of 64 columns with a tail. The NaN
 * codes have rows of their own (0 · NaN is NaN), all 0x7f or all 0xff: the
 * row's outputs are its NaN, payload and sign. */
static void test_fp8_kernel_widens_every_code(void **state) {
    enum { M = 10, K = 256 + 3, BC = 64 };
    static uint8_t q[M * K];
    static float scale[(K + BC - 1) / BC], x[K * K], y[K * M];
    for (int j = 0; j < M; j++)
        for (int c = 0; c < K; c++) {
            uint8_t v = (uint8_t)(c + 37 * j);
            q[j * K + c] = j == 8 ? 0x7f : j == 9 ? 0xff : (v & 0x7f) == 0x7f ? v ^ 1 : v;
        }
    for (int b = 0; b < (K + BC - 1) / BC; b++) scale[b] = ldexpf(0.75f - 0.125f * b, 3 * b - 4);
    for (int i = 0; i < K; i++) x[i * K + i] = 1.0f;
    struct backend_weight w = {.data = q, .dtype = DTYPE_F8_E4M3, .rows = M, .cols = K, .scale = scale,
                               .block_rows = M, .block_cols = BC};
    enum cpu_matmul_isa fam[4];
    int nf = families(fam);
    for (int f = 0; f < nf; f++) {
        cpu_matmul_cap_isa(fam[f]);
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 0) cpu_matmul(NULL, y, M, x, K, &w, NULL, K);
            else
                for (int i = 0; i < K; i++) cpu_matmul(NULL, y + i * M, M, x + i * K, K, &w, NULL, 1);
            for (int i = 0; i < K; i++)
                for (int j = 0; j < M; j++) {
                    float want = fp8_e4m3_to_f32(q[j * K + i]) * scale[i / BC], got = y[i * M + j];
                    if (want == 0.0f && got == 0.0f) continue;
                    if (memcmp(&want, &got, 4))
                        fail_msg("%s, %s: code 0x%02x scale %a: %a, want %a", cpu_matmul_isa_name(fam[f]),
                                 pass ? "rows alone" : "all rows", q[j * K + i], (double)scale[i / BC],
                                 (double)got, (double)want);
                }
        }
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
}

/* ---- the CPU backend's operations ------------------------------------- */

static void assert_same(const float *a, const float *b, size_t count, const char *what) {
    if (memcmp(a, b, count * sizeof(float))) fail_msg("%s: fp8 != f32 copy", what);
}

/* matmul (with bias) and matmul_heads on heads that start on a block row. */
static void test_fp8_backend_matmul(void **state) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    const struct backend_ops *ops = be.ops;
    assert_int_equal(ops->fp8_weights, 1); /* the model loads FP8 weights for it */
    uint64_t s = 0x5851f42d4c957f2dull;
    for (long n = 1; n <= 33; n += 16) {
        /* matmul: 3 x 5 blocks, edges partial */
        struct fp8w w = make_fp8(&s, 50, 71, 3, 5, 0, 0);
        struct backend_weight b8 = bw_fp8(&w), b32 = bw_f32(&w);
        float *x = make_floats(&s, (size_t)(n * 71)), *bias = make_floats(&s, 50);
        float *a = make_nans((size_t)(n * 50)), *b = make_nans((size_t)(n * 50));
        ops->matmul(be.ctx, a, 50, x, 71, &b8, bias, n);
        ops->matmul(be.ctx, b, 50, x, 71, &b32, bias, n);
        assert_same(a, b, (size_t)(n * 50), "matmul");
        free(x), free(bias), free(a), free(b);
        free_fp8(&w);

        /* matmul_heads: 4 heads of 16 rows, 32 rows apart, from row 16 of a
         * 128 x 48 tensor with 16 x 32 blocks (W_UV's views) */
        const int H = 4;
        const long rows = 16, cols = 48, w_stride = 32 * cols, off = 16;
        struct fp8w t = make_fp8(&s, 128, cols, 16, 32, 0, 0);
        struct backend_weight h8 = bw_fp8(&t), h32 = bw_f32(&t);
        h8.data = t.q + off * cols, h8.rows = rows, h8.scale = t.scale + (off / 16) * 2;
        h32.data = t.deq + off * cols, h32.rows = rows;
        float *xh = make_floats(&s, (size_t)(n * H * cols));
        float *ya = make_nans((size_t)(n * H * rows)), *yb = make_nans((size_t)(n * H * rows));
        ops->matmul_heads(be.ctx, ya, H * rows, rows, xh, H * cols, cols, &h8, w_stride, H, n);
        ops->matmul_heads(be.ctx, yb, H * rows, rows, xh, H * cols, cols, &h32, w_stride, H, n);
        assert_same(ya, yb, (size_t)(n * H * rows), "matmul_heads");
        free(xh), free(ya), free(yb);
        free_fp8(&t);
    }
    backend_destroy(&be);
}

/* moe_ffn with FP8 experts (gate, up, down) against fp32 copies. */
static void test_fp8_backend_moe(void **state) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    enum { E = 6, TOPK = 2 };
    const long H = 96, F = 80;
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int blk = 0; blk < 2; blk++) {
        int br = blk ? 128 : 32, bc = blk ? 128 : 32;
        struct fp8w g[E], u[E], d[E];
        struct backend_weight g8[E], u8[E], d8[E], g32[E], u32[E], d32[E];
        for (int e = 0; e < E; e++) {
            g[e] = make_fp8(&s, F, H, br, bc, 0, 0), u[e] = make_fp8(&s, F, H, br, bc, 0, 0);
            d[e] = make_fp8(&s, H, F, br, bc, 0, 0);
            g8[e] = bw_fp8(&g[e]), u8[e] = bw_fp8(&u[e]), d8[e] = bw_fp8(&d[e]);
            g32[e] = bw_f32(&g[e]), u32[e] = bw_f32(&u[e]), d32[e] = bw_f32(&d[e]);
        }
        struct moe_experts e8 = {
            .n_experts = E, .hidden = (int)H, .inter = (int)F, .gate = g8, .up = u8, .down = d8};
        struct moe_experts e32 = e8;
        e32.gate = g32, e32.up = u32, e32.down = d32;
        static const long ns[] = {1, 5, 40};
        for (int i = 0; i < 3; i++) {
            long n = ns[i];
            float *x = make_floats(&s, (size_t)(n * H)), *wt = malloc((size_t)(n * TOPK) * sizeof(float));
            int32_t *ids = malloc((size_t)(n * TOPK) * sizeof(int32_t));
            for (long t = 0; t < n; t++) {
                ids[t * TOPK] = (int32_t)(rng_next(&s) % E);
                ids[t * TOPK + 1] = (int32_t)((ids[t * TOPK] + 1 + rng_next(&s) % (E - 1)) % E);
                wt[t * TOPK] = fabsf(rng_uniform(&s)), wt[t * TOPK + 1] = fabsf(rng_uniform(&s));
            }
            float *a = make_nans((size_t)(n * H)), *b = make_nans((size_t)(n * H));
            be.ops->moe_ffn(be.ctx, a, x, ids, wt, TOPK, &e8, n);
            be.ops->moe_ffn(be.ctx, b, x, ids, wt, TOPK, &e32, n);
            assert_same(a, b, (size_t)(n * H), "moe_ffn");
            for (long j = 0; j < n * H; j++) assert_false(isnan(a[j]));
            free(x), free(wt), free(ids), free(a), free(b);
        }
        for (int e = 0; e < E; e++) free_fp8(&g[e]), free_fp8(&u[e]), free_fp8(&d[e]);
    }
    backend_destroy(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_widen_every_code),
        cmocka_unit_test(test_fp8_narrow),
        cmocka_unit_test(test_fp8_kernel_widens_every_code),
        cmocka_unit_test(test_fp8_matmul_accuracy),
        cmocka_unit_test(test_fp8_matmul_exact),
        cmocka_unit_test(test_fp8_backend_matmul),
        cmocka_unit_test(test_fp8_backend_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
