#include "cli/listen.h"

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

static void addr_text(const struct sockaddr *sa, char *buf, size_t n) {
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

int cli_listen(const char *host, int port, struct kiln_error *err) {
    char name[256];
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') host++, hl -= 2; /* "[::1]" as in a URL */
    if (hl == 0 || hl >= sizeof name) return kiln_errorf(err, "--host: '%s' is not a host name or address", host), -1;
    memcpy(name, host, hl);
    name[hl] = 0;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(name, service, &hints, &res);
    if (g) {
        kiln_errorf(err, "--host '%s': cannot resolve: %s", name, g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1, last_errno = 0;
    char where[INET6_ADDRSTRLEN + 16] = "";
    for (int pass = 0; pass < 2 && fd < 0; pass++) { /* IPv4 addresses first */
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if ((ai->ai_family == AF_INET) != (pass == 0)) continue;
            addr_text(ai->ai_addr, where, sizeof where);
            int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
            if (s < 0) {
                last_errno = errno;
                continue;
            }
            int one = 1;
            /* a restarted server must not wait for TIME_WAIT connections */
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
    if (fd == 0) { /* stdin was closed: 0 means "no socket" to the server */
        int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        close(fd);
        fd = d;
        if (fd < 0) last_errno = errno;
    }
    if (fd < 0) {
        unsigned char bin[16];
        int literal = inet_pton(AF_INET, name, bin) == 1 || inet_pton(AF_INET6, name, bin) == 1;
        kiln_errorf(err, "cannot listen on %s%s%s%s: %s", where, literal ? "" : " (--host ", literal ? "" : name,
                    literal ? "" : ")", strerror(last_errno));
        return -2;
    }
    return fd;
}
