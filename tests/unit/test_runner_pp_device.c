/* test_runner_pp_device.c — pipeline parallel through a backend's own
 * communicator, on the CPU. CUDA's runs PP over NCCL communicators that
 * runner_load creates with backend_ops.comm_id and comm_init (the job's for
 * the sends between the stages, each stage's for its collectives); here
 * the CPU backend gets the same two operations, which build TCP
 * communicators over the ranks they are asked for, so the runner's code of
 * that path (the groups, their ids from each group's first rank, which
 * communicator the model gets for what, the micro-batches' transfers) runs
 * on ranks as threads. Rank 0's logits (two sequences: a prefill cut into
 * micro-batches, then decode steps) must be those of the same layout over
 * the job's own TCP communicators, bit for bit, and every rank must have
 * joined the groups of its stage and of the job, as their rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/knob.h"
#include "base/mem.h"
#include "dist_world.h"
#include "runner/runner.h"
#include "tensor/backend.h"

enum { PROMPT = 7, DECODE = 3, PS = 2, SEQS = 2 };
static char model_dir[4096];
static int g_tp, g_pp, g_device; /* the layout; 1: through comm_id / comm_init */

/* ---- the backend's own communicator, over TCP -------------------------- */

static _Thread_local struct rank *me;
static int joined[8][2]; /* per rank: groups joined, of them the job's */

static int test_comm_id(void *ctx, void *blob, size_t *len, struct kiln_error *err) {
    (void)ctx;
    int n = snprintf(blob, *len, "test-comm:%d", me->r);
    if (n < 0 || (size_t)n >= *len) return kiln_errorf(err, "test id: no room");
    *len = (size_t)n + 1;
    return 0;
}

static int test_comm_init(void *ctx, struct dist_comm *out, int rank, int size, const void *id, size_t len,
                          struct kiln_error *err) {
    (void)ctx;
    int first = -1;
    if (len < 2 || ((const char *)id)[len - 1] || sscanf(id, "test-comm:%d", &first) != 1)
        return kiln_errorf(err, "rank %d: not a test id", me->r);
    if (first + rank != me->r || first % size || first + size > me->g.size)
        return kiln_errorf(err, "rank %d joined the group of %d ranks from %d as its rank %d", me->r, size, first,
                           rank);
    joined[me->r][0]++;
    if (size == me->g.size) {
        joined[me->r][1]++;
        return dist_comm_tcp_init(out, &me->g, 30, err);
    }
    int ranks[8];
    for (int i = 0; i < size; i++) ranks[i] = first + i;
    return dist_comm_tcp_init_sub(out, &me->g, ranks, size, 30, err);
}

/* ---- a rank ----------------------------------------------------------------- */

/* The rank's model_parallel as cli_job makes it; *sub is the stage's TCP
 * communicator (with tp > 1), for the plain CPU path. */
static struct model_parallel layout(struct rank *k, struct dist_comm *sub) {
    int stage = k->r / g_tp;
    struct model_parallel par = {.tp_size = g_tp, .tp_rank = k->r % g_tp, .pp_size = g_pp,
                                 .pp_rank = stage, .pp_comm = &k->c};
    if (g_tp > 1) {
        int ranks[8];
        for (int i = 0; i < g_tp; i++) ranks[i] = stage * g_tp + i;
        if (dist_comm_tcp_init_sub(sub, &k->g, ranks, g_tp, 30, &k->err))
            rank_fail(k, "stage communicator: %s", k->err.msg);
        par.comm = sub;
    }
    return par;
}

/* Rank 0: two sequences' prompts in one step, then decode steps; the
 * logits of every step's rows, concatenated into *out. */
static int lead(struct rank *k, struct backend *be, const struct model_parallel *par, float **out,
                struct kiln_error *err) {
    struct runner *r = NULL;
    int rc = -1;
    float *lg = NULL;
    struct model_options mo = {.max_batch_tokens = SEQS * PROMPT, .max_seqs = SEQS, .max_context = 64,
                               .par = *par};
    struct runner_options ro = {.page_size = PS, .kv_tokens = 64, .skip_warmup = 1, .ctrl = &k->c};
    if (runner_load(&r, be, model_dir, &mo, &ro, err)) goto out;
    int V = model_config(runner_model(r))->vocab_size, per = (PROMPT + DECODE + PS - 1) / PS;
    lg = xcalloc((size_t)(1 + DECODE) * SEQS * (size_t)V, sizeof *lg);
    int32_t pg[SEQS * 8], tok[SEQS][PROMPT + DECODE];
    if (kv_pool_alloc(runner_kv(r), SEQS * per, pg)) goto out;
    for (int s = 0; s < SEQS; s++)
        for (int i = 0; i < PROMPT + DECODE; i++) tok[s][i] = (i * 37 + 11 + 5 * s) % V;
    for (int step = 0, done = 0; step <= DECODE; step++) {
        int len = PROMPT + step, n = len - done;
        int32_t ids[SEQS * PROMPT], p[SEQS * PROMPT], sl[SEQS * PROMPT], q[SEQS + 1], kl[SEQS], pst[SEQS + 1],
            rows[SEQS];
        for (int s = 0; s < SEQS; s++) {
            q[s] = s * n, kl[s] = len, pst[s] = s * per, rows[s] = s * n + n - 1;
            for (int i = 0; i < n; i++) {
                int t = s * n + i, pos = done + i;
                ids[t] = tok[s][pos], p[t] = pos, sl[t] = pg[s * per + pos / PS] * PS + pos % PS;
            }
        }
        q[SEQS] = SEQS * n, pst[SEQS] = SEQS * per;
        struct batch b = {.mode = step ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = SEQS * n,
                          .input_ids = ids, .positions = p, .out_slot = sl, .n_seqs = SEQS, .q_start = q,
                          .kv_len = kl, .kv_page_start = pst, .kv_pages = pg, .page_size = PS,
                          .n_logit_rows = SEQS, .logit_rows = rows};
        if (runner_forward(r, &b, lg + (size_t)step * SEQS * V, err)) goto out;
        done = len;
    }
    *out = lg;
    lg = NULL;
    rc = 0;
out:
    free(lg);
    runner_free(r);
    if (rc == 0) rc = runner_job_end(&k->c, err);
    return rc;
}

static float *logits[2]; /* rank 0's: [0] plain TCP path, [1] through comm_id / comm_init */
static size_t n_logits;

static void body(struct rank *k) {
    me = k;
    struct backend be = {0};
    struct backend_options bo = {.n_threads = 1};
    if (backend_create(&be, "cpu", &bo, &k->err)) {
        rank_fail(k, "backend: %s", k->err.msg);
        return;
    }
    const struct backend_ops *cpu = be.ops;
    struct backend_ops ops = *cpu;
    if (g_device) {
        ops.comm_id = test_comm_id;
        ops.comm_init = test_comm_init;
        be.ops = &ops;
    }
    struct dist_comm sub = {0};
    struct model_parallel par = layout(k, &sub);
    if (k->failed) goto out;
    if (k->r == 0) {
        float *lg = NULL;
        if (lead(k, &be, &par, &lg, &k->err)) rank_fail(k, "rank 0: %s", k->err.msg);
        logits[g_device] = lg;
    } else {
        struct model_options mo = {.par = par};
        struct runner_options ro = {.ctrl = &k->c};
        struct runner *r = NULL;
        int rc;
        while ((rc = runner_follow_load(&r, &be, model_dir, &mo, &ro, &k->err)) == 0) {
            if (runner_follow(r, &k->err)) rank_fail(k, "follow: %s", k->err.msg);
            runner_free(r);
        }
        if (rc < 0) rank_fail(k, "follow_load: %s", k->err.msg);
    }
out:
    if (sub.ops) dist_comm_free(&sub);
    be.ops = cpu;
    backend_destroy(&be);
}

static void run(int tp, int pp) {
    g_tp = tp, g_pp = pp;
    int size = tp * pp;
    for (g_device = 0; g_device < 2; g_device++) {
        memset(joined, 0, sizeof joined);
        struct world w = {0};
        const char *first;
        int bad = world_run(&w, size, body, &first);
        if (bad) fail_msg("--tp %d --pp %d%s: %d rank(s) failed: %s", tp, pp,
                          g_device ? " (the backend's communicator)" : "", bad, first);
        for (int r = 0; r < size && g_device; r++) {
            /* the job's, and with tp > 1 the stage's */
            if (joined[r][0] != 1 + (tp > 1) || joined[r][1] != 1)
                fail_msg("--tp %d --pp %d: rank %d joined %d groups (%d of the job), not %d (1)", tp, pp, r,
                         joined[r][0], joined[r][1], 1 + (tp > 1));
        }
    }
    /* the vocabulary from the model's config: both runs loaded it */
    assert_non_null(logits[0]);
    assert_non_null(logits[1]);
    if (memcmp(logits[0], logits[1], n_logits * sizeof(float)))
        fail_msg("--tp %d --pp %d: rank 0's logits through the backend's communicator differ from the TCP path's", tp,
                 pp);
    free(logits[0]), free(logits[1]);
    logits[0] = logits[1] = NULL;
}

static void test_pp_device_comm(void **state) {
    (void)state;
    snprintf(model_dir, sizeof model_dir, "%s/stories260K", knob_str(KNOB_MODELS));
    struct model_config cfg;
    char path[4200];
    struct kiln_error err;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (model_config_load(&cfg, path, &err)) fail_msg("%s", err.msg);
    n_logits = (size_t)(1 + DECODE) * SEQS * (size_t)cfg.vocab_size;
    run(1, 2);
    run(2, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp_device_comm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
