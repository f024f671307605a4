/* jinja_strings.c — Python str methods (strip, split, startswith, format,
 * ...) on UTF-8 strings, counting in code points as Python does. */
#include "chat/jinja.h"

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/error.h"
#include "base/mem.h"

#define SELF_S (self->u.s->data)
#define SELF_N (self->u.s->len)

static int in_set(uint32_t cp, const struct jv *chars) {
    if (!chars) return py_isspace(cp);
    const char *s = chars->u.s->data;
    size_t n = chars->u.s->len;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += utf8_decode_lossy(s + i, n - i, &c);
        if (c == cp) return 1;
    }
    return 0;
}

struct jv jstr_strip(const struct jv s, const struct jv *chars, int left, int right) {
    const char *p = s.u.s->data;
    size_t n = s.u.s->len, a = 0, b = n;
    if (left)
        while (a < b) {
            uint32_t cp;
            size_t k = utf8_decode_lossy(p + a, b - a, &cp);
            if (!in_set(cp, chars)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t st = utf8_prev(p, a, b);
            uint32_t cp;
            utf8_decode_lossy(p + st, b - st, &cp);
            if (!in_set(cp, chars)) break;
            b = st;
        }
    if (a == 0 && b == n) return jv_retain(s);
    return jv_str(p + a, b - a);
}

static int is_cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* mode: 0 lower, 1 upper, 2 title (str.title), 3 capitalize, 4 swapcase */
static struct jv map_case(const struct jv s, int mode) {
    const char *p = s.u.s->data;
    size_t n = s.u.s->len;
    struct buf b = {0};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int32_t out;
        size_t k = utf8_decode_lossy(p + i, n - i, &cp);
        switch (mode) {
        case 0: out = utf8proc_tolower(cp); break;
        case 1: out = utf8proc_toupper(cp); break;
        case 2: out = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp); break;
        case 3: out = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        default: {
            utf8proc_category_t c = utf8proc_category(cp);
            out = c == UTF8PROC_CATEGORY_LU ? utf8proc_tolower(cp) : c == UTF8PROC_CATEGORY_LL ? utf8proc_toupper(cp) : (int32_t)cp;
        }
        }
        prev_cased = is_cased(cp);
        first = 0;
        if (out == (int32_t)cp)
            buf_append(&b, p + i, k);
        else
            buf_push_cp(&b, (uint32_t)out);
        i += k;
    }
    return jv_take_buf(&b);
}

struct jv jstr_upper_lower(const struct jv s, int upper) { return map_case(s, upper ? 1 : 0); }
struct jv jstr_capitalize(const struct jv s) { return map_case(s, 3); }

struct jv jstr_replace(struct jctx *ctx, const struct jv s, const struct jv old, const struct jv rep, int64_t count) {
    const char *p = s.u.s->data, *o = old.u.s->data, *r = rep.u.s->data;
    size_t n = s.u.s->len, on = old.u.s->len, rn = rep.u.s->len;
    struct buf b = {0};
    int64_t done = 0;
    if (on == 0) {
        for (size_t i = 0; i <= n;) {
            if (count < 0 || done < count) {
                buf_append(&b, r, rn);
                done++;
            } else {
                buf_append(&b, p + i, n - i);
                break;
            }
            if (i == n) break;
            uint32_t cp;
            size_t k = utf8_decode_lossy(p + i, n - i, &cp);
            buf_append(&b, p + i, k);
            i += k;
            if (ctx && jctx_check_len(ctx, b.len)) {
                buf_free(&b);
                return jv_undef();
            }
        }
        return jv_take_buf(&b);
    }
    size_t i = 0;
    while (i < n) {
        const char *hit = (count < 0 || done < count) ? memmem(p + i, n - i, o, on) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        buf_append(&b, p + i, at - i);
        buf_append(&b, r, rn);
        i = at + on;
        done++;
        if (ctx && jctx_check_len(ctx, b.len)) {
            buf_free(&b);
            return jv_undef();
        }
    }
    buf_append(&b, p + i, n - i);
    return jv_take_buf(&b);
}

/* ------------------------------------------------------------- methods */

static int want_str(struct jctx *ctx, const struct jv *v, const char *what) {
    if (!v || v->type != JV_STR) return jctx_fail(ctx, "%s: expected a string argument", what);
    return 0;
}

static int m_strip_common(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int l, int r,
                          const char *what) {
    const struct jv *chars = jargs_get(a, 0, NULL);
    if (jargs_check(ctx, a, 1, what)) return -1;
    if (chars && chars->type == JV_NONE) chars = NULL;
    if (chars && want_str(ctx, chars, what)) return -1;
    *out = jstr_strip(*self, chars, l, r);
    return 0;
}
static int m_strip(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_strip_common(c, s, a, o, 1, 1, "strip"); }
static int m_lstrip(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_strip_common(c, s, a, o, 1, 0, "lstrip"); }
static int m_rstrip(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_strip_common(c, s, a, o, 0, 1, "rstrip"); }

static int m_case(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int mode, const char *what) {
    if (jargs_check(ctx, a, 0, what)) return -1;
    *out = map_case(*self, mode);
    return 0;
}
static int m_lower(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_case(c, s, a, o, 0, "lower"); }
static int m_upper(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_case(c, s, a, o, 1, "upper"); }
static int m_title(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_case(c, s, a, o, 2, "title"); }
static int m_capitalize(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_case(c, s, a, o, 3, "capitalize"); }
static int m_swapcase(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_case(c, s, a, o, 4, "swapcase"); }

static int m_split_common(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int from_right) {
    const struct jv *sep = jargs_get(a, 0, "sep"), *maxv = jargs_get(a, 1, "maxsplit");
    if (jargs_check(ctx, a, 2, from_right ? "rsplit" : "split")) return -1;
    if (sep && sep->type == JV_NONE) sep = NULL;
    if (sep && want_str(ctx, sep, "split")) return -1;
    int64_t maxsplit = -1;
    if (maxv) {
        if (maxv->type != JV_INT) return jctx_fail(ctx, "split: maxsplit must be an integer");
        maxsplit = maxv->u.i;
    }
    const char *p = SELF_S;
    size_t n = SELF_N;
    struct jv parts = jv_list_new(0);
    if (jctx_step(ctx, n)) {
        jv_release(parts);
        return -1;
    }
    if (sep) {
        const char *sp = sep->u.s->data;
        size_t sn = sep->u.s->len;
        if (sn == 0) {
            jv_release(parts);
            return jctx_fail(ctx, "empty separator");
        }
        if (!from_right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sp, sn) : NULL;
                if (!hit) break;
                jv_list_push(parts, jv_str(p + i, (size_t)(hit - p) - i));
                i = (size_t)(hit - p) + sn;
                done++;
            }
            jv_list_push(parts, jv_str(p + i, n - i));
        } else {
            /* collect from the right, then reverse */
            size_t end = n;
            int64_t done = 0;
            struct jv rev = jv_list_new(0);
            while (maxsplit < 0 || done < maxsplit) {
                size_t found = (size_t)-1;
                for (size_t k = end >= sn ? end - sn + 1 : 0; k-- > 0;)
                    if (!memcmp(p + k, sp, sn)) {
                        found = k;
                        break;
                    }
                if (found == (size_t)-1) break;
                jv_list_push(rev, jv_str(p + found + sn, end - found - sn));
                end = found;
                done++;
            }
            jv_list_push(rev, jv_str(p, end));
            for (size_t k = rev.u.l->n; k-- > 0;) jv_list_push(parts, jv_retain(rev.u.l->items[k]));
            jv_release(rev);
        }
    } else {
        /* runs of whitespace; leading/trailing whitespace yields nothing */
        struct jv rev = jv_list_new(0);
        int64_t done = 0;
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                uint32_t cp;
                size_t k;
                while (i < n && (k = utf8_decode_lossy(p + i, n - i, &cp), py_isspace(cp))) i += k;
                if (i >= n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    size_t e = n;
                    struct jv rest = jv_str(p + i, e - i);
                    struct jv t = jstr_strip(rest, NULL, 0, 1);
                    jv_release(rest);
                    jv_list_push(parts, t);
                    break;
                }
                size_t st = i;
                while (i < n && (k = utf8_decode_lossy(p + i, n - i, &cp), !py_isspace(cp))) i += k;
                jv_list_push(parts, jv_str(p + st, i - st));
                done++;
            }
        } else {
            struct jv whole = jstr_strip(*self, NULL, 0, 1);
            const char *q = whole.u.s->data;
            size_t end = whole.u.s->len;
            while (end > 0) {
                if (maxsplit >= 0 && done >= maxsplit) {
                    struct jv rest = jv_str(q, end);
                    jv_list_push(rev, jstr_strip(rest, NULL, 1, 0));
                    jv_release(rest);
                    end = 0;
                    break;
                }
                size_t st = end;
                while (st > 0) {
                    size_t b = utf8_prev(q, 0, st);
                    uint32_t cp;
                    utf8_decode_lossy(q + b, st - b, &cp);
                    if (py_isspace(cp)) break;
                    st = b;
                }
                jv_list_push(rev, jv_str(q + st, end - st));
                done++;
                end = st;
                while (end > 0) {
                    size_t b = utf8_prev(q, 0, end);
                    uint32_t cp;
                    utf8_decode_lossy(q + b, end - b, &cp);
                    if (!py_isspace(cp)) break;
                    end = b;
                }
            }
            jv_release(whole);
            for (size_t k = rev.u.l->n; k-- > 0;) jv_list_push(parts, jv_retain(rev.u.l->items[k]));
        }
        jv_release(rev);
    }
    *out = parts;
    return 0;
}
static int m_split(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_split_common(c, s, a, o, 0); }
static int m_rsplit(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_split_common(c, s, a, o, 1); }

static int m_splitlines(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const struct jv *keep = jargs_get(a, 0, "keepends");
    if (jargs_check(ctx, a, 1, "splitlines")) return -1;
    int keepends = keep && jv_truthy(*keep);
    const char *p = SELF_S;
    size_t n = SELF_N, st = 0;
    struct jv l = jv_list_new(0);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode_lossy(p + i, n - i, &cp);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i += k;
            continue;
        }
        size_t e = i + k;
        if (cp == '\r' && e < n && p[e] == '\n') e++;
        jv_list_push(l, jv_str(p + st, (keepends ? e : i) - st));
        st = i = e;
    }
    if (st < n) jv_list_push(l, jv_str(p + st, n - st));
    *out = l;
    return 0;
}

static int affix(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int end, const char *what) {
    const struct jv *x = jargs_get(a, 0, NULL);
    if (!x || jargs_check(ctx, a, 1, what)) return x ? -1 : jctx_fail(ctx, "%s() takes at least 1 argument", what);
    const struct jv *cands = x;
    size_t nc = 1;
    if (jv_is_list(*x)) {
        cands = x->u.l->items;
        nc = x->u.l->n;
    }
    int r = 0;
    for (size_t i = 0; i < nc && !r; i++) {
        if (cands[i].type != JV_STR)
            return jctx_fail(ctx, "%s first arg must be str or a tuple of str, not %s", what, jv_type_name(cands[i]));
        size_t k = cands[i].u.s->len;
        r = k <= SELF_N && !memcmp(SELF_S + (end ? SELF_N - k : 0), cands[i].u.s->data, k);
    }
    *out = jv_bool(r);
    return 0;
}
static int m_startswith(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return affix(c, s, a, o, 0, "startswith"); }
static int m_endswith(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return affix(c, s, a, o, 1, "endswith"); }

static int m_removeaffix(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int end) {
    const struct jv *x = jargs_get(a, 0, NULL);
    if (want_str(ctx, x, end ? "removesuffix" : "removeprefix") || jargs_check(ctx, a, 1, "removeprefix")) return -1;
    size_t k = x->u.s->len;
    if (k <= SELF_N && !memcmp(SELF_S + (end ? SELF_N - k : 0), x->u.s->data, k))
        *out = jv_str(SELF_S + (end ? 0 : k), SELF_N - k);
    else
        *out = jv_retain(*self);
    return 0;
}
static int m_removeprefix(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_removeaffix(c, s, a, o, 0); }
static int m_removesuffix(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_removeaffix(c, s, a, o, 1); }

static int m_replace(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const struct jv *old = jargs_get(a, 0, NULL), *rep = jargs_get(a, 1, NULL), *cnt = jargs_get(a, 2, "count");
    if (want_str(ctx, old, "replace") || want_str(ctx, rep, "replace") || jargs_check(ctx, a, 3, "replace")) return -1;
    int64_t count = cnt && cnt->type == JV_INT ? cnt->u.i : -1;
    *out = jstr_replace(ctx, *self, *old, *rep, count);
    if (out->type == JV_UNDEFINED) return -1;
    return jctx_step(ctx, out->u.s->len);
}

static int m_find_common(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int right, int strict,
                         const char *what) {
    const struct jv *sub = jargs_get(a, 0, NULL);
    if (want_str(ctx, sub, what) || jargs_check(ctx, a, 1, what)) return -1;
    const char *p = SELF_S, *q = sub->u.s->data;
    size_t n = SELF_N, k = sub->u.s->len;
    int64_t found = -1;
    if (k <= n) {
        if (!right) {
            const char *hit = memmem(p, n, q, k);
            if (hit) found = (int64_t)utf8_count(p, (size_t)(hit - p));
        } else {
            for (size_t i = n - k + 1; i-- > 0;)
                if (!memcmp(p + i, q, k)) {
                    found = (int64_t)utf8_count(p, i);
                    break;
                }
        }
    }
    if (found < 0 && strict) return jctx_fail(ctx, "substring not found");
    *out = jv_int(found);
    return jctx_step(ctx, n);
}
static int m_find(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_find_common(c, s, a, o, 0, 0, "find"); }
static int m_rfind(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_find_common(c, s, a, o, 1, 0, "rfind"); }
static int m_index(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_find_common(c, s, a, o, 0, 1, "index"); }
static int m_rindex(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_find_common(c, s, a, o, 1, 1, "rindex"); }

static int m_count(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const struct jv *sub = jargs_get(a, 0, NULL);
    if (want_str(ctx, sub, "count") || jargs_check(ctx, a, 1, "count")) return -1;
    size_t k = sub->u.s->len;
    if (k == 0) {
        *out = jv_int((int64_t)utf8_count(SELF_S, SELF_N) + 1);
        return 0;
    }
    int64_t c = 0;
    for (size_t i = 0; i + k <= SELF_N;) {
        const char *hit = memmem(SELF_S + i, SELF_N - i, sub->u.s->data, k);
        if (!hit) break;
        c++;
        i = (size_t)(hit - SELF_S) + k;
    }
    *out = jv_int(c);
    return jctx_step(ctx, SELF_N);
}

static int m_join(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const struct jv *it = jargs_get(a, 0, NULL);
    if (!it || jargs_check(ctx, a, 1, "join")) return it ? -1 : jctx_fail(ctx, "join() takes exactly one argument");
    struct jv items;
    if (jinja_iterate(ctx, it, &items)) return -1;
    struct buf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        const struct jv *x = &items.u.l->items[i];
        if (x->type != JV_STR) {
            jctx_fail(ctx, "sequence item %zu: expected str instance, %s found", i, jv_type_name(*x));
            buf_free(&b);
            jv_release(items);
            return -1;
        }
        if (i) buf_append(&b, SELF_S, SELF_N);
        buf_append(&b, x->u.s->data, x->u.s->len);
        if (jctx_check_len(ctx, b.len)) {
            buf_free(&b);
            jv_release(items);
            return -1;
        }
    }
    jv_release(items);
    *out = jv_take_buf(&b);
    return jctx_step(ctx, out->u.s->len);
}

/* str.format with {}, {0}, {name}, {{ and }}; conversions and format
 * specs beyond !s/!r are not interpreted. */
static int m_format(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out) {
    const char *p = SELF_S;
    size_t n = SELF_N, auto_idx = 0;
    struct buf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '}') {
            if (i + 1 < n && p[i + 1] == '}') {
                buf_push(&b, '}');
                i++;
                continue;
            }
            buf_free(&b);
            return jctx_fail(ctx, "Single '}' encountered in format string");
        }
        if (c != '{') {
            buf_push(&b, c);
            continue;
        }
        if (i + 1 < n && p[i + 1] == '{') {
            buf_push(&b, '{');
            i++;
            continue;
        }
        const char *close = memchr(p + i, '}', n - i);
        if (!close) {
            buf_free(&b);
            return jctx_fail(ctx, "Single '{' encountered in format string");
        }
        size_t fl = (size_t)(close - (p + i + 1));
        char field[128];
        if (fl >= sizeof field) fl = sizeof field - 1;
        memcpy(field, p + i + 1, fl);
        field[fl] = 0;
        char *conv = strchr(field, '!'), *spec = strchr(field, ':');
        int repr = conv && conv[1] == 'r';
        if (conv) *conv = 0;
        if (spec) *spec = 0;
        const struct jv *v = NULL;
        if (!field[0]) {
            v = auto_idx < a->npos ? &a->pos[auto_idx] : NULL;
            auto_idx++;
        } else if (field[0] >= '0' && field[0] <= '9') {
            size_t k = (size_t)strtoul(field, NULL, 10);
            v = k < a->npos ? &a->pos[k] : NULL;
        } else {
            for (size_t k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwnames[k], field)) v = &a->kw[k];
        }
        if (!v) {
            buf_free(&b);
            return jctx_fail(ctx, "format: missing argument for field '%s'", field);
        }
        if (repr)
            jv_write_repr(&b, *v);
        else
            jv_write_str(&b, *v);
        if (jctx_check_len(ctx, b.len)) {
            buf_free(&b);
            return -1;
        }
        i = (size_t)(close - p);
    }
    *out = jv_take_buf(&b);
    return 0;
}

/* kind: 0 isalpha, 1 isdigit, 2 isalnum, 3 isspace, 4 islower, 5 isupper, 6 isnumeric/isdecimal */
static int m_is(struct jctx *ctx, const struct jv *self, struct jargs *a, struct jv *out, int kind) {
    if (jargs_check(ctx, a, 0, "is*")) return -1;
    const char *p = SELF_S;
    size_t n = SELF_N;
    int ok = n > 0, any_cased = 0;
    for (size_t i = 0; i < n && ok;) {
        uint32_t cp;
        i += utf8_decode_lossy(p + i, n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        int alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        int numeric = digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 0: ok = alpha; break;
        case 1: ok = digit; break;
        case 2: ok = alpha || numeric; break;
        case 3: ok = py_isspace(cp); break;
        case 4:
            if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) ok = 0;
            if (c == UTF8PROC_CATEGORY_LL) any_cased = 1;
            break;
        case 5:
            if (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) ok = 0;
            if (c == UTF8PROC_CATEGORY_LU) any_cased = 1;
            break;
        default: ok = numeric; break;
        }
    }
    if (kind == 4 || kind == 5) ok = ok && any_cased;
    *out = jv_bool(ok);
    return 0;
}
static int m_isalpha(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 0); }
static int m_isdigit(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 1); }
static int m_isalnum(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 2); }
static int m_isspace(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 3); }
static int m_islower(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 4); }
static int m_isupper(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 5); }
static int m_isnumeric(struct jctx *c, const struct jv *s, struct jargs *a, struct jv *o) { return m_is(c, s, a, o, 6); }

jfunc_fn jinja_str_method(const char *name);
jfunc_fn jinja_str_method(const char *name) {
    static const struct {
        const char *name;
        jfunc_fn fn;
    } methods[] = {
        {"strip", m_strip},         {"lstrip", m_lstrip},         {"rstrip", m_rstrip},
        {"lower", m_lower},         {"upper", m_upper},           {"title", m_title},
        {"capitalize", m_capitalize}, {"swapcase", m_swapcase},   {"split", m_split},
        {"rsplit", m_rsplit},       {"splitlines", m_splitlines}, {"startswith", m_startswith},
        {"endswith", m_endswith},   {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
        {"replace", m_replace},     {"find", m_find},             {"rfind", m_rfind},
        {"index", m_index},         {"rindex", m_rindex},         {"count", m_count},
        {"join", m_join},           {"format", m_format},         {"isalpha", m_isalpha},
        {"isdigit", m_isdigit},     {"isalnum", m_isalnum},       {"isspace", m_isspace},
        {"islower", m_islower},     {"isupper", m_isupper},       {"isnumeric", m_isnumeric},
        {"isdecimal", m_isdigit},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (!strcmp(methods[i].name, name)) return methods[i].fn;
    return NULL;
}
