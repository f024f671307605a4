#include "cli/listen.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/net.h"

int cli_listen(const char *host, int port, struct kiln_error *err) {
    char name[256];
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') host++, hl -= 2; /* "[::1]" as in a URL */
    if (hl == 0 || hl >= sizeof name) return kiln_errorf(err, "--host: '%s' is not a host name or address", host), -1;
    memcpy(name, host, hl);
    name[hl] = 0;
    return net_listen(name, port, NET_IPV4_FIRST, "--host", NULL, err);
}
