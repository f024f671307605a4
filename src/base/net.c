#include "base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"

void net_addr_text(const struct sockaddr *sa, char *buf, size_t n) {
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(buf, n, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(buf, n, "%s:%d", ip, ntohs(a->sin_port));
    }
}

/* A socket that came out as fd 0 (stdin closed) moves above the standard
 * streams; -1 with errno when it cannot. */
static int off_stdin(int fd) {
    if (fd != 0) return fd;
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 3), e = errno;
    close(fd);
    errno = e;
    return d;
}

int net_listen(const char *host, int port, int flags, const char *what, int *port_out, struct kiln_error *err) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g || !res) {
        kiln_errorc(err, KILN_ERR_IO, "%s%s'%s': cannot resolve: %s", what ? what : "", what ? " " : "", host,
                    g == EAI_SYSTEM ? strerror(errno) : g ? gai_strerror(g) : "no address");
        if (res) freeaddrinfo(res);
        return -1;
    }
    int fd = -1, last_errno = 0;
    char where[INET6_ADDRSTRLEN + 16] = "";
    for (int pass = 0; pass < 2 && fd < 0; pass++) { /* with NET_IPV4_FIRST: IPv4 addresses, then the others */
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if ((flags & NET_IPV4_FIRST) ? (ai->ai_family == AF_INET) != (pass == 0) : pass > 0) continue;
            net_addr_text(ai->ai_addr, where, sizeof where);
            int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
            if (s < 0 || (s = off_stdin(s)) < 0) {
                last_errno = errno;
                continue;
            }
            int one = 1;
            setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, 1024)) {
                last_errno = errno;
                close(s);
                continue;
            }
            fd = s;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        unsigned char bin[16];
        int literal = inet_pton(AF_INET, host, bin) == 1 || inet_pton(AF_INET6, host, bin) == 1 || !what;
        kiln_errorc(err, KILN_ERR_IO, "cannot listen on %s%s%s%s%s%s: %s", where, literal ? "" : " (",
                    literal ? "" : what, literal ? "" : " ", literal ? "" : host, literal ? "" : ")",
                    strerror(last_errno));
        return -2;
    }
    if (port_out) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        *port_out = port;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                       : ((struct sockaddr_in *)&ss)->sin_port);
    }
    return fd;
}
