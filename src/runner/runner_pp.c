/* runner_pp.c — a step of a model split into pipeline stages
 * (docs/distributed.md, "Pipeline parallel").
 *
 * Every rank gets the whole step from rank 0 (the lockstep's STEP) and
 * cuts it the same way into micro-batches, whole sequences each. A stage
 * runs them in order: the residual stream of micro-batch k from the stage
 * before (stage 0: the embedding), its layers, the stream on to the next
 * stage; the last stage runs the head of k's logit rows and its tensor
 * parallel rank 0 sends their logits to rank 0, which copies them to the
 * caller. While stage s works on micro-batch k, stage s - 1 works on k + 1.
 *
 * The transfers go through the model's pp_comm on the backend's memory:
 * the TCP communicator's host buffers on the CPU, NCCL's ncclSend and
 * ncclRecv on the device's stream on CUDA (the hidden states never leave
 * the GPU; a micro-batch's staging waits for the last one's copy, so for
 * its sends too, and the download of rank 0's logits for their recv).
 *
 * Sends complete when the receiver takes them (the TCP communicator's
 * send waits for its peer's recv; NCCL's, on the stream, likewise or
 * sooner), so rank 0 must take micro-batch
 * k - (stages - 1)'s logits before it sends micro-batch k: the chain of
 * sends from its send of k to the last stage's rank ends in that rank's
 * send of those logits. Anything else deadlocks with two or more
 * micro-batches.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "runner/runner_internal.h"

struct runner_pp {
    struct model_stage st;
    int *cut;          /* [max_seqs + 1] micro-batch k: sequences [cut[k], cut[k + 1]) */
    int *jcut;         /* [max_seqs + 1] ... and logit rows [jcut[k], jcut[k + 1]) */
    int32_t *q_start;  /* [max_seqs + 1] a micro-batch's own */
    int32_t *page_start; /* [max_seqs + 1] */
    int32_t *rows;     /* [max_batch_tokens] its logit rows */
};

int runner_pp_check(const struct backend *be, const struct model_options *mo, struct kiln_error *err) {
    if (mo->par.pp_size <= 1) return 0;
    if (!be->ops->embed_shard || (!be->ops->comm_init && strcmp(be->ops->name, "cpu")))
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "--pp %d with --device %s: pipeline parallel needs a backend with a communicator of "
                           "its own (CUDA: NCCL) or the CPU's",
                           mo->par.pp_size, be->ops->name);
    if (!mo->par.pp_comm)
        return kiln_errorc(err, KILN_ERR_BAD_INPUT, "--pp %d needs the job's communicator", mo->par.pp_size);
    return 0;
}

int runner_pp_init(struct runner *r, struct kiln_error *err) {
    struct model_stage st;
    model_stage_of(r->m, &st);
    if (st.stages <= 1) return 0;
    if (!r->ctrl || r->ctrl->size != st.stages * st.tp_size)
        return kiln_errorf(err, "pipeline parallel: the runner needs the job's %d ranks on its control channel",
                           st.stages * st.tp_size);
    struct runner_pp *p = xcalloc(1, sizeof *p);
    r->pp = p;
    p->st = st;
    size_t S = (size_t)r->max_seqs + 1;
    p->cut = xmalloc(S * sizeof *p->cut);
    p->jcut = xmalloc(S * sizeof *p->jcut);
    p->q_start = xmalloc(S * sizeof *p->q_start);
    p->page_start = xmalloc(S * sizeof *p->page_start);
    p->rows = xmalloc((size_t)r->max_batch_tokens * sizeof *p->rows);
    r->graphs_on = 0; /* a step's host round trips between the stages */
    r->sample_on = 0;  /* the logits travel to rank 0, which samples on the host */
    log_info("pipeline stage %d of %d (rank %d, tensor parallel rank %d of %d): layers %d to %d of %d%s%s", st.stage,
             st.stages, st.rank, st.tp_rank, st.tp_size, st.layer0, st.layer1 - 1, model_config(r->m)->n_layers,
             st.stage == 0 ? ", the embedding" : "", st.stage == st.stages - 1 ? ", the head" : "");
    return 0;
}

void runner_pp_free(struct runner *r) {
    struct runner_pp *p = r->pp;
    if (!p) return;
    free(p->cut);
    free(p->jcut);
    free(p->q_start);
    free(p->page_start);
    free(p->rows);
    free(p);
    r->pp = NULL;
}

/* The micro-batches of b: one per stage (at most one per sequence) for
 * steps with prefill rows, whole sequences each and about as many tokens
 * each; decode steps stay whole (a micro-batch reads all of a stage's
 * weights, which a decode step's rows would pay once per micro-batch). A
 * pure function of the batch: every rank cuts the same. */
static int split(const struct runner_pp *p, const struct batch *b) {
    int S = b->n_seqs, T = b->n_tokens, M = p->st.stages < S ? p->st.stages : S;
    for (int j = 1; j < b->n_logit_rows; j++)
        if (b->logit_rows[j] < b->logit_rows[j - 1]) M = 1; /* not in order: cannot be cut */
    if (T <= S) M = 1;
    if (M < 1) M = 1;
    p->cut[0] = 0;
    for (int k = 1; k < M; k++) {
        long target = (long)T * k / M;
        int i = p->cut[k - 1] + 1;
        while (i < S - (M - k) && b->q_start[i] < target) i++;
        if (i - 1 > p->cut[k - 1] && target - b->q_start[i - 1] < b->q_start[i] - target) i--; /* the nearer */
        p->cut[k] = i;
    }
    p->cut[M] = S;
    for (int k = 0, j = 0; k <= M; k++) {
        int end = b->q_start[p->cut[k]];
        while (k > 0 && j < b->n_logit_rows && b->logit_rows[j] < end) j++;
        p->jcut[k] = j;
    }
    p->jcut[M] = b->n_logit_rows;
    return M;
}

/* Micro-batch k of b, its arrays rebased to its own first token and page. */
static struct batch micro_batch(const struct runner_pp *p, const struct batch *b, int k) {
    int s0 = p->cut[k], s1 = p->cut[k + 1], t0 = b->q_start[s0], p0 = b->kv_page_start[s0];
    for (int i = s0; i <= s1; i++) {
        p->q_start[i - s0] = b->q_start[i] - t0;
        p->page_start[i - s0] = b->kv_page_start[i] - p0;
    }
    int j0 = p->jcut[k], nj = p->jcut[k + 1] - j0;
    for (int j = 0; j < nj; j++) p->rows[j] = b->logit_rows[j0 + j] - t0;
    return (struct batch){.mode = b->mode, .n_tokens = b->q_start[s1] - t0, .input_ids = b->input_ids + t0,
                          .positions = b->positions + t0, .out_slot = b->out_slot + t0, .n_seqs = s1 - s0,
                          .q_start = p->q_start, .kv_len = b->kv_len + s0, .kv_page_start = p->page_start,
                          .kv_pages = b->kv_pages + p0, .page_size = b->page_size,
                          .swa_out_slot = b->swa_out_slot ? b->swa_out_slot + t0 : NULL,
                          .swa_kv_pages = b->swa_kv_pages ? b->swa_kv_pages + p0 : NULL, .n_logit_rows = nj,
                          .logit_rows = p->rows};
}

/* The last stage: micro-batch's n_lr logit rows (staged in r->rows) through
 * the final norm and lm_head, a chunk at a time, each chunk to rank 0 from
 * the stage's tensor parallel rank 0 (the others hold the same logits). */
static void head_send(struct runner *r, long n_lr) {
    if (n_lr == 0) return;
    long V = r->vocab;
    model_final_norm(r->m, r->rows, n_lr);
    for (long r0 = 0; r0 < n_lr; r0 += r->logit_chunk) {
        long rn = n_lr - r0 < r->logit_chunk ? n_lr - r0 : r->logit_chunk;
        model_lm_head(r->m, r->logits, r0, rn);
        if (r->pp->st.tp_rank == 0) model_pp_send(r->m, r->logits, (size_t)(rn * V), 0);
    }
}

/* Rank 0: micro-batch k's logits from the last stage, in the chunks it
 * sends them, into logits[j] for the batch's logit rows j. */
static void logits_recv(struct runner *r, int k, float *logits) {
    const struct runner_pp *p = r->pp;
    long V = r->vocab, j0 = p->jcut[k], n_lr = p->jcut[k + 1] - j0;
    int from = (p->st.stages - 1) * p->st.tp_size;
    for (long r0 = 0; r0 < n_lr; r0 += r->logit_chunk) {
        long rn = n_lr - r0 < r->logit_chunk ? n_lr - r0 : r->logit_chunk;
        model_pp_recv(r->m, r->logits, (size_t)(rn * V), from);
        if (logits) r->be->ops->download(r->be->ctx, logits + (j0 + r0) * V, r->logits, (size_t)(rn * V) * 4);
    }
}

int runner_pp_step(struct runner *r, const struct batch *b, float *logits, struct kiln_error *err) {
    (void)err;
    struct runner_pp *p = r->pp;
    struct model *m = r->m;
    int stage = p->st.stage, last = p->st.stages - 1, lead = p->st.rank == 0, lag = last;
    int M = split(p, b);
    for (int k = 0; k < M; k++) {
        struct batch mb = micro_batch(p, b, k);
        struct backend_batch bb[2];
        struct model_step s;
        runner_stage_plain(r, &mb, bb, &s);
        if (stage > 0) model_pp_recv_hidden(m, mb.n_tokens);
        model_forward_layers(m, &r->kv, &s);
        if (lead && k >= lag) logits_recv(r, k - lag, logits);
        if (stage < last) model_pp_send_hidden(m, mb.n_tokens);
        else head_send(r, mb.n_logit_rows);
    }
    for (int k = M - lag > 0 ? M - lag : 0; lead && k < M; k++) logits_recv(r, k, logits);
    return 0;
}
