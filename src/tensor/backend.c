/* backend.c — the backend interface's shared helpers (creating one by name
 * is backend/registry.c, above the implementations). */
#include "tensor/backend.h"

void backend_destroy(struct backend *be) {
    if (be && be->ops) be->ops->destroy(be->ctx);
    if (be) {
        be->ops = NULL;
        be->ctx = NULL;
    }
}
