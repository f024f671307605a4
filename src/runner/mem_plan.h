/* mem_plan.h — the memory plan: how a device's memory is split between the
 * weights, everything a step needs (the activations, the runner's buffers,
 * the backend's scratch) and the KV pool, as a pure function of the
 * model's config, the options and the device's memory, so it can be
 * computed (and tested) without the device.
 *
 * As SGLang's --mem-fraction-static: the weights and the KV pool take
 * mem_fraction_static of the device (default 0.88); the rest,
 * (1 − mem_fraction_static) of the device, stays back for activations,
 * scratch, graphs and library workspaces. Every buffer a step of any size
 * up to the largest batch allocates is counted (mem_plan.counted: the
 * model's activation buffers, the runner's staging / logits / sampling
 * buffers, the backend's scratch for the largest step from
 * backend_ops.workspace_bytes, and a fixed headroom for what no one can
 * count exactly: graph executables, kernels loaded on first use,
 * allocator slack); where that exceeds the fraction kept back, the plan
 * keeps back the count instead, so nothing allocated after start-up falls
 * outside the plan. The pool is capped at what every running request at
 * full context could use, and refused when it cannot hold one prefill
 * chunk plus a token. When every layer slides over a window W (`window`),
 * a running request keeps at most mem_plan_window_tokens of KV (the
 * scheduler returns the pages its window left), so the cap is that per
 * request plus one prefill chunk.
 *
 * Without a device that reports its memory (the CPU), the pool is up to
 * 2 GiB. A given kv_tokens (--max-total-tokens) overrides the plan. */
#ifndef KILN_RUNNER_MEM_PLAN_H
#define KILN_RUNNER_MEM_PLAN_H

#include <stddef.h>

struct kiln_error;

/* What the plan counts for graphs, lazily loaded kernels and slack. */
#define MEM_PLAN_HEADROOM ((size_t)1 << 30)

struct mem_plan_in {
    size_t device_total;   /* 0: the device reports no memory (the CPU) */
    size_t device_free;    /* free before the model loaded */
    double mem_fraction_static; /* <= 0: 0.88 */
    long kv_tokens;        /* > 0: given, no plan */
    size_t kv_token_bytes; /* KV bytes a token takes (every layer) */
    long max_context;
    int max_running_requests, chunked_prefill_size;
    int window, page_size; /* every layer's sliding window (0: none), the pool's page size */
    /* the counts (model_config_weight_bytes + derived, model_activation_bytes,
     * mem_plan_runner_bytes, backend_ops.workspace_bytes) */
    size_t weights, activations, runner, workspace;
};

struct mem_plan {
    size_t weights;
    size_t counted;   /* activations + runner + workspace + headroom */
    size_t reserve;   /* kept back beside weights and the KV pool: max((1 − f)·total, counted) */
    size_t kv_bytes;
    long kv_tokens;
    long need_tokens; /* the least pool that serves: one prefill chunk and a token */
    double fraction;  /* mem_fraction_static used */
};

/* The most KV tokens a running request of a model whose every layer
 * slides over `window` keeps at once, chunk aside: its window, the page
 * its window starts in, the page it writes, and a prefix of up to one
 * window that the prefix cache shares (locked until the window has passed
 * it). A prefill chunk adds its own tokens. */
long mem_plan_window_tokens(int window, int page_size);

/* A hybrid KV pool (cache/kv_pool.h): the sliding layers' tokens beside
 * `tokens` of the full layers' at `ratio` (<= 0: 0.8, SGLang's
 * swa_full_tokens_ratio): ratio x tokens, but at least one request's
 * window (mem_plan_window_tokens) beside a batch of max_batch_tokens, and
 * at most `tokens`; a multiple of page_size. */
long mem_plan_swa_tokens(long tokens, double ratio, int window, int page_size, long max_batch_tokens);
/* The ratio a hybrid pool's plan uses (0.8 where ratio <= 0). */
double mem_plan_swa_ratio(double ratio);

/* Fills *p; -1 with a message giving the numbers and what to change when
 * the pool cannot hold need_tokens. */
int mem_plan_compute(const struct mem_plan_in *in, struct mem_plan *p, struct kiln_error *err);

/* The runner's device buffers for batches of T rows and S sequences: the
 * staging buffer (page lists of S sequences at max_context), the logits
 * of one chunk of rows, and the device sampler's buffers (device_sampling). */
struct mem_plan_runner {
    long logit_chunk, pages_cap, stage_ints, stage_srows_off, stage_pages_off, stage_swa_off;
    int adj_cap;
};
/* hybrid: the KV pool is hybrid (cache/kv_pool.h), so batches carry the
 * sliding layers' slots and pages too */
void mem_plan_runner_layout(long T, long S, long max_context, int page_size, int device_sampling, int hybrid,
                            struct mem_plan_runner *l);
size_t mem_plan_runner_bytes(long T, long S, long max_context, int page_size, long vocab,
                             int device_sampling, int hybrid);

#endif
