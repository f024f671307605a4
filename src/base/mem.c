#include "base/mem.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    KILN_ASSERT_MSG(p, "out of memory");
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    KILN_ASSERT_MSG(p, "out of memory");
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    KILN_ASSERT_MSG(q, "out of memory");
    return q;
}

char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

char *xstrndup(const char *s, size_t n) {
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void *xaligned_alloc(size_t n) {
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    KILN_ASSERT_MSG(p, "out of memory");
    memset(p, 0, sz ? sz : 64);
    return p;
}

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
