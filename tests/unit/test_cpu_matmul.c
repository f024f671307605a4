/* test_cpu_matmul.c — cpu_matmul against a double-precision reference, and
 * its invariance contract: a row's results are bitwise the same alone, in
 * any batch, at any position and with any number of threads. Each kernel
 * family the CPU runs (portable, AVX2, AVX-512) is checked on its own, and
 * AVX-512 against AVX2 to the bit.
 *
 * The bf16 mode (cpu_matmul_bf16) against a scalar model of its arithmetic
 * written here from the definition (bf16 rounding in double precision,
 * vdpbf16ps's lane order): bitwise, for each of its kernels the CPU runs
 * (vdpbf16ps, AVX2, portable), and the same invariance checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "backend/cpu/cpu_matmul.h"
#include "base/threadpool.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

typedef void (*matmul_fn)(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                          const void *w, enum dtype wt, const float *bias, long n, long m, long k);

/* cpu_matmul and cpu_matmul_bf16 on a [m][k] weight of dtype wt. */
static void mm_f32(struct threadpool *tp, float *y, long ldy, const float *x, long ldx, const void *w,
                   enum dtype wt, const float *bias, long n, long m, long k) {
    struct backend_weight bw = {.data = w, .dtype = wt, .rows = m, .cols = k};
    cpu_matmul(tp, y, ldy, x, ldx, &bw, bias, n);
}

static void mm_bf16(struct threadpool *tp, float *y, long ldy, const float *x, long ldx, const void *w,
                    enum dtype wt, const float *bias, long n, long m, long k) {
    struct backend_weight bw = {.data = w, .dtype = wt, .rows = m, .cols = k};
    cpu_matmul_bf16(tp, y, ldy, x, ldx, &bw, bias, n);
}

static const enum dtype kDtypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
/* A NaN with a payload no arithmetic produces: marks unwritten outputs. */
static const uint32_t kPoison = 0x7fc0dead;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Random weights in dtype wt; *exact gets the values they represent. */
static void *make_weights(uint64_t *s, enum dtype wt, long m, long k, float **exact) {
    size_t count = (size_t)(m * k) + 1;
    void *w = malloc(count * dtype_size(wt));
    float *e = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        float v = rng_uniform(s);
        if (wt == DTYPE_F32) {
            ((float *)w)[i] = v;
            e[i] = v;
        } else if (wt == DTYPE_F16) {
            uint16_t h = f32_to_f16(v);
            ((uint16_t *)w)[i] = h;
            e[i] = f16_to_f32(h);
        } else {
            uint16_t h = f32_to_bf16(v);
            ((uint16_t *)w)[i] = h;
            e[i] = bf16_to_f32(h);
        }
    }
    *exact = e;
    return w;
}

static float *make_floats(uint64_t *s, size_t count) {
    float *p = malloc((count + 1) * sizeof(float));
    for (size_t i = 0; i < count + 1; i++) p[i] = rng_uniform(s);
    return p;
}

static void poison(float *p, size_t count) {
    for (size_t i = 0; i < count; i++) memcpy(&p[i], &kPoison, 4);
}

static float *make_poisoned(size_t count) {
    float *p = malloc((count + 1) * sizeof(float));
    poison(p, count + 1);
    return p;
}

static int is_poison(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u == kPoison;
}

static void check_case(matmul_fn fn, struct threadpool *tp, uint64_t *s, enum dtype wt, long n,
                       long m, long k, long ldx, long ldy, int with_bias) {
    float *we;
    void *w = make_weights(s, wt, m, k, &we);
    float *x = make_floats(s, (size_t)(n * ldx));
    float *bias = with_bias ? make_floats(s, (size_t)m) : NULL;
    float *y = make_poisoned((size_t)(n * ldy));
    fn(tp, y, ldy, x, ldx, w, wt, bias, n, m, k);
    int bad = 0;
    for (long i = 0; i < n && bad < 5; i++) {
        for (long j = 0; j < ldy; j++) {
            float got = y[i * ldy + j];
            if (j >= m) { /* the row padding must be left alone */
                if (!is_poison(got)) {
                    print_error("padding written: n=%ld m=%ld k=%ld i=%ld j=%ld\n", n, m, k, i, j);
                    bad++;
                }
                continue;
            }
            double ref = bias ? bias[j] : 0.0, mag = bias ? fabs(bias[j]) : 0.0;
            for (long kk = 0; kk < k; kk++) {
                double p = (double)x[i * ldx + kk] * we[j * k + kk];
                ref += p;
                mag += fabs(p);
            }
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30)) {
                print_error("dtype %s n=%ld m=%ld k=%ld ldx=%ld ldy=%ld bias=%d: y[%ld][%ld] = %.9g, "
                            "want %.9g\n",
                            dtype_name(wt), n, m, k, ldx, ldy, with_bias, i, j, got, ref);
                bad++;
            }
        }
    }
    assert_int_equal(bad, 0);
    free(w);
    free(we);
    free(x);
    free(bias);
    free(y);
}

static void run_accuracy(matmul_fn fn) {
    static const long ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 33, 70};
    static const long ms[] = {1, 3, 8, 13, 17, 40};
    static const long ks[] = {0, 1, 7, 8, 9, 64, 172, 1000};
    struct threadpool *tp1 = threadpool_create(1), *tp2 = threadpool_create(2);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    long cases = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            for (size_t c = 0; c < sizeof ks / sizeof *ks; c++)
                for (size_t d = 0; d < 3; d++) {
                    long n = ns[a], m = ms[b], k = ks[c];
                    long ldx = k + (long)(rng_next(&s) % 3) * 5, ldy = m + (long)(rng_next(&s) % 3);
                    int with_bias = (int)(rng_next(&s) & 1);
                    struct threadpool *tp = (cases & 1) ? tp2 : tp1;
                    check_case(fn, tp, &s, kDtypes[d], n, m, k, ldx, ldy, with_bias);
                    cases++;
                }
    /* Large enough to use every thread and every tile shape; k so long that
     * the blocked x path holds only one tile of rows. */
    for (size_t d = 0; d < 3; d++) {
        check_case(fn, tp2, &s, kDtypes[d], 70, 301, 1000, 1003, 305, 1);
        check_case(fn, tp2, &s, kDtypes[d], 6, 11, 70001, 70001, 11, 0);
    }
    threadpool_destroy(tp1);
    threadpool_destroy(tp2);
}

/* Caps the kernel family at isa; false (and a note) when this CPU cannot
 * run it, so the caller skips: a CPU without AVX-512 has nothing to test. */
static int use_isa(enum cpu_matmul_isa isa) {
    if (cpu_matmul_cap_isa(isa) == isa) return 1;
    print_message("      this CPU has no %s kernel: skipped\n", cpu_matmul_isa_name(isa));
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    return 0;
}

static void test_accuracy(enum cpu_matmul_isa isa) {
    if (!use_isa(isa)) skip();
    run_accuracy(mm_f32);
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
}

static void test_accuracy_portable(void **state) { test_accuracy(CPU_MATMUL_PORTABLE); }
static void test_accuracy_avx2(void **state) { test_accuracy(CPU_MATMUL_AVX2); }
static void test_accuracy_avx512(void **state) { test_accuracy(CPU_MATMUL_AVX512); }

/* All rows at once vs each row alone, in chunks and with 1..3 threads. */
static void check_invariance(matmul_fn fn, uint64_t *s, enum dtype wt, long m, long k, int with_bias) {
    const long n = 37, ldx = k + 3, ldy = m + 1;
    float *we;
    void *w = make_weights(s, wt, m, k, &we);
    float *x = make_floats(s, (size_t)(n * ldx));
    float *bias = with_bias ? make_floats(s, (size_t)m) : NULL;
    float *full = make_poisoned((size_t)(n * ldy)), *part = make_poisoned((size_t)(n * ldy));
    /* Rows alone also come from a buffer with another alignment. */
    float *row = malloc((size_t)(k + 8) * sizeof(float));
    struct threadpool *tps[3];
    for (int t = 0; t < 3; t++) tps[t] = threadpool_create(t + 1);

    fn(tps[1], full, ldy, x, ldx, w, wt, bias, n, m, k);
    for (int t = 0; t < 3; t++) {
        poison(part, (size_t)(n * ldy));
        fn(tps[t], part, ldy, x, ldx, w, wt, bias, n, m, k);
        assert_memory_equal(full, part, (size_t)(n * ldy) * sizeof(float));

        poison(part, (size_t)(n * ldy));
        for (long i = 0; i < n; i++) {
            memcpy(row + 1 + (i % 7), x + i * ldx, (size_t)k * sizeof(float));
            fn(tps[t], part + i * ldy, ldy, row + 1 + (i % 7), k, w, wt, bias, 1, m, k);
        }
        assert_memory_equal(full, part, (size_t)(n * ldy) * sizeof(float));

        static const long chunks[] = {2, 3, 5, 8, 16};
        for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
            poison(part, (size_t)(n * ldy));
            for (long i = 0; i < n; i += chunks[c]) {
                long rows = n - i < chunks[c] ? n - i : chunks[c];
                fn(tps[t], part + i * ldy, ldy, x + i * ldx, ldx, w, wt, bias, rows, m, k);
            }
            assert_memory_equal(full, part, (size_t)(n * ldy) * sizeof(float));
        }
    }
    /* Sub-ranges of outputs (as a tensor-parallel shard or a differently
     * aligned thread split would compute them) give the same bits too. */
    long j0 = m / 3;
    if (j0 > 0) {
        size_t esz = dtype_size(wt);
        poison(part, (size_t)(n * ldy));
        fn(tps[2], part + j0, ldy, x, ldx, (const char *)w + (size_t)(j0 * k) * esz, wt,
           bias ? bias + j0 : NULL, n, m - j0, k);
        for (long i = 0; i < n; i++)
            assert_memory_equal(full + i * ldy + j0, part + i * ldy + j0,
                                (size_t)(m - j0) * sizeof(float));
    }
    for (int t = 0; t < 3; t++) threadpool_destroy(tps[t]);
    free(w);
    free(we);
    free(x);
    free(bias);
    free(full);
    free(part);
    free(row);
}

static void run_invariance(matmul_fn fn) {
    static const long ms[] = {67, 300};
    static const long ks[] = {9, 172, 1000, 3100}; /* 3100: k chunks in every SIMD family */
    uint64_t s = 0x0123456789abcdefull;
    for (size_t d = 0; d < 3; d++)
        for (size_t a = 0; a < 2; a++)
            for (size_t b = 0; b < 4; b++) check_invariance(fn, &s, kDtypes[d], ms[a], ks[b], (int)((a + b) & 1));
}

static void test_invariance(enum cpu_matmul_isa isa) {
    if (!use_isa(isa)) skip();
    run_invariance(mm_f32);
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
}

static void test_invariance_portable(void **state) { test_invariance(CPU_MATMUL_PORTABLE); }
static void test_invariance_avx2(void **state) { test_invariance(CPU_MATMUL_AVX2); }
static void test_invariance_avx512(void **state) { test_invariance(CPU_MATMUL_AVX512); }

/* The AVX-512 kernel performs the AVX2 kernel's operations: the same bits
 * for every shape, in both its stream (n <= 8) and packed paths, across
 * tile edges (n, m not multiples of the tiles), k tails and k chunks
 * (k = 4100 is cut into chunks by both kernels). */
static void test_avx512_equals_avx2(void **state) {
    if (!use_isa(CPU_MATMUL_AVX512)) skip();
    static const long ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 37, 70};
    static const long ms[] = {1, 2, 3, 5, 8, 9, 16, 17, 23, 67};
    static const long ks[] = {0, 1, 7, 8, 9, 100, 1031, 4100};
    struct threadpool *tp = threadpool_create(2);
    uint64_t s = 0x5851f42d4c957f2dull;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
                long n = ns[a], m = ms[b], k = ks[c], ldx = k + (long)(rng_next(&s) % 3),
                     ldy = m + (long)(rng_next(&s) % 2);
                enum dtype wt = kDtypes[rng_next(&s) % 3];
                float *we;
                void *w = make_weights(&s, wt, m, k, &we);
                float *x = make_floats(&s, (size_t)(n * ldx));
                float *bias = rng_next(&s) & 1 ? make_floats(&s, (size_t)m) : NULL;
                float *y2 = make_poisoned((size_t)(n * ldy)), *y5 = make_poisoned((size_t)(n * ldy));
                cpu_matmul_cap_isa(CPU_MATMUL_AVX2);
                mm_f32(tp, y2, ldy, x, ldx, w, wt, bias, n, m, k);
                cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
                mm_f32(tp, y5, ldy, x, ldx, w, wt, bias, n, m, k);
                if (memcmp(y2, y5, (size_t)(n * ldy) * sizeof(float)))
                    fail_msg("avx512 != avx2: dtype %s n=%ld m=%ld k=%ld bias=%d", dtype_name(wt), n, m, k,
                             bias != NULL);
                free(w);
                free(we);
                free(x);
                free(bias);
                free(y2);
                free(y5);
            }
    threadpool_destroy(tp);
}

/* ---- bf16 mode ---------------------------------------------------------- */

/* bf16(v) by its definition: the nearest of the two bf16 values around v
 * (ties to the even one), computed in double; subnormals become zero of the
 * same sign, values past the largest bf16 by half an ulp become infinity.
 * (NaN is not produced by the tests.) */
static uint16_t ref_round_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward larger magnitude */
    const double a = fabs((double)bf16_to_f32(lo)), x = fabs((double)v);
    /* the next value up: twice the ulp's binade end when lo is the largest finite */
    const double b = (lo & 0x7fffu) == 0x7f7fu ? ldexp(1.0, 128) : fabs((double)bf16_to_f32(hi));
    if (x - a < b - x) return lo;
    if (x - a > b - x) return hi;
    return (lo & 1u) ? hi : lo;
}

/* One output of the bf16 arithmetic (cpu_matmul_kernels.h), written from
 * its definition: 16 lanes, odd then even element of each pair, each
 * addition rounded to fp32, then the halving tree. */
static float ref_dot_bf16(const float *x, const uint16_t *w, long k) {
    float acc[16] = {0};
    for (long kb = 0; kb < k; kb += 32)
        for (int l = 0; l < 16; l++)
            for (int e = 1; e >= 0; e--) {
                long kk = kb + 2 * l + e;
                if (kk >= k) continue; /* a zero product leaves the lane as it is */
                volatile float p = bf16_to_f32(ref_round_bf16(x[kk])) * bf16_to_f32(w[kk]);
                acc[l] = acc[l] + p;
            }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) t[l] = t[l] + t[l + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* x of several magnitudes, with some values exactly halfway between two
 * bf16 values (the round-to-even cases). */
static float *make_x_bf16(uint64_t *s, size_t count) {
    float *p = make_floats(s, count);
    for (size_t i = 0; i < count; i++) {
        p[i] = ldexpf(p[i], (int)(rng_next(s) % 41) - 20);
        if (rng_next(s) % 8 == 0) { /* a tie: a bf16 value plus half its ulp */
            uint32_t u;
            memcpy(&u, &p[i], 4);
            u = (u & 0xffff0000u) | 0x8000u;
            memcpy(&p[i], &u, 4);
        }
    }
    return p;
}

/* The bf16 kernels this CPU runs, best first; says so when it has no
 * AVX512-BF16 (then the AVX2 and portable kernels are what is tested). */
static int bf16_families(enum cpu_matmul_isa *out) {
    static int told;
    int cnt = 0;
    enum cpu_matmul_isa top = cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    if (top == CPU_MATMUL_AVX512BF16) out[cnt++] = CPU_MATMUL_AVX512BF16;
    else if (!told++)
        print_message("      this CPU has no AVX512-BF16: the vdpbf16ps kernel is not tested here, "
                      "its fallbacks are\n");
    if (top >= CPU_MATMUL_AVX2) out[cnt++] = CPU_MATMUL_AVX2;
    out[cnt++] = CPU_MATMUL_PORTABLE;
    return cnt;
}

static void check_bf16_case(struct threadpool *tp, uint64_t *s, long n, long m, long k, long ldx,
                            long ldy, int with_bias) {
    float *we;
    uint16_t *w = make_weights(s, DTYPE_BF16, m, k, &we);
    float *x = make_x_bf16(s, (size_t)(n * ldx));
    float *bias = with_bias ? make_floats(s, (size_t)m) : NULL;
    float *y = make_poisoned((size_t)(n * ldy));
    mm_bf16(tp, y, ldy, x, ldx, w, DTYPE_BF16, bias, n, m, k);
    int bad = 0;
    for (long i = 0; i < n && bad < 5; i++)
        for (long j = 0; j < ldy && bad < 5; j++) {
            float got = y[i * ldy + j];
            if (j >= m) {
                if (!is_poison(got)) {
                    print_error("padding written: n=%ld m=%ld k=%ld i=%ld j=%ld\n", n, m, k, i, j);
                    bad++;
                }
                continue;
            }
            float want = ref_dot_bf16(x + i * ldx, w + j * k, k);
            if (bias) want = want + bias[j];
            if (memcmp(&got, &want, 4)) {
                print_error("%s: n=%ld m=%ld k=%ld ldx=%ld bias=%d: y[%ld][%ld] = %a, want %a\n",
                            cpu_matmul_isa_name(cpu_matmul_isa()), n, m, k, ldx, with_bias, i, j, got, want);
                bad++;
            }
        }
    assert_int_equal(bad, 0);
    free(w);
    free(we);
    free(x);
    free(bias);
    free(y);
}

/* Every kernel of the bf16 mode equals the scalar model to the bit, over
 * both loop nests (n <= 8 and above), every tail of n, m and k (k not a
 * multiple of 32, odd, 0), and k chunks (k above 2048 and 4096). */
static void test_bf16_reference(void **state) {
    static const long ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 33, 70};
    static const long ms[] = {1, 3, 8, 13, 17, 40};
    static const long ks[] = {0, 1, 7, 31, 32, 33, 63, 100, 1000};
    enum cpu_matmul_isa fam[3];
    int nf = bf16_families(fam);
    struct threadpool *tp1 = threadpool_create(1), *tp2 = threadpool_create(2);
    for (int f = 0; f < nf; f++) {
        cpu_matmul_cap_isa(fam[f]);
        print_message("      bf16 mode, %s kernel\n", cpu_matmul_isa_name(fam[f]));
        uint64_t s = 0x9e3779b97f4a7c15ull;
        long cases = 0;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
                for (size_t c = 0; c < sizeof ks / sizeof *ks; c++, cases++) {
                    long n = ns[a], m = ms[b], k = ks[c];
                    long ldx = k + (long)(rng_next(&s) % 3) * 5, ldy = m + (long)(rng_next(&s) % 3);
                    check_bf16_case(cases & 1 ? tp2 : tp1, &s, n, m, k, ldx, ldy, (int)(rng_next(&s) & 1));
                }
        check_bf16_case(tp2, &s, 70, 301, 1000, 1003, 305, 1);
        check_bf16_case(tp2, &s, 40, 19, 2049, 2049, 19, 0);
        check_bf16_case(tp2, &s, 17, 21, 4100, 4111, 22, 1);
        check_bf16_case(tp2, &s, 3, 11, 70001, 70001, 11, 0);
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    threadpool_destroy(tp1);
    threadpool_destroy(tp2);
}

/* The bf16 mode is batch-invariant in each of its kernels: a row alone, in
 * batches of several sizes, with 1..3 threads and in a shard of outputs
 * gives the same bits (F16/F32 weights take cpu_matmul: checked too). */
static void test_bf16_invariance(void **state) {
    enum cpu_matmul_isa fam[3];
    int nf = bf16_families(fam);
    for (int f = 0; f < nf; f++) {
        cpu_matmul_cap_isa(fam[f]);
        print_message("      bf16 mode, %s kernel\n", cpu_matmul_isa_name(fam[f]));
        run_invariance(mm_bf16);
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
}

/* Weights other than BF16 are untouched by the mode: cpu_matmul's bits. */
static void test_bf16_mode_other_dtypes(void **state) {
    struct threadpool *tp = threadpool_create(2);
    uint64_t s = 0x5851f42d4c957f2dull;
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16};
    for (int d = 0; d < 2; d++)
        for (long n = 1; n <= 37; n += 12) {
            long m = 45, k = 300;
            float *we;
            void *w = make_weights(&s, dts[d], m, k, &we);
            float *x = make_floats(&s, (size_t)(n * k));
            float *a = make_poisoned((size_t)(n * m)), *b = make_poisoned((size_t)(n * m));
            mm_f32(tp, a, m, x, k, w, dts[d], NULL, n, m, k);
            mm_bf16(tp, b, m, x, k, w, dts[d], NULL, n, m, k);
            assert_memory_equal(a, b, (size_t)(n * m) * sizeof(float));
            free(w);
            free(we);
            free(x);
            free(a);
            free(b);
        }
    threadpool_destroy(tp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accuracy_portable),
        cmocka_unit_test(test_accuracy_avx2),
        cmocka_unit_test(test_accuracy_avx512),
        cmocka_unit_test(test_invariance_portable),
        cmocka_unit_test(test_invariance_avx2),
        cmocka_unit_test(test_invariance_avx512),
        cmocka_unit_test(test_avx512_equals_avx2),
        cmocka_unit_test(test_bf16_reference),
        cmocka_unit_test(test_bf16_invariance),
        cmocka_unit_test(test_bf16_mode_other_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
