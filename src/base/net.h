/* net.h — the listening socket that `kiln serve` (cli/listen.c) and the
 * ranks' rendezvous (dist/net.c) both open: resolve a host, bind the first
 * of its addresses that binds, listen.
 */
#ifndef KILN_BASE_NET_H
#define KILN_BASE_NET_H

#include <stddef.h>

struct kiln_error;
struct sockaddr;

/* "1.2.3.4:5" or "[::1]:5" for a socket address. */
void net_addr_text(const struct sockaddr *sa, char *buf, size_t n);

enum {
    NET_IPV4_FIRST = 1, /* try the host's IPv4 addresses before its IPv6 ones (as uvicorn takes a name) */
};

/* Resolves host (a name, an IPv4 address or a bare IPv6 one) and binds the
 * first of its addresses that binds (in getaddrinfo's order, or IPv4 ones
 * first with NET_IPV4_FIRST), with SO_REUSEADDR (a restarted server does
 * not wait for TIME_WAIT connections), then listens. Port 0: the system
 * picks one; *port_out (when not NULL) gets the port bound. The socket is
 * non-blocking and close-on-exec, and never fd 0 (where stdin was closed,
 * it moves above the standard streams: 0 means "no socket" to its users).
 * Returns the socket; -1 when the host does not resolve ("'HOST': cannot
 * resolve: ..."), -2 when no address binds ("cannot listen on ADDR: ...",
 * ADDR the last one tried), with `what` (NULL: none) before HOST and, for a
 * name, after ADDR ("cannot listen on 127.0.0.1:80 (--host localhost): ..."). */
int net_listen(const char *host, int port, int flags, const char *what, int *port_out, struct kiln_error *err);

#endif
