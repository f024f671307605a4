/* test_mla_forms.c — MLA's two forms (model/deepseek_mha.c): the absorbed
 * form and the MHA form (the context decompressed through kv_b_proj,
 * ordinary attention at dk = nope + rope, dv = vd).
 *   - the choice: on DeepSeek-V2-Lite's shapes a prompt takes MHA, decode
 *     rows stay absorbed, an extend after a long prefix takes MHA from 169
 *     new tokens (the FLOP rule solved by hand below), a context past the
 *     workspace never does, and KILN_MLA_FORM forces either;
 *   - against the oracle (Hugging Face fp32 logits of deepseek_v2 and
 *     deepseek_v3), each form forced and auto, page sizes 1 and 16: a
 *     prompt prefix, then a second sequence that shares its KV pages (what
 *     a radix-cache hit hands the model) and extends them in the same
 *     batch as a decode row of a third sequence; the context decompressed
 *     in one product and in products of 7 positions (KILN_MLA_CHUNK);
 *   - auto really runs MHA for the prompt and absorbed for decode rows: its
 *     logits are the same bits as MHA forced for the prompt step and as
 *     absorbed forced for the decode steps after it, and the forms differ. */
#include <math.h>
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
#include "base/knob.h"
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

enum { FORM_AUTO = 0, FORM_ABSORBED = 1, FORM_MHA = 2, MAX_CTX = 128 };

static void set_form(const char *form) {
    setenv("KILN_MLA_FORM", form, 1);
    assert_int_equal(knob_reload(NULL), 0);
}

static char *fixture(const char *rel) {
    const char *fx = getenv("KILN_FIXTURES");
    return path_join(fx ? fx : "tests/fixtures", rel);
}

/* DeepSeek-V2-Lite: H 16, kv_lora_rank 512, nope 128, rope 64, v 128. Per
 * head (H cancels), with P = n·L − n(n−1)/2:
 *   absorbed = 2n·512·256 + 2P·(2·512 + 64),  mha = 2L·512·256 + 2P·(128 + 64 + 128)
 * so MHA ⇔ 131072·(L − n) < 768·P. A prompt (n = L) always; n = 1 never
 * (ruled out before the costs). At L = 8192: n = 168 gives P = 1,362,228,
 * 768·P = 1,046,191,104 < 131072·8024 = 1,051,721,728: absorbed; n = 169
 * gives P = 1,370,252, 768·P = 1,052,353,536 > 131072·8023 = 1,051,590,656:
 * MHA. */
static void test_choice(void **state) {
    (void)state;
    char *dir = path_join(getenv("KILN_MODELS") ? getenv("KILN_MODELS") : "models",
                          "configs/deepseek-v2-lite.json");
    struct model_config c;
    struct kiln_error err = {0};
    if (model_config_load(&c, dir, &err)) fail_msg("%s", err.msg);
    free(dir);
    assert_int_equal(c.n_heads, 16);
    long ws = 32768;
    assert_true(mla_use_mha(&c, 8192, 8192, ws, FORM_AUTO));
    assert_true(mla_use_mha(&c, 2, 2, ws, FORM_AUTO));
    assert_false(mla_use_mha(&c, 1, 8192, ws, FORM_AUTO));
    assert_false(mla_use_mha(&c, 1, 1, ws, FORM_AUTO));
    assert_false(mla_use_mha(&c, 168, 8192, ws, FORM_AUTO));
    assert_true(mla_use_mha(&c, 169, 8192, ws, FORM_AUTO));
    assert_false(mla_use_mha(&c, 16, 8192, ws, FORM_AUTO));
    assert_true(mla_use_mha(&c, 512, 8192, ws, FORM_AUTO));
    /* the workspace bounds the context, forced or not */
    assert_false(mla_use_mha(&c, 40000, 40000, ws, FORM_AUTO));
    assert_false(mla_use_mha(&c, 40000, 40000, ws, FORM_MHA));
    assert_true(mla_use_mha(&c, 1, 8192, ws, FORM_MHA));
    assert_false(mla_use_mha(&c, 8192, 8192, ws, FORM_ABSORBED));
}

struct oracle {
    struct st_set st;
    const int32_t *ids[2];
    const float *logits[2];
    int len[2];
};

static void oracle_open(struct oracle *o, const char *dir) {
    char *ref = path_join(dir, "reference.safetensors");
    struct kiln_error err = {0};
    if (st_open_file(&o->st, ref, &err)) fail_msg("%s", err.msg);
    free(ref);
    for (int i = 0; i < 2; i++) {
        char n[32];
        snprintf(n, sizeof n, "p%d.ids", i + 1);
        const struct st_tensor *t = st_find(&o->st, n);
        snprintf(n, sizeof n, "p%d.logits", i + 1);
        const struct st_tensor *lg = st_find(&o->st, n);
        assert_non_null(t);
        assert_non_null(lg);
        o->ids[i] = t->data, o->logits[i] = lg->data, o->len[i] = (int)t->shape[0];
    }
}

static double row_err(const float *a, const float *b, int V) {
    double e = 0;
    for (int i = 0; i < V; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

/* A: p1's first `pre` tokens (a page multiple); B: p1 again, sharing A's
 * pages for those positions, extends with the rest of p1 beside C's
 * decode row (C: p2's first half as a prompt first). Returns the largest
 * error against the oracle. */
static double shared_prefix_run(const char *arch, const char *form, int page, int chunk) {
    char cs[16];
    snprintf(cs, sizeof cs, "%d", chunk);
    setenv("KILN_MLA_CHUNK", cs, 1);
    set_form(form);
    char rel[64];
    snprintf(rel, sizeof rel, "oracle/tiny-models/%s", arch);
    char *dir = fixture(rel);
    struct oracle o;
    oracle_open(&o, dir);
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    struct model_options mo = {.max_batch_tokens = 128, .max_seqs = 4, .max_context = MAX_CTX};
    struct model *m;
    if (model_load(&m, dir, &be, &mo, &err)) fail_msg("%s", err.msg);
    int V = m->cfg.vocab_size;
    struct runner_options ro = {.page_size = page, .kv_tokens = 4 * MAX_CTX};
    struct runner *r;
    if (runner_create(&r, m, &ro, &err)) fail_msg("%s", err.msg);
    struct kv_pool *kv = runner_kv(r);
    int32_t pa[MAX_CTX], pb[MAX_CTX], pc[MAX_CTX];
    struct sb_seq A = {0, 0, pa, o.ids[0]}, B = {0, 0, pb, o.ids[0]}, C = {0, 0, pc, o.ids[1]};
    struct step_batch sb;
    sb_init(&sb, page, 128, 4, 4 * MAX_CTX);
    float *lg = xmalloc((size_t)4 * V * 4);
    double worst = 0;
    int pre = 32, half = o.len[1] / 2;
    /* step 1: A's prefix and C's prompt */
    sb_begin(&sb);
    sb_add(&sb, kv, &A, pre);
    sb_add(&sb, kv, &C, half);
    struct batch b = sb_batch(&sb);
    if (runner_forward(r, &b, lg, &err)) fail_msg("%s", err.msg);
    worst = fmax(worst, row_err(lg, o.logits[0] + (size_t)(pre - 1) * V, V));
    worst = fmax(worst, row_err(lg + V, o.logits[1] + (size_t)(half - 1) * V, V));
    /* B takes A's pages for positions 0 .. pre-1, as a radix-cache hit */
    B.n_pages = pre / page;
    memcpy(pb, pa, (size_t)B.n_pages * 4);
    B.len = pre;
    /* steps 2..: C decodes; B extends once with the rest of p1, then decodes */
    for (int step = 0; C.len < o.len[1] && B.len < o.len[0]; step++) {
        sb_begin(&sb);
        sb_add(&sb, kv, &C, 1);
        int nb = step == 0 ? o.len[0] - pre - 3 : 1;
        sb_add(&sb, kv, &B, nb);
        b = sb_batch(&sb);
        if (runner_forward(r, &b, lg, &err)) fail_msg("%s", err.msg);
        worst = fmax(worst, row_err(lg, o.logits[1] + (size_t)(C.len - 1) * V, V));
        worst = fmax(worst, row_err(lg + V, o.logits[0] + (size_t)(B.len - 1) * V, V));
    }
    kv_pool_release(kv, pa, A.n_pages);
    kv_pool_release(kv, pb + pre / page, B.n_pages - pre / page);
    kv_pool_release(kv, pc, C.n_pages);
    free(lg);
    sb_free(&sb);
    runner_free(r);
    model_free(m);
    backend_destroy(&be);
    st_close(&o.st);
    free(dir);
    return worst;
}

static void test_oracle_forms(void **state) {
    (void)state;
    const char *archs[] = {"deepseek_v2", "deepseek_v3"}, *forms[] = {"auto", "absorbed", "mha"};
    for (int a = 0; a < 2; a++)
        for (int f = 0; f < 3; f++)
            for (int page = 1; page <= 16; page += 15) {
                int chunk = page == 1 ? 0 : 7; /* 7: the context decompressed in several products */
                double e = shared_prefix_run(archs[a], forms[f], page, chunk);
                printf("  %s %-8s page %2d chunk %d: max |logit - oracle| %.3g\n", archs[a], forms[f],
                       page, chunk, e);
                if (!(e <= 1e-3)) fail_msg("%s %s page %d: %.3g above 1e-3", archs[a], forms[f], page, e);
            }
    unsetenv("KILN_MLA_FORM");
    unsetenv("KILN_MLA_CHUNK");
    knob_reload(NULL);
}

/* One sequence: a 40-token prompt, then 4 decode steps; the form of each
 * step set before it. out[step][V]. */
static void steps_run(const char *const *forms, float *out, int *V_out) {
    char *dir = fixture("oracle/tiny-models/deepseek_v2");
    struct oracle o;
    oracle_open(&o, dir);
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    struct model_options mo = {.max_batch_tokens = 64, .max_seqs = 2, .max_context = MAX_CTX};
    struct model *m;
    if (model_load(&m, dir, &be, &mo, &err)) fail_msg("%s", err.msg);
    int V = *V_out = m->cfg.vocab_size;
    struct runner_options ro = {.page_size = 4, .kv_tokens = MAX_CTX};
    struct runner *r;
    if (runner_create(&r, m, &ro, &err)) fail_msg("%s", err.msg);
    struct kv_pool *kv = runner_kv(r);
    int32_t pages[MAX_CTX];
    struct sb_seq s = {0, 0, pages, o.ids[0]};
    struct step_batch sb;
    sb_init(&sb, 4, 64, 2, MAX_CTX);
    for (int step = 0; step < 5; step++) {
        set_form(forms[step]);
        sb_begin(&sb);
        sb_add(&sb, kv, &s, step == 0 ? 40 : 1);
        struct batch b = sb_batch(&sb);
        if (runner_forward(r, &b, out + (size_t)step * V, &err)) fail_msg("%s", err.msg);
    }
    kv_pool_release(kv, pages, s.n_pages);
    sb_free(&sb);
    runner_free(r);
    model_free(m);
    backend_destroy(&be);
    st_close(&o.st);
    free(dir);
}

static void test_auto_picks(void **state) {
    (void)state;
    static const char *autos[] = {"auto", "auto", "auto", "auto", "auto"};
    static const char *mha_then_abs[] = {"mha", "absorbed", "absorbed", "absorbed", "absorbed"};
    static const char *all_abs[] = {"absorbed", "absorbed", "absorbed", "absorbed", "absorbed"};
    static const char *all_mha[] = {"mha", "mha", "mha", "mha", "mha"};
    int V;
    float *a = xcalloc(5 * 4096, 4), *x = xcalloc(5 * 4096, 4), *ab = xcalloc(5 * 4096, 4),
          *mh = xcalloc(5 * 4096, 4);
    steps_run(autos, a, &V);
    steps_run(mha_then_abs, x, &V);
    steps_run(all_abs, ab, &V);
    steps_run(all_mha, mh, &V);
    assert_memory_equal(a, x, (size_t)5 * V * 4);
    /* the forms really differ: in the prompt step, and in a decode step
     * over the same (MHA-built) cache */
    assert_true(memcmp(a, ab, (size_t)V * 4) != 0);
    assert_true(memcmp(a + V, mh + V, (size_t)V * 4) != 0);
    printf("  auto: the prompt step as MHA forced, decode steps as absorbed forced (same bits)\n");
    free(a), free(x), free(ab), free(mh);
    unsetenv("KILN_MLA_FORM");
    knob_reload(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_choice),
                                       cmocka_unit_test(test_oracle_forms),
                                       cmocka_unit_test(test_auto_picks)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
