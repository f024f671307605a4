/* net.h — the TCP plumbing under the rendezvous: HOST:PORT text, listening,
 * connecting until a deadline, whole reads and writes until a deadline.
 *
 * Every socket made here is non-blocking and close-on-exec with
 * TCP_NODELAY; waiting is poll() against an absolute deadline in
 * time_now() seconds (base/mem.h), so nothing here blocks past it. EINTR
 * is retried; a peer that closes is an error (KILN_ERR_IO) saying so.
 * Writes use MSG_NOSIGNAL: a dead peer never raises SIGPIPE.
 */
#ifndef KILN_DIST_NET_H
#define KILN_DIST_NET_H

#include <stddef.h>

struct kiln_error;

/* Splits "HOST:PORT", "[IPv6]:PORT" into host (brackets removed) and a
 * numeric port 0..65535. A bare IPv6 address needs brackets. */
int dist_addr_split(const char *hp, char *host, size_t host_n, int *port, struct kiln_error *err);

/* Listens on HOST:PORT (port 0: the system picks; *port_out gets the port
 * when not NULL): base/net.h's net_listen, every address of the host in
 * getaddrinfo's order. Returns the listening fd or -1. */
int dist_listen(const char *host_port, int *port_out, struct kiln_error *err);

/* Connects to HOST:PORT, trying again (connection refused, host not up
 * yet) every 50 ms until the deadline. Returns the fd or -1. */
int dist_connect(const char *host_port, double deadline, struct kiln_error *err);

/* Accepts one connection before the deadline. Returns the fd or -1. */
int dist_accept(int lfd, double deadline, struct kiln_error *err);

/* Sends / receives exactly n bytes before the deadline. `who` names the
 * peer in errors ("rank 2 (10.0.0.3:4000)"). */
int dist_send_all(int fd, const void *p, size_t n, double deadline, const char *who, struct kiln_error *err);
int dist_recv_all(int fd, void *p, size_t n, double deadline, const char *who, struct kiln_error *err);

/* Makes an fd non-blocking with TCP_NODELAY (idempotent). */
int dist_sock_setup(int fd, struct kiln_error *err);

#endif
