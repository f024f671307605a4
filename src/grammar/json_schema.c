/* json_schema.c — JSON Schema (draft 2020-12 and draft-07 keywords, draft-04's
 * boolean exclusiveMinimum/Maximum) to EBNF, and the compilers built on it.
 *
 * What the grammar fixes that JSON Schema leaves free (a validator accepts
 * both forms; the grammar one):
 *  - object keys come in the schema's "properties" order, each at most once;
 *    keys the schema does not name (when additionalProperties allows them)
 *    come after, and differ from every named key in their canonical form;
 *  - strings checked against a pattern, a length or a key set write each
 *    character canonically (raw, or JSON.stringify's escapes: \" \\ \b \f
 *    \n \r \t and \u00XX for other control characters); other strings
 *    take any escape (a \u surrogate only as half of a pair);
 *  - numbers under bounds are written without an exponent;
 *  - const and enum values are written canonically, keys in their order.
 * Keywords kiln cannot enforce exactly are refused, naming the keyword and
 * its JSON pointer; annotations and keywords JSON Schema does not define
 * are ignored, as every validator does.
 *
 * allOf, and anyOf / oneOf next to keywords of their own, are merged into
 * single schemas where the keywords combine exactly (json_schema_merge.c).
 * oneOf is enforced only when its branches cannot both match: disjoint JSON
 * types, disjoint constant sets, or objects told apart by a required
 * property with disjoint constants (a discriminator). Otherwise it is
 * refused: an alternation would accept a value matching two branches.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"
#include "grammar/json_schema_internal.h"
#include "grammar/regex.h"

enum { JS_MAX_NEST = 128 };

static const char *const annotation_keys[] = {
    "title", "description", "$schema", "$id", "id", "examples", "default", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType", "contentEncoding",
    "contentSchema", "$vocabulary", NULL};
static const char *const unsupported_keys[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependencies", "dependentRequired",
    "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "multipleOf", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "minProperties",
    "maxProperties", NULL};
/* the keywords each type's translation reads */
static const char *const string_keys[] = {"minLength", "maxLength", "pattern", "format", NULL};
static const char *const number_keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
static const char *const object_keys[] = {"properties", "required", "additionalProperties", NULL};
static const char *const array_keys[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                         "uniqueItems", NULL};

enum {
    T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_FRAC = 64, /* non-integer numbers */
    T_ALL = 127,
};

static int in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

int js_is_annotation(const char *key) { return in_list(annotation_keys, key); }

/* ---- context helpers ---- */

const char *js_w(struct js_ctx *c) { return c->ws ? " ws " : " "; }

int js_new_rule(struct js_ctx *c) { return c->n_rules++; }

void js_put_rule_ref(struct buf *out, int rule) { buf_printf(out, "r%d", rule); }

void js_add_rule(struct js_ctx *c, int rule, const char *body, size_t len) {
    buf_printf(&c->rules, "r%d ::= ", rule);
    buf_append(&c->rules, body, len);
    buf_push(&c->rules, '\n');
}

const char *js_where(struct js_ctx *c) { return c->ptr.len ? c->ptr.data : "the root"; }

int js_unsupported(struct js_ctx *c, const char *keyword) {
    return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED, "json_schema: '%s' at %s is not supported", keyword,
                       js_where(c));
}

/* Appends "/seg" (escaped per RFC 6901) to the pointer; returns the old
 * length for ptr_pop. */
static size_t ptr_push(struct js_ctx *c, const char *seg) {
    size_t old = c->ptr.len;
    buf_push(&c->ptr, '/');
    for (const char *p = seg; *p; p++) {
        if (*p == '~') buf_puts(&c->ptr, "~0");
        else if (*p == '/') buf_puts(&c->ptr, "~1");
        else buf_push(&c->ptr, *p);
    }
    return old;
}

static size_t ptr_push_index(struct js_ctx *c, size_t i) {
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%zu", i);
    return ptr_push(c, tmp);
}

static void ptr_pop(struct js_ctx *c, size_t old) { buf_truncate(&c->ptr, old); }

static int gen(struct js_ctx *c, const json_t *s, struct buf *out);

/* gen at a child pointer: s[key] (and index i when i >= 0). */
static int gen_at(struct js_ctx *c, const json_t *s, const char *key, long i, struct buf *out) {
    size_t old = ptr_push(c, key);
    if (i >= 0) ptr_push_index(c, (size_t)i);
    int r = gen(c, s, out);
    ptr_pop(c, old);
    return r;
}

/* ---- $ref ---- */

/* The schema a local reference names: "#", "#/$defs/a", any JSON pointer
 * fragment (percent-decoded, ~0 ~1 unescaped). NULL with err set. */
const json_t *js_resolve_ref(struct js_ctx *c, const char *ref) {
    if (ref[0] != '#')
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: '$ref' \"%s\" at %s: only local references (\"#...\") are supported", ref,
                           js_where(c)), NULL;
    if (ref[1] && ref[1] != '/')
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: '$ref' \"%s\" at %s: anchors are not supported, only JSON pointers", ref,
                           js_where(c)), NULL;
    struct buf dec = {0};
    for (const char *p = ref + 1; *p; p++) {
        int h1, h2;
        if (*p == '%' && p[1] && p[2] && (h1 = (p[1] >= 'a' ? p[1] - 'a' + 10 : p[1] >= 'A' ? p[1] - 'A' + 10 : p[1] - '0')) >= 0 &&
            h1 < 16 && (h2 = (p[2] >= 'a' ? p[2] - 'a' + 10 : p[2] >= 'A' ? p[2] - 'A' + 10 : p[2] - '0')) >= 0 && h2 < 16) {
            buf_push(&dec, (char)(h1 * 16 + h2));
            p += 2;
        } else {
            buf_push(&dec, *p);
        }
    }
    const json_t *cur = c->root;
    const char *p = dec.len ? dec.data : "";
    struct buf seg = {0};
    while (*p == '/' && cur) {
        p++;
        buf_clear(&seg);
        buf_reserve(&seg, 0);
        for (; *p && *p != '/'; p++) {
            if (p[0] == '~' && p[1] == '0') buf_push(&seg, '~'), p++;
            else if (p[0] == '~' && p[1] == '1') buf_push(&seg, '/'), p++;
            else buf_push(&seg, *p);
        }
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg.data);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(seg.data, &end, 10);
            cur = (seg.len && *end == 0 && (seg.data[0] != '0' || seg.len == 1)) ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
    }
    buf_free(&seg);
    buf_free(&dec);
    if (!cur) kiln_errorf(c->err, "json_schema: '$ref' \"%s\" at %s: no such schema", ref, js_where(c));
    return cur;
}

static int gen_ref(struct js_ctx *c, const char *ref, struct buf *out) {
    const json_t *t = js_resolve_ref(c, ref);
    if (!t) return JS_ERR;
    for (int i = 0; i < c->n_refs; i++) {
        if (c->refs[i].target != t) continue;
        if (!c->refs[i].done && c->refs[i].depth == c->depth)
            return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                               "json_schema: '$ref' \"%s\" at %s leads back to itself without entering an object "
                               "or array", ref, js_where(c));
        js_put_rule_ref(out, c->refs[i].rule);
        return JS_OK;
    }
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    int idx = c->n_refs++;
    int rule = js_new_rule(c);
    c->refs[idx] = (struct js_ref){.target = t, .rule = rule, .depth = c->depth};
    /* errors inside the target name the target's pointer */
    struct buf saved = c->ptr;
    c->ptr = (struct buf){0};
    buf_puts(&c->ptr, ref + 1);
    struct buf body = {0};
    int r = gen(c, t, &body);
    buf_free(&c->ptr);
    c->ptr = saved;
    if (r == JS_NEVER)
        r = kiln_errorc(c->err, KILN_ERR_UNSUPPORTED, "json_schema: '$ref' \"%s\" at %s names a schema no value matches",
                        ref, js_where(c));
    if (r == JS_OK) {
        js_add_rule(c, rule, body.data, body.len);
        c->refs[idx].done = 1;
        js_put_rule_ref(out, rule);
    }
    buf_free(&body);
    return r;
}

/* ---- oneOf: when can two branches not both match? ---- */

static const json_t *deref(struct js_ctx *c, const json_t *s) {
    for (int hops = 0; hops < 16 && json_is_object(s); hops++) {
        const json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r)) break;
        struct kiln_error junk;
        struct kiln_error *save = c->err;
        c->err = &junk;
        const json_t *t = js_resolve_ref(c, json_string_value(r));
        c->err = save;
        if (!t) return NULL;
        s = t;
    }
    return s;
}

static unsigned value_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE: case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_FRAC;
    }
    return T_ALL;
}

static unsigned type_name_mask(const char *t) {
    static const struct { const char *name; unsigned mask; } names[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
        {"string", T_STR}, {"integer", T_INT}, {"number", T_INT | T_FRAC}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(t, names[i].name)) return names[i].mask;
    return 0;
}

/* The JSON types a schema may match (a superset); errors read as T_ALL. */
static unsigned types_of(struct js_ctx *c, const json_t *s, int depth) {
    s = deref(c, s);
    if (!s || json_is_true(s) || depth > 16) return T_ALL;
    if (json_is_false(s)) return 0;
    if (!json_is_object(s)) return T_ALL;
    unsigned m = T_ALL;
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) m = type_name_mask(json_string_value(t));
    else if (json_is_array(t)) {
        m = 0;
        for (size_t i = 0; i < json_array_size(t); i++)
            if (json_is_string(json_array_get(t, i))) m |= type_name_mask(json_string_value(json_array_get(t, i)));
    }
    const json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    if (k) m &= value_type(k);
    if (json_is_array(e)) {
        unsigned em = 0;
        for (size_t i = 0; i < json_array_size(e); i++) em |= value_type(json_array_get(e, i));
        m &= em;
    }
    const char *combs[] = {"anyOf", "oneOf", "allOf"};
    for (int j = 0; j < 3; j++) {
        const json_t *a = json_object_get(s, combs[j]);
        if (!json_is_array(a)) continue;
        unsigned am = j == 2 ? T_ALL : 0;
        for (size_t i = 0; i < json_array_size(a); i++) {
            unsigned b = types_of(c, json_array_get(a, i), depth + 1);
            am = j == 2 ? am & b : am | b;
        }
        m &= am;
    }
    return m;
}

/* The finite set of values a schema allows (const / enum), or NULL. */
static const json_t *const_set(struct js_ctx *c, const json_t *s, json_t **tmp) {
    s = deref(c, s);
    if (!json_is_object(s)) return NULL;
    const json_t *k = json_object_get(s, "const");
    if (k) {
        *tmp = json_pack("[O]", k);
        return *tmp;
    }
    const json_t *e = json_object_get(s, "enum");
    return json_is_array(e) ? e : NULL;
}

static int sets_disjoint(const json_t *a, const json_t *b) {
    for (size_t i = 0; i < json_array_size(a); i++)
        for (size_t j = 0; j < json_array_size(b); j++)
            if (json_equal(json_array_get(a, i), json_array_get(b, j))) return 0;
    return 1;
}

/* Whether branches i and j of a oneOf cannot both match. */
static int branches_exclusive(struct js_ctx *c, const json_t *x, const json_t *y) {
    if (!(types_of(c, x, 0) & types_of(c, y, 0))) return 1;
    json_t *t1 = NULL, *t2 = NULL;
    const json_t *a = const_set(c, x, &t1), *b = const_set(c, y, &t2);
    int ok = a && b && sets_disjoint(a, b);
    json_decref(t1);
    json_decref(t2);
    if (ok) return 1;
    /* a discriminator: a property both require, with disjoint constants */
    x = deref(c, x), y = deref(c, y);
    if (!json_is_object(x) || !json_is_object(y)) return 0;
    const json_t *rx = json_object_get(x, "required"), *ry = json_object_get(y, "required");
    const json_t *px = json_object_get(x, "properties"), *py = json_object_get(y, "properties");
    for (size_t i = 0; i < json_array_size(rx); i++) {
        const char *name = json_string_value(json_array_get(rx, i));
        if (!name) continue;
        int in_y = 0;
        for (size_t j = 0; j < json_array_size(ry); j++)
            if (json_is_string(json_array_get(ry, j)) && !strcmp(json_string_value(json_array_get(ry, j)), name))
                in_y = 1;
        const json_t *sx = json_object_get(px, name), *sy = json_object_get(py, name);
        if (!in_y || !sx || !sy) continue;
        t1 = t2 = NULL;
        a = const_set(c, sx, &t1), b = const_set(c, sy, &t2);
        ok = a && b && sets_disjoint(a, b);
        json_decref(t1);
        json_decref(t2);
        if (ok && (types_of(c, x, 0) & ~T_OBJ) == 0 && (types_of(c, y, 0) & ~T_OBJ) == 0) return 1;
    }
    return 0;
}

/* ---- combinators ---- */

static int gen_union(struct js_ctx *c, const json_t *s, const char *key, const json_t *arr, struct buf *out) {
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return kiln_errorf(c->err, "json_schema: '%s' at %s must be a non-empty array", key, js_where(c));
    if (!strcmp(key, "oneOf")) {
        for (size_t i = 0; i < json_array_size(arr); i++)
            for (size_t j = i + 1; j < json_array_size(arr); j++)
                if (!branches_exclusive(c, json_array_get(arr, i), json_array_get(arr, j)))
                    return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                                       "json_schema: 'oneOf' at %s is not supported: branches %zu and %zu may both "
                                       "match (kiln enforces oneOf when branches differ in type or constants; "
                                       "anyOf is supported)", js_where(c), i, j);
    }
    struct buf alts = {0};
    int n = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        struct buf e = {0};
        int r = gen_at(c, json_array_get(arr, i), key, (long)i, &e);
        if (r == JS_ERR) {
            buf_free(&e);
            buf_free(&alts);
            return JS_ERR;
        }
        if (r == JS_OK) {
            if (n++) buf_puts(&alts, " | ");
            buf_append(&alts, e.data, e.len);
        }
        buf_free(&e);
    }
    (void)s;
    if (!n) {
        buf_free(&alts);
        return JS_NEVER;
    }
    if (n == 1) {
        buf_append(out, alts.data, alts.len);
    } else {
        int rule = js_new_rule(c);
        js_add_rule(c, rule, alts.data, alts.len);
        js_put_rule_ref(out, rule);
    }
    buf_free(&alts);
    return JS_OK;
}

static int gen_enum(struct js_ctx *c, const json_t *s, unsigned types, struct buf *out) {
    const json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    if (e && !json_is_array(e)) return kiln_errorf(c->err, "json_schema: 'enum' at %s must be an array", js_where(c));
    struct buf alts = {0};
    int n = 0;
    size_t count = k ? 1 : json_array_size(e);
    for (size_t i = 0; i < count; i++) {
        const json_t *v = k ? k : json_array_get(e, i);
        if (k && e) { /* both: the const, when the enum lists it */
            int found = 0;
            for (size_t j = 0; j < json_array_size(e); j++) found |= json_equal(v, json_array_get(e, j));
            if (!found) continue;
        }
        if (!(value_type(v) & types)) continue;
        int dup = 0; /* an enum may list a value twice: one alternative */
        for (size_t j = 0; j < i && !k; j++) dup |= json_equal(v, json_array_get(e, j));
        if (dup) continue;
        if (n++) buf_puts(&alts, " | ");
        js_put_const(c, v, &alts);
    }
    if (!n) {
        buf_free(&alts);
        return JS_NEVER;
    }
    int rule = js_new_rule(c);
    js_add_rule(c, rule, alts.data, alts.len);
    buf_free(&alts);
    js_put_rule_ref(out, rule);
    return JS_OK;
}

/* defined in json_schema_object.c */
int js_gen_object(struct js_ctx *c, const json_t *s, struct buf *out);
int js_gen_array(struct js_ctx *c, const json_t *s, struct buf *out);

static int has_any(const json_t *s, const char *const *keys) {
    for (; *keys; keys++)
        if (json_object_get(s, *keys)) return 1;
    return 0;
}

/* A keyword of JSON Schema that kiln reads (others are annotations or not
 * JSON Schema at all). */
static int is_keyword(const char *k) {
    static const char *const more[] = {"type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref", NULL};
    return in_list(string_keys, k) || in_list(number_keys, k) || in_list(object_keys, k) || in_list(array_keys, k) ||
           in_list(more, k) || in_list(unsupported_keys, k);
}

/* Whether s has keywords besides `except` that assert something. */
static int has_assertions(const json_t *s, const char *except) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (strcmp(k, except) && is_keyword(k)) return 1;
    return 0;
}

static int gen_object_schema(struct js_ctx *c, const json_t *s, struct buf *out) {
    const char *key;
    json_t *v;
    /* refuse first: an unsupported keyword anywhere is an error, whatever
     * the types */
    json_object_foreach((json_t *)s, key, v) {
        if (in_list(unsupported_keys, key)) {
            /* the trivial forms of some assert nothing */
            if ((!strcmp(key, "minProperties") && json_is_integer(v) && json_integer_value(v) == 0)) continue;
            return js_unsupported(c, key);
        }
    }
    const json_t *id = json_object_get(s, "$id");
    if (!id) id = json_object_get(s, "id");
    if (c->ptr.len && json_is_string(id) && json_string_value(id)[0] != '#')
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: '$id' at %s is not supported below the root (it would move references)",
                           js_where(c));
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        /* drafts differ on the keywords next to $ref (draft-07 ignores
         * them, 2019-09 on applies them): refused rather than guessed */
        json_object_foreach((json_t *)s, key, v) {
            if (!strcmp(key, "$ref") || in_list(annotation_keys, key) || !is_keyword(key)) continue;
            return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED, "json_schema: '$ref' next to '%s' at %s is not supported",
                               key, js_where(c));
        }
        if (!json_is_string(ref)) return kiln_errorf(c->err, "json_schema: '$ref' at %s must be a string", js_where(c));
        return gen_ref(c, json_string_value(ref), out);
    }
    const json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) == 0)
            return kiln_errorf(c->err, "json_schema: 'allOf' at %s must be a non-empty array", js_where(c));
        if (json_array_size(all) == 1 && !has_assertions(s, "allOf"))
            return gen_at(c, json_array_get(all, 0), "allOf", 0, out);
        /* the schemas merged into one, with the keywords next to allOf */
        json_t *m = json_copy((json_t *)s);
        json_object_del(m, "allOf");
        for (size_t i = 0; i < json_array_size(all) && m; i++) {
            json_t *n = js_merge(c, m, json_array_get(all, i), "'allOf'");
            json_decref(m);
            m = n;
        }
        if (!m) return JS_ERR;
        int r = gen(c, m, out);
        json_decref(m);
        return r;
    }
    const char *uk = json_object_get(s, "anyOf") ? "anyOf" : json_object_get(s, "oneOf") ? "oneOf" : NULL;
    if (uk) {
        const json_t *arr = json_object_get(s, uk);
        if (!has_assertions(s, uk) || !json_is_array(arr)) return gen_union(c, s, uk, arr, out);
        /* keywords next to anyOf / oneOf hold in every branch */
        json_t *base = json_copy((json_t *)s), *branches = json_array();
        json_object_del(base, uk);
        int r = JS_OK;
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *n = js_merge(c, base, json_array_get(arr, i), uk[0] == 'a' ? "'anyOf'" : "'oneOf'");
            if (!n) {
                r = JS_ERR;
                break;
            }
            json_array_append_new(branches, n);
        }
        if (r == JS_OK) r = gen_union(c, s, uk, branches, out);
        json_decref(base);
        json_decref(branches);
        return r;
    }

    /* the types */
    unsigned types = T_ALL;
    const json_t *t = json_object_get(s, "type");
    if (t) {
        types = 0;
        size_t n = json_is_array(t) ? json_array_size(t) : 1;
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
            unsigned m = json_is_string(x) ? type_name_mask(json_string_value(x)) : 0;
            if (!m)
                return kiln_errorf(c->err, "json_schema: 'type' at %s must be a type name or an array of them "
                                   "(null, boolean, object, array, number, integer, string)", js_where(c));
            types |= m;
        }
    }
    if (json_is_true(json_object_get(s, "uniqueItems")) && (types & T_ARR)) {
        const json_t *mx = json_object_get(s, "maxItems");
        if (!(json_is_integer(mx) && json_integer_value(mx) <= 1)) return js_unsupported(c, "uniqueItems");
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        json_object_foreach((json_t *)s, key, v) {
            if (in_list(string_keys, key) || in_list(number_keys, key) || in_list(object_keys, key) ||
                in_list(array_keys, key))
                return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                                   "json_schema: '%s' next to '%s' at %s is not supported",
                                   json_object_get(s, "enum") ? "enum" : "const", key, js_where(c));
        }
        return gen_enum(c, s, types, out);
    }
    if (types == T_ALL && !has_any(s, string_keys) && !has_any(s, number_keys) && !has_any(s, object_keys) &&
        !has_any(s, array_keys)) {
        c->used |= JSC_VALUE;
        buf_puts(out, "value");
        return JS_OK;
    }
    struct buf alts = {0};
    int n = 0, r = JS_OK;
    for (unsigned bit = 1; bit < T_ALL && r != JS_ERR; bit <<= 1) {
        if (!(types & bit) || (bit == T_INT && (types & T_FRAC))) continue;
        struct buf e = {0};
        switch (bit) {
        case T_NULL: buf_puts(&e, "\"null\""); r = JS_OK; break;
        case T_BOOL: buf_puts(&e, "(\"true\" | \"false\")"); r = JS_OK; break;
        case T_OBJ: r = js_gen_object(c, s, &e); break;
        case T_ARR: r = js_gen_array(c, s, &e); break;
        case T_STR: r = js_gen_string(c, s, &e); break;
        case T_INT: r = js_gen_number(c, s, 1, &e); break;
        case T_FRAC: r = js_gen_number(c, s, 0, &e); break;
        }
        if (r == JS_OK) {
            if (n++) buf_puts(&alts, " | ");
            buf_append(&alts, e.data, e.len);
        }
        buf_free(&e);
    }
    if (r == JS_ERR || n == 0) {
        buf_free(&alts);
        return r == JS_ERR ? JS_ERR : JS_NEVER;
    }
    if (n == 1) {
        buf_append(out, alts.data, alts.len);
    } else {
        int rule = js_new_rule(c);
        js_add_rule(c, rule, alts.data, alts.len);
        js_put_rule_ref(out, rule);
    }
    buf_free(&alts);
    return JS_OK;
}

static int gen(struct js_ctx *c, const json_t *s, struct buf *out) {
    if (json_is_true(s)) {
        c->used |= JSC_VALUE;
        buf_puts(out, "value");
        return JS_OK;
    }
    if (json_is_false(s)) return JS_NEVER;
    if (!json_is_object(s))
        return kiln_errorf(c->err, "json_schema: the schema at %s must be an object or a boolean, not %s",
                           js_where(c), json_is_array(s) ? "an array" : "a scalar");
    if (++c->nest > JS_MAX_NEST) {
        c->nest--;
        return kiln_errorc(c->err, KILN_ERR_TOO_LARGE, "json_schema: schemas nested deeper than %d at %s",
                           JS_MAX_NEST, js_where(c));
    }
    int r = gen_object_schema(c, s, out);
    c->nest--;
    return r;
}

/* Exposed to json_schema_object.c through a declaration there. */
int js_gen_child(struct js_ctx *c, const json_t *s, const char *key, const char *key2, long index, struct buf *out);
int js_gen_child(struct js_ctx *c, const json_t *s, const char *key, const char *key2, long index, struct buf *out) {
    size_t old = ptr_push(c, key);
    if (key2) ptr_push(c, key2);
    if (index >= 0) ptr_push_index(c, (size_t)index);
    int r = gen(c, s, out);
    ptr_pop(c, old);
    return r;
}

/* ---- entry points ---- */

/* Whether the translated rules (text, len) match some text: the grammar
 * engine compiles them and keeps only what the root reaches. 1 with the
 * grammar in *g when it compiles (the caller that wants it keeps it, so
 * the schema is compiled once); 0 when it matches no text; 1 with *g NULL
 * past the engine's size limits or on another refusal: the caller's own
 * compile says what is wrong. */
static int js_has_finite_value(const char *text, size_t len, struct grammar **g) {
    struct kiln_error e = {0};
    int empty;
    *g = grammar_compile_ebnf_empty(text, len, "root", &empty, &e);
    return *g || !empty;
}

/* The translation into out; for a schema with references, *compiled (when
 * not NULL) gets the grammar the finiteness check compiled, if it did. */
static int js_translate(const json_t *schema, const struct grammar_json_opts *opts, struct buf *out,
                        struct kiln_error *err, struct grammar **compiled) {
    struct js_ctx c = {.root = schema, .err = err};
    c.ws = opts ? opts->any_whitespace < 0 : 1;
    c.strict = opts ? opts->strict : 0;
    struct buf root = {0};
    int r = gen(&c, schema, &root);
    if (r == JS_NEVER) r = kiln_errorf(err, "json_schema: no value matches the schema");
    if (r == JS_OK) {
        size_t at = out->len;
        buf_puts(out, "root ::= ");
        buf_append(out, root.data, root.len);
        buf_push(out, '\n');
        if (c.rules.len) buf_append(out, c.rules.data, c.rules.len);
        js_put_common(&c, out);
        /* A reference back into a schema can leave no finite value: an
         * object whose required property is the object again (strict mode
         * requires them all). Only then can the rules above match nothing,
         * so only then are they compiled here, to say so in the schema's
         * terms instead of handing the engine a grammar it refuses. */
        struct grammar *g = NULL;
        if (c.n_refs > 0 && !js_has_finite_value(out->data + at, out->len - at, &g)) {
            out->len = at;
            r = kiln_errorf(err, "json_schema: no finite value matches the schema (a $ref that every value "
                                 "must take again, such as a required property holding the object itself)");
        }
        if (g && compiled) *compiled = g;
        else if (g) grammar_unref(g);
    }
    buf_free(&root);
    buf_free(&c.rules);
    buf_free(&c.ptr);
    free(c.refs);
    return r == JS_OK ? 0 : -1;
}

int grammar_ebnf_from_json_schema(const json_t *schema, const struct grammar_json_opts *opts, struct buf *out,
                                  struct kiln_error *err) {
    return js_translate(schema, opts, out, err, NULL);
}

struct grammar *grammar_compile_json_schema(const char *schema, size_t len, const struct grammar_json_opts *opts,
                                            struct kiln_error *err) {
    json_error_t je;
    json_t *s = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!s) {
        kiln_errorf(err, "json_schema: not valid JSON: %s at line %d, column %d", je.text, je.line, je.column);
        return NULL;
    }
    struct buf b = {0};
    struct grammar *g = NULL;
    if (js_translate(s, opts, &b, err, &g) == 0 && !g) {
        g = grammar_compile_ebnf(b.data, b.len, "root", err);
        if (!g) kiln_error_prefix(err, "json_schema: the translated grammar");
    }
    buf_free(&b);
    json_decref(s);
    return g;
}

struct grammar *grammar_compile_json_object(struct kiln_error *err) {
    const char text[] =
        "root ::= object\n"
        "ws ::= [ \\t\\n\\r]*\n"
        "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
        "object ::= \"{\" ws (member (ws \",\" ws member)*)? ws \"}\"\n"
        "member ::= string ws \":\" ws value\n"
        "array ::= \"[\" ws (value (ws \",\" ws value)*)? ws \"]\"\n"
        "string ::= \"\\\"\" char* \"\\\"\"\n"
        "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
        "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\x2D]? [0-9]+)?\n";
    return grammar_compile_ebnf(text, sizeof text - 1, "root", err);
}
