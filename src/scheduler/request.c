/* request.c — request copies, and the per-token output pipeline: stop
 * tokens, end-of-sequence, incremental detokenization and stop strings.
 *
 * Stop strings may span tokens. The text after the last emitted byte is
 * kept in `pending` as long as some suffix of it could still be the start
 * of a stop string; only the part that can no longer be part of a match is
 * emitted. When a stop string completes, the text before it is emitted and
 * everything from it on is dropped (OpenAI semantics: not included). */
#include "scheduler/request.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "sample/sampling.h"

enum { DETOK_CONTEXT = 4 }; /* prompt tokens the output is decoded after */

static void *dup_array(const void *src, size_t n, size_t size) {
    if (!n || !src) return NULL;
    void *p = xmalloc(n * size);
    memcpy(p, src, n * size);
    return p;
}

struct req *req_create(uint64_t id, const struct engine_request *in, int vocab,
                       const struct kiln_tokenizer *tok) {
    struct req *r = xcalloc(1, sizeof *r);
    r->id = id;
    r->in = *in;
    r->in.prompt = NULL;
    r->in.stop_ids = dup_array(in->stop_ids, (size_t)in->n_stop_ids, sizeof *in->stop_ids);
    r->in.label_ids = dup_array(in->label_ids, (size_t)in->n_label_ids, sizeof *in->label_ids);
    r->in.grammar_after = dup_array(in->grammar_after, (size_t)in->n_grammar_after, sizeof *in->grammar_after);
    if (!r->in.grammar_after) r->in.n_grammar_after = 0;
    if (in->grammar) grammar_ref(in->grammar);
    r->g_active = in->grammar && r->in.n_grammar_after == 0;
    r->g_slot = -1;
    r->in.sampling.logit_bias = dup_array(in->sampling.logit_bias, (size_t)in->sampling.n_logit_bias,
                                          sizeof *in->sampling.logit_bias);
    if (in->n_stop > 0) {
        char **stops = xcalloc((size_t)in->n_stop, sizeof *stops);
        for (int i = 0; i < in->n_stop; i++) stops[i] = xstrdup(in->stop[i]);
        r->in.stop = (const char *const *)stops;
    } else {
        r->in.stop = NULL;
    }
    r->in.cache_salt = NULL;
    r->salt = xstrdup(in->cache_salt ? in->cache_salt : "");
    r->cap_tokens = in->n_prompt + (in->max_new_tokens > 0 ? in->max_new_tokens : 0) + 1;
    r->tokens = xmalloc((size_t)r->cap_tokens * sizeof *r->tokens);
    memcpy(r->tokens, in->prompt, (size_t)in->n_prompt * sizeof *r->tokens);
    r->n_tokens = r->n_prompt = in->n_prompt;
    r->max_new_tokens = in->max_new_tokens;
    /* position 0 has no logprob (nothing comes before it) */
    r->lp_next = in->n_prompt;
    if (in->prompt_logprobs && !in->score)
        r->lp_next = in->prompt_logprob_start < 1 ? 1
                     : in->prompt_logprob_start < in->n_prompt ? in->prompt_logprob_start
                                                               : in->n_prompt;
    if (!in->score) r->sampler = sampler_state_create(vocab, in->prompt, in->n_prompt);
    if (tok && !in->score) {
        kiln_detok_stream_init(&r->detok, tok, in->skip_special_tokens);
        /* the output continues the prompt: decoded after its last tokens,
         * the first output token keeps its leading space as it would in
         * the decode of prompt + output (what vLLM and SGLang return) */
        int nc = in->n_prompt < DETOK_CONTEXT ? in->n_prompt : DETOK_CONTEXT;
        kiln_detok_stream_prime(r->detok, in->prompt + in->n_prompt - nc, (size_t)nc);
    }
    return r;
}

void req_free(struct req *r) {
    if (!r) return;
    free((void *)r->in.stop_ids);
    free((void *)r->in.label_ids);
    free((void *)r->in.grammar_after);
    if (r->gm) grammar_matcher_free(r->gm);
    if (r->in.grammar) grammar_unref(r->in.grammar);
    free((void *)r->in.sampling.logit_bias);
    for (int i = 0; i < r->in.n_stop; i++) free((void *)r->in.stop[i]);
    free((void *)r->in.stop);
    free(r->salt);
    free(r->tokens);
    free(r->pages);
    sampler_state_free(r->sampler);
    kiln_detok_stream_free(r->detok);
    buf_free(&r->pending);
    buf_free(&r->emit);
    free(r);
}

static int contains(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* Earliest complete stop string in pending: returns its start or -1. */
static long find_stop(const struct req *r, const char **which) {
    long best = -1;
    for (int i = 0; i < r->in.n_stop; i++) {
        const char *s = r->in.stop[i];
        size_t sl = strlen(s);
        if (!sl || sl > r->pending.len) continue;
        const char *hit = memmem(r->pending.data, r->pending.len, s, sl);
        if (hit && (best < 0 || hit - r->pending.data < best)) {
            best = hit - r->pending.data;
            *which = s;
        }
    }
    return best;
}

/* Length of the longest suffix of pending that is a proper prefix of a stop
 * string: that much must be held back. */
static size_t stop_holdback(const struct req *r) {
    size_t hold = 0;
    for (int i = 0; i < r->in.n_stop; i++) {
        const char *s = r->in.stop[i];
        size_t sl = strlen(s);
        size_t maxk = sl - 1 < r->pending.len ? sl - 1 : r->pending.len;
        for (size_t k = maxk; k > hold; k--)
            if (!memcmp(r->pending.data + r->pending.len - k, s, k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

static void emit_pending(struct req *r, size_t n) {
    buf_append(&r->emit, r->pending.data, n);
    buf_consume(&r->pending, n);
}

void req_flush_text(struct req *r, struct req_output *out) {
    if (r->detok) {
        const char *t;
        size_t n;
        if (kiln_detok_stream_flush(r->detok, &t, &n) == 0 && n)
            buf_append(&r->pending, t, n);
    }
    emit_pending(r, r->pending.len);
    out->text = r->emit.data;
    out->text_len = r->emit.len;
}

void req_append_token(struct req *r, int32_t token, const int32_t *eos, int n_eos,
                      int context_length, struct req_output *out) {
    memset(out, 0, sizeof *out);
    out->matched_stop_id = -1;
    if (!r->n_output) r->t_first_token = time_now();
    buf_clear(&r->emit);
    if (r->n_tokens == r->cap_tokens) {
        r->cap_tokens *= 2;
        r->tokens = xrealloc(r->tokens, (size_t)r->cap_tokens * sizeof *r->tokens);
    }
    r->tokens[r->n_tokens++] = token;
    r->n_output++;
    if (r->sampler) sampler_state_accept(r->sampler, token);

    int may_stop = r->n_output >= r->in.min_new_tokens;
    if (may_stop && (contains(r->in.stop_ids, r->in.n_stop_ids, token) ||
                     (!r->in.ignore_eos && contains(eos, n_eos, token)))) {
        out->finish = ENGINE_FINISH_STOP;
        out->matched_stop_id = token;
        req_flush_text(r, out);
        return;
    }
    if (r->detok) {
        const char *t;
        size_t n;
        if (kiln_detok_stream_push(r->detok, token, &t, &n) == 0 && n)
            buf_append(&r->pending, t, n);
    }
    const char *which = NULL;
    long at = may_stop ? find_stop(r, &which) : -1;
    if (at >= 0) {
        emit_pending(r, (size_t)at);
        buf_clear(&r->pending);
        out->finish = ENGINE_FINISH_STOP;
        out->matched_stop = which;
        out->text = r->emit.data;
        out->text_len = r->emit.len;
        return;
    }
    emit_pending(r, r->pending.len - stop_holdback(r));
    if ((r->max_new_tokens >= 0 && r->n_output >= r->max_new_tokens) ||
        r->n_tokens >= context_length) {
        out->finish = ENGINE_FINISH_LENGTH;
        req_flush_text(r, out);
        return;
    }
    out->text = r->emit.data;
    out->text_len = r->emit.len;
}
