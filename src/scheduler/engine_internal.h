/* engine_internal.h — the engine's state, shared by engine.c (thread and
 * queues) and scheduler.c (what runs in each step). Everything below the
 * "engine thread only" line is touched by the engine thread alone. */
#ifndef KILN_SCHEDULER_ENGINE_INTERNAL_H
#define KILN_SCHEDULER_ENGINE_INTERNAL_H

#include <pthread.h>

#include "cache/kv_pool.h"
#include "model/model.h"
#include "runner/runner.h"
#include "scheduler/engine.h"
#include "scheduler/request.h"
#include "tensor/backend.h"

struct radix_tree;

struct engine {
    struct engine_options opt;
    struct backend be;
    struct runner *runner; /* the model's forward steps, the KV pool */
    struct model *model;   /* runner_model(runner) */
    struct kv_pool *kv;    /* runner_kv(runner) */
    struct radix_tree *radix; /* group 0's prefix cache; NULL with --disable-radix-cache */
    /* Per DP attention group g (dp_size of them; one without DP attention):
     * the free list of its page ids and its prefix cache. Every rank's pool
     * holds n_pages pages, and the ranks of group g keep only the KV of g's
     * requests, so page id p of group g is page p of g's ranks' pools: the
     * ids of different groups name different memory. gkv[0] is the
     * runner's pool (rank 0 is in group 0); the others are free lists
     * without storage (kv_pool_init_ids). grx[0] == radix. */
    struct kv_pool **gkv;
    struct radix_tree **grx;
    int *g_reserve;           /* [dp_size] a step's admission scratch */
    unsigned char *g_full;    /* [dp_size] */
    struct kiln_tokenizer *tok;
    char *model_name;
    int vocab, context_length, page_size;
    long pool_tokens;
    /* every layer's sliding window (kv_pool.window; 0: none) and the most
     * KV a running request then keeps beside its chunk (mem_plan_window_tokens) */
    int window, window_tokens;
    /* a hybrid pool's sliding window (kv_pool.swa_window; 0: none) */
    int swa_window;
    /* requests' unset sampling fields come from here (engine_sampling_defaults) */
    struct sampling_params sampling_defaults;
    unsigned sampling_defaults_mask;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu; /* guards the fields up to the line below */
    pthread_cond_t cv;
    struct req *inbox, *inbox_tail;
    int n_inbox;
    uint64_t *aborts;
    int n_aborts, cap_aborts;
    int stopping;
    uint64_t next_id, seed_state;
    /* an engine_moe_counts call waiting for the engine thread (on done_cv) */
    struct moe_counts_ask {
        int pending, reset, max, n;
        struct model_moe_layer *out;
    } moe_ask;
    pthread_cond_t done_cv;
    struct engine_stats stats;

    /* ---- engine thread only ---- */
    struct req *waiting, *waiting_tail;
    struct req *running, *running_tail;
    int n_waiting, n_running;
    struct engine_stats counters;
    /* what the last sched_step ran, for the periodic log lines */
    struct sched_step_info {
        int prefill_seqs;   /* requests with prompt tokens in the step */
        int prefill_tokens; /* prompt tokens computed (new and continued chunks) */
        int cached_tokens;  /* prompt tokens the admitted requests found in the cache */
        int decode_rows;    /* requests that sampled a token */
    } step_info;
    enum kiln_error_code step_error; /* the kind of the last failed forward */
    long decode_steps;
    long log_tokens;        /* tokens generated since the last decode log line */
    long log_spec_drafts, log_spec_accepted; /* speculative counters at the last one */
    double log_t;           /* when that line was printed */
    /* step buffers, sized once */
    int max_batch_tokens, max_seqs;
    long pages_cap;
    int32_t *b_ids, *b_pos, *b_slot, *b_rows, *b_qstart, *b_kvlen, *b_pagestart, *b_pages;
    /* DP attention: groups (1: off), each one's load in tokens of the
     * requests it holds, and the step's batch.seq_group */
    int dp_size;
    long *dp_load;
    int32_t *b_group;
    struct req **b_reqs;
    int *b_from, *b_to;
    float *logits;  /* [max_seqs][vocab] */
    float *scratch; /* [2 * vocab] */
    int32_t *match_pages;
    /* the prefix cache's host tier (group 0's pool; NULL: off): each device
     * page the tree holds has its prefix key, parent key and tokens here
     * (hc_set 0: not known), which eviction stores the page under; hc_*
     * scratch of a request's pages */
    struct host_cache *hc;
    uint64_t *hc_key, *hc_parent;
    int32_t *hc_tokens;
    unsigned char *hc_set;
    uint64_t *hc_keys;
    int32_t *hc_pages;
    int hc_closing; /* shutting down: evictions are not stored */
    /* sampling on the device (runner_can_sample): per logit row of a step,
     * whether it needs its logits on the host (scores, logprobs) instead */
    int gpu_sample;
    unsigned char *s_want;             /* [max_seqs] */
    struct backend_sample_row *s_rows; /* [max_seqs] */
    struct backend_sample_adj *s_adj;  /* [s_adj_cap] all rows' adjustments */
    int s_adj_cap;
    int32_t *s_slot;                   /* [vocab], all -1 between uses */
    int32_t *s_tokens;                 /* [max_seqs] */
    int32_t *s_mask;                   /* [s_mask_cap] one row's stop-mask ids */
    int s_mask_cap;
    /* prompt logprob rows: logits (and s_want, s_rows) hold rows_cap rows
     * (0: max_seqs), grown the first time a step has prompt rows */
    int rows_cap;
    struct sample_result *lp_buf;      /* [max prompt rows of a step] */
    /* structured outputs (structured.c): the grammar vocabulary, and this
     * step's mask slots: g_reqs[k] owns slot k of g_masks (the runner's
     * host mask buffer, g_words words a slot) */
    struct grammar_vocab *gvocab;
    struct req **g_reqs;               /* [max_seqs] */
    uint32_t *g_masks;
    int g_words, g_n;
    int32_t *g_slots;                  /* [rows] mask slot per logit row, -1 none */
    struct threadpool *g_pool;         /* fills masks of many rows at once (NULL: one thread) */
    int g_use_pool;                    /* the last step's masks were slow on one thread */
    double g_fill_us;                  /* mask time and rows since the last decode log line */
    long g_fill_rows;
};

/* sched_kv.c: a request's KV pages, the prefix cache and windows */
void sched_release_pages(void *user, const int32_t *pages, int n); /* radix_release_fn over a kv_pool */
int sched_pages_for(const struct engine *e, int tokens);
/* Gives r's KV back: computed pages to the prefix cache, the rest to the pool. */
void sched_release_kv(struct engine *e, struct req *r);
/* After a prefill chunk: r's computed pages join the prefix cache. */
void sched_cache_unfinished(struct engine *e, struct req *r);
/* After a step: what r's window left goes back (every layer sliding; a
 * hybrid pool's sliding pages). */
void sched_window_drop(struct engine *e, struct req *r);
void sched_swa_drop(struct engine *e, struct req *r);
/* r's cached prefix of its first n tokens in group g's tree, into e->match_pages. */
int sched_match_prefix(struct engine *e, int g, const struct req *r, int n, struct radix_node **node);
/* The same, continued with pages the host tier holds (loaded into fresh
 * device pages and added to the tree) when the pool has room for them, a
 * page more and `reserve`: what admission uses. */
int sched_match_load(struct engine *e, int g, const struct req *r, int n, int reserve, struct radix_node **node);
/* The host tier: set-up (after the pool and the trees), the tree's
 * release callback that stores evicted pages (user: the engine), tear-down. */
int sched_hicache_init(struct engine *e, struct kiln_error *err);
void sched_evict_pages(void *user, const int32_t *pages, int n);
void sched_hicache_free(struct engine *e);
/* Group g's pages that could be had (free or evictable); a hybrid pool's sliding ones (an upper bound). */
int sched_available_pages(const struct engine *e, int g);
int sched_available_swa(const struct engine *e, int g);
/* Makes n pages (with their sliding pages) free in group g's pool; -1 when it cannot. */
int sched_make_free(struct engine *e, int g, int n);
/* Gives r pages for positions [0, len); -1 when they cannot be had. */
int sched_grow_pages(struct engine *e, struct req *r, int len);

/* spec.c: speculative decoding (NGRAM) */
/* Whether r's next tokens may be drafted: not a score request, no grammar
 * (its mask is made for one row a step). */
int spec_eligible(const struct engine *e, const struct req *r);
/* Up to max tokens that followed the latest earlier occurrence of r's
 * last w tokens (w from the largest window down), into out; their count. */
int spec_propose(const struct engine *e, const struct req *r, int max, int32_t *out);

/* structured.c */
int sg_init(struct engine *e, struct kiln_error *err);
void sg_free(struct engine *e);
/* The request's matcher (engine_submit): 0, or -1 with err. */
int sg_request_init(struct engine *e, struct req *r, struct kiln_error *err);
void sg_step_begin(struct engine *e);
/* A mask slot for r's sampling row this step, or -1 (no active grammar). */
int sg_assign(struct engine *e, struct req *r);
/* Fills every assigned slot (runner_sampling.fill_masks). */
void sg_fill_masks(void *engine);
/* logits[vocab]: the tokens r's mask clears are -inf (CPU sampling). */
void sg_apply(const struct engine *e, const struct req *r, float *logits);
/* After r drew token: 0 go on, 1 the grammar ended with an end id (finish
 * with "stop"), -1 the grammar refused the token. */
int sg_accept(struct engine *e, struct req *r, int32_t token);
/* After the token joined r->tokens: activates a grammar waiting for
 * in.grammar_after. */
void sg_follow(struct req *r);

int sched_init(struct engine *e, struct kiln_error *err);
void sched_free(struct engine *e);
void sched_enqueue(struct engine *e, struct req *r);
void sched_abort(struct engine *e, uint64_t id, const char *why);
void sched_abort_all(struct engine *e);
int sched_has_work(const struct engine *e);
void sched_step(struct engine *e);
void sched_publish_stats(struct engine *e);

#endif
