/* shard.c — one rank's share of a model split over ranks (tensor and
 * expert parallel, docs/distributed.md): which sizes of the config
 * divide over the ranks (refusals name config.json's field), the rank's
 * local config (config.h struct model_shard), and the all-reduce of the
 * ranks' partial sums inside the forward. */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "dist/comm.h"
#include "model/model_internal.h"

static int any_layer(const struct model_config *c, int moe) {
    for (int l = 0; l < c->n_layers; l++)
        if (!!model_config_layer_is_moe(c, l) == moe) return 1;
    return 0;
}

static int indivisible(const char *file, const char *field, long value, const char *what, int size,
                       struct kiln_error *err) {
    return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                       "%s: %s (%ld) is not divisible by the %s parallel size %d: choose a size "
                       "that divides it",
                       file, field, value, what, size);
}

/* The sizes the split needs to divide, checked on the whole config. */
static int split_check(const struct model_config *c, int tp, int ep, int attn_tp, const char *file,
                       struct kiln_error *err) {
    int mla = model_family_of(c) == &family_deepseek;
    if (c->n_heads % attn_tp)
        return indivisible(file, "num_attention_heads", c->n_heads, attn_tp < tp ? "attention tensor" : "tensor",
                           attn_tp, err);
    if (!mla) {
        /* KV heads split evenly, or each replicated on tp / n_kv_heads
         * ranks (a rank's query heads then share one KV head) */
        if (tp <= c->n_kv_heads && c->n_kv_heads % tp)
            return indivisible(file, "num_key_value_heads", c->n_kv_heads, "tensor", tp, err);
        if (tp > c->n_kv_heads && tp % c->n_kv_heads)
            return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                               "%s: the tensor parallel size %d is neither a divisor nor a multiple "
                               "of num_key_value_heads (%d): each rank needs whole KV heads, or one "
                               "replicated on tp / num_key_value_heads ranks",
                               file, tp, c->n_kv_heads);
    }
    if (c->vocab_size < tp)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "%s: vocab_size (%d) is smaller than the tensor parallel size %d", file,
                           c->vocab_size, tp);
    if (any_layer(c, 0) && c->intermediate_size % tp)
        return indivisible(file, "intermediate_size", c->intermediate_size, "tensor", tp, err);
    if (!any_layer(c, 1)) return 0;
    if (ep > 1 && c->n_experts % ep)
        return indivisible(file, mla ? "n_routed_experts" : "num_experts (or num_local_experts)", c->n_experts, "expert",
                           ep, err);
    if (ep <= 1 && c->moe_intermediate_size % tp)
        return indivisible(file, "moe_intermediate_size", c->moe_intermediate_size, "tensor", tp, err);
    if (mla && c->n_shared_experts > 0 && ((long)c->n_shared_experts * c->moe_intermediate_size) % tp)
        return indivisible(file, "n_shared_experts x moe_intermediate_size",
                           (long)c->n_shared_experts * c->moe_intermediate_size, "tensor", tp, err);
    if (!mla && c->shared_expert_intermediate_size % tp)
        return indivisible(file, "shared_expert_intermediate_size", c->shared_expert_intermediate_size,
                           "tensor", tp, err);
    return 0;
}

int model_shard_split(struct model_config *c, const struct model_parallel *p, const char *file,
                      struct kiln_error *err) {
    int tp = p ? p->tp_size : 0, ep = p ? p->ep_size : 0, rank = p ? p->tp_rank : 0;
    if (tp <= 1 && ep <= 1 && rank == 0 && (!p || p->dp_size <= 1)) return 0;
    if (tp < 0) return kiln_errorc(err, KILN_ERR_BAD_INPUT, "tensor parallel size %d is below 1", tp);
    if (tp == 0) tp = 1;
    if (rank < 0 || rank >= tp)
        return kiln_errorc(err, KILN_ERR_BAD_INPUT,
                           "tensor parallel rank %d is outside the group of %d rank(s)", rank, tp);
    if (ep > 1 && ep != tp)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "the expert parallel size (%d) must equal the tensor parallel size (%d): "
                           "experts are split over the same ranks",
                           ep, tp);
    int dp = p->dp_size > 1 ? p->dp_size : 1, attn_tp = tp / dp;
    if (dp > 1 && dp_attention_check(c, p, file, err)) return -1;
    if (split_check(c, tp, ep, attn_tp, file, err)) return -1;
    if (!p->comm || p->comm->size != tp || p->comm->rank != rank)
        return kiln_errorc(err, KILN_ERR_BAD_INPUT,
                           "tensor parallel rank %d of %d needs a communicator of that rank and size", rank,
                           tp);
    struct model_shard *s = &c->shard;
    *s = (struct model_shard){.tp_size = tp, .tp_rank = rank, .ep_size = ep > 1 ? ep : 1,
                              .kv_heads = c->n_kv_heads};
    int mla = model_family_of(c) == &family_deepseek;
    if (dp > 1) {
        s->dp_size = dp;
        s->dp_rank = rank / attn_tp;
        s->attn_tp_size = attn_tp;
        s->attn_tp_rank = rank % attn_tp;
    }
    c->n_heads /= attn_tp;
    if (!mla) c->n_kv_heads = tp <= c->n_kv_heads ? c->n_kv_heads / tp : 1;
    c->intermediate_size /= tp;
    c->shared_expert_intermediate_size /= tp;
    if (ep > 1) {
        s->n_experts = c->n_experts / ep;
        s->expert0 = rank * s->n_experts;
    } else {
        c->moe_intermediate_size /= tp;
        s->n_experts = c->n_experts;
    }
    /* the vocabulary in near-equal parts, rank r from r·V/tp */
    long V = c->vocab_size;
    s->vocab0 = rank * V / tp;
    s->vocab_rows = (rank + 1) * V / tp - s->vocab0;
    s->vocab_stride = (V + tp - 1) / tp;
    return 0;
}

long model_shard_kv_head0(const struct model_config *c) {
    if (c->shard.tp_size <= 1) return 0;
    /* split: rank r's first; replicated: the head of rank r's query heads */
    return (long)c->shard.tp_rank * c->shard.kv_heads / c->shard.tp_size;
}

long moe_shared_inter(const struct model_config *c) {
    if (model_family_of(c) != &family_deepseek) return c->shared_expert_intermediate_size;
    long inter = (long)c->n_shared_experts * c->moe_intermediate_size;
    /* whole experts: moe_intermediate_size is the whole model's, the
     * shared experts are still split by columns */
    return c->shard.ep_size > 1 ? inter / c->shard.tp_size : inter;
}

const struct ws_slice *ws_split(struct ws_slice *s, const struct model_config *c, int dim, long local) {
    if (c->shard.tp_size <= 1) return NULL;
    *s = (struct ws_slice){.dim = dim, .start = c->shard.tp_rank * local, .len = local};
    return s;
}

const struct ws_slice *ws_split_attn(struct ws_slice *s, const struct model_config *c, int dim, long local) {
    if (c->shard.dp_size <= 1) return ws_split(s, c, dim, local);
    if (c->shard.attn_tp_size <= 1) return NULL;
    *s = (struct ws_slice){.dim = dim, .start = c->shard.attn_tp_rank * local, .len = local};
    return s;
}

/* The ranks run in lockstep: a failed collective means a peer is gone
 * and the step cannot finish anywhere. The launcher ends the job when a
 * rank exits. */
static void comm_failed(const struct model *m, const struct kiln_error *err) {
    fprintf(stderr, "kiln: rank %d: %s\n", m->cfg.shard.tp_rank, err->msg);
    exit(1);
}

void model_tp_sum(struct model *m, float *buf, size_t count) {
    if (m->cfg.shard.tp_size <= 1) return;
    struct kiln_error err = {0};
    if (dist_comm_all_reduce(m->comm, buf, count, DIST_SUM, &err)) comm_failed(m, &err);
}

void model_tp_gather(struct model *m, const void *send, void *recv, size_t bytes) {
    struct kiln_error err = {0};
    if (dist_comm_all_gather(m->comm, send, recv, bytes, &err)) comm_failed(m, &err);
}
