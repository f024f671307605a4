/* routes_native.c — SGLang's native routes: POST /generate, /v1/score,
 * and the tokenizer routes /tokenize and /detokenize (SGLang and vLLM
 * shapes).
 *
 * /generate answers one object per prompt and choice ({text, output_ids,
 * meta_info}), a list when the input was a batch or n > 1. Streaming sends,
 * like SGLang, the cumulative text so far in every chunk.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "kiln/tokenizer.h"
#include "sample/sampling.h"
#include "server/http_error.h"
#include "server/server_internal.h"
#include "server/sse.h"

struct native {
    struct server *s;
    int score;
    int stream, logprob, top_n;
    long long logprob_start; /* -1: no prompt logprobs */
    int batch; /* answer a list */
    int n, n_prompts;
    struct prompt_list prompts;
    struct gen_output *out;
    char id[64];
    double t_start, t_end; /* for e2e_latency */
    char *reply;           /* the built answer */
};

static double finite_lp(float x) { return isfinite(x) ? (double)x : -9999.0; }

static json_t *finish_json(const struct gen_output *o) {
    switch (o->finish) {
    case ENGINE_FINISH_STOP:
        return json_pack("{s:s,s:o}", "type", "stop", "matched",
                         o->matched_stop ? server_json_text(o->matched_stop, strlen(o->matched_stop))
                         : o->matched_stop_id >= 0 ? json_integer(o->matched_stop_id)
                                                   : json_null());
    case ENGINE_FINISH_LENGTH: return json_pack("{s:s,s:i}", "type", "length", "length", o->completion_tokens);
    case ENGINE_FINISH_ABORT:
        return json_pack("{s:s,s:s}", "type", "abort", "message", o->error ? o->error : "aborted");
    case ENGINE_FINISH_ERROR:
        return json_pack("{s:s,s:s}", "type", "error", "message", o->error ? o->error : "error");
    default: return json_null();
    }
}

/* SGLang's input_token_logprobs / input_top_logprobs: prompt positions
 * from logprob_start_len on, [logprob, id, null] each; position 0 has
 * none (null, and null alternatives). */
static void input_logprobs(struct native *st, int i, json_t *meta) {
    const struct prompt *p = &st->prompts.v[i / st->n];
    const struct gen_output *o = &st->out[i];
    json_t *lps = json_array(), *tops = json_array();
    for (long long k = st->logprob_start; k < p->n; k++) {
        long long at = k - o->prompt_lp_pos;
        const struct sample_result *r = k > 0 && at >= 0 && at < o->n_prompt_lp ? &o->prompt_lp[at] : NULL;
        if (!r) {
            json_array_append_new(lps, json_pack("[n,i,n]", p->ids[k]));
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_pack("[f,i,n]", finite_lp(r->logprob), r->token));
        json_t *top = json_array();
        for (int t = 0; t < r->n_top && t < st->top_n; t++)
            json_array_append_new(top, json_pack("[f,i,n]", finite_lp(r->top_logprobs[t]), r->top_ids[t]));
        json_array_append_new(tops, top);
    }
    json_object_set_new(meta, "input_token_logprobs", lps);
    json_object_set_new(meta, "input_top_logprobs", tops);
}

static json_t *generate_item(struct native *st, int i, double now, double t_start) {
    struct gen_output *o = &st->out[i];
    json_t *ids = json_array();
    for (int k = 0; k < o->n_tokens; k++) json_array_append_new(ids, json_integer(o->tokens[k]));
    json_t *meta = json_pack("{s:s,s:i,s:i,s:i,s:o,s:f}", "id", st->id, "prompt_tokens", o->prompt_tokens,
                             "completion_tokens", o->completion_tokens, "cached_tokens", o->cached_tokens,
                             "finish_reason", finish_json(o), "e2e_latency", now - t_start);
    if (st->logprob) {
        json_t *lps = json_array(), *tops = json_array();
        for (int k = 0; k < o->n_samples; k++) {
            const struct sample_result *r = &o->samples[k];
            json_array_append_new(lps, json_pack("[f,i,n]", finite_lp(r->logprob), r->token));
            json_t *top = json_array();
            for (int t = 0; t < r->n_top && t < st->top_n; t++)
                json_array_append_new(top, json_pack("[f,i,n]", finite_lp(r->top_logprobs[t]), r->top_ids[t]));
            json_array_append_new(tops, top);
        }
        json_object_set_new(meta, "output_token_logprobs", lps);
        json_object_set_new(meta, "output_top_logprobs", tops);
        if (st->logprob_start >= 0) input_logprobs(st, i, meta);
    }
    json_t *item = json_pack("{s:o,s:o,s:o}", "text", server_json_text(o->text.data, o->text.len),
                             "output_ids", ids, "meta_info", meta);
    if (st->batch) json_object_set_new(item, "index", json_integer(i));
    return item;
}

static void on_event(struct gen *g, int i, const struct gen_event *ev) {
    struct native *st = g->state;
    gen_output_add(&st->out[i], ev);
    if (!st->stream || (!ev->n_tokens && ev->finish == ENGINE_FINISH_NONE)) return;
    sse_send_json(g->req, generate_item(st, i, time_now(), g->t_start));
}

static void native_free(struct native *st) {
    for (int i = 0; st->out && i < st->n_prompts * st->n; i++) gen_output_free(&st->out[i]);
    free(st->out);
    prompt_list_free(&st->prompts);
    free(st->reply);
    free(st);
}

/* The /generate answer; on the tokenizer pool when large (reads only st). */
static void reply_work(void *arg) {
    struct native *st = arg;
    json_t *v;
    if (!st->batch) {
        v = generate_item(st, 0, st->t_end, st->t_start);
    } else {
        v = json_array();
        for (int i = 0; i < st->n_prompts * st->n; i++)
            json_array_append_new(v, generate_item(st, i, st->t_end, st->t_start));
    }
    st->reply = json_dumps(v, JSON_COMPACT);
    json_decref(v);
}

static void reply_done(void *arg, struct http_request *r) {
    struct native *st = arg;
    if (!st->reply) http_error_respond(r, 500, "internal_error", NULL, "cannot encode the response");
    else http_respond(r, 200, "application/json", st->reply, strlen(st->reply), NULL);
}

static void reply_release(void *arg) { native_free(arg); }

static void on_done(struct gen *g) {
    struct native *st = g->state;
    int total = st->n_prompts * st->n;
    if (st->stream) {
        sse_end(g->req);
        return;
    }
    if (st->score) {
        json_t *scores = json_array();
        long prompt = 0;
        for (int i = 0; i < total; i++) {
            struct gen_output *o = &st->out[i];
            if (o->finish != ENGINE_FINISH_STOP) {
                const char *code = "engine_error";
                int status = o->finish == ENGINE_FINISH_ABORT ? 503
                             : o->finish == ENGINE_FINISH_ERROR && o->error_code
                                 ? server_error_status(o->error_code, &code)
                                 : 500;
                http_error_respond(g->req, status, code, NULL,
                                   "scoring item %d failed: %s", i, o->error ? o->error : engine_finish_name(o->finish));
                json_decref(scores);
                return;
            }
            json_t *row = json_array();
            for (int k = 0; k < o->n_scores; k++) json_array_append_new(row, json_real(o->scores[k]));
            json_array_append_new(scores, row);
            prompt += o->prompt_tokens;
        }
        server_reply_json(g->req, 200,
                          json_pack("{s:o,s:s,s:{s:I,s:i,s:I},s:s}", "scores", scores, "model", st->s->model_name,
                                    "usage", "prompt_tokens", (json_int_t)prompt, "completion_tokens", 0,
                                    "total_tokens", (json_int_t)prompt, "object", "scoring"));
        return;
    }
    /* a batch with logprobs can be tens of MB: a large answer is built on
     * the tokenizer pool, and the state goes with it */
    st->t_start = g->t_start;
    st->t_end = time_now();
    g->state = NULL;
    size_t cost = 0;
    for (int i = 0; i < total; i++)
        cost += st->out[i].text.len + (size_t)st->out[i].n_tokens * 8 +
                (size_t)st->out[i].n_samples * (size_t)(st->top_n + 1) * 32;
    if (st->s->tokpool && cost >= st->s->opt->tokenizer_inline_bytes) {
        tok_pool_submit(st->s->tokpool, g->req, cost, reply_work, reply_done, reply_release, st);
    } else {
        reply_work(st);
        reply_done(st, g->req);
        reply_release(st);
    }
}

static void on_free(struct gen *g) {
    if (g->state) native_free(g->state); /* NULL: the answer being built owns it */
}

static const struct gen_ops native_ops = {on_event, on_done, on_free};

static void native_free_unstarted(struct native *st) {
    prompt_list_free(&st->prompts);
    free(st);
}

static void native_start(struct server *s, struct http_request *r, struct native *st, const struct engine_request *base) {
    st->n_prompts = st->prompts.n;
    int total = st->n_prompts * st->n;
    if (server_refuse_fanout(s, r, total, NULL)) {
        native_free_unstarted(st);
        return;
    }
    st->out = xcalloc((size_t)total, sizeof *st->out);
    for (int i = 0; i < total; i++) gen_output_init(&st->out[i]);
    server_new_id(s, "", st->id, sizeof st->id);
    struct gen *g = gen_create(&s->hub, r, total, &native_ops, st);
    for (int i = 0; i < total; i++) {
        struct engine_request er = *base;
        er.prompt = st->prompts.v[i / st->n].ids;
        er.n_prompt = st->prompts.v[i / st->n].n;
        int j = i % st->n;
        if (j && er.sampling.has_seed) er.sampling.seed += (uint64_t)j * 0x9e3779b97f4a7c15ull;
        struct kiln_error err;
        if (!gen_submit(g, i, &er, st->logprob, &err)) {
            server_reply_submit_error(r, &err);
            gen_fail(g);
            return;
        }
    }
    if (st->stream) sse_begin(r);
}

/* The prompts' tokenization, maybe on the tokenizer pool (see
 * server_offload): body and prompts belong to the worker until done. */
struct native_job {
    struct server *s;
    json_t *body;
    const json_t *prompt;  /* generate: 'text' or 'input_ids' */
    const char *param;
    struct gen_params gp;  /* generate */
    struct engine_request er; /* score */
    int32_t *labels;       /* score */
    int item_first;        /* score */
    struct native *st;
    struct req_error e;
    int rc;
};

static void generate_work(void *arg) {
    struct native_job *j = arg;
    j->rc = jr_prompts(j->prompt, j->param, j->s->tok, j->s->vocab, 0, &j->st->prompts, &j->e);
    if (!j->rc) j->rc = server_structured(j->s, &j->gp, &j->e);
}

static void native_job_done(void *arg, struct http_request *r) {
    struct native_job *j = arg;
    if (j->rc) {
        server_reply_error(r, &j->e);
        return;
    }
    if (server_refuse_late(j->s, r)) return;
    native_start(j->s, r, j->st, j->st->score ? &j->er : &j->gp.r);
    j->st = NULL; /* native_start owns it now */
}

static void native_job_release(void *arg) {
    struct native_job *j = arg;
    json_decref(j->body);
    gen_params_free(&j->gp);
    free(j->labels);
    if (j->st) native_free_unstarted(j->st);
    free(j);
}

void route_generate(struct server *s, struct http_request *r) {
    json_t *body = server_body(s, r);
    if (!body) return;
    struct req_error e = {0};
    struct gen_params gp;
    gen_params_init(&gp);
    struct native *st = xcalloc(1, sizeof *st);
    st->s = s;
    long long top = 0;
    json_t *sp = json_object_get(body, "sampling_params");
    if (sp && !json_is_null(sp) && !json_is_object(sp)) {
        req_errorf(&e, 400, "invalid_type", "sampling_params", "'sampling_params' must be an object");
        goto bad;
    }
    if (!json_is_object(sp)) sp = NULL;
    json_t *empty = json_object();
    int rc = gen_params_parse(&gp, sp ? sp : empty, body, JR_NATIVE, s->vocab, &e);
    json_decref(empty);
    st->logprob_start = -1;
    if (rc || jr_bool(body, "stream", &st->stream, &e) < 0 || jr_bool(body, "return_logprob", &st->logprob, &e) < 0 ||
        jr_int(body, "top_logprobs_num", 0, SAMPLING_MAX_TOP_LOGPROBS, &top, &e) < 0 ||
        jr_int(body, "logprob_start_len", -1, 1 << 30, &st->logprob_start, &e) < 0)
        goto bad;
    gp.r.sampling_unset = server_sampling_unset(sp);
    /* SGLang: -1 (the default) means output tokens only */
    if (st->logprob && st->logprob_start >= 0) {
        gp.r.prompt_logprobs = 1;
        gp.r.prompt_logprob_start = (int)st->logprob_start;
    }
    st->top_n = (int)top;
    st->n = gp.n;
    json_t *text = json_object_get(body, "text"), *ids = json_object_get(body, "input_ids");
    int has_text = text && !json_is_null(text), has_ids = ids && !json_is_null(ids);
    if (has_text == has_ids) {
        req_errorf(&e, 400, "invalid_value", "text", "give exactly one of 'text' and 'input_ids'");
        goto bad;
    }
    if (has_text && !json_is_string(text) && !json_is_array(text)) {
        req_errorf(&e, 400, "invalid_type", "text", "'text' must be a string or an array of strings");
        goto bad;
    }
    if (has_ids && !json_is_array(ids)) {
        req_errorf(&e, 400, "invalid_type", "input_ids", "'input_ids' must be an array of token ids");
        goto bad;
    }
    json_t *v = has_text ? text : ids;
    st->batch = st->n > 1 || (has_text ? json_is_array(v) : json_is_array(json_array_get(v, 0)));
    gp.r.sampling.logprobs = st->logprob;
    gp.r.sampling.top_logprobs = st->top_n;
    struct native_job *j = xcalloc(1, sizeof *j);
    j->s = s;
    j->body = body;
    j->prompt = v;
    j->param = has_text ? "text" : "input_ids";
    j->gp = gp; /* moved */
    j->st = st;
    server_offload(s, r, j->gp.so.kind != SO_NONE, generate_work, native_job_done, native_job_release, j);
    return;
bad:
    json_decref(body);
    gen_params_free(&gp);
    native_free_unstarted(st);
    server_reply_error(r, &e);
}

/* ---- /v1/score -------------------------------------------------------------- */

/* query + item (or item + query), as text or as token ids. */
static int score_prompts(struct server *s, const json_t *query, const json_t *items, int item_first,
                         struct prompt_list *out, struct req_error *e) {
    memset(out, 0, sizeof *out);
    int text = json_is_string(query);
    if (!text && !json_is_array(query))
        return req_errorf(e, 400, "invalid_type", "query", "'query' must be a string or an array of token ids");
    if (json_is_string(items) || (json_is_array(items) && json_array_size(items) && json_is_integer(json_array_get(items, 0))))
        return req_errorf(e, 400, "invalid_type", "items",
                          "'items' must be an array of strings or an array of token id arrays");
    if (!json_is_array(items) || json_array_size(items) == 0)
        return req_errorf(e, 400, "invalid_value", "items", "'items' must be a non-empty array");
    size_t n = json_array_size(items);
    if (n > 4096) return req_errorf(e, 400, "invalid_value", "items", "more than 4096 items");
    out->v = xcalloc(n, sizeof *out->v);
    out->n = (int)n;
    int32_t *q = NULL;
    int nq = 0;
    if (!text && jr_ids(query, "query", s->vocab, &q, &nq, e)) goto fail;
    for (size_t i = 0; i < n; i++) {
        json_t *it = json_array_get(items, i);
        struct prompt *p = &out->v[i];
        if (text) {
            if (!json_is_string(it)) {
                req_errorf(e, 400, "invalid_type", "items", "'items'[%zu] must be a string like 'query'", i);
                goto fail;
            }
            if (!s->tok) {
                req_errorf(e, 400, "invalid_value", "query", "this model has no tokenizer: give token ids");
                goto fail;
            }
            size_t lq = json_string_length(query), li = json_string_length(it);
            char *joined = xmalloc(lq + li + 1);
            memcpy(joined + (item_first ? li : 0), json_string_value(query), lq);
            memcpy(joined + (item_first ? 0 : lq), json_string_value(it), li);
            int rc = jr_encode(s->tok, joined, lq + li, 1, p, "items", e);
            free(joined);
            if (rc) goto fail;
        } else {
            int32_t *ids;
            int ni;
            if (jr_ids(it, "items", s->vocab, &ids, &ni, e)) goto fail;
            p->n = nq + ni;
            p->ids = xmalloc(((size_t)p->n + 1) * sizeof *p->ids);
            memcpy(p->ids + (item_first ? ni : 0), q, (size_t)nq * sizeof *q);
            memcpy(p->ids + (item_first ? 0 : nq), ids, (size_t)ni * sizeof *ids);
            free(ids);
        }
        if (p->n == 0) {
            req_errorf(e, 400, "invalid_value", "items", "'items'[%zu] with the query is empty", i);
            goto fail;
        }
    }
    free(q);
    return 0;
fail:
    free(q);
    prompt_list_free(out);
    return -1;
}

static void score_work(void *arg) {
    struct native_job *j = arg;
    j->rc = score_prompts(j->s, json_object_get(j->body, "query"), json_object_get(j->body, "items"), j->item_first,
                          &j->st->prompts, &j->e);
}

void route_score(struct server *s, struct http_request *r) {
    json_t *body = server_body(s, r);
    if (!body) return;
    struct req_error e = {0};
    struct native *st = xcalloc(1, sizeof *st);
    st->s = s;
    st->score = 1;
    st->n = 1;
    int32_t *labels = NULL;
    int n_labels = 0, apply_softmax = 0, item_first = 0;
    json_t *lab = json_object_get(body, "label_token_ids");
    if (server_check_model(s, body, &e) || jr_bool(body, "apply_softmax", &apply_softmax, &e) < 0 ||
        jr_bool(body, "item_first", &item_first, &e) < 0)
        goto bad;
    if (!lab || json_is_null(lab)) {
        req_errorf(&e, 400, "missing_field", "label_token_ids", "'label_token_ids' is required");
        goto bad;
    }
    if (jr_ids(lab, "label_token_ids", s->vocab, &labels, &n_labels, &e)) goto bad;
    if (n_labels == 0) {
        req_errorf(&e, 400, "invalid_value", "label_token_ids", "'label_token_ids' is empty");
        goto bad;
    }
    json_t *query = json_object_get(body, "query"), *items = json_object_get(body, "items");
    if (!query || json_is_null(query)) {
        req_errorf(&e, 400, "missing_field", "query", "'query' is required");
        goto bad;
    }
    (void)items;
    struct native_job *j = xcalloc(1, sizeof *j);
    gen_params_init(&j->gp);
    sampling_params_default(&j->er.sampling);
    j->er.score = 1;
    j->er.label_ids = labels;
    j->er.n_label_ids = n_labels;
    j->er.apply_softmax = apply_softmax;
    j->er.skip_special_tokens = 1;
    j->s = s;
    j->body = body;
    j->labels = labels; /* moved */
    j->item_first = item_first;
    j->st = st;
    server_offload(s, r, 0, score_work, native_job_done, native_job_release, j);
    return;
bad:
    json_decref(body);
    free(labels);
    native_free_unstarted(st);
    server_reply_error(r, &e);
}

/* ---- tokenizer routes --------------------------------------------------------- */

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The /tokenize answer, serialized (it can be large: off the loop thread
 * with the tokenization). */
static char *reply_text(json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    return t;
}

/* /tokenize's work, on the tokenizer pool or inline: body to the JSON text
 * of the answer. The model was checked on the loop thread. */
static int tokenize_body(struct server *s, json_t *body, char **out, struct req_error *e) {
    struct prompt_list pl = {0};
    json_t *resp = NULL;
    json_t *prompt = json_object_get(body, "prompt"), *msgs = json_object_get(body, "messages");
    int has_msgs = msgs && !json_is_null(msgs), add_special = !has_msgs, strs = 0;
    if (jr_bool(body, "add_special_tokens", &add_special, e) < 0 || jr_bool(body, "return_token_strs", &strs, e) < 0)
        goto bad;
    int list = 0;
    if (has_msgs) {
        /* vLLM's chat form: the conversation rendered as chat completions would */
        if (server_chat_prompt(s, body, &pl, e)) goto bad;
        resp = json_pack("{s:o,s:i,s:i}", "tokens", ids_json(pl.v[0].ids, pl.v[0].n), "count", pl.v[0].n,
                         "max_model_len", s->context_length);
        prompt_list_free(&pl);
        *out = reply_text(resp);
        return 0;
    }
    if (!prompt || json_is_null(prompt)) prompt = json_object_get(body, "text");
    if (json_is_array(prompt)) {
        list = 1;
        size_t i;
        json_t *x;
        json_array_foreach(prompt, i, x) if (!json_is_string(x)) {
            req_errorf(e, 400, "invalid_type", "prompt", "'prompt' must be a string or an array of strings");
            goto bad;
        }
        if (json_array_size(prompt) == 0 || json_array_size(prompt) > 4096) {
            req_errorf(e, 400, "invalid_value", "prompt", "'prompt' must hold 1 to 4096 strings");
            goto bad;
        }
    } else if (!json_is_string(prompt)) {
        req_errorf(e, 400, prompt ? "invalid_type" : "missing_field", "prompt", "'prompt' must be a string");
        goto bad;
    }
    size_t n = list ? json_array_size(prompt) : 1;
    pl.v = xcalloc(n, sizeof *pl.v);
    pl.n = (int)n;
    json_t *tokens = json_array(), *counts = json_array(), *tstrs = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *x = list ? json_array_get(prompt, i) : prompt;
        if (jr_encode(s->tok, json_string_value(x), json_string_length(x), add_special, &pl.v[i], "prompt", e)) {
            json_decref(tokens), json_decref(counts), json_decref(tstrs);
            goto bad;
        }
        json_array_append_new(tokens, ids_json(pl.v[i].ids, pl.v[i].n));
        json_array_append_new(counts, json_integer(pl.v[i].n));
        json_t *ts = json_array();
        for (int k = 0; strs && k < pl.v[i].n; k++) {
            size_t len;
            const char *t = kiln_tokenizer_id_to_token(s->tok, pl.v[i].ids[k], &len);
            json_array_append_new(ts, t ? server_json_text(t, len) : json_null());
        }
        json_array_append_new(tstrs, ts);
    }
    if (list) {
        resp = json_pack("{s:o,s:o,s:i}", "tokens", tokens, "count", counts, "max_model_len", s->context_length);
        if (strs) json_object_set_new(resp, "token_strs", tstrs);
        else json_decref(tstrs);
    } else {
        resp = json_pack("{s:O,s:O,s:i}", "tokens", json_array_get(tokens, 0), "count", json_array_get(counts, 0),
                         "max_model_len", s->context_length);
        if (strs) json_object_set(resp, "token_strs", json_array_get(tstrs, 0));
        json_decref(tokens), json_decref(counts), json_decref(tstrs);
    }
    prompt_list_free(&pl);
    *out = reply_text(resp);
    return 0;
bad:
    prompt_list_free(&pl);
    return -1;
}

struct tokenize_job {
    struct server *s;
    json_t *body;
    char *resp;
    struct req_error e;
    int rc;
};

static void tokenize_work(void *arg) {
    struct tokenize_job *j = arg;
    j->rc = tokenize_body(j->s, j->body, &j->resp, &j->e);
}

static void tokenize_done(void *arg, struct http_request *r) {
    struct tokenize_job *j = arg;
    if (j->rc) server_reply_error(r, &j->e);
    else if (!j->resp) http_error_respond(r, 500, "internal_error", NULL, "cannot encode the response");
    else http_respond(r, 200, "application/json", j->resp, strlen(j->resp), NULL);
}

static void tokenize_release(void *arg) {
    struct tokenize_job *j = arg;
    json_decref(j->body);
    free(j->resp);
    free(j);
}

void route_tokenize(struct server *s, struct http_request *r) {
    json_t *body = server_body(s, r);
    if (!body) return;
    struct req_error e = {0};
    if (!s->tok) req_errorf(&e, 400, "invalid_value", NULL, "this model has no tokenizer");
    if (!s->tok || server_check_model(s, body, &e)) {
        json_decref(body);
        server_reply_error(r, &e);
        return;
    }
    struct tokenize_job *j = xcalloc(1, sizeof *j);
    j->s = s;
    j->body = body;
    server_offload(s, r, 0, tokenize_work, tokenize_done, tokenize_release, j);
}

/* /detokenize's work, on the tokenizer pool or inline: the body (a copy, so
 * that a client leaving cannot free it under the worker) to the JSON text of
 * the answer. A long id list is parsed and decoded off the loop thread. */
struct detok_job {
    struct server *s;
    char *body;
    size_t body_len;
    char *resp;
    struct req_error e;
    int rc;
};

static int detokenize_body(struct server *s, const char *text, size_t len, char **out, struct req_error *e) {
    json_t *body = jr_parse_body(text, len, e);
    if (!body) return -1;
    int skip = 0;
    json_t *texts = NULL;
    if (server_check_model(s, body, e) || jr_bool(body, "skip_special_tokens", &skip, e) < 0) goto bad;
    json_t *toks = json_object_get(body, "tokens");
    if (!toks || json_is_null(toks)) {
        req_errorf(e, 400, "missing_field", "tokens", "'tokens' is required");
        goto bad;
    }
    int list = json_is_array(toks) && json_array_size(toks) && json_is_array(json_array_get(toks, 0));
    size_t n = list ? json_array_size(toks) : 1;
    texts = json_array();
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        int ni;
        if (jr_ids(list ? json_array_get(toks, i) : toks, "tokens", s->vocab, &ids, &ni, e)) goto bad;
        char *t = NULL;
        size_t tlen = 0;
        struct kiln_error err;
        int rc = kiln_tokenizer_decode(s->tok, ids, (size_t)ni, skip, &t, &tlen, &err);
        free(ids);
        if (rc) {
            req_errorf(e, 400, "invalid_value", "tokens", "cannot detokenize: %s", err.msg);
            goto bad;
        }
        json_array_append_new(texts, server_json_text(t, tlen));
        free(t);
    }
    json_t *v = list ? json_incref(texts) : json_incref(json_array_get(texts, 0));
    json_decref(texts);
    json_decref(body);
    /* SGLang answers "text", vLLM "prompt" */
    *out = reply_text(json_pack("{s:O,s:o}", "text", v, "prompt", v));
    return 0;
bad:
    json_decref(texts);
    json_decref(body);
    return -1;
}

static void detokenize_work(void *arg) {
    struct detok_job *j = arg;
    j->rc = detokenize_body(j->s, j->body, j->body_len, &j->resp, &j->e);
}

static void detokenize_done(void *arg, struct http_request *r) {
    struct detok_job *j = arg;
    if (j->rc) server_reply_error(r, &j->e);
    else if (!j->resp) http_error_respond(r, 500, "internal_error", NULL, "cannot encode the response");
    else http_respond(r, 200, "application/json", j->resp, strlen(j->resp), NULL);
}

static void detokenize_release(void *arg) {
    struct detok_job *j = arg;
    free(j->body);
    free(j->resp);
    free(j);
}

void route_detokenize(struct server *s, struct http_request *r) {
    if (!s->tok) {
        http_error_respond(r, 400, "invalid_value", NULL, "this model has no tokenizer");
        return;
    }
    struct detok_job *j = xcalloc(1, sizeof *j);
    j->s = s;
    j->body = xmalloc(r->body.len + 1);
    memcpy(j->body, r->body.data, r->body.len);
    j->body[r->body.len] = 0;
    j->body_len = r->body.len;
    server_offload(s, r, 0, detokenize_work, detokenize_done, detokenize_release, j);
}
