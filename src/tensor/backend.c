/* backend.c — the backend interface's shared helpers (creating one by name
 * is backend/registry.c, above the implementations). */
#include "tensor/backend.h"

#include "base/knob.h"

void backend_destroy(struct backend *be) {
    if (be && be->ops) be->ops->destroy(be->ctx);
    if (be) {
        be->ops = NULL;
        be->ctx = NULL;
    }
}

long backend_moe_chunk_rows(void) {
    long t = knob_int(KNOB_TEST_MOE_CHUNK_ROWS);
    return t > 0 ? t : BACKEND_MOE_CHUNK_ROWS;
}

long backend_moe_chunk_tokens(int top_k) {
    long t = backend_moe_chunk_rows() / (top_k > 0 ? top_k : 1);
    return t > 0 ? t : 1;
}
