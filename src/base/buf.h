/* buf.h — the growable byte buffer every module builds text in.
 *
 *   struct buf b = {0};             // empty; data is NULL until the first append
 *   buf_append(&b, "abc", 3);
 *   buf_printf(&b, " %d", 42);
 *   use(b.data, b.len);             // data[len] is always 0 once anything was appended
 *   buf_free(&b);                   // or char *s = buf_take(&b), which empties b
 *
 * Growth at least doubles the capacity, so appending n bytes costs O(n)
 * amortized; a reserve of a known size allocates that size, not the next
 * power of two. Out of memory aborts (see mem.h): buffers hold internal
 * text whose size callers bound.
 *
 * Bytes that come from a reader (fread, a socket) go straight into the
 * buffer: p = buf_grow(&b, n) makes n more bytes to fill, buf_truncate
 * gives back the part the reader left unfilled. buf_consume drops bytes
 * from the front once they are used (a queue of text).
 */
#ifndef KILN_BASE_BUF_H
#define KILN_BASE_BUF_H

#include <stddef.h>
#include <stdint.h>

struct buf {
    char *data; /* [cap]; NUL-terminated at len once allocated */
    size_t len;
    size_t cap;
};

/* Makes room for `extra` more bytes (and the terminating NUL); data is
 * allocated and NUL-terminated afterwards even when extra is 0. */
void buf_reserve(struct buf *b, size_t extra);
void buf_append(struct buf *b, const void *p, size_t n);
/* Appends n bytes for the caller to fill and returns them (data[len] is 0
 * after them). */
char *buf_grow(struct buf *b, size_t n);
/* Shortens the text to its first len bytes (len <= b->len). */
void buf_truncate(struct buf *b, size_t len);
/* Drops the first n bytes (n <= b->len); the rest moves to the front. */
void buf_consume(struct buf *b, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends the UTF-8 encoding of `cp`. */
void buf_push_cp(struct buf *b, uint32_t cp);
void buf_free(struct buf *b);
/* The text as a malloc'd string ("" when empty); b is left empty. */
char *buf_take(struct buf *b);

static inline void buf_push(struct buf *b, char c) {
    if (b->len + 2 > b->cap) buf_reserve(b, 1);
    b->data[b->len++] = c;
    b->data[b->len] = 0;
}
/* Empties b and keeps its memory. */
static inline void buf_clear(struct buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

/* Little-endian integers for wire formats (dist/wire.c, runner/ctrl_msg.c):
 * buf_put_le* append, le_get* read from at least 2, 4 or 8 bytes. */
static inline void buf_put_le16(struct buf *b, uint32_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    buf_append(b, x, 2);
}
static inline void buf_put_le32(struct buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    buf_append(b, x, 4);
}
static inline void buf_put_le64(struct buf *b, uint64_t v) {
    buf_put_le32(b, (uint32_t)v);
    buf_put_le32(b, (uint32_t)(v >> 32));
}
static inline uint32_t le_get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t le_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le_get64(const uint8_t *p) { return (uint64_t)le_get32(p) | (uint64_t)le_get32(p + 4) << 32; }

#endif
