/* test_runner_lockstep.c — the lockstep of a job's runners: the messages
 * (runner/ctrl_msg.h) round-trip and are refused when a size or index is
 * out of range; ranks as threads on 127.0.0.1 build the same runner from
 * rank 0's LOAD and replay its steps (runner_follow) until STOP, then END;
 * rank 0's logits are those of a runner alone, bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/buf.h"
#include "base/knob.h"
#include "base/mem.h"
#include "dist_world.h"
#include "runner/ctrl_msg.h"
#include "runner/runner.h"

static const struct ctrl_limits lim = {.max_tokens = 16, .max_seqs = 4, .max_pages = 32, .vocab = 100,
                                       .max_context = 64, .page_size = 2, .pool_pages = 20};

/* seq 0: 3 prompt tokens on pages 4, 7; seq 1: a decode row at position 2
 * on pages 1, 2 */
static int32_t ids[] = {5, 6, 7, 8}, pos[] = {0, 1, 2, 2}, slot[] = {8, 9, 14, 4}, qs[] = {0, 3, 4},
               kvl[] = {3, 3}, pst[] = {0, 2, 4}, pages[] = {4, 7, 1, 2}, rows[] = {2, 3};
static struct batch sample_batch(void) {
    return (struct batch){.mode = BATCH_MODE_EXTEND, .n_tokens = 4, .input_ids = ids, .positions = pos,
                          .out_slot = slot, .n_seqs = 2, .q_start = qs, .kv_len = kvl, .kv_page_start = pst,
                          .kv_pages = pages, .page_size = 2, .n_logit_rows = 2, .logit_rows = rows};
}

static void test_msg_round_trip(void **state) {
    (void)state;
    struct buf b = {0};
    struct ctrl_msg m = {0};
    struct kiln_error err;
    struct ctrl_load l = {.max_batch_tokens = 16, .max_seqs = 4, .max_context = 64, .seed = 99, .moe_count = 1,
                          .skip_warmup = 1, .dummy_routing = 1, .page_size = 2, .kv_tokens = 40,
                          .mem_fraction_static = 0.5, .max_running_requests = 4, .chunked_prefill_size = 12};
    strcpy(l.load_format, "dummy");
    ctrl_msg_load(&b, 0, &l);
    assert_true(b.len <= CTRL_MSG_FRAME);
    assert_int_equal(ctrl_msg_parse((const uint8_t *)b.data, b.len, NULL, &m, &err), 0);
    assert_int_equal(m.type, CTRL_MSG_LOAD);
    assert_memory_equal(&m.load, &l, sizeof l);

    struct batch sb = sample_batch();
    unsigned char want[2] = {1, 0};
    buf_clear(&b);
    ctrl_msg_step(&b, 7, CTRL_STEP_SAMPLE | CTRL_STEP_WANT, 19, &sb, want);
    assert_true(b.len <= ctrl_msg_step_max(&lim));
    assert_int_equal(ctrl_msg_parse((const uint8_t *)b.data, b.len, &lim, &m, &err), 0);
    assert_int_equal(m.type, CTRL_MSG_STEP);
    assert_int_equal(m.seq, 7);
    assert_int_equal(m.scratch_page, 19);
    assert_int_equal(m.b.n_tokens, 4);
    assert_memory_equal(m.b.out_slot, slot, sizeof slot);
    assert_memory_equal(m.b.kv_pages, pages, sizeof pages);
    assert_memory_equal(m.want_logits, want, 2);
    struct buf again = {0};
    ctrl_msg_step(&again, m.seq, m.flags, m.scratch_page, &m.b, m.want_logits);
    assert_int_equal(again.len, b.len);
    assert_memory_equal(again.data, b.data, b.len);
    /* want_logits over zero logit rows: an empty list, still flagged */
    struct batch none = sb;
    none.n_logit_rows = 0;
    buf_clear(&again);
    ctrl_msg_step(&again, 9, CTRL_STEP_SAMPLE | CTRL_STEP_WANT, -1, &none, want);
    struct ctrl_msg m0 = {0};
    assert_int_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &lim, &m0, &err), 0);
    assert_int_equal(m0.b.n_logit_rows, 0);
    assert_true(m0.want_logits != NULL);
    struct buf back = {0};
    ctrl_msg_step(&back, m0.seq, m0.flags, m0.scratch_page, &m0.b, m0.want_logits);
    assert_int_equal(back.len, again.len);
    assert_memory_equal(back.data, again.data, again.len);
    buf_free(&back);
    /* a hybrid pool's sliding slots and pages travel with the batch, and
     * only to a runner with one */
    static const int32_t swa_slot[] = {9, 10, 11, 6}, swa_pages[] = {4, 5, 3, 0};
    struct batch hb = sb;
    hb.swa_out_slot = swa_slot;
    hb.swa_kv_pages = swa_pages;
    struct ctrl_limits hlim = lim;
    hlim.swa_pages = 6;
    buf_clear(&again);
    ctrl_msg_step(&again, 10, 0, -1, &hb, NULL);
    assert_true(again.len <= ctrl_msg_step_max(&hlim));
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &lim, &m0, &err), 0);
    assert_int_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &hlim, &m0, &err), 0);
    assert_memory_equal(m0.b.swa_out_slot, swa_slot, sizeof swa_slot);
    assert_memory_equal(m0.b.swa_kv_pages, swa_pages, sizeof swa_pages);
    assert_memory_equal(m0.b.kv_pages, pages, sizeof pages);
    struct buf hback = {0};
    ctrl_msg_step(&hback, m0.seq, m0.flags, m0.scratch_page, &m0.b, m0.want_logits);
    assert_int_equal(hback.len, again.len);
    assert_memory_equal(hback.data, again.data, again.len);
    buf_free(&hback);
    buf_clear(&again);
    ctrl_msg_step(&again, 11, 0, -1, &sb, NULL); /* without them, to a hybrid runner */
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &hlim, &m0, &err), 0);
    static const int32_t far_slot[] = {9, 10, 24, 6}, far_page[] = {4, 6, 3, 0};
    hb.swa_out_slot = far_slot; /* slot 24: beyond 6 pages of 2 */
    buf_clear(&again);
    ctrl_msg_step(&again, 12, 0, -1, &hb, NULL);
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &hlim, &m0, &err), 0);
    hb.swa_out_slot = swa_slot;
    hb.swa_kv_pages = far_page;
    buf_clear(&again);
    ctrl_msg_step(&again, 13, 0, -1, &hb, NULL);
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)again.data, again.len, &hlim, &m0, &err), 0);
    ctrl_msg_free(&m0);
    buf_free(&again);
    /* without a runner, a STEP is refused */
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)b.data, b.len, NULL, &m, &err), 0);

    buf_clear(&b);
    ctrl_msg_stop(&b, 8);
    assert_int_equal(ctrl_msg_parse((const uint8_t *)b.data, b.len, &lim, &m, &err), 0);
    assert_int_equal(m.type, CTRL_MSG_STOP);
    buf_clear(&b);
    ctrl_msg_end(&b, 0);
    assert_int_equal(ctrl_msg_parse((const uint8_t *)b.data, b.len, &lim, &m, &err), 0);
    assert_int_equal(m.type, CTRL_MSG_END);
    buf_free(&b);
    ctrl_msg_free(&m);
}

/* A STEP encoded from b must be refused. */
static void expect_refused(const struct batch *b, int flags, const unsigned char *want, const char *why) {
    struct buf m = {0};
    struct ctrl_msg out = {0};
    struct kiln_error err;
    ctrl_msg_step(&m, 1, flags, -1, b, want);
    int rc = ctrl_msg_parse((const uint8_t *)m.data, m.len, &lim, &out, &err);
    if (rc == 0) fail_msg("accepted: %s", why);
    buf_free(&m);
    ctrl_msg_free(&out);
}

static void test_msg_refusals(void **state) {
    (void)state;
    struct batch b;
    int32_t bad[8];
#define MUTATE(field, n, i, v, why)                                                                             \
    do {                                                                                                         \
        b = sample_batch();                                                                                      \
        memcpy(bad, b.field, (n) * sizeof *bad);                                                                 \
        bad[i] = (v);                                                                                            \
        b.field = bad;                                                                                           \
        expect_refused(&b, 0, NULL, why);                                                                        \
    } while (0)
    MUTATE(input_ids, 4, 1, 100, "an id outside the vocabulary");
    MUTATE(input_ids, 4, 0, -1, "a negative id");
    MUTATE(out_slot, 4, 2, 40, "a slot outside the pool");
    MUTATE(positions, 4, 1, 3, "a position at the KV length");
    MUTATE(kv_len, 2, 0, 5, "a KV length beyond the sequence's pages");
    MUTATE(kv_len, 2, 1, 0, "a KV length below the new tokens");
    MUTATE(kv_pages, 4, 3, 20, "a page outside the pool");
    MUTATE(q_start, 3, 1, 5, "q_start beyond the tokens");
    MUTATE(kv_page_start, 3, 1, 5, "kv_page_start decreasing");
    MUTATE(logit_rows, 2, 1, 4, "a logit row past the tokens");
    b = sample_batch();
    b.page_size = 4;
    expect_refused(&b, 0, NULL, "another page size");
    b = sample_batch();
    b.mode = BATCH_MODE_DECODE;
    expect_refused(&b, 0, NULL, "a DECODE sequence of 3 tokens");
    b = sample_batch();
    expect_refused(&b, CTRL_STEP_MASKED, NULL, "masks without sampling");
#undef MUTATE
    struct buf m = {0};
    struct ctrl_msg out = {0};
    struct kiln_error err;
    /* a want_logits byte other than 0 and 1 (the encoder writes only those) */
    unsigned char want[2] = {0, 1};
    ctrl_msg_step(&m, 1, CTRL_STEP_SAMPLE | CTRL_STEP_WANT, -1, &b, want);
    assert_int_equal(ctrl_msg_parse((const uint8_t *)m.data, m.len, &lim, &out, &err), 0);
    m.data[m.len - 1] = 2;
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)m.data, m.len, &lim, &out, &err), 0);
    buf_clear(&m);
    /* truncated, lengthened, a bad magic */
    b = sample_batch();
    ctrl_msg_step(&m, 1, 0, -1, &b, NULL);
    for (size_t n = 0; n < m.len; n++)
        assert_int_not_equal(ctrl_msg_parse((const uint8_t *)m.data, n, &lim, &out, &err), 0);
    buf_push(&m, 0);
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)m.data, m.len, &lim, &out, &err), 0);
    m.data[0] ^= 1;
    assert_int_not_equal(ctrl_msg_parse((const uint8_t *)m.data, m.len - 1, &lim, &out, &err), 0);
    buf_free(&m);
    ctrl_msg_free(&out);
}

/* ---- ranks as threads -------------------------------------------------- */

enum { PROMPT = 9, DECODE = 4, PS = 2 };
static char model_dir[4096];

/* Rank 0 (or a runner alone, ctrl NULL): a prompt, then decode steps;
 * every step's logits of the last row, concatenated into *out. */
static int lead(struct dist_comm *ctrl, float **out, int *vocab, struct kiln_error *err) {
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1};
    struct runner *r = NULL;
    int rc = -1;
    float *lg = NULL;
    if (backend_create(&be, "cpu", &bo, err)) return -1;
    struct model_options mo = {.max_batch_tokens = PROMPT, .max_seqs = 2, .max_context = 64};
    struct runner_options ro = {.page_size = PS, .kv_tokens = 64, .skip_warmup = 1, .ctrl = ctrl};
    if (runner_load(&r, &be, model_dir, &mo, &ro, err)) goto out;
    int V = model_config(runner_model(r))->vocab_size, n_pages = (PROMPT + DECODE + PS - 1) / PS;
    *vocab = V;
    lg = xcalloc((size_t)(1 + DECODE) * (size_t)V, sizeof *lg);
    int32_t pg[16], tok[PROMPT + DECODE], p[PROMPT], s[PROMPT];
    if (kv_pool_alloc(runner_kv(r), n_pages, pg)) goto out;
    for (int i = 0; i < PROMPT + DECODE; i++) tok[i] = (i * 37 + 11) % V;
    int done = 0;
    for (int step = 0; step <= DECODE; step++) {
        int len = PROMPT + step, n = len - done;
        for (int i = 0; i < n; i++) p[i] = done + i, s[i] = pg[(done + i) / PS] * PS + (done + i) % PS;
        int32_t q[2] = {0, n}, kl = len, pst2[2] = {0, n_pages}, row = n - 1;
        struct batch b = {.mode = step ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = n,
                          .input_ids = tok + done, .positions = p, .out_slot = s, .n_seqs = 1, .q_start = q,
                          .kv_len = &kl, .kv_page_start = pst2, .kv_pages = pg, .page_size = PS,
                          .n_logit_rows = 1, .logit_rows = &row};
        if (runner_forward(r, &b, lg + (size_t)step * V, err)) goto out;
        done = len;
    }
    *out = lg;
    lg = NULL;
    rc = 0;
out:
    free(lg);
    runner_free(r); /* rank 0: STOP */
    backend_destroy(&be);
    if (rc == 0 && ctrl) rc = runner_job_end(ctrl, err);
    return rc;
}

static void follower(struct rank *k) {
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1};
    struct runner *r = NULL;
    if (backend_create(&be, "cpu", &bo, &k->err)) {
        rank_fail(k, "backend: %s", k->err.msg);
        return;
    }
    struct model_options mo = {0};
    struct runner_options ro = {.ctrl = &k->c};
    int loads = 0;
    for (;;) {
        int rc = runner_follow_load(&r, &be, model_dir, &mo, &ro, &k->err);
        if (rc == 1) break;
        if (rc < 0) {
            rank_fail(k, "follow_load: %s", k->err.msg);
            break;
        }
        loads++;
        if (runner_follow(r, &k->err)) rank_fail(k, "follow: %s", k->err.msg);
        runner_free(r);
    }
    if (loads != 1) rank_fail(k, "%d runners followed, 1 expected", loads);
    backend_destroy(&be);
}

static float *alone;
static int alone_vocab;

static void body(struct rank *k) {
    if (k->r > 0) {
        follower(k);
        return;
    }
    float *lg = NULL;
    int V = 0;
    if (lead(&k->c, &lg, &V, &k->err)) {
        rank_fail(k, "rank 0: %s", k->err.msg);
        return;
    }
    if (V != alone_vocab || memcmp(lg, alone, (size_t)(1 + DECODE) * (size_t)V * sizeof *lg))
        rank_fail(k, "rank 0's logits differ from a runner alone's");
    free(lg);
}

static void test_lockstep(void **state) {
    (void)state;
    snprintf(model_dir, sizeof model_dir, "%s/stories260K", knob_str(KNOB_MODELS));
    struct kiln_error err;
    if (lead(NULL, &alone, &alone_vocab, &err)) fail_msg("alone: %s", err.msg);
    for (int size = 2; size <= 3; size++) {
        struct world w = {0};
        const char *first;
        int bad = world_run(&w, size, body, &first);
        if (bad) fail_msg("%d ranks: %d failed: %s", size, bad, first);
    }
    free(alone);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_round_trip),
        cmocka_unit_test(test_msg_refusals),
        cmocka_unit_test(test_lockstep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
