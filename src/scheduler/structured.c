/* structured.c — grammar-constrained decoding inside the engine: the
 * grammar vocabulary of the model, each step's token masks, and the
 * matchers following what was drawn.
 *
 * A step gives every sampling row whose request has an active grammar a
 * mask slot (runner_mask_host). The masks are filled while the device runs
 * the step's layers (runner_sampling.fill_masks; on the CPU backend after
 * the forward, which has nothing to overlap with), each from the matcher
 * as the previous step left it, then:
 *  - the device sampler reads them (backend_sample_row.mask), or
 *  - the CPU sampler's rows (logprobs, scores) set masked logits to -inf
 *    before anything else.
 * The end of the grammar is not a token: once it can end, the request's
 * stop ids and (unless ignore_eos) the model's end-of-sequence ids are
 * allowed; once nothing can follow, only they are (the end-of-sequence ids
 * too under ignore_eos, when no stop id is given: the output is over).
 *
 * Rows are independent (each its own matcher and slot; the grammar and
 * the vocabulary are read-only once prepared, which engine_submit makes
 * sure of), so a step whose masks took more than SERIAL_US on one thread
 * fills them on a small pool of threads (up to 8, half the cores), started
 * on first need. (Cached masks cost about a microsecond a row, where waking
 * sleeping workers would cost more than it saves.)
 */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/threadpool.h"
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine_internal.h"

int sg_init(struct engine *e, struct kiln_error *err) {
    e->g_words = (e->vocab + 31) / 32;
    e->g_reqs = xcalloc((size_t)e->max_seqs, sizeof *e->g_reqs);
    e->g_masks = runner_mask_host(e->runner);
    KILN_ASSERT(runner_mask_words(e->runner) == e->g_words);
    if (!e->tok) return 0;
    struct kiln_token_bytes tb;
    if (kiln_tokenizer_token_bytes(e->tok, &tb, err)) return -1;
    /* the model's vocabulary: ids past the tokenizer's are never allowed,
     * ids past the model's never drawn */
    const char **tokens = xcalloc((size_t)e->vocab, sizeof *tokens);
    size_t *lens = xcalloc((size_t)e->vocab, sizeof *lens);
    uint8_t *special = xcalloc((size_t)e->vocab, 1);
    for (int i = 0; i < e->vocab && i < tb.n; i++) {
        tokens[i] = tb.bytes[i];
        lens[i] = tb.lens[i];
        special[i] = tb.special[i];
    }
    double t0 = time_now();
    e->gvocab = grammar_vocab_create(e->vocab, (const char *const *)tokens, lens, special);
    free(tokens);
    free(lens);
    free(special);
    kiln_token_bytes_free(&tb);
    if (!e->gvocab) return kiln_errorf(err, "cannot build the grammar vocabulary");
    log_debug("grammar vocabulary: %d tokens in %.1f ms", e->vocab, (time_now() - t0) * 1e3);
    return 0;
}

void sg_free(struct engine *e) {
    if (e->g_pool) threadpool_destroy(e->g_pool);
    e->g_pool = NULL;
    if (e->gvocab) grammar_vocab_free(e->gvocab);
    e->gvocab = NULL;
    free(e->g_reqs);
    e->g_reqs = NULL;
}

const struct grammar_vocab *engine_grammar_vocab(const struct engine *e) { return e->gvocab; }

int sg_request_init(struct engine *e, struct req *r, struct kiln_error *err) {
    if (!r->in.grammar) return 0;
    if (!e->gvocab) return kiln_errorf(err, "structured outputs need the model's tokenizer, which did not load");
    /* prepared here, off the engine thread (a no-op when the server did it):
     * the engine's threads then only read the grammar */
    if (grammar_prepare(r->in.grammar, e->gvocab, err)) return -1;
    r->gm = grammar_matcher_create(r->in.grammar, e->gvocab, err);
    return r->gm ? 0 : -1;
}

void sg_step_begin(struct engine *e) {
    e->g_n = 0;
}

int sg_assign(struct engine *e, struct req *r) {
    r->g_slot = -1;
    if (!r->gm || !r->g_active) return -1;
    KILN_ASSERT(e->g_n < e->max_seqs);
    r->g_slot = e->g_n++;
    r->g_done = grammar_matcher_is_done(r->gm);
    e->g_reqs[r->g_slot] = r;
    return r->g_slot;
}

static void set_bit(uint32_t *m, int vocab, int32_t id) {
    if (id >= 0 && id < vocab) m[id >> 5] |= 1u << (id & 31);
}

static void fill_one(struct engine *e, struct req *r, uint32_t *m) {
    if (r->g_done) memset(m, 0, (size_t)e->g_words * 4);
    else grammar_matcher_fill_mask(r->gm, m);
    if (!r->g_done && !grammar_matcher_can_end(r->gm)) return;
    for (int i = 0; i < r->in.n_stop_ids; i++) set_bit(m, e->vocab, r->in.stop_ids[i]);
    if (!r->in.ignore_eos || (r->g_done && r->in.n_stop_ids == 0)) {
        const struct generation_config *g = model_generation_config(e->model);
        for (int i = 0; i < g->n_eos; i++) set_bit(m, e->vocab, g->eos_token_ids[i]);
    }
}

static void fill_part(void *arg, int ith, int nth) {
    struct engine *e = arg;
    for (int k = ith; k < e->g_n; k += nth) fill_one(e, e->g_reqs[k], e->g_masks + (size_t)k * (size_t)e->g_words);
}

enum { POOL_MIN_ROWS = 4, POOL_MAX_THREADS = 8, SERIAL_US = 200 };

void sg_fill_masks(void *user) {
    struct engine *e = user;
    if (!e->g_n) return;
    double t0 = time_now();
    int pooled = e->g_n >= POOL_MIN_ROWS && e->g_use_pool;
    if (pooled && !e->g_pool) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int n = (int)(cores / 2 < POOL_MAX_THREADS ? cores / 2 : POOL_MAX_THREADS);
        if (n > 1) e->g_pool = threadpool_create(n);
        else pooled = 0;
    }
    if (pooled) threadpool_run(e->g_pool, fill_part, e);
    else fill_part(e, 0, 1);
    double us = (time_now() - t0) * 1e6;
    /* what one thread would have taken: the next step's choice */
    double serial = pooled ? us * threadpool_size(e->g_pool) : us;
    e->g_use_pool = serial > SERIAL_US;
    e->g_fill_us += us;
    e->g_fill_rows += e->g_n;
    log_debug("grammar masks: %d rows in %.1f us (%.1f us a row)", e->g_n, us, us / e->g_n);
}

void sg_apply(const struct engine *e, const struct req *r, float *logits) {
    if (r->g_slot < 0) return;
    const uint32_t *m = e->g_masks + (size_t)r->g_slot * (size_t)e->g_words;
    for (int w = 0; w < e->g_words; w++) {
        uint32_t bits = m[w];
        if (bits == 0xffffffffu) continue;
        int hi = w * 32 + 32 < e->vocab ? w * 32 + 32 : e->vocab;
        for (int i = w * 32; i < hi; i++)
            if (!(bits >> (i & 31) & 1)) logits[i] = -INFINITY;
    }
}

static int is_end_id(const struct engine *e, const struct req *r, int32_t token) {
    for (int i = 0; i < r->in.n_stop_ids; i++)
        if (r->in.stop_ids[i] == token) return 1;
    const struct generation_config *g = model_generation_config(e->model);
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos_token_ids[i] == token) return 1;
    return 0;
}

int sg_accept(struct engine *e, struct req *r, int32_t token) {
    if (!r->gm || !r->g_active) return 0;
    if (is_end_id(e, r, token) && grammar_matcher_can_end(r->gm)) return 1;
    return grammar_matcher_accept_token(r->gm, token) ? -1 : 0;
}

void sg_follow(struct req *r) {
    int n = r->in.n_grammar_after;
    if (!r->gm || r->g_active || r->n_output < n) return;
    if (!memcmp(r->tokens + r->n_tokens - n, r->in.grammar_after, (size_t)n * sizeof *r->tokens))
        r->g_active = 1;
}
