/* test_shared_fusion.c — shared-expert fusion (src/model/moe.c):
 * DeepSeek's single shared expert joins the routed experts as expert E,
 * chosen by every token with weight 1. The oracle's deepseek_v3 model
 * (one shared expert) runs the same prefill and decode steps with fusion on
 * (the default) and off (model_options.no_shared_expert_fusion); the
 * logits must be the same to the bit (the fused path sums in the same
 * order), and fusion must really have happened on every MoE layer. The
 * deepseek_v2 model (two shared experts) must keep them separate. Agreement
 * with Hugging Face is `kiln verify`'s (tests/cli/verify_oracle.sh). */
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
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

enum { PAGE = 4, N_SEQS = 3, MAX_CTX = 128, STEPS = 4 };

/* Logits of N_SEQS sequences: a prefill step (prompts of 9, 17, 30
 * tokens), then STEPS - 1 decode steps; out[(step * N_SEQS + s) * V]. */
static void run(const char *dir, int fuse, float *out, int *n_fused_layers, int *n_moe_layers) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 1};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    struct model_options mo = {.max_batch_tokens = 256, .max_seqs = N_SEQS, .max_context = MAX_CTX,
                               .no_shared_expert_fusion = !fuse};
    struct model *m;
    if (model_load(&m, dir, &be, &mo, &err)) fail_msg("%s", err.msg);
    *n_fused_layers = *n_moe_layers = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (m->layers[l].mlp_kind != LAYER_MLP_MOE) continue;
        (*n_moe_layers)++;
        *n_fused_layers += m->layers[l].moe.shared_fused;
    }
    int V = m->cfg.vocab_size;
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = N_SEQS * MAX_CTX};
    struct runner *r;
    if (runner_create(&r, m, &ro, &err)) fail_msg("%s", err.msg);
    struct kv_pool *kv = runner_kv(r);
    static const int prompt[N_SEQS] = {9, 17, 30};
    int32_t pages[N_SEQS][MAX_CTX / PAGE], ids[N_SEQS][64];
    struct sb_seq seqs[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        for (int k = 0; k < 64; k++) ids[s][k] = (int32_t)((s * 131 + k * 17 + 5) % V);
        seqs[s] = (struct sb_seq){0, 0, pages[s], ids[s]};
    }
    struct step_batch sb;
    sb_init(&sb, PAGE, 256, N_SEQS, N_SEQS * MAX_CTX / PAGE);
    for (int step = 0; step < STEPS; step++) {
        sb_begin(&sb);
        for (int s = 0; s < N_SEQS; s++) sb_add(&sb, kv, &seqs[s], step == 0 ? prompt[s] : 1);
        struct batch b = sb_batch(&sb);
        if (runner_forward(r, &b, out + (size_t)step * N_SEQS * V, &err)) fail_msg("%s", err.msg);
    }
    for (int s = 0; s < N_SEQS; s++) kv_pool_release(kv, seqs[s].pages, seqs[s].n_pages);
    sb_free(&sb);
    runner_free(r);
    model_free(m);
    backend_destroy(&be);
}

static char *model_dir(const char *arch) {
    const char *fx = getenv("KILN_FIXTURES");
    char rel[128];
    snprintf(rel, sizeof rel, "oracle/tiny-models/%s", arch);
    return path_join(fx ? fx : "tests/fixtures", rel);
}

static void test_deepseek_v3_fused_equals_separate(void **state) {
    (void)state;
    char *dir = model_dir("deepseek_v3");
    size_t n = (size_t)STEPS * N_SEQS * 4096;
    float *a = xcalloc(n, 4), *b = xcalloc(n, 4);
    int fa, fb, ma, mb;
    run(dir, 1, a, &fa, &ma);
    run(dir, 0, b, &fb, &mb);
    printf("  deepseek_v3: %d of %d MoE layers fused (fusion on), %d (off)\n", fa, ma, fb);
    assert_true(ma > 0);
    assert_int_equal(fa, ma);
    assert_int_equal(fb, 0);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], 4) != 0;
    printf("  logits differing between fused and separate: %zu\n", diff);
    assert_int_equal(diff, 0);
    free(a), free(b), free(dir);
}

static void test_deepseek_v2_two_shared_stay_separate(void **state) {
    (void)state;
    char *dir = model_dir("deepseek_v2");
    float *a = xcalloc((size_t)STEPS * N_SEQS * 4096, 4);
    int f, mo;
    run(dir, 1, a, &f, &mo);
    assert_true(mo > 0);
    assert_int_equal(f, 0);
    free(a), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_deepseek_v3_fused_equals_separate),
                                       cmocka_unit_test(test_deepseek_v2_two_shared_stay_separate)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
