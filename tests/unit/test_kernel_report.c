/* test_kernel_report.c — the profiling report (src/profile/kernel_report.c).
 *
 * The non-overlapped shares are checked against a brute force that walks
 * every nanosecond of random traces with integer times and credits it to
 * the activity that started first among those running then (ties: the one
 * that ends first, then the name) — the definition, not the algorithm. The busy time must
 * equal the number of nanoseconds with any activity. The readers are
 * checked on hand-written traces in the three formats, quoting and
 * malformed files included; the default rules on kiln's own kernel names
 * (mangled, as CUPTI records them, and demangled, as nsys prints them). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/mem.h"
#include "profile/kernel_report.h"

static uint64_t rng = 88172645463325252ull;
static int irand(int n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

static void add(struct kr_trace *t, const char *name, double s, double e) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->a = xrealloc(t->a, (size_t)t->cap * sizeof *t->a);
    }
    t->a[t->n++] = (struct kr_activity){xstrdup(name), s, e};
}

static const struct kr_kernel_row *row(const struct kr_report *r, const char *name) {
    for (long i = 0; i < r->n_kernels; i++)
        if (!strcmp(r->kernels[i].name, name)) return &r->kernels[i];
    return NULL;
}

static void test_shares_against_brute_force(void **state) {
    (void)state;
    struct kiln_error err;
    struct kr_rules rules;
    assert_int_equal(kr_rules_default(&rules, &err), 0);
    static const char *const names[] = {"gemv_kernel", "ad_kernel", "rmsnorm_warp_kernel", "nccl_allreduce", "x"};
    for (int round = 0; round < 200; round++) {
        struct kr_trace t = {0};
        /* short horizons: many equal starts and identical intervals */
        int n = 1 + irand(40), horizon = round % 2 ? 50 + irand(400) : 5 + irand(10);
        for (int i = 0; i < n; i++) {
            int s = irand(horizon), d = irand(3) == 0 ? 0 : 1 + irand(round % 2 ? 60 : 4);
            add(&t, names[irand(5)], s, s + d);
        }
        struct kr_report rep;
        kr_analyze(&t, &rules, &rep);
        /* brute force over every nanosecond [u, u + 1) */
        double *credit = xcalloc((size_t)n, sizeof *credit);
        long busy = 0;
        for (int u = 0; u < horizon + 70; u++) {
            int best = -1;
            for (int i = 0; i < n; i++) {
                if (!(t.a[i].start <= u && u + 1 <= t.a[i].end)) continue;
                if (best < 0 || t.a[i].start < t.a[best].start ||
                    (t.a[i].start == t.a[best].start && t.a[i].end < t.a[best].end) ||
                    (t.a[i].start == t.a[best].start && t.a[i].end == t.a[best].end &&
                     strcmp(t.a[i].name, t.a[best].name) < 0))
                    best = i;
            }
            if (best >= 0) credit[best] += 1, busy++;
        }
        assert_true(fabs(rep.busy_ns - (double)busy) < 1e-9);
        double sum = 0;
        for (int k = 0; k < 5; k++) {
            double want = 0, total = 0;
            long count = 0;
            for (int i = 0; i < n; i++)
                if (!strcmp(t.a[i].name, names[k])) want += credit[i], total += t.a[i].end - t.a[i].start, count++;
            const struct kr_kernel_row *r = row(&rep, names[k]);
            if (!count) {
                assert_null(r);
                continue;
            }
            assert_non_null(r);
            assert_int_equal(r->count, count);
            assert_true(fabs(r->gpu_ns - want) < 1e-9);
            assert_true(fabs(r->total_ns - total) < 1e-9);
            sum += r->gpu_ns;
        }
        assert_true(fabs(sum - rep.busy_ns) < 1e-9);
        double csum = 0;
        for (int c = 0; c < rep.n_categories; c++) csum += rep.categories[c].gpu_ns;
        assert_true(fabs(csum - rep.busy_ns) < 1e-9);
        for (long i = 1; i < rep.n_kernels; i++) assert_true(rep.kernels[i - 1].gpu_ns >= rep.kernels[i].gpu_ns);
        free(credit);
        kr_report_free(&rep);
        kr_trace_free(&t);
    }
    kr_rules_free(&rules);
}

static void test_default_rules(void **state) {
    (void)state;
    struct kiln_error err;
    struct kr_rules r;
    assert_int_equal(kr_rules_default(&r, &err), 0);
    static const char *const cases[][2] = {
        /* kiln's kernels as CUPTI records them (mangled) */
        {"_Z11gemv_kernelI13__nv_bfloat16Li4ELi2EEvPfPKfPKT_S6_ii", "gemm"},
        {"_ZN12_GLOBAL__N_117gemm_small_kernelI13__nv_bfloat16Li2ELi2EEEvPflS3_PKT_lS6_PKfiiiiNS_7groupedE", "gemm"},
        {"_Z9ad_kernelILi2EEvN2ad6ParamsE", "attention"},
        {"_Z12split_kernelILi128EEvPKfPKvS3_Pfii", "attention"},
        {"_Z14split16_kernelI13__nv_bfloat16EvPT_PKfll", "elementwise"},
        {"_Z16moe_align_kernelPKiiiiPiS1_P4int4S1_", "moe"},
        {"_Z19rmsnorm_warp_kernelPfPKfS1_lf", "norm"},
        {"_Z20qk_rope_store_kernelPfS_S_", "rope / kv store"},
        {"_Z12embed_kernelILi8EEvPfPKvPKil", "elementwise"},
        {"_Z10add_kernelPfPKfl", "elementwise"},
        {"_Z15silu_mul_kernelPfPKfS1_ll", "activation"},
        {"_Z12argmax_kernelPKfPiil", "sampling"},
        /* demangled (nsys) and libraries */
        {"void gemv_kernel<__nv_bfloat16, 4, 2>(float *, const float *, const T1 *, const float *, int, int)", "gemm"},
        {"void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>>(Flash_fwd_params)", "attention"},
        {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"},
        {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096>)", "communication"},
        {"[CUDA memcpy Host-to-Device]", "memory"},
        {"[CUDA memset]", "memory"},
        {"some_unknown_kernel", "misc"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = kr_classify(&r, cases[i][0]);
        if (strcmp(got, cases[i][1])) fail_msg("%s: %s, expected %s", cases[i][0], got, cases[i][1]);
    }
    kr_rules_free(&r);
    /* a rules object: the file's order decides; no catch-all gets "misc" */
    const char *j = "{\"gemm|flash\": \"mixed\", \"flash\": \"attention\", \"norm\": \"norm\"}";
    assert_int_equal(kr_rules_parse_object(&r, j, strlen(j), "rules", &err), 0);
    assert_string_equal(kr_classify(&r, "flash_fwd"), "mixed");
    assert_string_equal(kr_classify(&r, "rmsnorm"), "norm");
    assert_string_equal(kr_classify(&r, "other"), "misc");
    kr_rules_free(&r);
    const char *bad[] = {"{\"(unclosed\": \"x\"}", "{\"a\": 3}", "[]", "{}", "not json"};
    for (size_t i = 0; i < 5; i++) {
        memset(&r, 0, sizeof r);
        err.msg[0] = 0;
        assert_int_not_equal(kr_rules_parse_object(&r, bad[i], strlen(bad[i]), "rules.json", &err), 0);
        assert_non_null(strstr(err.msg, "rules.json"));
        kr_rules_free(&r);
    }
}

static void parse_ok(const char *text, struct kr_trace *t) {
    struct kiln_error err = {0};
    memset(t, 0, sizeof *t);
    if (kr_trace_parse(t, text, strlen(text), "trace", &err)) fail_msg("%s", err.msg);
}

static void parse_bad(const char *text, const char *want) {
    struct kiln_error err = {0};
    struct kr_trace t = {0};
    assert_int_not_equal(kr_trace_parse(&t, text, strlen(text), "trace.csv", &err), 0);
    if (!strstr(err.msg, want)) fail_msg("'%s' does not say '%s'", err.msg, want);
    kr_trace_free(&t);
}

static void test_readers(void **state) {
    (void)state;
    struct kr_trace t;
    /* nsys cuda_gpu_trace CSV: notes before the header, quoted names with commas and quotes */
    parse_ok("Processing [x.sqlite] with [cuda_gpu_trace.py]...\n\n"
             "Start (ns),Duration (ns),CorrId,Name\r\n"
             "100,50,1,\"void k<1, 2>(\"\"a\"\")\"\r\n"
             "120,10,2,plain\n"
             "\n"
             "300,0,3,\"[CUDA memset]\"\n",
             &t);
    assert_int_equal(t.n, 3);
    assert_string_equal(t.a[0].name, "void k<1, 2>(\"a\")");
    assert_true(t.a[0].start == 100 && t.a[0].end == 150);
    assert_string_equal(t.a[1].name, "plain");
    assert_string_equal(t.a[2].name, "[CUDA memset]");
    kr_trace_free(&t);
    /* columns in another order */
    parse_ok("Name,Duration (ns),Start (ns)\nk,5,7\n", &t);
    assert_true(t.n == 1 && t.a[0].start == 7 && t.a[0].end == 12);
    kr_trace_free(&t);
    /* scripts/gpu/cupti_trace.c */
    parse_ok("K,1000,1500,7,3,132x1x1,128,49152,96,_Z11gemv_kernelPf\n"
             "M,1600,1700,8,0,4096,0,0,0,memcpy1\n"
             "S,1800,1810,9,0,64,0,0,0,memset\n",
             &t);
    assert_int_equal(t.n, 3);
    assert_string_equal(t.a[0].name, "_Z11gemv_kernelPf");
    assert_true(t.a[0].start == 1000 && t.a[0].end == 1500 && t.a[2].end == 1810);
    kr_trace_free(&t);
    /* Chrome trace: only GPU complete events, µs → ns */
    parse_ok("{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k1\", \"ts\": 10.5, \"dur\": 2},"
             "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"ts\": 1, \"dur\": 100},"
             "{\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy HtoD\", \"ts\": 20, \"dur\": 1},"
             "{\"ph\": \"i\", \"cat\": \"kernel\", \"name\": \"mark\", \"ts\": 3}]}",
             &t);
    assert_int_equal(t.n, 2);
    assert_string_equal(t.a[0].name, "k1");
    assert_true(t.a[0].start == 10500 && t.a[0].end == 12500);
    kr_trace_free(&t);
    parse_ok("[{\"ph\": \"X\", \"cat\": \"Kernel\", \"name\": \"k\", \"ts\": 1, \"dur\": 1}]", &t);
    assert_int_equal(t.n, 1);
    kr_trace_free(&t);
    /* malformed */
    parse_bad("Start (ns),Duration (ns),Name\n1,2,\"open\n", "not closed");
    parse_bad("Start (ns),Duration (ns),Name\n1,-2,k\n", "record 2");
    parse_bad("Start (ns),Duration (ns),Name\nx,2,k\n", "numbers");
    parse_bad("a,b,c\n1,2,3\n", "no header");
    parse_bad("Start (ns),Duration (ns),Name\n1,2\n", "record 2");
    parse_bad("K,10,5,1,1,1x1x1,1,0,0,k\n", "ends before");
    parse_bad("K,10,20,1,1\n", "10 fields");
    parse_bad("K,1,2,1,1,1x1x1,1,0,0,k\nfoo\n", "line 2");
    parse_bad("{\"traceEvents\": {}}", "traceEvents");
    parse_bad("{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": \"1\", \"dur\": 1}]}", "[0]");
    parse_bad("{broken", "not JSON");
    parse_bad("   \n", "empty");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_shares_against_brute_force),
                                       cmocka_unit_test(test_default_rules), cmocka_unit_test(test_readers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
