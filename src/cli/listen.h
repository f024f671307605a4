/* listen.h — the listening socket of `kiln serve`, bound before the model
 * loads so that a port in use or a bad --host fails at once, not minutes
 * later; the server then takes the socket over (server_options.listen_fd).
 */
#ifndef KILN_CLI_LISTEN_H
#define KILN_CLI_LISTEN_H

#include <stddef.h>

struct kiln_error;

/* Resolves host (a name such as "localhost", an IPv4 address, or an IPv6
 * address with or without brackets) and binds the first of its addresses
 * that binds, IPv4 ones first (as uvicorn, SGLang's server, takes a name),
 * then listens (base/net.h's net_listen). Port 0 picks a free port.
 * Returns the socket (non-blocking, close-on-exec, never fd 0), -1 when
 * the host does not resolve, -2 when no address binds; the reason is in
 * err. */
int cli_listen(const char *host, int port, struct kiln_error *err);

#endif
