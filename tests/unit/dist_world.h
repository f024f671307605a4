/* dist_world.h — runs one function as every rank of a job, ranks as threads
 * on 127.0.0.1 (rank 0 listens on port 0; the port reaches the others
 * in-process). For the test_dist_* programs: a rank records its failures
 * in its struct (cmocka asserts must stay on the main thread). */
#ifndef KILN_TESTS_DIST_WORLD_H
#define KILN_TESTS_DIST_WORLD_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "dist/comm.h"
#include "dist/net.h"
#include "dist/rendezvous.h"

struct world;
struct rank {
    struct world *w;
    int r;
    struct dist_group g;
    struct dist_comm c;
    int failed;           /* checks that failed */
    char msg[KILN_ERROR_MAX];
    struct kiln_error err; /* the last error a dist_* call gave */
    void *out;            /* what the body wants compared across ranks */
    double t;             /* seconds, for the body's own use */
};
struct world {
    int size;
    char addr[64];
    int lfd;
    double timeout_s;     /* the communicator's */
    void (*body)(struct rank *);
    struct rank rk[8];
};

static inline void rank_fail(struct rank *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void rank_fail(struct rank *k, const char *fmt, ...) {
    if (!k->failed++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(k->msg, sizeof k->msg, fmt, ap);
        va_end(ap);
    }
}

static void *world_rank_main(void *a) {
    struct rank *k = a;
    struct world *w = k->w;
    struct dist_rdv_config cfg = {.init_addr = w->addr, .rank = k->r, .world_size = w->size, .timeout_s = 10,
                                  .listen_fd = k->r == 0 ? w->lfd : -1};
    if (dist_rendezvous(&cfg, &k->g, &k->err)) {
        rank_fail(k, "rendezvous: %s", k->err.msg);
        return NULL;
    }
    if (dist_comm_tcp_init(&k->c, &k->g, w->timeout_s, &k->err)) {
        rank_fail(k, "comm init: %s", k->err.msg);
        dist_group_free(&k->g);
        return NULL;
    }
    w->body(k);
    dist_comm_free(&k->c);
    dist_group_free(&k->g);
    return NULL;
}

/* Runs body on `size` ranks; returns the number of ranks that failed, with
 * the first message in *first. */
static inline int world_run(struct world *w, int size, void (*body)(struct rank *), const char **first) {
    struct kiln_error err;
    w->size = size, w->body = body;
    if (w->timeout_s <= 0) w->timeout_s = 10;
    int port;
    w->lfd = size > 1 ? dist_listen("127.0.0.1:0", &port, &err) : -1;
    if (size > 1 && w->lfd < 0) {
        *first = "cannot listen on 127.0.0.1:0";
        return size;
    }
    snprintf(w->addr, sizeof w->addr, "127.0.0.1:%d", size > 1 ? port : 0);
    pthread_t th[8];
    for (int r = 0; r < size; r++) {
        memset(&w->rk[r], 0, sizeof w->rk[r]);
        w->rk[r].w = w, w->rk[r].r = r;
        pthread_create(&th[r], NULL, world_rank_main, &w->rk[r]);
    }
    int bad = 0;
    *first = "";
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (w->rk[r].failed && !bad++) *first = w->rk[r].msg;
    return bad;
}

#endif
