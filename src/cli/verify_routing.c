/* verify_routing.c — `kiln verify --routing-check` (verify_routing.h).
 *
 * A device's products round differently from the CPU's (bf16 activations,
 * another order of sums), so its router logits differ from the CPU's by
 * that rounding, and where two experts' scores are closer than it, the
 * device may choose the other one: a jump in the layer's output that no
 * logit tolerance bounds. So the check runs every batch on both, and for
 * each MoE layer and row compares the sets of routed experts chosen:
 *  - equal: the row goes on; its router logits must be within the
 *    tolerance of the CPU's;
 *  - different: the CPU's own routing operation runs on the device's router
 *    logits for that row. If it chooses what the device chose, the device
 *    routed correctly and the difference comes from the router logits'
 *    rounding alone, at a near tie (a flip); if not, the device's routing
 *    is wrong, and the check fails naming the layer, row and experts.
 * After a flip at layer l of the token at position p of a sequence, that
 * token's hidden state and, from layer l + 1 on, the keys and values the
 * sequence's later tokens read differ from the CPU's for a reason the
 * tolerance does not cover: those rows' later layers are not compared in
 * the step, and no row of the sequence from p on in later steps, nor their
 * logits (vr_excluded). The CPU runner's router logits and choices are the
 * reference (fp32 products: within 1e-3 of Hugging Face's, kiln verify on
 * the CPU). */
#include "cli/verify_routing.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

struct vr_rec {
    int layer, E, k;
    long n;
    float *logits;  /* [n][E] */
    int32_t *ids;   /* [n][k] */
    struct moe_route_params rp;
    const float *bias; /* the layer's correction bias (its backend's memory) */
};

struct vr_side {
    struct vr_rec *r;
    int n, cap;
};

struct verify_routing {
    struct backend *cpu;
    int n_seqs;
    struct vr_side dev, ref;
    int *taint;                  /* [n_seqs]: rows from this position on are not compared (INT_MAX: none) */
    int *step_pos, *step_layer;  /* [n_seqs]: this step's first flip */
    long choices, flips;         /* this mode's */
    double router_err;           /* this mode's largest router-logit difference */
    double router_err_all;
};

static void side_clear(struct vr_side *s) {
    for (int i = 0; i < s->n; i++) free(s->r[i].logits), free(s->r[i].ids);
    s->n = 0;
}

static void record(struct vr_side *s, int layer, long n, int E, int k, const float *logits, const int32_t *ids,
                   const struct moe_route_params *rp, const float *bias) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->r = xrealloc(s->r, (size_t)s->cap * sizeof *s->r);
    }
    struct vr_rec *r = &s->r[s->n++];
    r->layer = layer, r->E = E, r->k = k, r->n = n;
    r->logits = xmalloc((size_t)(n * E) * sizeof *logits);
    memcpy(r->logits, logits, (size_t)(n * E) * sizeof *logits);
    r->ids = xmalloc((size_t)(n * k) * sizeof *ids);
    memcpy(r->ids, ids, (size_t)(n * k) * sizeof *ids);
    r->rp = *rp;
    r->bias = bias;
}

static void on_dev(void *user, int layer, long n, int E, int k, const float *logits, const int32_t *ids,
                   const struct moe_route_params *rp, const float *bias) {
    record(&((struct verify_routing *)user)->dev, layer, n, E, k, logits, ids, rp, bias);
}

static void on_ref(void *user, int layer, long n, int E, int k, const float *logits, const int32_t *ids,
                   const struct moe_route_params *rp, const float *bias) {
    record(&((struct verify_routing *)user)->ref, layer, n, E, k, logits, ids, rp, bias);
}

struct verify_routing *vr_create(struct backend *cpu, int n_seqs) {
    struct verify_routing *vr = xcalloc(1, sizeof *vr);
    vr->cpu = cpu;
    vr->n_seqs = n_seqs;
    vr->taint = xmalloc((size_t)n_seqs * sizeof *vr->taint);
    vr->step_pos = xmalloc((size_t)n_seqs * sizeof *vr->step_pos);
    vr->step_layer = xmalloc((size_t)n_seqs * sizeof *vr->step_layer);
    for (int i = 0; i < n_seqs; i++) vr->step_pos[i] = INT_MAX;
    vr_mode_begin(vr);
    return vr;
}

void vr_free(struct verify_routing *vr) {
    if (!vr) return;
    side_clear(&vr->dev), side_clear(&vr->ref);
    free(vr->dev.r), free(vr->ref.r);
    free(vr->taint), free(vr->step_pos), free(vr->step_layer);
    free(vr);
}

struct model_route_trace vr_trace_device(struct verify_routing *vr) {
    return (struct model_route_trace){on_dev, vr};
}

struct model_route_trace vr_trace_cpu(struct verify_routing *vr) {
    return (struct model_route_trace){on_ref, vr};
}

void vr_step_begin(struct verify_routing *vr) {
    side_clear(&vr->dev);
    side_clear(&vr->ref);
}

/* ids[0 .. n) sorted into out (n small: insertion) */
static void sorted(const int32_t *ids, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        int32_t v = ids[i];
        int j = i;
        for (; j > 0 && out[j - 1] > v; j--) out[j] = out[j - 1];
        out[j] = v;
    }
}

static void put_set(char *buf, size_t cap, const int32_t *ids, int n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at + 16 < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? "," : "", ids[i]);
}

int vr_step_compare(struct verify_routing *vr, const struct vr_row *rows, long n, struct kiln_error *err) {
    if (vr->dev.n != vr->ref.n)
        return kiln_errorf(err, "routing check: the device routed %d MoE layers in a step, the CPU %d", vr->dev.n,
                           vr->ref.n);
    int rc = 0;
    for (int l = 0; l < vr->dev.n && !rc; l++) {
        const struct vr_rec *d = &vr->dev.r[l], *c = &vr->ref.r[l];
        if (d->layer != c->layer || d->n != n || c->n != n || d->E != c->E || d->k != c->k) {
            rc = kiln_errorf(err, "routing check: layer %d of the device's step against layer %d of the CPU's",
                             d->layer, c->layer);
            break;
        }
        const int E = d->E, k = d->k, top = c->rp.top_k;
        int32_t *ds = xmalloc((size_t)k * 4 * 4), *cs = ds + k, *rid = cs + k, *rs = rid + k;
        float *rw = xmalloc((size_t)k * sizeof *rw);
        for (long t = 0; t < n && !rc; t++) {
            const int s = rows[t].seq, p = rows[t].pos;
            if (p >= vr->taint[s] || (p >= vr->step_pos[s] && d->layer > vr->step_layer[s])) continue;
            const float *dl = d->logits + t * E, *cl = c->logits + t * E;
            for (int e = 0; e < E; e++) {
                double diff = fabs((double)dl[e] - (double)cl[e]);
                if (!(diff <= vr->router_err)) vr->router_err = isnan(diff) ? INFINITY : diff;
            }
            vr->choices++;
            sorted(d->ids + t * k, top, ds);
            sorted(c->ids + t * k, top, cs);
            if (!memcmp(ds, cs, (size_t)top * sizeof *ds)) continue;
            /* the CPU's routing on the device's router logits */
            struct moe_route_params rp = c->rp;
            rp.count = NULL, rp.uniform = 0, rp.key_slot = rp.key_pos = NULL;
            vr->cpu->ops->moe_route(vr->cpu->ctx, rid, rw, dl, c->bias, &rp, 1);
            sorted(rid, top, rs);
            if (memcmp(rs, ds, (size_t)top * sizeof *ds)) {
                char a[256], b[256], cc[256];
                put_set(a, sizeof a, ds, top), put_set(b, sizeof b, rs, top), put_set(cc, sizeof cc, cs, top);
                rc = kiln_errorf(err,
                                 "routing check: layer %d, sequence %d, position %d: the device chose experts {%s}, "
                                 "the CPU's routing on the device's router logits {%s} (on its own {%s})",
                                 d->layer, s, p, a, b, cc);
                break;
            }
            vr->flips++;
            if (p < vr->step_pos[s] || (p == vr->step_pos[s] && d->layer < vr->step_layer[s]))
                vr->step_pos[s] = p, vr->step_layer[s] = d->layer;
        }
        free(ds), free(rw);
    }
    for (int s = 0; s < vr->n_seqs; s++) {
        if (vr->step_pos[s] < vr->taint[s]) vr->taint[s] = vr->step_pos[s];
        vr->step_pos[s] = INT_MAX;
    }
    return rc;
}

int vr_excluded(const struct verify_routing *vr, int seq, int pos) { return pos >= vr->taint[seq]; }

void vr_mode_begin(struct verify_routing *vr) {
    for (int i = 0; i < vr->n_seqs; i++) vr->taint[i] = INT_MAX;
    vr->choices = vr->flips = 0;
    vr->router_err = 0;
}

void vr_mode_end(struct verify_routing *vr, const char *mode, long rows_excluded) {
    printf("routing mode=%s choices=%ld flips=%ld rows_after_flips=%ld router_max_abs_err=%.3g\n", mode,
           vr->choices, vr->flips, rows_excluded, vr->router_err);
    if (!(vr->router_err <= vr->router_err_all)) vr->router_err_all = vr->router_err;
}

double vr_router_err(const struct verify_routing *vr) { return vr->router_err_all; }
