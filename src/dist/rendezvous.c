#include "dist/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/net.h"
#include "dist/net.h"

/* Reads one whole message before the deadline. */
static int read_msg(int fd, double deadline, const char *who, struct dist_msg *m, struct kiln_error *err) {
    uint8_t hdr[DIST_WIRE_HEADER];
    if (dist_recv_all(fd, hdr, sizeof hdr, deadline, who, err)) return -1;
    enum dist_msg_type type;
    long body = dist_wire_header(hdr, &type, err);
    if (body < 0) return kiln_error_prefix(err, "from %s", who);
    uint8_t *msg = xmalloc(DIST_WIRE_HEADER + (size_t)body);
    memcpy(msg, hdr, sizeof hdr);
    int rc = dist_recv_all(fd, msg + DIST_WIRE_HEADER, (size_t)body, deadline, who, err);
    if (!rc && dist_wire_parse(msg, DIST_WIRE_HEADER + (size_t)body, m, err)) rc = kiln_error_prefix(err, "from %s", who);
    free(msg);
    return rc;
}

static int send_buf(int fd, struct buf *b, double deadline, const char *who, struct kiln_error *err) {
    return dist_send_all(fd, b->data, b->len, deadline, who, err);
}

static void peer_text(int fd, char *buf, size_t n) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl)) snprintf(buf, n, "?");
    else net_addr_text((struct sockaddr *)&ss, buf, n);
}

static void group_alloc(struct dist_group *g, int rank, int size) {
    memset(g, 0, sizeof *g);
    g->rank = rank, g->size = size;
    g->fd = xmalloc((size_t)size * sizeof *g->fd);
    for (int i = 0; i < size; i++) g->fd[i] = -1;
    g->addr = xcalloc((size_t)size, sizeof *g->addr);
}

void dist_group_free(struct dist_group *g) {
    if (g->fd)
        for (int i = 0; i < g->size; i++)
            if (g->fd[i] >= 0) close(g->fd[i]);
    free(g->fd);
    free(g->addr);
    memset(g, 0, sizeof *g);
}

/* Rank 0: collect every HELLO, check it, answer with the table. */
static int serve(const struct dist_rdv_config *cfg, struct dist_group *g, double deadline, struct kiln_error *err) {
    int lfd = cfg->listen_fd >= 0 ? cfg->listen_fd : dist_listen(cfg->init_addr, NULL, err);
    if (lfd < 0) return kiln_error_prefix(err, "rendezvous (rank 0)");
    uint64_t session = 0;
    if (getrandom(&session, sizeof session, 0) != (ssize_t)sizeof session)
        session = (uint64_t)getpid() * 0x9e3779b97f4a7c15u ^ (uint64_t)(time_now() * 1e9);
    g->session = session;
    snprintf(g->addr[0], DIST_ADDR_MAX, "%s", cfg->init_addr);
    if (cfg->blob_len) memcpy(g->blob, cfg->blob, cfg->blob_len);
    g->blob_len = cfg->blob_len;
    struct buf out = {0};
    int got = 1, stray = -1, rc = 0;
    char who[DIST_ADDR_MAX + 32];
    while (got < g->size) {
        int fd = dist_accept(lfd, deadline, err);
        if (fd < 0) {
            char missing[256] = "";
            size_t o = 0;
            for (int i = 1; i < g->size && o < sizeof missing - 16; i++)
                if (g->fd[i] < 0) o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", o ? ", " : "", i);
            rc = kiln_errorc(err, KILN_ERR_IO, "rendezvous (rank 0 on %s): %d of %d ranks came within %.1f s; missing rank(s) %s",
                             cfg->init_addr, got, g->size, cfg->timeout_s > 0 ? cfg->timeout_s : 60, missing);
            goto done;
        }
        char peer[DIST_ADDR_MAX];
        peer_text(fd, peer, sizeof peer);
        snprintf(who, sizeof who, "a rank at %s", peer);
        struct dist_msg m;
        if (read_msg(fd, deadline, who, &m, err)) {
            stray = fd;
            rc = kiln_error_prefix(err, "rendezvous (rank 0)");
            goto done;
        }
        const char *why = NULL;
        char whybuf[DIST_TEXT_MAX];
        if (m.type != DIST_MSG_HELLO) {
            snprintf(whybuf, sizeof whybuf, "%s sent message type %d, not HELLO", who, (int)m.type);
            why = whybuf;
        } else if (m.world_size != (uint32_t)g->size) {
            snprintf(whybuf, sizeof whybuf, "rank %u at %s says the world size is %u, rank 0 says %d", m.rank, peer,
                     m.world_size, g->size);
            why = whybuf;
        } else if (m.rank == 0 || m.rank >= (uint32_t)g->size) {
            snprintf(whybuf, sizeof whybuf, "%s says it is rank %u, not one of 1..%d", who, m.rank, g->size - 1);
            why = whybuf;
        } else if (g->fd[m.rank] >= 0) {
            char first[DIST_ADDR_MAX];
            peer_text(g->fd[m.rank], first, sizeof first);
            snprintf(whybuf, sizeof whybuf, "rank %u twice: from %s and from %s", m.rank, first, peer);
            why = whybuf;
        }
        dist_msg_free(&m);
        if (why) {
            stray = fd;
            rc = kiln_errorc(err, KILN_ERR_BAD_INPUT, "rendezvous (rank 0): %s", why);
            goto done;
        }
        g->fd[m.rank] = fd;
        snprintf(g->addr[m.rank], DIST_ADDR_MAX, "%s", m.addr_one);
        got++;
    }
    dist_wire_table(&out, (uint32_t)g->size, session, g->blob, g->blob_len, (const char(*)[DIST_ADDR_MAX])g->addr);
    for (int i = 1; i < g->size && !rc; i++) {
        snprintf(who, sizeof who, "rank %d (%s)", i, g->addr[i]);
        if (send_buf(g->fd[i], &out, deadline, who, err)) rc = kiln_error_prefix(err, "rendezvous (rank 0)");
    }
done:
    if (rc && err) { /* tell every rank that came why the job does not start */
        buf_clear(&out);
        dist_wire_error(&out, err->msg);
        double soon = time_now() + 1.0 < deadline ? time_now() + 1.0 : deadline;
        for (int i = 1; i < g->size; i++)
            if (g->fd[i] >= 0) dist_send_all(g->fd[i], out.data, out.len, soon, "", NULL);
        if (stray >= 0) dist_send_all(stray, out.data, out.len, soon, "", NULL);
    }
    if (stray >= 0) close(stray);
    buf_free(&out);
    close(lfd);
    return rc;
}

/* Ranks > 0: HELLO to rank 0, the table back, then the mesh. */
static int join(const struct dist_rdv_config *cfg, struct dist_group *g, double deadline, struct kiln_error *err) {
    int lfd = -1, rc = -1;
    char who[DIST_ADDR_MAX + 32];
    struct buf out = {0};
    struct dist_msg m = {0};
    snprintf(who, sizeof who, "rank 0 (%s)", cfg->init_addr);
    int c = dist_connect(cfg->init_addr, deadline, err);
    if (c < 0) goto fail;
    g->fd[0] = c;
    /* the mesh listener: on the interface that reaches rank 0 unless told */
    char host[DIST_ADDR_MAX], me[DIST_ADDR_MAX + 16];
    if (cfg->mesh_host) {
        snprintf(host, sizeof host, "%s", cfg->mesh_host);
    } else {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(c, (struct sockaddr *)&ss, &sl);
        net_addr_text((struct sockaddr *)&ss, host, sizeof host);
        *strrchr(host, ':') = 0; /* "1.2.3.4" or "[::1]" */
    }
    int bracket = strchr(host, ':') && host[0] != '[';
    snprintf(me, sizeof me, "%s%s%s:0", bracket ? "[" : "", host, bracket ? "]" : "");
    int port;
    if ((lfd = dist_listen(me, &port, err)) < 0) goto fail;
    snprintf(me, sizeof me, "%s%s%s:%d", bracket ? "[" : "", host, bracket ? "]" : "", port);
    if (strlen(me) >= DIST_ADDR_MAX) {
        kiln_errorf(err, "mesh address '%s' is longer than %d bytes", me, DIST_ADDR_MAX - 1);
        goto fail;
    }
    dist_wire_hello(&out, (uint32_t)g->rank, (uint32_t)g->size, me);
    if (send_buf(c, &out, deadline, who, err) || read_msg(c, deadline, who, &m, err)) goto fail;
    if (m.type == DIST_MSG_ERROR) {
        kiln_errorc(err, KILN_ERR_BAD_INPUT, "rank 0 refused the start: %s", m.text);
        goto fail;
    }
    if (m.type != DIST_MSG_TABLE || m.world_size != (uint32_t)g->size) {
        kiln_errorc(err, KILN_ERR_BAD_INPUT, "%s answered message type %d for world size %u, not the table for %d",
                    who, (int)m.type, m.world_size, g->size);
        goto fail;
    }
    memcpy(g->addr, m.addr, (size_t)g->size * sizeof *g->addr);
    if (m.blob_len) memcpy(g->blob, m.blob, m.blob_len);
    g->blob_len = m.blob_len;
    g->session = m.session;
    for (int i = 1; i < g->rank; i++) { /* connect down, greet */
        snprintf(who, sizeof who, "rank %d (%s)", i, g->addr[i]);
        if ((g->fd[i] = dist_connect(g->addr[i], deadline, err)) < 0) goto fail;
        buf_clear(&out);
        dist_wire_greet(&out, (uint32_t)g->rank, (uint32_t)g->size, g->session);
        if (send_buf(g->fd[i], &out, deadline, who, err)) goto fail;
    }
    for (int k = g->rank + 1; k < g->size; k++) { /* accept from above */
        int fd = dist_accept(lfd, deadline, err);
        if (fd < 0) goto fail;
        char peer[DIST_ADDR_MAX];
        peer_text(fd, peer, sizeof peer);
        snprintf(who, sizeof who, "a rank at %s", peer);
        dist_msg_free(&m);
        int bad = read_msg(fd, deadline, who, &m, err);
        if (!bad && (m.type != DIST_MSG_GREET || m.session != g->session || m.world_size != (uint32_t)g->size ||
                     m.rank <= (uint32_t)g->rank || m.rank >= (uint32_t)g->size || g->fd[m.rank] >= 0))
            bad = kiln_errorc(err, KILN_ERR_BAD_INPUT, "%s opened the mesh with type %d rank %u world %u (another job, or a rank twice)",
                              who, (int)m.type, m.rank, m.world_size);
        if (bad) {
            close(fd);
            goto fail;
        }
        g->fd[m.rank] = fd;
    }
    rc = 0;
fail:
    if (rc) kiln_error_prefix(err, "rendezvous (rank %d)", g->rank);
    dist_msg_free(&m);
    buf_free(&out);
    if (lfd >= 0) close(lfd);
    return rc;
}

int dist_rendezvous(const struct dist_rdv_config *cfg, struct dist_group *g, struct kiln_error *err) {
    memset(g, 0, sizeof *g);
    if (cfg->world_size < 1 || cfg->world_size > DIST_WORLD_MAX || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return kiln_errorf(err, "rendezvous: rank %d of world size %d (want 0 <= rank < size <= %d)", cfg->rank,
                           cfg->world_size, DIST_WORLD_MAX);
    if (cfg->blob_len > DIST_BLOB_MAX) return kiln_errorf(err, "rendezvous: blob of %zu bytes (at most %d)", cfg->blob_len, DIST_BLOB_MAX);
    size_t al = cfg->init_addr ? strlen(cfg->init_addr) : 0;
    if (cfg->world_size > 1 && (al == 0 || al >= DIST_ADDR_MAX))
        return kiln_errorf(err, "rendezvous: --dist-init-addr HOST:PORT is needed for %d ranks", cfg->world_size);
    for (size_t i = 0; i < al; i++)
        if (cfg->init_addr[i] < 0x20 || cfg->init_addr[i] > 0x7e)
            return kiln_errorf(err, "rendezvous: --dist-init-addr is not printable ASCII");
    group_alloc(g, cfg->rank, cfg->world_size);
    if (cfg->world_size == 1) {
        if (cfg->listen_fd >= 0) close(cfg->listen_fd);
        if (cfg->blob_len) memcpy(g->blob, cfg->blob, cfg->blob_len);
        g->blob_len = cfg->blob_len;
        snprintf(g->addr[0], DIST_ADDR_MAX, "%s", al ? cfg->init_addr : "-");
        return 0;
    }
    double deadline = time_now() + (cfg->timeout_s > 0 ? cfg->timeout_s : 60);
    int rc = cfg->rank == 0 ? serve(cfg, g, deadline, err) : join(cfg, g, deadline, err);
    if (rc) dist_group_free(g);
    return rc;
}
