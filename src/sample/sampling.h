/* sampling.h — per-request sampling parameters and the CPU sampler.
 *
 * The sampler turns one row of logits into the next token, applying in
 * order: logit_bias, repetition / frequency / presence penalties (over the
 * request's generated tokens; repetition also over the prompt, as in
 * vLLM/SGLang/HF), temperature, then top_k, top_p and min_p filtering, and
 * draws from the resulting distribution with the request's own random
 * stream. temperature == 0 (or top_k == 1) is greedy: the first index of
 * the largest logit.
 *
 * Reproducibility: a request's random stream is a counter-based generator
 * keyed by (seed, output position), so a seeded request draws the same
 * tokens whatever else is in the batch and however the steps are split.
 *
 * Logprobs are of the distribution after penalties and temperature but
 * before top-k/top-p/min-p truncation (OpenAI / vLLM "processed" default is
 * raw; we report log_softmax of the raw logits, like OpenAI, see
 * sampler_logprobs).
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

/* Samples one token from logits[vocab] (modified in place as scratch).
 * `step` is the index of the output token being drawn (0 for the first);
 * with the seed it selects the random draw. `scratch` must hold
 * 2 * vocab floats. */
void sampler_sample(const struct sampling_params *p, struct sampler_state *s, float *logits,
                    int vocab, uint64_t step, float *scratch, struct sample_result *out);

/* Runs the sampler over representative batch sizes and configurations so
 * that the first real request pays no first-use cost (SEEDS: sampler
 * warm-up). Returns the seconds it took. */
double sampler_warmup(int vocab, const int *batch_sizes, int n_batch_sizes);

#endif
