/* spec.c — speculative decoding, NGRAM: drafts from a request's own tokens.
 *
 * A greedy request's decode row carries, after its last token, a few
 * tokens guessed from its history: the tokens that followed the latest
 * earlier occurrence of its last w tokens, w from spec_max_window down to
 * spec_min_window (SGLang's NGRAM drafts from a trie over many requests,
 * as a tree; this is one chain from the request's own prompt and output,
 * prompt lookup). The row is computed as a short prefill with the logits
 * of every position; the scheduler keeps, in order, each token the model
 * picks while it equals the draft before it, and the first that does not
 * (scheduler.c, handle_outputs). Greedy picks depend on the logits alone,
 * so the output is the same as without drafts wherever the logits of a
 * position do not depend on the batch (the CPU's always do; on the GPU
 * with --deterministic). */
#include "sample/sampling.h"
#include "scheduler/engine_internal.h"
#include "scheduler/request.h"

/* the tokens searched for an earlier occurrence: the latest ones (one
 * pass over them a drafted row) */
enum { SPEC_SCAN = 8192 };

int spec_eligible(const struct engine *e, const struct req *r) {
    const struct sampling_params *sp = &r->in.sampling;
    return e->opt.spec_draft_tokens > 0 && !r->in.score && !r->gm && sp->temperature == 0 && !sp->logprobs &&
           sp->top_logprobs == 0 && sp->repetition_penalty == 1.0f && sp->frequency_penalty == 0 &&
           sp->presence_penalty == 0 && sp->n_logit_bias == 0 && r->n_output >= r->in.min_new_tokens;
}

int spec_propose(const struct engine *e, const struct req *r, int max, int32_t *out) {
    const int32_t *h = r->tokens;
    int n = r->n_tokens, lo = n - SPEC_SCAN > 0 ? n - SPEC_SCAN : 0;
    int wmin = e->opt.spec_min_window > 0 ? e->opt.spec_min_window : 1;
    int wmax = e->opt.spec_max_window > 0 ? e->opt.spec_max_window : 12;
    if (max > SPEC_MAX_DRAFT) max = SPEC_MAX_DRAFT;
    if (max <= 0 || n < 2) return 0;
    /* one pass from the latest: each earlier place j of the last token, and
     * how many tokens up to it match the last ones (at most wmax); the
     * longest match wins, the latest among equals */
    int best = -1, best_len = wmin - 1;
    for (int j = n - 2; j >= lo && best_len < wmax; j--) {
        if (h[j] != h[n - 1]) continue;
        int len = 1;
        while (len < wmax && j - len >= 0 && h[j - len] == h[n - 1 - len]) len++;
        if (len > best_len) best = j, best_len = len;
    }
    if (best < 0) return 0;
    int got = n - (best + 1) < max ? n - (best + 1) : max;
    for (int k = 0; k < got; k++) out[k] = h[best + 1 + k];
    return got;
}
