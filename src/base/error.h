/* error.h — the two error channels of kiln.
 *
 * 1. Input from users, files and the network: functions return 0 on success
 *    and -1 on failure, after writing a message a person can act on into a
 *    caller-owned `struct kiln_error` (which file, which field, what was
 *    expected). `kiln_errorf` formats it and returns -1 so a failing path can
 *    say `return kiln_errorf(err, "...")`. A NULL `err` is allowed.
 * 2. Broken invariants (bugs): KILN_ASSERT aborts with file:line, always on,
 *    also in release builds. Library code never calls exit().
 */
#ifndef KILN_BASE_ERROR_H
#define KILN_BASE_ERROR_H

#include <stddef.h>

#define KILN_ERROR_MAX 1024

struct kiln_error {
    char msg[KILN_ERROR_MAX];
};

/* Writes the message and returns -1. */
int kiln_errorf(struct kiln_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (adds context on the way up). */
int kiln_error_prefix(struct kiln_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

_Noreturn void kiln_assert_fail(const char *expr, const char *file, int line, const char *msg);

#define KILN_ASSERT(cond)                                                     \
    do {                                                                      \
        if (!(cond)) kiln_assert_fail(#cond, __FILE__, __LINE__, NULL);       \
    } while (0)
#define KILN_ASSERT_MSG(cond, msg)                                            \
    do {                                                                      \
        if (!(cond)) kiln_assert_fail(#cond, __FILE__, __LINE__, (msg));      \
    } while (0)

#endif
