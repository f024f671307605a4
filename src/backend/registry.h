/* registry.h — the backends by name: the one place that knows every device
 * folder (backend/cpu, backend/cuda) and chooses among them. It sits above
 * them and above tensor/backend.h, whose interface they implement, so the
 * interface layer never depends on an implementation.
 *
 *   struct backend be;
 *   if (backend_create(&be, backend_default_name(), &opt, &err)) ...;
 *   ... be.ops->matmul(be.ctx, ...) ...
 *   backend_destroy(&be);
 */
#ifndef KILN_BACKEND_REGISTRY_H
#define KILN_BACKEND_REGISTRY_H

#include "tensor/backend.h"

struct kiln_error;

/* The device commands use when none is given: $KILN_DEVICE, else "auto"
 * (the GPU when one can be opened, else the CPU). */
const char *backend_default_name(void);
/* Creates a backend by name ("cpu", "cuda"); "auto" takes the first that
 * works. Returns 0, or -1 with err set. */
int backend_create(struct backend *be, const char *name, const struct backend_options *opt,
                   struct kiln_error *err);

#endif
