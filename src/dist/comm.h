/* comm.h — collectives between the ranks of one kiln job.
 *
 * A communicator is a table of operations plus a context (like the device
 * backends of tensor/backend.h): dist_comm_tcp_init fills one that runs
 * over the TCP mesh of dist/rendezvous.h with host buffers, so every
 * parallel layout runs and is tested without a GPU; an NCCL one fills the
 * same table with device buffers (its unique id travels in the
 * rendezvous blob). Callers use the dist_comm_* wrappers below.
 *
 * Every rank calls the same collectives in the same order with the same
 * sizes (a mismatch is reported, not guessed at). Results are bitwise the
 * same on every rank and do not depend on timing: reductions add the
 * ranks' contributions in rank order, 0 first (see comm_tcp.c). Buffers of
 * one call must not overlap unless said.
 *
 * Errors: a peer that closes, dies or moves no byte for timeout_s seconds
 * fails the operation on the ranks waiting for it, with KILN_ERR_IO and a
 * message naming the peer's rank and address; the communicator is then
 * broken (its byte streams are out of step) and every later call fails at
 * once. Free it and start a new job.
 */
#ifndef KILN_DIST_COMM_H
#define KILN_DIST_COMM_H

#include <stddef.h>

struct kiln_error;
struct dist_group;

enum dist_reduce { DIST_SUM = 0, DIST_MAX };

/* The most bytes of a device communicator's start-up token
 * (backend_ops.comm_id; NCCL's unique id is 128). */
#define DIST_COMM_ID_MAX 1024

struct dist_comm_ops {
    const char *name;
    /* buf[n] f32, in place: every rank gets op over the ranks' buf */
    int (*all_reduce)(void *ctx, float *buf, size_t n, enum dist_reduce op, struct kiln_error *err);
    /* recv[size][bytes] gets every rank's send[bytes], rank order; send may
     * be recv + rank * bytes (in place) */
    int (*all_gather)(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err);
    /* send[size][n] f32: rank r gets recv[n] = op over the ranks' send[r] */
    int (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t n, enum dist_reduce op,
                          struct kiln_error *err);
    /* send[size][bytes]: block p goes to rank p, recv[size][bytes] gets
     * block p from rank p */
    int (*all_to_all)(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err);
    /* variable sizes: send_bytes[p] from send + send_off[p] to rank p,
     * recv_bytes[p] from rank p into recv + recv_off[p]; every pair of
     * ranks must agree on the sizes between them */
    int (*all_to_allv)(void *ctx, const void *send, const size_t *send_bytes, const size_t *send_off, void *recv,
                       const size_t *recv_bytes, const size_t *recv_off, struct kiln_error *err);
    /* buf[bytes] of rank root to every rank */
    int (*broadcast)(void *ctx, void *buf, size_t bytes, int root, struct kiln_error *err);
    /* returns once every rank called it */
    int (*barrier)(void *ctx, struct kiln_error *err);
    /* Point to point, between two ranks only (pipeline stages): buf[bytes]
     * to rank peer, which calls recv with the same size and this rank.
     * Pairs of ranks must call them in the same order. Optional (NULL:
     * the communicator has none; the wrappers refuse). TCP: send returns
     * once the peer is in its recv and every byte went to the socket. */
    int (*send)(void *ctx, const void *buf, size_t bytes, int peer, struct kiln_error *err);
    int (*recv)(void *ctx, void *buf, size_t bytes, int peer, struct kiln_error *err);
    /* Optional (NULL: the wrapper answers 1 at once). Blocks until bytes
     * from rank `peer` can be read, or its connection ended, for at most
     * timeout_s seconds (< 0: no limit). 1: ready (the next collective
     * reads them, or reports the end); 0: the time passed; -1: error. No
     * collective's deadline runs meanwhile: a rank that waits for its
     * leader's next message, however long, calls this first. */
    int (*wait)(void *ctx, int peer, double timeout_s, struct kiln_error *err);
    void (*free)(void *ctx);
};

struct dist_comm {
    const struct dist_comm_ops *ops;
    void *ctx;
    int rank, size;
};

/* The TCP communicator over a rendezvous' mesh. It borrows g (its sockets):
 * g must outlive it. timeout_s: how long an operation may wait without a
 * byte moving before it fails (<= 0: 60 s). */
int dist_comm_tcp_init(struct dist_comm *c, const struct dist_group *g, double timeout_s, struct kiln_error *err);
/* A TCP communicator over some ranks of g: ranks[0..n) (ascending group
 * ranks; this rank among them) become its ranks 0..n-1, e.g. the tensor
 * parallel group of one pipeline stage. It shares g's sockets with any
 * other communicator over g: every pair of ranks must then run the
 * operations the two share in the same order on both sides, whichever
 * communicator each belongs to (lockstep gives that). Errors name the
 * peers by their rank in g. */
int dist_comm_tcp_init_sub(struct dist_comm *c, const struct dist_group *g, const int *ranks, int n,
                           double timeout_s, struct kiln_error *err);

static inline int dist_comm_all_reduce(struct dist_comm *c, float *buf, size_t n, enum dist_reduce op,
                                       struct kiln_error *err) {
    return c->ops->all_reduce(c->ctx, buf, n, op, err);
}
static inline int dist_comm_all_gather(struct dist_comm *c, const void *send, void *recv, size_t bytes,
                                       struct kiln_error *err) {
    return c->ops->all_gather(c->ctx, send, recv, bytes, err);
}
static inline int dist_comm_reduce_scatter(struct dist_comm *c, const float *send, float *recv, size_t n,
                                           enum dist_reduce op, struct kiln_error *err) {
    return c->ops->reduce_scatter(c->ctx, send, recv, n, op, err);
}
static inline int dist_comm_all_to_all(struct dist_comm *c, const void *send, void *recv, size_t bytes,
                                       struct kiln_error *err) {
    return c->ops->all_to_all(c->ctx, send, recv, bytes, err);
}
static inline int dist_comm_all_to_allv(struct dist_comm *c, const void *send, const size_t *send_bytes,
                                        const size_t *send_off, void *recv, const size_t *recv_bytes,
                                        const size_t *recv_off, struct kiln_error *err) {
    return c->ops->all_to_allv(c->ctx, send, send_bytes, send_off, recv, recv_bytes, recv_off, err);
}
static inline int dist_comm_broadcast(struct dist_comm *c, void *buf, size_t bytes, int root, struct kiln_error *err) {
    return c->ops->broadcast(c->ctx, buf, bytes, root, err);
}
static inline int dist_comm_barrier(struct dist_comm *c, struct kiln_error *err) { return c->ops->barrier(c->ctx, err); }
int dist_comm_no_p2p(const struct dist_comm *c, struct kiln_error *err);
static inline int dist_comm_send(struct dist_comm *c, const void *buf, size_t bytes, int peer,
                                 struct kiln_error *err) {
    return c->ops->send ? c->ops->send(c->ctx, buf, bytes, peer, err) : dist_comm_no_p2p(c, err);
}
static inline int dist_comm_recv(struct dist_comm *c, void *buf, size_t bytes, int peer, struct kiln_error *err) {
    return c->ops->recv ? c->ops->recv(c->ctx, buf, bytes, peer, err) : dist_comm_no_p2p(c, err);
}
static inline int dist_comm_wait(struct dist_comm *c, int peer, double timeout_s, struct kiln_error *err) {
    return c->ops->wait ? c->ops->wait(c->ctx, peer, timeout_s, err) : 1;
}
/* Accepts a zeroed communicator. */
static inline void dist_comm_free(struct dist_comm *c) {
    if (c->ops) c->ops->free(c->ctx);
    c->ops = NULL, c->ctx = NULL;
}

#endif
