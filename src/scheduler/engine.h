/* engine.h — the serving engine: one thread that owns the model, the KV
 * pool, the radix prefix cache and the scheduler, fed through queues.
 *
 * Other threads (the HTTP server) call engine_submit / engine_abort; both
 * only enqueue and return at once. The engine thread runs continuous
 * batching steps and reports progress through each request's callback,
 * which is called ON THE ENGINE THREAD and must not block: copy what is
 * needed and hand it to your own thread (e.g. libevent's event_active).
 *
 * A request is never dropped: every submitted request gets exactly one
 * final event (finish != ENGINE_FINISH_NONE) with its reason: stop (eos,
 * stop token or stop string), length (max_tokens or context), abort
 * (engine_abort, or shutdown) or error (with a message). After its final
 * event the engine never touches the request's callback again.
 *
 * Text: the engine detokenizes incrementally (stop strings must be found
 * where generation is controlled, so no step is wasted); events carry the
 * newly final text with any matched stop string and what follows removed.
 */
#ifndef KILN_SCHEDULER_ENGINE_H
#define KILN_SCHEDULER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "sample/sampling.h"

struct dist_comm;
struct kiln_error;
struct engine;
struct model_parallel;
struct grammar;
struct kiln_tokenizer;

enum engine_finish {
    ENGINE_FINISH_NONE = 0, /* not finished: a progress event */
    ENGINE_FINISH_STOP,
    ENGINE_FINISH_LENGTH,
    ENGINE_FINISH_ABORT,
    ENGINE_FINISH_ERROR,
};

const char *engine_finish_name(enum engine_finish f); /* "stop", "length", "abort", "error" */

struct engine_event {
    uint64_t request_id;
    /* new output tokens since the last event */
    int n_tokens;
    const int32_t *tokens;
    const struct sample_result *samples; /* [n_tokens], logprobs when asked */
    /* newly final text (UTF-8, never a broken sequence) */
    const char *text;
    size_t text_len;
    enum engine_finish finish;
    const char *error;        /* ENGINE_FINISH_ERROR: what went wrong */
    enum kiln_error_code error_code; /* ENGINE_FINISH_ERROR: its kind (out_of_memory, internal, ...) */
    const char *matched_stop; /* the stop string that ended it, or NULL */
    int32_t matched_stop_id;  /* the stop token id that ended it, or -1 */
    /* usage, valid in every event */
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;        /* prompt tokens served from the prefix cache */
    /* prompt logprobs (engine_request.prompt_logprobs): the logprobs of the
     * prompt tokens at positions [prompt_logprob_pos, + n_prompt_logprobs),
     * each given the tokens before it, in progress events (n_tokens 0) as
     * the prefill computes them, in order, before the first output token */
    int n_prompt_logprobs;
    int prompt_logprob_pos;
    const struct sample_result *prompt_logprobs;
    /* score requests: probabilities/logits of the label tokens, on the final event */
    int n_scores;
    const float *scores;
    /* the request's stages so far (time_now() seconds; 0: not reached) */
    struct engine_timing {
        double arrival;     /* engine_submit */
        double admitted;    /* first taken into a batch (left the queue) */
        double first_token; /* its first output token (prefill done) */
        int prefill_chunks; /* prompt chunks run (retracted requests run theirs again) */
        int retractions;    /* times it gave its KV back to make room */
    } timing;
};

typedef void (*engine_callback)(void *user, const struct engine_event *ev);

struct engine_request {
    const int32_t *prompt;    /* copied by engine_submit */
    int n_prompt;
    struct sampling_params sampling; /* logit_bias copied */
    int max_new_tokens;       /* 0 allowed (prefill only) */
    int min_new_tokens;
    int ignore_eos;
    int n_stop;
    const char *const *stop;  /* stop strings, copied */
    int n_stop_ids;
    const int32_t *stop_ids;  /* copied */
    int skip_special_tokens;  /* in the text of events (default 1) */
    int priority;             /* larger runs first when the policy is priority */
    const char *cache_salt;   /* prefix-cache isolation key (NULL = shared) */
    /* the sampling fields (SAMPLING_FIELD_* bits) the client left unset:
     * with engine_options.sampling_defaults MODEL they take the values of
     * the model's generation_config.json where it has them */
    unsigned sampling_unset;
    /* prompt logprobs: the logprob of every prompt token from position
     * prompt_logprob_start on (position 0 has none: it is given nothing),
     * with sampling.top_logprobs alternatives; see engine_event */
    int prompt_logprobs;
    int prompt_logprob_start;
    /* score requests: prefill only, no sampling; report label probabilities
     * at the last prompt position */
    int score;
    int n_label_ids;
    const int32_t *label_ids;
    int apply_softmax;
    /* structured output: the output must match this compiled grammar
     * (NULL: free text). engine_submit takes a reference of its own (the
     * caller drops its own when it likes); refused when the engine has no
     * tokenizer. Tokens the grammar cannot continue with are masked out;
     * once it can end, the end-of-sequence and stop ids are allowed, and
     * once nothing can follow, only they are: drawing one ends the request
     * with "stop". max_new_tokens before the end: "length". */
    struct grammar *grammar;
    /* the grammar applies only to what follows these output tokens (e.g. a
     * reasoning model's end of thinking); until they are generated the
     * output is free. NULL / 0: from the first token. Copied. */
    const int32_t *grammar_after;
    int n_grammar_after;
    engine_callback callback;
    void *user;
};

enum schedule_policy { SCHEDULE_FCFS = 0, SCHEDULE_LPM, SCHEDULE_PRIORITY };

/* Where a request's unset sampling fields come from: the model's
 * generation_config.json (SGLang's and vLLM's default), or the OpenAI
 * defaults (temperature 1, no top_p / top_k / min_p, no penalty). */
enum engine_sampling_defaults { ENGINE_SAMPLING_DEFAULTS_MODEL = 0, ENGINE_SAMPLING_DEFAULTS_OPENAI };

/* The most draft tokens a decode row carries (engine_options.spec_draft_tokens). */
enum { ENGINE_SPEC_MAX_DRAFT = 16 };

struct engine_options {
    const char *model_dir;
    const char *device;           /* cpu | cuda | auto */
    const char *load_format;      /* auto | dummy */
    const char *quantization;     /* NULL | fp8 (model_options.quantization) */
    int no_shared_expert_fusion;  /* model_options.no_shared_expert_fusion */
    int dummy_routing;            /* model_options.dummy_routing (enum model_routing; benchmarks) */
    int moe_count;                /* count touched experts from the start (engine_moe_counts) */
    int threads;
    int page_size;                /* default 1 */
    int max_running_requests;     /* default 256 */
    int max_queued_requests;      /* 0 = unbounded */
    int chunked_prefill_size;     /* tokens of prefill per step; 0 = 8192 on a GPU, 512 on the CPU */
    int max_total_tokens;         /* KV pool size in tokens; 0 = from memory */
    double mem_fraction_static;   /* GPU: share of device memory for weights + KV cache;
                                     0 = 0.88 (SGLang's default for large GPUs) */
    /* a model with sliding and full layers: the sliding layers' KV pool
     * against the full layers' in tokens (0 = 0.8, as SGLang), or one pool
     * for every layer (runner_options) */
    double swa_full_tokens_ratio;
    int disable_hybrid_swa;
    /* Speculative decoding, NGRAM (spec.c): a request's decode row carries
     * up to spec_draft_tokens tokens guessed from its own earlier tokens
     * (what followed the earlier place matching the most of its last
     * spec_min_window .. spec_max_window tokens), verified in the same
     * forward; 0: off. */
    int spec_draft_tokens;                /* 0 .. ENGINE_SPEC_MAX_DRAFT */
    int spec_min_window, spec_max_window; /* 0: 1 and 12, as SGLang */
    int context_length;           /* 0 = the model's */
    enum schedule_policy policy;
    int disable_radix_cache;
    /* The prefix cache's host tier (cache/host_cache.h; SGLang's
     * --enable-hierarchical-cache): pages the device evicts are kept in
     * host memory, hicache_size_gb of it, or else hicache_ratio times the
     * device pool (0: 2). One rank, no sliding windows. */
    int enable_hicache;
    double hicache_ratio, hicache_size_gb;
    int skip_sampler_warmup;
    int skip_warmup;              /* no kernel/graph prewarm by bucket (GPU) */
    int log_requests;
    int deterministic;            /* batch-invariant results (backend_options.deterministic) */
    int kv_fp8;                   /* an FP8 KV cache (backend_options.kv_fp8) */
    enum engine_sampling_defaults sampling_defaults;
    int decode_log_interval;      /* a "Decode batch" log line every N decode steps; 0 = none
                                     (engine_options_default: 40, as SGLang) */
    /* rank 0 of a multi-rank job (docs/distributed.md): */
    int device_index;             /* backend_options.device */
    const struct model_parallel *par; /* model_options.par; NULL: one rank */
    struct dist_comm *ctrl;       /* runner_options.ctrl */
};

void engine_options_default(struct engine_options *o);

int engine_create(struct engine **out, const struct engine_options *opt, struct kiln_error *err);
/* Stops accepting, aborts what is still running (each gets its final
 * ENGINE_FINISH_ABORT event), joins the thread, frees everything. */
void engine_destroy(struct engine *e);

/* Validates and enqueues. Returns the request id (> 0), or 0 with a message
 * and a code in err; then no event will ever be sent. Codes:
 * KILN_ERR_OVERLOADED (the queue is full: retry later), KILN_ERR_UNAVAILABLE
 * (shutting down), KILN_ERR_TOO_LARGE (longer than the context or the KV
 * cache), KILN_ERR_BAD_INPUT (anything else the client got wrong). */
uint64_t engine_submit(struct engine *e, const struct engine_request *r, struct kiln_error *err);
/* Asks for a request to end (client gone); its KV is freed at the next step
 * and it gets a final ENGINE_FINISH_ABORT event. Unknown ids are ignored. */
void engine_abort(struct engine *e, uint64_t request_id);

/* Read-only facts for the server. */
const struct kiln_tokenizer *engine_tokenizer(const struct engine *e);
/* The tokenizer's tokens as a grammar vocabulary (built at start, for the
 * model's vocabulary size), to compile and prepare grammars against; NULL
 * when the engine has no tokenizer. */
struct grammar_vocab;
const struct grammar_vocab *engine_grammar_vocab(const struct engine *e);
const char *engine_model_name(const struct engine *e);
int engine_context_length(const struct engine *e);
int engine_vocab_size(const struct engine *e);
/* The sampling defaults requests get for their unset fields (the model's,
 * or the OpenAI ones with ENGINE_SAMPLING_DEFAULTS_OPENAI), and which
 * fields the model's generation_config.json set (SAMPLING_FIELD_* bits; 0
 * with ENGINE_SAMPLING_DEFAULTS_OPENAI). */
unsigned engine_sampling_defaults(const struct engine *e, struct sampling_params *out);
const struct engine_options *engine_options(const struct engine *e);

/* A snapshot of counters for /metrics (thread-safe). */
struct engine_stats {
    int running, waiting;
    /* every DP attention group's pages (kv_groups pools of kv_pages_total /
     * kv_groups pages; 1 without DP attention) */
    long kv_pages_total, kv_pages_free, kv_pages_cached; /* cached = held by the radix cache only */
    int page_size, kv_groups;
    /* a hybrid pool (kv_pool.h): the sliding layers' pages (0 otherwise) */
    long kv_swa_pages_total, kv_swa_pages_free;
    long kv_swa_pages_shed_total; /* sliding pages the prefix cache gave back when they ran short */
    long prompt_tokens_total, cached_tokens_total, generation_tokens_total;
    long requests_finished[5]; /* by enum engine_finish */
    long retractions_total;
    /* speculative decoding: tokens drafted, and of those the ones accepted */
    long spec_draft_tokens_total, spec_accepted_tokens_total;
    /* the prefix cache's host tier (0 pages: off): pages held and their
     * room, pages copied out at eviction, prompt tokens loaded back */
    long hicache_pages, hicache_pages_total, hicache_saved_pages_total, hicache_loaded_tokens_total;
};
void engine_stats(struct engine *e, struct engine_stats *out);

/* Benchmarks (engine_options.moe_count): the touched-expert counts of the
 * MoE layers so far (model_moe_counts; out[max] may be NULL), read on the
 * engine thread between steps; reset zeroes them afterwards. Waits for
 * the step in flight. Returns how many layers, or -1 when the engine
 * counts nothing or is shutting down. */
struct model_moe_layer;
int engine_moe_counts(struct engine *e, struct model_moe_layer *out, int max, int reset);

#endif
