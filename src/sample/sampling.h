/* sampling.h — per-request sampling parameters and the CPU sampler.
 *
 * The sampler turns one row of logits into the next token, applying in
 * order: logit_bias, repetition / frequency / presence penalties (over the
 * request's generated tokens; repetition also over the prompt, as in
 * vLLM/SGLang/HF), temperature, then top_k, top_p and min_p filtering, and
 * draws from the resulting distribution with the request's own random
 * stream. temperature == 0 (or top_k == 1) is greedy: the first index of
 * the largest logit after bias and penalties. top_k <= 0 or >= vocab,
 * top_p >= 1 and min_p <= 0 are off.
 *
 * Reproducibility: a request's random stream is a counter-based generator
 * keyed by (seed, output position), so a seeded request draws the same
 * tokens whatever else is in the batch and however the steps are split.
 * The sampler always uses `seed` as given: for a request without a seed
 * (has_seed == 0) the engine fills `seed` from its own generator, so such a
 * request is random across requests but still replayable inside the engine.
 *
 * Logprobs (the chosen token's and top_logprobs) are log_softmax of the RAW
 * logits as received, before logit_bias, penalties, temperature and any
 * truncation: what the model thinks, independent of how we sampled (vLLM's
 * default "raw_logprobs"). top_logprobs are ordered by logprob descending,
 * ties by lower id.
 *
 * top_p keeps the smallest set, in order of logit descending then id
 * ascending, whose cumulative probability reaches top_p (the top token is
 * always kept); the comparison allows a slack of 1e-6 so that boundaries
 * that are exact in decimal (0.5 + 0.25 >= 0.75) are not lost to float
 * rounding. top_k ties at the k-th logit are broken the same way (lower ids
 * kept). min_p is applied after top_k and top_p, relative to the top token.
 * Non-finite logits: NaN is never chosen; -inf has probability 0. Tokens
 * whose weight is below 2^-40 of the top token's are treated as weight 0
 * (never drawn; the total moves by at most vocab * 2^-40).
 *
 * Cost (vocab 151936, one core): greedy ~11 us, top_k ~50 us, anything that
 * needs the whole softmax (plain temperature, min_p, top_p, logprobs)
 * ~250 us; see bench/bench_sampler.c. No allocation per call.
 *
 * On the GPU (backend_ops.sample, src/backend/cuda/cuda_sample.cu; the
 * engine uses it when the backend has it): the same semantics. Greedy is
 * identical; the bias / penalty / stop-mask adjustments are the same float
 * operations (sampler_build_adjustments turns a row's state into a sparse
 * list); the weight argument, the 2^-40 cut and the min_p test are the
 * same float operations and exp polynomial, so top_k, min_p and the cut
 * keep the same tokens, and top_p the same prefix up to rounding of the
 * mass sums (the GPU weighs tokens with a fast exp, 2^-21 relative, and
 * sums them in exact 64-bit fixed point); the draw uses the same
 * uniform01(seed, step). One difference: the GPU's
 * inverse-CDF walk visits the kept tokens in ascending id order, the CPU's
 * in the order its selection left them, so a given u may pick a different
 * token; the kept set and the probabilities are the same, and a seeded
 * request still depends only on (seed, step) on either device. Rows that
 * ask for logprobs (or scores) are sampled on the CPU from downloaded
 * logits. Cost on an H100 (vocab 151936, docs/cuda-decode.md "Sampling on the
 * GPU"): greedy 6.5 us for one row, 20 us for 64; top_k 50 56 / 73 us;
 * top_p 0.9 92 / 109 us. (Where the CPU skips a group of 16 logits wholly below the 2^-40
 * cut it may zero a token of weight ~2^-40 that the GPU keeps.)
 */
#ifndef KILN_SAMPLE_SAMPLING_H
#define KILN_SAMPLE_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLING_MAX_TOP_LOGPROBS 20

struct logit_bias_entry {
    int32_t id;
    float bias;
};

struct sampling_params {
    float temperature;        /* 0 = greedy; default 1.0 */
    int top_k;                /* <= 0 = off */
    float top_p;              /* 1.0 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1.0 = off; > 1 discourages repeats (HF semantics) */
    float frequency_penalty;  /* 0 = off; OpenAI semantics, in [-2, 2] */
    float presence_penalty;   /* 0 = off; OpenAI semantics, in [-2, 2] */
    int n_logit_bias;
    const struct logit_bias_entry *logit_bias; /* owned by the request */
    int has_seed;
    uint64_t seed;
    int logprobs;             /* return the chosen token's logprob */
    int top_logprobs;         /* 0..SAMPLING_MAX_TOP_LOGPROBS alternatives */
};

void sampling_params_default(struct sampling_params *p);

/* The fields a model's generation_config.json may give defaults for, as
 * bits of a mask (which ones a request left unset, which ones a model sets). */
enum {
    SAMPLING_FIELD_TEMPERATURE = 1u << 0,
    SAMPLING_FIELD_TOP_P = 1u << 1,
    SAMPLING_FIELD_TOP_K = 1u << 2,
    SAMPLING_FIELD_MIN_P = 1u << 3,
    SAMPLING_FIELD_REPETITION_PENALTY = 1u << 4,
    SAMPLING_FIELD_ALL = (1u << 5) - 1,
};
/* Copies the fields in `mask` from `from` to `to`. */
void sampling_params_take(struct sampling_params *to, const struct sampling_params *from, unsigned mask);
/* Checks ranges a client can get wrong (temperature >= 0, top_p in (0, 1],
 * min_p in [0, 1], repetition_penalty > 0, frequency/presence in [-2, 2],
 * logit_bias ids in [0, vocab) with bias in [-100, 100], top_logprobs in
 * 0..SAMPLING_MAX_TOP_LOGPROBS). Returns 0, or -1 with a message naming the
 * field. The sampler itself assumes valid parameters. */
struct kiln_error;
int sampling_params_validate(const struct sampling_params *p, int vocab, struct kiln_error *err);

/* Per-request state the penalties need: counts of generated tokens and the
 * set of prompt tokens. Sized to the vocabulary; created once per request. */
struct sampler_state;
struct sampler_state *sampler_state_create(int vocab_size, const int32_t *prompt, int n_prompt);
void sampler_state_free(struct sampler_state *s);
/* Records a generated token (after it was chosen). */
void sampler_state_accept(struct sampler_state *s, int32_t token);

struct sample_result {
    int32_t token;
    float logprob;                     /* of the chosen token */
    int n_top;
    int32_t top_ids[SAMPLING_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLING_MAX_TOP_LOGPROBS];
};

/* Applies logit_bias and the penalties to logits[vocab] in place: the first
 * stage of sampler_sample, exposed for tests and for callers that sample
 * elsewhere (s may be NULL when no penalties apply). */
void sampler_process_logits(const struct sampling_params *p, const struct sampler_state *s,
                            float *logits, int vocab);

/* Samples one token from logits[vocab] (modified in place as scratch).
 * `step` is the index of the output token being drawn (0 for the first);
 * with the seed it selects the random draw. `scratch` must hold
 * 2 * vocab floats. */
void sampler_sample(const struct sampling_params *p, struct sampler_state *s, float *logits,
                    int vocab, uint64_t step, float *scratch, struct sample_result *out);

/* The raw logprob of `token` in logits[vocab] (log_softmax, nothing
 * applied) and the n_top most likely tokens (capped at
 * SAMPLING_MAX_TOP_LOGPROBS), as sampler_sample reports them: for prompt
 * logprobs, where the token is given, not drawn. */
void sampler_logprob_of(const float *logits, int vocab, int32_t token, int n_top,
                        struct sample_result *out);

/* Test hook: weights[vocab] = the weight (relative to the top token's 1)
 * of every token sampler_sample could draw from the already processed
 * logits (bias and penalties applied), 0 for the others: the set left by
 * top_k, top_p and min_p, with positive weight. A greedy configuration
 * gives its one token weight 1. Returns the number of kept tokens.
 * scratch: 2 * vocab floats. */
int sampler_kept_set(const struct sampling_params *p, const float *logits, int vocab,
                     float *scratch, float *weights);

/* ---- device sampling (backend_ops.sample) ---- */
struct backend_sample_row;
struct backend_sample_adj;
/* Row parameters for backend_ops.sample; adj_start / n_adj left 0. */
void sampler_row_params(const struct sampling_params *p, uint64_t step,
                        struct backend_sample_row *row);
/* The adjustments sampler_process_logits (and the engine's stop masks,
 * mask_ids: set to -inf first; ids outside [0, vocab) ignored) would make
 * to a row, as at most one entry per token into out[cap]. slot: vocab
 * int32 all -1, left so. Returns the entry count, or -1 when the row
 * cannot be expressed (a logit_bias id given twice, which the CPU adds
 * twice; more than cap entries): sample that row on the CPU. */
int sampler_build_adjustments(const struct sampling_params *p, const struct sampler_state *s,
                              const int32_t *mask_ids, int n_mask, int vocab,
                              struct backend_sample_adj *out, int cap, int32_t *slot);

/* Runs the sampler over representative batch sizes and configurations so
 * that the first real request pays no first-use cost (the sampler
 * warm-up). Returns the seconds it took. */
double sampler_warmup(int vocab, const int *batch_sizes, int n_batch_sizes);

#endif
