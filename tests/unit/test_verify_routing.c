/* test_verify_routing.c — the comparison behind `kiln verify
 * --routing-check` (src/cli/verify_routing.c), fed traces as the two
 * models give them, with the CPU backend's routing operation as the truth:
 * equal choices pass; a choice that differs where the CPU's routing on the
 * device's own router logits makes it too is a flip, which marks the
 * sequence's later rows and, within the step, the rows at later layers as
 * not compared; any other difference fails naming the layer and row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "cli/verify_routing.h"

enum { E = 8, K = 2 };

static struct backend cpu;

static const struct moe_route_params RP = {.n_experts = E, .top_k = K, .scoring = MOE_ROUTE_SOFTMAX,
                                           .method = MOE_ROUTE_GREEDY, .n_group = 1, .topk_group = 1,
                                           .renormalize = 1, .scaling = 1.0f};

/* the CPU's choice of the rows' logits [n][E] into ids [n][K] */
static void route(const float *logits, long n, int32_t *ids) {
    float w[64 * K];
    assert_true(n <= 64);
    cpu.ops->moe_route(cpu.ctx, ids, w, logits, NULL, &RP, n);
}

/* one layer of a step: the device's and the CPU's traces */
static void layer(struct verify_routing *vr, int l, long n, const float *dev_logits, const int32_t *dev_ids,
                  const float *ref_logits) {
    int32_t ref_ids[64 * K];
    route(ref_logits, n, ref_ids);
    struct model_route_trace td = vr_trace_device(vr), tc = vr_trace_cpu(vr);
    td.fn(td.user, l, n, E, K, dev_logits, dev_ids, &RP, NULL);
    tc.fn(tc.user, l, n, E, K, ref_logits, ref_ids, &RP, NULL);
}

/* logits of a row: expert e at e / 8, then experts a, b, c set to va, vb,
 * vc (c < 0: none) */
static void row3(float *lg, int a, float va, int b, float vb, int c, float vc) {
    for (int e = 0; e < E; e++) lg[e] = (float)e / 8.0f;
    lg[a] = va, lg[b] = vb;
    if (c >= 0) lg[c] = vc;
}
static void row(float *lg, int a, float va, int b, float vb) { row3(lg, a, va, b, vb, -1, 0.0f); }

static void test_agree_and_flip(void **state) {
    (void)state;
    struct verify_routing *vr = vr_create(&cpu, 2);
    struct kiln_error err = {0};
    /* step 1: rows (seq 0, pos 0), (seq 0, pos 1), (seq 1, pos 0); layer
     * 0: the device's logits differ by rounding only, same choices */
    float ref[3 * E], dev[3 * E];
    int32_t ids[3 * K];
    for (int t = 0; t < 3; t++) row(ref + t * E, 6, 2.0f, 7, 3.0f), row(dev + t * E, 6, 2.001f, 7, 3.0f);
    struct vr_row rows[3] = {{0, 0}, {0, 1}, {1, 0}};
    vr_step_begin(vr);
    route(dev, 3, ids);
    layer(vr, 0, 3, dev, ids, ref);
    /* layer 1: expert 7 first; at (seq 0, pos 0) experts 5 and 6 tie for
     * second within the rounding and the device's logits tip it: a flip.
     * (seq 0, pos 1) then differs by more at layer 2, after the flip: not
     * compared. */
    for (int t = 0; t < 3; t++)
        row3(ref + t * E, 7, 3.0f, 6, 2.0005f, 5, 2.0f), row3(dev + t * E, 7, 3.0f, 6, 2.0005f, 5, 2.0f);
    dev[5] = 2.001f; /* row 0: expert 5 above 6 on the device */
    route(dev, 3, ids);
    assert_true(ids[0] == 5 || ids[1] == 5); /* the device's choice really differs */
    layer(vr, 1, 3, dev, ids, ref);
    for (int t = 0; t < 3; t++) row(ref + t * E, 1, 4.0f, 2, 5.0f), row(dev + t * E, 1, 4.0f, 2, 5.0f);
    route(dev, 3, ids);
    ids[1 * K] = 0; /* row 1 (seq 0, pos 1): not what any routing of its logits gives */
    layer(vr, 2, 3, dev, ids, ref);
    assert_int_equal(vr_step_compare(vr, rows, 3, &err), 0);
    assert_true(vr_excluded(vr, 0, 0));
    assert_true(vr_excluded(vr, 0, 1));
    assert_false(vr_excluded(vr, 1, 0));
    assert_false(vr_excluded(vr, 1, 1));

    /* step 2: seq 1 alone, its device choice wrong at layer 0: fails */
    vr_step_begin(vr);
    float r1[E], d1[E];
    int32_t i1[K];
    row(r1, 3, 7.0f, 4, 6.0f), row(d1, 3, 7.0f, 4, 6.0f);
    route(d1, 1, i1);
    i1[1] = 0; /* {3, 0}: the CPU's routing of these logits gives {3, 4} */
    layer(vr, 0, 1, d1, i1, r1);
    struct vr_row r[1] = {{1, 1}};
    assert_int_equal(vr_step_compare(vr, r, 1, &err), -1);
    assert_non_null(strstr(err.msg, "layer 0, sequence 1, position 1"));
    assert_non_null(strstr(err.msg, "{0,3}"));
    assert_non_null(strstr(err.msg, "{3,4}"));
    /* the router logits differed by 1e-3 where compared */
    assert_true(vr_router_err(vr) == 0.0);
    vr_mode_end(vr, "test", 0);
    assert_true(vr_router_err(vr) > 0.9e-3 && vr_router_err(vr) < 1.1e-3);
    vr_free(vr);
}

/* A new mode starts every sequence over: nothing excluded. */
static void test_mode_resets(void **state) {
    (void)state;
    struct verify_routing *vr = vr_create(&cpu, 1);
    struct kiln_error err = {0};
    float ref[E], dev[E];
    int32_t ids[K];
    row3(ref, 7, 3.0f, 6, 2.0005f, 5, 2.0f), row3(dev, 7, 3.0f, 6, 2.0005f, 5, 2.001f);
    vr_step_begin(vr);
    route(dev, 1, ids);
    layer(vr, 0, 1, dev, ids, ref);
    struct vr_row r[1] = {{0, 4}};
    assert_int_equal(vr_step_compare(vr, r, 1, &err), 0);
    assert_true(vr_excluded(vr, 0, 4));
    assert_false(vr_excluded(vr, 0, 3));
    vr_mode_begin(vr);
    assert_false(vr_excluded(vr, 0, 4));
    vr_free(vr);
}

int main(void) {
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 1, .cpu_f32 = 1};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agree_and_flip),
        cmocka_unit_test(test_mode_resets),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    backend_destroy(&cpu);
    return rc;
}
