#include "dist/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/mem.h"
#include "base/net.h"

int dist_addr_split(const char *hp, char *host, size_t host_n, int *port, struct kiln_error *err) {
    const char *colon, *h = hp;
    size_t hl;
    if (hp[0] == '[') {
        const char *close = strchr(hp, ']');
        if (!close || close[1] != ':') return kiln_errorf(err, "'%s' is not [IPv6]:PORT", hp);
        h = hp + 1, hl = (size_t)(close - h), colon = close + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon) return kiln_errorf(err, "'%s' is not HOST:PORT", hp);
        if (memchr(hp, ':', (size_t)(colon - hp)))
            return kiln_errorf(err, "'%s': an IPv6 address needs brackets, as in [::1]:PORT", hp);
        hl = (size_t)(colon - hp);
    }
    if (hl == 0 || hl >= host_n) return kiln_errorf(err, "'%s': empty or too long a host", hp);
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || p < 0 || p > 65535) return kiln_errorf(err, "'%s': port is not 0..65535", hp);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
}

int dist_sock_setup(int fd, struct kiln_error *err) {
    int one = 1, fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return kiln_errorc(err, KILN_ERR_IO, "socket: cannot make it non-blocking: %s", strerror(errno));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails only on non-TCP sockets */
    return 0;
}

static struct addrinfo *resolve(const char *hp, int passive, struct kiln_error *err) {
    char host[256];
    int port = 0;
    if (dist_addr_split(hp, host, sizeof host, &port, err)) return NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g || !res) {
        kiln_errorc(err, KILN_ERR_IO, "'%s': cannot resolve: %s", hp, g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return NULL;
    }
    return res;
}

int dist_listen(const char *host_port, int *port_out, struct kiln_error *err) {
    char host[256];
    int port = 0;
    if (dist_addr_split(host_port, host, sizeof host, &port, err)) return -1;
    int fd = net_listen(host, port, 0, NULL, port_out, err);
    return fd < 0 ? -1 : fd;
}

/* Waits for events on fd until the deadline: 1 ready, 0 deadline passed, -1 error. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - time_now();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 3600 ? 3600000 : (int)ceil(left * 1000);
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

int dist_connect(const char *host_port, double deadline, struct kiln_error *err) {
    const char *why = "timed out";
    char whybuf[KILN_ERROR_MAX];
    for (;;) {
        struct addrinfo *res = resolve(host_port, 0, err);
        if (res) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
                if (s < 0) continue;
                int r = connect(s, ai->ai_addr, ai->ai_addrlen), e = r ? errno : 0;
                if (r && e == EINPROGRESS) {
                    int w = wait_fd(s, POLLOUT, deadline);
                    socklen_t el = sizeof e;
                    if (w == 1) getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el);
                    else e = w == 0 ? ETIMEDOUT : errno;
                }
                if (!e && dist_sock_setup(s, err) == 0) {
                    freeaddrinfo(res);
                    return s;
                }
                snprintf(whybuf, sizeof whybuf, "%s", strerror(e));
                why = whybuf;
                close(s);
            }
            freeaddrinfo(res);
        } else {
            snprintf(whybuf, sizeof whybuf, "%.200s", err ? err->msg : "cannot resolve");
            why = whybuf;
        }
        if (time_now() + 0.05 >= deadline) break;
        sleep_ms(50);
    }
    return kiln_errorc(err, KILN_ERR_IO, "cannot connect to %s before the deadline: %s", host_port, why);
}

int dist_accept(int lfd, double deadline, struct kiln_error *err) {
    for (;;) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w == 0) return kiln_errorc(err, KILN_ERR_IO, "no connection came before the deadline");
        if (w < 0) return kiln_errorc(err, KILN_ERR_IO, "poll: %s", strerror(errno));
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            if (dist_sock_setup(fd, err)) {
                close(fd);
                return -1;
            }
            return fd;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return kiln_errorc(err, KILN_ERR_IO, "accept: %s", strerror(errno));
    }
}

static int io_all(int fd, void *p, size_t n, double deadline, int is_send, const char *who, struct kiln_error *err) {
    char *c = p;
    while (n) {
        ssize_t k = is_send ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (k > 0) {
            c += k, n -= (size_t)k;
            continue;
        }
        if (k == 0) return kiln_errorc(err, KILN_ERR_IO, "%s closed the connection", who);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return kiln_errorc(err, KILN_ERR_IO, "%s: connection lost: %s", who, strerror(errno));
        int w = wait_fd(fd, is_send ? POLLOUT : POLLIN, deadline);
        if (w == 0) return kiln_errorc(err, KILN_ERR_IO, "%s did not %s before the deadline", who, is_send ? "take our bytes" : "answer");
        if (w < 0) return kiln_errorc(err, KILN_ERR_IO, "poll: %s", strerror(errno));
    }
    return 0;
}

int dist_send_all(int fd, const void *p, size_t n, double deadline, const char *who, struct kiln_error *err) {
    return io_all(fd, (void *)p, n, deadline, 1, who, err);
}
int dist_recv_all(int fd, void *p, size_t n, double deadline, const char *who, struct kiln_error *err) {
    return io_all(fd, p, n, deadline, 0, who, err);
}
