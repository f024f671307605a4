/* json_req.c — request field validation (see json_req.h). */
#include "server/json_req.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "sample/sampling.h"
#include "server/http_error.h"

int req_errorf(struct req_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->msg) e->msg[utf8_cut(e->msg, sizeof e->msg - 1)] = 0;
    return -1;
}

json_t *jr_parse_body(const char *body, size_t len, struct req_error *e) {
    if (!len) {
        req_errorf(e, 400, "invalid_json", NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    json_error_t je;
    /* jansson rejects invalid UTF-8, NUL in strings, lone surrogates, trailing
     * garbage and nesting deeper than 2048 */
    json_t *v = json_loadb(body, len, 0, &je);
    if (!v) {
        req_errorf(e, 400, "invalid_json", NULL, "the request body is not valid JSON: %s (line %d, column %d)",
                   je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        req_errorf(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
        return NULL;
    }
    return v;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int jr_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, struct req_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v); /* 16.0 is an integer to JavaScript clients */
    } else {
        return req_errorf(e, 400, "invalid_type", key, "'%s' must be an integer, got %s", key, type_name(v));
    }
    if (x < lo || x > hi)
        return req_errorf(e, 400, "invalid_value", key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 1;
}

static int jr_num(const json_t *o, const char *key, double lo, double hi, double *out, struct req_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return req_errorf(e, 400, "invalid_type", key, "'%s' must be a number, got %s", key, type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return req_errorf(e, 400, "invalid_value", key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
    *out = x;
    return 1;
}

int jr_bool(const json_t *o, const char *key, int *out, struct req_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return req_errorf(e, 400, "invalid_type", key, "'%s' must be a boolean, got %s", key, type_name(v));
    *out = json_is_true(v);
    return 1;
}

int jr_str(const json_t *o, const char *key, const char **out, struct req_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return req_errorf(e, 400, "invalid_type", key, "'%s' must be a string, got %s", key, type_name(v));
    *out = json_string_value(v);
    return 1;
}

int jr_ids(const json_t *v, const char *param, int vocab, int32_t **ids, int *n, struct req_error *e) {
    *ids = NULL;
    *n = 0;
    if (!json_is_array(v))
        return req_errorf(e, 400, "invalid_type", param, "'%s' must be an array of token ids", param);
    size_t len = json_array_size(v);
    int32_t *out = xmalloc((len ? len : 1) * sizeof *out);
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
            free(out);
            return req_errorf(e, 400, "invalid_type", param, "'%s'[%zu] must be an integer token id, got %s", param,
                              i, type_name(x));
        }
        long long id = json_integer_value(x);
        if (id < 0 || id >= vocab) {
            free(out);
            return req_errorf(e, 400, "invalid_value", param,
                              "'%s'[%zu]: token id %lld is outside the vocabulary of %d", param, i, id, vocab);
        }
        out[i] = (int32_t)id;
    }
    *ids = out;
    *n = (int)len;
    return 0;
}

/* ---- sampling parameters ------------------------------------------------- */

void gen_params_init(struct gen_params *p) {
    memset(p, 0, sizeof *p);
    sampling_params_default(&p->r.sampling);
    p->r.skip_special_tokens = 1;
    p->n = 1;
}

void gen_params_free(struct gen_params *p) {
    for (int i = 0; i < p->r.n_stop; i++) free(p->stop[i]);
    free(p->stop);
    free(p->stop_ids);
    free(p->bias);
    free(p->salt);
    so_spec_free(&p->so);
    if (p->grammar) grammar_unref(p->grammar);
    free(p->grammar_after);
    memset(p, 0, sizeof *p);
}

static int parse_stop(struct gen_params *p, const json_t *o, struct req_error *e) {
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v)) return 0; /* "" stops nothing: clients send it for "none" */
        p->stop = xcalloc(1, sizeof *p->stop);
        p->stop[0] = xstrdup(json_string_value(v));
        p->r.n_stop = 1;
        return 0;
    }
    if (!json_is_array(v))
        return req_errorf(e, 400, "invalid_type", "stop", "'stop' must be a string or an array of strings");
    size_t n = json_array_size(v);
    if (n > JR_MAX_STOP)
        return req_errorf(e, 400, "invalid_value", "stop", "'stop' has %zu strings; at most %d are allowed", n,
                          JR_MAX_STOP);
    p->stop = xcalloc(n ? n : 1, sizeof *p->stop);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s))
            return req_errorf(e, 400, "invalid_type", "stop", "'stop'[%zu] must be a string", i);
        if (!json_string_length(s))
            return req_errorf(e, 400, "invalid_value", "stop", "'stop'[%zu] is empty", i);
        if (strlen(json_string_value(s)) != json_string_length(s))
            return req_errorf(e, 400, "invalid_value", "stop", "'stop'[%zu] contains a NUL character", i);
        p->stop[p->r.n_stop++] = xstrdup(json_string_value(s));
    }
    return 0;
}

static int parse_logit_bias(struct gen_params *p, const json_t *o, int vocab, struct req_error *e) {
    json_t *v = json_object_get(o, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return req_errorf(e, 400, "invalid_type", "logit_bias",
                          "'logit_bias' must be an object mapping token ids to biases");
    size_t n = json_object_size(v);
    p->bias = xcalloc(n ? n : 1, sizeof *p->bias);
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        /* decimal digits only: strtol would take " 5" and "+5", and
         * saturate what is too large (misreporting the id) */
        size_t klen = strlen(key);
        int digits = klen > 0;
        long long id = 0;
        for (size_t k = 0; digits && k < klen; k++) {
            if (key[k] < '0' || key[k] > '9') digits = 0;
            else if (id <= vocab) id = id * 10 + (key[k] - '0');
        }
        if (!digits)
            return req_errorf(e, 400, "invalid_value", "logit_bias",
                              "'logit_bias' key '%s' is not a token id (decimal digits)", key);
        if (id >= vocab)
            return req_errorf(e, 400, "invalid_value", "logit_bias",
                              "'logit_bias': token id %s is outside the vocabulary of %d", key, vocab);
        if (!json_is_number(b))
            return req_errorf(e, 400, "invalid_type", "logit_bias", "'logit_bias'[\"%s\"] must be a number", key);
        double x = json_number_value(b);
        if (!(x >= -100 && x <= 100))
            return req_errorf(e, 400, "invalid_value", "logit_bias",
                              "'logit_bias'[\"%s\"] must be in [-100, 100], got %g", key, x);
        p->bias[p->r.sampling.n_logit_bias].id = (int32_t)id;
        p->bias[p->r.sampling.n_logit_bias].bias = (float)x;
        p->r.sampling.n_logit_bias++;
    }
    p->r.sampling.logit_bias = p->bias;
    return 0;
}

int gen_params_parse(struct gen_params *p, const json_t *o, const json_t *top, enum jr_dialect d, int vocab,
                     struct req_error *e) {
    struct sampling_params *s = &p->r.sampling;
    double x;
    long long i;
    int rc;
    if ((rc = jr_num(o, "temperature", 0, 1e6, &x, e)) < 0) return -1;
    if (rc) s->temperature = (float)x;
    if ((rc = jr_num(o, "top_p", 0, 1, &x, e)) < 0) return -1;
    if (rc && x <= 0) return req_errorf(e, 400, "invalid_value", "top_p", "'top_p' must be in (0, 1], got %g", x);
    if (rc) s->top_p = (float)x;
    if ((rc = jr_int(o, "top_k", -1, 1 << 30, &i, e)) < 0) return -1;
    if (rc) s->top_k = i <= 0 ? 0 : (int)i;
    if ((rc = jr_num(o, "min_p", 0, 1, &x, e)) < 0) return -1;
    if (rc) s->min_p = (float)x;
    if ((rc = jr_num(o, "presence_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) s->presence_penalty = (float)x;
    if ((rc = jr_num(o, "frequency_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) s->frequency_penalty = (float)x;
    if ((rc = jr_num(o, "repetition_penalty", 0, 1e6, &x, e)) < 0) return -1;
    if (rc && x <= 0)
        return req_errorf(e, 400, "invalid_value", "repetition_penalty", "'repetition_penalty' must be > 0, got %g", x);
    if (rc) s->repetition_penalty = (float)x;
    const char *seed_key = d == JR_NATIVE && json_object_get(o, "sampling_seed") ? "sampling_seed" : "seed";
    if ((rc = jr_int(o, seed_key, INT64_MIN, INT64_MAX, &i, e)) < 0) return -1;
    if (rc) {
        s->has_seed = 1;
        s->seed = (uint64_t)i;
    }
    if ((rc = jr_int(o, "n", 1, JR_MAX_N, &i, e)) < 0) return -1;
    if (rc) p->n = (int)i;

    /* lengths */
    p->r.max_new_tokens = d == JR_COMPLETION ? 16 : d == JR_NATIVE ? 128 : -1;
    if (d == JR_NATIVE) {
        if ((rc = jr_int(o, "max_new_tokens", 0, 1 << 30, &i, e)) < 0) return -1;
        if (rc) p->r.max_new_tokens = (int)i;
        if ((rc = jr_int(o, "min_new_tokens", 0, 1 << 30, &i, e)) < 0) return -1;
        if (rc) p->r.min_new_tokens = (int)i;
    } else {
        const char *key = d == JR_CHAT && json_object_get(o, "max_completion_tokens") &&
                                  !json_is_null(json_object_get(o, "max_completion_tokens"))
                              ? "max_completion_tokens"
                              : "max_tokens";
        if ((rc = jr_int(o, key, 0, 1 << 30, &i, e)) < 0) return -1;
        if (rc) p->r.max_new_tokens = (int)i;
    }
    if ((rc = jr_int(o, "min_tokens", 0, 1 << 30, &i, e)) < 0) return -1;
    if (rc) p->r.min_new_tokens = (int)i;
    if (p->r.max_new_tokens >= 0 && p->r.min_new_tokens > p->r.max_new_tokens)
        return req_errorf(e, 400, "invalid_value", "min_tokens", "'min_tokens' (%d) exceeds max_tokens (%d)",
                          p->r.min_new_tokens, p->r.max_new_tokens);

    /* stopping */
    if (parse_stop(p, o, e)) return -1;
    p->r.stop = (const char *const *)p->stop;
    json_t *sid = json_object_get(o, "stop_token_ids");
    if (sid && !json_is_null(sid)) {
        if (jr_ids(sid, "stop_token_ids", vocab, &p->stop_ids, &p->r.n_stop_ids, e)) return -1;
        p->r.stop_ids = p->stop_ids;
    }
    if (jr_bool(o, "ignore_eos", &p->r.ignore_eos, e) < 0) return -1;
    if (jr_bool(o, "skip_special_tokens", &p->r.skip_special_tokens, e) < 0) return -1;
    if (parse_logit_bias(p, o, vocab, e)) return -1;
    if (so_parse(&p->so, o, d == JR_NATIVE, e)) return -1;

    /* scheduling and cache isolation: the body's top level in both dialects */
    if ((rc = jr_int(top, "priority", INT32_MIN, INT32_MAX, &i, e)) < 0) return -1;
    if (rc) p->r.priority = (int)i;
    const char *salt = NULL, *extra = NULL;
    if (jr_str(top, "cache_salt", &salt, e) < 0 || jr_str(top, "extra_key", &extra, e) < 0) return -1;
    if (salt || extra) {
        /* "\x1f" keeps ("ab","c") apart from ("a","bc") */
        size_t n = (salt ? strlen(salt) : 0) + (extra ? strlen(extra) : 0) + 2;
        p->salt = xmalloc(n);
        snprintf(p->salt, n, "%s\x1f%s", salt ? salt : "", extra ? extra : "");
        p->r.cache_salt = p->salt;
    }
    struct kiln_error err;
    if (sampling_params_validate(s, vocab, &err))
        return req_errorf(e, 400, "invalid_value", NULL, "%s", err.msg);
    return 0;
}

/* ---- prompts ----------------------------------------------------------- */

void prompt_list_free(struct prompt_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i].ids), free(l->v[i].text);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int jr_encode(const struct kiln_tokenizer *tok, const char *text, size_t len, int add_special, struct prompt *out,
              const char *param, struct req_error *e) {
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    if (kiln_tokenizer_encode(tok, text, len, add_special, &ids, &err)) {
        kiln_token_ids_free(&ids);
        return req_errorf(e, 400, "invalid_value", param, "'%s' cannot be tokenized: %s", param, err.msg);
    }
    int32_t bos = kiln_tokenizer_bos_id(tok);
    int add_bos = add_special && kiln_tokenizer_add_bos_token(tok) && bos >= 0 && (ids.n == 0 || ids.ids[0] != bos);
    out->n = (int)ids.n + add_bos;
    out->ids = xmalloc(((size_t)out->n + 1) * sizeof *out->ids);
    if (add_bos) out->ids[0] = bos;
    if (ids.n) memcpy(out->ids + add_bos, ids.ids, ids.n * sizeof *ids.ids);
    kiln_token_ids_free(&ids);
    return 0;
}

static int is_id_array(const json_t *v) {
    return json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0));
}

int jr_prompts(const json_t *v, const char *param, const struct kiln_tokenizer *tok, int vocab, int single,
               struct prompt_list *out, struct req_error *e) {
    memset(out, 0, sizeof *out);
    if (!v || json_is_null(v)) return req_errorf(e, 400, "missing_field", param, "'%s' is required", param);
    size_t n = 1;
    int kind; /* 0 text, 1 ids, 2 texts, 3 id arrays */
    if (json_is_string(v)) kind = 0;
    else if (is_id_array(v)) kind = 1;
    else if (json_is_array(v) && json_array_size(v) > 0 && json_is_string(json_array_get(v, 0))) kind = 2;
    else if (json_is_array(v) && json_array_size(v) > 0 && json_is_array(json_array_get(v, 0))) kind = 3;
    else if (json_is_array(v) && json_array_size(v) == 0)
        return req_errorf(e, 400, "invalid_value", param, "'%s' is empty", param);
    else
        return req_errorf(e, 400, "invalid_type", param,
                          "'%s' must be a string, an array of strings, an array of token ids or an array of "
                          "arrays of token ids", param);
    if (kind >= 2) n = json_array_size(v);
    if (single && n > 1)
        return req_errorf(e, 400, "invalid_value", param, "'%s' must be a single prompt here", param);
    if (n > 4096) return req_errorf(e, 400, "invalid_value", param, "'%s' has more than 4096 prompts", param);
    out->v = xcalloc(n, sizeof *out->v);
    out->n = (int)n;
    for (size_t k = 0; k < n; k++) {
        const json_t *x = kind >= 2 ? json_array_get(v, k) : v;
        struct prompt *p = &out->v[k];
        if (kind == 0 || kind == 2) {
            if (!json_is_string(x)) goto mixed;
            if (!tok) goto no_tok;
            if (jr_encode(tok, json_string_value(x), json_string_length(x), 1, p, param, e)) goto fail;
            p->text = xstrndup(json_string_value(x), json_string_length(x));
        } else {
            if (kind == 3 && !is_id_array(x)) {
                if (json_is_array(x) && json_array_size(x) == 0) {
                    req_errorf(e, 400, "invalid_value", param, "'%s'[%zu] is empty", param, k);
                    goto fail;
                }
                goto mixed;
            }
            if (jr_ids(x, param, vocab, &p->ids, &p->n, e)) goto fail;
        }
        if (p->n == 0) {
            req_errorf(e, 400, "invalid_value", param, "'%s' is empty after tokenization", param);
            goto fail;
        }
    }
    return 0;
mixed:
    req_errorf(e, 400, "invalid_type", param, "'%s' mixes prompt kinds; give all strings or all token id arrays",
               param);
    goto fail;
no_tok:
    req_errorf(e, 400, "invalid_value", param, "this model has no tokenizer: give '%s' as token ids", param);
fail:
    prompt_list_free(out);
    return -1;
}
