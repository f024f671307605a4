/* rendezvous.h — how the ranks of one kiln job find each other.
 *
 * Rank 0 listens on --dist-init-addr HOST:PORT; every other rank connects
 * to it (retrying until the deadline, so start order does not matter),
 * opens its own mesh listener and says HELLO (magic, protocol version,
 * rank, world size, its mesh address). Rank 0 checks every HELLO (rank in
 * 1..size-1, no rank twice, the same world size) and answers everybody with
 * the TABLE: all mesh addresses, a session number and an opaque blob that
 * rank 0 supplies (NCCL's 128-byte unique id). If any HELLO is wrong, rank 0
 * fails with a message naming the rank and its address and sends that
 * message (ERROR) to every rank connected so far, which fail with it too.
 *
 * The ranks then build a full mesh of TCP connections: the link to rank 0 is
 * the rendezvous connection itself; rank j > i > 0 connects to rank i's mesh
 * address and opens with GREET (rank, world size, session), so a rank of an
 * earlier job cannot join. The mesh is what the TCP communicator
 * (dist/comm.h) runs over, and the control channel of any other one.
 * Message layouts: dist/wire.h. Everything finishes before cfg.timeout_s
 * or fails with KILN_ERR_IO; no step waits without a deadline.
 *
 *   struct dist_group g;
 *   struct dist_rdv_config c = {.init_addr = "10.0.0.1:29500", .rank = r, .world_size = n,
 *                               .timeout_s = 60, .listen_fd = -1};
 *   if (dist_rendezvous(&c, &g, &err)) ...;
 *   ... g.fd[peer] ... dist_group_free(&g);
 */
#ifndef KILN_DIST_RENDEZVOUS_H
#define KILN_DIST_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "dist/wire.h"

struct kiln_error;

struct dist_rdv_config {
    const char *init_addr; /* rank 0's HOST:PORT (name, IPv4 or [IPv6]) */
    int rank, world_size;
    double timeout_s;      /* the whole rendezvous, mesh included; <= 0: 60 s */
    /* rank 0: the blob every rank receives (NULL / 0: none) */
    const void *blob;
    size_t blob_len;
    /* ranks > 0: the host to open the mesh listener on; NULL: the local
     * address of the connection to rank 0 (the interface that reaches it) */
    const char *mesh_host;
    /* rank 0: an already-listening socket to use instead of listening on
     * init_addr (tests bind port 0 with dist_listen); -1 for none. The
     * rendezvous closes it. */
    int listen_fd;
};

/* One rank's view of the job after the rendezvous. */
struct dist_group {
    int rank, size;
    int *fd;                     /* [size]: the connection to each peer, -1 for itself */
    char (*addr)[DIST_ADDR_MAX]; /* [size]: each rank's mesh address ("HOST:PORT") */
    uint64_t session;
    uint8_t blob[DIST_BLOB_MAX];
    size_t blob_len;
};

/* Runs the rendezvous and builds the mesh. Size 1 opens no socket. Returns 0,
 * or -1 with err (g then owns nothing). */
int dist_rendezvous(const struct dist_rdv_config *cfg, struct dist_group *g, struct kiln_error *err);
/* Closes the connections; accepts a zeroed or half-built group. */
void dist_group_free(struct dist_group *g);

#endif
