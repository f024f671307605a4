/* routes_openai.c — POST /v1/completions and /v1/chat/completions.
 *
 * One HTTP request becomes prompts x n engine requests (choice index =
 * prompt * n + j). Non-streaming answers collect every choice and reply once
 * all are final; streaming answers send one SSE chunk per engine event that
 * carries text or logprobs, a final chunk per choice with its
 * finish_reason, an optional usage chunk, then `data: [DONE]`.
 *
 * Usage counts each prompt once (n choices share it, as OpenAI does);
 * cached_tokens is, per prompt, the largest cache hit among its choices.
 */
#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/mem.h"
#include "kiln/tokenizer.h"
#include "sample/sampling.h"
#include "server/http_error.h"
#include "server/server_internal.h"
#include "server/sse.h"
#include "server/tool_choice.h"

struct choice {
    struct gen_output out;
    size_t offset; /* completions logprobs: text offset of the next token */
    struct chat_output co; /* chat: the text as reasoning, content and tool calls */
};

struct oai {
    struct server *s;
    int chat;
    int stream, include_usage;
    int logprobs, top_logprobs;
    int echo;
    int n, n_prompts;
    struct prompt_list prompts;
    struct chat_output_opts co; /* chat: the request's tools and reasoning */
    struct choice *ch;
    char id[64];
    long created;
    char *reply; /* the built answer */
};

static const char *finish_reason(enum engine_finish f) {
    return f == ENGINE_FINISH_NONE ? NULL : engine_finish_name(f);
}

static double finite_lp(float x) { return isfinite(x) ? (double)x : -9999.0; }

/* ---- logprobs ---------------------------------------------------------------- */

static json_t *token_bytes(const json_t *text) {
    json_t *a = json_array();
    const unsigned char *p = (const unsigned char *)json_string_value(text);
    for (size_t i = 0; i < json_string_length(text); i++) json_array_append_new(a, json_integer(p[i]));
    return a;
}

static json_t *chat_lp_item(struct server *s, int32_t prev, int32_t id, float lp) {
    json_t *t = server_token_text(s, prev, id);
    return json_pack("{s:o,s:f,s:o}", "token", t, "logprob", finite_lp(lp), "bytes", token_bytes(t));
}

/* {"content": [...]} for n samples following token `prev` */
static json_t *chat_logprobs(struct oai *st, int32_t prev, const struct sample_result *smp, int n) {
    json_t *content = json_array();
    for (int k = 0; k < n; k++) {
        int32_t pv = k ? smp[k - 1].token : prev;
        json_t *item = chat_lp_item(st->s, pv, smp[k].token, smp[k].logprob);
        json_t *top = json_array();
        for (int t = 0; t < smp[k].n_top && t < st->top_logprobs; t++)
            json_array_append_new(top, chat_lp_item(st->s, pv, smp[k].top_ids[t], smp[k].top_logprobs[t]));
        json_object_set_new(item, "top_logprobs", top);
        json_array_append_new(content, item);
    }
    return json_pack("{s:o}", "content", content);
}

/* The legacy completions shape: parallel arrays. */
static json_t *completion_logprobs(struct oai *st, int32_t prev, const struct sample_result *smp, int n,
                                   size_t *offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int k = 0; k < n; k++) {
        int32_t pv = k ? smp[k - 1].token : prev;
        json_t *t = server_token_text(st->s, pv, smp[k].token);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += json_string_length(t);
        json_array_append_new(tokens, t);
        json_array_append_new(lps, json_real(finite_lp(smp[k].logprob)));
        json_t *top = json_object();
        for (int i = 0; i < smp[k].n_top && i < st->top_logprobs; i++) {
            json_t *tt = server_token_text(st->s, pv, smp[k].top_ids[i]);
            json_object_set_new(top, json_string_value(tt), json_real(finite_lp(smp[k].top_logprobs[i])));
            json_decref(tt);
        }
        /* like vLLM, the chosen token is always among them */
        json_t *ct = server_token_text(st->s, pv, smp[k].token);
        if (!json_object_get(top, json_string_value(ct)))
            json_object_set_new(top, json_string_value(ct), json_real(finite_lp(smp[k].logprob)));
        json_decref(ct);
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

/* The echoed prompt's logprobs in the same shape: its first token has none
 * (null), as OpenAI's legacy API and vLLM answer; the others come from the
 * prefill (engine_request.prompt_logprobs). */
static json_t *prompt_logprobs_json(struct oai *st, int i, size_t *offset) {
    const struct prompt *p = &st->prompts.v[i / st->n];
    const struct gen_output *o = &st->ch[i].out;
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int k = 0; k < p->n; k++) {
        int32_t pv = k ? p->ids[k - 1] : -1;
        json_t *t = server_token_text(st->s, pv, p->ids[k]);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += json_string_length(t);
        json_array_append_new(tokens, t);
        int at = k - o->prompt_lp_pos;
        const struct sample_result *r = k > 0 && at >= 0 && at < o->n_prompt_lp ? &o->prompt_lp[at] : NULL;
        if (!r) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_real(finite_lp(r->logprob)));
        json_t *top = json_object();
        for (int j = 0; j < r->n_top && j < st->top_logprobs; j++) {
            json_t *tt = server_token_text(st->s, pv, r->top_ids[j]);
            json_object_set_new(top, json_string_value(tt), json_real(finite_lp(r->top_logprobs[j])));
            json_decref(tt);
        }
        json_t *ct = server_token_text(st->s, pv, r->token);
        if (!json_object_get(top, json_string_value(ct)))
            json_object_set_new(top, json_string_value(ct), json_real(finite_lp(r->logprob)));
        json_decref(ct);
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

/* a's arrays followed by b's (b consumed). */
static json_t *logprobs_concat(json_t *a, json_t *b) {
    const char *key;
    json_t *v;
    json_object_foreach(a, key, v) json_array_extend(v, json_object_get(b, key));
    json_decref(b);
    return a;
}

/* The token before output token k of choice i (the prompt's last for k = 0). */
static int32_t token_before(const struct oai *st, int i, int k) {
    if (k > 0) return st->ch[i].out.tokens[k - 1];
    const struct prompt *p = &st->prompts.v[i / st->n];
    return p->n ? p->ids[p->n - 1] : -1;
}

/* ---- responses --------------------------------------------------------------- */

static json_t *usage_json(const struct oai *st) {
    long prompt = 0, completion = 0, cached = 0;
    for (int p = 0; p < st->n_prompts; p++) {
        int best = 0;
        for (int j = 0; j < st->n; j++) {
            const struct gen_output *o = &st->ch[p * st->n + j].out;
            if (j == 0) prompt += o->prompt_tokens;
            if (o->cached_tokens > best) best = o->cached_tokens;
        }
        cached += best;
    }
    for (int i = 0; i < st->n_prompts * st->n; i++) completion += st->ch[i].out.completion_tokens;
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)completion, "total_tokens", (json_int_t)(prompt + completion),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)cached);
}

static json_t *matched_stop_json(const struct gen_output *c) {
    if (c->finish != ENGINE_FINISH_STOP) return json_null();
    if (c->matched_stop) return server_json_text(c->matched_stop, strlen(c->matched_stop));
    if (c->matched_stop_id >= 0) return json_integer(c->matched_stop_id);
    return json_null();
}

static json_t *envelope(struct oai *st, const char *object, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", st->id, "object", object, "created", (json_int_t)st->created,
                     "model", st->s->model_name, "choices", choices);
}

/* Appends the text of the prompt, for echo. */
static void prompt_text(struct oai *st, int p, struct buf *out) {
    const struct prompt *pr = &st->prompts.v[p];
    if (pr->text) {
        buf_puts(out, pr->text);
        return;
    }
    char *t = NULL;
    size_t n = 0;
    if (st->s->tok && !kiln_tokenizer_decode(st->s->tok, pr->ids, (size_t)pr->n, 1, &t, &n, NULL))
        buf_append(out, t, n);
    free(t);
}

/* The streamed echo of choice i's prompt; with logprobs it waits for the
 * prompt's logprobs (all in before the first output token). */
static void echo_chunk(struct oai *st, int i, struct http_request *r) {
    struct buf t = {0};
    size_t off = 0;
    prompt_text(st, i / st->n, &t);
    size_t n = t.len;
    json_t *choice = json_pack("{s:i,s:o,s:n}", "index", i, "text", server_json_text(t.data, n), "finish_reason");
    buf_free(&t);
    json_object_set_new(choice, "logprobs", st->logprobs ? prompt_logprobs_json(st, i, &off) : json_null());
    st->ch[i].offset = st->logprobs ? off : n;
    sse_send_json(r, envelope(st, "text_completion", json_pack("[o]", choice)));
}

static int echo_waits_for_logprobs(const struct oai *st, int i) {
    return st->echo && st->logprobs && st->prompts.v[i / st->n].n > 1;
}

static void stream_open(struct oai *st, struct http_request *r) {
    sse_begin(r);
    int total = st->n_prompts * st->n;
    for (int i = 0; i < total; i++) {
        json_t *choice;
        if (st->chat) {
            choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", i, "delta", "role", "assistant", "content", "",
                               "logprobs", "finish_reason");
        } else if (st->echo) {
            if (!echo_waits_for_logprobs(st, i)) echo_chunk(st, i, r);
            continue;
        } else {
            continue;
        }
        sse_send_json(r, envelope(st, st->chat ? "chat.completion.chunk" : "text_completion", json_pack("[o]", choice)));
    }
}

/* A chat stream's chunks for one event: one per delta the text decided
 * (content, reasoning, a tool call's start and its arguments); logprobs go
 * with the first, finish_reason with the last. */
static void chat_event(struct oai *st, int i, const struct gen_event *ev, int has_lp, struct http_request *r) {
    struct choice *c = &st->ch[i];
    int final = ev->finish != ENGINE_FINISH_NONE;
    json_t *deltas = chat_output_feed(&c->co, ev->text, ev->text_len, final);
    size_t n = json_array_size(deltas);
    if (!n && !has_lp && !final) {
        json_decref(deltas);
        return;
    }
    if (!n) json_array_append_new(deltas, json_object()), n = 1;
    const char *fr = final ? chat_output_finish_reason(&c->co, finish_reason(ev->finish)) : NULL;
    for (size_t k = 0; k < n; k++) {
        json_t *choice = json_pack("{s:i,s:O}", "index", i, "delta", json_array_get(deltas, k));
        json_object_set_new(choice, "logprobs",
                            has_lp && k == 0 ? chat_logprobs(st, token_before(st, i, c->out.n_tokens - ev->n_tokens),
                                                             ev->samples, ev->n_tokens)
                                             : json_null());
        json_object_set_new(choice, "finish_reason", fr && k + 1 == n ? json_string(fr) : json_null());
        if (final && k + 1 == n) json_object_set_new(choice, "matched_stop", matched_stop_json(&c->out));
        sse_send_json(r, envelope(st, "chat.completion.chunk", json_pack("[o]", choice)));
    }
    json_decref(deltas);
}

static void on_event(struct gen *g, int i, const struct gen_event *ev) {
    struct oai *st = g->state;
    struct choice *c = &st->ch[i];
    int final = ev->finish != ENGINE_FINISH_NONE;
    gen_output_add(&c->out, ev);
    if (!st->stream) return;
    if (ev->n_prompt_logprobs && echo_waits_for_logprobs(st, i) &&
        c->out.prompt_lp_pos + c->out.n_prompt_lp == st->prompts.v[i / st->n].n)
        echo_chunk(st, i, g->req);
    if (ev->finish == ENGINE_FINISH_ERROR) {
        const char *code;
        int status = server_error_status(ev->error_code ? ev->error_code : KILN_ERR_INTERNAL, &code);
        char *err = http_error_json(status, code, NULL, ev->error ? ev->error : "generation failed");
        sse_send_raw(g->req, err);
        free(err);
        return;
    }
    int has_lp = st->logprobs && ev->samples && ev->n_tokens;
    if (st->chat) {
        chat_event(st, i, ev, has_lp, g->req);
        return;
    }
    if (!ev->text_len && !has_lp && !final) return;
    json_t *choice;
    {
        choice = json_pack("{s:i,s:o}", "index", i, "text", server_json_text(ev->text, ev->text_len));
        json_object_set_new(choice, "logprobs",
                            has_lp ? completion_logprobs(st, token_before(st, i, c->out.n_tokens - ev->n_tokens),
                                                         ev->samples, ev->n_tokens, &c->offset)
                                   : json_null());
    }
    const char *fr = finish_reason(ev->finish);
    json_object_set_new(choice, "finish_reason", fr ? json_string(fr) : json_null());
    if (final) json_object_set_new(choice, "matched_stop", matched_stop_json(&c->out));
    sse_send_json(g->req, envelope(st, st->chat ? "chat.completion.chunk" : "text_completion", json_pack("[o]", choice)));
}

/* The complete (non-streamed) answer; on the tokenizer pool when large, so
 * it reads only st and read-only server state. */
static json_t *build_reply(struct oai *st) {
    int total = st->n_prompts * st->n;
    json_t *choices = json_array();
    for (int i = 0; i < total; i++) {
        struct gen_output *c = &st->ch[i].out;
        json_t *choice;
        const char *fr = finish_reason(c->finish);
        if (st->chat) {
            json_decref(chat_output_feed(&st->ch[i].co, c->text.data, c->text.len, 1));
            fr = chat_output_finish_reason(&st->ch[i].co, fr);
            choice = json_pack("{s:i,s:o}", "index", i, "message", chat_output_message(&st->ch[i].co));
            json_object_set_new(choice, "logprobs",
                                st->logprobs ? chat_logprobs(st, token_before(st, i, 0), c->samples, c->n_samples)
                                             : json_null());
        } else {
            struct buf t = {0};
            if (st->echo) prompt_text(st, i / st->n, &t);
            size_t off = t.len;
            buf_append(&t, c->text.data, c->text.len);
            choice = json_pack("{s:i,s:o}", "index", i, "text", server_json_text(t.data, t.len));
            buf_free(&t);
            json_t *lp = NULL;
            if (st->logprobs && st->echo) {
                off = 0;
                lp = prompt_logprobs_json(st, i, &off);
            }
            if (st->logprobs) {
                json_t *gen = completion_logprobs(st, token_before(st, i, 0), c->samples, c->n_samples, &off);
                lp = lp ? logprobs_concat(lp, gen) : gen;
            }
            json_object_set_new(choice, "logprobs", lp ? lp : json_null());
        }
        json_object_set_new(choice, "finish_reason", json_string(fr));
        json_object_set_new(choice, "matched_stop", matched_stop_json(c));
        json_array_append_new(choices, choice);
    }
    json_t *resp = envelope(st, st->chat ? "chat.completion" : "text_completion", choices);
    json_object_set_new(resp, "usage", usage_json(st));
    return resp;
}

/* Bytes the answer will take, about: logprobs dominate. */
static size_t reply_cost(const struct oai *st) {
    size_t cost = 0;
    for (int i = 0; i < st->n_prompts * st->n; i++)
        cost += st->ch[i].out.text.len + (size_t)st->ch[i].out.n_samples * (size_t)(st->top_logprobs + 1) * 48;
    return cost;
}

static void reply_work(void *arg) {
    struct oai *st = arg;
    json_t *resp = build_reply(st);
    st->reply = json_dumps(resp, JSON_COMPACT);
    json_decref(resp);
}

static void reply_done(void *arg, struct http_request *r) {
    struct oai *st = arg;
    if (!st->reply) http_error_respond(r, 500, "internal_error", NULL, "cannot encode the response");
    else http_respond(r, 200, "application/json", st->reply, strlen(st->reply), NULL);
}

static void oai_free(struct oai *st);
static void reply_release(void *arg) { oai_free(arg); }

static void on_done(struct gen *g) {
    struct oai *st = g->state;
    int total = st->n_prompts * st->n;
    if (st->stream) {
        if (st->include_usage) {
            json_t *u = envelope(st, st->chat ? "chat.completion.chunk" : "text_completion", json_array());
            json_object_set_new(u, "usage", usage_json(st));
            sse_send_json(g->req, u);
        }
        sse_end(g->req);
        return;
    }
    for (int i = 0; i < total; i++)
        if (st->ch[i].out.finish == ENGINE_FINISH_ERROR) {
            const char *code;
            int status = server_error_status(st->ch[i].out.error_code ? st->ch[i].out.error_code : KILN_ERR_INTERNAL,
                                             &code);
            http_error_respond(g->req, status, code, NULL, "generation failed: %s",
                               st->ch[i].out.error ? st->ch[i].out.error : "unknown error");
            return;
        }
    /* the answer can be tens of MB (n x prompts x tokens x top logprobs): a
     * large one is built on the tokenizer pool, and the state goes with it */
    g->state = NULL;
    size_t cost = reply_cost(st);
    if (st->s->tokpool && cost >= st->s->opt->tokenizer_inline_bytes) {
        tok_pool_submit(st->s->tokpool, g->req, cost, reply_work, reply_done, reply_release, st);
    } else {
        reply_work(st);
        reply_done(st, g->req);
        reply_release(st);
    }
}

static void oai_free(struct oai *st) {
    int total = st->n_prompts * st->n;
    for (int i = 0; st->ch && i < total; i++) {
        gen_output_free(&st->ch[i].out);
        if (st->chat) chat_output_free(&st->ch[i].co);
    }
    free(st->ch);
    prompt_list_free(&st->prompts);
    free(st->reply);
    free(st);
}

static void on_free(struct gen *g) {
    if (g->state) oai_free(g->state); /* NULL: the answer being built owns it */
}

static const struct gen_ops oai_ops = {on_event, on_done, on_free};

static void oai_free_unstarted(struct oai *st) {
    prompt_list_free(&st->prompts);
    free(st->ch);
    free(st);
}

/* Submits prompts x n requests and, for streams, opens the event stream. */
static void oai_start(struct server *s, struct http_request *r, struct oai *st, struct gen_params *gp) {
    st->n = gp->n;
    st->n_prompts = st->prompts.n;
    int total = st->n_prompts * st->n;
    if (server_refuse_fanout(s, r, total, "n")) {
        oai_free_unstarted(st);
        return;
    }
    st->ch = xcalloc((size_t)total, sizeof *st->ch);
    for (int i = 0; i < total; i++) gen_output_init(&st->ch[i].out);
    st->created = (long)time(NULL);
    server_new_id(s, st->chat ? "chatcmpl-" : "cmpl-", st->id, sizeof st->id);
    /* tool call ids: random per response, different per choice */
    uint64_t seed = (uint64_t)st->created * 0x9e3779b97f4a7c15ull;
    for (const char *p = st->id; *p; p++) seed = seed * 131 + (unsigned char)*p;
    for (int i = 0; st->chat && i < total; i++) {
        const struct prompt *p = &st->prompts.v[i / st->n];
        chat_output_init(&st->ch[i].co, &st->co, p->text, p->text ? strlen(p->text) : 0, seed + (uint64_t)i * 7919);
    }
    struct gen *g = gen_create(&s->hub, r, total, &oai_ops, st);
    for (int i = 0; i < total; i++) {
        const struct prompt *p = &st->prompts.v[i / st->n];
        struct engine_request er = gp->r;
        er.prompt = p->ids;
        er.n_prompt = p->n;
        er.sampling.logprobs = st->logprobs;
        er.sampling.top_logprobs = st->top_logprobs;
        /* echo + logprobs: the prompt's logprobs too (lm-eval's loglikelihood) */
        er.prompt_logprobs = !st->chat && st->echo && st->logprobs;
        er.prompt_logprob_start = 0;
        int j = i % st->n;
        /* n seeded choices must differ from each other, yet replay the same */
        if (j && er.sampling.has_seed) er.sampling.seed += (uint64_t)j * 0x9e3779b97f4a7c15ull;
        struct kiln_error err;
        if (!gen_submit(g, i, &er, st->logprobs, &err)) {
            server_reply_submit_error(r, &err);
            gen_fail(g);
            return;
        }
    }
    if (st->stream) stream_open(st, r);
}

static int parse_stream(struct oai *st, const json_t *body, struct req_error *e) {
    if (jr_bool(body, "stream", &st->stream, e) < 0) return -1;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return req_errorf(e, 400, "invalid_type", "stream_options", "'stream_options' must be an object");
        if (jr_bool(so, "include_usage", &st->include_usage, e) < 0) return -1;
    }
    return 0;
}

/* The prompt's tokenization, maybe on the tokenizer pool: the body and the
 * prompts belong to the worker until oai_job_done. */
struct oai_job {
    struct server *s;
    json_t *body;
    struct gen_params gp;
    struct oai *st;
    struct req_error e;
    int rc;
};

static void completions_work(void *arg) {
    struct oai_job *j = arg;
    j->rc = jr_prompts(json_object_get(j->body, "prompt"), "prompt", j->s->tok, j->s->vocab, 0, &j->st->prompts,
                       &j->e);
    if (!j->rc) j->rc = server_structured(j->s, &j->gp, &j->e);
}

/* A reasoning model thinks first: its constraint (structured output, forced
 * tool call) applies once the think block has ended, after "</think>"
 * (gpt-oss: once its final channel opens, "<|channel|>final<|message|>") —
 * unless thinking is off (the template wrote an empty block). */
static int constrain_after_thinking(struct oai_job *j) {
    const struct chat_output_opts *o = &j->st->co;
    if (!j->gp.grammar || j->s->reasoning_format == REASONING_NONE || o->thinking_off) return 0;
    struct kiln_token_ids ids = {0};
    struct kiln_error err = {0};
    const char *after = j->s->reasoning_format == REASONING_GPT_OSS ? "<|channel|>final<|message|>" : "</think>";
    if (kiln_tokenizer_encode(j->s->tok, after, strlen(after), 0, &ids, &err))
        return req_errorf(&j->e, 500, "internal_error", NULL, "cannot tokenize the end of thinking: %s", err.msg);
    j->gp.grammar_after = ids.ids;
    j->gp.r.grammar_after = ids.ids;
    j->gp.r.n_grammar_after = (int)ids.n;
    return 0;
}

static void chat_work(void *arg) {
    struct oai_job *j = arg;
    j->rc = server_chat_prompt(j->s, j->body, &j->st->prompts, &j->e);
    if (!j->rc) j->rc = server_structured(j->s, &j->gp, &j->e);
    if (!j->rc) j->rc = constrain_after_thinking(j);
}

static void oai_job_done(void *arg, struct http_request *r) {
    struct oai_job *j = arg;
    if (j->rc) {
        server_reply_error(r, &j->e);
        return;
    }
    if (server_refuse_late(j->s, r)) return;
    oai_start(j->s, r, j->st, &j->gp);
    j->st = NULL; /* oai_start owns it now */
}

static void oai_job_release(void *arg) {
    struct oai_job *j = arg;
    json_decref(j->body);
    gen_params_free(&j->gp);
    if (j->st) oai_free_unstarted(j->st);
    free(j);
}

static void oai_offload(struct server *s, struct http_request *r, json_t *body, struct gen_params *gp,
                        struct oai *st, tok_work_fn work) {
    struct oai_job *j = xcalloc(1, sizeof *j);
    j->s = s;
    j->body = body;
    j->gp = *gp; /* moved: the caller does not free it */
    j->st = st;
    server_offload(s, r, gp->so.kind != SO_NONE, work, oai_job_done, oai_job_release, j);
}

void route_completions(struct server *s, struct http_request *r) {
    json_t *body = server_body(s, r);
    if (!body) return;
    struct req_error e = {0};
    struct gen_params gp;
    gen_params_init(&gp);
    struct oai *st = xcalloc(1, sizeof *st);
    st->s = s;
    long long lp = 0, best_of = 0;
    int rc;
    const char *suffix = NULL;
    if (server_check_model(s, body, &e) || gen_params_parse(&gp, body, body, JR_COMPLETION, s->vocab, &e) ||
        parse_stream(st, body, &e) || (rc = jr_int(body, "logprobs", 0, SAMPLING_MAX_TOP_LOGPROBS, &lp, &e)) < 0 ||
        jr_bool(body, "echo", &st->echo, &e) < 0 || jr_str(body, "suffix", &suffix, &e) < 0 ||
        jr_int(body, "best_of", 1, JR_MAX_N, &best_of, &e) < 0)
        goto bad;
    if (rc) st->logprobs = 1, st->top_logprobs = (int)lp;
    if (suffix && *suffix) {
        req_errorf(&e, 400, "unsupported", "suffix", "'suffix' (insertion) is not supported");
        goto bad;
    }
    if (best_of > gp.n) {
        req_errorf(&e, 400, "unsupported", "best_of", "'best_of' larger than 'n' is not supported");
        goto bad;
    }
    gp.r.sampling_unset = server_sampling_unset(body);
    oai_offload(s, r, body, &gp, st, completions_work);
    return;
bad:
    json_decref(body);
    gen_params_free(&gp);
    oai_free_unstarted(st);
    server_reply_error(r, &e);
}

/* ---- chat ---------------------------------------------------------------------- */

/* Messages as templates expect them: content parts of type "text" joined
 * into one string (what vLLM does for text-only models). */
static json_t *normalize_messages(const struct server *s, const json_t *msgs, struct req_error *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        req_errorf(e, 400, json_is_array(msgs) ? "invalid_value" : "invalid_type", "messages",
                   "'messages' must be a non-empty array of message objects");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) {
            req_errorf(e, 400, "invalid_type", "messages", "'messages'[%zu] must be an object", i);
            goto fail;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            req_errorf(e, 400, "invalid_value", "messages", "'messages'[%zu].role must be a string", i);
            goto fail;
        }
        json_t *copy = json_deep_copy(m);
        json_array_append_new(out, copy);
        if (chat_message_prepare(copy, i, &s->chat_needs, e)) goto fail;
        json_t *content = json_object_get(m, "content");
        if (!content || json_is_null(content) || json_is_string(content)) continue;
        if (!json_is_array(content)) {
            req_errorf(e, 400, "invalid_type", "messages",
                       "'messages'[%zu].content must be a string or an array of content parts", i);
            goto fail;
        }
        size_t k, len = 0;
        json_t *part;
        json_array_foreach(content, k, part) {
            json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
            if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text)) {
                req_errorf(e, 400, "unsupported", "messages",
                           "'messages'[%zu].content[%zu]: only parts of type \"text\" are supported", i, k);
                goto fail;
            }
            len += json_string_length(text) + 1;
        }
        char *joined = xmalloc(len + 1), *p = joined;
        json_array_foreach(content, k, part) {
            json_t *text = json_object_get(part, "text");
            if (k) *p++ = '\n';
            memcpy(p, json_string_value(text), json_string_length(text));
            p += json_string_length(text);
        }
        json_object_set_new(copy, "content", json_stringn(joined, (size_t)(p - joined)));
        free(joined);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* OpenAI's `reasoning_effort` ("low", "medium" or "high"): a variable of
 * the chat template, as vLLM and SGLang pass it to gpt-oss's. A template
 * that never reads it would ignore it, so the request is refused; a
 * different value in chat_template_kwargs is a conflict. *vars: a copy of
 * kwargs with the variable set (NULL when the request has none). */
static int reasoning_effort_var(const struct server *s, const json_t *body, const json_t *kwargs, json_t **vars,
                                struct req_error *e) {
    json_t *v = json_object_get(body, "reasoning_effort");
    *vars = NULL;
    if (!v || json_is_null(v)) return 0;
    const char *effort = json_string_value(v);
    if (!effort)
        return req_errorf(e, 400, "invalid_type", "reasoning_effort",
                          "'reasoning_effort' must be a string: \"low\", \"medium\" or \"high\"");
    if (strcmp(effort, "low") && strcmp(effort, "medium") && strcmp(effort, "high"))
        return req_errorf(e, 400, "invalid_value", "reasoning_effort",
                          "'reasoning_effort' must be \"low\", \"medium\" or \"high\", not \"%s\"", effort);
    if (!s->chat_needs.reasoning_effort)
        return req_errorf(e, 400, "unsupported", "reasoning_effort",
                          "this model's chat template has no reasoning effort: 'reasoning_effort' would have no "
                          "effect (its switches, if any, go in 'chat_template_kwargs')");
    const char *other = json_string_value(json_object_get(kwargs, "reasoning_effort"));
    if (other && strcmp(other, effort))
        return req_errorf(e, 400, "invalid_value", "reasoning_effort",
                          "'reasoning_effort' \"%s\" and 'chat_template_kwargs'.reasoning_effort \"%s\" disagree",
                          effort, other);
    *vars = json_is_object(kwargs) ? json_copy((json_t *)kwargs) : json_object();
    json_object_set_new(*vars, "reasoning_effort", json_string(effort));
    return 0;
}

int server_chat_prompt(struct server *s, const json_t *body, struct prompt_list *out, struct req_error *e) {
    if (!s->have_chat)
        return req_errorf(e, 400, "no_chat_template", "messages",
                          "this model has no chat template (%s); start the server with --chat-template FILE",
                          s->chat_error);
    json_t *tools = json_object_get(body, "tools"), *kwargs = json_object_get(body, "chat_template_kwargs");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return req_errorf(e, 400, "invalid_type", "tools", "'tools' must be an array");
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
        return req_errorf(e, 400, "invalid_type", "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    int add_gen = 1;
    if (jr_bool(body, "add_generation_prompt", &add_gen, e) < 0) return -1;
    json_t *vars = NULL; /* kwargs with reasoning_effort, when the request sets it */
    if (reasoning_effort_var(s, body, kwargs, &vars, e)) return -1;
    json_t *msgs = normalize_messages(s, json_object_get(body, "messages"), e);
    if (!msgs) {
        json_decref(vars);
        return -1;
    }
    struct chat_template_args a = {.messages = msgs, .add_generation_prompt = add_gen,
                                   .tools = json_is_array(tools) ? tools : NULL,
                                   .kwargs = vars ? vars : json_is_object(kwargs) ? kwargs : NULL};
    char *text = NULL;
    size_t len = 0;
    struct kiln_error err;
    int rc = chat_template_render(&s->chat, &a, &text, &len, &err);
    json_decref(msgs);
    json_decref(vars);
    if (rc) return req_errorf(e, 400, "chat_template_error", "messages", "the chat template failed: %s", err.msg);
    if (!s->tok) {
        free(text);
        return req_errorf(e, 400, "invalid_value", "messages", "this model has no tokenizer");
    }
    out->v = xcalloc(1, sizeof *out->v);
    out->n = 1;
    /* the template already holds BOS and friends: do not add them again */
    rc = jr_encode(s->tok, text, len, 0, &out->v[0], "messages", e);
    if (!rc) out->v[0].text = text;
    else free(text);
    if (!rc && out->v[0].n == 0) rc = req_errorf(e, 400, "invalid_value", "messages", "the prompt is empty");
    return rc;
}

/* OpenAI chat fields for what kiln does not do: refused, never ignored
 * (the bookkeeping ones, user / metadata / store / service_tier, have no
 * effect on the answer and are accepted, as the peers accept them). */
static int chat_unsupported(const json_t *body, struct req_error *e) {
    static const char *const fields[][2] = {
        {"functions", "'functions' (the deprecated function calling) is not supported: send 'tools'"},
        {"function_call", "'function_call' (the deprecated function calling) is not supported: send 'tool_choice'"},
        {"audio", "audio output is not supported"},
        {"prediction", "predicted outputs ('prediction') are not supported"},
        {"web_search_options", "web search is not supported"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(body, fields[i][0]);
        if (v && !json_is_null(v)) return req_errorf(e, 400, "unsupported", fields[i][0], "%s", fields[i][1]);
    }
    json_t *mods = json_object_get(body, "modalities"), *m;
    size_t k;
    if (mods && !json_is_null(mods)) {
        if (!json_is_array(mods))
            return req_errorf(e, 400, "invalid_type", "modalities", "'modalities' must be an array of strings");
        json_array_foreach(mods, k, m) {
            if (!json_is_string(m))
                return req_errorf(e, 400, "invalid_type", "modalities", "'modalities' must be an array of strings");
            if (strcmp(json_string_value(m), "text"))
                return req_errorf(e, 400, "unsupported", "modalities", "only the \"text\" modality is supported, not \"%s\"",
                                  json_string_value(m));
        }
    }
    return 0;
}

void route_chat_completions(struct server *s, struct http_request *r) {
    json_t *body = server_body(s, r);
    if (!body) return;
    struct req_error e = {0};
    struct gen_params gp;
    gen_params_init(&gp);
    struct oai *st = xcalloc(1, sizeof *st);
    st->s = s;
    st->chat = 1;
    long long top = 0;
    int rc;
    if (server_check_model(s, body, &e) || chat_unsupported(body, &e) ||
        gen_params_parse(&gp, body, body, JR_CHAT, s->vocab, &e) ||
        parse_stream(st, body, &e) || jr_bool(body, "logprobs", &st->logprobs, &e) < 0 ||
        (rc = jr_int(body, "top_logprobs", 0, SAMPLING_MAX_TOP_LOGPROBS, &top, &e)) < 0)
        goto bad;
    if (rc && top > 0 && !st->logprobs) {
        req_errorf(&e, 400, "invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        goto bad;
    }
    st->top_logprobs = (int)top;
    if (chat_output_parse_request(body, s->tool_format, s->reasoning_format, &st->co, &gp.r, &e)) goto bad;
    if (st->co.tools != TOOL_FORMAT_NONE &&
        tool_choice_grammar(body, st->co.tools, st->co.parallel_tool_calls, &gp.so, &e))
        goto bad;
    gp.r.sampling_unset = server_sampling_unset(body);
    oai_offload(s, r, body, &gp, st, chat_work);
    return;
bad:
    json_decref(body);
    gen_params_free(&gp);
    oai_free_unstarted(st);
    server_reply_error(r, &e);
}
