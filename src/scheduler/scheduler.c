/* scheduler.c — one continuous-batching step at a time.
 *
 * A step's batch holds, in this order: one decode row for every running
 * request whose prompt is computed; the next chunk of running requests
 * still in (chunked) prefill; then newly admitted requests, in policy
 * order, while the prefill budget (--chunked-prefill-size), the running
 * limit and the KV admission check allow.
 *
 * KV memory: decode rows come first. When their pages cannot be had even
 * after evicting the prefix cache, running requests are retracted (fewest
 * generated tokens first, newest first among equals): their computed KV is
 * handed to the radix cache (so resuming is cheap if it survives) and they
 * go back to the front of the waiting queue with their output so far. A
 * resumed request recomputes exactly what it had (kernels are
 * batch-invariant), so greedy outputs do not change. Admission reserves
 * room for the decode tokens the running requests will still need (half of
 * their remaining max_tokens, capped), so retraction stays the exception.
 *
 * Sliding windows (every layer slides over W, kv_pool.window): after each
 * step, the pages wholly before a running request's window (positions
 * before n_computed - W + 1) go back to the pool and its page table points
 * there at the zero page. The prefix cache then holds prefixes of at most
 * W tokens, inserted while the request still has all its pages; the
 * request keeps them locked until its window has passed them all, then
 * unlocks them (they stay cached, evictable) and drops its own pages from
 * then on. So a request keeps at most about 2W tokens of KV beside its
 * chunk, whatever its length, and admission reserves no decode room past
 * that.
 *
 * DP attention (dp_size groups): each group has its own page ids, free
 * list and prefix cache (engine_internal.h, gkv and grx), as large as one
 * rank's pool, so the job caches dp_size times the tokens of one pool.
 * Everything above runs per group: a request is admitted when its group
 * has room (a full group holds back only its own later requests),
 * retraction and eviction free pages of the group that needs them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/host_cache.h"
#include "cache/radix.h"
#include "runner/mem_plan.h"
#include "sample/sampling.h"
#include "scheduler/engine_internal.h"
#include "tensor/backend.h"

enum { RESERVE_CAP_TOKENS = 256, PROMPT_LOGPROB_ROWS = 256 /* prompt logprob rows per step */ };

/* ---- lists ---------------------------------------------------------------- */

static void list_remove(struct req **head, struct req **tail, struct req *r) {
    if (r->prev) r->prev->next = r->next;
    else *head = r->next;
    if (r->next) r->next->prev = r->prev;
    else *tail = r->prev;
    r->prev = r->next = NULL;
}

static void list_push_back(struct req **head, struct req **tail, struct req *r) {
    r->next = NULL;
    r->prev = *tail;
    if (*tail) (*tail)->next = r;
    else *head = r;
    *tail = r;
}

static void list_push_front(struct req **head, struct req **tail, struct req *r) {
    r->prev = NULL;
    r->next = *head;
    if (*head) (*head)->prev = r;
    else *tail = r;
    *head = r;
}

/* ---- events ---------------------------------------------------------------- */

static void send(struct engine *e, struct req *r, const int32_t *tok, const struct sample_result *s,
                 const struct req_output *o, enum engine_finish fin, const char *error,
                 const float *scores, int n_scores) {
    struct engine_event ev = {
        .request_id = r->id, .n_tokens = tok ? 1 : 0, .tokens = tok, .samples = s,
        .text = o ? o->text : "", .text_len = o ? o->text_len : 0, .finish = fin, .error = error,
        .error_code = fin == ENGINE_FINISH_ERROR ? e->step_error : KILN_ERR_NONE,
        .matched_stop = o ? o->matched_stop : NULL, .matched_stop_id = o ? o->matched_stop_id : -1,
        .prompt_tokens = r->n_prompt, .completion_tokens = r->n_output,
        .cached_tokens = r->cached_tokens, .n_scores = n_scores, .scores = scores,
        .timing = {.arrival = r->t_arrival, .admitted = r->t_admitted, .first_token = r->t_first_token,
                   .prefill_chunks = r->n_prefill_chunks, .retractions = r->n_retracted}};
    if (r->in.callback) r->in.callback(r->in.user, &ev);
}

static void finish(struct engine *e, struct req *r, enum engine_finish fin,
                   const struct req_output *o, const int32_t *tok, const struct sample_result *s,
                   const char *error, const float *scores, int n_scores) {
    if (r->state == REQ_RUNNING) {
        sched_release_kv(e, r);
        list_remove(&e->running, &e->running_tail, r);
        e->n_running--;
    } else if (r->state == REQ_WAITING) {
        list_remove(&e->waiting, &e->waiting_tail, r);
        e->n_waiting--;
    }
    r->state = REQ_FINISHED;
    e->counters.requests_finished[fin]++;
    e->counters.prompt_tokens_total += r->n_prompt;
    e->counters.cached_tokens_total += r->cached_tokens;
    e->counters.generation_tokens_total += r->n_output;
    if (e->dp_size > 1) e->dp_load[r->dp_group] -= r->dp_tokens;
    send(e, r, tok, s, o, fin, error, scores, n_scores);
    req_free(r);
}

/* DP attention: the request goes to the group with the fewest tokens of
 * requests (the lowest index among equals) for its whole life. Its cache
 * key gets the group in front ("dp<g>:" + cache_salt), so the radix cache
 * keeps each group's prefixes apart (their KV is only on that group's
 * ranks) and only requests of one group share a prefix. */
static void dp_assign(struct engine *e, struct req *r) {
    int g = 0;
    for (int i = 1; i < e->dp_size; i++)
        if (e->dp_load[i] < e->dp_load[g]) g = i;
    r->dp_group = g;
    r->dp_tokens = r->n_tokens;
    e->dp_load[g] += r->dp_tokens;
    size_t n = strlen(r->salt) + 16;
    char *key = xmalloc(n);
    snprintf(key, n, "dp%d:%s", g, r->salt);
    free(r->salt);
    r->salt = key;
}

void sched_enqueue(struct engine *e, struct req *r) {
    if (e->dp_size > 1) dp_assign(e, r);
    r->state = REQ_WAITING;
    list_push_back(&e->waiting, &e->waiting_tail, r);
    e->n_waiting++;
}

static struct req *find(struct req *head, uint64_t id) {
    for (struct req *r = head; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

void sched_abort(struct engine *e, uint64_t id, const char *why) {
    struct req *r = find(e->running, id);
    if (!r) r = find(e->waiting, id);
    if (!r) return;
    struct req_output o = {0};
    o.matched_stop_id = -1;
    req_flush_text(r, &o);
    finish(e, r, ENGINE_FINISH_ABORT, &o, NULL, NULL, why, NULL, 0);
}

void sched_abort_all(struct engine *e) {
    while (e->running) sched_abort(e, e->running->id, "shutting down");
    while (e->waiting) sched_abort(e, e->waiting->id, "shutting down");
}

int sched_has_work(const struct engine *e) { return e->running || e->waiting; }

/* ---- retraction ------------------------------------------------------------ */

static void retract(struct engine *e, struct req *r) {
    sched_release_kv(e, r);
    list_remove(&e->running, &e->running_tail, r);
    e->n_running--;
    r->state = REQ_WAITING;
    r->n_retracted++;
    list_push_front(&e->waiting, &e->waiting_tail, r);
    e->n_waiting++;
    e->counters.retractions_total++;
    log_debug("retracted request %llu after %d output tokens", (unsigned long long)r->id, r->n_output);
}

/* Of group g's running requests: fewest output tokens first; among
 * equals the newest. */
static struct req *pick_victim(struct engine *e, int g) {
    struct req *v = NULL;
    for (struct req *r = e->running; r; r = r->next)
        if (r->dp_group == g && (!v || r->n_output < v->n_output ||
                                 (r->n_output == v->n_output && r->t_arrival > v->t_arrival)))
            v = r;
    return v;
}

/* ---- admission ------------------------------------------------------------- */

static int remaining_reserve(const struct req *r) {
    int rem = r->max_new_tokens - r->n_output;
    if (rem > RESERVE_CAP_TOKENS) rem = RESERVE_CAP_TOKENS;
    return rem > 0 ? rem / 2 : 0;
}

/* The pages admission keeps back for r's coming decode tokens, r having
 * `at` tokens: with a window, none past the most it keeps. */
static int reserve_pages(const struct engine *e, const struct req *r, int at) {
    int rem = remaining_reserve(r);
    if (e->window && rem > e->window_tokens - at) rem = e->window_tokens > at ? e->window_tokens - at : 0;
    return (rem + e->page_size - 1) / e->page_size;
}

static int shares_prefix(const struct req *a, const struct req *b, int from, int ps) {
    if (strcmp(a->salt, b->salt)) return 0;
    int n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens;
    int k = from;
    while (k < n && a->tokens[k] == b->tokens[k]) k++;
    return k - from >= ps;
}

/* Orders the waiting queue for this step: FCFS keeps arrival order
 * (retracted requests are at the front); priority sorts by priority, then
 * arrival; LPM by the longest cached prefix. */
static int cmp_priority(const void *pa, const void *pb) {
    const struct req *a = *(struct req *const *)pa, *b = *(struct req *const *)pb;
    if (a->in.priority != b->in.priority) return a->in.priority > b->in.priority ? -1 : 1;
    if (a->n_retracted != b->n_retracted) return a->n_retracted > b->n_retracted ? -1 : 1;
    return a->t_arrival < b->t_arrival ? -1 : a->t_arrival > b->t_arrival;
}

struct lpm_item {
    struct req *r;
    int match;
};

static int cmp_lpm(const void *pa, const void *pb) {
    const struct lpm_item *a = pa, *b = pb;
    if (a->match != b->match) return a->match > b->match ? -1 : 1;
    return a->r->t_arrival < b->r->t_arrival ? -1 : a->r->t_arrival > b->r->t_arrival;
}

static void order_waiting(struct engine *e) {
    if (e->opt.policy == SCHEDULE_FCFS || e->n_waiting < 2) return;
    int n = e->n_waiting;
    struct lpm_item *items = xmalloc((size_t)n * sizeof *items);
    int i = 0;
    for (struct req *r = e->waiting; r; r = r->next, i++) {
        items[i].r = r;
        items[i].match = 0;
        if (e->opt.policy == SCHEDULE_LPM && e->grx[r->dp_group] && n <= 128) {
            struct radix_node *node;
            items[i].match = sched_match_prefix(e, r->dp_group, r, r->n_tokens - 1, &node);
        }
    }
    if (e->opt.policy == SCHEDULE_LPM) {
        qsort(items, (size_t)n, sizeof *items, cmp_lpm);
    } else {
        struct req **v = xmalloc((size_t)n * sizeof *v);
        for (i = 0; i < n; i++) v[i] = items[i].r;
        qsort(v, (size_t)n, sizeof *v, cmp_priority);
        for (i = 0; i < n; i++) items[i].r = v[i];
        free(v);
    }
    e->waiting = e->waiting_tail = NULL;
    for (i = 0; i < n; i++) list_push_back(&e->waiting, &e->waiting_tail, items[i].r);
    free(items);
}

/* ---- prompt logprobs -------------------------------------------------------
 * Row q of a request's logits gives the logprob of prompt token q + 1. The
 * rows still owed, [lp_next - 1, n_prompt - 1), are computed with the
 * prompt: a cached prefix has no logits, so the prefix match stops before
 * them (SGLang does the same), and a step takes at most PROMPT_LOGPROB_ROWS
 * of them (the host logits buffer grows to hold them, once). */

/* The owed rows among positions [from, to): their count, the first in *first. */
static int lp_rows(const struct req *r, int from, int to, int *first) {
    int lo = r->lp_next - 1 > from ? r->lp_next - 1 : from, hi = r->n_prompt - 1 < to ? r->n_prompt - 1 : to;
    *first = lo;
    return hi > lo ? hi - lo : 0;
}

/* The longest chunk [from, from + take) whose owed rows fit in `left`. */
static int lp_take(const struct req *r, int from, int take, int left) {
    int first, n = lp_rows(r, from, from + take, &first);
    return n <= left ? take : first + left - from;
}

static void ensure_rows(struct engine *e, int n) {
    int cap = e->rows_cap ? e->rows_cap : e->max_seqs;
    if (n <= cap) return;
    cap = e->max_seqs + PROMPT_LOGPROB_ROWS;
    KILN_ASSERT(n <= cap);
    e->logits = xrealloc(e->logits, (size_t)cap * (size_t)e->vocab * sizeof *e->logits);
    if (e->gpu_sample) {
        e->s_want = xrealloc(e->s_want, (size_t)cap);
        e->s_rows = xrealloc(e->s_rows, (size_t)cap * sizeof *e->s_rows);
    }
    e->rows_cap = cap;
}

/* The owed rows of r in this step's logits, from logit row *row on. */
static void prompt_logprobs(struct engine *e, struct req *r, int from, int to, int *row, int *want_row) {
    int first, n = lp_rows(r, from, to, &first);
    if (!n) return;
    if (!e->lp_buf) e->lp_buf = xmalloc(PROMPT_LOGPROB_ROWS * sizeof *e->lp_buf);
    for (int k = 0; k < n; k++) {
        int j = (*row)++;
        const float *lg = e->logits + (size_t)(e->gpu_sample ? (*want_row)++ : j) * (size_t)e->vocab;
        sampler_logprob_of(lg, e->vocab, r->tokens[first + k + 1], r->in.sampling.top_logprobs, &e->lp_buf[k]);
    }
    r->lp_next = first + n + 1;
    struct engine_event ev = {
        .request_id = r->id, .text = "", .matched_stop_id = -1, .prompt_tokens = r->n_prompt,
        .cached_tokens = r->cached_tokens, .n_prompt_logprobs = n, .prompt_logprob_pos = first + 1,
        .prompt_logprobs = e->lp_buf,
        .timing = {.arrival = r->t_arrival, .admitted = r->t_admitted,
                   .prefill_chunks = r->n_prefill_chunks, .retractions = r->n_retracted}};
    if (r->in.callback) r->in.callback(r->in.user, &ev);
}

/* ---- the step ------------------------------------------------------------- */

struct plan {
    int n_seqs, n_tokens;
};

static void plan_add(struct engine *e, struct plan *p, struct req *r, int from, int to) {
    if (from < r->n_prompt) r->n_prefill_chunks++;
    if (from < r->n_prompt) e->step_info.prefill_seqs++, e->step_info.prefill_tokens += to - from;
    else e->step_info.decode_rows++;
    e->b_reqs[p->n_seqs] = r;
    e->b_from[p->n_seqs] = from;
    e->b_to[p->n_seqs] = to;
    p->n_seqs++;
    p->n_tokens += to - from;
}

static void score_finish(struct engine *e, struct req *r, const float *logits) {
    int n = r->in.n_label_ids;
    float *scores = xmalloc((size_t)(n ? n : 1) * sizeof *scores);
    double mx = -INFINITY, sum = 0;
    if (r->in.apply_softmax) { /* normalised over the label tokens */
        for (int i = 0; i < n; i++) mx = fmax(mx, logits[r->in.label_ids[i]]);
        for (int i = 0; i < n; i++) sum += exp((double)logits[r->in.label_ids[i]] - mx);
        for (int i = 0; i < n; i++) scores[i] = (float)(exp((double)logits[r->in.label_ids[i]] - mx) / sum);
    } else { /* probability under the full next-token distribution */
        for (int i = 0; i < e->vocab; i++) mx = fmax(mx, logits[i]);
        for (int i = 0; i < e->vocab; i++) sum += exp((double)logits[i] - mx);
        for (int i = 0; i < n; i++) scores[i] = (float)(exp((double)logits[r->in.label_ids[i]] - mx) / sum);
    }
    struct req_output o = {.text = "", .matched_stop_id = -1};
    finish(e, r, ENGINE_FINISH_STOP, &o, NULL, NULL, NULL, scores, n);
    free(scores);
}

/* (A finished grammar allows only the end ids: min_new_tokens gives way.) */
static void mask_stops(const struct engine *e, const struct req *r, float *logits) {
    if (r->n_output >= r->in.min_new_tokens || (r->g_slot >= 0 && r->g_done)) return;
    for (int i = 0; i < r->in.n_stop_ids; i++) logits[r->in.stop_ids[i]] = -INFINITY;
    if (!r->in.ignore_eos) {
        const struct generation_config *g = model_generation_config(e->model);
        for (int i = 0; i < g->n_eos; i++)
            if (g->eos_token_ids[i] >= 0 && g->eos_token_ids[i] < e->vocab)
                logits[g->eos_token_ids[i]] = -INFINITY;
    }
}

/* The ids mask_stops sets to -inf for r this step, into e->s_mask. */
static int stop_mask_ids(struct engine *e, const struct req *r) {
    if (r->n_output >= r->in.min_new_tokens || (r->g_slot >= 0 && r->g_done)) return 0;
    const struct generation_config *g = model_generation_config(e->model);
    int need = r->in.n_stop_ids + g->n_eos;
    if (need > e->s_mask_cap) {
        e->s_mask_cap = need * 2;
        e->s_mask = xrealloc(e->s_mask, (size_t)e->s_mask_cap * sizeof *e->s_mask);
    }
    int n = 0;
    for (int i = 0; i < r->in.n_stop_ids; i++) e->s_mask[n++] = r->in.stop_ids[i];
    if (!r->in.ignore_eos)
        for (int i = 0; i < g->n_eos; i++) e->s_mask[n++] = g->eos_token_ids[i]; /* out of range: skipped */
    return n;
}

static void sample_host(struct engine *e, struct req *r, float *lg, struct sample_result *res);
static int emit(struct engine *e, struct req *r, const struct sample_result *res);
static void spec_verify(struct engine *e, struct req *r, int nd, int row, int want_row);

static void handle_outputs(struct engine *e, const struct plan *p) {
    int row = 0, want_row = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        struct req *r = e->b_reqs[s];
        int prefill = e->b_to[s] - e->b_from[s] > 1 || r->n_output == 0;
        prompt_logprobs(e, r, e->b_from[s], e->b_to[s], &row, &want_row);
        int nd = r->n_draft; /* a draft's positions count once its tokens are kept */
        r->n_draft = 0;
        r->n_computed = e->b_to[s] - nd;
        if (nd > 0) {
            spec_verify(e, r, nd, row, want_row);
            row += nd + 1, want_row += nd + 1; /* a draft's rows all come to the host */
            continue;
        }
        if (r->n_computed < r->n_tokens) { /* an intermediate prefill chunk */
            sched_cache_unfinished(e, r);
            sched_window_drop(e, r);
            sched_swa_drop(e, r);
            continue;
        }
        /* with device sampling, only rows that wanted logits have them
         * (packed in row order); the others come with their token */
        int j = row++, on_device = e->gpu_sample && !e->s_want[j];
        float *lg = on_device ? NULL
                              : e->logits + (size_t)(e->gpu_sample ? want_row++ : j) * (size_t)e->vocab;
        if (r->in.score) {
            score_finish(e, r, lg);
            continue;
        }
        if (r->max_new_tokens == 0) {
            struct req_output o = {.text = "", .matched_stop_id = -1};
            finish(e, r, ENGINE_FINISH_LENGTH, &o, NULL, NULL, NULL, NULL, 0);
            continue;
        }
        if (prefill) sched_cache_unfinished(e, r);
        sched_window_drop(e, r);
        sched_swa_drop(e, r);
        struct sample_result res;
        if (on_device) {
            memset(&res, 0, sizeof res);
            res.token = e->s_tokens[j];
        } else {
            sample_host(e, r, lg, &res);
        }
        emit(e, r, &res);
    }
}

/* r's row sampled on the host from its logits lg (masked in place). */
static void sample_host(struct engine *e, struct req *r, float *lg, struct sample_result *res) {
    sg_apply(e, r, lg);
    mask_stops(e, r, lg);
    struct sampling_params sp = r->in.sampling;
    sp.seed = r->in.sampling.seed;
    sampler_sample(&sp, r->sampler, lg, e->vocab, (uint64_t)r->n_output, e->scratch, res);
}

/* Appends r's sampled token and sends it; 1 when that finished r (r is
 * gone then). */
static int emit(struct engine *e, struct req *r, const struct sample_result *pres) {
    const struct generation_config *g = model_generation_config(e->model);
    struct sample_result res = *pres;
    {
        struct req_output o;
        int gs = sg_accept(e, r, res.token);
        if (gs < 0) { /* a mask let through what the grammar refuses: a bug, reported */
            char why[96];
            snprintf(why, sizeof why, "the output's grammar refused token %d", (int)res.token);
            log_error("request %llu: %s", (unsigned long long)r->id, why);
            e->step_error = KILN_ERR_INTERNAL;
            struct req_output eo = {.text = "", .matched_stop_id = -1};
            req_flush_text(r, &eo);
            finish(e, r, ENGINE_FINISH_ERROR, &eo, NULL, NULL, why, NULL, 0);
            return 1;
        }
        e->log_tokens++;
        req_append_token(r, res.token, g->eos_token_ids, g->n_eos, e->context_length, &o);
        if (gs == 1 && o.finish == ENGINE_FINISH_NONE) { /* the grammar's end, under ignore_eos or min_tokens */
            o.finish = ENGINE_FINISH_STOP;
            o.matched_stop_id = res.token;
            req_flush_text(r, &o);
        }
        if (o.finish == ENGINE_FINISH_NONE) sg_follow(r);
        if (o.finish != ENGINE_FINISH_NONE) {
            finish(e, r, o.finish, &o, &res.token, &res, NULL, NULL, 0);
            return 1;
        }
        send(e, r, &res.token, &res, &o, ENGINE_FINISH_NONE, NULL, NULL, 0);
        return 0;
    }
}

/* A decode row that carried nd draft tokens (spec.c): its nd + 1 rows'
 * logits are on the host from row `row` (want_row with device sampling).
 * Row k's pick is kept; while it equals draft k, the draft token's
 * position counts as computed and row k + 1's pick follows. */
static void spec_verify(struct engine *e, struct req *r, int nd, int row, int want_row) {
    int kept = 0, alive = 1;
    for (int k = 0; k <= nd; k++) {
        float *lg = e->logits + (size_t)(e->gpu_sample ? want_row + k : row + k) * (size_t)e->vocab;
        struct sample_result res;
        sample_host(e, r, lg, &res);
        int hit = k < nd && res.token == r->draft[k]; /* before emit: it may free r */
        kept += hit;
        if (emit(e, r, &res)) { /* finished: r is gone */
            alive = 0;
            break;
        }
        if (!hit) break;
        r->n_computed++; /* the draft token at this position was the one picked */
    }
    e->counters.spec_draft_tokens_total += nd;
    e->counters.spec_accepted_tokens_total += kept;
    if (alive) { /* what the window left, now that the kept positions count */
        sched_window_drop(e, r);
        sched_swa_drop(e, r);
    }
}

static int run_batch(struct engine *e, const struct plan *p) {
    int t = 0, pg = 0, n_rows = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        struct req *r = e->b_reqs[s];
        e->b_qstart[s] = t;
        e->b_pagestart[s] = pg;
        KILN_ASSERT(pg + r->n_pages <= e->pages_cap);
        memcpy(e->b_pages + pg, r->pages, (size_t)r->n_pages * sizeof *r->pages);
        pg += r->n_pages;
        e->b_kvlen[s] = e->b_to[s];
        e->b_group[s] = r->dp_group;
        for (int q = e->b_from[s]; q < e->b_to[s]; q++, t++) {
            e->b_ids[t] = q < r->n_tokens ? r->tokens[q] : r->draft[q - r->n_tokens];
            e->b_pos[t] = q;
            e->b_slot[t] = r->pages[q / e->page_size] * e->page_size + q % e->page_size;
        }
        int first, n_lp = lp_rows(r, e->b_from[s], e->b_to[s], &first);
        for (int k = 0; k < n_lp; k++) e->b_rows[n_rows++] = e->b_qstart[s] + first + k - e->b_from[s];
        if (e->b_to[s] == r->n_tokens + r->n_draft) /* the last token's row, and a draft's */
            for (int k = r->n_draft; k >= 0; k--) e->b_rows[n_rows++] = t - 1 - k;
    }
    ensure_rows(e, n_rows);
    sg_step_begin(e);
    e->b_qstart[p->n_seqs] = t;
    e->b_pagestart[p->n_seqs] = pg;
    struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = t, .input_ids = e->b_ids,
                      .positions = e->b_pos, .out_slot = e->b_slot, .n_seqs = p->n_seqs,
                      .q_start = e->b_qstart, .kv_len = e->b_kvlen, .kv_page_start = e->b_pagestart,
                      .kv_pages = e->b_pages, .page_size = e->page_size,
                      .seq_group = e->dp_size > 1 ? e->b_group : NULL, .n_logit_rows = n_rows,
                      .logit_rows = e->b_rows};
    struct kiln_error err;
    int rc;
    if (e->gpu_sample) {
        /* Each logit row samples on the device unless the CPU sampler must
         * see its logits: scores, logprobs, or adjustments a sparse list
         * cannot express (sampler_build_adjustments). */
        int n_adj = 0, j = 0;
        for (int s = 0; s < p->n_seqs; s++) {
            struct req *r = e->b_reqs[s];
            int first, n_lp = lp_rows(r, e->b_from[s], e->b_to[s], &first);
            for (int k = 0; k < n_lp; k++, j++) { /* prompt logprob rows: logits to the host */
                e->s_want[j] = 1;
                e->g_slots[j] = -1;
                memset(&e->s_rows[j], 0, sizeof e->s_rows[j]);
            }
            if (e->b_to[s] != r->n_tokens + r->n_draft) continue;
            if (r->n_draft > 0) { /* a draft's rows are checked on the host */
                for (int k = 0; k <= r->n_draft; k++, j++) {
                    e->s_want[j] = 1;
                    e->g_slots[j] = -1;
                    memset(&e->s_rows[j], 0, sizeof e->s_rows[j]);
                }
                continue;
            }
            e->g_slots[j] = sg_assign(e, r);
            const struct sampling_params *sp = &r->in.sampling;
            int want = r->in.score || sp->logprobs || sp->top_logprobs > 0;
            struct backend_sample_row *sr = &e->s_rows[j];
            sampler_row_params(sp, (uint64_t)r->n_output, sr);
            if (!want && r->max_new_tokens > 0) {
                int k = sampler_build_adjustments(sp, r->sampler, e->s_mask, stop_mask_ids(e, r),
                                                  e->vocab, e->s_adj + n_adj, e->s_adj_cap - n_adj,
                                                  e->s_slot);
                if (k < 0) {
                    want = 1;
                } else {
                    sr->adj_start = n_adj, sr->n_adj = k;
                    n_adj += k;
                }
            }
            e->s_want[j++] = (unsigned char)want;
        }
        struct runner_sampling smp = {.want_logits = e->s_want, .rows = e->s_rows, .adj = e->s_adj,
                                      .n_adj = n_adj, .mask_slot = e->g_n ? e->g_slots : NULL,
                                      .n_mask_slots = e->g_n, .fill_masks = e->g_n ? sg_fill_masks : NULL,
                                      .fill_user = e};
        rc = runner_forward_sample(e->runner, &b, &smp, e->s_tokens, e->logits, &err);
    } else {
        for (int s = 0; s < p->n_seqs; s++)
            if (e->b_to[s] == e->b_reqs[s]->n_tokens && !e->b_reqs[s]->n_draft) sg_assign(e, e->b_reqs[s]);
        rc = runner_forward(e->runner, &b, e->logits, &err);
        if (rc == 0) sg_fill_masks(e); /* the CPU's forward is done: nothing to overlap */
    }
    if (rc) {
        log_error("forward failed: %s", err.msg);
        e->step_error = err.code ? err.code : KILN_ERR_INTERNAL;
        for (int s = 0; s < p->n_seqs; s++) {
            struct req_output o = {.text = "", .matched_stop_id = -1};
            finish(e, e->b_reqs[s], ENGINE_FINISH_ERROR, &o, NULL, NULL, err.msg, NULL, 0);
        }
        return -1;
    }
    return 0;
}

void sched_step(struct engine *e) {
    struct plan p = {0};
    int ps = e->page_size, budget = e->opt.chunked_prefill_size;
    memset(&e->step_info, 0, sizeof e->step_info);

    /* 1. decode rows, retracting when their pages cannot be had (per group) */
    for (int g = 0; g < e->dp_size; g++)
        for (;;) {
            int need = 0, any = 0;
            for (struct req *r = e->running; r; r = r->next) {
                if (r->dp_group != g) continue;
                any = 1;
                /* (a rejected draft may have left a request pages ahead) */
                int more = sched_pages_for(e, r->n_tokens) - r->n_pages;
                if (r->n_tokens - r->n_computed == 1 && more > 0) need += more;
            }
            /* (with a hybrid pool the count is an upper bound: sched_make_free tells) */
            if (!any || (need <= sched_available_pages(e, g) && need <= sched_available_swa(e, g) && sched_make_free(e, g, need) == 0))
                break;
            retract(e, pick_victim(e, g));
        }
    for (struct req *r = e->running; r; r = r->next) {
        r->n_draft = 0;
        if (r->n_tokens - r->n_computed == 1) KILN_ASSERT(sched_grow_pages(e, r, r->n_tokens) == 0);
    }
    for (struct req *r = e->running; r; r = r->next) {
        if (r->n_tokens - r->n_computed != 1) continue;
        /* speculative decoding: a draft after the last token, from the
         * prefill budget, where its pages can be had (after every decode
         * row has its own) */
        int d = 0, max = e->opt.spec_draft_tokens;
        if (max > 0 && budget > 0 && spec_eligible(e, r)) {
            int left = r->max_new_tokens - r->n_output - 1, room = e->context_length - r->n_tokens - 1;
            if (max > left) max = left;
            if (max > room) max = room;
            if (max > budget) max = budget;
            if (max > 0) d = spec_propose(e, r, max, r->draft);
            if (d > 0 && sched_grow_pages(e, r, r->n_tokens + d)) d = 0;
        }
        r->n_draft = d;
        budget -= d;
        plan_add(e, &p, r, r->n_computed, r->n_tokens + d);
    }
    /* 2. running requests still in prefill continue with their next chunk */
    int lp_left = PROMPT_LOGPROB_ROWS;
    for (struct req *r = e->running; r && budget > 0; r = r->next) {
        int left = r->n_tokens - r->n_computed;
        if (left <= 1) continue; /* a decode row, planned above */
        int take = lp_take(r, r->n_computed, left < budget ? left : budget, lp_left);
        if (take <= 0) continue;
        lp_left -= lp_rows(r, r->n_computed, r->n_computed + take, &(int){0});
        if (sched_grow_pages(e, r, r->n_computed + take)) continue;
        plan_add(e, &p, r, r->n_computed, r->n_computed + take);
        budget -= take;
    }
    /* 3. admissions */
    order_waiting(e);
    int *reserve = e->g_reserve, n_full = 0;
    unsigned char *full = e->g_full;
    memset(reserve, 0, (size_t)e->dp_size * sizeof *reserve);
    memset(full, 0, (size_t)e->dp_size);
    for (struct req *r = e->running; r; r = r->next) reserve[r->dp_group] += reserve_pages(e, r, r->n_tokens);
    int first_admitted = p.n_seqs;
    struct req *next;
    for (struct req *r = e->waiting; r && budget > 0; r = next) {
        next = r->next;
        if (e->n_running >= e->opt.max_running_requests || p.n_seqs >= e->max_seqs) break;
        int g = r->dp_group;
        if (full[g]) continue; /* behind an earlier request of its group that did not fit */
        int deferred = 0;
        for (int s = first_admitted; s < p.n_seqs && !deferred; s++)
            deferred = shares_prefix(r, e->b_reqs[s], e->b_reqs[s]->n_tree_tokens, ps);
        if (deferred) continue; /* computed once by the first, shared next step */
        struct radix_node *node = NULL;
        int matched = 0;
        /* owed prompt logprob rows need their positions computed, not cached */
        int lim = r->lp_next < r->n_prompt && r->lp_next - 1 < r->n_tokens - 1 ? r->lp_next - 1 : r->n_tokens - 1;
        struct radix_tree *rx = e->grx[g];
        if (rx) matched = sched_match_load(e, g, r, lim, reserve[g], &node);
        int take = lp_take(r, matched, r->n_tokens - matched < budget ? r->n_tokens - matched : budget, lp_left);
        if (take <= 0) break;
        int need = sched_pages_for(e, matched + take) - matched / ps + reserve_pages(e, r, matched + take) + reserve[g];
        /* the matched pages stop being evictable once locked */
        int avail = sched_available_pages(e, g);
        if (rx && node) {
            radix_lock(rx, node);
            avail = sched_available_pages(e, g);
        }
        /* a hybrid pool: the sliding pages for the chunk and a reserve of
         * up to a window (the window's pages go back as it moves), which
         * sched_make_free then frees for the chunk */
        int fresh = sched_pages_for(e, matched + take) - matched / ps, pin0 = 0, pin1 = 0;
        if (e->swa_window) {
            /* the matched pages the window reads are pinned first, so the
             * shedding cannot take their sliding pages */
            struct kv_pool *kv = e->gkv[g];
            pin1 = matched / ps;
            pin0 = kv_pool_swa_dead(kv, matched, pin1);
            kv_pool_swa_pin(kv, e->match_pages + pin0, pin1 - pin0, 1);
            int wr = reserve_pages(e, r, matched + take), wmax = sched_pages_for(e, e->swa_window) + 1;
            if (need <= avail && (fresh + (wr < wmax ? wr : wmax) > sched_available_swa(e, g) || sched_make_free(e, g, fresh)))
                need = avail + 1;
            if (need > avail) kv_pool_swa_pin(kv, e->match_pages + pin0, pin1 - pin0, -1);
        }
        if (need > avail) {
            if (node) radix_unlock(rx, node);
            /* keep arrival order: the group's later requests wait behind this one */
            full[g] = 1;
            if (++n_full == e->dp_size) break;
            continue;
        }
        list_remove(&e->waiting, &e->waiting_tail, r);
        e->n_waiting--;
        r->state = REQ_RUNNING;
        list_push_back(&e->running, &e->running_tail, r);
        e->n_running++;
        if (r->cap_pages < sched_pages_for(e, r->n_tokens + 1)) {
            r->cap_pages = sched_pages_for(e, r->cap_tokens + 1);
            r->pages = xrealloc(r->pages, (size_t)r->cap_pages * sizeof *r->pages);
        }
        memcpy(r->pages, e->match_pages, (size_t)(matched / ps) * sizeof *r->pages);
        r->n_pages = matched / ps;
        r->n_tree_tokens = r->n_computed = matched;
        r->lock_node = node;
        r->swa_pin0 = pin0, r->swa_pin1 = pin1;
        if (!r->admitted_once) {
            r->cached_tokens = matched < r->n_prompt ? matched : r->n_prompt;
            r->t_admitted = time_now();
        }
        r->admitted_once = 1;
        KILN_ASSERT(sched_grow_pages(e, r, matched + take) == 0);
        plan_add(e, &p, r, matched, matched + take);
        e->step_info.cached_tokens += matched;
        lp_left -= lp_rows(r, matched, matched + take, &(int){0});
        budget -= take;
        reserve[g] += reserve_pages(e, r, matched + take);
    }
    /* A group whose running requests hold all its memory mid-prefill (none
     * ran, and not for want of prefill budget): free the one with the least
     * progress so the others can go on. */
    if (budget > 0) {
        memset(full, 0, (size_t)e->dp_size); /* now: the group has a row in the step */
        for (int s = 0; s < p.n_seqs; s++) full[e->b_reqs[s]->dp_group] = 1;
        for (int g = 0; g < e->dp_size; g++) {
            if (full[g]) continue;
            struct req *v = pick_victim(e, g);
            if (v) retract(e, v);
        }
    }
    if (p.n_seqs == 0) return;
    if (run_batch(e, &p) == 0) handle_outputs(e, &p);
}

/* ---- set-up --------------------------------------------------------------- */

void sched_publish_stats(struct engine *e) {
    struct engine_stats s = e->counters;
    s.running = e->n_running;
    s.waiting = e->n_waiting;
    for (int g = 0; g < e->dp_size; g++) { /* every group's pages, all of them the job's */
        s.kv_pages_total += kv_pool_usable(e->gkv[g]);
        s.kv_pages_free += e->gkv[g]->n_free;
        s.kv_pages_cached += e->grx[g] ? radix_total_pages(e->grx[g]) : 0;
    }
    if (e->swa_window) {
        s.kv_swa_pages_total = e->kv->n_swa_pages - 2;
        s.kv_swa_pages_free = kv_pool_swa_available(e->kv);
    }
    s.hicache_pages = host_cache_pages(e->hc);
    s.hicache_pages_total = host_cache_capacity(e->hc);
    s.page_size = e->page_size;
    s.kv_groups = e->dp_size;
    pthread_mutex_lock(&e->mu);
    e->stats = s;
    pthread_mutex_unlock(&e->mu);
}

int sched_init(struct engine *e, struct kiln_error *err) {
    const struct engine_options *o = &e->opt;
    e->max_seqs = o->max_running_requests;
    e->max_batch_tokens = o->chunked_prefill_size + o->max_running_requests;
    struct model_options mo = {.load_format = o->load_format, .quantization = o->quantization,
                               .max_batch_tokens = e->max_batch_tokens,
                               .max_seqs = e->max_seqs, .max_context = o->context_length,
                               .no_shared_expert_fusion = o->no_shared_expert_fusion,
                               .dummy_routing = (enum model_routing)o->dummy_routing, .moe_count = o->moe_count};
    if (o->par) mo.par = *o->par;
    struct runner_options ro = {.page_size = e->page_size, .kv_tokens = o->max_total_tokens,
                                .mem_fraction_static = o->mem_fraction_static,
                                .max_running_requests = o->max_running_requests,
                                .chunked_prefill_size = o->chunked_prefill_size,
                                .swa_full_tokens_ratio = o->swa_full_tokens_ratio,
                                .disable_hybrid_swa = o->disable_hybrid_swa,
                                .skip_warmup = o->skip_warmup, .ctrl = o->ctrl};
    if (runner_load(&e->runner, &e->be, o->model_dir, &mo, &ro, err)) return -1;
    e->model = runner_model(e->runner);
    e->kv = runner_kv(e->runner);
    if (o->moe_count) model_moe_count_set(e->model, 1, 1);
    e->vocab = model_config(e->model)->vocab_size;
    e->context_length = model_max_context(e->model);
    e->pool_tokens = (long)kv_pool_usable(e->kv) * e->page_size; /* one group's: what one request can have */
    if ((e->window = e->kv->window) > 0) e->window_tokens = (int)mem_plan_window_tokens(e->window, e->page_size);
    e->swa_window = e->kv->swa_window;
    e->dp_size = e->opt.par && e->opt.par->dp_size > 1 ? e->opt.par->dp_size : 1;
    e->gkv = xcalloc((size_t)e->dp_size, sizeof *e->gkv);
    e->grx = xcalloc((size_t)e->dp_size, sizeof *e->grx);
    e->gkv[0] = e->kv;
    for (int g = 1; g < e->dp_size; g++) {
        e->gkv[g] = xcalloc(1, sizeof *e->gkv[g]);
        if (kv_pool_init_ids(e->gkv[g], e->page_size, e->kv->n_pages, err)) return -1;
        if (e->window && kv_pool_set_window(e->gkv[g], e->window, err)) return -1;
    }
    if (sched_hicache_init(e, err)) return -1;
    for (int g = 0; g < e->dp_size && !o->disable_radix_cache; g++)
        e->grx[g] = e->hc && g == 0 ? radix_create(e->page_size, sched_evict_pages, e)
                                    : radix_create(e->page_size, sched_release_pages, e->gkv[g]);
    e->radix = e->grx[0];
    e->g_reserve = xcalloc((size_t)e->dp_size, sizeof *e->g_reserve);
    e->g_full = xcalloc((size_t)e->dp_size, 1);
    e->pages_cap = (long)e->max_seqs * (e->context_length / e->page_size + 2);
    int T = e->max_batch_tokens, S = e->max_seqs;
    e->b_ids = xmalloc((size_t)T * 4);
    e->b_pos = xmalloc((size_t)T * 4);
    e->b_slot = xmalloc((size_t)T * 4);
    e->b_rows = xmalloc((size_t)T * 4);
    e->b_qstart = xmalloc((size_t)(S + 1) * 4);
    e->b_kvlen = xmalloc((size_t)S * 4);
    e->b_group = xcalloc((size_t)S, 4);
    e->dp_load = xcalloc((size_t)e->dp_size, sizeof *e->dp_load);
    e->b_pagestart = xmalloc((size_t)(S + 1) * 4);
    e->b_pages = xmalloc((size_t)e->pages_cap * 4);
    e->b_reqs = xmalloc((size_t)S * sizeof *e->b_reqs);
    e->b_from = xmalloc((size_t)S * sizeof *e->b_from);
    e->b_to = xmalloc((size_t)S * sizeof *e->b_to);
    /* touched now, so no step pays first-touch page faults on it */
    e->logits = xmalloc((size_t)S * (size_t)e->vocab * 4);
    memset(e->logits, 0, (size_t)S * (size_t)e->vocab * 4);
    e->scratch = xmalloc((size_t)e->vocab * 2 * 4);
    if ((e->gpu_sample = runner_can_sample(e->runner))) {
        e->s_want = xcalloc((size_t)S, 1);
        e->s_rows = xcalloc((size_t)S, sizeof *e->s_rows);
        e->s_adj_cap = runner_sample_adj_capacity(e->runner);
        e->s_adj = xmalloc((size_t)e->s_adj_cap * sizeof *e->s_adj);
        e->s_slot = xmalloc((size_t)e->vocab * sizeof *e->s_slot);
        for (int i = 0; i < e->vocab; i++) e->s_slot[i] = -1;
        e->s_tokens = xcalloc((size_t)S, sizeof *e->s_tokens);
    }
    e->match_pages = xmalloc((size_t)(e->context_length / e->page_size + 2) * 4);
    e->g_slots = xmalloc((size_t)(S + PROMPT_LOGPROB_ROWS) * sizeof *e->g_slots);
    return 0;
}

void sched_free(struct engine *e) {
    e->hc_closing = 1; /* the trees' pages go back without a copy */
    for (int g = 0; e->grx && g < e->dp_size; g++) radix_destroy(e->grx[g]);
    sched_hicache_free(e);
    for (int g = 1; e->gkv && g < e->dp_size; g++) {
        if (e->gkv[g]) kv_pool_free(e->gkv[g]);
        free(e->gkv[g]);
    }
    free(e->grx), free(e->gkv), free(e->g_reserve), free(e->g_full);
    e->grx = NULL, e->gkv = NULL, e->g_reserve = NULL, e->g_full = NULL;
    e->radix = NULL;
    runner_free(e->runner);
    e->runner = NULL;
    e->model = NULL;
    e->kv = NULL;
    free(e->b_ids), free(e->b_pos), free(e->b_slot), free(e->b_rows), free(e->b_qstart),
        free(e->b_kvlen), free(e->b_pagestart), free(e->b_pages), free(e->b_reqs), free(e->b_from),
        free(e->b_to), free(e->logits), free(e->scratch), free(e->match_pages);
    free(e->s_want), free(e->s_rows), free(e->s_adj), free(e->s_slot), free(e->s_tokens),
        free(e->s_mask), free(e->lp_buf), free(e->g_slots);
    free(e->b_group), free(e->dp_load);
}
