/* fuzz_rendezvous.c — arbitrary bytes as a rendezvous message
 * (dist/wire.h): parsed or refused, never read past its end, and a parsed
 * message encodes back to exactly the same bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "dist/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct dist_msg m;
    struct kiln_error err;
    if (size >= DIST_WIRE_HEADER) {
        enum dist_msg_type t;
        long body = dist_wire_header(data, &t, &err);
        KILN_ASSERT(body >= -1 && body <= (long)DIST_WIRE_BODY_MAX);
    }
    if (dist_wire_parse(data, size, &m, &err)) return 0;
    struct buf b = {0};
    switch (m.type) {
    case DIST_MSG_HELLO: dist_wire_hello(&b, m.rank, m.world_size, m.addr_one); break;
    case DIST_MSG_TABLE:
        dist_wire_table(&b, m.world_size, m.session, m.blob, m.blob_len, (const char(*)[DIST_ADDR_MAX])m.addr);
        break;
    case DIST_MSG_ERROR: dist_wire_error(&b, m.text); break;
    case DIST_MSG_GREET: dist_wire_greet(&b, m.rank, m.world_size, m.session); break;
    }
    KILN_ASSERT(b.len == size && memcmp(b.data, data, size) == 0);
    buf_free(&b);
    dist_msg_free(&m);
    return 0;
}
