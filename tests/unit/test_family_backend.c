/* test_family_backend.c — what a backend must run for the sliding-window
 * families (model/model.c finish_load):
 *   - mistral and gemma3_text load on the CPU's table; each layer's window
 *     and rope table follow the config (gemma3: sliding layers with the
 *     local rope, the global one with the whole context);
 *   - a backend without sliding_window refuses both with a message that
 *     names the model type and the backend (the CUDA backend's case);
 *   - a backend without gelu_tanh_mul or scale refuses gemma3_text;
 *   - gemma3's norms are read as 1 + w (dummy weights: exactly 1).
 * The CPU backend's table is copied with those members cleared as each
 * case needs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "model/model.h"
#include "model/model_internal.h"

static struct backend be;
static struct backend_ops ops;

static int setup(void **state) {
    (void)state;
    struct backend_options bo = {.n_threads = 1};
    struct kiln_error err = {0};
    if (backend_create(&be, "cpu", &bo, &err)) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    backend_destroy(&be);
    return 0;
}

static char *fixture(const char *rel) {
    const char *fx = getenv("KILN_FIXTURES");
    return path_join(fx ? fx : "tests/fixtures", rel);
}

/* Loads a tiny-models-more fixture with the CPU's table as changed by `edit`. */
static int load(struct model **m, const char *arch, const struct backend_ops *table,
                struct kiln_error *err) {
    char rel[128];
    snprintf(rel, sizeof rel, "oracle/tiny-models-more/%s", arch);
    char *dir = fixture(rel);
    /* the model keeps the backend's address: one loaded model at a time */
    static struct backend b;
    b = (struct backend){table, be.ctx};
    struct model_options mo = {.max_batch_tokens = 4, .max_seqs = 1, .max_context = 16};
    err->msg[0] = 0;
    int rc = model_load(m, dir, &b, &mo, err);
    free(dir);
    return rc;
}

static void test_cpu_loads(void **state) {
    (void)state;
    struct model *m;
    struct kiln_error err;
    if (load(&m, "mistral", be.ops, &err)) fail_msg("%s", err.msg);
    for (int l = 0; l < m->cfg.n_layers; l++) assert_int_equal(model_config_layer_window(&m->cfg, l), 8);
    assert_null(m->rope_table_local);
    model_free(m);
    if (load(&m, "gemma3", be.ops, &err)) fail_msg("%s", err.msg);
    assert_int_equal(model_config_layer_window(&m->cfg, 0), 8);
    assert_int_equal(model_config_layer_window(&m->cfg, 2), 0);
    assert_non_null(m->rope_table_local);
    assert_true(m->rope_table_local != m->rope_table);
    assert_ptr_equal(m->lm_head.data, m->embed.data); /* tied */
    assert_non_null(m->layers[0].ln_post_attn);
    assert_non_null(m->layers[0].ln_post_mlp);
    model_free(m);
}

static void test_refusals(void **state) {
    (void)state;
    struct model *m = NULL;
    struct kiln_error err;
    ops = *be.ops;
    ops.name = "nowindow";
    ops.sliding_window = 0;
    assert_int_equal(load(&m, "mistral", &ops, &err), -1);
    assert_non_null(strstr(err.msg, "mistral: sliding_window 8: the nowindow backend does not run "
                                    "sliding-window attention yet"));
    assert_int_equal(load(&m, "gemma3", &ops, &err), -1);
    assert_non_null(strstr(err.msg, "sliding-window attention"));
    ops = *be.ops;
    ops.name = "nogelu";
    ops.gelu_tanh_mul = NULL;
    assert_int_equal(load(&m, "gemma3", &ops, &err), -1);
    assert_non_null(strstr(err.msg, "gemma3_text: the nogelu backend does not run this family's "
                                    "operations"));
    ops = *be.ops;
    ops.name = "noscale";
    ops.scale = NULL;
    assert_int_equal(load(&m, "gemma3", &ops, &err), -1);
    assert_non_null(strstr(err.msg, "the noscale backend"));
}

static void test_norm_plus_one(void **state) {
    (void)state;
    char *cfg = fixture("oracle/tiny-models-more/gemma3/config.json");
    struct model_config c;
    struct kiln_error err = {0};
    if (model_config_load(&c, cfg, &err)) fail_msg("%s", err.msg);
    free(cfg);
    struct model *m;
    struct model_options mo = {.max_batch_tokens = 4, .max_seqs = 1, .max_context = 16};
    if (model_load_dummy(&m, &c, &be, &mo, &err)) fail_msg("%s", err.msg);
    const struct layer *L = &m->layers[1];
    const float *norms[] = {L->ln_attn, L->ln_mlp, L->ln_post_attn, L->ln_post_mlp, m->final_norm};
    for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++)
        for (int k = 0; k < c.hidden_size; k++) assert_true(norms[i][k] == 1.0f);
    for (int k = 0; k < c.head_dim; k++) assert_true(L->mha.q_norm[k] == 1.0f);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_loads),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_norm_plus_one),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
