/* test_model_dp.c — DP attention inside the model (docs/distributed.md,
 * "DP attention"): the MLA oracle models (deepseek_v2, deepseek_v3) over
 * 2 and 4 ranks as threads with 2 (or 4) data parallel groups, experts
 * split by columns or whole (--ep), run the steps of test_model_tp.c (a
 * prefill of four sequences, a chunk of one beside decode rows of the
 * others, decode steps; page sizes 1 and 16) with the sequences placed on
 * the groups in several ways: spread over every group (interleaved, so a
 * group's rows are not contiguous), all on group 0 (the others idle every
 * step) and all but one on the last group. Every rank's logits must match
 * the whole model's within 1e-4 (and be the same bits on every rank), and
 * Hugging Face's within 1e-3. Each group writes only its own sequences'
 * latent KV rows: the others' stay zero in its pool. Refusals: a dp size
 * that does not divide tp, a model without MLA, a wrong dp rank. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "dist_world.h"
#include "model_par_test.h"
#include "model_ref_steps.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"




/* Where sequence s of the steps goes: spread (s % dp), all on group 0,
 * all but sequence 0 on the last group. */
enum placement { SPREAD = 0, ALL_FIRST, ALL_LAST };
static int group_of(enum placement pl, int s, int dp) {
    if (dp <= 1) return 0;
    if (pl == SPREAD) return s % dp;
    if (pl == ALL_FIRST) return 0;
    return s == 0 ? 0 : dp - 1;
}

/* One rank (or the whole model: par NULL) loads dir and runs the steps
 * into out[rows][V]. own_zero: set to 1 when every KV row of a sequence
 * outside the rank's group is still zero after the steps. */
static int run_model(const char *dir, const struct ref *r, const struct model_parallel *par, int page,
                     enum placement pl, float *out, int *others_zero, struct kiln_error *err) {
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1};
    struct model *m = NULL;
    struct runner *run = NULL;
    int rc = -1, dp = par ? par->dp_size : 0;
    int32_t pages[MAX_SEQS][MAX_CTX];
    int n_pages[MAX_SEQS] = {0};
    if (backend_create(&be, "cpu", &bo, err)) return -1;
    struct model_options mo = {.max_batch_tokens = MAX_TOKENS, .max_seqs = MAX_SEQS, .max_context = MAX_CTX};
    if (par) mo.par = *par;
    if (model_load(&m, dir, &be, &mo, err)) goto out;
    struct runner_options ro = {.page_size = page, .kv_tokens = MAX_SEQS * MAX_CTX};
    if (runner_create(&run, m, &ro, err)) goto out;
    struct kv_pool *kv = runner_kv(run);
    int32_t group[MAX_SEQS];
    for (int s = 0; s < r->n; s++) group[s] = group_of(pl, s, dp);
    if (ref_run_steps(run, r, page, dp > 1 ? group : NULL, pages, n_pages, out, err)) goto out;
    if (others_zero && dp > 1) {
        /* the CPU's cache is fp32 host memory: the latent rows of layer 0 */
        const float *k0 = kv->k[0];
        long w = kv->layout[0].k_width;
        int g = par->dp_rank, zero = 1, written = 0;
        for (int s = 0; s < r->n; s++)
            for (int p = 0; p < n_pages[s] * page; p++) {
                const float *row = k0 + (size_t)(pages[s][p / page] * page + p % page) * (size_t)w;
                int nz = 0;
                for (long i = 0; i < w; i++) nz |= row[i] != 0.0f;
                if (group_of(pl, s, dp) != g) zero &= !nz;
                else written |= nz;
            }
        int any_own = 0;
        for (int s = 0; s < r->n; s++) any_own |= group_of(pl, s, dp) == g;
        *others_zero = zero && (written || !any_own);
    }
    rc = 0;
out:
    for (int s = 0; s < MAX_SEQS; s++)
        if (n_pages[s]) kv_pool_release(runner_kv(run), pages[s], n_pages[s]);
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
    return rc;
}

/* ---- ranks as threads ----------------------------------------------------- */

struct job {
    const char *dir;
    const struct ref *ref;
    int tp, ep, dp, page;
    enum placement pl;
    float *out[8];
    int zero[8];
    char err[8][KILN_ERROR_MAX];
};
struct dp_world {
    struct world w; /* first: the ranks' k->w */
    struct job *job;
};

static void rank_body(struct rank *k) {
    struct job *j = ((struct dp_world *)k->w)->job;
    struct model_parallel par = {.tp_size = j->tp, .tp_rank = k->r, .ep_size = j->ep, .dp_size = j->dp,
                                 .dp_rank = k->r / (j->tp / j->dp), .comm = &k->c};
    struct kiln_error err = {0};
    if (run_model(j->dir, j->ref, &par, j->page, j->pl, j->out[k->r], &j->zero[k->r], &err)) {
        snprintf(j->err[k->r], sizeof j->err[k->r], "%s", err.msg);
        rank_fail(k, "rank %d: %s", k->r, err.msg);
    }
}

static int run_ranks(struct job *j) {
    struct dp_world tw = {.job = j};
    const char *first;
    tw.w.timeout_s = 60;
    return world_run(&tw.w, j->tp, rank_body, &first);
}

/* {tp, ep, dp, page, placement} */
struct split {
    int tp, ep, dp, page;
    enum placement pl;
};

static void check_model(const char *rel, const struct split *splits, int n_splits) {
    static const char *const pl_names[] = {"spread", "all on group 0", "all but one on the last"};
    char *dir = fixture(rel);
    struct ref r;
    ref_open_steps(&r, dir);
    const float *want[MAX_ROWS];
    int rows = want_rows(&r, want);
    assert_true(rows <= MAX_ROWS);
    size_t n = (size_t)rows * (size_t)r.V;
    float *whole = xcalloc(n, 4);
    struct kiln_error err = {0};
    if (run_model(dir, &r, NULL, 16, SPREAD, whole, NULL, &err)) fail_msg("%s: %s", rel, err.msg);
    for (int t = 0; t < n_splits; t++) {
        const struct split *sp = &splits[t];
        struct job j = {.dir = dir, .ref = &r, .tp = sp->tp, .ep = sp->ep, .dp = sp->dp, .page = sp->page,
                        .pl = sp->pl};
        for (int k = 0; k < j.tp; k++) j.out[k] = xcalloc(n, 4);
        int bad = run_ranks(&j);
        for (int k = 0; k < j.tp && bad; k++)
            if (j.err[k][0]) fail_msg("%s tp %d dp %d ep %d: rank %d: %s", rel, j.tp, j.dp, j.ep, k, j.err[k]);
        assert_int_equal(bad, 0);
        double e_whole = 0, e_ref = 0;
        for (int k = 0; k < j.tp; k++) {
            double e = max_diff(j.out[k], whole, n);
            if (!(e <= e_whole)) e_whole = e;
            for (int i = 0; i < rows; i++) {
                e = max_diff(j.out[k] + (size_t)i * (size_t)r.V, want[i], (size_t)r.V);
                if (!(e <= e_ref)) e_ref = e;
            }
            assert_memory_equal(j.out[k], j.out[0], n * 4);
            if (!j.zero[k]) fail_msg("%s tp %d dp %d: rank %d wrote KV rows of another group's sequences (or none of its own)",
                                     rel, j.tp, j.dp, k);
        }
        printf("  %s tp %d dp %d ep %d page %d, %s: max |logit - whole| %.3g, |logit - Hugging Face| %.3g\n",
               rel, j.tp, j.dp, j.ep, j.page, pl_names[j.pl], e_whole, e_ref);
        assert_true(e_whole <= 1e-4);
        assert_true(e_ref <= 1e-3);
        for (int k = 0; k < j.tp; k++) free(j.out[k]);
    }
    free(whole);
    st_close(&r.st);
    free(dir);
}

static const struct split SPLITS[] = {
    {2, 0, 2, 16, SPREAD}, {2, 0, 2, 1, ALL_FIRST}, {2, 2, 2, 16, ALL_LAST}, {2, 2, 2, 1, SPREAD},
    {4, 0, 2, 16, SPREAD}, {4, 4, 4, 16, SPREAD},   {4, 0, 4, 1, ALL_LAST},
};
enum { N_SPLITS = sizeof SPLITS / sizeof SPLITS[0] };

static void test_deepseek_v2(void **state) {
    (void)state;
    check_model("oracle/tiny-models/deepseek_v2", SPLITS, N_SPLITS);
}
static void test_deepseek_v3(void **state) {
    (void)state;
    check_model("oracle/tiny-models/deepseek_v3", SPLITS, N_SPLITS);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_refusals(void **state) {
    (void)state;
    struct model_config *c = xcalloc(1, sizeof *c);
    load_config("oracle/tiny-models/deepseek_v3/config.json", c);
    struct model_parallel p = {.tp_size = 4, .dp_size = 3};
    expect_refusal(c, &p, "the data parallel size (3) must divide the tensor parallel size (4)");
    p = (struct model_parallel){.tp_size = 1, .dp_size = 2};
    expect_refusal(c, &p, "the data parallel size (2) must divide the tensor parallel size (1)");
    p = (struct model_parallel){.tp_size = 4, .tp_rank = 3, .dp_size = 2, .dp_rank = 0};
    expect_refusal(c, &p, "rank 3 belongs to DP attention group 1 of 2, not 0");
    /* 4 heads over the 4 ranks of one group... of 3 heads: not divisible */
    c->n_heads = 6;
    p = (struct model_parallel){.tp_size = 4, .dp_size = 1};
    expect_refusal(c, &p, "num_attention_heads (6) is not divisible by the tensor parallel size 4");
    p = (struct model_parallel){.tp_size = 8, .dp_size = 2};
    expect_refusal(c, &p, "num_attention_heads (6) is not divisible by the attention tensor parallel size 4");
    load_config("oracle/tiny-models/qwen2_moe/config.json", c);
    p = (struct model_parallel){.tp_size = 2, .dp_size = 2};
    expect_refusal(c, &p, "DP attention needs multi-head latent attention (DeepSeek-V2/V3), not model_type qwen2_moe");
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_v2),
        cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
