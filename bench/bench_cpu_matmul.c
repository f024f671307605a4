/* bench_cpu_matmul.c — speed of cpu_matmul against the machine's memory
 * bandwidth (decode) and OpenBLAS sgemm (prefill).
 *
 *   build/bench_cpu_matmul [threads] [--quick] [--decode|--prefill|--fp8]
 *                          [--isa portable|avx2|avx512|avx512bf16] [--mode f32|bf16]
 *
 * --isa caps the kernel family (default: the best this CPU runs), to
 * compare families on one machine. --mode picks the arithmetic of the
 * products with BF16 weights (KILN_CPU_MATMUL): f32 (cpu_matmul) or bf16
 * (cpu_matmul_bf16); F16 and F32 weights take cpu_matmul either way.
 * Decode runs each shape over enough copies of its weights that they come
 * from DRAM, not cache, and reports the weight bytes read per second.
 * --fp8 (also at the end of a full run): FP8 block-quantized weights
 * against BF16, decode and prefill.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_matmul.h"
#include "base/mem.h"
#include "base/threadpool.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

struct shape {
    const char *name;
    long m, k;
};

static const struct shape kQwen[] = {
    {"qwen3-0.6b q_proj", 2048, 1024},  {"qwen3-0.6b k/v_proj", 1024, 1024},
    {"qwen3-0.6b o_proj", 1024, 2048},  {"qwen3-0.6b gate/up", 3072, 1024},
    {"qwen3-0.6b down", 1024, 3072},    {"qwen3-0.6b lm_head", 151936, 1024},
};
static const struct shape kLlama[] = {
    {"llama3-8b q/o_proj", 4096, 4096},  {"llama3-8b k/v_proj", 1024, 4096},
    {"llama3-8b gate/up", 14336, 4096},  {"llama3-8b down", 4096, 14336},
    {"llama3-8b lm_head", 128256, 4096},
};
/* FP8 against BF16: dense shapes and DeepSeek-V3's (hidden 7168, expert
 * intermediate 2048). */
static const struct shape kFp8[] = {
    {"qwen3-0.6b q_proj", 2048, 1024},   {"qwen3-0.6b gate/up", 3072, 1024},
    {"llama3-8b q/o_proj", 4096, 4096},  {"llama3-8b down", 4096, 14336},
    {"dsv3 expert gate/up", 2048, 7168}, {"dsv3 expert down", 7168, 2048},
};
#define COUNT(a) (sizeof(a) / sizeof *(a))

/* ---- memory read bandwidth: each thread sums its half of a big array ---- */

struct bw_task {
    const float *a;
    long n;
    double sums[64];
};

#if defined(__x86_64__)
__attribute__((target("avx2"))) static double sum_avx2(const float *a, long n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static double sum_any(const float *a, long n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) return sum_avx2(a, n);
#endif
    float s[8] = {0};
    for (long i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l];
    return (double)s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void bw_worker(void *arg, int ith, int nth) {
    struct bw_task *t = arg;
    long lo, hi;
    threadpool_split(t->n / 64, ith, nth, &lo, &hi);
    t->sums[ith] = sum_any(t->a + lo * 64, (hi - lo) * 64);
}

static void fill_worker(void *arg, int ith, int nth) {
    struct bw_task *t = arg;
    long lo, hi;
    threadpool_split(t->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) ((float *)t->a)[i] = (float)(i & 7);
}

static double measure_bandwidth(struct threadpool *tp) {
    const long n = 1L << 28; /* 1 GiB of floats */
    struct bw_task t = {.a = xaligned_alloc((size_t)n * sizeof(float)), .n = n};
    threadpool_run(tp, fill_worker, &t); /* first touch from the threads that read */
    double best = 0;
    for (int rep = 0; rep < 10; rep++) {
        double t0 = time_now();
        threadpool_run(tp, bw_worker, &t);
        double gbs = (double)n * sizeof(float) / (time_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free((void *)t.a);
    return best;
}

/* ---- helpers ---- */

static uint64_t g_unused;

typedef void (*matmul_fn)(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                          const struct backend_weight *w, const float *bias, long n);
/* The function products with BF16 weights go through (--mode). */
static matmul_fn g_bf16_fn = cpu_matmul;

/* FP8 weights: e4m3 with one scale per FP8_BLOCK x FP8_BLOCK block (the
 * DeepSeek-V3 / Qwen3-FP8 layout). */
enum { FP8_BLOCK = 128 };
static long fp8_scale_count(long m, long k) {
    return ((m + FP8_BLOCK - 1) / FP8_BLOCK) * ((k + FP8_BLOCK - 1) / FP8_BLOCK);
}

static struct backend_weight weight_of(const void *data, enum dtype wt, long m, long k, const float *scale) {
    struct backend_weight w = {.data = data, .dtype = wt, .rows = m, .cols = k};
    if (wt == DTYPE_F8_E4M3) {
        w.scale = scale;
        w.block_rows = w.block_cols = FP8_BLOCK;
    }
    return w;
}
static float *random_floats(long count, uint64_t seed) {
    float *p = xaligned_alloc((size_t)count * sizeof(float));
    for (long i = 0; i < count; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 23);
    }
    return p;
}

/* Block quantization of src [m][k] as the checkpoints have it: scale =
 * amax / 448 per block, codes rounded to nearest. */
static uint8_t *to_fp8(const float *src, long m, long k, float **scale) {
    uint8_t *q = xaligned_alloc((size_t)(m * k));
    long nbc = (k + FP8_BLOCK - 1) / FP8_BLOCK;
    float *s = xaligned_alloc((size_t)fp8_scale_count(m, k) * sizeof(float));
    for (long rb = 0; rb * FP8_BLOCK < m; rb++)
        for (long cb = 0; cb < nbc; cb++) {
            long r1 = (rb + 1) * FP8_BLOCK < m ? (rb + 1) * FP8_BLOCK : m;
            long c1 = (cb + 1) * FP8_BLOCK < k ? (cb + 1) * FP8_BLOCK : k;
            float amax = 0;
            for (long r = rb * FP8_BLOCK; r < r1; r++)
                for (long c = cb * FP8_BLOCK; c < c1; c++) amax = fmaxf(amax, fabsf(src[r * k + c]));
            float sc = amax > 0 ? amax / 448.0f : 1.0f;
            s[rb * nbc + cb] = sc;
            for (long r = rb * FP8_BLOCK; r < r1; r++)
                for (long c = cb * FP8_BLOCK; c < c1; c++) q[r * k + c] = f32_to_fp8_e4m3(src[r * k + c] / sc);
        }
    *scale = s;
    return q;
}

static void *to_dtype(const float *src, long count, enum dtype wt) {
    void *w = xaligned_alloc((size_t)count * dtype_size(wt));
    for (long i = 0; i < count; i++) {
        if (wt == DTYPE_F32) ((float *)w)[i] = src[i];
        else if (wt == DTYPE_F16) ((uint16_t *)w)[i] = f32_to_f16(src[i]);
        else ((uint16_t *)w)[i] = f32_to_bf16(src[i]);
    }
    return w;
}

/* Decode: n rows against weights that do not fit in cache. Returns GB/s of
 * weights read. */
static double bench_decode(struct threadpool *tp, const struct shape *s, enum dtype wt, long n,
                           double min_time) {
    size_t bytes = (size_t)(s->m * s->k) * dtype_size(wt);
    /* 1.5 GiB of copies: more than any last-level cache a VM reports. */
    int copies = (int)((3ul << 29) / bytes) + 1;
    char *all = xaligned_alloc(bytes * (size_t)copies);
    void **w = xcalloc((size_t)copies, sizeof *w);
    void *one = NULL;
    float *scale = NULL;
    {
        float *src = random_floats(s->m * s->k, 1);
        one = wt == DTYPE_F8_E4M3 ? to_fp8(src, s->m, s->k, &scale) : to_dtype(src, s->m * s->k, wt);
        free(src);
    }
    struct backend_weight *bw = xcalloc((size_t)copies, sizeof *bw);
    for (int c = 0; c < copies; c++) {
        w[c] = all + bytes * (size_t)c;
        memcpy(w[c], one, bytes);
        bw[c] = weight_of(w[c], wt, s->m, s->k, scale);
    }
    free(one);
    float *x = random_floats(n * s->k, 2), *y = xaligned_alloc((size_t)(n * s->m) * sizeof(float));
    matmul_fn fn = wt == DTYPE_BF16 ? g_bf16_fn : cpu_matmul;
    for (int c = 0; c < copies; c++) fn(tp, y, s->m, x, s->k, &bw[c], NULL, n);
    /* Best pass over all copies: other processes on a small machine only
     * ever make a pass slower. */
    double best = 1e30, t_all = time_now();
    int passes = 0;
    do {
        double t0 = time_now();
        for (int c = 0; c < copies; c++) fn(tp, y, s->m, x, s->k, &bw[c], NULL, n);
        double dt = time_now() - t0;
        if (dt < best) best = dt;
        passes++;
    } while (time_now() - t_all < min_time || passes < 3);
    g_unused += (uint64_t)y[0];
    free(all);
    free(w);
    free(bw);
    free(scale);
    free(x);
    free(y);
    return (double)bytes * copies / best / 1e9;
}

/* Prefill GFLOP/s of cpu_matmul (BF16: g_bf16_fn) with weights wf held in wt. */
static double bench_prefill_dtype(struct threadpool *tp, const struct shape *s, const float *wf, enum dtype wt,
                                  long n, double min_time) {
    float *scale = NULL;
    void *w = wt == DTYPE_F8_E4M3 ? (void *)to_fp8(wf, s->m, s->k, &scale) : to_dtype(wf, s->m * s->k, wt);
    struct backend_weight bw = weight_of(w, wt, s->m, s->k, scale);
    matmul_fn fn = wt == DTYPE_BF16 ? g_bf16_fn : cpu_matmul;
    float *x = random_floats(n * s->k, 4), *y = xaligned_alloc((size_t)(n * s->m) * sizeof(float));
    double best = 1e30, t_all = time_now();
    long calls = 0;
    do {
        double t0 = time_now();
        fn(tp, y, s->m, x, s->k, &bw, NULL, n);
        double dt = time_now() - t0;
        if (dt < best) best = dt;
        calls++;
    } while (time_now() - t_all < min_time || calls < 3);
    g_unused += (uint64_t)y[0];
    free(w);
    free(scale);
    free(x);
    free(y);
    return 2.0 * n * s->m * s->k / best / 1e9;
}

/* FP8 (128 x 128 blocks) against BF16 weights: decode (n = 1, weights from
 * DRAM: microseconds a product and GB/s of the weights' own bytes) and
 * prefill (n = 64, GFLOP/s). */
static void bench_fp8(struct threadpool *tp, double tmin) {
    printf("\nFP8 e4m3 (128x128 blocks) vs BF16     decode n=1: us (GB/s)             prefill n=64 GFLOP/s\n");
    printf("%-28s %12s %18s %18s %9s %9s\n", "", "", "FP8", "BF16", "FP8", "BF16");
    for (size_t i = 0; i < COUNT(kFp8); i++) {
        const struct shape *sh = &kFp8[i];
        double g8 = bench_decode(tp, sh, DTYPE_F8_E4M3, 1, tmin), gb = bench_decode(tp, sh, DTYPE_BF16, 1, tmin);
        double us8 = (double)(sh->m * sh->k) / g8 / 1e3, usb = 2.0 * (double)(sh->m * sh->k) / gb / 1e3;
        float *wf = random_floats(sh->m * sh->k, 3);
        double p8 = bench_prefill_dtype(tp, sh, wf, DTYPE_F8_E4M3, 64, tmin / 2);
        double pb = bench_prefill_dtype(tp, sh, wf, DTYPE_BF16, 64, tmin / 2);
        free(wf);
        printf("%-28s %5ldx%-6ld %8.1f (%5.1f) %11.1f (%5.1f) %9.1f %9.1f\n", sh->name, sh->m, sh->k, us8, g8,
               usb, gb, p8, pb);
    }
}

/* Prefill: GFLOP/s of kiln (weights in wt) and of OpenBLAS sgemm on fp32. */
static void bench_prefill(struct threadpool *tp, const struct shape *s, long n, double min_time,
                          double *kiln_bf16, double *kiln_f32, double *blas) {
    float *wf = random_floats(s->m * s->k, 3);
    void *wb = to_dtype(wf, s->m * s->k, DTYPE_BF16);
    struct backend_weight bwb = weight_of(wb, DTYPE_BF16, s->m, s->k, NULL),
                          bwf = weight_of(wf, DTYPE_F32, s->m, s->k, NULL);
    float *x = random_floats(n * s->k, 4), *y = xaligned_alloc((size_t)(n * s->m) * sizeof(float));
    double flop = 2.0 * n * s->m * s->k;
    for (int which = 0; which < 3; which++) {
        double best = 1e30;
        long calls = 0;
        double t_all = time_now();
        do {
            double t0 = time_now();
            if (which == 0) g_bf16_fn(tp, y, s->m, x, s->k, &bwb, NULL, n);
            else if (which == 1) cpu_matmul(tp, y, s->m, x, s->k, &bwf, NULL, n);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)s->m, (int)s->k, 1.0f,
                            x, (int)s->k, wf, (int)s->k, 0.0f, y, (int)s->m);
            double dt = time_now() - t0;
            if (dt < best) best = dt;
            calls++;
        } while (time_now() - t_all < min_time || calls < 3);
        double g = flop / best / 1e9;
        if (which == 0) *kiln_bf16 = g;
        else if (which == 1) *kiln_f32 = g;
        else *blas = g;
    }
    g_unused += (uint64_t)y[0];
    free(wf);
    free(wb);
    free(x);
    free(y);
}

int main(int argc, char **argv) {
    int threads = 2, quick = 0, decode = 1, prefill = 1, fp8_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *name = argv[++i];
            enum cpu_matmul_isa isa = CPU_MATMUL_PORTABLE;
            while (isa < CPU_MATMUL_AVX512BF16 && strcmp(cpu_matmul_isa_name(isa), name)) isa++;
            if (strcmp(cpu_matmul_isa_name(isa), name)) {
                fprintf(stderr,
                        "bench_cpu_matmul: --isa: unknown kernel family '%s' (portable, avx2, avx512, "
                        "avx512bf16)\n",
                        name);
                return 2;
            }
            if (cpu_matmul_cap_isa(isa) != isa) {
                fprintf(stderr, "bench_cpu_matmul: --isa %s: this CPU does not run it\n", name);
                return 2;
            }
        } else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            const char *name = argv[++i];
            if (!strcmp(name, "bf16")) g_bf16_fn = cpu_matmul_bf16;
            else if (strcmp(name, "f32")) {
                fprintf(stderr, "bench_cpu_matmul: --mode: expected f32 or bf16, not '%s'\n", name);
                return 2;
            }
        } else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--fp8")) fp8_only = 1;
        else if (!strcmp(argv[i], "--decode")) prefill = 0;
        else if (!strcmp(argv[i], "--prefill")) decode = 0;
        else threads = atoi(argv[i]);
    }
    double tmin = quick ? 0.3 : 1.0;
    struct threadpool *tp = threadpool_create(threads);
    openblas_set_num_threads(threads);
    printf("threads: %d; kiln kernels: %s, BF16 weights in %s mode; OpenBLAS %s (core %s)\n", threads,
           cpu_matmul_isa_name(cpu_matmul_isa()), g_bf16_fn == cpu_matmul ? "f32" : "bf16",
           openblas_get_config(), openblas_get_corename());

    double bw = measure_bandwidth(tp);
    printf("memory read bandwidth (%d threads, 1 GiB sum): %.1f GB/s\n\n", threads, bw);
    if (fp8_only) {
        bench_fp8(tp, tmin);
        threadpool_destroy(tp);
        return g_unused == 42 ? 1 : 0;
    }

    if (decode)
        printf("decode, n=1, weights from DRAM          BF16 GB/s   %%bw   F16 GB/s  F32 GB/s\n");
    for (int set = 0; set < 2 && decode; set++) {
        const struct shape *sh = set ? kLlama : kQwen;
        size_t cnt = set ? COUNT(kLlama) : COUNT(kQwen);
        for (size_t i = 0; i < cnt; i++) {
            double b = bench_decode(tp, &sh[i], DTYPE_BF16, 1, tmin);
            double h = quick ? 0 : bench_decode(tp, &sh[i], DTYPE_F16, 1, tmin);
            double f = quick || set ? 0 : bench_decode(tp, &sh[i], DTYPE_F32, 1, tmin);
            printf("%-28s %5ldx%-6ld %8.1f %6.0f%% %9.1f %9.1f\n", sh[i].name, sh[i].m, sh[i].k, b,
                   100 * b / bw, h, f);
        }
    }
    if (decode) printf("\ndecode, BF16, n rows (GB/s of weights)   n=1     n=2     n=4     n=8\n");
    for (size_t i = 0; i < COUNT(kQwen) && decode; i += 3) {
        printf("%-28s %5ldx%-6ld", kQwen[i].name, kQwen[i].m, kQwen[i].k);
        for (long n = 1; n <= 8; n *= 2) printf(" %7.1f", bench_decode(tp, &kQwen[i], DTYPE_BF16, n, tmin));
        printf("\n");
    }

    if (prefill)
        printf("\nprefill GFLOP/s                      n   kiln BF16  kiln F32  OpenBLAS F32  BF16/BLAS\n");
    for (int set = 0; set < 2 && prefill; set++) {
        const struct shape *sh = set ? kLlama : kQwen;
        size_t cnt = set ? COUNT(kLlama) - 1 : COUNT(kQwen) - 1; /* no lm_head: one row */
        for (size_t i = 0; i < cnt; i++) {
            for (long n = 128; n <= 512; n *= 4) {
                if (set && n == 512 && quick) continue;
                double kb = 0, kf = 0, bl = 0;
                bench_prefill(tp, &sh[i], n, quick ? 0.2 : 0.5, &kb, &kf, &bl);
                printf("%-22s %5ldx%-6ld %4ld %9.1f %9.1f %12.1f %9.2f\n", sh[i].name, sh[i].m, sh[i].k, n,
                       kb, kf, bl, kb / bl);
            }
        }
    }
    if (decode && prefill) bench_fp8(tp, tmin);
    threadpool_destroy(tp);
    return g_unused == 42 ? 1 : 0;
}
