/* verify_routing.h — `kiln verify --routing-check`: the experts a device
 * chooses, layer by layer, against a CPU runner's on the same batches
 * (verify_routing.c says how a choice may differ). */
#ifndef KILN_CLI_VERIFY_ROUTING_H
#define KILN_CLI_VERIFY_ROUTING_H

#include "base/error.h"
#include "model/model.h"
#include "tensor/backend.h"

struct verify_routing;

/* A step's row: its sequence and position. */
struct vr_row {
    int seq, pos;
};

/* cpu: the reference runner's backend (fp32 products); n_seqs: the
 * reference's sequences. */
struct verify_routing *vr_create(struct backend *cpu, int n_seqs);
void vr_free(struct verify_routing *vr);

/* The traces to give the device's model and the CPU runner's model
 * (model_set_route_trace). */
struct model_route_trace vr_trace_device(struct verify_routing *vr);
struct model_route_trace vr_trace_cpu(struct verify_routing *vr);

/* Before a step's two forwards: forgets the last step's traces. */
void vr_step_begin(struct verify_routing *vr);
/* After both forwards of a step of n rows: compares each MoE layer's
 * choices; -1 (err says where) when the device's choice differs and the
 * CPU's routing on the device's own router logits does not make it too. */
int vr_step_compare(struct verify_routing *vr, const struct vr_row *rows, long n, struct kiln_error *err);
/* Whether a row's logits follow a flipped choice (not compared). */
int vr_excluded(const struct verify_routing *vr, int seq, int pos);

/* A mode starts (every sequence from position 0) and ends: its line
 * "routing choices=... flips=... router_max_abs_err=...". */
void vr_mode_begin(struct verify_routing *vr);
void vr_mode_end(struct verify_routing *vr, const char *mode, long rows_excluded);
/* The largest router-logit difference of every mode. */
double vr_router_err(const struct verify_routing *vr);

#endif
