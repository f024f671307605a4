/* cpu_matmul.c — thread split, ISA dispatch, the portable kernel (FP8
 * weights: row by row dequantized, then as F32), and the bf16 mode's entry
 * (rounding x, then the same thread split).
 *
 * Threads split the outputs (columns j of y, i.e. rows of w) into contiguous
 * ranges; k is never split, so an output's arithmetic is the same whoever
 * computes it. The arithmetic itself is fixed in cpu_matmul_kernels.h.
 */
#include "backend/cpu/cpu_matmul.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "backend/cpu/cpu_matmul_kernels.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/threadpool.h"
#include "tensor/backend.h"

enum {
    /* Threads take outputs in multiples of this, so tiles stay whole. */
    SPLIT_UNIT = 8,
    /* Below this many multiply-adds, waking the pool costs more than it saves. */
    MIN_PARALLEL_MACS = 1 << 16,
    /* bf16 mode: x rows of up to this many bf16 (16 KiB, decode) are
     * rounded on the stack; fewer elements than ROUND_PARALLEL_MIN are
     * rounded by the caller alone. */
    XH_STACK = 8192,
    ROUND_PARALLEL_MIN = 1 << 15,
};

static float load_w_scalar(const void *w, long idx, enum dtype wt) {
    switch (wt) {
    case DTYPE_F32: return ((const float *)w)[idx];
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)w)[idx]);
    default: return bf16_to_f32(((const uint16_t *)w)[idx]);
    }
}

/* One output, 8 lanes over k and the fixed reduction tree. Not inlined so
 * that the compiler makes the same contraction choices for every output. */
static __attribute__((noinline)) float dot_portable(const float *x, const void *w, long off,
                                                    enum dtype wt, long k) {
    float acc[8] = {0};
    for (long kb = 0; kb < k; kb += 8) {
        for (int l = 0; l < 8; l++) {
            long kk = kb + l;
            float xv = kk < k ? x[kk] : 0.0f, wv = kk < k ? load_w_scalar(w, off + kk, wt) : 0.0f;
            acc[l] += xv * wv;
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Every call goes through this pointer: the compiler cannot specialise a
 * copy of dot_portable for one call site's constant arguments (gcc did, for
 * the FP8 path's), whose code could order an addition's operands otherwise
 * and so propagate another NaN's sign. */
static float (*volatile dot_portable_fn)(const float *, const void *, long, enum dtype, long) = dot_portable;

void cpu_matmul_range_portable(const struct cpu_matmul_job *job, long j0, long j1) {
    if (job->wt == DTYPE_F8_E4M3) { /* each row dequantized, then as F32 */
        float *row = xmalloc((size_t)((job->k + 7) & ~7L) * sizeof(float) + 1);
        for (long j = j0; j < j1; j++) {
            cpu_matmul_fp8_row(job, j, row, 8, 0);
            for (long i = 0; i < job->n; i++) {
                float s = dot_portable_fn(job->x + i * job->ldx, row, 0, DTYPE_F32, job->k);
                job->y[i * job->ldy + j] = job->bias ? s + job->bias[j] : s;
            }
        }
        free(row);
        return;
    }
    for (long i = 0; i < job->n; i++) {
        const float *x = job->x + i * job->ldx;
        float *y = job->y + i * job->ldy;
        for (long j = j0; j < j1; j++) {
            float s = dot_portable_fn(x, job->w, j * job->k, job->wt, job->k);
            y[j] = job->bias ? s + job->bias[j] : s;
        }
    }
}

typedef void (*range_fn)(const struct cpu_matmul_job *job, long j0, long j1);

struct matmul_task {
    const struct cpu_matmul_job *job;
    range_fn range;
};

static void matmul_worker(void *arg, int ith, int nth) {
    const struct matmul_task *t = arg;
    long units = (t->job->m + SPLIT_UNIT - 1) / SPLIT_UNIT, lo, hi;
    threadpool_split(units, ith, nth, &lo, &hi);
    long j0 = lo * SPLIT_UNIT, j1 = hi * SPLIT_UNIT < t->job->m ? hi * SPLIT_UNIT : t->job->m;
    if (j0 < j1) t->range(t->job, j0, j1);
}

static void matmul_job_run(struct threadpool *tp, range_fn range, const struct cpu_matmul_job *job) {
    struct matmul_task task = {.job = job, .range = range};
    if (!tp || threadpool_size(tp) == 1 || (double)job->n * job->m * job->k < MIN_PARALLEL_MACS)
        matmul_worker(&task, 0, 1);
    else
        threadpool_run(tp, matmul_worker, &task);
}

/* The job of a product by w, checked. */
static struct cpu_matmul_job make_job(float *y, long ldy, const float *x, long ldx,
                                      const struct backend_weight *w, const float *bias, long n) {
    const long m = w->rows, k = w->cols;
    KILN_ASSERT_MSG(w->dtype == DTYPE_F32 || w->dtype == DTYPE_F16 || w->dtype == DTYPE_BF16 ||
                        w->dtype == DTYPE_F8_E4M3,
                    "cpu_matmul: weights must be F32, F16, BF16 or F8_E4M3");
    KILN_ASSERT_MSG(w->dtype != DTYPE_F8_E4M3 || (w->scale && w->block_rows > 0 && w->block_cols > 0),
                    "cpu_matmul: F8_E4M3 weights need their block scales");
    KILN_ASSERT(n >= 0 && m >= 0 && k >= 0 && ldx >= k && ldy >= m);
    struct cpu_matmul_job job = {.y = y, .ldy = ldy, .x = x, .ldx = ldx, .w = w->data, .wt = w->dtype,
                                 .bias = bias, .n = n, .m = m, .k = k};
    if (w->dtype == DTYPE_F8_E4M3) {
        job.scale = w->scale;
        job.block_rows = w->block_rows;
        job.block_cols = w->block_cols;
    }
    return job;
}

static enum cpu_matmul_isa detect_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* clang 14 has no "f16c" for __builtin_cpu_supports: ask cpuid (leaf 1,
     * ecx bit 29); the avx2 check already covers OS support of ymm state,
     * and the avx512 checks that of zmm state. */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)) return CPU_MATMUL_PORTABLE;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")))
        return CPU_MATMUL_AVX2;
    /* AVX512_BF16: cpuid leaf 7, sub-leaf 1, eax bit 5 (asked directly, as
     * not every compiler's __builtin_cpu_supports knows it) */
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) return CPU_MATMUL_AVX512BF16;
    return CPU_MATMUL_AVX512;
#else
    return CPU_MATMUL_PORTABLE;
#endif
}

/* cpuid traps to the hypervisor in a VM (microseconds), too slow for every
 * decode call, so the detected family is cached. It describes the machine,
 * not engine state: every thread would store the same value, so a race is
 * harmless. The cap is a test hook, set while no product runs. */
static _Atomic int g_detected; /* 0: not yet */
static _Atomic int g_cap = CPU_MATMUL_AVX512BF16;

static enum cpu_matmul_isa detected_isa(void) {
    int v = atomic_load_explicit(&g_detected, memory_order_relaxed);
    if (!v) {
        v = (int)detect_isa();
        atomic_store_explicit(&g_detected, v, memory_order_relaxed);
    }
    return (enum cpu_matmul_isa)v;
}

enum cpu_matmul_isa cpu_matmul_isa(void) {
    int v = (int)detected_isa(), cap = atomic_load_explicit(&g_cap, memory_order_relaxed);
    return (enum cpu_matmul_isa)(v < cap ? v : cap);
}

const char *cpu_matmul_isa_name(enum cpu_matmul_isa isa) {
    switch (isa) {
    case CPU_MATMUL_AVX512BF16: return "avx512bf16";
    case CPU_MATMUL_AVX512: return "avx512";
    case CPU_MATMUL_AVX2: return "avx2";
    default: return "portable";
    }
}

enum cpu_matmul_isa cpu_matmul_cap_isa(enum cpu_matmul_isa max) {
    KILN_ASSERT(max >= CPU_MATMUL_PORTABLE && max <= CPU_MATMUL_AVX512BF16);
    atomic_store_explicit(&g_cap, (int)max, memory_order_relaxed);
    return cpu_matmul_isa();
}

static range_fn best_range(void) {
    switch (cpu_matmul_isa()) {
#if defined(__x86_64__)
    case CPU_MATMUL_AVX512BF16:
    case CPU_MATMUL_AVX512: return cpu_matmul_range_avx512;
    case CPU_MATMUL_AVX2: return cpu_matmul_range_avx2;
#endif
    default: return cpu_matmul_range_portable;
    }
}

void cpu_matmul(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                const struct backend_weight *w, const float *bias, long n) {
    struct cpu_matmul_job job = make_job(y, ldy, x, ldx, w, bias, n);
    if (n == 0 || job.m == 0) return;
    matmul_job_run(tp, best_range(), &job);
}

/* ---- bf16 mode ------------------------------------------------------------ */

struct round_task {
    const struct cpu_matmul_job *job;
    int avx2;
};

static void round_worker(void *arg, int ith, int nth) {
    const struct round_task *t = arg;
    long lo, hi;
    threadpool_split(t->job->n, ith, nth, &lo, &hi);
    cpu_matmul_bf16_round_rows(t->job, lo, hi, t->avx2);
}

void cpu_matmul_bf16(struct threadpool *tp, float *y, long ldy, const float *x, long ldx,
                     const struct backend_weight *w, const float *bias, long n) {
    if (w->dtype != DTYPE_BF16) {
        cpu_matmul(tp, y, ldy, x, ldx, w, bias, n);
        return;
    }
    struct cpu_matmul_job job = make_job(y, ldy, x, ldx, w, bias, n);
    const long m = job.m, k = job.k;
    if (n == 0 || m == 0) return;
    const enum cpu_matmul_isa isa = cpu_matmul_isa();
    range_fn range = cpu_matmul_bf16_range_portable;
#if defined(__x86_64__)
    if (isa >= CPU_MATMUL_AVX512BF16) range = cpu_matmul_bf16_range_avx512bf16;
    else if (isa >= CPU_MATMUL_AVX2) range = cpu_matmul_bf16_range_avx2;
#endif
    /* Rows a multiple of 1 KiB apart would share L1 sets (and, on AMD, way
     * predictions) with each other: one more cache line apart, they don't. */
    long ldxh = k > 0 ? (k + 31) & ~31L : 32;
    if (ldxh % 512 == 0) ldxh += 32;
    _Alignas(64) uint16_t local[XH_STACK];
    uint16_t *xh = n * ldxh <= XH_STACK ? local : xaligned_alloc((size_t)(n * ldxh) * sizeof(uint16_t));
    job.xh = xh;
    job.ldxh = ldxh;
    struct round_task rt = {.job = &job, .avx2 = isa >= CPU_MATMUL_AVX2};
    if (tp && threadpool_size(tp) > 1 && n > 1 && n * k >= ROUND_PARALLEL_MIN)
        threadpool_run(tp, round_worker, &rt);
    else
        round_worker(&rt, 0, 1);
    matmul_job_run(tp, range, &job);
    if (xh != local) free(xh);
}
