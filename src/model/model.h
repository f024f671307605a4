/* model.h — a loaded model and its forward pass.
 *
 * model_load reads config.json, generation_config.json and the safetensors
 * weights of a checkpoint folder (or builds random weights from config.json
 * alone with load_format "dummy"), places the weights on a backend, and
 * reserves the activations for the largest batch up front. model_forward
 * runs one ragged batch (model/batch.h) against a KV pool whose layout came
 * from model_kv_layout, and returns fp32 logits of the requested rows.
 *
 * Only this folder knows architectures: a family file (llama.c,
 * deepseek.c; moe.c for the experts) provides loading and forward of its layers.
 */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stdint.h>

#include "cache/kv_pool.h"
#include "model/batch.h"
#include "model/config.h"

struct backend;
struct kiln_error;
struct model;

struct model_options {
    const char *load_format; /* "auto" (safetensors) or "dummy" (random weights) */
    int max_batch_tokens;    /* largest n_tokens of a batch (default 2048) */
    int max_seqs;            /* largest n_seqs of a batch (default 256) */
    int max_context;         /* longest sequence (default: max_position_embeddings) */
    int page_size;           /* KV page size the batches will use (default 1) */
    uint64_t seed;           /* dummy weights */
    int no_graphs;           /* 1: never replay decode steps from graphs (also KILN_GRAPHS=0) */
    /* 1: DeepSeek's shared expert stays a separate MLP instead of joining
     * the routed experts (moe.c; also KILN_SHARED_EXPERTS_FUSION=0) */
    int no_shared_expert_fusion;
    /* 1: checkpoint weights may still be copying to the device when
     * model_load returns (backends with weight_upload_later); the model may
     * run (warm-up) but computes on partly loaded weights until
     * model_weights_ready. */
    int defer_weights;
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

/* Fills layout[n_layers]; returns n_layers. */
int model_kv_layout(const struct model *m, struct kv_layer_layout *layout, int max_layers);

/* Start-up warm-up (kernel prewarm by decode bucket): on a backend with
 * graphs, runs and records every decode bucket's graph and runs a prefill
 * at every power-of-two token count up to the reserved batch, each with
 * its largest shape, so no request pays a first-seen cost. Uses scratch
 * KV pages and returns them; call before the first request. Logs what was
 * warmed and how long it took. A backend without graphs (the CPU) has
 * nothing to warm and returns at once. */
int model_warmup(struct model *m, struct kv_pool *kv, struct kiln_error *err);

/* Runs the batch; writes logits[n_logit_rows][vocab] (host memory). */
int model_forward(struct model *m, struct kv_pool *kv, const struct batch *b, float *logits,
                  struct kiln_error *err);

/* ---- sampling on the device (backends with backend_ops.sample) ----------
 *
 * model_forward_sample runs the batch like model_forward, but samples the
 * logit rows on the device and copies back only their token ids; rows
 * marked want_logits (scores, logprobs: what the CPU sampler must see)
 * have their logits downloaded instead, and only those. Row j of the
 * batch's logit rows gets tokens[j] (rows not wanting logits), or its
 * logits at logits[k][vocab] where k counts the want_logits rows before it.
 * rows[j].adj_start / n_adj index `adj` (entries of want_logits rows are
 * ignored); at most model_sample_capacity(m, ...) entries per batch. The
 * parameters travel with the batch's staging upload (one pinned copy; a
 * second only when there are adjustments), and decode steps whose rows all
 * sample on the device replay a graph that includes the final norm, the
 * lm_head and the sampling kernels (KILN_GRAPH_SAMPLE=0: graphs cover the
 * layers only, as for model_forward). */
struct backend_sample_row;
struct backend_sample_adj;
struct model_sampling {
    const unsigned char *want_logits;       /* [n_logit_rows]; NULL: none */
    const struct backend_sample_row *rows;  /* [n_logit_rows] */
    const struct backend_sample_adj *adj;   /* [n_adj] */
    int n_adj;
};

/* 1 when the backend samples on the device and KILN_GPU_SAMPLE is not 0. */
int model_can_sample(const struct model *m);
/* Most adjustment entries one batch may carry; most rows it may sample. */
int model_sample_adj_capacity(const struct model *m);
int model_forward_sample(struct model *m, struct kv_pool *kv, const struct batch *b,
                         const struct model_sampling *s, int32_t *tokens, float *logits,
                         struct kiln_error *err);
/* Runs the device sampler over representative batch sizes and
 * configurations (first-use costs out of the way); returns seconds, 0
 * where the model does not sample on the device. */
double model_sample_warmup(struct model *m);

#endif
