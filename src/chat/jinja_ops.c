/* jinja_ops.c — Python semantics of operators, attribute and item access,
 * iteration and calls, as jinja2's immutable sandbox exposes them: methods
 * come before dict keys on `.name`, keys before methods on `[name]`,
 * mutating methods (list.append, dict.update) are "unsafe" Undefined. */
#include "chat/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/mem.h"

/* ----------------------------------------------------------- iteration */

int jinja_iterate(struct jctx *ctx, const struct jv *v, struct jv *out) {
    switch (v->type) {
    case JV_LIST:
    case JV_TUPLE: {
        struct jv l = jv_list_new(v->u.l->n);
        for (size_t i = 0; i < v->u.l->n; i++) jv_list_push(l, jv_retain(v->u.l->items[i]));
        *out = l;
        return 0;
    }
    case JV_DICT: {
        struct jv l = jv_list_new(v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++) jv_list_push(l, jv_retain(v->u.d->keys[i]));
        *out = l;
        return 0;
    }
    case JV_STR: {
        const char *s = v->u.s->data;
        size_t n = v->u.s->len;
        struct jv l = jv_list_new(0);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = utf8_decode_lossy(s + i, n - i, &cp);
            jv_list_push(l, jv_str(s + i, k));
            i += k;
        }
        *out = l;
        return jctx_step(ctx, n);
    }
    case JV_UNDEFINED: *out = jv_list_new(0); return 0;
    default: *out = jv_undef(); return jctx_fail(ctx, "'%s' object is not iterable", jv_type_name(*v));
    }
}

int jinja_contains(struct jctx *ctx, const struct jv *c, const struct jv *item, int *result) {
    *result = 0;
    switch (c->type) {
    case JV_STR:
        if (item->type != JV_STR)
            return jctx_fail(ctx, "'in <string>' requires string as left operand, not %s", jv_type_name(*item));
        if (item->u.s->len == 0) {
            *result = 1;
            return 0;
        }
        *result = memmem(c->u.s->data, c->u.s->len, item->u.s->data, item->u.s->len) != NULL;
        return jctx_step(ctx, c->u.s->len);
    case JV_LIST:
    case JV_TUPLE:
        for (size_t i = 0; i < c->u.l->n; i++)
            if (jv_equal(c->u.l->items[i], *item)) {
                *result = 1;
                break;
            }
        return jctx_step(ctx, c->u.l->n);
    case JV_DICT:
    case JV_NAMESPACE: *result = jv_dict_find(*c, *item) != NULL; return 0;
    case JV_UNDEFINED: return 0;
    default: return jctx_fail(ctx, "argument of type '%s' is not iterable", jv_type_name(*c));
    }
}

/* ----------------------------------------------------------- operators */

static int arith_undefined(struct jctx *ctx, const struct jv *a, const struct jv *b) {
    return jinja_undefined_error(ctx, a->type == JV_UNDEFINED ? a : b);
}

static int unsupported(struct jctx *ctx, const char *op, const struct jv *a, const struct jv *b) {
    return jctx_fail(ctx, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(*a), jv_type_name(*b));
}

static int64_t as_int(const struct jv *v) { return v->type == JV_BOOL ? v->u.b : v->u.i; }

static int repeat(struct jctx *ctx, const struct jv *seq, int64_t times, struct jv *out) {
    if (times < 0) times = 0;
    /* an empty sequence repeated any number of times is empty (without
     * looping `times` times: "" * 10**13 is instant in Python too) */
    if (seq->type == JV_STR ? seq->u.s->len == 0 : seq->u.l->n == 0) times = 0;
    if (seq->type == JV_STR) {
        size_t len = seq->u.s->len;
        if (len && (uint64_t)times > ctx->lim.max_output / len) return jctx_check_len(ctx, ctx->lim.max_output + 1);
        if (jctx_step(ctx, len * (size_t)times)) return -1;
        struct buf b = {0};
        for (int64_t i = 0; i < times; i++) buf_append(&b, seq->u.s->data, len);
        *out = jv_take_buf(&b);
        return 0;
    }
    size_t n = seq->u.l->n;
    if (n && (uint64_t)times > ctx->lim.max_output / sizeof(struct jv) / n) return jctx_fail(ctx, "list too large");
    if (jctx_step(ctx, n * (size_t)times * 8)) return -1;
    struct jv l = jv_list_new(n * (size_t)times);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < n; k++) jv_list_push(l, jv_retain(seq->u.l->items[k]));
    l.type = seq->type;
    *out = l;
    return 0;
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m == 0) return copysign(0.0, b);
    if ((m < 0) != (b < 0)) m += b;
    return m;
}

int jinja_binop(struct jctx *ctx, enum jop op, const struct jv *a, const struct jv *b, struct jv *out) {
    if (op == JOP_TILDE) {
        struct buf buf = {0};
        jv_write_str(&buf, *a);
        jv_write_str(&buf, *b);
        if (jctx_check_len(ctx, buf.len) || jctx_step(ctx, buf.len)) {
            buf_free(&buf);
            return -1;
        }
        *out = jv_take_buf(&buf);
        return 0;
    }
    if (a->type == JV_UNDEFINED || b->type == JV_UNDEFINED) return arith_undefined(ctx, a, b);
    int ints = (a->type == JV_INT || a->type == JV_BOOL) && (b->type == JV_INT || b->type == JV_BOOL);
    int nums = jv_is_number(*a) && jv_is_number(*b);
    double x = jv_as_double(*a), y = jv_as_double(*b);
    int64_t i = ints ? as_int(a) : 0, j = ints ? as_int(b) : 0, r;
    switch (op) {
    case JOP_ADD:
        if (ints) {
            if (__builtin_add_overflow(i, j, &r)) return jctx_fail(ctx, "integer overflow");
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(x + y);
            return 0;
        }
        if (a->type == JV_STR && b->type == JV_STR) {
            size_t len = a->u.s->len + b->u.s->len;
            if (jctx_check_len(ctx, len) || jctx_step(ctx, len)) return -1;
            struct buf buf = {0};
            buf_append(&buf, a->u.s->data, a->u.s->len);
            buf_append(&buf, b->u.s->data, b->u.s->len);
            *out = jv_take_buf(&buf);
            return 0;
        }
        if (jv_is_list(*a) && a->type == b->type) {
            if ((a->u.l->n + b->u.l->n) * sizeof(struct jv) > ctx->lim.max_output)
                return jctx_fail(ctx, "list too large");
            struct jv l = jv_list_new(a->u.l->n + b->u.l->n);
            for (size_t k = 0; k < a->u.l->n; k++) jv_list_push(l, jv_retain(a->u.l->items[k]));
            for (size_t k = 0; k < b->u.l->n; k++) jv_list_push(l, jv_retain(b->u.l->items[k]));
            l.type = a->type;
            *out = l;
            return jctx_step(ctx, (a->u.l->n + b->u.l->n) * 8);
        }
        if (a->type == JV_STR) return jctx_fail(ctx, "can only concatenate str (not \"%s\") to str", jv_type_name(*b));
        if (a->type == JV_LIST)
            return jctx_fail(ctx, "can only concatenate list (not \"%s\") to list", jv_type_name(*b));
        return unsupported(ctx, "+", a, b);
    case JOP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(i, j, &r)) return jctx_fail(ctx, "integer overflow");
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(x - y);
            return 0;
        }
        return unsupported(ctx, "-", a, b);
    case JOP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(i, j, &r)) return jctx_fail(ctx, "integer overflow");
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(x * y);
            return 0;
        }
        if ((a->type == JV_STR || jv_is_list(*a)) && (b->type == JV_INT || b->type == JV_BOOL))
            return repeat(ctx, a, as_int(b), out);
        if ((b->type == JV_STR || jv_is_list(*b)) && (a->type == JV_INT || a->type == JV_BOOL))
            return repeat(ctx, b, as_int(a), out);
        return jctx_fail(ctx, "can't multiply sequence by non-int of type '%s'", jv_type_name(*b));
    case JOP_DIV:
        if (!nums) return unsupported(ctx, "/", a, b);
        if (y == 0) return jctx_fail(ctx, "division by zero");
        *out = jv_float(ints ? (double)i / (double)j : x / y);
        return 0;
    case JOP_FLOORDIV:
        if (!nums) return unsupported(ctx, "//", a, b);
        if (y == 0) return jctx_fail(ctx, "integer division or modulo by zero");
        if (ints) {
            if (i == INT64_MIN && j == -1) return jctx_fail(ctx, "integer overflow");
            int64_t q = i / j;
            if ((i % j != 0) && ((i < 0) != (j < 0))) q--;
            *out = jv_int(q);
        } else {
            /* CPython's float floor division, signs of zero included */
            double m = fmod(x, y), d = (x - m) / y, q;
            if (m != 0 && ((y < 0) != (m < 0))) d -= 1.0;
            if (d != 0) {
                q = floor(d);
                if (d - q > 0.5) q += 1.0;
            } else {
                q = copysign(0.0, x / y);
            }
            *out = jv_float(q);
        }
        return 0;
    case JOP_MOD:
        if (a->type == JV_STR) return jctx_fail(ctx, "printf-style string formatting (%%) is not supported");
        if (!nums) return unsupported(ctx, "%", a, b);
        if (y == 0) return jctx_fail(ctx, "integer division or modulo by zero");
        if (ints) {
            if (j == -1) {
                *out = jv_int(0);
                return 0;
            }
            int64_t m = i % j;
            if (m != 0 && ((m < 0) != (j < 0))) m += j;
            *out = jv_int(m);
        } else {
            *out = jv_float(py_fmod(x, y));
        }
        return 0;
    case JOP_POW:
        if (!nums) return unsupported(ctx, "** or pow()", a, b);
        if (ints && j >= 0) {
            int64_t acc = 1, base = i;
            for (int64_t e = j; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return jctx_fail(ctx, "integer overflow");
                if (e > 1 && __builtin_mul_overflow(base, base, &base)) return jctx_fail(ctx, "integer overflow");
            }
            *out = jv_int(acc);
            return 0;
        }
        if (x == 0 && y < 0) return jctx_fail(ctx, "0.0 cannot be raised to a negative power");
        *out = jv_float(pow(x, y));
        return 0;
    default: return jctx_fail(ctx, "unknown operator");
    }
}

/* -------------------------------------------------------- bound methods */

static struct jv method(const char *name, jfunc_fn fn, const struct jv *self) {
    struct jfunc *f = xcalloc(1, sizeof *f);
    f->rc = 1;
    f->kind = JFUNC_BUILTIN;
    f->name = name;
    f->fn = fn;
    f->self = self ? jv_retain(*self) : jv_undef();
    struct jv v = {.type = JV_FUNC, .u.fn = f};
    return v;
}

int jinja_call(struct jctx *ctx, const struct jv *fn, struct jargs *args, struct jv *out) {
    if (fn->type == JV_FUNC) {
        const struct jfunc *f = fn->u.fn;
        if (f->kind == JFUNC_BUILTIN) return f->fn(ctx, &f->self, args, out);
        return jinja_call_macro(ctx, f, args, out);
    }
    if (fn->type == JV_UNDEFINED) return jinja_undefined_error(ctx, fn);
    return jctx_fail(ctx, "'%s' object is not callable", jv_type_name(*fn));
}

/* dict methods */
static int m_dict_items(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    if (jargs_check(ctx, a, 0, "items")) return -1;
    struct jv l = jv_list_new(self->u.d->n);
    for (size_t i = 0; i < self->u.d->n; i++) {
        struct jv t = jv_list_new(2);
        jv_list_push(t, jv_retain(self->u.d->keys[i]));
        jv_list_push(t, jv_retain(self->u.d->vals[i]));
        t.type = JV_TUPLE;
        jv_list_push(l, t);
    }
    *out = l;
    return 0;
}

static int m_dict_keys_values(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int keys) {
    if (jargs_check(ctx, a, 0, keys ? "keys" : "values")) return -1;
    struct jv l = jv_list_new(self->u.d->n);
    for (size_t i = 0; i < self->u.d->n; i++)
        jv_list_push(l, jv_retain(keys ? self->u.d->keys[i] : self->u.d->vals[i]));
    *out = l;
    return 0;
}
static int m_dict_keys(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    return m_dict_keys_values(ctx, self, a, out, 1);
}
static int m_dict_values(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    return m_dict_keys_values(ctx, self, a, out, 0);
}

static int m_dict_get(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const struct jv *key = jargs_get(a, 0, NULL), *def = jargs_get(a, 1, NULL);
    if (!key || a->nkw || a->npos > 2) return jctx_fail(ctx, "get() takes 1 or 2 positional arguments");
    struct jv *v = jv_dict_find(*self, *key);
    *out = v ? jv_retain(*v) : def ? jv_retain(*def) : jv_none();
    return 0;
}

static int m_dict_copy(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    if (jargs_check(ctx, a, 0, "copy")) return -1;
    struct jv d = jv_dict_new();
    for (size_t i = 0; i < self->u.d->n; i++) jv_dict_set(d, jv_retain(self->u.d->keys[i]), jv_retain(self->u.d->vals[i]));
    *out = d;
    return 0;
}

/* list methods that do not mutate */
static int m_list_index_count(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int count) {
    const struct jv *x = jargs_get(a, 0, NULL);
    if (!x || jargs_check(ctx, a, 1, count ? "count" : "index")) return x ? -1 : jctx_fail(ctx, "missing argument");
    int64_t c = 0;
    for (size_t i = 0; i < self->u.l->n; i++)
        if (jv_equal(self->u.l->items[i], *x)) {
            if (!count) {
                *out = jv_int((int64_t)i);
                return 0;
            }
            c++;
        }
    if (!count) return jctx_fail(ctx, "value is not in list");
    *out = jv_int(c);
    return 0;
}
static int m_list_index(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    return m_list_index_count(ctx, self, a, out, 0);
}
static int m_list_count(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    return m_list_index_count(ctx, self, a, out, 1);
}

/* loop.cycle(a, b, ...) and loop.changed(x) */
static int m_loop_cycle(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    if (a->npos == 0) return jctx_fail(ctx, "no items for cycling given");
    *out = jv_retain(a->pos[self->u.loop->index0 % a->npos]);
    return 0;
}

static int m_loop_changed(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    struct jloop *lp = self->u.loop;
    struct jv t = jv_list_new(a->npos);
    for (size_t i = 0; i < a->npos; i++) jv_list_push(t, jv_retain(a->pos[i]));
    int changed = !lp->have_changed || !jv_equal(t, lp->last_changed);
    jv_release(lp->last_changed);
    lp->last_changed = t;
    lp->have_changed = 1;
    *out = jv_bool(changed);
    return 0;
}

/* String methods live in jinja_strings.c. */
jfunc_fn jinja_str_method(const char *name);

static const char *const unsafe_list[] = {"append", "pop", "extend", "insert", "remove", "clear", "sort", "reverse", NULL};
static const char *const unsafe_dict[] = {"pop", "popitem", "update", "setdefault", "clear", NULL};

static int in_list(const char *const *names, const char *name) {
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

static struct jv undef_attr(const struct jv *obj, const char *name) {
    char msg[300];
    if (obj->type == JV_NONE)
        snprintf(msg, sizeof msg, "'None' has no attribute '%.100s'", name);
    else
        snprintf(msg, sizeof msg, "'%s object' has no attribute '%.100s'", jv_type_name(*obj), name);
    return jv_undef_named(msg);
}

static struct jv undef_unsafe(const struct jv *obj, const char *name) {
    char msg[300];
    snprintf(msg, sizeof msg, "access to attribute '%.100s' of '%s' object is unsafe.", name, jv_type_name(*obj));
    return jv_undef_named(msg);
}

static int loop_attr(struct jctx *ctx, const struct jv *obj, const char *name, struct jv *out) {
    const struct jloop *lp = obj->u.loop;
    size_t n = lp->items.u.l->n, i = lp->index0;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = jv_int(1);
    else if (!strcmp(name, "depth0")) *out = jv_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? jv_retain(lp->items.u.l->items[i - 1]) : jv_undef_named("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? jv_retain(lp->items.u.l->items[i + 1]) : jv_undef_named("there is no next item");
    else if (!strcmp(name, "cycle")) *out = method("cycle", m_loop_cycle, obj);
    else if (!strcmp(name, "changed")) *out = method("changed", m_loop_changed, obj);
    else *out = undef_attr(obj, name);
    (void)ctx;
    return 0;
}

int jinja_getattr(struct jctx *ctx, const struct jv *obj, const char *name, size_t name_len, struct jv *out) {
    (void)name_len;
    switch (obj->type) {
    case JV_UNDEFINED: return jinja_undefined_error(ctx, obj);
    case JV_DICT: {
        if (!strcmp(name, "items")) *out = method("items", m_dict_items, obj);
        else if (!strcmp(name, "keys")) *out = method("keys", m_dict_keys, obj);
        else if (!strcmp(name, "values")) *out = method("values", m_dict_values, obj);
        else if (!strcmp(name, "get")) *out = method("get", m_dict_get, obj);
        else if (!strcmp(name, "copy")) *out = method("copy", m_dict_copy, obj);
        else if (in_list(unsafe_dict, name)) *out = undef_unsafe(obj, name);
        else {
            struct jv *v = jv_dict_find_str(*obj, name);
            *out = v ? jv_retain(*v) : undef_attr(obj, name);
        }
        return 0;
    }
    case JV_NAMESPACE: {
        struct jv *v = jv_dict_find_str(*obj, name);
        *out = v ? jv_retain(*v) : undef_attr(obj, name);
        return 0;
    }
    case JV_STR: {
        jfunc_fn fn = jinja_str_method(name);
        *out = fn ? method(name, fn, obj) : undef_attr(obj, name);
        return 0;
    }
    case JV_LIST:
    case JV_TUPLE:
        if (!strcmp(name, "index")) *out = method("index", m_list_index, obj);
        else if (!strcmp(name, "count")) *out = method("count", m_list_count, obj);
        else if (obj->type == JV_LIST && in_list(unsafe_list, name)) *out = undef_unsafe(obj, name);
        else *out = undef_attr(obj, name);
        return 0;
    case JV_LOOP: return loop_attr(ctx, obj, name, out);
    default: *out = undef_attr(obj, name); return 0;
    }
}

int jinja_getitem(struct jctx *ctx, const struct jv *obj, const struct jv *key, struct jv *out) {
    char msg[200];
    switch (obj->type) {
    case JV_UNDEFINED: return jinja_undefined_error(ctx, obj);
    case JV_LIST:
    case JV_TUPLE:
        if (key->type == JV_INT || key->type == JV_BOOL) {
            int64_t i = as_int(key), n = (int64_t)obj->u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                *out = jv_retain(obj->u.l->items[i]);
            } else {
                snprintf(msg, sizeof msg, "%s object has no element %lld", jv_type_name(*obj), (long long)as_int(key));
                *out = jv_undef_named(msg);
            }
            return 0;
        }
        break;
    case JV_STR:
        if (key->type == JV_INT || key->type == JV_BOOL) {
            int64_t i = as_int(key), n = (int64_t)utf8_count(obj->u.s->data, obj->u.s->len);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t off = utf8_offset(obj->u.s->data, obj->u.s->len, (size_t)i);
                uint32_t cp;
                size_t k = utf8_decode_lossy(obj->u.s->data + off, obj->u.s->len - off, &cp);
                *out = jv_str(obj->u.s->data + off, k);
            } else {
                snprintf(msg, sizeof msg, "str object has no element %lld", (long long)as_int(key));
                *out = jv_undef_named(msg);
            }
            return jctx_step(ctx, obj->u.s->len);
        }
        break;
    case JV_DICT: {
        struct jv *v = jv_dict_find(*obj, *key);
        if (v) {
            *out = jv_retain(*v);
            return 0;
        }
        break;
    }
    default: break;
    }
    if (key->type == JV_STR) return jinja_getattr(ctx, obj, key->u.s->data, key->u.s->len, out);
    if (obj->type == JV_DICT) {
        struct buf b = {0};
        jv_write_repr(&b, *key);
        snprintf(msg, sizeof msg, "'dict object' has no attribute %.100s", b.data ? b.data : "");
        buf_free(&b);
        *out = jv_undef_named(msg);
        return 0;
    }
    *out = undef_attr(obj, "?");
    return 0;
}

/* --------------------------------------------------------------- globals */

static int g_range(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    (void)self;
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3 || a->nkw) return jctx_fail(ctx, "range expected 1 to 3 integer arguments");
    for (size_t i = 0; i < a->npos; i++) {
        if (a->pos[i].type != JV_INT && a->pos[i].type != JV_BOOL)
            return jctx_fail(ctx, "'%s' object cannot be interpreted as an integer", jv_type_name(a->pos[i]));
        v[a->npos == 1 ? 1 : i] = as_int(&a->pos[i]);
    }
    if (v[2] == 0) return jctx_fail(ctx, "range() arg 3 must not be zero");
    double count = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2]) : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (count < 0) count = 0;
    if (count > 100000) return jctx_fail(ctx, "range too big, maximum size is 100000"); /* jinja2's sandbox limit */
    if (jctx_step(ctx, (size_t)count * 4)) return -1;
    struct jv l = jv_list_new((size_t)count);
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
        jv_list_push(l, jv_int(i));
        if ((v[2] > 0 && i > INT64_MAX - v[2]) || (v[2] < 0 && i < INT64_MIN - v[2])) break;
    }
    *out = l;
    return 0;
}

static int dict_from_args(struct jctx *ctx, struct jargs *a, struct jv *out, const char *what) {
    struct jv d = jv_dict_new();
    if (a->npos > 1) {
        jv_release(d);
        return jctx_fail(ctx, "%s expected at most 1 positional argument", what);
    }
    if (a->npos == 1) {
        const struct jv *src = &a->pos[0];
        if (jv_is_dict(*src)) {
            for (size_t i = 0; i < src->u.d->n; i++) jv_dict_set(d, jv_retain(src->u.d->keys[i]), jv_retain(src->u.d->vals[i]));
        } else if (jv_is_list(*src)) {
            for (size_t i = 0; i < src->u.l->n; i++) {
                const struct jv *pair = &src->u.l->items[i];
                if (!jv_is_list(*pair) || pair->u.l->n != 2) {
                    jv_release(d);
                    return jctx_fail(ctx, "%s: sequence elements must be pairs", what);
                }
                jv_dict_set(d, jv_retain(pair->u.l->items[0]), jv_retain(pair->u.l->items[1]));
            }
        } else if (src->type != JV_UNDEFINED) {
            jv_release(d);
            return jctx_fail(ctx, "'%s' object is not iterable", jv_type_name(*src));
        }
    }
    for (size_t i = 0; i < a->nkw; i++) jv_dict_set(d, jv_cstr(a->kwnames[i]), jv_retain(a->kw[i]));
    *out = d;
    return 0;
}

static int g_namespace(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    (void)self;
    if (dict_from_args(ctx, a, out, "namespace")) return -1;
    out->type = JV_NAMESPACE;
    jv_list_push(ctx->namespaces, jv_retain(*out));
    return 0;
}

static int g_dict(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    (void)self;
    return dict_from_args(ctx, a, out, "dict");
}

static int g_raise_exception(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    (void)self;
    (void)out;
    const struct jv *m = jargs_get(a, 0, "message");
    struct jv s = m ? jv_to_str(*m) : jv_cstr("");
    jctx_fail(ctx, "%s", s.u.s->data);
    ctx->failed_positioned = 1; /* the template's own message, shown as written */
    jv_release(s);
    return -1;
}

static int g_strftime_now(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    (void)self;
    const struct jv *f = jargs_get(a, 0, "format");
    if (!f || f->type != JV_STR || jargs_check(ctx, a, 1, "strftime_now"))
        return jctx_fail(ctx, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char buf[512];
    /* the template's own format (bounded in length; strftime bounds the output) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = f->u.s->len < 200 ? strftime(buf, sizeof buf, f->u.s->data, &tm) : 0;
#pragma GCC diagnostic pop
    *out = jv_str(buf, n);
    return 0;
}

struct jv jinja_global(const char *name) {
    static const struct {
        const char *name;
        jfunc_fn fn;
    } globals[] = {
        {"range", g_range},
        {"namespace", g_namespace},
        {"dict", g_dict},
        {"raise_exception", g_raise_exception},
        {"strftime_now", g_strftime_now},
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(globals[i].name, name)) return method(globals[i].name, globals[i].fn, NULL);
    return jv_undef();
}
