/* request.h — one request's life inside the engine: its tokens, its KV
 * pages, its sampler and detokenizer state, and how each new token is
 * turned into an event (stop conditions, stop strings held back until they
 * can no longer match, usage counts).
 *
 * KV ownership: pages[0 .. n_pages) cover positions [0, n_pages*page_size).
 * The first n_tree_tokens positions are backed by pages the radix cache
 * owns (locked through lock_node); the rest belong to the request. When
 * every layer slides (kv_pool.window), pages[0 .. n_dropped) are the
 * pool's zero page: the request's window has left them and their pages
 * went back (n_dropped > 0 only once n_tree_tokens is 0). With a hybrid
 * pool (kv_pool.swa_window), the sliding pages of the request's own pages
 * in [n_tree_tokens / page_size, n_swa_dropped) went back, and the tree's
 * pages its window reads, pages[swa_pin0 .. swa_pin1), are pinned (the
 * tree's others keep their sliding pages until shed or evicted).
 */
#ifndef KILN_SCHEDULER_REQUEST_H
#define KILN_SCHEDULER_REQUEST_H

#include <stdint.h>

#include "base/buf.h"
#include "scheduler/engine.h"

struct radix_node;
struct sampler_state;
struct kiln_detok_stream;
struct kiln_tokenizer;

enum req_state { REQ_WAITING = 0, REQ_RUNNING, REQ_FINISHED };

enum { SPEC_MAX_DRAFT = ENGINE_SPEC_MAX_DRAFT };

struct req {
    uint64_t id;
    struct engine_request in;   /* with owned copies of every array */
    char *salt;                 /* cache_salt ("" when none) */
    int32_t *tokens;            /* prompt followed by output */
    int n_tokens, cap_tokens;
    int n_prompt, n_output;
    int max_new_tokens;
    int n_computed;             /* positions whose KV is in the cache */
    int32_t *pages;
    int n_pages, cap_pages;
    int n_tree_tokens;
    int n_dropped;
    int n_swa_dropped;
    int swa_pin0, swa_pin1;
    /* speculative decoding: this step's draft, tokens n_tokens .. n_tokens +
     * n_draft of its decode row (spec.c) */
    int32_t draft[SPEC_MAX_DRAFT];
    int n_draft;
    struct radix_node *lock_node;
    /* DP attention (engine_options.par->dp_size > 1): the group that holds
     * the request's KV and computes its attention, chosen at sched_enqueue
     * and kept (a retracted request finds its cached prefix there); the
     * tokens it counts in that group's load */
    int dp_group, dp_tokens;
    int cached_tokens;          /* prompt tokens served from the cache (first admission) */
    int admitted_once;
    int n_retracted;
    enum req_state state;
    int abort_requested;
    uint64_t seed;
    double t_arrival;
    double t_admitted;          /* first admission to the running batch (0 before) */
    double t_first_token;       /* first output token appended (0 before) */
    int n_prefill_chunks;       /* prompt chunks run, retracted re-runs included */
    int lp_next;                /* prompt logprobs: the next prompt position whose logprob is
                                   owed (n_prompt: none owed) */
    /* structured output (in.grammar): the matcher follows the output once
     * the grammar is active (at once, or after in.grammar_after) */
    struct grammar_matcher *gm;
    int g_active;
    int g_done;                 /* the grammar was done when this step's mask was made */
    int g_slot;                 /* this step's mask slot (runner_mask_host), -1 none */
    struct sampler_state *sampler;
    struct kiln_detok_stream *detok;
    struct buf pending;         /* text held back while it may start a stop string */
    struct buf emit;            /* the text of the event being built */
    struct req *prev, *next;    /* in the waiting or running list */
};

struct req *req_create(uint64_t id, const struct engine_request *in, int vocab,
                       const struct kiln_tokenizer *tok);
void req_free(struct req *r);

/* Appends a sampled token; returns the finish reason it causes (or NONE)
 * and fills the event's text. `eos` lists the model's end ids. */
struct req_output {
    const char *text;
    size_t text_len;
    enum engine_finish finish;
    const char *matched_stop;
    int32_t matched_stop_id;
};
void req_append_token(struct req *r, int32_t token, const int32_t *eos, int n_eos,
                      int context_length, struct req_output *out);
/* Text still held back (stop-string candidates, detokenizer tail), for a
 * request that ends for another reason. */
void req_flush_text(struct req *r, struct req_output *out);

#endif
