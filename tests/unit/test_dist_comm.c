/* test_dist_comm.c — the TCP communicator: every collective on 1..4 ranks
 * (threads on 127.0.0.1) against a direct computation, all-reduce bitwise
 * equal on every rank and summed in rank order, a 64 MB all-reduce, a
 * peer that dies, stalls or calls another collective, and the pipeline
 * layout: point-to-point sends between some ranks and subgroup
 * communicators sharing the sockets with the whole group's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/mem.h"
#include "dist_world.h"

/* A float of rank r at index i whose sums depend on the order of addition:
 * magnitudes spread over 2^-20 .. 2^20. */
static float val(int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    return (float)((int)(h % 2001) - 1000) * ldexpf(1.0f, (int)(h >> 20) % 41 - 20);
}

static void expect_sum(float *want, size_t n, int size, size_t base) {
    for (size_t i = 0; i < n; i++) {
        float s = val(0, base + i);
        for (int r = 1; r < size; r++) s = s + val(r, base + i);
        want[i] = s;
    }
}

#define CHECK(k, cond, ...)                                                                                 \
    do {                                                                                                     \
        if (!(cond)) rank_fail(k, __VA_ARGS__);                                                              \
    } while (0)

static void body_all(struct rank *k) {
    struct dist_comm *c = &k->c;
    int size = c->size, me = c->rank;
    struct kiln_error *e = &k->err;
    /* all_reduce sum over lengths that split unevenly, and 0 and 1 */
    size_t lens[] = {0, 1, 3, 1001};
    for (size_t li = 0; li < 4; li++) {
        size_t n = lens[li];
        float *b = xmalloc((n + 1) * sizeof *b), *want = xmalloc((n + 1) * sizeof *want);
        for (size_t i = 0; i < n; i++) b[i] = val(me, i);
        expect_sum(want, n, size, 0);
        CHECK(k, !dist_comm_all_reduce(c, b, n, DIST_SUM, e), "all_reduce %zu: %s", n, e->msg);
        CHECK(k, memcmp(b, want, n * sizeof *b) == 0, "all_reduce sum of %zu differs", n);
        if (n == 1001) k->out = b;
        else free(b);
        free(want);
    }
    /* rank order: ((1e8 + 1) - 1e8) + 1 = 1; any other order gives 0 or 2 */
    float ord[4] = {1e8f, 1.0f, -1e8f, 1.0f}, o = ord[me];
    CHECK(k, !dist_comm_all_reduce(c, &o, 1, DIST_SUM, e), "all_reduce order: %s", e->msg);
    float wo = ord[0];
    for (int r = 1; r < size; r++) wo = wo + ord[r];
    CHECK(k, memcmp(&o, &wo, sizeof o) == 0, "rank-order sum %g, want %g", o, wo);
    if (size == 4) CHECK(k, o == 1.0f, "4-rank order sum %g, want 1", o);
    /* max */
    float m[5];
    for (int i = 0; i < 5; i++) m[i] = val(me, (size_t)i);
    CHECK(k, !dist_comm_all_reduce(c, m, 5, DIST_MAX, e), "all_reduce max: %s", e->msg);
    for (int i = 0; i < 5; i++) {
        float w = val(0, (size_t)i);
        for (int r = 1; r < size; r++) w = val(r, (size_t)i) > w ? val(r, (size_t)i) : w;
        CHECK(k, m[i] == w, "max[%d] = %g, want %g", i, m[i], w);
    }
    /* all_gather of 13 bytes, then in place */
    uint8_t s13[13], g13[4 * 13];
    for (int i = 0; i < 13; i++) s13[i] = (uint8_t)(me * 31 + i);
    CHECK(k, !dist_comm_all_gather(c, s13, g13, 13, e), "all_gather: %s", e->msg);
    for (int r = 0; r < size; r++)
        for (int i = 0; i < 13; i++) CHECK(k, g13[r * 13 + i] == (uint8_t)(r * 31 + i), "all_gather block %d", r);
    memset(g13, 0, sizeof g13);
    memcpy(g13 + me * 13, s13, 13);
    CHECK(k, !dist_comm_all_gather(c, g13 + me * 13, g13, 13, e), "all_gather in place: %s", e->msg);
    for (int r = 0; r < size; r++) CHECK(k, g13[r * 13 + 5] == (uint8_t)(r * 31 + 5), "in-place block %d", r);
    /* reduce_scatter: send[p][n] with values val(me, p * n + i) */
    size_t n = 777;
    float *send = xmalloc((size_t)size * n * sizeof *send), *recv = xmalloc(n * sizeof *recv), *want = xmalloc(n * sizeof *want);
    for (size_t i = 0; i < (size_t)size * n; i++) send[i] = val(me, i);
    CHECK(k, !dist_comm_reduce_scatter(c, send, recv, n, DIST_SUM, e), "reduce_scatter: %s", e->msg);
    expect_sum(want, n, size, (size_t)me * n);
    CHECK(k, memcmp(recv, want, n * sizeof *recv) == 0, "reduce_scatter differs");
    free(send), free(recv), free(want);
    /* all_to_all: block p of rank r is 7 bytes of r * 16 + p */
    uint8_t a2s[4 * 7], a2r[4 * 7];
    for (int p = 0; p < size; p++) memset(a2s + p * 7, me * 16 + p, 7);
    CHECK(k, !dist_comm_all_to_all(c, a2s, a2r, 7, e), "all_to_all: %s", e->msg);
    for (int p = 0; p < size; p++) CHECK(k, a2r[p * 7 + 6] == p * 16 + me, "all_to_all from %d", p);
    /* all_to_allv: rank r sends r + p + 1 bytes to rank p (0 from rank 0 to 0... all non-zero) */
    size_t sb[4], so[4], rb[4], ro[4], st = 0, rt = 0;
    for (int p = 0; p < size; p++) {
        sb[p] = (size_t)(me * p), so[p] = st, st += sb[p]; /* rank 0 sends nothing: zero-sized parts */
        rb[p] = (size_t)(p * me), ro[p] = rt, rt += rb[p];
    }
    uint8_t *vs = xmalloc(st + 1), *vr = xmalloc(rt + 1);
    for (int p = 0; p < size; p++) memset(vs + so[p], 100 + me * 4 + p, sb[p]);
    CHECK(k, !dist_comm_all_to_allv(c, vs, sb, so, vr, rb, ro, e), "all_to_allv: %s", e->msg);
    for (int p = 0; p < size; p++)
        for (size_t i = 0; i < rb[p]; i++) CHECK(k, vr[ro[p] + i] == 100 + p * 4 + me, "all_to_allv from %d", p);
    free(vs), free(vr);
    /* broadcast 100003 bytes from the last rank */
    size_t bn = 100003;
    uint8_t *bb = xmalloc(bn);
    for (size_t i = 0; i < bn; i++) bb[i] = me == size - 1 ? (uint8_t)(i * 7) : 0;
    CHECK(k, !dist_comm_broadcast(c, bb, bn, size - 1, e), "broadcast: %s", e->msg);
    for (size_t i = 0; i < bn; i += 997) CHECK(k, bb[i] == (uint8_t)(i * 7), "broadcast byte %zu", i);
    free(bb);
    CHECK(k, !dist_comm_barrier(c, e), "barrier: %s", e->msg);
}

static void check_world(int size) {
    struct world w = {0};
    const char *first;
    int bad = world_run(&w, size, body_all, &first);
    if (bad) fail_msg("size %d: %d rank(s) failed: %s", size, bad, first);
    for (int r = 1; r < size; r++) assert_memory_equal(w.rk[0].out, w.rk[r].out, 1001 * sizeof(float));
    for (int r = 0; r < size; r++) free(w.rk[r].out);
}
static void test_size1(void **s) { (void)s; check_world(1); }
static void test_size2(void **s) { (void)s; check_world(2); }
static void test_size3(void **s) { (void)s; check_world(3); }
static void test_size4(void **s) { (void)s; check_world(4); }

/* 64 MB: segments of the reduction, partial writes everywhere */
#define BIG ((size_t)16 << 20)
static void body_big(struct rank *k) {
    float *b = xmalloc(BIG * sizeof *b);
    for (size_t i = 0; i < BIG; i++) b[i] = (float)((i + (size_t)k->r * 3) % 1024) * 0.25f;
    double t0 = time_now();
    CHECK(k, !dist_comm_all_reduce(&k->c, b, BIG, DIST_SUM, &k->err), "big all_reduce: %s", k->err.msg);
    k->t = time_now() - t0;
    for (size_t i = 0; i < BIG; i += 4099) {
        float w = 0;
        for (int r = 0; r < k->c.size; r++) w += (float)((i + (size_t)r * 3) % 1024) * 0.25f;
        CHECK(k, b[i] == w, "big[%zu] = %g, want %g", i, b[i], w);
    }
    free(b);
}
static void test_big(void **s) {
    (void)s;
    struct world w = {0};
    const char *first;
    if (world_run(&w, 2, body_big, &first)) fail_msg("%s", first);
    print_message("64 MB all_reduce over 2 ranks: %.3f s\n", w.rk[0].t);
}

/* Rank 2 starts an all_reduce (a header and a few bytes) and dies. A
 * survivor reports the first broken link it meets: rank 2's, or the other
 * survivor's once that one has failed and gone; at least one names rank 2. */
static int named_dead[2];
static void body_dies(struct rank *k) {
    if (k->r == 2) {
        uint8_t h[24] = {1, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3};
        for (int p = 0; p < 2; p++) (void)!send(k->g.fd[p], h, sizeof h, MSG_NOSIGNAL);
        return; /* the world closes its sockets */
    }
    float b[12] = {0};
    double t0 = time_now();
    int rc = dist_comm_all_reduce(&k->c, b, 12, DIST_SUM, &k->err);
    k->t = time_now() - t0;
    CHECK(k, rc == -1 && k->err.code == KILN_ERR_IO && strstr(k->err.msg, " the connection"),
          "rank died: rc %d, '%s'", rc, k->err.msg);
    named_dead[k->r] = strstr(k->err.msg, "rank 2 (") != NULL;
    rc = dist_comm_barrier(&k->c, &k->err);
    CHECK(k, rc == -1 && strstr(k->err.msg, "broken"), "after a failure: rc %d, '%s'", rc, k->err.msg);
}
static void test_rank_dies(void **s) {
    (void)s;
    struct world w = {.timeout_s = 5};
    const char *first;
    if (world_run(&w, 3, body_dies, &first)) fail_msg("%s", first);
    assert_true(w.rk[0].t < 2 && w.rk[1].t < 2);
    assert_true(named_dead[0] || named_dead[1]);
}

/* Rank 2 never comes: the others give up after the timeout, naming it. */
static void body_stalls(struct rank *k) {
    if (k->r == 2) {
        usleep(800 * 1000);
        return;
    }
    float b[12] = {0};
    double t0 = time_now();
    int rc = dist_comm_all_reduce(&k->c, b, 12, DIST_SUM, &k->err);
    k->t = time_now() - t0;
    CHECK(k, rc == -1 && strstr(k->err.msg, "rank 2 (") && strstr(k->err.msg, "moved no byte"), "stall: rc %d, '%s'",
          rc, k->err.msg);
}
static void test_rank_stalls(void **s) {
    (void)s;
    struct world w = {.timeout_s = 0.3};
    const char *first;
    if (world_run(&w, 3, body_stalls, &first)) fail_msg("%s", first);
    assert_true(w.rk[0].t >= 0.25 && w.rk[0].t < 0.75);
}

/* Rank 1 broadcasts while rank 0 all-reduces: both hear which. */
static void body_mismatch(struct rank *k) {
    float b[4] = {0};
    int rc = k->r == 0 ? dist_comm_all_reduce(&k->c, b, 4, DIST_SUM, &k->err)
                       : dist_comm_broadcast(&k->c, b, sizeof b, 1, &k->err);
    CHECK(k, rc == -1 && strstr(k->err.msg, k->r == 0 ? "is in broadcast" : "is in all_reduce"), "mismatch: '%s'",
          k->err.msg);
}
static void test_mismatch(void **s) {
    (void)s;
    struct world w = {.timeout_s = 5};
    const char *first;
    if (world_run(&w, 2, body_mismatch, &first)) fail_msg("%s", first);
}

/* Four ranks as two stages of two: each stage a subgroup communicator;
 * sends from stage 0 to stage 1 rank by rank (one of 8 MB), one back to
 * rank 0 alone, the whole group's collectives in between: sequence
 * numbers per pair keep every stream in step. */
#define P2P_BIG ((size_t)2 << 20)
static void body_p2p(struct rank *k) {
    struct dist_comm *c = &k->c, sub;
    struct kiln_error *e = &k->err;
    int me = c->rank, stage = me / 2, ranks[2] = {stage * 2, stage * 2 + 1};
    if (dist_comm_tcp_init_sub(&sub, &k->g, ranks, 2, 10, e)) {
        rank_fail(k, "sub init: %s", e->msg);
        return;
    }
    CHECK(k, sub.rank == me % 2 && sub.size == 2, "sub rank %d size %d", sub.rank, sub.size);
    float b[3], want[3];
    for (int i = 0; i < 3; i++) b[i] = val(me, (size_t)i), want[i] = val(ranks[0], (size_t)i) + val(ranks[1], (size_t)i);
    CHECK(k, !dist_comm_all_reduce(&sub, b, 3, DIST_SUM, e), "sub all_reduce: %s", e->msg);
    CHECK(k, memcmp(b, want, sizeof b) == 0, "sub all_reduce differs");
    uint32_t step = me == 0 ? 7 : 0;
    CHECK(k, !dist_comm_broadcast(c, &step, sizeof step, 0, e), "broadcast: %s", e->msg);
    CHECK(k, step == 7, "broadcast gave %u", step);
    float *big = xmalloc(P2P_BIG * sizeof *big);
    if (stage == 0) {
        for (size_t i = 0; i < P2P_BIG; i++) big[i] = val(me, i);
        CHECK(k, !dist_comm_send(c, big, 5 * sizeof *big, me + 2, e), "send: %s", e->msg);
        CHECK(k, !dist_comm_send(c, big, P2P_BIG * sizeof *big, me + 2, e), "send big: %s", e->msg);
    } else {
        CHECK(k, !dist_comm_recv(c, big, 5 * sizeof *big, me - 2, e), "recv: %s", e->msg);
        CHECK(k, !dist_comm_recv(c, big, P2P_BIG * sizeof *big, me - 2, e), "recv big: %s", e->msg);
        for (size_t i = 0; i < P2P_BIG && !k->failed; i++) CHECK(k, big[i] == val(me - 2, i), "recv: element %zu", i);
    }
    float back = 0;
    if (me == 2) CHECK(k, !dist_comm_send(c, big, sizeof *big, 0, e), "send back: %s", e->msg);
    if (me == 0) CHECK(k, !dist_comm_recv(c, &back, sizeof back, 2, e), "recv back: %s", e->msg);
    CHECK(k, me != 0 || back == val(0, 0), "rank 0 got %g back", back);
    CHECK(k, !dist_comm_all_reduce(&sub, b, 3, DIST_SUM, e), "sub all_reduce 2: %s", e->msg);
    float one = 1;
    CHECK(k, !dist_comm_all_reduce(c, &one, 1, DIST_SUM, e), "all_reduce: %s", e->msg);
    CHECK(k, one == 4, "all_reduce gave %g", one);
    /* both ends sending: each hears it */
    if (me < 2) {
        int rc = dist_comm_send(&sub, b, sizeof b, 1 - sub.rank, e);
        CHECK(k, rc == -1 && strstr(e->msg, "this rank expects 0"), "send against send: '%s'", e->msg);
    }
    free(big);
    dist_comm_free(&sub);
}
static void test_p2p_subgroups(void **s) {
    (void)s;
    struct world w = {0};
    const char *first;
    if (world_run(&w, 4, body_p2p, &first)) fail_msg("%s", first);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size1),     cmocka_unit_test(test_size2),       cmocka_unit_test(test_size3),
        cmocka_unit_test(test_size4),     cmocka_unit_test(test_big),         cmocka_unit_test(test_rank_dies),
        cmocka_unit_test(test_rank_stalls), cmocka_unit_test(test_mismatch), cmocka_unit_test(test_p2p_subgroups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
