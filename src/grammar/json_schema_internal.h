/* json_schema_internal.h — what the two halves of the JSON Schema translator
 * share: the translation context (json_schema.c: schemas, references,
 * objects, arrays, combinators) and the scalar writers
 * (json_schema_scalar.c: strings, formats, numbers and their bounds,
 * constants).
 *
 * Every schema becomes an EBNF expression appended to a buffer; the
 * helpers that need rules of their own add them to ctx->rules, and the
 * shared JSON rules (value, string, number, ...) are written once at the
 * end for those that were used (ctx->used).
 */
#ifndef KILN_GRAMMAR_JSON_SCHEMA_INTERNAL_H
#define KILN_GRAMMAR_JSON_SCHEMA_INTERNAL_H

#include <stdint.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"

/* gen results: an expression was written, or the schema matches no value
 * (false, an empty enum, minItems > maxItems) and nothing was written */
enum { JS_OK = 0, JS_ERR = -1, JS_NEVER = 1 };

/* shared rules, written at the end when used */
enum js_common {
    JSC_WS = 1u << 0,     /* ws: any JSON white space */
    JSC_VALUE = 1u << 1,  /* value, object, array, member: any JSON value */
    JSC_STRING = 1u << 2, /* string: any JSON string */
    JSC_CHAR = 1u << 3,   /* char: one character of a JSON string, any form */
    JSC_NUMBER = 1u << 4, /* number */
    JSC_INT = 1u << 5,    /* integer */
    JSC_CCHAR = 1u << 6,  /* cchar: one character of a JSON string, canonical form */
};

struct js_ref {
    const json_t *target;
    int rule;     /* its rule number */
    int depth;    /* ctx->depth when its translation began */
    int done;
};

struct js_ctx {
    const json_t *root;
    int ws;    /* white space between tokens (opts.any_whitespace < 0) */
    int strict;
    struct buf rules; /* finished rules, one per line */
    int n_rules;
    unsigned used;    /* enum js_common bits */
    struct buf ptr;   /* the JSON pointer of the schema being translated */
    int depth;        /* objects and arrays entered: a reference back to a
                       * schema at the same depth consumes nothing */
    int nest;         /* recursion guard */
    struct js_ref *refs;
    int n_refs, cap_refs;
    struct kiln_error *err;
};

/* " ws " between tokens when white space is allowed, else " ". */
const char *js_w(struct js_ctx *c);
/* A new rule number; its name is "r<N>" (js_rule_name). */
int js_new_rule(struct js_ctx *c);
void js_put_rule_ref(struct buf *out, int rule);
/* Adds "r<N> ::= body" to the rules. */
void js_add_rule(struct js_ctx *c, int rule, const char *body, size_t len);
/* The pointer for messages: "/properties/a", or "the root" for "". */
const char *js_where(struct js_ctx *c);
int js_unsupported(struct js_ctx *c, const char *keyword);

/* Keywords that assert nothing (title, $defs, ...). */
int js_is_annotation(const char *key);
/* The schema a local reference ("#/$defs/a") names; NULL with err set. */
const json_t *js_resolve_ref(struct js_ctx *c, const char *ref);

/* json_schema_merge.c: a new schema meaning a and b both (what: the
 * keyword asking, for messages), or NULL with err set when they do not
 * combine exactly. */
json_t *js_merge(struct js_ctx *c, const json_t *a, const json_t *b, const char *what);

/* json_schema_scalar.c */
int js_gen_string(struct js_ctx *c, const json_t *s, struct buf *out);
int js_gen_number(struct js_ctx *c, const json_t *s, int integer, struct buf *out);
/* A JSON value as the literal text the grammar accepts for it (canonical:
 * keys in the value's order, numbers as JSON.stringify writes them). */
void js_put_const(struct js_ctx *c, const json_t *v, struct buf *out);
/* The canonical JSON text of a string value, quotes included. */
void js_canon_string(struct buf *out, const char *s, size_t n);
/* The shared rules that were used, appended to out. */
void js_put_common(struct js_ctx *c, struct buf *out);

#endif
