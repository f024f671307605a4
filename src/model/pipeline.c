/* pipeline.c — one rank's stage of a model split into pipeline stages
 * (docs/distributed.md, "Pipeline parallel"): which layers a stage holds,
 * the refusals, the KV pool a stage's layers index, and the transfers of
 * the residual stream and the logits between the stages' ranks. */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "model/model_internal.h"

/* Layers of stage s of pp over n: n / pp each, and the remainder one more
 * each to the stages before the last, from the second to last backwards
 * (SGLang's default partition: the last stage also runs the head). */
static void partition(int n, int pp, int s, int *l0, int *l1) {
    int base = n / pp, rem = n % pp, first = 0;
    for (int i = 0; i <= s; i++) {
        int len = base + (i >= pp - 1 - rem && i < pp - 1);
        if (i == s) {
            *l0 = first;
            *l1 = first + len;
        }
        first += len;
    }
}

int model_pp_setup(struct model *m, const struct model_options *opt, const char *file, struct kiln_error *err) {
    struct model_config *c = &m->cfg;
    const struct model_parallel *p = opt ? &opt->par : NULL;
    int pp = p ? p->pp_size : 0;
    if (pp <= 1) return 0;
    int tp = p->tp_size > 1 ? p->tp_size : 1, tp_rank = p->tp_size > 1 ? p->tp_rank : 0;
    if (p->pp_rank < 0 || p->pp_rank >= pp)
        return kiln_errorc(err, KILN_ERR_BAD_INPUT, "pipeline stage %d is outside the %d stage(s)", p->pp_rank, pp);
    if (pp > c->n_layers)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "%s: num_hidden_layers (%d) is smaller than the pipeline parallel size %d: every "
                           "stage needs a layer",
                           file, c->n_layers, pp);
    if (!p->pp_comm || p->pp_comm->size != pp * tp || p->pp_comm->rank != p->pp_rank * tp + tp_rank)
        return kiln_errorc(err, KILN_ERR_BAD_INPUT,
                           "pipeline stage %d of %d (tensor parallel rank %d of %d) needs a communicator of "
                           "every rank, this one rank %d of %d",
                           p->pp_rank, pp, tp_rank, tp, p->pp_rank * tp + tp_rank, pp * tp);
    struct model_shard *s = &c->shard;
    s->pp_size = pp;
    s->pp_rank = p->pp_rank;
    partition(c->n_layers, pp, p->pp_rank, &s->layer0, &s->layer1);
    m->pp_comm = p->pp_comm;
    m->pp_k = model_own(m, xcalloc((size_t)c->n_layers, sizeof *m->pp_k));
    m->pp_v = model_own(m, xcalloc((size_t)c->n_layers, sizeof *m->pp_v));
    return 0;
}

void model_stage_of(const struct model *m, struct model_stage *s) {
    const struct model_config *c = &m->cfg;
    *s = (struct model_stage){.stages = 1, .tp_size = model_tp(c), .tp_rank = c->shard.tp_rank};
    model_stage_layers(c, &s->layer0, &s->layer1);
    if (c->shard.pp_size > 1) {
        s->stage = c->shard.pp_rank;
        s->stages = c->shard.pp_size;
        s->rank = m->pp_comm->rank;
    }
}

struct kv_pool *model_pp_kv(struct model *m, struct kv_pool *kv, struct kv_pool *tmp) {
    const struct model_config *c = &m->cfg;
    if (c->shard.pp_size <= 1) return kv;
    int l0, l1;
    model_stage_layers(c, &l0, &l1);
    KILN_ASSERT(kv->n_layers == l1 - l0);
    for (int l = l0; l < l1; l++) {
        m->pp_k[l] = kv->k[l - l0];
        m->pp_v[l] = kv->v[l - l0];
    }
    *tmp = *kv;
    tmp->k = m->pp_k;
    tmp->v = m->pp_v;
    return tmp;
}

/* The stages run in lockstep: a transfer that fails means a peer is gone
 * and the step cannot finish anywhere (the launcher ends the job). */
static void pp_failed(const struct model *m, const struct kiln_error *err) {
    fprintf(stderr, "kiln: rank %d: %s\n", m->pp_comm->rank, err->msg);
    exit(1);
}

void model_pp_send(struct model *m, const float *buf, size_t count, int peer) {
    struct kiln_error err = {0};
    if (dist_comm_send(m->pp_comm, buf, count * sizeof *buf, peer, &err)) pp_failed(m, &err);
}

void model_pp_recv(struct model *m, float *buf, size_t count, int peer) {
    struct kiln_error err = {0};
    if (dist_comm_recv(m->pp_comm, buf, count * sizeof *buf, peer, &err)) pp_failed(m, &err);
}

/* The neighbour stage's rank of the same tensor parallel rank. */
static int neighbour(const struct model *m, int step) {
    return m->pp_comm->rank + step * model_tp(&m->cfg);
}

/* h and the pending delta: the next stage's first add_rmsnorm adds them,
 * exactly as the layer after them would on one rank. */
void model_pp_send_hidden(struct model *m, long n) {
    KILN_ASSERT(m->cfg.shard.pp_rank + 1 < m->cfg.shard.pp_size);
    size_t count = (size_t)n * (size_t)m->cfg.hidden_size;
    model_pp_send(m, m->act.h, count, neighbour(m, 1));
    model_pp_send(m, m->act.delta, count, neighbour(m, 1));
}

void model_pp_recv_hidden(struct model *m, long n) {
    KILN_ASSERT(m->cfg.shard.pp_rank > 0);
    size_t count = (size_t)n * (size_t)m->cfg.hidden_size;
    model_pp_recv(m, m->act.h, count, neighbour(m, -1));
    model_pp_recv(m, m->act.delta, count, neighbour(m, -1));
}
