/* json_schema_merge.c — one schema equal to two that must both hold (allOf,
 * and anyOf / oneOf next to keywords of their own), for the cases where the
 * keywords combine without changing meaning:
 *  - a keyword on one side only is kept; type sets intersect; required
 *    lists unite; min* bounds take the larger, max* the smaller; enum and
 *    const keep the values both allow; a property both name holds both of
 *    its schemas (an allOf of the two, merged in turn);
 *  - keywords whose meaning depends on their neighbours refuse to merge when
 *    the neighbours differ: additionalProperties against properties the
 *    other side adds, items / prefixItems / additionalItems on both sides;
 *  - anything else present on both sides must be equal.
 * What cannot be merged is refused with the keyword's name.
 */
#include <string.h>

#include "grammar/json_schema_internal.h"

static int refuse(struct js_ctx *c, const char *what, const char *key) {
    return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                       "json_schema: %s at %s: '%s' of two schemas cannot be combined", what, js_where(c), key);
}

enum { M_NULL = 1, M_BOOL = 2, M_OBJ = 4, M_ARR = 8, M_STR = 16, M_INT = 32, M_FRAC = 64, M_ALL = 127 };

static unsigned type_bits(const char *n) {
    static const struct { const char *name; unsigned bits; } t[] = {
        {"null", M_NULL}, {"boolean", M_BOOL}, {"object", M_OBJ}, {"array", M_ARR},
        {"string", M_STR}, {"integer", M_INT}, {"number", M_INT | M_FRAC}};
    for (size_t i = 0; n && i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(n, t[i].name)) return t[i].bits;
    return 0;
}

static unsigned type_mask(const json_t *t) {
    if (json_is_string(t)) return type_bits(json_string_value(t));
    unsigned m = 0;
    for (size_t i = 0; i < json_array_size(t); i++) m |= type_bits(json_string_value(json_array_get(t, i)));
    return m;
}

/* The intersection of two type keywords, as an array of names. */
static json_t *merge_types(const json_t *a, const json_t *b) {
    unsigned m = type_mask(a) & type_mask(b);
    json_t *out = json_array();
    static const char *const names[] = {"null", "boolean", "object", "array", "string"};
    for (int i = 0; i < 5; i++)
        if (m & (1u << i)) json_array_append_new(out, json_string(names[i]));
    if ((m & (M_INT | M_FRAC)) == (M_INT | M_FRAC)) json_array_append_new(out, json_string("number"));
    else if (m & M_INT) json_array_append_new(out, json_string("integer"));
    return out;
}

static json_t *values_of(const json_t *s) {
    const json_t *k = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (k) return json_pack("[O]", k);
    return json_incref((json_t *)e);
}

static int names_subset(const json_t *props, const json_t *of) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v)
        if (!json_object_get(of, k)) return 0;
    return 1;
}

/* Follows a $ref that stands alone (annotations aside). */
static const json_t *plain_target(struct js_ctx *c, const json_t *s, int *bad) {
    const json_t *r = json_object_get(s, "$ref");
    if (!r) return s;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (strcmp(k, "$ref") && !js_is_annotation(k)) *bad = 1;
    if (*bad || !json_is_string(r)) return s;
    const json_t *t = js_resolve_ref(c, json_string_value(r));
    if (!t) *bad = 2;
    return t;
}

json_t *js_merge(struct js_ctx *c, const json_t *a, const json_t *b, const char *what) {
    for (int hops = 0; hops < 8; hops++) {
        int bad = 0;
        const json_t *ta = json_is_object(a) ? plain_target(c, a, &bad) : a;
        if (bad == 2) return NULL;
        const json_t *tb = json_is_object(b) ? plain_target(c, b, &bad) : b;
        if (bad == 2) return NULL;
        if (bad) return refuse(c, what, "$ref"), NULL;
        if (ta == a && tb == b) break;
        a = ta, b = tb;
    }
    if (json_is_false(a) || json_is_false(b)) return json_false();
    if (json_is_true(a)) return json_deep_copy(b);
    if (json_is_true(b)) return json_deep_copy(a);
    if (!json_is_object(a) || !json_is_object(b))
        return kiln_errorf(c->err, "json_schema: %s at %s: a schema must be an object or a boolean", what,
                           js_where(c)), NULL;
    if (json_object_get(a, "$ref") || json_object_get(b, "$ref")) return refuse(c, what, "$ref"), NULL;
    /* keywords that read their neighbours */
    if ((json_object_get(a, "additionalProperties") && json_object_get(b, "properties") &&
         !names_subset(json_object_get(b, "properties"), json_object_get(a, "properties"))) ||
        (json_object_get(b, "additionalProperties") && json_object_get(a, "properties") &&
         !names_subset(json_object_get(a, "properties"), json_object_get(b, "properties"))))
        return refuse(c, what, "additionalProperties"), NULL;
    static const char *const positional[] = {"items", "prefixItems", "additionalItems"};
    int pa = 0, pb = 0;
    for (int i = 0; i < 3; i++) {
        pa |= json_object_get(a, positional[i]) != NULL;
        pb |= json_object_get(b, positional[i]) != NULL;
    }
    if (pa && pb) {
        for (int i = 0; i < 3; i++)
            if (!json_equal(json_object_get(a, positional[i]), json_object_get(b, positional[i])))
                return refuse(c, what, positional[i]), NULL;
    }
    /* draft 4's boolean exclusiveMinimum qualifies its own side's minimum */
    static const char *const bound[][2] = {{"minimum", "exclusiveMinimum"}, {"maximum", "exclusiveMaximum"}};
    for (int i = 0; i < 2; i++)
        if ((json_is_boolean(json_object_get(a, bound[i][1])) || json_is_boolean(json_object_get(b, bound[i][1]))) &&
            json_object_get(a, bound[i][0]) && json_object_get(b, bound[i][0]) &&
            !json_equal(json_object_get(a, bound[i][1]), json_object_get(b, bound[i][1])))
            return refuse(c, what, bound[i][1]), NULL;
    json_t *out = json_deep_copy(a);
    const char *key;
    json_t *bv;
    json_object_foreach((json_t *)b, key, bv) {
        json_t *av = json_object_get(a, key);
        if (js_is_annotation(key)) {
            if (!av) json_object_set(out, key, bv);
            continue;
        }
        if (!av) {
            json_object_set(out, key, bv);
            continue;
        }
        if (json_equal(av, bv)) continue;
        if (!strcmp(key, "type")) {
            json_object_set_new(out, key, merge_types(av, bv));
        } else if (!strcmp(key, "required") && json_is_array(av) && json_is_array(bv)) {
            json_t *r = json_deep_copy(av);
            for (size_t i = 0; i < json_array_size(bv); i++) {
                int dup = 0;
                for (size_t j = 0; j < json_array_size(r); j++) dup |= json_equal(json_array_get(r, j), json_array_get(bv, i));
                if (!dup) json_array_append(r, json_array_get(bv, i));
            }
            json_object_set_new(out, key, r);
        } else if (!strcmp(key, "properties") && json_is_object(av) && json_is_object(bv)) {
            json_t *p = json_deep_copy(av);
            const char *name;
            json_t *sv;
            json_object_foreach(bv, name, sv) {
                json_t *x = json_object_get(av, name);
                if (!x) json_object_set(p, name, sv);
                else if (!json_equal(x, sv)) json_object_set_new(p, name, json_pack("{s:[O,O]}", "allOf", x, sv));
            }
            json_object_set_new(out, key, p);
        } else if ((!strcmp(key, "minLength") || !strcmp(key, "minItems") || !strcmp(key, "minimum") ||
                    !strcmp(key, "exclusiveMinimum")) && json_is_number(av) && json_is_number(bv)) {
            if (json_number_value(bv) > json_number_value(av)) json_object_set(out, key, bv);
        } else if ((!strcmp(key, "maxLength") || !strcmp(key, "maxItems") || !strcmp(key, "maximum") ||
                    !strcmp(key, "exclusiveMaximum")) && json_is_number(av) && json_is_number(bv)) {
            if (json_number_value(bv) < json_number_value(av)) json_object_set(out, key, bv);
        } else if (!strcmp(key, "enum") || !strcmp(key, "const")) {
            /* below, with the other side's enum or const */
        } else {
            json_decref(out);
            return refuse(c, what, key), NULL;
        }
    }
    /* enum / const: the values both sides allow */
    if ((json_object_get(a, "enum") || json_object_get(a, "const")) &&
        (json_object_get(b, "enum") || json_object_get(b, "const"))) {
        json_t *va = values_of(a), *vb = values_of(b), *both = json_array();
        for (size_t i = 0; i < json_array_size(va); i++)
            for (size_t j = 0; j < json_array_size(vb); j++)
                if (json_equal(json_array_get(va, i), json_array_get(vb, j))) {
                    json_array_append(both, json_array_get(va, i));
                    break;
                }
        json_object_del(out, "const");
        json_object_set_new(out, "enum", both);
        json_decref(va);
        json_decref(vb);
    }
    return out;
}
