/* jinja_value.c — Python-like values: lifetime, str()/repr(), equality,
 * ordering, and the byte buffer and UTF-8 helpers everything else uses. */
#include "chat/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

struct jv jv_take_buf(struct buf *b) {
    struct jv v = jv_str(b->data ? b->data : "", b->len);
    buf_free(b);
    return v;
}

/* ------------------------------------------------------------------ utf8 */

/* Python's str.isspace(): the Unicode White_Space set plus the ASCII
 * separators \x1c-\x1f that Python also counts. */
int py_isspace(int32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return 1;
    if (cp < 0x80) return 0;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ------------------------------------------------------------- lifetimes */

static struct jstr *jstr_alloc(size_t len) {
    struct jstr *s = xmalloc(sizeof *s + len + 1);
    s->rc = 1;
    s->len = len;
    s->data[len] = 0;
    return s;
}

struct jv jv_str(const char *p, size_t len) {
    struct jstr *s = jstr_alloc(len);
    if (len) memcpy(s->data, p, len);
    struct jv v = {.type = JV_STR, .u.s = s};
    return v;
}

struct jv jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

struct jv jv_undef_named(const char *name) {
    struct jv v = jv_cstr(name);
    v.type = JV_UNDEFINED;
    return v;
}

struct jv jv_list_new(size_t cap) {
    struct jlist *l = xcalloc(1, sizeof *l);
    l->rc = 1;
    if (cap) {
        l->items = xmalloc(cap * sizeof *l->items);
        l->cap = cap;
    }
    struct jv v = {.type = JV_LIST, .u.l = l};
    return v;
}

struct jv jv_dict_new(void) {
    struct jdict *d = xcalloc(1, sizeof *d);
    d->rc = 1;
    struct jv v = {.type = JV_DICT, .u.d = d};
    return v;
}

static int *jv_rc(struct jv v) {
    switch (v.type) {
    case JV_UNDEFINED:
        return v.u.s ? &v.u.s->rc : NULL;
    case JV_STR: return &v.u.s->rc;
    case JV_LIST:
    case JV_TUPLE: return &v.u.l->rc;
    case JV_DICT:
    case JV_NAMESPACE: return &v.u.d->rc;
    case JV_FUNC: return &v.u.fn->rc;
    case JV_LOOP: return &v.u.loop->rc;
    default: return NULL;
    }
}

struct jv jv_retain(struct jv v) {
    int *rc = jv_rc(v);
    if (rc && *rc >= 0) (*rc)++;
    return v;
}

static void jv_destroy(struct jv v) {
    switch (v.type) {
    case JV_UNDEFINED:
    case JV_STR: free(v.u.s); break;
    case JV_LIST:
    case JV_TUPLE:
        for (size_t i = 0; i < v.u.l->n; i++) jv_release(v.u.l->items[i]);
        free(v.u.l->items);
        free(v.u.l);
        break;
    case JV_DICT:
    case JV_NAMESPACE:
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv_release(v.u.d->keys[i]);
            jv_release(v.u.d->vals[i]);
        }
        free(v.u.d->keys);
        free(v.u.d->vals);
        free(v.u.d->index);
        free(v.u.d);
        break;
    case JV_FUNC:
        jv_release(v.u.fn->self);
        free(v.u.fn);
        break;
    case JV_LOOP:
        jv_release(v.u.loop->items);
        jv_release(v.u.loop->last_changed);
        free(v.u.loop);
        break;
    default: break;
    }
}

void jv_release(struct jv v) {
    int *rc = jv_rc(v);
    if (!rc || *rc < 0) return;
    KILN_ASSERT(*rc > 0);
    if (--*rc == 0) jv_destroy(v);
}

void jv_make_immortal(struct jv v) {
    KILN_ASSERT(v.type != JV_LIST && v.type != JV_DICT);
    int *rc = jv_rc(v);
    if (rc) *rc = -1;
}

void jv_free_immortal(struct jv v) {
    int *rc = jv_rc(v);
    if (rc && *rc < 0) {
        *rc = 1;
        jv_release(v);
    } else {
        jv_release(v);
    }
}

/* ------------------------------------------------------ lists and dicts */

void jv_list_push(struct jv list, struct jv take) {
    struct jlist *l = list.u.l;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->items = xrealloc(l->items, l->cap * sizeof *l->items);
    }
    l->items[l->n++] = take;
}

#define DICT_INDEX_MIN 16

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_int(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint64_t jv_hash(const struct jv v) {
    switch (v.type) {
    case JV_BOOL: return hash_int((uint64_t)v.u.b);
    case JV_INT: return hash_int((uint64_t)v.u.i);
    case JV_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9.2e18) return hash_int((uint64_t)(int64_t)v.u.f);
        {
            uint64_t bits;
            memcpy(&bits, &v.u.f, sizeof bits);
            return hash_int(bits);
        }
    case JV_STR: return hash_bytes(v.u.s->data, v.u.s->len);
    case JV_TUPLE:
    case JV_LIST: {
        uint64_t h = 7;
        for (size_t i = 0; i < v.u.l->n; i++) h = h * 31 + jv_hash(v.u.l->items[i]);
        return h;
    }
    case JV_NONE: return 1;
    case JV_UNDEFINED: return 2;
    case JV_DICT:
    case JV_NAMESPACE: return (uint64_t)(uintptr_t)v.u.d;
    case JV_FUNC: return (uint64_t)(uintptr_t)v.u.fn;
    case JV_LOOP: return (uint64_t)(uintptr_t)v.u.loop;
    }
    return 0;
}

static void dict_index_insert(struct jdict *d, size_t entry) {
    size_t mask = d->index_cap - 1, slot = (size_t)jv_hash(d->keys[entry]) & mask;
    while (d->index[slot]) slot = (slot + 1) & mask;
    d->index[slot] = entry + 1;
}

static void dict_reindex(struct jdict *d) {
    size_t cap = 64;
    while (cap < d->n * 2 + 2) cap *= 2;
    free(d->index);
    d->index = xcalloc(cap, sizeof *d->index);
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++) dict_index_insert(d, i);
}

static struct jv *dict_lookup(struct jdict *d, const struct jv *key, const char *raw, size_t raw_len) {
    if (!d->index) {
        for (size_t i = 0; i < d->n; i++) {
            const struct jv *k = &d->keys[i];
            if (raw ? (k->type == JV_STR && k->u.s->len == raw_len && !memcmp(k->u.s->data, raw, raw_len))
                    : jv_equal(*k, *key))
                return &d->vals[i];
        }
        return NULL;
    }
    uint64_t h = raw ? hash_bytes(raw, raw_len) : jv_hash(*key);
    size_t mask = d->index_cap - 1;
    for (size_t slot = (size_t)h & mask; d->index[slot]; slot = (slot + 1) & mask) {
        size_t e = d->index[slot] - 1;
        const struct jv *k = &d->keys[e];
        if (raw ? (k->type == JV_STR && k->u.s->len == raw_len && !memcmp(k->u.s->data, raw, raw_len)) : jv_equal(*k, *key))
            return &d->vals[e];
    }
    return NULL;
}

struct jv *jv_dict_find(const struct jv dict, const struct jv key) { return dict_lookup(dict.u.d, &key, NULL, 0); }

struct jv *jv_dict_find_str(const struct jv dict, const char *key) {
    return dict_lookup(dict.u.d, NULL, key, strlen(key));
}

void jv_dict_set(struct jv dict, struct jv take_key, struct jv take_val) {
    struct jv *slot = jv_dict_find(dict, take_key);
    if (slot) {
        jv_release(*slot);
        *slot = take_val;
        jv_release(take_key);
        return;
    }
    struct jdict *d = dict.u.d;
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        d->keys = xrealloc(d->keys, d->cap * sizeof *d->keys);
        d->vals = xrealloc(d->vals, d->cap * sizeof *d->vals);
    }
    d->keys[d->n] = take_key;
    d->vals[d->n] = take_val;
    d->n++;
    if (d->index && d->n * 2 + 2 <= d->index_cap)
        dict_index_insert(d, d->n - 1);
    else if (d->n >= DICT_INDEX_MIN)
        dict_reindex(d);
}

void jv_dict_clear(struct jv dict) {
    struct jdict *d = dict.u.d;
    size_t n = d->n;
    d->n = 0;
    free(d->index);
    d->index = NULL;
    d->index_cap = 0;
    for (size_t k = 0; k < n; k++) {
        jv_release(d->keys[k]);
        jv_release(d->vals[k]);
    }
}

/* ------------------------------------------------------------ semantics */

int jv_is_list(const struct jv v) { return v.type == JV_LIST || v.type == JV_TUPLE; }
int jv_is_dict(const struct jv v) { return v.type == JV_DICT || v.type == JV_NAMESPACE; }
int jv_is_number(const struct jv v) { return v.type == JV_BOOL || v.type == JV_INT || v.type == JV_FLOAT; }

double jv_as_double(const struct jv v) {
    switch (v.type) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return (double)v.u.i;
    case JV_FLOAT: return v.u.f;
    default: return 0;
    }
}

int jv_truthy(const struct jv v) {
    switch (v.type) {
    case JV_UNDEFINED:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST:
    case JV_TUPLE: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int jv_equal(const struct jv a, const struct jv b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_BOOL ? a.u.b : a.u.i, y = b.type == JV_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a.type == JV_STR && b.type == JV_STR)
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->data, b.u.s->data, a.u.s->len);
    if (a.type != b.type) return 0;
    switch (a.type) {
    case JV_UNDEFINED:
    case JV_NONE: return 1;
    case JV_LIST:
    case JV_TUPLE:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->items[i], b.u.l->items[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct jv *o = jv_dict_find(b, a.u.d->keys[i]);
            if (!o || !jv_equal(a.u.d->vals[i], *o)) return 0;
        }
        return 1;
    case JV_NAMESPACE: return a.u.d == b.u.d;
    case JV_FUNC: return a.u.fn == b.u.fn;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int jv_compare(const struct jv a, const struct jv b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_BOOL ? a.u.b : a.u.i, y = b.type == JV_BOOL ? b.u.b : b.u.i;
            return x < y ? -1 : x > y;
        }
        double x = jv_as_double(a), y = jv_as_double(b);
        if (isnan(x) || isnan(y)) return 3; /* unordered: every comparison is false */
        return x < y ? -1 : x > y;
    }
    if (a.type == JV_STR && b.type == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->data, b.u.s->data, n); /* UTF-8 byte order is code point order */
        if (c) return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (jv_is_list(a) && a.type == b.type) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return jv_compare(a.u.l->items[i], b.u.l->items[i]);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    return 2;
}

const char *jv_type_name(const struct jv v) {
    switch (v.type) {
    case JV_UNDEFINED: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NAMESPACE: return "Namespace";
    case JV_FUNC: return v.u.fn->kind == JFUNC_BUILTIN ? "builtin_function_or_method" : "Macro";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

/* -------------------------------------------------------- str and repr */

/* float.__repr__: the shortest digits that read back to the same double,
 * in fixed notation for exponents in [-4, 16), else d.ddde+XX. */
void py_float_repr(double f, char out[40]) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        *o++ = 'e';
        *o++ = exp10 < 0 ? '-' : '+';
        int e = exp10 < 0 ? -exp10 : exp10;
        if (e >= 100) *o++ = (char)('0' + e / 100);
        *o++ = (char)('0' + e / 10 % 10);
        *o++ = (char)('0' + e % 10);
        *o = 0;
    }
}

static int py_isprintable(int32_t cp) {
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp >= 0x80 && cp < 0xa0) return 0;
    if (cp == 0xad || cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) ||
        (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x206f) || cp == 0xfeff ||
        (cp >= 0xd800 && cp <= 0xdfff) || (py_isspace(cp) && cp != ' '))
        return 0;
    return 1;
}

static void write_str_repr(struct buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    buf_push(b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode_lossy(s + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            buf_push(b, '\\');
            buf_push(b, (char)cp);
        } else if (cp == '\n') {
            buf_puts(b, "\\n");
        } else if (cp == '\r') {
            buf_puts(b, "\\r");
        } else if (cp == '\t') {
            buf_puts(b, "\\t");
        } else if (!py_isprintable(cp)) {
            if (cp < 0x100)
                buf_printf(b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                buf_printf(b, "\\u%04x", (unsigned)cp);
            else
                buf_printf(b, "\\U%08x", (unsigned)cp);
        } else {
            buf_append(b, s + i, k);
        }
        i += k;
    }
    buf_push(b, q);
}

static void write_value(struct buf *b, const struct jv v, int repr, int depth) {
    char num[40];
    if (depth > 100) {
        buf_puts(b, "...");
        return;
    }
    switch (v.type) {
    case JV_UNDEFINED:
        if (repr) buf_puts(b, "Undefined");
        break;
    case JV_NONE: buf_puts(b, "None"); break;
    case JV_BOOL: buf_puts(b, v.u.b ? "True" : "False"); break;
    case JV_INT: buf_printf(b, "%lld", (long long)v.u.i); break;
    case JV_FLOAT:
        py_float_repr(v.u.f, num);
        buf_puts(b, num);
        break;
    case JV_STR:
        if (repr)
            write_str_repr(b, v.u.s->data, v.u.s->len);
        else
            buf_append(b, v.u.s->data, v.u.s->len);
        break;
    case JV_LIST:
    case JV_TUPLE:
        buf_push(b, v.type == JV_LIST ? '[' : '(');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) buf_puts(b, ", ");
            write_value(b, v.u.l->items[i], 1, depth + 1);
        }
        if (v.type == JV_TUPLE && v.u.l->n == 1) buf_push(b, ',');
        buf_push(b, v.type == JV_LIST ? ']' : ')');
        break;
    case JV_DICT:
    case JV_NAMESPACE:
        buf_puts(b, v.type == JV_DICT ? "{" : "<Namespace {");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) buf_puts(b, ", ");
            write_value(b, v.u.d->keys[i], 1, depth + 1);
            buf_puts(b, ": ");
            write_value(b, v.u.d->vals[i], 1, depth + 1);
        }
        buf_puts(b, v.type == JV_DICT ? "}" : "}>");
        break;
    case JV_FUNC:
        if (v.u.fn->kind == JFUNC_BUILTIN)
            buf_printf(b, "<built-in method %s>", v.u.fn->name);
        else
            buf_printf(b, "<Macro '%s'>", v.u.fn->name ? v.u.fn->name : "caller");
        break;
    case JV_LOOP: buf_puts(b, "<LoopContext>"); break;
    }
}

void jv_write_str(struct buf *b, const struct jv v) { write_value(b, v, 0, 0); }
void jv_write_repr(struct buf *b, const struct jv v) { write_value(b, v, 1, 0); }

struct jv jv_to_str(const struct jv v) {
    if (v.type == JV_STR) return jv_retain(v);
    struct buf b = {0};
    jv_write_str(&b, v);
    return jv_take_buf(&b);
}
