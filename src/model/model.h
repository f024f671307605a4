/* model.h — a loaded model and its forward pass.
 *
 * model_load reads config.json, generation_config.json and the safetensors
 * weights of a checkpoint folder (or builds random weights from config.json
 * alone with load_format "dummy"), places the weights on a backend, and
 * reserves the activations for the largest batch up front.
 * model_forward_layers runs the layers over a batch already staged on the
 * device (struct model_step; src/runner stages batches and drives steps)
 * against a KV pool whose layout came from model_kv_layout, leaving the
 * residual stream for the head: model_final_norm and model_lm_head turn
 * rows of it into logits on the device.
 *
 * Only this folder knows architectures: a family file (llama.c,
 * deepseek.c; moe.c for the experts) provides loading and forward of its layers.
 */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stdint.h>
#include <stdio.h>

#include "cache/kv_pool.h"
#include "model/batch.h"
#include "model/config.h"

struct backend;
struct dist_comm;
struct kiln_error;
struct model;

/* This rank's place when one model is split over several ranks
 * (docs/distributed.md). Tensor parallel: every layer's heads, MLP
 * columns, experts' intermediate columns and the vocabulary are split
 * over the tp_size ranks of the group; each rank reads only its slices
 * of the checkpoint and the partial sums meet in all-reduces of comm.
 * Expert parallel (ep_size == tp_size): the routed experts are split
 * whole over the same ranks instead. Zeroed: one rank.
 *
 * The ranks call model_forward_layers and the head (model_lm_head,
 * model_norm_lm_head) with the same batches in the same order: each makes
 * collectives. Every rank gets the whole logits[r][vocab]. A collective
 * that fails there ends the process ("kiln: rank R: <error>", status 1).
 * model_config of a split model is its rank's config: its head counts and
 * intermediate sizes are the rank's, vocab_size and n_experts the whole
 * model's (config.h struct model_shard); the size functions below count
 * the rank's share when given it. */
struct model_parallel {
    int tp_size;            /* 0 or 1: not split */
    int tp_rank;            /* 0 .. tp_size - 1 */
    int ep_size;            /* 0 or 1: experts split by columns like the MLP; tp_size: whole */
    /* DP attention (docs/distributed.md, "DP attention"; MLA models only):
     * 0 or 1 off; else a divisor of tp_size, the number of data parallel
     * groups of tp_size / dp_size consecutive ranks. Each group holds its
     * whole attention (heads split over the group's ranks) and computes it
     * for its own sequences only (batch.seq_group), against its own KV
     * rows; the MLPs, the embedding and the lm_head stay split over all
     * tp_size ranks. dp_rank: this rank's group, tp_rank / (tp_size /
     * dp_size). */
    int dp_size, dp_rank;
    struct dist_comm *comm; /* the group's collectives, on the backend's memory */
    /* Pipeline parallel (model/pipeline.c): the layers split into pp_size
     * stages, this rank in stage pp_rank, each stage a tensor parallel
     * group of its own (comm above: the stage's tp_size ranks). pp_comm
     * holds every rank of the job, rank pp_rank · tp_size + tp_rank: the
     * residual stream goes over it to the next stage's rank of the same
     * tp_rank (model_pp_send_hidden / model_pp_recv_hidden). 0 or 1: one
     * stage. */
    int pp_size, pp_rank;
    struct dist_comm *pp_comm;
};

/* How MoE layers choose experts: as the router computes (the model), or,
 * for benchmarks on dummy weights whose router would send every token to
 * the same few experts, uniformly at random per token, layer and step
 * (moe_route_params.uniform; outputs are then meaningless). */
enum model_routing { MODEL_ROUTING_MODEL = 0, MODEL_ROUTING_UNIFORM };
/* "model" or "uniform"; -1 for anything else. */
int model_routing_parse(const char *name, enum model_routing *out);

struct model_options {
    const char *load_format; /* "auto" (safetensors) or "dummy" (random weights) */
    int max_batch_tokens;    /* largest n_tokens of a batch (default 2048) */
    int max_seqs;            /* largest n_seqs of a batch (default 256) */
    int max_context;         /* longest sequence (default: max_position_embeddings) */
    uint64_t seed;           /* dummy weights */
    /* 1: DeepSeek's shared expert stays a separate MLP instead of joining
     * the routed experts (moe.c; also KILN_SHARED_EXPERTS_FUSION=0) */
    int no_shared_expert_fusion;
    /* 1: checkpoint weights may still be copying to the device when
     * model_load returns (backends with weight_upload_later); the model may
     * run (warm-up) but computes on partly loaded weights until
     * model_weights_ready. */
    int defer_weights;
    enum model_routing dummy_routing; /* benchmarks; any weights, with a warning */
    /* Benchmarks: reserve touched-expert counts (model_moe_count_set) */
    int moe_count;
    /* NULL or "fp8" (SGLang's --quantization): the attention and MLP
     * projections not already FP8 (all of an unquantized checkpoint, or
     * of dummy weights) become FP8 with 128x128 block scales at load (a
     * config whose quantization_config is fp8: its blocks), except what
     * quantization_config lists as not converted; embeddings, lm_head,
     * norms and routers stay as they are. An FP8 checkpoint is loaded as
     * it is. The backend must run FP8 (backend_ops.fp8_weights). Without
     * the option, dummy weights are never FP8. */
    const char *quantization;
    struct model_parallel par;
};

int model_load(struct model **out, const char *dir, struct backend *be,
               const struct model_options *opt, struct kiln_error *err);
/* Builds from an already parsed config (dummy weights only). */
int model_load_dummy(struct model **out, const struct model_config *cfg, struct backend *be,
                     const struct model_options *opt, struct kiln_error *err);
void model_free(struct model *m);
/* Waits for weights still copying after a model_load with defer_weights
 * (no-op otherwise). Before the first forward whose results are used. */
void model_weights_ready(struct model *m);
/* 1 while copies queued by a deferred load may still be running. */
int model_weights_pending(const struct model *m);

const struct model_config *model_config(const struct model *m);
const struct generation_config *model_generation_config(const struct model *m);
int model_max_context(const struct model *m);
int model_max_batch_tokens(const struct model *m);
/* Bytes of weights read by one forward (for bandwidth figures). */
size_t model_weight_bytes(const struct model *m);

int model_max_seqs(const struct model *m);

/* ---- Touched-expert counting (model_options.moe_count; benchmarks) ----
 *
 * While on, every MoE layer counts, per forward, the distinct routed
 * experts its tokens chose: decode steps (one token per sequence, graph
 * padding included: its rows run through the experts too) apart from
 * other steps (prefill, mixed). Counting happens on the device inside the
 * route operation (nothing waits for the host, graphs included); when off
 * it costs the route one flag read. The bytes of a step's experts are the
 * count times expert_bytes, plus shared_bytes. */
struct model_moe_steps {
    long calls;          /* forwards counted */
    long long sum, rows; /* their distinct experts, summed; token rows routed */
    int min, max;        /* distinct experts of one forward */
};
struct model_moe_layer {
    int layer, n_experts, top_k;
    size_t expert_bytes; /* one routed expert: gate + up + down */
    size_t shared_bytes; /* the shared expert(s) and their gate: read whole by every forward */
    struct model_moe_steps decode, other;
};
/* The number of MoE layers. */
int model_moe_layers(const struct model *m);
/* Turns counting on or off; reset zeroes the counts. Between steps, from
 * the thread that runs them. -1 when the model reserved no counts. */
int model_moe_count_set(struct model *m, int on, int reset);
/* The counts so far, one entry per MoE layer (out[model_moe_layers]);
 * returns how many, 0 without counts. Between steps (a download). */
int model_moe_counts(struct model *m, struct model_moe_layer *out, int max);
/* Routing trace (kiln verify --routing-check): after each MoE layer's
 * routing, fn gets the step's rows: the router logits [n][n_experts] and
 * the chosen ids [n][k] (the routed experts in top-k order, then any fused
 * shared expert, ids >= n_experts), copied to the host, with the layer's
 * routing parameters and correction bias (in the backend's memory). Each
 * copy waits for the device: for checks, not for serving, and a step that
 * graphs record cannot hold it (runner_options.no_graphs). NULL fn: off. */
struct moe_route_params;
struct model_route_trace {
    void (*fn)(void *user, int layer, long n, int n_experts, int k, const float *logits, const int32_t *ids,
               const struct moe_route_params *rp, const float *correction_bias);
    void *user;
};
void model_set_route_trace(struct model *m, const struct model_route_trace *t);
/* Prints one line per layer (decode steps: experts touched, mean / min /
 * max over the steps, and their bytes; other steps likewise) and the
 * totals, which it also returns. */
struct model_moe_totals {
    long decode_steps, other_steps; /* forwards counted (the first MoE layer's) */
    double decode_bytes; /* routed experts read by a decode step, mean, all layers */
    double other_bytes;  /* the same for other steps */
    double shared_bytes; /* shared experts, read by every step, all layers */
    double routed_bytes; /* every routed expert's weights, all layers */
};
struct model_moe_totals model_moe_report(FILE *out, const struct model_moe_layer *c, int n);

struct backend *model_backend(const struct model *m);

/* ---- sizes for the memory plan: pure functions of the config ----------- */
struct backend_step_shape;
/* Bytes of the weights model_load gives a dummy model of this config
 * (checkpoints: what model_weight_bytes reports, in their dtypes); of a
 * split model's config (model_config), the rank's share. */
size_t model_config_weight_bytes(const struct model_config *c);
/* Device copies the model derives from its weights at load (MLA's W_UK^T). */
size_t model_config_derived_bytes(const struct model_config *c);
/* The activation buffers model_load reserves for batches of max_tokens
 * rows, and the rope table of max_context positions. */
size_t model_activation_bytes(const struct model_config *c, long max_tokens, long max_context);
/* The largest step's shape for backend_ops.workspace_bytes. fuse_shared:
 * shared-expert fusion on (model_options). */
void model_step_shape(const struct model_config *c, long max_tokens, long max_context,
                      int fuse_shared, struct backend_step_shape *s);
/* 1 when shared-expert fusion is on for this model. */
int model_fuses_shared(const struct model *m);

/* Fills layout[n_layers]; returns n_layers. */
int model_kv_layout(const struct model *m, struct kv_layer_layout *layout, int max_layers);

/* A batch staged on the device: its metadata (bb: positions, q_start, KV
 * page lists) and the token ids and KV out slots of its bb->n_tokens rows,
 * all device memory. */
struct backend_batch;
struct model_step {
    const struct backend_batch *bb;
    const int32_t *ids;  /* [n_tokens] */
    const int32_t *slot; /* [n_tokens] */
    /* The same batch on the host (without the runner's graph padding:
     * staged sequences past host->n_seqs are one-token pads), for choices
     * made per sequence from its shape; NULL: none (every choice takes its
     * default). */
    const struct batch *host;
    /* A hybrid KV pool (kv_pool.h): the sliding layers' pages and slots
     * (their K/V buffers hold the pool's sliding pages); NULL: none. */
    const struct backend_batch *swa_bb;
    const int32_t *swa_slot;
};

/* Embedding and every layer: the residual stream after the last layer is
 * left for the head (below); the new tokens' K/V are in kv. Enqueued on the
 * backend; nothing waits for the host, so it can be recorded in a graph
 * where model_graphable says so. */
void model_forward_layers(struct model *m, struct kv_pool *kv, const struct model_step *s);
/* 1 when model_forward_layers of up to n rows runs without the host (MoE
 * layers whose routing the backend keeps on the device). */
int model_graphable(const struct model *m, long n);

/* ---- Pipeline parallel (model_parallel.pp_size > 1; model/pipeline.c) ----
 *
 * model_forward_layers runs the rank's stage: stage 0 starts from the
 * embedding, a later stage from the residual stream the stage before sent
 * (model_pp_recv_hidden before the call); the stage's layers only. The
 * runner moves the stream on (model_pp_send_hidden after the call) and
 * only the last stage runs the head. The KV pool of a stage holds its
 * layers (model_kv_layout). Failed transfers end the process as the
 * collectives do. */
struct model_stage {
    int stage, stages;  /* 0, 1 when not split */
    int layer0, layer1; /* this stage's layers [layer0, layer1) */
    int rank;           /* this rank in pp_comm (0 when not split) */
    int tp_size, tp_rank;
};
void model_stage_of(const struct model *m, struct model_stage *s);
/* Rows 0..n-1 of the residual stream (h and the last sublayer's pending
 * output) to the next stage's rank / from the previous stage's. */
void model_pp_send_hidden(struct model *m, long n);
void model_pp_recv_hidden(struct model *m, long n);
/* buf[count] f32 (device) to / from rank peer of pp_comm. */
void model_pp_send(struct model *m, const float *buf, size_t count, int peer);
void model_pp_recv(struct model *m, float *buf, size_t count, int peer);

/* The head, after model_forward_layers. model_final_norm applies the final
 * norm to n rows of the residual stream: rows (device [n]) picks them,
 * NULL takes rows 0..n-1 in place. model_lm_head writes
 * logits[r][vocab] (device) for normed rows r0..r0+r. model_norm_lm_head
 * is both for rows 0..n-1 in one backend call. */
void model_final_norm(struct model *m, const int32_t *rows, long n);
void model_lm_head(struct model *m, float *logits, long r0, long r);
void model_norm_lm_head(struct model *m, float *logits, long n);

#endif
