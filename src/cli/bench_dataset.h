/* bench_dataset.h — the benchmark workloads, as bench_serving builds them.
 *
 *   random        prompts of random ordinary token ids; input lengths uniform
 *                 in [max(len*ratio, 1), len], output lengths in
 *                 [max(len*ratio, 1), len].
 *   sharegpt      a ShareGPT JSON file: conversations[0] (human) is the
 *                 prompt, the token count of conversations[1] (gpt) the
 *                 output length; shuffled with the seed; pairs with fewer
 *                 than 2 prompt or output tokens, or longer than
 *                 --sharegpt-context-len, are skipped.
 *   shared-prefix groups of prompts "<system prompt>\n\n<question>" that share
 *                 one random system prompt per group; shuffled.
 *   score         one query and N items per request for POST /v1/score.
 *
 * Random text is made so that the server sees the intended length: ids are
 * decoded, re-encoded and topped up or truncated until the text's own
 * tokenization has the target count (a few rounds; what remains off is
 * reported honestly in prompt_len, which always counts the final text
 * encoded with the tokenizer's special tokens, as the server counts it).
 */
#ifndef KILN_CLI_BENCH_DATASET_H
#define KILN_CLI_BENCH_DATASET_H

#include "cli/bench.h"

struct bench_rng;

int bench_dataset_build(const struct bench_options *o, const struct kiln_tokenizer *tok,
                        struct bench_rng *rng, struct bench_prompt **out, int *n_out,
                        struct kiln_error *err);
void bench_prompts_free(struct bench_prompt *p, int n);

/* The default score labels: the first `n` ids that are neither special nor
 * byte-fallback tokens. Returns how many were found. */
int bench_default_label_ids(const struct kiln_tokenizer *tok, int32_t *out, int n);

#endif
