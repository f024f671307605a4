#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_errorf(struct kiln_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int kiln_error_prefix(struct kiln_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[KILN_ERROR_MAX], old[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return -1;
}

void kiln_assert_fail(const char *expr, const char *file, int line, const char *msg) {
    fprintf(stderr, "kiln: assertion failed at %s:%d: %s%s%s\n", file, line, expr,
            msg ? " — " : "", msg ? msg : "");
    fflush(stderr);
    abort();
}
