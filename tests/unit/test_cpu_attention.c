/* test_cpu_attention.c — the CPU backend's paged causal attention against a
 * double-precision softmax reference, and its AVX-512 path against the
 * scalar one to the bit (both families must give the same logits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/threadpool.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Two sequences in one batch: sequence 0 has ctx0 cached positions and its
 * last nq0 are queried, sequence 1 likewise; pages of page_size slots are
 * handed out in a shuffled order so that positions are not contiguous. */
struct setup {
    struct attn_params p;
    struct backend_batch b;
    int32_t positions[64], q_start[3], kv_page_start[3], kv_pages[256];
    float *q, *k, *v;
    long ldq, n_slots;
};

static void make_setup(struct setup *st, uint64_t *s, int dk, int dv, int heads, int kv_heads, int ctx0,
                       int nq0, int ctx1, int nq1, int page_size) {
    memset(st, 0, sizeof *st);
    st->p = (struct attn_params){.n_heads = heads, .n_kv_heads = kv_heads, .dk = dk, .dv = dv,
                                 .k_stride = (long)kv_heads * dk + 3, .v_stride = (long)kv_heads * dv + 5,
                                 .scale = 1.0f / sqrtf((float)dk)};
    int pages0 = (ctx0 + page_size - 1) / page_size, pages1 = (ctx1 + page_size - 1) / page_size;
    int total = pages0 + pages1;
    assert_true(total <= 256 && nq0 + nq1 <= 64);
    int perm[256];
    for (int i = 0; i < total; i++) perm[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int r = (int)(rng_next(s) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[r];
        perm[r] = t;
    }
    memcpy(st->kv_pages, perm, (size_t)total * sizeof(int32_t));
    st->kv_page_start[0] = 0;
    st->kv_page_start[1] = pages0;
    st->kv_page_start[2] = total;
    st->q_start[0] = 0;
    st->q_start[1] = nq0;
    st->q_start[2] = nq0 + nq1;
    for (int i = 0; i < nq0; i++) st->positions[i] = ctx0 - nq0 + i;
    for (int i = 0; i < nq1; i++) st->positions[nq0 + i] = ctx1 - nq1 + i;
    st->b = (struct backend_batch){.n_tokens = nq0 + nq1, .n_seqs = 2, .page_size = page_size,
                                   .positions = st->positions, .q_start = st->q_start,
                                   .kv_page_start = st->kv_page_start, .kv_pages = st->kv_pages};
    st->n_slots = (long)total * page_size;
    st->ldq = (long)heads * dk + 1;
    size_t nk = (size_t)(st->n_slots * st->p.k_stride), nv = (size_t)(st->n_slots * st->p.v_stride),
           nq = (size_t)(st->b.n_tokens * st->ldq);
    st->k = malloc(nk * sizeof(float));
    st->v = malloc(nv * sizeof(float));
    st->q = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nk; i++) st->k[i] = 3.0f * rng_uniform(s);
    for (size_t i = 0; i < nv; i++) st->v[i] = rng_uniform(s);
    for (size_t i = 0; i < nq; i++) st->q[i] = rng_uniform(s);
}

static void free_setup(struct setup *st) {
    free(st->q);
    free(st->k);
    free(st->v);
}

static void run_attention_on(struct setup *st, int threads, float *out, long ldo, int fp8,
                             const void *k, const void *v) {
    struct cpu_ctx ctx = {.tp = threadpool_create(threads), .n_threads = threads, .max_context = 512,
                          .kv_fp8 = fp8};
    ctx.attn_scratch = malloc((size_t)threads * 512 * sizeof(float));
    cpu_attention(&ctx, out, ldo, st->q, st->ldq, k, v, &st->p, &st->b);
    free(ctx.attn_scratch);
    threadpool_destroy(ctx.tp);
}

static void run_attention(struct setup *st, int threads, float *out, long ldo) {
    run_attention_on(st, threads, out, ldo, 0, st->k, st->v);
}

/* Double-precision softmax(q k^T * scale) v for token t, head h, dim d. */
static double reference(const struct setup *st, int t, int h, int d) {
    const struct attn_params *p = &st->p;
    int seq = t < st->q_start[1] ? 0 : 1, g = h / (p->n_heads / p->n_kv_heads);
    long n = st->positions[t] + 1;
    /* a sliding window: the last `window` positions, the query's own included */
    long i0 = p->window > 0 && n > p->window ? n - p->window : 0;
    const int32_t *pages = st->kv_pages + st->kv_page_start[seq];
    double mx = -INFINITY, sc[512], sum = 0, acc = 0;
    for (long i = i0; i < n; i++) {
        long slot = (long)pages[i / st->b.page_size] * st->b.page_size + i % st->b.page_size;
        double dot = 0;
        for (int e = 0; e < p->dk; e++)
            dot += (double)st->q[t * st->ldq + (long)h * p->dk + e] * st->k[slot * p->k_stride + (long)g * p->dk + e];
        sc[i] = dot * p->scale;
        if (sc[i] > mx) mx = sc[i];
    }
    for (long i = i0; i < n; i++) {
        long slot = (long)pages[i / st->b.page_size] * st->b.page_size + i % st->b.page_size;
        double w = exp(sc[i] - mx);
        sum += w;
        acc += w * st->v[slot * p->v_stride + (long)g * p->dv + d];
    }
    return acc / sum;
}

static void check_window(uint64_t *s, int dk, int dv, int heads, int kv_heads, int ctx0, int nq0,
                         int ctx1, int nq1, int page_size, int window) {
    struct setup st;
    make_setup(&st, s, dk, dv, heads, kv_heads, ctx0, nq0, ctx1, nq1, page_size);
    st.p.window = window;
    long ldo = (long)heads * dv + 2, rows = st.b.n_tokens;
    float *scalar = calloc((size_t)(rows * ldo), sizeof(float)), *best = calloc((size_t)(rows * ldo), sizeof(float));
    cpu_matmul_cap_isa(CPU_MATMUL_AVX2); /* the scalar attention */
    run_attention(&st, 2, scalar, ldo);
    int bad = 0;
    for (int t = 0; t < rows && bad < 5; t++)
        for (int h = 0; h < heads; h++)
            for (int d = 0; d < dv; d++) {
                double ref = reference(&st, t, h, d), got = scalar[t * ldo + (long)h * dv + d];
                if (!(fabs(got - ref) <= 1e-5 + 1e-5 * fabs(ref))) {
                    print_error("dk=%d dv=%d t=%d h=%d d=%d: %.9g, want %.9g\n", dk, dv, t, h, d, got, ref);
                    bad++;
                }
            }
    assert_int_equal(bad, 0);
    /* Every family the CPU runs, with 1 and 3 threads: the same bits. */
    for (enum cpu_matmul_isa isa = CPU_MATMUL_PORTABLE; isa <= CPU_MATMUL_AVX512BF16; isa++) {
        if (cpu_matmul_cap_isa(isa) != isa) continue;
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(best, 0, (size_t)(rows * ldo) * sizeof(float));
            run_attention(&st, threads, best, ldo);
            if (memcmp(scalar, best, (size_t)(rows * ldo) * sizeof(float)))
                fail_msg("%s attention differs from the scalar one: dk=%d dv=%d heads=%d/%d ctx=%d,%d",
                         cpu_matmul_isa_name(isa), dk, dv, heads, kv_heads, ctx0, ctx1);
        }
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    free(scalar);
    free(best);
    free_setup(&st);
}

static void check_case(uint64_t *s, int dk, int dv, int heads, int kv_heads, int ctx0, int nq0, int ctx1,
                       int nq1, int page_size) {
    check_window(s, dk, dv, heads, kv_heads, ctx0, nq0, ctx1, nq1, page_size, 0);
}

static void test_attention(void **state) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    /* dk 128 / dv 128: the vectorised shape (Qwen3, Llama); 192 / 128 as
     * DeepSeek's MLA; 64 / 64 and 72 / 136 take the scalar path everywhere.
     * Contexts of 1..4 keys past a multiple of 4 reach every key-group edge. */
    check_case(&s, 128, 128, 4, 2, 37, 5, 9, 9, 3);
    check_case(&s, 128, 128, 2, 1, 130, 2, 1, 1, 16);
    check_case(&s, 128, 256, 3, 3, 6, 6, 4, 4, 1);
    check_case(&s, 192, 128, 2, 2, 22, 3, 3, 2, 5);
    check_case(&s, 64, 64, 4, 1, 19, 4, 7, 7, 2);
    check_case(&s, 72, 136, 2, 1, 11, 2, 5, 1, 4);
}

/* Sliding windows (attn_params.window): each query sees its last `window`
 * positions; queries before, at and past the window's edge, windows that
 * start inside a page and on a page boundary, on both paths. */
static void test_attention_window(void **state) {
    (void)state;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    check_window(&s, 128, 128, 4, 2, 37, 12, 9, 9, 3, 8);
    check_window(&s, 128, 128, 2, 1, 130, 5, 20, 20, 16, 16);
    check_window(&s, 64, 64, 4, 1, 19, 19, 7, 7, 2, 5);
    check_window(&s, 72, 136, 2, 1, 11, 2, 5, 1, 4, 1);
    check_window(&s, 128, 128, 3, 3, 12, 12, 4, 4, 1, 64); /* longer than the contexts */
}

/* An FP8 cache (--kv-cache-dtype fp8_e4m3): the backend's kv_store keeps
 * e4m3(x / scale) (saturated at ±448), kv_gather reads e4m3 · scale, and
 * the attention over the e4m3 cache is the fp32 attention over those
 * dequantized values bit for bit, on every family and thread count (the
 * error of the FP8 cache is the rounding of K and V alone). */
static void fp8_case(uint64_t *s, int dk, int dv, int heads, int kv_heads, int ctx0, int nq0, int ctx1,
                     int nq1, int page_size, float k_scale, float v_scale) {
    struct setup st;
    make_setup(&st, s, dk, dv, heads, kv_heads, ctx0, nq0, ctx1, nq1, page_size);
    st.p.k_scale = k_scale;
    st.p.v_scale = v_scale;
    struct backend be;
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 1, .kv_fp8 = 1};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    assert_int_equal(backend_kv_dtype(&be), DTYPE_F8_E4M3);
    long nk = st.n_slots * st.p.k_stride, nv = st.n_slots * st.p.v_stride;
    uint8_t *kq = malloc((size_t)nk), *vq = malloc((size_t)nv);
    int32_t *slots = malloc((size_t)st.n_slots * sizeof(int32_t));
    for (long i = 0; i < st.n_slots; i++) slots[i] = (int32_t)i;
    be.ops->kv_store(be.ctx, kq, st.p.k_stride, st.k, st.p.k_stride, st.p.k_stride, slots, st.n_slots, k_scale);
    be.ops->kv_store(be.ctx, vq, st.p.v_stride, st.v, st.p.v_stride, st.p.v_stride, slots, st.n_slots, v_scale);
    /* the dequantized cache, and the stored bytes are e4m3(x / scale) */
    float *kd = malloc((size_t)nk * sizeof(float)), *vd = malloc((size_t)nv * sizeof(float));
    for (long i = 0; i < nk; i++) {
        assert_int_equal(kq[i], f32_to_fp8_e4m3(st.k[i] / k_scale));
        kd[i] = fp8_e4m3_to_f32(kq[i]) * k_scale;
    }
    for (long i = 0; i < nv; i++) vd[i] = fp8_e4m3_to_f32(vq[i]) * v_scale;
    /* kv_gather reads the same values back (one page list of all slots) */
    float g[512];
    int32_t pages1[1] = {0};
    long w = st.p.k_stride < 512 ? st.p.k_stride : 512;
    be.ops->kv_gather(be.ctx, g, w, kq, st.p.k_stride, w, pages1, (int)st.n_slots, 1, 1, k_scale);
    assert_memory_equal(g, kd + st.p.k_stride, (size_t)w * sizeof(float));
    long ldo = (long)heads * dv + 2, rows = st.b.n_tokens;
    float *want = calloc((size_t)(rows * ldo), sizeof(float)), *got = calloc((size_t)(rows * ldo), sizeof(float));
    for (enum cpu_matmul_isa isa = CPU_MATMUL_PORTABLE; isa <= CPU_MATMUL_AVX512BF16; isa++) {
        if (cpu_matmul_cap_isa(isa) != isa) continue;
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(want, 0, (size_t)(rows * ldo) * sizeof(float));
            memset(got, 0, (size_t)(rows * ldo) * sizeof(float));
            run_attention_on(&st, threads, want, ldo, 0, kd, vd);
            run_attention_on(&st, threads, got, ldo, 1, kq, vq);
            if (memcmp(want, got, (size_t)(rows * ldo) * sizeof(float)))
                fail_msg("%s FP8 attention differs from fp32 over the dequantized cache: dk=%d dv=%d",
                         cpu_matmul_isa_name(isa), dk, dv);
        }
    }
    cpu_matmul_cap_isa(CPU_MATMUL_AVX512BF16);
    backend_destroy(&be);
    free(want);
    free(got);
    free(kq);
    free(vq);
    free(kd);
    free(vd);
    free(slots);
    free_setup(&st);
}

static void test_attention_fp8(void **state) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    /* K in [-3, 3): scale 1/256 puts some of it past 448 (saturated), 1 and
     * 0.01 not; the shapes as test_attention's (vectorised and scalar). */
    fp8_case(&s, 128, 128, 4, 2, 37, 5, 9, 9, 3, 1.0f, 1.0f);
    fp8_case(&s, 128, 128, 2, 1, 130, 2, 1, 1, 16, 1.0f / 256, 0.01f);
    fp8_case(&s, 192, 128, 2, 2, 22, 3, 3, 2, 5, 0.01f, 0.5f);
    fp8_case(&s, 64, 64, 4, 1, 19, 4, 7, 7, 2, 2.0f, 1.0f);
    fp8_case(&s, 72, 136, 2, 1, 11, 2, 5, 1, 4, 1.0f, 0.25f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_attention_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
