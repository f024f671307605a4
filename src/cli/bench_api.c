#include "cli/bench_api.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

/* Error bodies are kept only this far: enough for the message. */
#define ERROR_BODY_MAX 2048

const char *bench_api_path(enum bench_api api) {
    switch (api) {
    case BENCH_API_OPENAI: return "/v1/completions";
    case BENCH_API_OPENAI_CHAT: return "/v1/chat/completions";
    case BENCH_API_GENERATE: return "/generate";
    case BENCH_API_SCORE: return "/v1/score";
    }
    return "/";
}

char *bench_api_payload(const struct bench_options *o, const char *model, const struct bench_prompt *p,
                        int output_len, size_t *len, struct kiln_error *err) {
    json_t *b = json_object();
    int stream = !o->disable_stream, ignore_eos = !o->disable_ignore_eos;
    switch (o->api) {
    case BENCH_API_OPENAI:
    case BENCH_API_OPENAI_CHAT:
        json_object_set_new(b, "model", json_string(model));
        if (o->api == BENCH_API_OPENAI) {
            json_object_set_new(b, "prompt", json_string(p->text));
            json_object_set_new(b, "best_of", json_integer(1));
        } else {
            json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", p->text);
            json_object_set_new(b, "messages", json_pack("[o]", msg));
        }
        json_object_set_new(b, "temperature", json_real(0.0));
        json_object_set_new(b, "max_tokens", json_integer(output_len));
        json_object_set_new(b, "stream", json_boolean(stream));
        /* bench_serving sends ignore_eos to completions only; chat gets it
         * too here so both measure the same output lengths (SGLang and
         * vLLM accept it on both routes). */
        json_object_set_new(b, "ignore_eos", json_boolean(ignore_eos));
        if (stream) json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
        break;
    case BENCH_API_GENERATE:
        json_object_set_new(b, "text", json_string(p->text));
        json_object_set_new(b, "sampling_params", json_pack("{s:f, s:i, s:b}", "temperature", 0.0, "max_new_tokens",
                                                            output_len, "ignore_eos", ignore_eos));
        json_object_set_new(b, "stream", json_boolean(stream));
        break;
    case BENCH_API_SCORE: {
        json_object_set_new(b, "model", json_string(model));
        json_object_set_new(b, "query", json_string(p->text));
        json_t *items = json_array(), *labels = json_array();
        for (int i = 0; i < p->n_items; i++) json_array_append_new(items, json_string(p->items[i]));
        for (int i = 0; i < o->n_score_label_ids; i++)
            json_array_append_new(labels, json_integer(o->score_label_ids[i]));
        json_object_set_new(b, "items", items);
        json_object_set_new(b, "label_token_ids", labels);
        json_object_set_new(b, "apply_softmax", json_true());
        break;
    }
    }
    if (o->extra_request_body) {
        json_error_t je;
        json_t *extra = json_loads(o->extra_request_body, 0, &je);
        if (!json_is_object(extra)) {
            json_decref(extra);
            json_decref(b);
            kiln_errorf(err, "--extra-request-body: expected a JSON object (%s)", extra ? "not an object" : je.text);
            return NULL;
        }
        json_object_update(b, extra);
        json_decref(extra);
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    KILN_ASSERT(s);
    *len = strlen(s);
    return s;
}

void bench_api_stream_init(struct bench_api_stream *s, enum bench_api api, int stream, int n_items,
                           struct bench_result *res) {
    memset(s, 0, sizeof *s);
    s->api = api;
    s->stream = api == BENCH_API_SCORE ? 0 : stream;
    s->n_items = n_items;
    s->res = res;
}

void bench_api_stream_free(struct bench_api_stream *s) {
    buf_free(&s->body);
}

static void stream_fail(struct bench_api_stream *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stream_fail(struct bench_api_stream *s, const char *fmt, ...) {
    if (s->failed) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bench_result_fail(s->res, "%s", msg);
    s->failed = 1;
}

static void read_usage(struct bench_result *r, json_t *usage) {
    if (!json_is_object(usage)) return;
    json_t *c = json_object_get(usage, "completion_tokens"), *p = json_object_get(usage, "prompt_tokens");
    if (json_is_integer(c)) r->usage_output_len = (int)json_integer_value(c);
    if (json_is_integer(p)) r->usage_prompt_len = (int)json_integer_value(p);
}

/* "error": {"message": ...} or "error": "..." in a body or a chunk. */
static int check_error(struct bench_api_stream *s, json_t *data) {
    json_t *e = json_object_get(data, "error");
    if (!e || json_is_null(e)) return 0;
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m) m = json_string_value(e);
    stream_fail(s, "server error: %s", m ? m : "(no message)");
    return 1;
}

static void content_chunk(struct bench_api_stream *s, double now, int new_tokens) {
    struct bench_result *r = s->res;
    if (!s->have_first) {
        r->ttft = now - r->start;
        s->have_first = 1;
    } else {
        double gap = now - s->last_content;
        for (int k = 0; k < new_tokens; k++) bench_result_add_itl(r, gap / new_tokens);
    }
    s->last_content = now;
}

/* The text of one chunk (streaming) or of the whole response, and its
 * length in *len (it may hold NUL bytes: "\u0000" is valid JSON, and a
 * model may generate it). */
static const char *chunk_text(enum bench_api api, json_t *data, int stream, size_t *len) {
    json_t *c0 = json_array_get(json_object_get(data, "choices"), 0), *t = NULL;
    switch (api) {
    case BENCH_API_OPENAI: t = json_object_get(c0, "text"); break;
    case BENCH_API_OPENAI_CHAT: t = json_object_get(json_object_get(c0, stream ? "delta" : "message"), "content"); break;
    case BENCH_API_GENERATE: t = json_object_get(data, "text"); break;
    case BENCH_API_SCORE: break;
    }
    *len = json_string_length(t);
    return json_string_value(t);
}

/* /generate streams the whole text so far (SGLang's default); a server
 * that streams increments instead is recognised by the text not starting
 * with what came before. */
static void generate_text(struct bench_result *r, const char *t, size_t n) {
    if (r->text.len && n >= r->text.len && !memcmp(t, r->text.data, r->text.len))
        buf_append(&r->text, t + r->text.len, n - r->text.len);
    else
        buf_append(&r->text, t, n);
}

static void on_event(struct bench_api_stream *s, const char *data, size_t n, double now) {
    struct bench_result *r = s->res;
    s->last_chunk = now;
    r->latency = now - r->start;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) return;
    json_error_t je;
    json_t *j = json_loadb(data, n, JSON_ALLOW_NUL, &je);
    if (!json_is_object(j)) {
        stream_fail(s, "malformed stream chunk (%s): %.120s", j ? "not an object" : je.text, data);
        json_decref(j);
        return;
    }
    if (check_error(s, j)) {
        json_decref(j);
        return;
    }
    read_usage(r, json_object_get(j, "usage"));
    size_t tn;
    const char *text = chunk_text(s->api, j, 1, &tn);
    if (s->api == BENCH_API_GENERATE) {
        json_t *ct = json_object_get(json_object_get(j, "meta_info"), "completion_tokens");
        int tokens = json_is_integer(ct) ? (int)json_integer_value(ct) : -1;
        if (tokens >= 0) r->usage_output_len = tokens;
        json_t *pt = json_object_get(json_object_get(j, "meta_info"), "prompt_tokens");
        if (json_is_integer(pt)) r->usage_prompt_len = (int)json_integer_value(pt);
        if (text && tn) {
            int new_tokens = tokens >= 0 ? tokens - r->gen_tokens_seen : 1;
            /* A chunk with no new token does not move the clock (as in
             * bench_serving), so the next gap covers it. */
            if (s->have_first && new_tokens <= 0) {
                generate_text(r, text, tn);
                json_decref(j);
                return;
            }
            content_chunk(s, now, new_tokens > 0 ? new_tokens : 1);
            generate_text(r, text, tn);
            if (tokens >= 0) r->gen_tokens_seen = tokens;
        }
    } else if (text && tn) {
        content_chunk(s, now, 1);
        buf_append(&r->text, text, tn);
    }
    json_decref(j);
}

void bench_api_on_body(struct bench_api_stream *s, int status, const char *data, size_t n, double now) {
    if (s->failed) return;
    if (status != 200 || !s->stream) {
        if (status != 200 && s->body.len >= ERROR_BODY_MAX) return;
        buf_append(&s->body, data, n);
        return;
    }
    /* SSE: every line is handled when its '\n' arrives; only "data:" lines
     * matter (event:, id:, comments and blank separators are skipped). */
    size_t i = 0;
    while (i < n && !s->failed) {
        const char *nl = memchr(data + i, '\n', n - i);
        if (!nl) {
            buf_append(&s->body, data + i, n - i);
            break;
        }
        size_t seg = (size_t)(nl - (data + i));
        const char *line = data + i;
        size_t line_len = seg;
        if (s->body.len) {
            buf_append(&s->body, data + i, seg);
            line = s->body.data;
            line_len = s->body.len;
        }
        while (line_len && (line[line_len - 1] == '\r' || line[line_len - 1] == ' ')) line_len--;
        if (line_len >= 5 && !memcmp(line, "data:", 5)) {
            const char *d = line + 5;
            size_t dl = line_len - 5;
            while (dl && *d == ' ') d++, dl--;
            if (dl) on_event(s, d, dl, now);
        }
        buf_clear(&s->body);
        i += seg + 1;
    }
}

static void finish_whole_body(struct bench_api_stream *s, double now) {
    struct bench_result *r = s->res;
    json_error_t je;
    json_t *j = json_loadb(s->body.data ? s->body.data : "", s->body.len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(j)) {
        stream_fail(s, "malformed response body (%s): %.120s", j ? "not an object" : je.text, s->body.data ? s->body.data : "");
        json_decref(j);
        return;
    }
    if (check_error(s, j)) {
        json_decref(j);
        return;
    }
    read_usage(r, json_object_get(j, "usage"));
    r->latency = now - r->start;
    r->ttft = r->latency;
    if (s->api == BENCH_API_SCORE) {
        json_t *scores = json_object_get(j, "scores");
        if (!json_is_array(scores) || (int)json_array_size(scores) != s->n_items) {
            stream_fail(s, "score response: expected \"scores\" with %d entries", s->n_items);
        } else {
            r->usage_output_len = 0; /* scoring generates nothing */
        }
        json_decref(j);
        return;
    }
    size_t tn;
    const char *text = chunk_text(s->api, j, 0, &tn);
    if (!text) {
        stream_fail(s, "response without generated text: %.120s", s->body.data);
    } else {
        buf_append(&r->text, text, tn);
        json_t *ct = json_object_get(json_object_get(j, "meta_info"), "completion_tokens");
        if (s->api == BENCH_API_GENERATE && json_is_integer(ct)) r->usage_output_len = (int)json_integer_value(ct);
    }
    json_decref(j);
}

void bench_api_finish(struct bench_api_stream *s, int status, double now) {
    struct bench_result *r = s->res;
    if (s->failed) return;
    if (status != 200) {
        /* Keep the server's message: JSON "error.message"/"detail", or the
         * start of the body. */
        const char *msg = s->body.data ? s->body.data : "";
        json_t *j = json_loadb(msg, s->body.len, JSON_ALLOW_NUL, NULL);
        json_t *e = json_object_get(j, "error");
        const char *m = json_string_value(json_object_get(e, "message"));
        if (!m) m = json_string_value(e);
        if (!m) m = json_string_value(json_object_get(j, "detail"));
        if (!m) m = json_string_value(json_object_get(j, "message"));
        stream_fail(s, "HTTP %d: %.200s", status, m ? m : msg);
        json_decref(j);
        return;
    }
    if (!s->stream) {
        finish_whole_body(s, now);
    } else {
        /* A last line without '\n' still counts. */
        if (s->body.len) bench_api_on_body(s, status, "\n", 1, s->last_chunk ? s->last_chunk : now);
        if (s->failed) return;
        if (!s->last_chunk) {
            stream_fail(s, "stream ended without any data chunk");
            return;
        }
        /* A stream without content (zero new tokens) has no first token;
         * its TTFT is its latency, as in the non-streaming case. */
        if (!s->have_first) r->ttft = r->latency;
    }
    if (!s->failed) r->success = 1;
}
