/* spec.c — speculative decoding, NGRAM: drafts from a request's own tokens.
 *
 * A request's decode row carries, after its last token, a few tokens
 * guessed from its history: the tokens that followed the earlier place
 * that matches the most of its last tokens (up to spec_max_window, at
 * least spec_min_window; the latest among equals). SGLang's NGRAM drafts
 * from a trie over many requests, as a tree; this is one chain from the
 * request's own prompt and output (prompt lookup). The row is computed as
 * a short prefill with the logits of every position, and the scheduler
 * (scheduler.c, spec_verify) samples the rows in order, each exactly as a
 * decode step at that position would: the same sampler, the penalties'
 * counts with the tokens kept so far, the draw of that output step (kiln
 * keys a request's draws by its seed and step). A row's token is kept;
 * while it equals the draft token that went into the next row, that row
 * follows. So every kept token is the one the request would have drawn
 * without drafts, sampled or greedy, wherever a position's logits do not
 * depend on the batch (the CPU's never do; on the GPU with
 * --deterministic). */
#include "sample/sampling.h"
#include "scheduler/engine_internal.h"
#include "scheduler/request.h"

/* the tokens searched for an earlier occurrence: the latest ones (one
 * pass over them a drafted row) */
enum { SPEC_SCAN = 8192 };

int spec_eligible(const struct engine *e, const struct req *r) {
    /* a grammar's mask is made once a step, for one row */
    return e->opt.spec_draft_tokens > 0 && !r->in.score && !r->gm;
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
