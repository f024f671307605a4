/* comm_tcp.c — the collectives of comm.h over the rendezvous' TCP mesh.
 *
 * Everything is built on one step, exchange(): with every participating
 * peer at once, send one buffer and receive one buffer, driven by poll()
 * over non-blocking sockets, so two ranks sending each other hundreds of MB
 * never wait on each other's full socket buffers. Each direction opens with
 * a 16-byte header (u32 operation, u32 sequence number, u64 payload bytes):
 * ranks that called different collectives, or the same one with different
 * sizes, fail at once with both names instead of misreading bytes.
 *
 * Determinism. The engine's ranks run the same model step in lockstep and
 * must take the same decisions (sampling, routing, stopping) from the same
 * numbers, so every rank must see bitwise the same reduction result, and
 * the result must not depend on which bytes arrived first. Float addition
 * is not associative, so the order is fixed: an all-reduce is a
 * reduce-scatter, in which the owner of part p of the vector (rank p) adds
 * the ranks' contributions to it in rank order, ((x0 + x1) + x2) + ..., and
 * an all-gather of the owners' sums. No rank adds in arrival order, and
 * every rank gets the owner's bits.
 *
 * Sequence numbers count per pair of ranks (each peer's own), so two ranks
 * may exchange point-to-point messages (send / recv) between collectives
 * without the others, and a communicator over some of the ranks
 * (dist_comm_tcp_init_sub) shares the sockets with the whole group's: each
 * pair's operations come in one order on both sides.
 *
 * Large buffers are reduced in segments of at most SEG_FLOATS floats per
 * part, so the scratch memory stays at size x SEG_FLOATS x 4 bytes; gathers,
 * all-to-all and broadcast move straight between the caller's buffers.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "dist/rendezvous.h"

#define SEG_FLOATS ((size_t)1 << 20)
#define HDR 16

/* OP_WAIT never goes on the wire: it names wait() in errors */
enum op_code { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_ALL_TO_ALLV, OP_BROADCAST, OP_BARRIER, OP_WAIT, OP_P2P };
static const char *op_name(uint32_t op) {
    static const char *n[] = {"?", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_allv", "broadcast", "barrier", "wait", "send/recv"};
    return op < sizeof n / sizeof *n ? n[op] : "?";
}

/* One peer's part of an exchange. */
struct xfer {
    int on;
    const char *sp;
    size_t sn, sdone; /* payload bytes to send, sent (after the header) */
    char *rp;
    size_t rn, rdone;
    uint8_t shdr[HDR], rhdr[HDR];
    size_t shd, rhd; /* header bytes sent, received */
};

struct tcp {
    int rank, size;
    const int *fd;
    const char (*addr)[DIST_ADDR_MAX];
    const int *grank; /* [size] the group's rank of each (a sub-communicator), or NULL */
    int *own_fd;      /* a sub-communicator's fd[] and addr[], grank[] */
    char (*own_addr)[DIST_ADDR_MAX];
    int *own_grank;
    double timeout;
    uint32_t *seq;    /* [size] the next sequence number with each peer */
    int broken;
    char why[KILN_ERROR_MAX];
    struct xfer *x;
    struct pollfd *pfd;
    int *pfd_peer;
    float *tmp; /* [size][SEG_FLOATS] scratch for reductions */
};

static void put_hdr(uint8_t *h, uint32_t op, uint32_t seq, uint64_t n) {
    for (int i = 0; i < 4; i++) h[i] = (uint8_t)(op >> 8 * i), h[4 + i] = (uint8_t)(seq >> 8 * i);
    for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(n >> 8 * i);
}
static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Fails the operation and breaks the communicator. */
static int fail(struct tcp *t, struct kiln_error *err, uint32_t op, int peer, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(struct tcp *t, struct kiln_error *err, uint32_t op, int peer, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int me = t->grank ? t->grank[t->rank] : t->rank, them = t->grank ? t->grank[peer] : peer;
    snprintf(t->why, sizeof t->why, "%s (rank %d%s%d): rank %d (%s) %s", op_name(op), me, t->grank ? ", a group of " : " of ",
             t->size, them, t->addr[peer], what);
    t->broken = 1;
    return kiln_errorc(err, KILN_ERR_IO, "%s", t->why);
}

static void part(struct tcp *t, int peer, const void *s, size_t sn, void *r, size_t rn) {
    struct xfer *x = &t->x[peer];
    *x = (struct xfer){.on = 1, .sp = s, .sn = sn, .rp = r, .rn = rn};
}

/* Runs the parts set with part() until every byte moved. The deadline is
 * for progress: it moves on whenever a byte does. */
static int exchange(struct tcp *t, uint32_t op, struct kiln_error *err) {
    for (int p = 0; p < t->size; p++)
        if (t->x[p].on) put_hdr(t->x[p].shdr, op, t->seq[p], t->x[p].sn);
    double deadline = time_now() + t->timeout;
    for (;;) {
        int n = 0;
        for (int p = 0; p < t->size; p++) {
            struct xfer *x = &t->x[p];
            if (!x->on) continue;
            short ev = 0;
            if (x->shd < HDR || x->sdone < x->sn) ev |= POLLOUT;
            if (x->rhd < HDR || x->rdone < x->rn) ev |= POLLIN;
            if (!ev) continue;
            t->pfd[n] = (struct pollfd){.fd = t->fd[p], .events = ev};
            t->pfd_peer[n++] = p;
        }
        if (!n) break;
        double left = deadline - time_now();
        int r = left > 0 ? poll(t->pfd, (nfds_t)n, (int)ceil(left * 1000)) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fail(t, err, op, t->pfd_peer[0], "poll: %s", strerror(errno));
        if (r == 0)
            return fail(t, err, op, t->pfd_peer[0], "moved no byte for %.1f s (dead, stuck, or in another collective)",
                        t->timeout);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            if (!t->pfd[i].revents) continue;
            int p = t->pfd_peer[i], fd = t->fd[p];
            struct xfer *x = &t->x[p];
            while (x->shd < HDR || x->sdone < x->sn) { /* send what the socket takes */
                const char *b = x->shd < HDR ? (const char *)x->shdr + x->shd : x->sp + x->sdone;
                size_t len = x->shd < HDR ? HDR - x->shd : x->sn - x->sdone;
                ssize_t k = send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0 && errno == EINTR) continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (k < 0) return fail(t, err, op, p, "lost the connection: %s", strerror(errno));
                moved = 1;
                if (x->shd < HDR) x->shd += (size_t)k;
                else x->sdone += (size_t)k;
            }
            while (x->rhd < HDR || x->rdone < x->rn) {
                char *b = x->rhd < HDR ? (char *)x->rhdr + x->rhd : x->rp + x->rdone;
                size_t len = x->rhd < HDR ? HDR - x->rhd : x->rn - x->rdone;
                ssize_t k = recv(fd, b, len, MSG_DONTWAIT);
                if (k < 0 && errno == EINTR) continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (k < 0) return fail(t, err, op, p, "lost the connection: %s", strerror(errno));
                if (k == 0) return fail(t, err, op, p, "closed the connection");
                moved = 1;
                if (x->rhd < HDR) {
                    x->rhd += (size_t)k;
                    if (x->rhd < HDR) continue;
                    uint32_t pop = (uint32_t)get_le(x->rhdr, 4), pseq = (uint32_t)get_le(x->rhdr + 4, 4);
                    uint64_t pn = get_le(x->rhdr + 8, 8);
                    if (pop != op || pseq != t->seq[p])
                        return fail(t, err, op, p, "is in %s step %u, this rank in %s step %u", op_name(pop), pseq,
                                    op_name(op), t->seq[p]);
                    if (pn != x->rn)
                        return fail(t, err, op, p, "sends %llu bytes, this rank expects %zu", (unsigned long long)pn,
                                    x->rn);
                } else {
                    x->rdone += (size_t)k;
                }
            }
        }
        if (moved) deadline = time_now() + t->timeout;
    }
    for (int p = 0; p < t->size; p++)
        if (t->x[p].on) t->x[p].on = 0, t->seq[p]++;
    return 0;
}

static int check(struct tcp *t, struct kiln_error *err) {
    if (t->broken) return kiln_errorc(err, KILN_ERR_IO, "communicator broken by an earlier failure: %s", t->why);
    return 0;
}

/* The bounds of part p when m elements are split over the ranks. */
static size_t lo(size_t m, int p, int size) { return m * (size_t)p / (size_t)size; }

/* dst[0..m) = op over the ranks of src[r][0..m), ranks in order 0, 1, ... */
static void reduce_in_order(float *dst, const float *src, size_t stride, size_t m, int size, enum dist_reduce op) {
    if (!m) return;
    memcpy(dst, src, m * sizeof *dst);
    for (int r = 1; r < size; r++) {
        const float *s = src + (size_t)r * stride;
        if (op == DIST_SUM)
            for (size_t i = 0; i < m; i++) dst[i] = dst[i] + s[i];
        else
            for (size_t i = 0; i < m; i++) dst[i] = s[i] > dst[i] ? s[i] : dst[i];
    }
}

static int tcp_all_reduce(void *ctx, float *buf, size_t n, enum dist_reduce op, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    size_t seg_max = SEG_FLOATS * (size_t)t->size;
    for (size_t off = 0; off < n || (off == 0 && n == 0); off += seg_max) {
        size_t m = n - off < seg_max ? n - off : seg_max;
        float *b = buf + off;
        size_t mlo = lo(m, t->rank, t->size), mn = lo(m, t->rank + 1, t->size) - mlo;
        /* reduce-scatter: part p of every rank goes to rank p */
        for (int p = 0; p < t->size; p++)
            if (p != t->rank)
                part(t, p, b + lo(m, p, t->size), (lo(m, p + 1, t->size) - lo(m, p, t->size)) * sizeof(float),
                     t->tmp + (size_t)p * SEG_FLOATS, mn * sizeof(float));
        if (exchange(t, OP_ALL_REDUCE, err)) return -1;
        if (mn) memcpy(t->tmp + (size_t)t->rank * SEG_FLOATS, b + mlo, mn * sizeof(float));
        reduce_in_order(b + mlo, t->tmp, SEG_FLOATS, mn, t->size, op);
        /* all-gather of the owners' results */
        for (int p = 0; p < t->size; p++)
            if (p != t->rank)
                part(t, p, b + mlo, mn * sizeof(float), b + lo(m, p, t->size),
                     (lo(m, p + 1, t->size) - lo(m, p, t->size)) * sizeof(float));
        if (exchange(t, OP_ALL_REDUCE, err)) return -1;
        if (n == 0) break;
    }
    return 0;
}

static int tcp_reduce_scatter(void *ctx, const float *send, float *recv, size_t n, enum dist_reduce op,
                              struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    for (size_t off = 0; off < n || (off == 0 && n == 0); off += SEG_FLOATS) {
        size_t m = n - off < SEG_FLOATS ? n - off : SEG_FLOATS;
        for (int p = 0; p < t->size; p++)
            if (p != t->rank)
                part(t, p, send + (size_t)p * n + off, m * sizeof(float), t->tmp + (size_t)p * SEG_FLOATS,
                     m * sizeof(float));
        if (exchange(t, OP_REDUCE_SCATTER, err)) return -1;
        if (m) memcpy(t->tmp + (size_t)t->rank * SEG_FLOATS, send + (size_t)t->rank * n + off, m * sizeof(float));
        reduce_in_order(recv + off, t->tmp, SEG_FLOATS, m, t->size, op);
        if (n == 0) break;
    }
    return 0;
}

static int tcp_all_gather(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    char *r = recv;
    if (bytes && r + (size_t)t->rank * bytes != send) memmove(r + (size_t)t->rank * bytes, send, bytes);
    for (int p = 0; p < t->size; p++)
        if (p != t->rank) part(t, p, r + (size_t)t->rank * bytes, bytes, r + (size_t)p * bytes, bytes);
    return exchange(t, OP_ALL_GATHER, err);
}

static int tcp_all_to_allv(void *ctx, const void *send, const size_t *send_bytes, const size_t *send_off, void *recv,
                           const size_t *recv_bytes, const size_t *recv_off, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    const char *s = send;
    char *r = recv;
    KILN_ASSERT(send_bytes[t->rank] == recv_bytes[t->rank]);
    if (send_bytes[t->rank]) memmove(r + recv_off[t->rank], s + send_off[t->rank], send_bytes[t->rank]);
    for (int p = 0; p < t->size; p++)
        if (p != t->rank) part(t, p, s + send_off[p], send_bytes[p], r + recv_off[p], recv_bytes[p]);
    return exchange(t, OP_ALL_TO_ALLV, err);
}

static int tcp_all_to_all(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    const char *s = send;
    char *r = recv;
    if (bytes) memcpy(r + (size_t)t->rank * bytes, s + (size_t)t->rank * bytes, bytes);
    for (int p = 0; p < t->size; p++)
        if (p != t->rank) part(t, p, s + (size_t)p * bytes, bytes, r + (size_t)p * bytes, bytes);
    return exchange(t, OP_ALL_TO_ALL, err);
}

static int tcp_broadcast(void *ctx, void *buf, size_t bytes, int root, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    KILN_ASSERT(root >= 0 && root < t->size);
    if (t->rank == root) {
        for (int p = 0; p < t->size; p++)
            if (p != root) part(t, p, buf, bytes, NULL, 0);
    } else {
        part(t, root, NULL, 0, buf, bytes);
    }
    return exchange(t, OP_BROADCAST, err);
}

/* Every rank's header reaches every rank: nobody leaves before all came. */
static int tcp_barrier(void *ctx, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    for (int p = 0; p < t->size; p++)
        if (p != t->rank) part(t, p, NULL, 0, NULL, 0);
    return exchange(t, OP_BARRIER, err);
}

static int tcp_send(void *ctx, const void *buf, size_t bytes, int peer, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    KILN_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    part(t, peer, buf, bytes, NULL, 0);
    return exchange(t, OP_P2P, err);
}

static int tcp_recv(void *ctx, void *buf, size_t bytes, int peer, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    KILN_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    part(t, peer, NULL, 0, buf, bytes);
    return exchange(t, OP_P2P, err);
}

static int tcp_wait(void *ctx, int peer, double timeout_s, struct kiln_error *err) {
    struct tcp *t = ctx;
    if (check(t, err)) return -1;
    KILN_ASSERT(peer >= 0 && peer < t->size && peer != t->rank);
    double deadline = timeout_s < 0 ? 0 : time_now() + timeout_s;
    for (;;) {
        int ms = -1;
        if (timeout_s >= 0) {
            double left = deadline - time_now();
            if (left <= 0) return 0;
            ms = (int)ceil(left * 1000);
        }
        struct pollfd p = {.fd = t->fd[peer], .events = POLLIN};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fail(t, err, OP_WAIT, peer, "poll: %s", strerror(errno));
        if (r > 0) return 1; /* data, or the end of the stream (the next read reports it) */
    }
}

static void tcp_free(void *ctx) {
    struct tcp *t = ctx;
    if (!t) return;
    free(t->x);
    free(t->pfd);
    free(t->pfd_peer);
    free(t->tmp);
    free(t->seq);
    free(t->own_fd);
    free(t->own_addr);
    free(t->own_grank);
    free(t);
}

static const struct dist_comm_ops tcp_ops = {
    .name = "tcp",
    .all_reduce = tcp_all_reduce,
    .all_gather = tcp_all_gather,
    .reduce_scatter = tcp_reduce_scatter,
    .all_to_all = tcp_all_to_all,
    .all_to_allv = tcp_all_to_allv,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .send = tcp_send,
    .recv = tcp_recv,
    .wait = tcp_wait,
    .free = tcp_free,
};

/* The communicator of ranks 0..size-1 whose sockets are fd[] (t->fd, addr
 * set by the caller). */
static int tcp_make(struct dist_comm *c, struct tcp *t, int rank, int size, double timeout_s, struct kiln_error *err) {
    t->rank = rank, t->size = size;
    t->timeout = timeout_s > 0 ? timeout_s : 60;
    t->seq = xcalloc((size_t)size, sizeof *t->seq);
    t->x = xcalloc((size_t)size, sizeof *t->x);
    t->pfd = xcalloc((size_t)size, sizeof *t->pfd);
    t->pfd_peer = xcalloc((size_t)size, sizeof *t->pfd_peer);
    t->tmp = malloc((size_t)size * SEG_FLOATS * sizeof(float));
    if (!t->tmp) {
        tcp_free(t);
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "communicator: no memory for %d x %zu MB of scratch",
                           size, SEG_FLOATS * sizeof(float) >> 20);
    }
    c->ops = &tcp_ops, c->ctx = t, c->rank = rank, c->size = size;
    return 0;
}

int dist_comm_tcp_init(struct dist_comm *c, const struct dist_group *g, double timeout_s, struct kiln_error *err) {
    memset(c, 0, sizeof *c);
    if (g->size < 1 || !g->fd) return kiln_errorf(err, "communicator: the group has no ranks (no rendezvous?)");
    struct tcp *t = xcalloc(1, sizeof *t);
    t->fd = g->fd;
    t->addr = (const char(*)[DIST_ADDR_MAX])g->addr;
    return tcp_make(c, t, g->rank, g->size, timeout_s, err);
}

int dist_comm_tcp_init_sub(struct dist_comm *c, const struct dist_group *g, const int *ranks, int n,
                           double timeout_s, struct kiln_error *err) {
    memset(c, 0, sizeof *c);
    if (g->size < 1 || !g->fd) return kiln_errorf(err, "communicator: the group has no ranks (no rendezvous?)");
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= g->size || (i && ranks[i] <= ranks[i - 1]))
            return kiln_errorf(err, "communicator: ranks of a subgroup must be ascending ranks of the group of %d",
                               g->size);
        if (ranks[i] == g->rank) me = i;
    }
    if (me < 0) return kiln_errorf(err, "communicator: rank %d is not in the subgroup", g->rank);
    struct tcp *t = xcalloc(1, sizeof *t);
    t->own_fd = xmalloc((size_t)n * sizeof *t->own_fd);
    t->own_addr = xmalloc((size_t)n * sizeof *t->own_addr);
    t->own_grank = xmalloc((size_t)n * sizeof *t->own_grank);
    for (int i = 0; i < n; i++) {
        t->own_fd[i] = g->fd[ranks[i]];
        memcpy(t->own_addr[i], g->addr[ranks[i]], DIST_ADDR_MAX);
        t->own_grank[i] = ranks[i];
    }
    t->fd = t->own_fd, t->grank = t->own_grank;
    t->addr = (const char(*)[DIST_ADDR_MAX])t->own_addr;
    return tcp_make(c, t, me, n, timeout_s, err);
}

int dist_comm_no_p2p(const struct dist_comm *c, struct kiln_error *err) {
    return kiln_errorc(err, KILN_ERR_UNSUPPORTED, "the %s communicator has no point-to-point send and recv",
                       c->ops->name);
}
