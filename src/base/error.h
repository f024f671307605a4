/* error.h — the two error channels of kiln.
 *
 * 1. Input from users, files and the network: functions return 0 on success
 *    and -1 on failure, after writing a message a person can act on into a
 *    caller-owned `struct kiln_error` (which file, which field, what was
 *    expected) and a code saying what kind of failure it is. `kiln_errorf`
 *    formats the message with the code KILN_ERR_BAD_INPUT and returns -1 so a
 *    failing path can say `return kiln_errorf(err, "...")`; `kiln_errorc`
 *    names another code. A NULL `err` is allowed.
 *    Decisions about an error (an HTTP status, whether to retry, whether a
 *    failed step may go on) switch on `code`, never on the message text: the
 *    message is for people and may be reworded or prefixed freely.
 * 2. Broken invariants (bugs): KILN_ASSERT aborts with file:line, always on,
 *    also in release builds. Library code never calls exit().
 */
#ifndef KILN_BASE_ERROR_H
#define KILN_BASE_ERROR_H

#include <stddef.h>

#define KILN_ERROR_MAX 1024

enum kiln_error_code {
    KILN_ERR_NONE = 0,      /* no error recorded */
    KILN_ERR_BAD_INPUT,     /* the input is wrong: a field, a value, a file's content */
    KILN_ERR_NOT_FOUND,     /* a named thing (file, model, route, id) does not exist */
    KILN_ERR_UNSUPPORTED,   /* valid, but this build, device or model does not do it */
    KILN_ERR_TOO_LARGE,     /* larger than a fixed limit (context length, KV cache) */
    KILN_ERR_OVERLOADED,    /* a temporary limit (queue full): the same input may work later */
    KILN_ERR_UNAVAILABLE,   /* not serving any more (shutting down) */
    KILN_ERR_OUT_OF_MEMORY, /* an allocation failed (device memory, most often) */
    KILN_ERR_IO,            /* the system failed us: a read, a socket, a thread */
    KILN_ERR_INTERNAL,      /* a failure that is no one's input: a bug or a device fault */
};

struct kiln_error {
    char msg[KILN_ERROR_MAX];
    enum kiln_error_code code;
};

/* Writes the message with code KILN_ERR_BAD_INPUT and returns -1. */
int kiln_errorf(struct kiln_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Writes the message with the given code and returns -1. */
int kiln_errorc(struct kiln_error *err, enum kiln_error_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (adds context on the way up);
 * the code stays. */
int kiln_error_prefix(struct kiln_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "bad_input", "not_found", ... (stable names, for logs and metrics). */
const char *kiln_error_code_name(enum kiln_error_code code);

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
