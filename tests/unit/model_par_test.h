/* model_par_test.h — what the tensor parallel and DP attention model tests
 * (test_model_tp.c, test_model_dp.c) share: the largest difference of two
 * results, and the loads that must be refused. Include after cmocka.h. */
#ifndef KILN_TESTS_MODEL_PAR_TEST_H
#define KILN_TESTS_MODEL_PAR_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "model/model.h"
#include "model_ref_steps.h"
#include "tensor/backend.h"

/* The largest |a - b| (a NaN on either side: infinity). */
static double max_diff(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
    }
    return e;
}

/* Loading config c (dummy weights) as rank 0 of par gives an error
 * containing `want`. */
static void expect_refusal(const struct model_config *c, const struct model_parallel *par, const char *want) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 1};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    struct model_options mo = {.max_batch_tokens = 16, .max_seqs = 2, .max_context = 64, .par = *par};
    struct model *m = NULL;
    int rc = model_load_dummy(&m, c, &be, &mo, &err);
    if (rc == 0) model_free(m);
    backend_destroy(&be);
    printf("  refused: %s\n", err.msg);
    assert_int_equal(rc, -1);
    if (!strstr(err.msg, want)) fail_msg("expected '%s' in: %s", want, err.msg);
}

/* The config.json of fixture rel into c. */
static void load_config(const char *rel, struct model_config *c) {
    struct kiln_error err = {0};
    char *path = fixture(rel);
    if (model_config_load(c, path, &err)) fail_msg("%s", err.msg);
    free(path);
}

#endif
