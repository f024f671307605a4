/* wire.h — the rendezvous messages of kiln's multi-rank start-up, as bytes.
 *
 * Pure encoding and parsing, no sockets (dist/rendezvous.c moves the bytes;
 * tests/fuzz/fuzz_rendezvous.c feeds the parser arbitrary input). Every
 * message is a 12-byte header followed by a body; integers are
 * little-endian whatever the host:
 *
 *   header  u32 magic 0x5652444b ("KDRV") | u16 version (1) | u16 type
 *           | u32 body length (at most DIST_WIRE_BODY_MAX)
 *   HELLO   u32 rank | u32 world size | u16 n | n bytes: the rank's mesh
 *           address "HOST:PORT" (rank -> rank 0)
 *   TABLE   u32 world size | u64 session | u32 n | n bytes: the blob
 *           (NCCL's unique id) | world size x (u16 n | n bytes: address)
 *           (rank 0 -> every rank)
 *   ERROR   u16 n | n bytes: why rank 0 refused the start (rank 0 -> rank)
 *   GREET   u32 rank | u32 world size | u64 session (the opening of every
 *           mesh connection, higher rank -> lower rank)
 *
 * Addresses and error texts are printable ASCII (0x20..0x7e), 1 to
 * DIST_ADDR_MAX - 1 bytes; the body has no trailing bytes. A parsed message
 * is exactly the bytes its encoder writes (the fuzz target checks the round
 * trip).
 */
#ifndef KILN_DIST_WIRE_H
#define KILN_DIST_WIRE_H

#include <stddef.h>
#include <stdint.h>

struct buf;
struct kiln_error;

#define DIST_WIRE_MAGIC 0x5652444bu
#define DIST_WIRE_VERSION 1
#define DIST_WIRE_HEADER 12
#define DIST_WIRE_BODY_MAX (1u << 24)
#define DIST_ADDR_MAX 272  /* "[" IPv6 or a host name "]:" port, NUL */
#define DIST_BLOB_MAX 4096 /* NCCL's unique id is 128 bytes */
#define DIST_WORLD_MAX 4096
#define DIST_TEXT_MAX 1024

enum dist_msg_type { DIST_MSG_HELLO = 1, DIST_MSG_TABLE = 2, DIST_MSG_ERROR = 3, DIST_MSG_GREET = 4 };

/* A parsed message; only the fields of its type are set. addr (TABLE) is
 * malloc'd by the parser: free with dist_msg_free. */
struct dist_msg {
    enum dist_msg_type type;
    uint32_t rank, world_size;      /* HELLO, GREET (world_size also TABLE) */
    uint64_t session;               /* TABLE, GREET */
    char addr_one[DIST_ADDR_MAX];   /* HELLO: the sender's mesh address */
    char (*addr)[DIST_ADDR_MAX];    /* TABLE: [world_size] */
    uint8_t blob[DIST_BLOB_MAX];    /* TABLE */
    size_t blob_len;
    char text[DIST_TEXT_MAX];       /* ERROR */
};

/* Checks a header: magic, version, a known type, a body length within the
 * limit. Returns the body length, or -1 with a message in err. */
long dist_wire_header(const uint8_t *hdr, enum dist_msg_type *type, struct kiln_error *err);

/* Parses one whole message (header and body, exactly len bytes) into m.
 * Returns 0, or -1 with a message in err (m then owns nothing). */
int dist_wire_parse(const uint8_t *data, size_t len, struct dist_msg *m, struct kiln_error *err);
void dist_msg_free(struct dist_msg *m);

/* Encoders append one whole message to out. Strings and sizes must be
 * within the limits above (asserted: callers pass their own values). */
void dist_wire_hello(struct buf *out, uint32_t rank, uint32_t world_size, const char *addr);
void dist_wire_table(struct buf *out, uint32_t world_size, uint64_t session, const void *blob, size_t blob_len,
                     const char (*addr)[DIST_ADDR_MAX]);
void dist_wire_error(struct buf *out, const char *text);
void dist_wire_greet(struct buf *out, uint32_t rank, uint32_t world_size, uint64_t session);

#endif
