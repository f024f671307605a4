/* json_schema_object.c — objects and arrays of the JSON Schema translator
 * (see json_schema_internal.h).
 *
 * An object with properties p1..pn (schema order) is a chain of rules, two
 * per property: S_i ("nothing written yet, p_i is next") and R_i ("something
 * written, a comma comes before p_i"):
 *
 *     object ::= "{" S_1 "}"
 *     S_i ::= kv_i R_i+1 | S_i+1          (the second only if p_i is optional)
 *     R_i ::= "," kv_i R_i+1              (or ("," kv_i)? R_i+1 if optional)
 *     S_n+1 ::= (extra R_n+1)?,  R_n+1 ::= ("," extra)*   (extra keys allowed)
 *
 * so the size is linear in the number of properties. Extra keys must differ
 * from every named key: their grammar walks a trie of the names and leaves
 * it at the first character that differs (or at a closing quote where no
 * name ends). Arrays work the same way over positions: prefixItems first,
 * then the items schema repeated within minItems / maxItems.
 */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"
#include "grammar/json_schema_internal.h"
#include "grammar/regex.h"

int js_gen_object(struct js_ctx *c, const json_t *s, struct buf *out);
int js_gen_array(struct js_ctx *c, const json_t *s, struct buf *out);
int js_gen_child(struct js_ctx *c, const json_t *s, const char *key, const char *key2, long index, struct buf *out);

enum { JS_MAX_ITEMS = 100000 };

/* ---- keys that are none of a set of names ---- */

struct key_name {
    uint32_t *cp;
    int len;
};

/* names[0..n) share their first d code points; the rule for the rest of
 * a key (closing quote included) that is none of them. */
static int put_key_trie(struct js_ctx *c, struct key_name *names, int n, int d) {
    int rule = js_new_rule(c);
    struct buf b = {0}, t = {0};
    int alts = 0, terminal = 0;
    uint32_t *next = xmalloc((size_t)n * sizeof *next);
    int n_next = 0;
    for (int i = 0; i < n; i++) {
        if (names[i].len == d) {
            terminal = 1;
            continue;
        }
        uint32_t cp = names[i].cp[d];
        int seen = 0;
        for (int k = 0; k < n_next; k++) seen |= next[k] == cp;
        if (!seen) next[n_next++] = cp;
    }
    if (!terminal) {
        buf_puts(&b, "\"\\\"\"");
        alts++;
    }
    struct key_name *group = xmalloc((size_t)n * sizeof *group);
    for (int k = 0; k < n_next; k++) {
        int g = 0;
        for (int i = 0; i < n; i++)
            if (names[i].len > d && names[i].cp[d] == next[k]) group[g++] = names[i];
        char u[4];
        size_t ul = utf8_encode(next[k], u);
        buf_clear(&t);
        js_canon_string(&t, u, ul);
        if (alts++) buf_puts(&b, " | ");
        ebnf_put_lit(&b, t.data + 1, t.len - 2);
        buf_push(&b, ' ');
        js_put_rule_ref(&b, put_key_trie(c, group, g, d + 1));
    }
    if (alts++) buf_puts(&b, " | ");
    regex_put_json_char_except(&b, next, n_next);
    buf_puts(&b, " char* \"\\\"\"");
    c->used |= JSC_CHAR;
    js_add_rule(c, rule, b.data, b.len);
    free(group);
    free(next);
    buf_free(&b);
    buf_free(&t);
    return rule;
}

/* A JSON string (quotes included) that is none of the keys of `names`
 * (a set of strings as a JSON object's keys or array). */
static void put_key_except(struct js_ctx *c, const char *const *keys, int n, struct buf *out) {
    if (n == 0) {
        c->used |= JSC_STRING;
        buf_puts(out, "string");
        return;
    }
    struct key_name *names = xcalloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(keys[i]);
        names[i].cp = xmalloc((len + 1) * sizeof(uint32_t));
        for (size_t j = 0; j < len;) j += utf8_decode(keys[i] + j, &names[i].cp[names[i].len++]);
    }
    buf_puts(out, "\"\\\"\" ");
    js_put_rule_ref(out, put_key_trie(c, names, n, 0));
    for (int i = 0; i < n; i++) free(names[i].cp);
    free(names);
}

/* ---- objects ---- */

struct prop {
    const char *name;
    struct buf expr;
    int required;
};

static int name_in(const json_t *arr, const char *name) {
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(json_string_value(json_array_get(arr, i)), name)) return 1;
    return 0;
}

int js_gen_object(struct js_ctx *c, const json_t *s, struct buf *out) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return kiln_errorf(c->err, "json_schema: 'properties' at %s must be an object", js_where(c));
    if (req) {
        if (!json_is_array(req))
            return kiln_errorf(c->err, "json_schema: 'required' at %s must be an array of strings", js_where(c));
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_is_string(json_array_get(req, i)))
                return kiln_errorf(c->err, "json_schema: 'required' at %s must be an array of strings", js_where(c));
    }
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return kiln_errorf(c->err, "json_schema: 'additionalProperties' at %s must be a schema", js_where(c));
    size_t cap = json_object_size(props) + json_array_size(req);
    struct prop *p = xcalloc(cap + 1, sizeof *p);
    const char **names = xcalloc(cap + 1, sizeof *names);
    int n = 0, n_names = 0, r = JS_OK;
    struct buf extra = {0}, key = {0}, body = {0};
    const char *w = js_w(c);

    /* extra keys: none, any value, or values of a schema */
    int extra_ok = 1;
    c->depth++;
    if (!addl) {
        extra_ok = !c->strict;
        if (extra_ok) {
            c->used |= JSC_VALUE;
            buf_puts(&extra, "value");
        }
    } else {
        r = js_gen_child(c, addl, "additionalProperties", NULL, -1, &extra);
        if (r == JS_NEVER) extra_ok = 0, r = JS_OK;
    }
    const char *name;
    json_t *sub;
    if (r == JS_OK) json_object_foreach((json_t *)props, name, sub) {
        names[n_names++] = name;
        struct prop *q = &p[n];
        q->name = name;
        q->required = c->strict || name_in(req, name);
        r = js_gen_child(c, sub, "properties", name, -1, &q->expr);
        if (r == JS_ERR) break;
        if (r == JS_NEVER) {
            buf_free(&q->expr);
            r = q->required ? JS_NEVER : JS_OK;
            if (r == JS_NEVER) break;
            continue;
        }
        n++;
    }
    c->depth--;
    /* required names "properties" does not list: extra keys that must be there */
    for (size_t i = 0; r == JS_OK && i < json_array_size(req); i++) {
        const char *rn = json_string_value(json_array_get(req, i));
        if (json_object_get(props, rn)) continue;
        int dup = 0;
        for (int k = 0; k < n_names; k++) dup |= !strcmp(names[k], rn);
        if (dup) continue;
        if (!extra_ok) {
            r = JS_NEVER;
            break;
        }
        names[n_names++] = rn;
        p[n].name = rn;
        p[n].required = 1;
        buf_append(&p[n].expr, extra.data, extra.len);
        n++;
    }
    if (r != JS_OK) goto done;
    if (extra_ok) {
        put_key_except(c, names, n_names, &key);
        buf_printf(&key, "%s\":\"%s", w, w);
        buf_append(&key, extra.data, extra.len);
    }
    /* the chain, from the end: S[i] and R[i] rules (-1: empty) */
    int *S = xmalloc((size_t)(n + 1) * sizeof *S), *R = xmalloc((size_t)(n + 1) * sizeof *R);
    S[n] = R[n] = -1;
    if (extra_ok) {
        R[n] = js_new_rule(c);
        buf_clear(&body);
        buf_printf(&body, "(%s\",\"%s%s)*", w, w, key.data);
        js_add_rule(c, R[n], body.data, body.len);
        S[n] = js_new_rule(c);
        buf_clear(&body);
        buf_printf(&body, "(%s ", key.data);
        js_put_rule_ref(&body, R[n]);
        buf_puts(&body, ")?");
        js_add_rule(c, S[n], body.data, body.len);
    }
    for (int i = n - 1; i >= 0; i--) {
        struct buf kv = {0}, nm = {0};
        js_canon_string(&nm, p[i].name, strlen(p[i].name));
        ebnf_put_lit(&kv, nm.data, nm.len);
        buf_free(&nm);
        buf_printf(&kv, "%s\":\"%s", w, w);
        buf_append(&kv, p[i].expr.data, p[i].expr.len);
        /* R[i] (R[0] would follow nothing: never used) */
        R[i] = -1;
        if (i > 0) R[i] = js_new_rule(c);
        buf_clear(&body);
        buf_printf(&body, "%s%s\",\"%s%s%s", p[i].required ? "" : "(", w, w, kv.data, p[i].required ? "" : ")?");
        if (R[i + 1] >= 0) {
            buf_push(&body, ' ');
            js_put_rule_ref(&body, R[i + 1]);
        }
        if (i > 0) js_add_rule(c, R[i], body.data, body.len);
        /* S[i] */
        S[i] = js_new_rule(c);
        buf_clear(&body);
        int wrap = !p[i].required && S[i + 1] < 0;
        buf_printf(&body, "%s%s", wrap ? "(" : "", kv.data);
        if (R[i + 1] >= 0) {
            buf_push(&body, ' ');
            js_put_rule_ref(&body, R[i + 1]);
        }
        if (wrap) buf_puts(&body, ")?");
        else if (!p[i].required) {
            buf_puts(&body, " | ");
            js_put_rule_ref(&body, S[i + 1]);
        }
        js_add_rule(c, S[i], body.data, body.len);
        buf_free(&kv);
    }
    buf_printf(out, "\"{\"%s", w);
    if (S[0] >= 0) {
        js_put_rule_ref(out, S[0]);
        buf_puts(out, w);
    }
    buf_puts(out, "\"}\"");
    free(S);
    free(R);
done:
    for (size_t i = 0; i <= cap; i++) buf_free(&p[i].expr);
    free(p);
    free(names);
    buf_free(&extra);
    buf_free(&key);
    buf_free(&body);
    return r;
}

/* ---- arrays ---- */

static int get_items_count(struct js_ctx *c, const json_t *s, const char *key, long *v) {
    const json_t *x = json_object_get(s, key);
    *v = -1;
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return kiln_errorf(c->err, "json_schema: '%s' at %s must be a non-negative integer", key, js_where(c));
    if (json_integer_value(x) > JS_MAX_ITEMS)
        return kiln_errorc(c->err, KILN_ERR_TOO_LARGE, "json_schema: '%s' at %s is above %d", key, js_where(c),
                           JS_MAX_ITEMS);
    *v = (long)json_integer_value(x);
    return 0;
}

static void put_quant(struct buf *out, long lo, long hi) {
    if (lo == 0 && hi < 0) buf_push(out, '*');
    else if (lo == 1 && hi < 0) buf_push(out, '+');
    else if (lo == 0 && hi == 1) buf_push(out, '?');
    else if (hi < 0) buf_printf(out, "{%ld,}", lo);
    else if (lo == hi) buf_printf(out, "{%ld}", lo);
    else buf_printf(out, "{%ld,%ld}", lo, hi);
}

int js_gen_array(struct js_ctx *c, const json_t *s, struct buf *out) {
    long mn, mx;
    if (get_items_count(c, s, "minItems", &mn) || get_items_count(c, s, "maxItems", &mx)) return JS_ERR;
    if (mn < 0) mn = 0;
    const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items"), *rest;
    const char *prefix_key = "prefixItems", *rest_key = "items";
    if (prefix && !json_is_array(prefix))
        return kiln_errorf(c->err, "json_schema: 'prefixItems' at %s must be an array", js_where(c));
    if (prefix && json_is_array(items))
        return kiln_errorf(c->err, "json_schema: 'items' at %s must be a schema next to 'prefixItems'", js_where(c));
    if (prefix) {
        rest = items;
    } else if (json_is_array(items)) { /* draft-07's tuple form */
        prefix = items, prefix_key = "items";
        rest = json_object_get(s, "additionalItems"), rest_key = "additionalItems";
    } else {
        rest = items;
    }
    long k = (long)json_array_size(prefix);
    struct buf *pe = xcalloc((size_t)k + 1, sizeof *pe);
    struct buf re = {0}, body = {0};
    int r = JS_OK;
    const char *w = js_w(c);
    c->depth++;
    for (long i = 0; i < k; i++) {
        r = js_gen_child(c, json_array_get(prefix, (size_t)i), prefix_key, NULL, i, &pe[i]);
        if (r == JS_ERR) break;
        if (r == JS_NEVER) { /* nothing can stand at i: the array ends before it */
            k = i;
            if (mx < 0 || mx > i) mx = i;
            r = JS_OK;
            break;
        }
    }
    int rest_ok = 1;
    if (r == JS_OK) {
        if (!rest) {
            c->used |= JSC_VALUE;
            buf_puts(&re, "value");
        } else {
            r = js_gen_child(c, rest, rest_key, NULL, -1, &re);
            if (r == JS_NEVER) rest_ok = 0, r = JS_OK;
        }
    }
    c->depth--;
    if (r != JS_OK) goto done;
    if (!rest_ok && (mx < 0 || mx > k)) mx = k;
    if (mx >= 0 && mn > mx) {
        r = JS_NEVER;
        goto done;
    }
    if (mx == 0) {
        buf_printf(out, "\"[\"%s\"]\"", w);
        goto done;
    }
    /* T[i]: what follows the first i items (i >= 1); -1 when nothing */
    long last = k < 1 ? 1 : k; /* T[last] is the repetition of the rest */
    int *T = xmalloc((size_t)(last + 2) * sizeof *T);
    for (long i = last; i >= 1; i--) {
        T[i] = -1;
        if (mx >= 0 && i >= mx) continue;
        buf_clear(&body);
        if (i >= k) {
            long lo = mn > i ? mn - i : 0, hi = mx < 0 ? -1 : mx - i;
            buf_printf(&body, "(%s\",\"%s%s)", w, w, re.data);
            put_quant(&body, lo, hi);
        } else {
            int opt = i >= mn;
            buf_printf(&body, "%s%s\",\"%s%s", opt ? "(" : "", w, w, pe[i].data);
            if (i + 1 <= last && T[i + 1] >= 0) {
                buf_push(&body, ' ');
                js_put_rule_ref(&body, T[i + 1]);
            }
            if (opt) buf_puts(&body, ")?");
        }
        T[i] = js_new_rule(c);
        js_add_rule(c, T[i], body.data, body.len);
    }
    int rule = js_new_rule(c);
    buf_clear(&body);
    buf_printf(&body, "\"[\"%s%s", w, mn == 0 ? "(" : "");
    buf_append(&body, k > 0 ? pe[0].data : re.data, k > 0 ? pe[0].len : re.len);
    if (T[1] >= 0) {
        buf_push(&body, ' ');
        js_put_rule_ref(&body, T[1]);
    }
    buf_printf(&body, "%s%s\"]\"", mn == 0 ? ")?" : "", w);
    js_add_rule(c, rule, body.data, body.len);
    js_put_rule_ref(out, rule);
    free(T);
done:
    for (long i = 0; i < (long)json_array_size(prefix); i++) buf_free(&pe[i]);
    free(pe);
    buf_free(&re);
    buf_free(&body);
    return r;
}
