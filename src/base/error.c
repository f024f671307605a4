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
    err->code = KILN_ERR_BAD_INPUT;
    return -1;
}

int kiln_errorc(struct kiln_error *err, enum kiln_error_code code, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    return -1;
}

const char *kiln_error_code_name(enum kiln_error_code code) {
    static const char *names[] = {"none",        "bad_input",   "not_found",     "unsupported",
                                  "too_large",   "overloaded",  "unavailable",   "out_of_memory",
                                  "io",          "internal"};
    return (unsigned)code < sizeof names / sizeof names[0] ? names[code] : "unknown";
}

int kiln_error_prefix(struct kiln_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[KILN_ERROR_MAX], old[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t a = strlen(prefix), b = strlen(old);
    if (a + 2 >= sizeof err->msg) a = sizeof err->msg - 3;
    if (a + 2 + b >= sizeof err->msg) b = sizeof err->msg - a - 3;
    memcpy(err->msg, prefix, a);
    memcpy(err->msg + a, ": ", 2);
    memcpy(err->msg + a + 2, old, b);
    err->msg[a + 2 + b] = 0;
    return -1;
}

void kiln_assert_fail(const char *expr, const char *file, int line, const char *msg) {
    fprintf(stderr, "kiln: assertion failed at %s:%d: %s%s%s\n", file, line, expr,
            msg ? " — " : "", msg ? msg : "");
    fflush(stderr);
    abort();
}
