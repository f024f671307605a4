/* structured.c — structured-output fields and the grammar cache (see
 * structured.h). */
#include "server/structured.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "server/json_req.h"
#include "server/server_internal.h"

void so_spec_free(struct so_spec *sp) {
    free(sp->text);
    memset(sp, 0, sizeof *sp);
}

/* ---- reading the fields ------------------------------------------------------ */

/* The first constraint found, kept to name both in a conflict. */
static int take(struct so_spec *sp, enum so_kind kind, const char *param, char *text, size_t len,
                struct req_error *e) {
    if (sp->kind != SO_NONE) {
        free(text);
        return req_errorf(e, 400, "invalid_value", param,
                          "only one structured-output constraint may be given, got '%s' and '%s'", sp->param, param);
    }
    sp->kind = kind;
    sp->text = text;
    sp->len = len;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int take_string(struct so_spec *sp, enum so_kind kind, const json_t *v, const char *param,
                       struct req_error *e) {
    if (!json_is_string(v)) return req_errorf(e, 400, "invalid_type", param, "'%s' must be a string", param);
    return take(sp, kind, param, xstrndup(json_string_value(v), json_string_length(v)), json_string_length(v), e);
}

/* A schema given as an object (or a boolean schema), or as its JSON text. */
static int take_schema(struct so_spec *sp, const json_t *v, const char *param, struct req_error *e) {
    if (json_is_string(v)) return take_string(sp, SO_JSON_SCHEMA, v, param, e);
    if (!json_is_object(v) && !json_is_boolean(v))
        return req_errorf(e, 400, "invalid_type", param, "'%s' must be a JSON Schema (an object) or its text", param);
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return req_errorf(e, 400, "invalid_value", param, "'%s' cannot be serialized", param);
    return take(sp, SO_JSON_SCHEMA, param, text, strlen(text), e);
}

/* Choices as EBNF: root ::= "a" | "b" | ... (string literals escaped). */
static int take_choice(struct so_spec *sp, const json_t *v, const char *param, struct req_error *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return req_errorf(e, 400, "invalid_type", param, "'%s' must be a non-empty array of strings", param);
    struct buf b = {0};
    buf_puts(&b, "root ::= ");
    size_t i;
    json_t *c;
    json_array_foreach(v, i, c) {
        if (!json_is_string(c) || json_string_length(c) == 0) {
            buf_free(&b);
            return req_errorf(e, 400, "invalid_value", param, "'%s'[%zu] must be a non-empty string", param, i);
        }
        if (i) buf_puts(&b, " | ");
        buf_push(&b, '"');
        const unsigned char *s = (const unsigned char *)json_string_value(c);
        for (size_t k = 0; k < json_string_length(c); k++) {
            unsigned char ch = s[k];
            if (ch == '"' || ch == '\\') buf_push(&b, '\\'), buf_push(&b, (char)ch);
            else if (ch == '\n') buf_puts(&b, "\\n");
            else if (ch == '\r') buf_puts(&b, "\\r");
            else if (ch == '\t') buf_puts(&b, "\\t");
            else if (ch < 0x20 || ch == 0x7f) buf_printf(&b, "\\x%02X", ch);
            else buf_push(&b, (char)ch);
        }
        buf_push(&b, '"');
    }
    size_t len = b.len;
    return take(sp, SO_CHOICE, param, buf_take(&b), len, e);
}

static int present(const json_t *o, const char *key, json_t **v) {
    *v = json_object_get(o, key);
    return *v && !json_is_null(*v);
}

static int parse_response_format(struct so_spec *sp, const json_t *rf, struct req_error *e) {
    if (!json_is_object(rf))
        return req_errorf(e, 400, "invalid_type", "response_format", "'response_format' must be an object");
    json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type))
        return req_errorf(e, 400, "invalid_value", "response_format",
                          "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) return take(sp, SO_JSON_OBJECT, "response_format", NULL, 0, e);
    if (strcmp(t, "json_schema"))
        return req_errorf(e, 400, "unsupported", "response_format",
                          "'response_format.type' \"%s\" is not supported (\"text\", \"json_object\" or "
                          "\"json_schema\")", t);
    json_t *js = json_object_get(rf, "json_schema"), *schema, *strict;
    if (!json_is_object(js))
        return req_errorf(e, 400, "invalid_value", "response_format.json_schema",
                          "'response_format.json_schema' must be an object with a 'schema'");
    json_t *name = json_object_get(js, "name");
    if (name && !json_is_null(name) && !json_is_string(name))
        return req_errorf(e, 400, "invalid_type", "response_format.json_schema.name",
                          "'response_format.json_schema.name' must be a string");
    if (!present(js, "schema", &schema))
        return req_errorf(e, 400, "invalid_value", "response_format.json_schema.schema",
                          "'response_format.json_schema.schema' is missing");
    int st = 0;
    if (present(js, "strict", &strict)) {
        if (!json_is_boolean(strict))
            return req_errorf(e, 400, "invalid_type", "response_format.json_schema.strict",
                              "'response_format.json_schema.strict' must be true or false");
        st = json_is_true(strict);
    }
    if (take_schema(sp, schema, "response_format.json_schema.schema", e)) return -1;
    sp->strict = st;
    return 0;
}

static int parse_structured_outputs(struct so_spec *sp, const json_t *so, struct req_error *e) {
    json_t *v;
    if (!json_is_object(so))
        return req_errorf(e, 400, "invalid_type", "structured_outputs", "'structured_outputs' must be an object");
    static const char *const refused[] = {"structural_tag", "whitespace_pattern"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (present(so, refused[i], &v))
            return req_errorf(e, 400, "unsupported", "structured_outputs",
                              "'structured_outputs.%s' is not supported", refused[i]);
    if (present(so, "json", &v) && take_schema(sp, v, "structured_outputs.json", e)) return -1;
    if (present(so, "regex", &v) && take_string(sp, SO_REGEX, v, "structured_outputs.regex", e)) return -1;
    if (present(so, "grammar", &v) && take_string(sp, SO_EBNF, v, "structured_outputs.grammar", e)) return -1;
    if (present(so, "choice", &v) && take_choice(sp, v, "structured_outputs.choice", e)) return -1;
    if (present(so, "json_object", &v)) {
        if (!json_is_boolean(v))
            return req_errorf(e, 400, "invalid_type", "structured_outputs.json_object",
                              "'structured_outputs.json_object' must be true or false");
        if (json_is_true(v) && take(sp, SO_JSON_OBJECT, "structured_outputs.json_object", NULL, 0, e)) return -1;
    }
    return 0;
}

int so_parse(struct so_spec *sp, const json_t *o, int native, struct req_error *e) {
    json_t *v;
    memset(sp, 0, sizeof *sp);
    int rc = 0;
    if (native) {
        if (present(o, "structural_tag", &v))
            rc = req_errorf(e, 400, "unsupported", "structural_tag", "'structural_tag' is not supported");
        if (!rc && present(o, "regex", &v)) rc = take_string(sp, SO_REGEX, v, "regex", e);
        if (!rc && present(o, "json_schema", &v)) rc = take_schema(sp, v, "json_schema", e);
        if (!rc && present(o, "ebnf", &v)) rc = take_string(sp, SO_EBNF, v, "ebnf", e);
    } else {
        if (present(o, "guided_whitespace_pattern", &v))
            rc = req_errorf(e, 400, "unsupported", "guided_whitespace_pattern",
                            "'guided_whitespace_pattern' is not supported");
        if (!rc && present(o, "response_format", &v)) rc = parse_response_format(sp, v, e);
        if (!rc && present(o, "guided_json", &v)) rc = take_schema(sp, v, "guided_json", e);
        if (!rc && present(o, "guided_regex", &v)) rc = take_string(sp, SO_REGEX, v, "guided_regex", e);
        if (!rc && present(o, "guided_grammar", &v)) rc = take_string(sp, SO_EBNF, v, "guided_grammar", e);
        if (!rc && present(o, "guided_choice", &v)) rc = take_choice(sp, v, "guided_choice", e);
        if (!rc && present(o, "structured_outputs", &v)) rc = parse_structured_outputs(sp, v, e);
        if (!rc && present(o, "regex", &v)) rc = take_string(sp, SO_REGEX, v, "regex", e);
        if (!rc && present(o, "ebnf", &v)) rc = take_string(sp, SO_EBNF, v, "ebnf", e);
    }
    if (rc) so_spec_free(sp);
    return rc;
}

/* ---- the cache ------------------------------------------------------------------ */

struct so_entry {
    enum so_kind kind;
    int strict;
    uint64_t hash;
    char *text;
    size_t len;
    struct grammar *g; /* the cache's reference */
    uint64_t used;
};

struct so_cache {
    pthread_mutex_t mu;
    struct so_entry *v;
    int n, cap;
    uint64_t clock;
};

struct so_cache *so_cache_create(int capacity) {
    struct so_cache *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->cap = capacity > 0 ? capacity : 1;
    c->v = xcalloc((size_t)c->cap, sizeof *c->v);
    return c;
}

void so_cache_free(struct so_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        grammar_unref(c->v[i].g);
        free(c->v[i].text);
    }
    free(c->v);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static uint64_t fnv(const char *s, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* A referenced grammar for the key, or NULL. Caller holds mu. */
static struct grammar *lookup(struct so_cache *c, enum so_kind kind, int strict, uint64_t h, const char *text,
                              size_t len) {
    for (int i = 0; i < c->n; i++) {
        struct so_entry *x = &c->v[i];
        if (x->hash == h && x->kind == kind && x->strict == strict && x->len == len &&
            (!len || !memcmp(x->text, text, len))) {
            x->used = ++c->clock;
            grammar_ref(x->g);
            return x->g;
        }
    }
    return NULL;
}

static struct grammar *compile(const struct so_spec *sp, struct kiln_error *err) {
    switch (sp->kind) {
    /* compact JSON, as OpenAI's structured outputs are: a grammar that
     * allows whitespace anywhere lets a model loop on newlines until
     * max_tokens, leaving no JSON at all */
    case SO_JSON_SCHEMA: {
        struct grammar_json_opts o = {.any_whitespace = 0, .strict = sp->strict};
        return grammar_compile_json_schema(sp->text, sp->len, &o, err);
    }
    case SO_JSON_OBJECT: {
        struct grammar_json_opts o = {.any_whitespace = 0, .strict = 0};
        static const char obj[] = "{\"type\":\"object\"}";
        return grammar_compile_json_schema(obj, sizeof obj - 1, &o, err);
    }
    case SO_REGEX: return grammar_compile_regex(sp->text, sp->len, err);
    case SO_EBNF:
    case SO_CHOICE: return grammar_compile_ebnf(sp->text, sp->len, NULL, err);
    default: return NULL;
    }
}

int so_compile(struct so_cache *c, const struct grammar_vocab *v, const struct so_spec *sp, struct grammar **out,
               struct req_error *e) {
    *out = NULL;
    if (sp->kind == SO_NONE) return 0;
    if (!v)
        return req_errorf(e, 400, "unsupported", sp->param,
                          "structured outputs need the model's tokenizer, and this model has none");
    const char *text = sp->text ? sp->text : "";
    uint64_t h = fnv(text, sp->len, 0xcbf29ce484222325ull ^ (uint64_t)sp->kind * 31 ^ (uint64_t)sp->strict);
    pthread_mutex_lock(&c->mu);
    struct grammar *g = lookup(c, sp->kind, sp->strict, h, text, sp->len);
    pthread_mutex_unlock(&c->mu);
    if (g) {
        *out = g;
        return 0;
    }
    struct kiln_error err = {0};
    double t0 = time_now();
    g = compile(sp, &err);
    /* a valid schema or pattern kiln cannot constrain: "unsupported" */
    if (!g)
        return req_errorf(e, 400, err.code == KILN_ERR_UNSUPPORTED ? "unsupported" : "invalid_value", sp->param,
                          "'%s': %s", sp->param, err.msg);
    double t1 = time_now();
    if (grammar_prepare(g, v, &err)) {
        grammar_unref(g);
        return req_errorf(e, 400, "invalid_value", sp->param, "'%s': %s", sp->param, err.msg);
    }
    log_debug("structured output (%s): compiled in %.2f ms, token cache in %.2f ms", sp->param, (t1 - t0) * 1e3,
              (time_now() - t1) * 1e3);
    pthread_mutex_lock(&c->mu);
    struct grammar *had = lookup(c, sp->kind, sp->strict, h, text, sp->len);
    if (had) { /* another thread compiled it meanwhile: one copy in the cache */
        pthread_mutex_unlock(&c->mu);
        grammar_unref(g);
        *out = had;
        return 0;
    }
    struct so_entry *slot;
    if (c->n < c->cap) {
        slot = &c->v[c->n++];
    } else {
        slot = &c->v[0];
        for (int i = 1; i < c->n; i++)
            if (c->v[i].used < slot->used) slot = &c->v[i];
        grammar_unref(slot->g);
        free(slot->text);
    }
    *slot = (struct so_entry){.kind = sp->kind, .strict = sp->strict, .hash = h,
                              .text = xstrndup(text, sp->len), .len = sp->len, .g = g, .used = ++c->clock};
    grammar_ref(g);
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}

/* ---- the server's side ------------------------------------------------------------ */

int server_structured(struct server *s, struct gen_params *gp, struct req_error *e) {
    if (gp->so.kind == SO_NONE) return 0;
    if (so_compile(s->so_cache, engine_grammar_vocab(s->engine), &gp->so, &gp->grammar, e)) return -1;
    gp->r.grammar = gp->grammar;
    return 0;
}
