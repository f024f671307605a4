/* buf.c — the growable byte buffer. */
#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "base/utf8.h"

void buf_reserve(struct buf *b, size_t extra) {
    KILN_ASSERT(b->len + extra + 1 > b->len);
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? (b->cap <= SIZE_MAX / 2 ? b->cap * 2 : SIZE_MAX) : 64;
    if (cap < need) cap = need;
    b->data = xrealloc(b->data, cap);
    b->data[b->len] = 0;
    b->cap = cap;
}

void buf_append(struct buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

char *buf_grow(struct buf *b, size_t n) {
    buf_reserve(b, n);
    char *p = b->data + b->len;
    b->len += n;
    b->data[b->len] = 0;
    return p;
}

void buf_truncate(struct buf *b, size_t len) {
    KILN_ASSERT(len <= b->len);
    b->len = len;
    if (b->data) b->data[len] = 0;
}

void buf_consume(struct buf *b, size_t n) {
    KILN_ASSERT(n <= b->len);
    if (!n) return;
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void buf_puts(struct buf *b, const char *s) { buf_append(b, s, strlen(s)); }

void buf_printf(struct buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        buf_append(b, tmp, (size_t)n);
        return;
    }
    buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void buf_push_cp(struct buf *b, uint32_t cp) {
    char tmp[4];
    buf_append(b, tmp, utf8_encode(cp, tmp));
}

void buf_free(struct buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *buf_take(struct buf *b) {
    char *s = b->data ? b->data : xcalloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    return s;
}
