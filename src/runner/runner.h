/* runner.h — runs forward steps of a model on its backend: the layer
 * between the scheduler (which requests make a step) and the model
 * (weights and the layers' forward).
 *
 * How a request becomes a forward: the scheduler picks the requests of a
 * step and lays each one's new tokens out as rows of a Batch
 * (model/batch.h: token ids, positions, KV slots and page lists, the rows
 * that want logits), host arrays it owns. runner_forward stages the batch:
 * it packs those arrays into one pinned buffer and uploads them in one
 * copy, padding a decode batch to the next graph bucket. The model then
 * runs its layers over the staged device batch (model_forward_layers),
 * eagerly or by replaying the graph recorded for that bucket, and the
 * runner finishes with the tail: final norm and lm_head of the wanted rows,
 * their logits downloaded to the host, or (runner_forward_sample) their
 * tokens sampled on the device and only the ids copied back.
 *
 * The runner owns the KV pool (sized by the memory plan or given), the
 * staging buffers, the decode graphs and the start-up warm-up. One runner
 * drives one model against one KV pool from one thread.
 */
#ifndef KILN_RUNNER_RUNNER_H
#define KILN_RUNNER_RUNNER_H

#include <stdint.h>

#include "cache/kv_pool.h"
#include "model/batch.h"
#include "model/model.h"

struct backend;
struct kiln_error;
struct runner;

struct runner_options {
    int page_size;              /* KV page size of every batch (default 1) */
    long kv_tokens;             /* KV pool size in tokens; 0: the memory plan */
    /* The memory plan (kv_tokens 0): on a device that reports its memory,
     * the pool takes what is free minus (1 - mem_fraction_static) of the
     * device (default 0.88); elsewhere up to 2 GiB. Never more than
     * max_running_requests sequences of full context need; refused when
     * not even one chunk of chunked_prefill_size tokens fits. */
    double mem_fraction_static;
    int max_running_requests;
    int chunked_prefill_size;
    /* Models with both sliding and full layers (model_config_hybrid_window):
     * the sliding layers' KV in a pool of its own (cache/kv_pool.h
     * "Hybrid"), of swa_full_tokens_ratio (0 < r <= 1; 0: 0.8, as SGLang)
     * times the full layers' tokens, at least what one request needs beside
     * a full batch; disable_hybrid_swa: one pool for every layer. */
    double swa_full_tokens_ratio;
    int disable_hybrid_swa;
    int no_graphs;              /* 1: never replay decode steps from graphs (also KILN_GRAPHS=0) */
    int skip_warmup;            /* runner_load: no warm-up (and no overlapped weight copy) */
    /* Several ranks running one model in lockstep (model_options.par):
     * the job's host-memory communicator (the TCP mesh of dist/), NULL for
     * one rank. Rank 0 leads: every step it runs is first broadcast on
     * ctrl; the other ranks replay them in runner_follow (see "Lockstep"
     * below). */
    struct dist_comm *ctrl;
};

/* Loads the model of a checkpoint folder (model_load with *mo; the
 * weights' copy overlaps the KV pool and the warm-up unless
 * KILN_LOAD_OVERLAP=0), plans memory, creates the KV pool, warms up and
 * waits for the weights, logging what each took. The runner owns the
 * model. */
int runner_load(struct runner **out, struct backend *be, const char *model_dir,
                const struct model_options *mo, const struct runner_options *ro,
                struct kiln_error *err);
/* A runner for an already loaded model, which it borrows (free it after
 * the runner): creates the KV pool; no warm-up. One rank only (a ctrl of
 * several ranks is refused: they load through runner_load). */
int runner_create(struct runner **out, struct model *m, const struct runner_options *ro,
                  struct kiln_error *err);
/* Rank 0 of a job: sends STOP to the other ranks first. */
void runner_free(struct runner *r);

struct model *runner_model(const struct runner *r);
struct kv_pool *runner_kv(struct runner *r);

/* Start-up warm-up (kernel prewarm by bucket): on a backend with graphs,
 * runs and records every decode bucket's graph and runs a prefill at every
 * power-of-two token count up to the reserved batch, each with its largest
 * shape, so no request pays a first-seen cost. Uses scratch KV pages and
 * returns them; call before the first request. Logs what was warmed and
 * how long it took. A backend without graphs (the CPU) has nothing to warm
 * and returns at once. */
int runner_warmup(struct runner *r, struct kiln_error *err);

/* Runs the batch; writes logits[n_logit_rows][vocab] (host memory). */
int runner_forward(struct runner *r, const struct batch *b, float *logits, struct kiln_error *err);

/* ---- sampling on the device (backends with backend_ops.sample) ----------
 *
 * runner_forward_sample runs the batch like runner_forward, but samples the
 * logit rows on the device and copies back only their token ids; rows
 * marked want_logits (scores, logprobs: what the CPU sampler must see)
 * have their logits downloaded instead, and only those. Row j of the
 * batch's logit rows gets tokens[j] (rows not wanting logits), or its
 * logits at logits[k][vocab] where k counts the want_logits rows before it.
 * rows[j].adj_start / n_adj index `adj` (entries of want_logits rows are
 * ignored); at most runner_sample_adj_capacity entries per batch. The
 * parameters travel with the batch's staging upload (one pinned copy; a
 * second only when there are adjustments), and decode steps whose rows all
 * sample on the device replay a graph that includes the final norm, the
 * lm_head and the sampling kernels (KILN_GRAPH_SAMPLE=0: graphs cover the
 * layers only, as for runner_forward). */
struct backend_sample_row;
struct backend_sample_adj;
struct runner_sampling {
    const unsigned char *want_logits;       /* [n_logit_rows]; NULL: none */
    const struct backend_sample_row *rows;  /* [n_logit_rows] */
    const struct backend_sample_adj *adj;   /* [n_adj] */
    int n_adj;
    /* Grammar masks (structured outputs). mask_slot[j] >= 0 (NULL: none)
     * gives row j the bitmask in that slot of runner_mask_host (rows[j].mask
     * is set by the runner). fill_masks(fill_user), when set, is called
     * once the step's layers are enqueued and before its sampling kernels,
     * so the host computes the masks while the device runs the forward;
     * slots [0, n_mask_slots) are then uploaded to the device buffer the
     * sampler reads. Such a step replays the layers' graph and runs the
     * tail (final norm, lm_head, sampling) eagerly. */
    const int32_t *mask_slot;
    int n_mask_slots;
    void (*fill_masks)(void *user);
    void *fill_user;
};

/* Grammar mask slots: runner_mask_words(r) 32-bit words per slot (the
 * vocabulary rounded up), max_running_requests slots, host memory (pinned
 * where the backend has it). Filled by the caller, in fill_masks for
 * device-sampled rows; rows sampled on the host read them after the step. */
uint32_t *runner_mask_host(struct runner *r);
int runner_mask_words(const struct runner *r);

/* 1 when the backend samples on the device and KILN_GPU_SAMPLE is not 0. */
int runner_can_sample(const struct runner *r);
/* Most adjustment entries one batch may carry. */
int runner_sample_adj_capacity(const struct runner *r);
int runner_forward_sample(struct runner *r, const struct batch *b, const struct runner_sampling *s,
                          int32_t *tokens, float *logits, struct kiln_error *err);
/* ---- Lockstep: one model over the ranks of a job (runner_options.ctrl) ----
 *
 * Rank 0 runs the command (scheduler, verify, ...) and calls runner_load;
 * the other ranks call runner_follow_load, then runner_follow. Over ctrl,
 * rank 0's runner sends, as messages of runner/ctrl_msg.h:
 *   LOAD  at runner_load, before the model loads: the sizes of its
 *         model_options and runner_options, so every rank builds the
 *         same runner (each reads its own slices: model_options.par);
 *   STEP  before every step it runs (runner_forward, runner_forward_sample,
 *         the warm-up's): the batch's host arrays, its kind and the
 *         decisions the other ranks must copy (the scratch KV page);
 *   STOP  at runner_free;
 *   END   (runner_job_end) when no runner follows.
 * The KV pool is the smallest any rank's memory plan allows; pages are
 * rank 0's to allocate (its page lists travel in the steps). Sampling and
 * everything after the logits is rank 0's: the others compute their part
 * of each step (the model's collectives need them) and drop the logits.
 * Without ctrl (or with one rank) nothing of this runs. */

/* Ranks > 0: waits (no time limit) for rank 0's LOAD and does the same
 * runner_load with its sizes; be, model_dir, mo->par and ro->ctrl are this
 * rank's, the rest comes from rank 0. Returns 0 with *out, 1 when rank 0
 * sent END instead (the job ends), -1 on error. */
int runner_follow_load(struct runner **out, struct backend *be, const char *model_dir,
                       const struct model_options *mo, const struct runner_options *ro,
                       struct kiln_error *err);
/* Ranks > 0: replays rank 0's steps until its STOP, then returns 0 (free
 * the runner, then runner_follow_load again). -1 with err when the
 * communicator breaks (rank 0 is gone) or a step fails. */
int runner_follow(struct runner *r, struct kiln_error *err);
/* Rank 0: tells the other ranks that no more runners follow (their
 * runner_follow_load returns 1). Does nothing without several ranks. */
int runner_job_end(struct dist_comm *ctrl, struct kiln_error *err);

/* Runs the device sampler over representative batch sizes and
 * configurations (first-use costs out of the way); returns seconds, 0
 * where the runner does not sample on the device. */
double runner_sample_warmup(struct runner *r);

#endif
