/* runner_follow.c — the lockstep of a job's ranks: rank 0's runner sends
 * LOAD, every STEP before it runs it, and STOP (runner_free); the other
 * ranks build the same runner from LOAD and replay the steps
 * (runner_follow). Message bytes: ctrl_msg.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "runner/runner_internal.h"

/* One message: a frame of CTRL_MSG_FRAME bytes, then the rest. */
static int send_msg(struct dist_comm *ctrl, struct buf *msg, struct kiln_error *err) {
    size_t len = msg->len;
    if (len < CTRL_MSG_FRAME) {
        buf_reserve(msg, CTRL_MSG_FRAME - len);
        memset(msg->data + len, 0, CTRL_MSG_FRAME - len);
    }
    if (dist_comm_broadcast(ctrl, msg->data, CTRL_MSG_FRAME, 0, err)) return -1;
    if (len > CTRL_MSG_FRAME && dist_comm_broadcast(ctrl, msg->data + CTRL_MSG_FRAME, len - CTRL_MSG_FRAME, 0, err))
        return -1;
    return 0;
}

/* Waits (without a time limit: rank 0 may be idle for hours) for rank 0's
 * next message and parses it. max_len bounds what is accepted. */
static int recv_msg(struct dist_comm *ctrl, uint8_t **rx, size_t *cap, size_t max_len,
                    const struct ctrl_limits *lim, struct ctrl_msg *m, struct kiln_error *err) {
    if (dist_comm_wait(ctrl, 0, -1, err) < 0) return -1;
    if (*cap < CTRL_MSG_FRAME) {
        *rx = xrealloc(*rx, CTRL_MSG_FRAME);
        *cap = CTRL_MSG_FRAME;
    }
    if (dist_comm_broadcast(ctrl, *rx, CTRL_MSG_FRAME, 0, err)) return -1;
    enum ctrl_msg_type type = CTRL_MSG_STOP;
    uint32_t seq = 0;
    long body = ctrl_msg_header(*rx, &type, &seq, err);
    if (body < 0) return -1;
    size_t len = CTRL_MSG_HEADER + (size_t)body;
    if (len > CTRL_MSG_FRAME) {
        if (len > max_len)
            return kiln_errorf(err, "rank 0 sends a step of %zu bytes, more than this runner's batches take (%zu)",
                               len, max_len);
        if (*cap < len) {
            *rx = xrealloc(*rx, len);
            *cap = len;
        }
        if (dist_comm_broadcast(ctrl, *rx + CTRL_MSG_FRAME, len - CTRL_MSG_FRAME, 0, err)) return -1;
    }
    return ctrl_msg_parse(*rx, len, lim, m, err);
}

static void name_copy(char *dst, const char *src) {
    snprintf(dst, CTRL_MSG_NAME_MAX, "%s", src ? src : "");
}

int runner_lead_load(struct dist_comm *ctrl, const struct model_options *mo, const struct runner_options *ro,
                     struct kiln_error *err) {
    struct ctrl_load l = {
        .max_batch_tokens = mo->max_batch_tokens, .max_seqs = mo->max_seqs, .max_context = mo->max_context,
        .seed = mo->seed, .no_shared_expert_fusion = !!mo->no_shared_expert_fusion, .moe_count = !!mo->moe_count,
        .no_graphs = !!ro->no_graphs, .skip_warmup = !!ro->skip_warmup, .dummy_routing = (int)mo->dummy_routing,
        .page_size = ro->page_size, .kv_tokens = ro->kv_tokens > 0 ? ro->kv_tokens : 0,
        .mem_fraction_static = ro->mem_fraction_static > 0 ? ro->mem_fraction_static : 0,
        .max_running_requests = ro->max_running_requests > 0 ? ro->max_running_requests : 0,
        .chunked_prefill_size = ro->chunked_prefill_size > 0 ? ro->chunked_prefill_size : 0,
        .swa_full_tokens_ratio = ro->swa_full_tokens_ratio > 0 ? ro->swa_full_tokens_ratio : 0,
        .disable_hybrid_swa = !!ro->disable_hybrid_swa};
    const char *names[2] = {mo->load_format, mo->quantization};
    for (int i = 0; i < 2; i++)
        if (names[i] && !ctrl_msg_name_ok(names[i]))
            return kiln_errorf(err, "%s '%.64s': not a name the other ranks can be told (at most %d printable "
                                    "bytes)", i ? "--quantization" : "--load-format", names[i], CTRL_MSG_NAME_MAX - 1);
    name_copy(l.load_format, mo->load_format);
    name_copy(l.quantization, mo->quantization);
    struct buf b = {0};
    ctrl_msg_load(&b, 0, &l);
    int rc = send_msg(ctrl, &b, err);
    buf_free(&b);
    return rc ? kiln_error_prefix(err, "telling the other ranks to load") : 0;
}

int runner_lead_step(struct runner *r, const struct batch *b, const struct runner_sampling *smp,
                     struct kiln_error *err) {
    int flags = 0;
    if (smp)
        flags = CTRL_STEP_SAMPLE | (smp->fill_masks ? CTRL_STEP_MASKED : 0) | (smp->want_logits ? CTRL_STEP_WANT : 0);
    buf_clear(&r->msg);
    ctrl_msg_step(&r->msg, ++r->seq, flags, r->kv.scratch_page, b, smp ? smp->want_logits : NULL);
    if (send_msg(r->ctrl, &r->msg, err)) return kiln_error_prefix(err, "step %u to the other ranks", r->seq);
    return 0;
}

void runner_lead_stop(struct runner *r) {
    struct kiln_error err;
    buf_clear(&r->msg);
    ctrl_msg_stop(&r->msg, ++r->seq);
    if (send_msg(r->ctrl, &r->msg, &err)) log_error("runner: STOP to the other ranks: %s", err.msg);
}

int runner_job_end(struct dist_comm *ctrl, struct kiln_error *err) {
    if (!ctrl || ctrl->size < 2 || ctrl->rank != 0) return 0;
    struct buf b = {0};
    ctrl_msg_end(&b, 0);
    int rc = send_msg(ctrl, &b, err);
    buf_free(&b);
    return rc ? kiln_error_prefix(err, "END to the other ranks") : 0;
}

int runner_ctrl_agree(struct runner *r, long *tokens, struct kiln_error *err) {
    struct dist_comm *c = r->ctrl;
    const struct model_config *mc = model_config(r->m);
    enum { N = 7 };
    static const char *const what[N] = {"KV tokens", "vocabulary", "layers", "hidden size", "page size",
                                        "batch tokens", "context"};
    int64_t mine[N] = {*tokens, r->vocab, mc->n_layers, r->hidden, r->page_size, r->max_batch_tokens,
                       r->max_context};
    int64_t *all = xmalloc((size_t)c->size * sizeof mine);
    if (dist_comm_all_gather(c, mine, all, sizeof mine, err)) {
        free(all);
        return kiln_error_prefix(err, "agreeing on the KV pool");
    }
    long least = *tokens;
    int rc = 0;
    for (int p = 0; p < c->size && rc == 0; p++) {
        const int64_t *v = all + (size_t)p * N;
        for (int i = 1; i < N; i++)
            if (v[i] != all[i]) {
                rc = kiln_errorf(err, "rank %d has %s %lld, rank 0 %lld: every rank must load the same model "
                                      "with the same options", p, what[i], (long long)v[i], (long long)all[i]);
                break;
            }
        if (v[0] < least) least = (long)v[0];
    }
    free(all);
    if (rc) return -1;
    if (least < *tokens)
        log_info("KV pool: %ld tokens, the least of the %d ranks (this rank could hold %ld)", least, c->size, *tokens);
    *tokens = least;
    return 0;
}

int runner_follow_load(struct runner **out, struct backend *be, const char *model_dir,
                       const struct model_options *mo_in, const struct runner_options *ro_in,
                       struct kiln_error *err) {
    *out = NULL;
    struct dist_comm *ctrl = ro_in->ctrl;
    KILN_ASSERT(ctrl && ctrl->size > 1 && ctrl->rank > 0);
    uint8_t *rx = NULL;
    size_t cap = 0;
    struct ctrl_msg m = {0};
    int rc = recv_msg(ctrl, &rx, &cap, CTRL_MSG_FRAME, NULL, &m, err);
    if (rc) {
        kiln_error_prefix(err, "waiting for rank 0's model load");
    } else if (m.type == CTRL_MSG_END) {
        rc = 1;
    } else if (m.type != CTRL_MSG_LOAD || m.seq != 0) {
        rc = kiln_errorf(err, "rank 0 sent message type %d (sequence %u) where a LOAD was due", (int)m.type, m.seq);
    } else {
        const struct ctrl_load *l = &m.load;
        struct model_options mo = *mo_in;
        struct runner_options ro = *ro_in;
        mo.max_batch_tokens = l->max_batch_tokens, mo.max_seqs = l->max_seqs, mo.max_context = l->max_context;
        mo.seed = l->seed, mo.no_shared_expert_fusion = l->no_shared_expert_fusion, mo.moe_count = l->moe_count;
        mo.dummy_routing = (enum model_routing)l->dummy_routing;
        mo.load_format = l->load_format[0] ? l->load_format : NULL;
        mo.quantization = l->quantization[0] ? l->quantization : NULL;
        ro.page_size = l->page_size, ro.kv_tokens = l->kv_tokens, ro.mem_fraction_static = l->mem_fraction_static;
        ro.max_running_requests = l->max_running_requests, ro.chunked_prefill_size = l->chunked_prefill_size;
        ro.no_graphs = l->no_graphs, ro.skip_warmup = l->skip_warmup;
        ro.swa_full_tokens_ratio = l->swa_full_tokens_ratio, ro.disable_hybrid_swa = l->disable_hybrid_swa;
        rc = runner_load(out, be, model_dir, &mo, &ro, err);
    }
    free(rx);
    ctrl_msg_free(&m);
    return rc;
}

/* Nothing to compute: grammar masks are rank 0's. */
static void no_masks(void *user) { (void)user; }

int runner_follow(struct runner *r, struct kiln_error *err) {
    KILN_ASSERT(r->follower);
    struct ctrl_limits lim = {.max_tokens = r->max_batch_tokens, .max_seqs = r->max_seqs, .max_pages = r->pages_cap,
                              .vocab = r->vocab, .max_context = r->max_context, .page_size = r->page_size,
                              .pool_pages = r->kv.n_pages, .swa_pages = r->kv.n_swa_pages,
                              .dp_groups = model_config(r->m)->shard.dp_size};
    size_t max_len = ctrl_msg_step_max(&lim);
    struct ctrl_msg *m = &r->in;
    for (;;) {
        if (recv_msg(r->ctrl, &r->rx, &r->rx_cap, max_len, &lim, m, err))
            return kiln_error_prefix(err, "following rank 0 after step %u", r->seq);
        if (m->seq != r->seq + 1)
            return kiln_errorf(err, "rank 0's message %u came where %u was due", m->seq, r->seq + 1);
        r->seq = m->seq;
        if (m->type == CTRL_MSG_STOP) return 0;
        if (m->type != CTRL_MSG_STEP)
            return kiln_errorf(err, "rank 0 sent message type %d in the middle of a runner's steps", (int)m->type);
        r->kv.scratch_page = m->scratch_page;
        int rc;
        if (m->flags & CTRL_STEP_SAMPLE) {
            struct runner_sampling smp = {.want_logits = m->want_logits, .rows = r->f_rows,
                                          .fill_masks = (m->flags & CTRL_STEP_MASKED) ? no_masks : NULL};
            rc = runner_forward_impl(r, &m->b, &smp, r->f_tokens, NULL, err);
        } else {
            rc = runner_forward_impl(r, &m->b, NULL, NULL, NULL, err);
        }
        if (rc) return kiln_error_prefix(err, "step %u", r->seq);
    }
}
