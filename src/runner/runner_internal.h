/* runner_internal.h — the runner's state, shared by runner.c (set-up, the
 * memory plan, the KV pool), runner_step.c (staging, graphs, the tail) and
 * runner_warmup.c. Not for use outside src/runner/. */
#ifndef KILN_RUNNER_RUNNER_INTERNAL_H
#define KILN_RUNNER_RUNNER_INTERNAL_H

#include "base/buf.h"
#include "runner/ctrl_msg.h"
#include "runner/runner.h"
#include "tensor/backend.h"

/* Decode batches (one token per sequence) are padded up to one of these
 * sizes and replayed from a graph recorded once per size. */
enum { RUNNER_GRAPH_BUCKETS = 36 };

struct runner {
    struct model *m;
    int own_model;
    /* the model's collectives on a device backend (backend_ops.comm_init,
     * runner_load), freed after the model; NULL: the host ctrl serves.
     * Under pipeline parallel dev_comm carries the sends between the
     * stages and dev_stage (with --tp) the stage's collectives. */
    struct dist_comm *dev_comm, *dev_stage;
    struct backend *be;
    struct kv_pool kv;
    int max_batch_tokens, max_seqs, max_context, page_size;
    long vocab, hidden;

    /* Batch metadata: views into one device buffer `stage`, filled by one
     * upload from `stage_host` (pinned where the backend has host_alloc) at
     * fixed offsets, so graphs can capture the pointers. */
    int32_t *ids, *pos, *slot, *q_start, *page_start, *pages, *rows;
    int32_t *stage, *stage_host;
    long stage_pages_off;     /* ints before the page list */
    /* A hybrid KV pool (swa_window > 0, the sliding layers' window): the
     * batch's sliding slots and pages, a stage view at stage_swa_off
     * ([T] slots, then the pages), and the host arrays a batch without
     * them gets them in (runner_swa_fill). */
    int swa_window;
    int32_t *swa_slot, *swa_pages;
    long stage_swa_off;
    int32_t *swa_slot_host, *swa_pages_host;
    int stage_pinned;         /* stage_host came from host_alloc */
    int stage_busy;           /* an upload from stage_host may still be in flight */
    long pages_cap;
    float *logits;            /* [logit_chunk][vocab] device */
    int logit_chunk;
    /* device sampling (backends with `sample`): row parameters are a view
     * into `stage` (uploaded with the batch), adjustments their own pinned
     * buffer, token ids come back through stok_host */
    struct backend_sample_row *srows;   /* [max_seqs] (stage view) */
    long stage_srows_off;               /* ints before srows in stage */
    struct backend_sample_adj *sadj, *sadj_host; /* [adj_cap] device, pinned host */
    int sadj_pinned;
    int adj_cap;
    int32_t *stok, *stok_host;          /* [max_seqs] device, host (pinned when possible) */
    int stok_pinned;
    int32_t *perm;                      /* [T] host: logit rows, want_logits first */
    /* grammar masks: [max_seqs][mask_words] host (pinned when possible)
     * and device (backends that sample) */
    uint32_t *smask_host, *smask;
    int smask_pinned, mask_words;

    /* graphs (backends with graph_begin; models whose layers can be recorded) */
    int graphs_on;
    /* [0]: the layers only; [1]: layers + final norm, lm_head and sampling
     * of every (padded) row, for runner_forward_sample steps */
    void *graphs[2][RUNNER_GRAPH_BUCKETS];
    unsigned char graph_warm[2][RUNNER_GRAPH_BUCKETS]; /* ran eagerly once at this size */
    int sample_on;                   /* backend samples (and KILN_GPU_SAMPLE != 0) */
    int graph_sample_on;             /* graphs [1] allowed (KILN_GRAPH_SAMPLE != 0) */

    /* lockstep (runner_options.ctrl of more than one rank): rank 0 leads,
     * broadcasting every step before it runs it; the others follow */
    struct dist_comm *ctrl;
    int lead, follower;
    int ready;                       /* lead: fully made, so runner_free sends STOP */
    uint32_t seq;                    /* the last message's sequence number */
    struct buf msg;                  /* lead: the message being sent */
    struct ctrl_msg in;              /* follower: the last message parsed */
    uint8_t *rx;                     /* follower: its bytes */
    size_t rx_cap;
    struct backend_sample_row *f_rows; /* follower: [max_batch_tokens] greedy rows */
    int32_t *f_tokens;               /* follower: [max_batch_tokens] sampled ids, unused */

    struct runner_pp *pp;            /* pipeline parallel (runner_pp.c), NULL: one stage */
};

/* runner_step.c */
int runner_bucket_size(int i);
/* The index of the smallest graph bucket that holds n, or -1. */
int runner_bucket_for(const struct runner *r, long n);
void runner_drop_graphs(struct runner *r);
int runner_forward_impl(struct runner *r, const struct batch *b, const struct runner_sampling *smp,
                        int32_t *tokens, float *logits, struct kiln_error *err);
/* Stages b (no padding, no device sampling; logit rows in order) and fills
 * bb (the full layers' and, with a hybrid pool, the sliding layers') and
 * *s for model_forward_layers over it. */
void runner_stage_plain(struct runner *r, const struct batch *b, struct backend_batch bb[2], struct model_step *s);
/* A hybrid pool's runner and a batch without sliding slots and pages:
 * *out becomes b with them (kv_pool_swa_page), in r's host arrays, and
 * the call returns out; otherwise returns b. */
const struct batch *runner_swa_fill(struct runner *r, const struct batch *b, struct batch *out);

/* runner_pp.c: pipeline parallel. runner_pp_check refuses what it does not
 * run (before the model loads); runner_pp_init makes r->pp for a model
 * split into stages (nothing otherwise); runner_pp_step is such a runner's
 * whole step, after rank 0 broadcast it. */
int runner_pp_check(const struct backend *be, const struct model_options *mo, struct kiln_error *err);
int runner_pp_init(struct runner *r, struct kiln_error *err);
void runner_pp_free(struct runner *r);
int runner_pp_step(struct runner *r, const struct batch *b, float *logits, struct kiln_error *err);

/* runner_follow.c: the lead's side of the lockstep */
int runner_lead_load(struct dist_comm *ctrl, const struct model_options *mo, const struct runner_options *ro,
                     struct kiln_error *err);
int runner_lead_step(struct runner *r, const struct batch *b, const struct runner_sampling *smp,
                     struct kiln_error *err);
void runner_lead_stop(struct runner *r);
/* Every rank's pool size, the least of them in *tokens; the model's shape
 * must be the same on every rank. */
int runner_ctrl_agree(struct runner *r, long *tokens, struct kiln_error *err);

#endif
