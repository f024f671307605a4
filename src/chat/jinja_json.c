/* jinja_json.c — JSON into template values (jansson keeps key order), and
 * values out as Python's json.dumps writes them, since templates embed tool
 * schemas with `tojson` and the model was trained on exactly that text. */
#include "chat/jinja.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

struct jv jv_from_json(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jv d = jv_dict_new();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) jv_dict_set(d, jv_cstr(k), jv_from_json(v));
        return d;
    }
    case JSON_ARRAY: {
        struct jv l = jv_list_new(json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) jv_list_push(l, jv_from_json(json_array_get(j, i)));
        return l;
    }
    case JSON_STRING: return jv_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

static void dump_string(struct buf *b, const char *s, size_t n, int ensure_ascii) {
    buf_push(b, '"');
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode_lossy(s + i, n - i, &cp);
        switch (cp) {
        case '"': buf_puts(b, "\\\""); break;
        case '\\': buf_puts(b, "\\\\"); break;
        case '\n': buf_puts(b, "\\n"); break;
        case '\r': buf_puts(b, "\\r"); break;
        case '\t': buf_puts(b, "\\t"); break;
        case '\b': buf_puts(b, "\\b"); break;
        case '\f': buf_puts(b, "\\f"); break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
                if (cp >= 0x10000) {
                    int32_t v = cp - 0x10000;
                    buf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xd800 | (v >> 10)), (unsigned)(0xdc00 | (v & 0x3ff)));
                } else {
                    buf_printf(b, "\\u%04x", (unsigned)cp);
                }
            } else {
                buf_append(b, s + i, k);
            }
        }
        i += k;
    }
    buf_push(b, '"');
}

static void dump_float(struct buf *b, double f) {
    if (isnan(f)) {
        buf_puts(b, "NaN");
    } else if (isinf(f)) {
        buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    } else {
        char num[40];
        py_float_repr(f, num);
        buf_puts(b, num);
    }
}

static void dump_newline(struct buf *b, const struct jdump_opts *o, int level) {
    buf_push(b, '\n');
    for (int i = 0; i < level; i++) buf_puts(b, o->indent);
}

/* Keys become strings the way json.dumps converts them. */
static int dump_key(struct jctx *ctx, struct buf *b, const struct jv k, const struct jdump_opts *o) {
    switch (k.type) {
    case JV_STR: dump_string(b, k.u.s->data, k.u.s->len, o->ensure_ascii); return 0;
    case JV_INT: buf_printf(b, "\"%lld\"", (long long)k.u.i); return 0;
    case JV_BOOL: buf_puts(b, k.u.b ? "\"true\"" : "\"false\""); return 0;
    case JV_NONE: buf_puts(b, "\"null\""); return 0;
    case JV_FLOAT:
        buf_push(b, '"');
        dump_float(b, k.u.f);
        buf_push(b, '"');
        return 0;
    default: return jctx_fail(ctx, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int cmp_keys(const void *a, const void *b) {
    const struct jv *x = *(const struct jv *const *)a, *y = *(const struct jv *const *)b;
    int c = jv_compare(*x, *y);
    return c == 2 || c == 3 ? 0 : c;
}

int jv_dump_json(struct jctx *ctx, struct buf *b, const struct jv v, const struct jdump_opts *o, int depth) {
    if (depth > 200) return jctx_fail(ctx, "maximum recursion depth exceeded while encoding a JSON object");
    if (ctx && jctx_check_len(ctx, b->len)) return -1;
    switch (v.type) {
    case JV_NONE: buf_puts(b, "null"); return 0;
    case JV_BOOL: buf_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT: buf_printf(b, "%lld", (long long)v.u.i); return 0;
    case JV_FLOAT: dump_float(b, v.u.f); return 0;
    case JV_STR: dump_string(b, v.u.s->data, v.u.s->len, o->ensure_ascii); return 0;
    case JV_LIST:
    case JV_TUPLE: {
        const struct jlist *l = v.u.l;
        if (l->n == 0) {
            buf_puts(b, "[]");
            return 0;
        }
        buf_push(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) buf_puts(b, o->item_sep);
            if (o->indent) dump_newline(b, o, depth + 1);
            if (jv_dump_json(ctx, b, l->items[i], o, depth + 1)) return -1;
        }
        if (o->indent) dump_newline(b, o, depth);
        buf_push(b, ']');
        return 0;
    }
    case JV_DICT: {
        const struct jdict *d = v.u.d;
        if (d->n == 0) {
            buf_puts(b, "{}");
            return 0;
        }
        const struct jv **keys = malloc(d->n * sizeof *keys);
        KILN_ASSERT(keys);
        for (size_t i = 0; i < d->n; i++) keys[i] = &d->keys[i];
        if (o->sort_keys) {
            for (size_t i = 1; i < d->n; i++)
                if (jv_compare(*keys[0], *keys[i]) >= 2) {
                    const char *ta = jv_type_name(*keys[0]), *tb = jv_type_name(*keys[i]);
                    free(keys);
                    return jctx_fail(ctx, "'<' not supported between instances of '%s' and '%s'", ta, tb);
                }
            qsort(keys, d->n, sizeof *keys, cmp_keys);
        }
        buf_push(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) buf_puts(b, o->item_sep);
            if (o->indent) dump_newline(b, o, depth + 1);
            const struct jv *val = &d->vals[keys[i] - d->keys];
            if (dump_key(ctx, b, *keys[i], o) || (buf_puts(b, o->key_sep), 0) ||
                jv_dump_json(ctx, b, *val, o, depth + 1)) {
                free(keys);
                return -1;
            }
        }
        free(keys);
        if (o->indent) dump_newline(b, o, depth);
        buf_push(b, '}');
        return 0;
    }
    default:
        return jctx_fail(ctx, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
