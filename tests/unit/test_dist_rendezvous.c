/* test_dist_rendezvous.c — the rendezvous: the wire messages, HOST:PORT
 * text, the table and blob reaching every rank, and its refusals (a rank
 * twice, a world-size mismatch, a stranger's bytes, nobody listening, a rank
 * that never comes), each before its deadline; ranks as separate processes. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/buf.h"
#include "base/mem.h"
#include "dist_world.h"
#include "dist/wire.h"

static void test_wire_roundtrip(void **s) {
    (void)s;
    struct buf b = {0};
    struct kiln_error err;
    struct dist_msg m;
    dist_wire_hello(&b, 3, 4, "[::1]:5000");
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), 0);
    assert_int_equal(m.type, DIST_MSG_HELLO);
    assert_int_equal(m.rank, 3);
    assert_string_equal(m.addr_one, "[::1]:5000");
    char addr[2][DIST_ADDR_MAX] = {"h0:1", "10.0.0.2:2"};
    uint8_t blob[128];
    for (int i = 0; i < 128; i++) blob[i] = (uint8_t)i;
    buf_clear(&b);
    dist_wire_table(&b, 2, 0x1122334455667788u, blob, sizeof blob, (const char(*)[DIST_ADDR_MAX])addr);
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), 0);
    assert_true(m.session == 0x1122334455667788u && m.blob_len == 128 && memcmp(m.blob, blob, 128) == 0);
    assert_string_equal(m.addr[1], "10.0.0.2:2");
    dist_msg_free(&m);
    /* cut short, a trailing byte, a wrong magic, a wrong version */
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len - 1, &m, &err), -1);
    buf_push(&b, 0);
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), -1);
    buf_clear(&b);
    dist_wire_greet(&b, 1, 2, 7);
    b.data[0] ^= 1;
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), -1);
    assert_non_null(strstr(err.msg, "not a kiln rendezvous message"));
    b.data[0] ^= 1, b.data[4] = 9;
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), -1);
    assert_non_null(strstr(err.msg, "version 9"));
    buf_clear(&b);
    dist_wire_error(&b, "bad\n rank");
    assert_int_equal(dist_wire_parse((uint8_t *)b.data, b.len, &m, &err), 0);
    assert_string_equal(m.text, "bad? rank");
    buf_free(&b);
}

static void test_addr_split(void **s) {
    (void)s;
    char h[64];
    int port;
    struct kiln_error err;
    assert_int_equal(dist_addr_split("[::1]:29500", h, sizeof h, &port, &err), 0);
    assert_string_equal(h, "::1");
    assert_int_equal(port, 29500);
    assert_int_equal(dist_addr_split("node-3.example:0", h, sizeof h, &port, &err), 0);
    assert_string_equal(h, "node-3.example");
    assert_int_equal(dist_addr_split("::1:80", h, sizeof h, &port, &err), -1);
    assert_int_equal(dist_addr_split("h:65536", h, sizeof h, &port, &err), -1);
    assert_int_equal(dist_addr_split("h:", h, sizeof h, &port, &err), -1);
    assert_int_equal(dist_addr_split(":80", h, sizeof h, &port, &err), -1);
}

/* One rank of a rendezvous-only job, as a thread. */
struct rdv {
    struct dist_rdv_config cfg;
    struct dist_group g;
    struct kiln_error err;
    int rc;
    double t;
    pthread_t th;
};
static void *rdv_main(void *a) {
    struct rdv *x = a;
    double t0 = time_now();
    x->rc = dist_rendezvous(&x->cfg, &x->g, &x->err);
    x->t = time_now() - t0;
    return NULL;
}
/* Starts n ranks (ranks[i], world sizes sizes[i]) against a rank-0 listener. */
static void rdv_run(struct rdv *x, int n, const int *ranks, const int *sizes, double timeout) {
    static char addr[64];
    struct kiln_error err;
    int port, lfd = dist_listen("127.0.0.1:0", &port, &err);
    assert_true(lfd >= 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int i = 0; i < n; i++) {
        memset(&x[i], 0, sizeof x[i]);
        x[i].cfg = (struct dist_rdv_config){.init_addr = addr, .rank = ranks[i], .world_size = sizes[i],
                                            .timeout_s = timeout, .listen_fd = ranks[i] == 0 ? lfd : -1};
        pthread_create(&x[i].th, NULL, rdv_main, &x[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(x[i].th, NULL);
}

static void test_table_and_blob(void **s) {
    (void)s;
    struct rdv x[4];
    uint8_t blob[128];
    for (int i = 0; i < 128; i++) blob[i] = (uint8_t)(255 - i);
    int ranks[4] = {3, 1, 0, 2};
    struct kiln_error err;
    int port, lfd = dist_listen("127.0.0.1:0", &port, &err);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int i = 0; i < 4; i++) {
        memset(&x[i], 0, sizeof x[i]);
        x[i].cfg = (struct dist_rdv_config){.init_addr = addr, .rank = ranks[i], .world_size = 4, .timeout_s = 10,
                                            .listen_fd = ranks[i] == 0 ? lfd : -1, .blob = blob, .blob_len = 128};
        pthread_create(&x[i].th, NULL, rdv_main, &x[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(x[i].th, NULL);
    for (int i = 0; i < 4; i++) {
        if (x[i].rc) fail_msg("rank %d: %s", ranks[i], x[i].err.msg);
        assert_int_equal(x[i].g.rank, ranks[i]);
        assert_int_equal(x[i].g.blob_len, 128);
        assert_memory_equal(x[i].g.blob, blob, 128);
        assert_true(x[i].g.session == x[0].g.session);
        for (int p = 0; p < 4; p++) {
            assert_true((x[i].g.fd[p] < 0) == (p == ranks[i]));
            assert_string_equal(x[i].g.addr[p], x[0].g.addr[p]);
        }
    }
    for (int i = 0; i < 4; i++) dist_group_free(&x[i].g);
}

static void test_duplicate_rank(void **s) {
    (void)s;
    struct rdv x[3];
    int ranks[3] = {0, 1, 1}, sizes[3] = {3, 3, 3};
    rdv_run(x, 3, ranks, sizes, 5);
    assert_int_equal(x[0].rc, -1);
    assert_non_null(strstr(x[0].err.msg, "rank 1 twice: from 127.0.0.1:"));
    for (int i = 1; i < 3; i++) {
        assert_int_equal(x[i].rc, -1);
        assert_non_null(strstr(x[i].err.msg, "rank 0 refused the start"));
        assert_non_null(strstr(x[i].err.msg, "rank 1 twice"));
        assert_true(x[i].t < 2);
    }
}

static void test_world_mismatch(void **s) {
    (void)s;
    struct rdv x[2];
    int ranks[2] = {0, 1}, sizes[2] = {2, 3};
    rdv_run(x, 2, ranks, sizes, 5);
    assert_int_equal(x[0].rc, -1);
    assert_non_null(strstr(x[0].err.msg, "rank 1 at 127.0.0.1:"));
    assert_non_null(strstr(x[0].err.msg, "world size is 3, rank 0 says 2"));
    assert_int_equal(x[1].rc, -1);
    assert_non_null(strstr(x[1].err.msg, "refused"));
}

static void test_missing_rank(void **s) {
    (void)s;
    struct rdv x[2];
    int ranks[2] = {0, 2}, sizes[2] = {3, 3};
    rdv_run(x, 2, ranks, sizes, 0.4);
    assert_int_equal(x[0].rc, -1);
    assert_non_null(strstr(x[0].err.msg, "missing rank(s) 1"));
    assert_true(x[0].t < 1.5);
    assert_int_equal(x[1].rc, -1); /* told by rank 0 */
}

static void test_nobody_listening(void **s) {
    (void)s;
    struct kiln_error err;
    int port, lfd = dist_listen("127.0.0.1:0", &port, &err);
    close(lfd); /* a port nobody listens on */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct dist_rdv_config c = {.init_addr = addr, .rank = 1, .world_size = 2, .timeout_s = 0.3, .listen_fd = -1};
    struct dist_group g;
    double t0 = time_now();
    assert_int_equal(dist_rendezvous(&c, &g, &err), -1);
    double t = time_now() - t0;
    assert_true(t >= 0.25 && t < 1.0);
    assert_non_null(strstr(err.msg, "cannot connect to 127.0.0.1:"));
    assert_int_equal(err.code, KILN_ERR_IO);
}

/* A stranger connects to rank 0 and sends HTTP. */
static void test_wrong_magic(void **s) {
    (void)s;
    struct kiln_error err;
    int port, lfd = dist_listen("127.0.0.1:0", &port, &err);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct rdv x = {.cfg = {.init_addr = addr, .rank = 0, .world_size = 2, .timeout_s = 5, .listen_fd = lfd}};
    pthread_create(&x.th, NULL, rdv_main, &x);
    int fd = dist_connect(addr, time_now() + 5, &err);
    assert_true(fd >= 0);
    assert_int_equal(dist_send_all(fd, "GET / HTTP/1.1\r\n", 16, time_now() + 5, "rank 0", &err), 0);
    pthread_join(x.th, NULL);
    close(fd);
    assert_int_equal(x.rc, -1);
    assert_non_null(strstr(x.err.msg, "not a kiln rendezvous message"));
    assert_non_null(strstr(x.err.msg, "from a rank at 127.0.0.1:"));
}

static void test_size_one(void **s) {
    (void)s;
    struct dist_rdv_config c = {.rank = 0, .world_size = 1, .listen_fd = -1};
    struct dist_group g;
    struct kiln_error err;
    assert_int_equal(dist_rendezvous(&c, &g, &err), 0);
    struct dist_comm cm;
    assert_int_equal(dist_comm_tcp_init(&cm, &g, 1, &err), 0);
    float v[3] = {1, 2, 3};
    assert_int_equal(dist_comm_all_reduce(&cm, v, 3, DIST_SUM, &err), 0);
    assert_true(v[2] == 3);
    assert_int_equal(dist_comm_barrier(&cm, &err), 0);
    dist_comm_free(&cm);
    dist_group_free(&g);
}

/* Three processes: this one is rank 0, two children are ranks 1 and 2. */
static void test_processes(void **s) {
    (void)s;
    struct kiln_error err;
    int port, lfd = dist_listen("127.0.0.1:0", &port, &err);
    assert_true(lfd >= 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pid_t kid[2];
    for (int r = 1; r <= 2; r++) {
        if ((kid[r - 1] = fork()) == 0) {
            close(lfd);
            struct dist_rdv_config c = {.init_addr = addr, .rank = r, .world_size = 3, .timeout_s = 10, .listen_fd = -1};
            struct dist_group g;
            struct dist_comm cm;
            if (dist_rendezvous(&c, &g, &err) || dist_comm_tcp_init(&cm, &g, 10, &err)) _exit(2);
            float v[5] = {1, 2, 3, 4, (float)r};
            int ok = !dist_comm_all_reduce(&cm, v, 5, DIST_SUM, &err) && v[0] == 3 && v[4] == 3;
            _exit(ok ? 0 : 1);
        }
        assert_true(kid[r - 1] > 0);
    }
    struct dist_rdv_config c = {.init_addr = addr, .rank = 0, .world_size = 3, .timeout_s = 10, .listen_fd = lfd};
    struct dist_group g;
    struct dist_comm cm;
    int rc = dist_rendezvous(&c, &g, &err);
    if (!rc) rc = dist_comm_tcp_init(&cm, &g, 10, &err);
    float v[5] = {1, 2, 3, 4, 0};
    if (!rc) rc = dist_comm_all_reduce(&cm, v, 5, DIST_SUM, &err);
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(kid[i], &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    if (rc) fail_msg("rank 0: %s", err.msg);
    assert_true(v[0] == 3 && v[3] == 12 && v[4] == 3);
    dist_comm_free(&cm);
    dist_group_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_roundtrip), cmocka_unit_test(test_addr_split),
        cmocka_unit_test(test_table_and_blob), cmocka_unit_test(test_duplicate_rank),
        cmocka_unit_test(test_world_mismatch), cmocka_unit_test(test_missing_rank),
        cmocka_unit_test(test_nobody_listening), cmocka_unit_test(test_wrong_magic),
        cmocka_unit_test(test_size_one),       cmocka_unit_test(test_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
