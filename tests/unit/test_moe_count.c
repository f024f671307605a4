/* test_moe_count.c — the model's touched-expert counting and uniform dummy
 * routing (model_options.moe_count / dummy_routing, src/model/moe.c) on the
 * oracle MoE models with their real weights, on the CPU.
 *
 * The backend's moe_route is wrapped: the wrapper runs the real operation,
 * then counts the distinct routed experts of the call from the ids it
 * returned, on its own. Over a prefill step, decode steps and a mixed step
 * (decode rows beside a prompt chunk), model_moe_counts must report
 * exactly those counts per layer, decode steps (one token per sequence)
 * apart from the others; a step run with counting off adds nothing; the
 * bytes per expert and of the shared experts are the configs' shapes
 * (bf16). With --dummy-routing uniform, every row's experts must be the
 * draw of tensor/route_uniform.h for the row's KV slot, position and the
 * layer index (the keys the model passes are the batch's), and without it
 * no row may be routed at random. */
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
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "tensor/route_uniform.h"
#include "../step_batch.h"

enum { PAGE = 4, N_SEQS = 3, MAX_CTX = 128, MAX_LAYERS = 8 };

/* What the wrapper saw in the step running now, and the step's batch. */
static const struct backend_ops *real_ops;
static struct {
    int calls[MAX_LAYERS], distinct[MAX_LAYERS];
    const struct step_batch *batch;
    int uniform_rows, count_calls;
} seen;

static void wrap_route(void *ctx, int32_t *ids, float *weights, const float *logits, const float *bias,
                       const struct moe_route_params *p, long n) {
    real_ops->moe_route(ctx, ids, weights, logits, bias, p, n);
    int W = p->top_k + p->n_fused, d = 0;
    char hit[1024] = {0};
    assert_true(p->layer >= 0 && p->layer < MAX_LAYERS && n == seen.batch->nt);
    for (long i = 0; i < n; i++) {
        for (int j = 0; j < p->top_k; j++) {
            int e = ids[i * W + j];
            assert_true(e >= 0 && e < p->n_experts);
            if (!hit[e]) hit[e] = 1, d++;
        }
        if (!p->uniform) continue;
        /* the model keys rows on the batch's slots and positions */
        assert_int_equal(p->key_slot[i], seen.batch->slot[i]);
        assert_int_equal(p->key_pos[i], seen.batch->pos[i]);
        uint64_t row = route_uniform_row(seen.batch->slot[i], seen.batch->pos[i], p->layer);
        for (int j = 0; j < p->top_k; j++) { /* ids[j] is the j-th largest draw */
            int e = ids[i * W + j];
            float s = route_uniform_score(row, e);
            int above = 0;
            for (int x = 0; x < p->n_experts; x++) {
                float t = route_uniform_score(row, x);
                above += t > s || (t == s && x < e);
            }
            assert_int_equal(above, j);
        }
        seen.uniform_rows++;
    }
    seen.calls[p->layer]++;
    seen.distinct[p->layer] = d;
    seen.count_calls += p->count != NULL;
}

struct expect {
    long calls;
    long long sum, rows;
    int min, max;
};

static void add(struct expect *x, int d, long rows) {
    if (!x->calls || d < x->min) x->min = d;
    if (!x->calls || d > x->max) x->max = d;
    x->calls++, x->sum += d, x->rows += rows;
}

static void check(const struct model_moe_steps *got, const struct expect *want) {
    assert_int_equal(got->calls, want->calls);
    assert_int_equal(got->sum, want->sum);
    assert_int_equal(got->rows, want->rows);
    if (want->calls) {
        assert_int_equal(got->min, want->min);
        assert_int_equal(got->max, want->max);
    }
}

static void run(const char *arch, int uniform, size_t want_expert, size_t want_shared) {
    const char *fx = getenv("KILN_FIXTURES");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/oracle/tiny-models/%s", fx ? fx : "tests/fixtures", arch);
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 1};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    static struct backend_ops ops;
    real_ops = be.ops;
    ops = *be.ops;
    ops.moe_route = wrap_route;
    struct backend wrapped = {&ops, be.ctx};
    struct model_options mo = {.max_batch_tokens = 256, .max_seqs = N_SEQS, .max_context = MAX_CTX,
                               .moe_count = 1, .dummy_routing = uniform ? MODEL_ROUTING_UNIFORM : MODEL_ROUTING_MODEL};
    struct model *m;
    if (model_load(&m, dir, &wrapped, &mo, &err)) fail_msg("%s", err.msg);
    const struct model_config *c = model_config(m);
    int n_moe = model_moe_layers(m), V = c->vocab_size;
    assert_true(n_moe > 0 && c->n_layers <= MAX_LAYERS);
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = N_SEQS * MAX_CTX};
    struct runner *r;
    if (runner_create(&r, m, &ro, &err)) fail_msg("%s", err.msg);
    struct kv_pool *kv = runner_kv(r);
    int32_t pages[N_SEQS][MAX_CTX / PAGE], ids[N_SEQS][64];
    struct sb_seq seqs[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        for (int k = 0; k < 64; k++) ids[s][k] = (int32_t)((s * 131 + k * 17 + 5) % V);
        seqs[s] = (struct sb_seq){0, 0, pages[s], ids[s]};
    }
    float *logits = xmalloc((size_t)N_SEQS * V * 4);
    struct step_batch sb;
    sb_init(&sb, PAGE, 256, N_SEQS, N_SEQS * MAX_CTX / PAGE);
    struct expect want[MAX_LAYERS][2];
    memset(want, 0, sizeof want);
    memset(&seen, 0, sizeof seen);
    seen.batch = &sb;
    assert_int_equal(model_moe_count_set(m, 1, 1), 0);
    /* prefill (other), 4 decode steps, a mixed step (other), then a decode
     * step with counting off */
    static const int tokens[7][N_SEQS] = {{9, 17, 30}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1},
                                          {1, 1, 1},   {1, 5, 1}, {1, 1, 1}};
    for (int step = 0; step < 7; step++) {
        if (step == 6) assert_int_equal(model_moe_count_set(m, 0, 0), 0);
        sb_begin(&sb);
        for (int s = 0; s < N_SEQS; s++) sb_add(&sb, kv, &seqs[s], tokens[step][s]);
        struct batch b = sb_batch(&sb);
        int before[MAX_LAYERS];
        memcpy(before, seen.calls, sizeof before);
        if (runner_forward(r, &b, logits, &err)) fail_msg("%s", err.msg);
        int kind = sb.nt == sb.ns ? 0 : 1;
        for (int l = 0; l < c->n_layers; l++) {
            if (seen.calls[l] == before[l]) continue;
            assert_int_equal(seen.calls[l], before[l] + 1);
            if (step < 6) add(&want[l][kind], seen.distinct[l], sb.nt);
        }
    }
    struct model_moe_layer got[MAX_LAYERS];
    assert_int_equal(model_moe_counts(m, got, MAX_LAYERS), n_moe);
    for (int i = 0; i < n_moe; i++) {
        int l = got[i].layer;
        printf("  %s%s layer %d: decode %lld over %ld steps, other %lld over %ld\n", arch, uniform ? " uniform" : "",
               l, got[i].decode.sum, got[i].decode.calls, got[i].other.sum, got[i].other.calls);
        assert_int_equal(got[i].decode.calls, 4);
        assert_int_equal(got[i].other.calls, 2);
        check(&got[i].decode, &want[l][0]);
        check(&got[i].other, &want[l][1]);
        assert_int_equal(got[i].expert_bytes, want_expert);
        assert_int_equal(got[i].shared_bytes, want_shared);
        assert_int_equal(got[i].top_k, c->n_experts_per_tok);
        assert_int_equal(got[i].n_experts, c->n_experts);
    }
    assert_int_equal(seen.count_calls, 7 * n_moe); /* the record goes along, on or off */
    /* uniform: every routed row drew at random; model: none did */
    assert_int_equal(seen.uniform_rows, uniform ? n_moe * (9 + 17 + 30 + 4 * 3 + 7 + 3) : 0);
    for (int s = 0; s < N_SEQS; s++) kv_pool_release(kv, seqs[s].pages, seqs[s].n_pages);
    sb_free(&sb);
    free(logits);
    runner_free(r);
    model_free(m);
    backend_destroy(&be);
}

/* bf16 experts of hidden 64 and moe_intermediate_size 32: gate, up, down */
enum { EXPERT = 3 * 64 * 32 * 2 };

static void test_qwen3_moe(void **state) {
    (void)state;
    run("qwen3_moe", 0, EXPERT, 0);
    run("qwen3_moe", 1, EXPERT, 0);
}

/* one shared expert of intermediate 64 behind a [1][64] gate */
static void test_qwen2_moe(void **state) {
    (void)state;
    run("qwen2_moe", 0, EXPERT, 3 * 64 * 64 * 2 + 64 * 2);
}

/* two shared experts: one MLP of 2 x 32 */
static void test_deepseek_v2(void **state) {
    (void)state;
    run("deepseek_v2", 0, EXPERT, 2 * EXPERT);
    run("deepseek_v2", 1, EXPERT, 2 * EXPERT);
}

/* one shared expert, fused into the routed list (never counted as routed) */
static void test_deepseek_v3(void **state) {
    (void)state;
    run("deepseek_v3", 0, EXPERT, EXPERT);
    run("deepseek_v3", 1, EXPERT, EXPERT);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_qwen2_moe),
                                       cmocka_unit_test(test_deepseek_v2), cmocka_unit_test(test_deepseek_v3)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
