#include "dist/wire.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"


static int printable(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e) return 0;
    return 1;
}

/* Starts a message; returns the offset of its length field. */
static size_t begin(struct buf *b, enum dist_msg_type type) {
    buf_put_le32(b, DIST_WIRE_MAGIC);
    buf_put_le16(b, DIST_WIRE_VERSION);
    buf_put_le16(b, (uint32_t)type);
    size_t at = b->len;
    buf_put_le32(b, 0);
    return at;
}
static void end(struct buf *b, size_t at) {
    size_t body = b->len - at - 4;
    KILN_ASSERT(body <= DIST_WIRE_BODY_MAX);
    uint8_t *p = (uint8_t *)b->data + at;
    p[0] = (uint8_t)body, p[1] = (uint8_t)(body >> 8), p[2] = (uint8_t)(body >> 16), p[3] = (uint8_t)(body >> 24);
}
static void put_str(struct buf *b, const char *s) {
    size_t n = strlen(s);
    KILN_ASSERT(n >= 1 && n < DIST_ADDR_MAX && printable((const uint8_t *)s, n));
    buf_put_le16(b, (uint32_t)n);
    buf_append(b, s, n);
}

void dist_wire_hello(struct buf *out, uint32_t rank, uint32_t world_size, const char *addr) {
    size_t at = begin(out, DIST_MSG_HELLO);
    buf_put_le32(out, rank);
    buf_put_le32(out, world_size);
    put_str(out, addr);
    end(out, at);
}

void dist_wire_table(struct buf *out, uint32_t world_size, uint64_t session, const void *blob, size_t blob_len,
                     const char (*addr)[DIST_ADDR_MAX]) {
    KILN_ASSERT(world_size >= 1 && world_size <= DIST_WORLD_MAX && blob_len <= DIST_BLOB_MAX);
    size_t at = begin(out, DIST_MSG_TABLE);
    buf_put_le32(out, world_size);
    buf_put_le64(out, session);
    buf_put_le32(out, (uint32_t)blob_len);
    if (blob_len) buf_append(out, blob, blob_len);
    for (uint32_t i = 0; i < world_size; i++) put_str(out, addr[i]);
    end(out, at);
}

void dist_wire_error(struct buf *out, const char *text) {
    char t[DIST_TEXT_MAX];
    size_t n = 0;
    for (; text[n] && n < sizeof t - 1; n++) t[n] = text[n] >= 0x20 && text[n] <= 0x7e ? text[n] : '?';
    if (n == 0) t[n++] = '?';
    t[n] = 0;
    size_t at = begin(out, DIST_MSG_ERROR);
    buf_put_le16(out, (uint32_t)n);
    buf_append(out, t, n);
    end(out, at);
}

void dist_wire_greet(struct buf *out, uint32_t rank, uint32_t world_size, uint64_t session) {
    size_t at = begin(out, DIST_MSG_GREET);
    buf_put_le32(out, rank);
    buf_put_le32(out, world_size);
    buf_put_le64(out, session);
    end(out, at);
}

long dist_wire_header(const uint8_t *hdr, enum dist_msg_type *type, struct kiln_error *err) {
    uint32_t magic = le_get32(hdr), version = le_get16(hdr + 4), t = le_get16(hdr + 6), len = le_get32(hdr + 8);
    if (magic != DIST_WIRE_MAGIC)
        return kiln_errorf(err, "not a kiln rendezvous message (magic %08x, want %08x)", magic, DIST_WIRE_MAGIC);
    if (version != DIST_WIRE_VERSION)
        return kiln_errorf(err, "rendezvous protocol version %u, this build speaks %u (mixed kiln versions?)",
                           version, DIST_WIRE_VERSION);
    if (t < DIST_MSG_HELLO || t > DIST_MSG_GREET) return kiln_errorf(err, "unknown rendezvous message type %u", t);
    if (len > DIST_WIRE_BODY_MAX)
        return kiln_errorf(err, "rendezvous message of %u bytes (at most %u)", len, DIST_WIRE_BODY_MAX);
    *type = (enum dist_msg_type)t;
    return (long)len;
}

/* A reader over the body: every take checks the bytes are there. */
struct rd {
    const uint8_t *p;
    size_t left;
};
static const uint8_t *take(struct rd *r, size_t n) {
    if (r->left < n) return NULL;
    const uint8_t *p = r->p;
    r->p += n, r->left -= n;
    return p;
}
static int take_str(struct rd *r, char *dst, size_t max, const char *what, struct kiln_error *err) {
    const uint8_t *p = take(r, 2);
    if (!p) return kiln_errorf(err, "rendezvous message cut short in %s", what);
    size_t n = le_get16(p);
    if (n == 0 || n >= max) return kiln_errorf(err, "%s of %zu bytes (1 to %zu)", what, n, max - 1);
    if (!(p = take(r, n))) return kiln_errorf(err, "rendezvous message cut short in %s", what);
    if (!printable(p, n)) return kiln_errorf(err, "%s is not printable ASCII", what);
    memcpy(dst, p, n);
    dst[n] = 0;
    return 0;
}

int dist_wire_parse(const uint8_t *data, size_t len, struct dist_msg *m, struct kiln_error *err) {
    memset(m, 0, sizeof *m);
    if (len < DIST_WIRE_HEADER) return kiln_errorf(err, "rendezvous message of %zu bytes, shorter than its header", len);
    enum dist_msg_type type = DIST_MSG_HELLO;
    long body = dist_wire_header(data, &type, err);
    if (body < 0) return -1;
    if ((size_t)body != len - DIST_WIRE_HEADER)
        return kiln_errorf(err, "rendezvous message says %ld body bytes, has %zu", body, len - DIST_WIRE_HEADER);
    struct rd r = {data + DIST_WIRE_HEADER, (size_t)body};
    const uint8_t *p;
    m->type = type;
    switch (type) {
    case DIST_MSG_HELLO:
    case DIST_MSG_GREET:
        if (!(p = take(&r, 8))) return kiln_errorf(err, "rendezvous message cut short in its rank");
        m->rank = le_get32(p), m->world_size = le_get32(p + 4);
        if (m->world_size < 1 || m->world_size > DIST_WORLD_MAX)
            return kiln_errorf(err, "world size %u (1 to %d)", m->world_size, DIST_WORLD_MAX);
        if (type == DIST_MSG_HELLO) {
            if (take_str(&r, m->addr_one, DIST_ADDR_MAX, "mesh address", err)) return -1;
        } else {
            if (!(p = take(&r, 8))) return kiln_errorf(err, "rendezvous message cut short in its session");
            m->session = le_get64(p);
        }
        break;
    case DIST_MSG_TABLE: {
        if (!(p = take(&r, 16))) return kiln_errorf(err, "rendezvous table cut short in its header");
        m->world_size = le_get32(p), m->session = le_get64(p + 4);
        size_t bl = le_get32(p + 12);
        if (m->world_size < 1 || m->world_size > DIST_WORLD_MAX)
            return kiln_errorf(err, "world size %u (1 to %d)", m->world_size, DIST_WORLD_MAX);
        if (bl > DIST_BLOB_MAX) return kiln_errorf(err, "blob of %zu bytes (at most %d)", bl, DIST_BLOB_MAX);
        if (!(p = take(&r, bl))) return kiln_errorf(err, "rendezvous table cut short in its blob");
        if (bl) memcpy(m->blob, p, bl);
        m->blob_len = bl;
        /* every address takes at least 3 bytes: refuse a world the body cannot hold before allocating */
        if (r.left / 3 < m->world_size)
            return kiln_errorf(err, "rendezvous table of %u ranks has %zu bytes of addresses", m->world_size, r.left);
        m->addr = xcalloc(m->world_size, sizeof *m->addr);
        for (uint32_t i = 0; i < m->world_size; i++)
            if (take_str(&r, m->addr[i], DIST_ADDR_MAX, "mesh address", err)) {
                kiln_error_prefix(err, "rank %u", i);
                dist_msg_free(m);
                return -1;
            }
        break;
    }
    case DIST_MSG_ERROR:
        if (take_str(&r, m->text, DIST_TEXT_MAX, "error text", err)) return -1;
        break;
    }
    if (r.left) {
        dist_msg_free(m);
        return kiln_errorf(err, "rendezvous message has %zu bytes after its end", r.left);
    }
    return 0;
}

void dist_msg_free(struct dist_msg *m) {
    free(m->addr);
    m->addr = NULL;
}
