/* registry.c — choosing a backend by name. */
#include "backend/registry.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

const char *backend_default_name(void) { return knob_str(KNOB_DEVICE); }

int backend_create(struct backend *be, const char *name, const struct backend_options *opt,
                   struct kiln_error *err) {
    be->ops = NULL;
    be->ctx = NULL;
    /* the backends read knobs: a bad one fails here, named, not later */
    if (knob_init(err)) return -1;
    if (!name || !strcmp(name, "auto")) {
#ifdef KILN_HAVE_CUDA
        struct kiln_error why;
        if (cuda_backend_create(be, opt, &why) == 0) return 0;
        log_info("device auto: %s; using the CPU", why.msg);
#else
        log_info("device auto: this kiln was built without CUDA; using the CPU");
#endif
        return cpu_backend_create(be, opt, err);
    }
    if (!strcmp(name, "cpu")) return cpu_backend_create(be, opt, err);
    if (!strcmp(name, "cuda")) {
#ifdef KILN_HAVE_CUDA
        return cuda_backend_create(be, opt, err);
#else
        return kiln_errorf(err, "--device cuda: this kiln was built without CUDA");
#endif
    }
    return kiln_errorf(err, "unknown device '%s' (expected cpu, cuda or auto)", name);
}
