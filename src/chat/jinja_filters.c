/* jinja_filters.c — jinja2's built-in filters and tests (the ones chat
 * templates use), with transformers' tojson. Each follows the jinja2 3.1
 * implementation's argument names and defaults. Tests are in jinja_tests.c. */
#include "chat/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/error.h"
#include "base/mem.h"


typedef int (*filter_fn)(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out);

static struct jv soft_str(const struct jv *v) { return jv_to_str(*v); }

static int no_args(struct jctx *ctx, struct jargs *a, const char *name) { return jargs_check(ctx, a, 0, name); }

/* ------------------------------------------------------ attribute paths */

/* jinja2's make_attrgetter: "a.b.0" walks getitem per dotted part. */
static int attr_get(struct jctx *ctx, const struct jv *item, const struct jv *attr, const struct jv *def, struct jv *out) {
    if (attr->type == JV_INT) return jinja_getitem(ctx, item, attr, out);
    if (attr->type != JV_STR) return jctx_fail(ctx, "attribute must be a string or integer");
    struct jv cur = jv_retain(*item);
    const char *p = attr->u.s->data, *end = p + attr->u.s->len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t len = dot ? (size_t)(dot - p) : (size_t)(end - p);
        struct jv key;
        int digits = len > 0;
        for (size_t i = 0; i < len; i++)
            if (p[i] < '0' || p[i] > '9') digits = 0;
        key = digits && len < 18 ? jv_int(strtoll(p, NULL, 10)) : jv_str(p, len);
        struct jv next;
        int rc = jinja_getitem(ctx, &cur, &key, &next);
        jv_release(key);
        jv_release(cur);
        if (rc) return -1;
        cur = next;
        if (!dot) break;
        p = dot + 1;
    }
    if (def && cur.type == JV_UNDEFINED) {
        jv_release(cur);
        cur = jv_retain(*def);
    }
    *out = cur;
    return 0;
}

static struct jv ignore_case(struct jv take) {
    if (take.type != JV_STR) return take;
    struct jv l = jstr_upper_lower(take, 0);
    jv_release(take);
    return l;
}

/* ----------------------------------------------------------- the filters */

static int f_length(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "length")) return -1;
    switch (v->type) {
    case JV_STR: *out = jv_int((int64_t)utf8_count(v->u.s->data, v->u.s->len)); return 0;
    case JV_LIST:
    case JV_TUPLE: *out = jv_int((int64_t)v->u.l->n); return 0;
    case JV_DICT: *out = jv_int((int64_t)v->u.d->n); return 0;
    case JV_UNDEFINED: *out = jv_int(0); return 0;
    case JV_LOOP: *out = jv_int((int64_t)v->u.loop->items.u.l->n); return 0;
    default: return jctx_fail(ctx, "object of type '%s' has no len()", jv_type_name(*v));
    }
}

static int f_string(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "string")) return -1;
    *out = soft_str(v);
    return 0;
}

static int f_trim(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *chars = jargs_get(a, 0, "chars");
    if (jargs_check(ctx, a, 1, "trim")) return -1;
    if (chars && chars->type == JV_NONE) chars = NULL;
    if (chars && chars->type != JV_STR) return jctx_fail(ctx, "trim: chars must be a string");
    struct jv s = soft_str(v);
    *out = jstr_strip(s, chars, 1, 1);
    jv_release(s);
    return 0;
}

static int f_case(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out, int mode) {
    if (no_args(ctx, a, "upper/lower")) return -1;
    struct jv s = soft_str(v);
    if (mode == 2) {
        *out = jstr_capitalize(s);
    } else if (mode == 3) {
        /* jinja2's title: a word starts after [-\s({[<]; its first char is upper-cased, the rest lower-cased */
        struct buf b = {0};
        int start = 1;
        for (size_t i = 0; i < s.u.s->len;) {
            uint32_t cp;
            i += utf8_decode_lossy(s.u.s->data + i, s.u.s->len - i, &cp);
            int delim = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            buf_push_cp(&b, delim ? cp : (uint32_t)(start ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
            start = delim;
        }
        *out = jv_take_buf(&b);
    } else {
        *out = jstr_upper_lower(s, mode);
    }
    jv_release(s);
    return 0;
}
static int f_upper(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_case(c, v, a, o, 1); }
static int f_lower(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_case(c, v, a, o, 0); }
static int f_capitalize(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_case(c, v, a, o, 2); }
static int f_title(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_case(c, v, a, o, 3); }

static int f_replace(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *old = jargs_get(a, 0, "old"), *rep = jargs_get(a, 1, "new"), *cnt = jargs_get(a, 2, "count");
    if (jargs_check(ctx, a, 3, "replace")) return -1;
    if (!old || !rep) return jctx_fail(ctx, "replace needs old and new");
    struct jv s = soft_str(v), o = soft_str(old), r = soft_str(rep);
    int64_t count = cnt && cnt->type == JV_INT ? cnt->u.i : -1;
    *out = jstr_replace(ctx, s, o, r, count);
    jv_release(s);
    jv_release(o);
    jv_release(r);
    return out->type == JV_UNDEFINED ? -1 : 0;
}

static int f_join(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *d = jargs_get(a, 0, "d"), *attr = jargs_get(a, 1, "attribute");
    if (jargs_check(ctx, a, 2, "join")) return -1;
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    struct jv sep = d ? soft_str(d) : jv_cstr("");
    struct buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < items.u.l->n && !rc; i++) {
        if (i) buf_append(&b, sep.u.s->data, sep.u.s->len);
        struct jv x;
        if (attr) {
            if (attr_get(ctx, &items.u.l->items[i], attr, NULL, &x)) {
                rc = -1;
                break;
            }
        } else {
            x = jv_retain(items.u.l->items[i]);
        }
        jv_write_str(&b, x);
        jv_release(x);
        rc = jctx_check_len(ctx, b.len);
    }
    jv_release(sep);
    jv_release(items);
    if (rc) {
        buf_free(&b);
        return -1;
    }
    *out = jv_take_buf(&b);
    return jctx_step(ctx, out->u.s->len);
}

static int f_default(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *d = jargs_get(a, 0, "default_value"), *boolean = jargs_get(a, 1, "boolean");
    if (jargs_check(ctx, a, 2, "default")) return -1;
    int use_default = v->type == JV_UNDEFINED || (boolean && jv_truthy(*boolean) && !jv_truthy(*v));
    *out = use_default ? (d ? jv_retain(*d) : jv_cstr("")) : jv_retain(*v);
    return 0;
}

static int f_first_last(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out, int last) {
    if (no_args(ctx, a, last ? "last" : "first")) return -1;
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t n = items.u.l->n;
    *out = n ? jv_retain(items.u.l->items[last ? n - 1 : 0])
             : jv_undef_named(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    jv_release(items);
    return 0;
}
static int f_first(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_first_last(c, v, a, o, 0); }
static int f_last(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return f_first_last(c, v, a, o, 1); }

static int f_list(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "list")) return -1;
    return jinja_iterate(ctx, v, out);
}

static int parse_number(const char *s, int base, int64_t *i, double *f, int *is_int) {
    struct jv t = jv_cstr(s), st = jstr_strip(t, NULL, 1, 1);
    jv_release(t);
    char *clean = xmalloc(st.u.s->len + 1);
    size_t k = 0;
    for (size_t j = 0; j < st.u.s->len; j++)
        if (st.u.s->data[j] != '_') clean[k++] = st.u.s->data[j];
    clean[k] = 0;
    jv_release(st);
    char *end;
    int ok = 0;
    if (k) {
        long long v = strtoll(clean, &end, base);
        if (*end == 0) {
            *i = v;
            *is_int = 1;
            ok = 1;
        } else if (!strpbrk(clean, "xXpP")) { /* Python's float() reads no hex */
            double d = strtod(clean, &end);
            if (*end == 0) {
                *f = d;
                *is_int = 0;
                ok = 1;
            }
        }
    }
    free(clean);
    return ok;
}

static int f_int(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *d = jargs_get(a, 0, "default"), *basev = jargs_get(a, 1, "base");
    if (jargs_check(ctx, a, 2, "int")) return -1;
    int base = basev && basev->type == JV_INT ? (int)basev->u.i : 10;
    if (base < 2 || base > 36) base = 10;
    switch (v->type) {
    case JV_INT: *out = jv_retain(*v); return 0;
    case JV_BOOL: *out = jv_int(v->u.b); return 0;
    case JV_FLOAT:
        if (isfinite(v->u.f) && fabs(v->u.f) < 9.2e18) {
            *out = jv_int((int64_t)v->u.f);
            return 0;
        }
        break;
    case JV_STR: {
        int64_t i;
        double f;
        int is_int;
        if (parse_number(v->u.s->data, base, &i, &f, &is_int)) {
            if (is_int) {
                *out = jv_int(i);
                return 0;
            }
            if (isfinite(f) && fabs(f) < 9.2e18) {
                *out = jv_int((int64_t)f);
                return 0;
            }
        }
        break;
    }
    case JV_UNDEFINED: return jinja_undefined_error(ctx, v);
    default: break;
    }
    *out = d ? jv_retain(*d) : jv_int(0);
    return 0;
}

static int f_float(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *d = jargs_get(a, 0, "default");
    if (jargs_check(ctx, a, 1, "float")) return -1;
    if (jv_is_number(*v)) {
        *out = jv_float(jv_as_double(*v));
        return 0;
    }
    if (v->type == JV_UNDEFINED) return jinja_undefined_error(ctx, v);
    if (v->type == JV_STR) {
        int64_t i;
        double f;
        int is_int;
        if (parse_number(v->u.s->data, 10, &i, &f, &is_int)) {
            *out = jv_float(is_int ? (double)i : f);
            return 0;
        }
    }
    *out = d ? jv_retain(*d) : jv_float(0.0);
    return 0;
}

static int f_abs(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "abs")) return -1;
    if (v->type == JV_INT && v->u.i != INT64_MIN) *out = jv_int(v->u.i < 0 ? -v->u.i : v->u.i);
    else if (v->type == JV_BOOL) *out = jv_int(v->u.b);
    else if (v->type == JV_FLOAT) *out = jv_float(fabs(v->u.f));
    else if (v->type == JV_UNDEFINED) return jinja_undefined_error(ctx, v);
    else return jctx_fail(ctx, "bad operand type for abs(): '%s'", jv_type_name(*v));
    return 0;
}

static int f_round(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *precv = jargs_get(a, 0, "precision"), *methv = jargs_get(a, 1, "method");
    if (jargs_check(ctx, a, 2, "round")) return -1;
    int64_t prec = precv && (precv->type == JV_INT) ? precv->u.i : 0;
    const char *method = methv && methv->type == JV_STR ? methv->u.s->data : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jctx_fail(ctx, "method must be common, ceil or floor");
    if (!jv_is_number(*v)) {
        if (v->type == JV_UNDEFINED) return jinja_undefined_error(ctx, v);
        return jctx_fail(ctx, "type %s doesn't define __round__ method", jv_type_name(*v));
    }
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = jv_as_double(*v);
    if (!strcmp(method, "common")) {
        if (v->type != JV_FLOAT) {
            *out = v->type == JV_BOOL ? jv_int(v->u.b) : jv_retain(*v); /* round(int, n>=0) keeps the int */
            if (prec < 0) {
                double p = pow(10, (double)-prec);
                *out = jv_int((int64_t)(nearbyint(x / p) * p));
            }
            return 0;
        }
        if (!isfinite(x)) {
            *out = jv_float(x);
            return 0;
        }
        if (prec >= 0 && prec < 60) {
            /* printf rounds the exact binary value half-to-even, as Python's round does */
            char buf[512];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = jv_float(strtod(buf, NULL));
        } else {
            double p = pow(10, (double)prec);
            *out = jv_float(nearbyint(x * p) / p);
        }
        return 0;
    }
    double p = pow(10, (double)prec);
    *out = jv_float((method[0] == 'c' ? ceil(x * p) : floor(x * p)) / p);
    return 0;
}

static int f_tojson(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *ea = jargs_get(a, 0, "ensure_ascii"), *ind = jargs_get(a, 1, "indent"),
                    *seps = jargs_get(a, 2, "separators"), *sk = jargs_get(a, 3, "sort_keys");
    if (jargs_check(ctx, a, 4, "tojson")) return -1;
    char spaces[64];
    struct jdump_opts o = {.item_sep = ", ", .key_sep = ": ", .ensure_ascii = ea && jv_truthy(*ea),
                           .sort_keys = sk && jv_truthy(*sk)};
    if (ind && ind->type != JV_NONE) {
        if (ind->type == JV_INT || ind->type == JV_BOOL) {
            int64_t n = ind->type == JV_INT ? ind->u.i : ind->u.b;
            if (n < 0) n = 0;
            if (n > 32) n = 32;
            memset(spaces, ' ', (size_t)n);
            spaces[n] = 0;
            o.indent = spaces;
        } else if (ind->type == JV_STR) {
            o.indent = ind->u.s->data;
        } else {
            return jctx_fail(ctx, "tojson: indent must be an integer or a string");
        }
        o.item_sep = ",";
    }
    if (seps && seps->type != JV_NONE) {
        if (!jv_is_list(*seps) || seps->u.l->n != 2 || seps->u.l->items[0].type != JV_STR ||
            seps->u.l->items[1].type != JV_STR)
            return jctx_fail(ctx, "tojson: separators must be a pair of strings");
        o.item_sep = seps->u.l->items[0].u.s->data;
        o.key_sep = seps->u.l->items[1].u.s->data;
    }
    struct buf b = {0};
    if (jv_dump_json(ctx, &b, *v, &o, 0) || jctx_check_len(ctx, b.len)) {
        buf_free(&b);
        return -1;
    }
    *out = jv_take_buf(&b);
    return jctx_step(ctx, out->u.s->len);
}

static int f_safe(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "safe")) return -1;
    *out = soft_str(v);
    return 0;
}

static int f_escape(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "escape")) return -1;
    struct jv s = soft_str(v);
    struct buf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->data[i];
        switch (c) {
        case '&': buf_puts(&b, "&amp;"); break;
        case '<': buf_puts(&b, "&lt;"); break;
        case '>': buf_puts(&b, "&gt;"); break;
        case '"': buf_puts(&b, "&#34;"); break;
        case '\'': buf_puts(&b, "&#39;"); break;
        default: buf_push(&b, c);
        }
    }
    jv_release(s);
    *out = jv_take_buf(&b);
    return 0;
}

static int f_items(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "items")) return -1;
    if (v->type == JV_UNDEFINED) {
        *out = jv_list_new(0);
        return 0;
    }
    if (!jv_is_dict(*v)) return jctx_fail(ctx, "Can only get item pairs from a mapping.");
    struct jv l = jv_list_new(v->u.d->n);
    for (size_t i = 0; i < v->u.d->n; i++) {
        struct jv t = jv_list_new(2);
        jv_list_push(t, jv_retain(v->u.d->keys[i]));
        jv_list_push(t, jv_retain(v->u.d->vals[i]));
        t.type = JV_TUPLE;
        jv_list_push(l, t);
    }
    *out = l;
    return 0;
}

static int f_map(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    struct jv items;
    if (!jv_truthy(*v)) { /* jinja2 yields nothing for a falsy input, iterable or not */
        *out = jv_list_new(0);
        return 0;
    }
    if (jinja_iterate(ctx, v, &items)) return -1;
    struct jv res = jv_list_new(items.u.l->n);
    int rc = 0;
    if (a->npos == 0) {
        const struct jv *attr = jargs_get(a, (size_t)-1, "attribute"), *def = jargs_get(a, (size_t)-1, "default");
        if (!attr) rc = jctx_fail(ctx, "map requires a filter argument");
        if (!rc) rc = jargs_check(ctx, a, 0, "map");
        for (size_t i = 0; i < items.u.l->n && !rc; i++) {
            struct jv x;
            rc = attr_get(ctx, &items.u.l->items[i], attr, def, &x);
            if (!rc) jv_list_push(res, x);
        }
    } else {
        if (a->pos[0].type != JV_STR) rc = jctx_fail(ctx, "map: filter name must be a string");
        struct jargs rest = {.pos = a->pos + 1, .npos = a->npos - 1, .kwnames = a->kwnames, .kw = a->kw, .nkw = a->nkw};
        for (size_t i = 0; i < items.u.l->n && !rc; i++) {
            struct jv x;
            rest.kw_used = 0;
            rc = jinja_filter_apply(ctx, a->pos[0].u.s->data, &items.u.l->items[i], &rest, &x);
            if (!rc) jv_list_push(res, x);
        }
    }
    jv_release(items);
    if (rc) {
        jv_release(res);
        return -1;
    }
    *out = res;
    return 0;
}

/* select/reject/selectattr/rejectattr */
static int select_common(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out, int keep, int by_attr) {
    struct jv items;
    if (!jv_truthy(*v)) {
        *out = jv_list_new(0);
        return 0;
    }
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t off = by_attr ? 1 : 0;
    if (by_attr && a->npos < 1) {
        jv_release(items);
        return jctx_fail(ctx, "Missing parameter for attribute name");
    }
    const char *test = a->npos > off ? (a->pos[off].type == JV_STR ? a->pos[off].u.s->data : NULL) : NULL;
    if (a->npos > off && !test) {
        jv_release(items);
        return jctx_fail(ctx, "test name must be a string");
    }
    struct jargs rest = {.pos = a->npos > off ? a->pos + off + 1 : NULL, .npos = a->npos > off ? a->npos - off - 1 : 0,
                         .kwnames = a->kwnames, .kw = a->kw, .nkw = a->nkw};
    struct jv res = jv_list_new(0);
    int rc = 0;
    for (size_t i = 0; i < items.u.l->n && !rc; i++) {
        struct jv x;
        if (by_attr)
            rc = attr_get(ctx, &items.u.l->items[i], &a->pos[0], NULL, &x);
        else
            x = jv_retain(items.u.l->items[i]);
        if (rc) break;
        int r = 0;
        if (test) {
            rest.kw_used = 0;
            rc = jinja_test_apply(ctx, test, &x, &rest, &r);
        } else {
            r = jv_truthy(x);
        }
        jv_release(x);
        if (!rc && r == keep) jv_list_push(res, jv_retain(items.u.l->items[i]));
    }
    jv_release(items);
    if (rc) {
        jv_release(res);
        return -1;
    }
    *out = res;
    return 0;
}
static int f_select(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return select_common(c, v, a, o, 1, 0); }
static int f_reject(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return select_common(c, v, a, o, 0, 0); }
static int f_selectattr(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return select_common(c, v, a, o, 1, 1); }
static int f_rejectattr(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return select_common(c, v, a, o, 0, 1); }

/* Stable merge sort of items by precomputed keys; fails on unorderable keys. */
static int sort_by_keys(struct jctx *ctx, struct jv *items, struct jv *keys, size_t n, int reverse) {
    size_t *idx = xmalloc((n ? n : 1) * sizeof *idx), *tmp = xmalloc((n ? n : 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    int bad = 0;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                /* jinja2 sorts by one-item lists, so equal keys (even two Undefined) tie */
                int c = jv_equal(keys[idx[j]], keys[idx[i]]) ? 0 : jv_compare(keys[idx[j]], keys[idx[i]]);
                if (c == 2) bad = 1;
                int take_right = reverse ? (c == 1) : (c == -1);
                tmp[k++] = take_right ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
    if (!bad) {
        struct jv *copy = xmalloc((n ? n : 1) * sizeof *copy);
        for (size_t i = 0; i < n; i++) copy[i] = items[idx[i]];
        if (n) memcpy(items, copy, n * sizeof *copy);
        free(copy);
    }
    free(idx);
    free(tmp);
    if (bad) return jctx_fail(ctx, "'<' not supported between these values");
    return jctx_step(ctx, n * 8);
}

static int keyed(struct jctx *ctx, struct jv items, const struct jv *attr, int case_sensitive, struct jv **keys_out) {
    size_t n = items.u.l->n;
    struct jv *keys = xcalloc(n ? n : 1, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        struct jv k;
        if (attr) {
            if (attr_get(ctx, &items.u.l->items[i], attr, NULL, &k)) {
                for (size_t j = 0; j < i; j++) jv_release(keys[j]);
                free(keys);
                return -1;
            }
        } else {
            k = jv_retain(items.u.l->items[i]);
        }
        keys[i] = case_sensitive ? k : ignore_case(k);
    }
    *keys_out = keys;
    return 0;
}

static void free_keys(struct jv *keys, size_t n) {
    for (size_t i = 0; i < n; i++) jv_release(keys[i]);
    free(keys);
}

static int f_sort(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *rev = jargs_get(a, 0, "reverse"), *cs = jargs_get(a, 1, "case_sensitive"),
                    *attr = jargs_get(a, 2, "attribute");
    if (jargs_check(ctx, a, 3, "sort")) return -1;
    struct jv items, *keys;
    if (jinja_iterate(ctx, v, &items)) return -1;
    if (keyed(ctx, items, attr, cs && jv_truthy(*cs), &keys)) {
        jv_release(items);
        return -1;
    }
    int rc = sort_by_keys(ctx, items.u.l->items, keys, items.u.l->n, rev && jv_truthy(*rev));
    free_keys(keys, items.u.l->n);
    if (rc) {
        jv_release(items);
        return -1;
    }
    *out = items;
    return 0;
}

static int f_dictsort(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *cs = jargs_get(a, 0, "case_sensitive"), *by = jargs_get(a, 1, "by"), *rev = jargs_get(a, 2, "reverse");
    if (jargs_check(ctx, a, 3, "dictsort")) return -1;
    int pos = 0;
    if (by && by->type == JV_STR) {
        if (!strcmp(by->u.s->data, "value")) pos = 1;
        else if (strcmp(by->u.s->data, "key")) return jctx_fail(ctx, "You can only sort by either \"key\" or \"value\"");
    }
    struct jv items;
    struct jargs none = {0};
    if (f_items(ctx, v, &none, &items)) return -1;
    size_t n = items.u.l->n;
    struct jv *keys = xcalloc(n ? n : 1, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        struct jv k = jv_retain(items.u.l->items[i].u.l->items[pos]);
        keys[i] = cs && jv_truthy(*cs) ? k : ignore_case(k);
    }
    int rc = sort_by_keys(ctx, items.u.l->items, keys, n, rev && jv_truthy(*rev));
    free_keys(keys, n);
    if (rc) {
        jv_release(items);
        return -1;
    }
    *out = items;
    return 0;
}

static int f_unique(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *cs = jargs_get(a, 0, "case_sensitive"), *attr = jargs_get(a, 1, "attribute");
    if (jargs_check(ctx, a, 2, "unique")) return -1;
    struct jv items, *keys;
    if (jinja_iterate(ctx, v, &items)) return -1;
    if (keyed(ctx, items, attr, cs && jv_truthy(*cs), &keys)) {
        jv_release(items);
        return -1;
    }
    size_t n = items.u.l->n;
    if (jctx_step(ctx, n * n / 8)) { /* quadratic: charge before doing it */
        free_keys(keys, n);
        jv_release(items);
        return -1;
    }
    struct jv res = jv_list_new(0);
    for (size_t i = 0; i < n; i++) {
        size_t j;
        for (j = 0; j < i; j++)
            if (jv_equal(keys[j], keys[i])) break;
        if (j == i) jv_list_push(res, jv_retain(items.u.l->items[i]));
    }
    free_keys(keys, n);
    jv_release(items);
    *out = res;
    return 0;
}

static int min_max(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out, int want_max) {
    const struct jv *cs = jargs_get(a, 0, "case_sensitive"), *attr = jargs_get(a, 1, "attribute");
    if (jargs_check(ctx, a, 2, want_max ? "max" : "min")) return -1;
    struct jv items, *keys;
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t n = items.u.l->n;
    if (n == 0) {
        jv_release(items);
        *out = jv_undef_named("No aggregated item, sequence was empty.");
        return 0;
    }
    if (keyed(ctx, items, attr, cs && jv_truthy(*cs), &keys)) {
        jv_release(items);
        return -1;
    }
    size_t best = 0;
    int rc = 0;
    for (size_t i = 1; i < n; i++) {
        int c = jv_compare(keys[i], keys[best]);
        if (c == 2) {
            rc = jctx_fail(ctx, "'<' not supported between instances of '%s' and '%s'", jv_type_name(keys[i]),
                           jv_type_name(keys[best]));
            break;
        }
        if ((want_max && c == 1) || (!want_max && c == -1)) best = i;
    }
    if (!rc) *out = jv_retain(items.u.l->items[best]);
    free_keys(keys, n);
    jv_release(items);
    return rc;
}
static int f_min(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return min_max(c, v, a, o, 0); }
static int f_max(struct jctx *c, const struct jv *v, struct jargs *a, struct jv *o) { return min_max(c, v, a, o, 1); }

static int f_sum(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *attr = jargs_get(a, 0, "attribute"), *start = jargs_get(a, 1, "start");
    if (jargs_check(ctx, a, 2, "sum")) return -1;
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    struct jv acc = start ? jv_retain(*start) : jv_int(0);
    int rc = 0;
    for (size_t i = 0; i < items.u.l->n && !rc; i++) {
        struct jv x, next;
        if (attr)
            rc = attr_get(ctx, &items.u.l->items[i], attr, NULL, &x);
        else
            x = jv_retain(items.u.l->items[i]);
        if (rc) break;
        if (x.type == JV_STR) rc = jctx_fail(ctx, "unsupported operand type(s) for +: 'int' and 'str'");
        if (!rc) rc = jinja_binop(ctx, JOP_ADD, &acc, &x, &next);
        jv_release(x);
        if (!rc) {
            jv_release(acc);
            acc = next;
        }
    }
    jv_release(items);
    if (rc) {
        jv_release(acc);
        return -1;
    }
    *out = acc;
    return 0;
}

static int f_reverse(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "reverse")) return -1;
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t n = items.u.l->n;
    for (size_t i = 0; i < n / 2; i++) {
        struct jv t = items.u.l->items[i];
        items.u.l->items[i] = items.u.l->items[n - 1 - i];
        items.u.l->items[n - 1 - i] = t;
    }
    if (v->type == JV_STR) {
        struct buf b = {0};
        for (size_t i = 0; i < n; i++) jv_write_str(&b, items.u.l->items[i]);
        jv_release(items);
        *out = jv_take_buf(&b);
        return 0;
    }
    *out = items;
    return 0;
}

static int f_indent(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *w = jargs_get(a, 0, "width"), *first = jargs_get(a, 1, "first"), *blank = jargs_get(a, 2, "blank");
    if (jargs_check(ctx, a, 3, "indent")) return -1;
    struct jv ind;
    if (w && w->type == JV_STR) {
        ind = jv_retain(*w);
    } else {
        int64_t n = w && w->type == JV_INT ? w->u.i : 4;
        if (n < 0) n = 0;
        if (n > 256) n = 256;
        char sp[257];
        memset(sp, ' ', (size_t)n);
        ind = jv_str(sp, (size_t)n);
    }
    struct jv s = soft_str(v);
    struct jv nl = jv_cstr("\n"), with_nl;
    jinja_binop(ctx, JOP_ADD, &s, &nl, &with_nl);
    jv_release(nl);
    jv_release(s);
    struct jargs none = {0};
    extern jfunc_fn jinja_str_method(const char *name);
    struct jv lines;
    if (with_nl.type != JV_STR || jinja_str_method("splitlines")(ctx, &with_nl, &none, &lines)) {
        jv_release(with_nl);
        jv_release(ind);
        return -1;
    }
    jv_release(with_nl);
    struct buf b = {0};
    int do_blank = blank && jv_truthy(*blank);
    if (first && jv_truthy(*first)) buf_append(&b, ind.u.s->data, ind.u.s->len);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        const struct jv *ln = &lines.u.l->items[i];
        if (i) {
            buf_push(&b, '\n');
            if (do_blank || ln->u.s->len) buf_append(&b, ind.u.s->data, ind.u.s->len);
        }
        buf_append(&b, ln->u.s->data, ln->u.s->len);
        if (jctx_check_len(ctx, b.len)) break;
    }
    jv_release(lines);
    jv_release(ind);
    if (jctx_check_len(ctx, b.len)) {
        buf_free(&b);
        return -1;
    }
    *out = jv_take_buf(&b);
    return jctx_step(ctx, out->u.s->len);
}

static int f_wordcount(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    if (no_args(ctx, a, "wordcount")) return -1;
    struct jv s = soft_str(v);
    int64_t count = 0;
    int in_word = 0;
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t cp;
        i += utf8_decode_lossy(s.u.s->data + i, s.u.s->len - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        int w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
        if (w && !in_word) count++;
        in_word = w;
    }
    jv_release(s);
    *out = jv_int(count);
    return 0;
}

static int f_batch(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *cnt = jargs_get(a, 0, "linecount"), *fill = jargs_get(a, 1, "fill_with");
    if (jargs_check(ctx, a, 2, "batch")) return -1;
    if (!cnt || cnt->type != JV_INT || cnt->u.i <= 0) return jctx_fail(ctx, "batch: linecount must be a positive integer");
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t per = (size_t)cnt->u.i, n = items.u.l->n;
    struct jv res = jv_list_new(0), cur = jv_undef();
    for (size_t i = 0; i < n; i++) {
        if (i % per == 0) {
            if (cur.type != JV_UNDEFINED) jv_list_push(res, cur);
            cur = jv_list_new(per < 64 ? per : 64);
        }
        jv_list_push(cur, jv_retain(items.u.l->items[i]));
    }
    if (cur.type != JV_UNDEFINED) {
        if (fill && fill->type != JV_NONE)
            while (cur.u.l->n < per) jv_list_push(cur, jv_retain(*fill));
        jv_list_push(res, cur);
    }
    jv_release(items);
    *out = res;
    return jctx_step(ctx, n + per);
}

static int f_center(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *w = jargs_get(a, 0, "width");
    if (jargs_check(ctx, a, 1, "center")) return -1;
    int64_t width = w && w->type == JV_INT ? w->u.i : 80;
    struct jv s = soft_str(v);
    int64_t len = (int64_t)utf8_count(s.u.s->data, s.u.s->len);
    if (width > (int64_t)ctx->lim.max_output) width = (int64_t)ctx->lim.max_output;
    if (width <= len) {
        *out = s;
        return 0;
    }
    int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
    struct buf b = {0};
    for (int64_t i = 0; i < left; i++) buf_push(&b, ' ');
    buf_append(&b, s.u.s->data, s.u.s->len);
    for (int64_t i = 0; i < pad - left; i++) buf_push(&b, ' ');
    jv_release(s);
    *out = jv_take_buf(&b);
    return jctx_step(ctx, (size_t)width);
}

static int f_attr(struct jctx *ctx, const struct jv *v, struct jargs *a, struct jv *out) {
    const struct jv *name = jargs_get(a, 0, "name");
    if (jargs_check(ctx, a, 1, "attr")) return -1;
    if (!name || name->type != JV_STR) return jctx_fail(ctx, "attr: name must be a string");
    return jinja_getattr(ctx, v, name->u.s->data, name->u.s->len, out);
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"abs", f_abs},         {"attr", f_attr},         {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},   {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},     {"first", f_first},
    {"float", f_float},     {"forceescape", f_escape}, {"indent", f_indent},    {"int", f_int},
    {"items", f_items},     {"join", f_join},         {"last", f_last},         {"length", f_length},
    {"list", f_list},       {"lower", f_lower},       {"map", f_map},           {"max", f_max},
    {"min", f_min},         {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round},       {"safe", f_safe},         {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort},   {"string", f_string},     {"sum", f_sum},
    {"title", f_title},     {"tojson", f_tojson},     {"trim", f_trim},         {"unique", f_unique},
    {"upper", f_upper},     {"wordcount", f_wordcount},
};

int jinja_filter_apply(struct jctx *ctx, const char *name, const struct jv *v, struct jargs *args, struct jv *out) {
    *out = jv_undef();
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) {
            int rc = filters[i].fn(ctx, v, args, out);
            if (rc) *out = jv_undef();
            return rc;
        }
    return jctx_fail(ctx, "No filter named '%s'.", name);
}

int jinja_filter_exists(const char *name) {
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) return 1;
    return 0;
}
