/* json_schema_scalar.c — strings, formats, numbers and constants of the JSON
 * Schema translator (see json_schema_internal.h).
 *
 * Integer bounds become digit-range grammars: the numerals of [lo, hi] are
 * split by length, and numerals of one length by their first differing
 * digit, so "minimum": 18, "maximum": 120 reads
 * ("1" [8-9] | [2-9] [0-9] | "1" ( [0-1] [0-9] | "20" )). Number bounds are
 * enforced when they are integers: the integer part is ranged the same way
 * and the fraction constrained at the ends (x <= 5 allows 5, 5.0, 5.00 but
 * not 5.1); such numbers are written without an exponent. Other number
 * bounds are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "grammar/json_schema_internal.h"
#include "grammar/regex.h"

enum { JS_MAX_LENGTH = 100000 };
#define JS_MAX_BOUND 1e18 /* integer bounds beyond it would overflow int64 arithmetic */

/* ---- strings ---- */

void js_canon_string(struct buf *out, const char *s, size_t n) {
    buf_push(out, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"': buf_puts(out, "\\\""); break;
        case '\\': buf_puts(out, "\\\\"); break;
        case '\b': buf_puts(out, "\\b"); break;
        case '\f': buf_puts(out, "\\f"); break;
        case '\n': buf_puts(out, "\\n"); break;
        case '\r': buf_puts(out, "\\r"); break;
        case '\t': buf_puts(out, "\\t"); break;
        default:
            if (ch < 0x20) buf_printf(out, "\\u%04x", ch);
            else buf_push(out, (char)ch);
        }
    }
    buf_push(out, '"');
}

/* The formats, as expressions over the string's inside. */
static const char fmt_date[] =
    "([0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])"
    " | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\")"
    " | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))"
    " | ([0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | ([02468] [048] | [13579] [26]) \"00\") \"-02-29\")";
static const char fmt_time[] =
    "(([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)?"
    " ([Zz] | [+\\x2D] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9]))";
static const char fmt_email[] =
    "([A-Za-z0-9!#$%&'*+/=?\\x5E_`{|}~\\x2D]+ (\".\" [A-Za-z0-9!#$%&'*+/=?\\x5E_`{|}~\\x2D]+)* \"@\""
    " [A-Za-z0-9] ([A-Za-z0-9\\x2D]* [A-Za-z0-9])? (\".\" [A-Za-z0-9] ([A-Za-z0-9\\x2D]* [A-Za-z0-9])?)*)";
static const char fmt_uuid[] =
    "([0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12})";
#define IPV4_OCTET "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])"
static const char fmt_ipv4[] = IPV4_OCTET;
/* RFC 3986's URI: scheme ":" hier-part ["?" query] ["#" fragment], where
 * hier-part is "//" authority path-abempty, path-absolute, path-rootless or
 * empty, and the authority [userinfo "@"] host [":" port], the host an
 * IP-literal ("[" IPv6address or IPvFuture "]") or a reg-name (which holds
 * IPv4address). '[' and ']' only around an IP-literal, one '#'. */
#define URI_PCT "\"%\" [0-9a-fA-F] [0-9a-fA-F]"
#define URI_PCHAR "([A-Za-z0-9._~!$&'()*+,;=:@\\x2D] | " URI_PCT ")"
#define URI_H16 "[0-9a-fA-F]{1,4}"
#define URI_H16C "(" URI_H16 " \":\")"
#define URI_IPV4 "(" IPV4_OCTET " \".\" " IPV4_OCTET " \".\" " IPV4_OCTET " \".\" " IPV4_OCTET ")"
#define URI_LS32 "(" URI_H16 " \":\" " URI_H16 " | " URI_IPV4 ")"
static const char fmt_uri[] =
    "([A-Za-z] [A-Za-z0-9+.\\x2D]* \":\""
    " (\"//\" (([A-Za-z0-9._~!$&'()*+,;=:\\x2D] | " URI_PCT ")* \"@\")?"
    " (\"[\" (" URI_H16C "{6} " URI_LS32
    " | \"::\" " URI_H16C "{5} " URI_LS32
    " | (" URI_H16 ")? \"::\" " URI_H16C "{4} " URI_LS32
    " | (" URI_H16C "{0,1} " URI_H16 ")? \"::\" " URI_H16C "{3} " URI_LS32
    " | (" URI_H16C "{0,2} " URI_H16 ")? \"::\" " URI_H16C "{2} " URI_LS32
    " | (" URI_H16C "{0,3} " URI_H16 ")? \"::\" " URI_H16C " " URI_LS32
    " | (" URI_H16C "{0,4} " URI_H16 ")? \"::\" " URI_LS32
    " | (" URI_H16C "{0,5} " URI_H16 ")? \"::\" " URI_H16
    " | (" URI_H16C "{0,6} " URI_H16 ")? \"::\""
    " | [vV] [0-9a-fA-F]+ \".\" [A-Za-z0-9._~!$&'()*+,;=:\\x2D]+) \"]\""
    " | ([A-Za-z0-9._~!$&'()*+,;=\\x2D] | " URI_PCT ")*) (\":\" [0-9]*)? (\"/\" " URI_PCHAR "*)*"
    " | \"/\" (" URI_PCHAR "+ (\"/\" " URI_PCHAR "*)*)?"
    " | " URI_PCHAR "+ (\"/\" " URI_PCHAR "*)*)?"
    " (\"?\" (" URI_PCHAR " | [/?])*)? (\"#\" (" URI_PCHAR " | [/?])*)?)";

static int put_format(struct js_ctx *c, const char *f, struct buf *out) {
    int r = js_new_rule(c);
    struct buf b = {0};
    buf_puts(&b, "\"\\\"\" ");
    if (!strcmp(f, "date")) buf_puts(&b, fmt_date);
    else if (!strcmp(f, "time")) buf_puts(&b, fmt_time);
    else if (!strcmp(f, "date-time")) buf_printf(&b, "%s [Tt] %s", fmt_date, fmt_time);
    else if (!strcmp(f, "email")) buf_puts(&b, fmt_email);
    else if (!strcmp(f, "uuid")) buf_puts(&b, fmt_uuid);
    else if (!strcmp(f, "uri")) buf_puts(&b, fmt_uri);
    else if (!strcmp(f, "ipv4")) buf_printf(&b, "%s \".\" %s \".\" %s \".\" %s", fmt_ipv4, fmt_ipv4, fmt_ipv4, fmt_ipv4);
    else {
        buf_free(&b);
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: format '%s' at %s is not supported (supported: date, time, "
                           "date-time, email, uuid, uri, ipv4)", f, js_where(c));
    }
    buf_puts(&b, " \"\\\"\"");
    js_add_rule(c, r, b.data, b.len);
    buf_free(&b);
    js_put_rule_ref(out, r);
    return JS_OK;
}

/* A non-negative integer keyword (minLength ...): -1 when absent. */
static int get_count(struct js_ctx *c, const json_t *s, const char *key, long long *v) {
    const json_t *x = json_object_get(s, key);
    *v = -1;
    if (!x) return 0;
    double d = json_is_integer(x) ? (double)json_integer_value(x) : json_is_real(x) ? json_real_value(x) : -1;
    if (d < 0 || d != floor(d))
        return kiln_errorf(c->err, "json_schema: '%s' at %s must be a non-negative integer", key, js_where(c));
    if (d > JS_MAX_LENGTH)
        return kiln_errorc(c->err, KILN_ERR_TOO_LARGE, "json_schema: '%s' at %s is above %d", key, js_where(c),
                           JS_MAX_LENGTH);
    *v = (long long)d;
    return 0;
}

int js_gen_string(struct js_ctx *c, const json_t *s, struct buf *out) {
    long long mn, mx;
    if (get_count(c, s, "minLength", &mn) || get_count(c, s, "maxLength", &mx)) return JS_ERR;
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (pat && !json_is_string(pat))
        return kiln_errorf(c->err, "json_schema: 'pattern' at %s must be a string", js_where(c));
    if (fmt && !json_is_string(fmt))
        return kiln_errorf(c->err, "json_schema: 'format' at %s must be a string", js_where(c));
    int n_kinds = (pat != NULL) + (fmt != NULL) + (mn > 0 || mx >= 0);
    if (n_kinds > 1)
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: at %s, only one of 'pattern', 'format' and 'minLength'/'maxLength' "
                           "is supported on one string", js_where(c));
    if (fmt) return put_format(c, json_string_value(fmt), out);
    if (pat) {
        struct buf e = {0};
        if (regex_to_ebnf_expr(json_string_value(pat), json_string_length(pat), REGEX_JSON, &e, c->err)) {
            buf_free(&e);
            return kiln_error_prefix(c->err, "json_schema: 'pattern' at %s", js_where(c));
        }
        buf_puts(out, "\"\\\"\" ");
        buf_append(out, e.data, e.len);
        buf_puts(out, " \"\\\"\"");
        buf_free(&e);
        return JS_OK;
    }
    if (mx >= 0 && mn > mx) return JS_NEVER;
    if (mn <= 0 && mx < 0) {
        c->used |= JSC_STRING;
        buf_puts(out, "string");
        return JS_OK;
    }
    /* counted characters are written canonically: one form per character
     * keeps the grammar small (the engine expands the repetition) */
    c->used |= JSC_CCHAR;
    if (mn < 0) mn = 0;
    if (mx < 0) buf_printf(out, "\"\\\"\" cchar{%lld,} \"\\\"\"", mn);
    else if (mx == mn) buf_printf(out, "\"\\\"\" cchar{%lld} \"\\\"\"", mn);
    else buf_printf(out, "\"\\\"\" cchar{%lld,%lld} \"\\\"\"", mn, mx);
    return JS_OK;
}

/* ---- numbers ---- */

/* Digit strings a and b of length n (a <= b): the strings between them,
 * leading zeros allowed (the caller picks lengths so none occurs). */
static void put_digits_between(struct buf *out, const char *a, const char *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    if (i == n) {
        buf_printf(out, "\"%.*s\"", n, a);
        return;
    }
    if (i > 0) buf_printf(out, "\"%.*s\" ", i, a);
    a += i, b += i, n -= i;
    if (n == 1) {
        buf_printf(out, "[%c-%c]", a[0], b[0]);
        return;
    }
    int lo_zero = 1, hi_nine = 1;
    for (int k = 1; k < n; k++) {
        if (a[k] != '0') lo_zero = 0;
        if (b[k] != '9') hi_nine = 0;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int alts = 0;
    struct buf t = {0};
    if (!lo_zero) {
        buf_printf(&t, "\"%c\" ", a[0]);
        put_digits_between(&t, a + 1, nines, n - 1);
        alts++;
    }
    char s = (char)(a[0] + !lo_zero), e = (char)(b[0] - !hi_nine);
    if (s <= e) {
        if (alts++) buf_puts(&t, " | ");
        if (s == e) buf_printf(&t, "\"%c\"", s);
        else buf_printf(&t, "[%c-%c]", s, e);
        if (n == 2) buf_puts(&t, " [0-9]");
        else buf_printf(&t, " [0-9]{%d}", n - 1);
    }
    if (!hi_nine) {
        if (alts++) buf_puts(&t, " | ");
        buf_printf(&t, "\"%c\" ", b[0]);
        put_digits_between(&t, zeros, b + 1, n - 1);
    }
    if (alts > 1) buf_printf(out, "(%s)", t.data);
    else buf_append(out, t.data, t.len);
    buf_free(&t);
}

/* The numerals (no leading zeros) of [lo, hi], or of [lo, inf) when
 * unbounded, as alternatives appended to alts; returns their count. */
static int put_uint_range(struct buf *alts, int n_alts, uint64_t lo, uint64_t hi, int unbounded) {
    char los[24], his[24];
    int L = snprintf(los, sizeof los, "%llu", (unsigned long long)lo);
    int H = unbounded ? L : snprintf(his, sizeof his, "%llu", (unsigned long long)hi);
    uint64_t p = 1;
    for (int k = 1; k < L; k++) p *= 10; /* 10^(L-1) */
    for (int k = L; k <= H; k++, p *= 10) {
        char a[24], b[24];
        uint64_t klo = k == L ? lo : p;
        uint64_t khi = (k == H && !unbounded) ? hi : p * 10 - 1;
        snprintf(a, sizeof a, "%llu", (unsigned long long)klo);
        snprintf(b, sizeof b, "%llu", (unsigned long long)khi);
        if (n_alts++) buf_puts(alts, " | ");
        put_digits_between(alts, a, b, k);
    }
    if (unbounded) {
        if (n_alts++) buf_puts(alts, " | ");
        buf_printf(alts, "[1-9] [0-9]{%d,}", L);
    }
    return n_alts;
}

struct bound {
    int has;    /* 0: unbounded */
    double v;
    int excl;
    const char *key; /* the keyword v came from */
};

/* minimum / exclusiveMinimum (or the maximum pair, upper = 1) as one
 * bound: the stricter when both are given. exclusiveMinimum may be a
 * number (draft 6 on) or a boolean qualifying minimum (draft 4). */
static int get_bound(struct js_ctx *c, const json_t *s, int upper, struct bound *b) {
    const char *inc_key = upper ? "maximum" : "minimum";
    const char *exc_key = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    const json_t *inc = json_object_get(s, inc_key), *exc = json_object_get(s, exc_key);
    memset(b, 0, sizeof *b);
    if (inc) {
        if (!json_is_number(inc)) return kiln_errorf(c->err, "json_schema: '%s' at %s must be a number", inc_key, js_where(c));
        b->has = 1;
        b->v = json_number_value(inc);
        b->key = inc_key;
    }
    if (exc && json_is_boolean(exc)) {
        if (json_is_true(exc)) {
            if (!inc)
                return kiln_errorf(c->err, "json_schema: '%s': true at %s needs '%s'", exc_key, js_where(c), inc_key);
            b->excl = 1;
        }
    } else if (exc) {
        if (!json_is_number(exc)) return kiln_errorf(c->err, "json_schema: '%s' at %s must be a number", exc_key, js_where(c));
        double v = json_number_value(exc);
        if (!b->has || (upper ? v <= b->v : v >= b->v)) {
            b->has = 1;
            b->v = v;
            b->excl = 1;
            b->key = exc_key;
        }
    }
    if (b->has && !isfinite(b->v)) return kiln_errorf(c->err, "json_schema: bad '%s' at %s", inc_key, js_where(c));
    if (b->has && fabs(b->v) > JS_MAX_BOUND)
        return kiln_errorc(c->err, KILN_ERR_TOO_LARGE, "json_schema: '%s' at %s is beyond +-1e18", inc_key,
                           js_where(c));
    return 0;
}

static const char frac_any[] = "(\".\" [0-9]+)?", frac_zero[] = "(\".\" \"0\"+)?",
                  frac_nonzero[] = "\".\" [0-9]* [1-9] [0-9]*";

/* Non-negative numbers x with a <(=) x <(=) b (b_inf: no upper bound), as
 * alternatives; integer: no fraction. Returns the new count. */
static int put_nonneg(struct buf *alts, int n, const char *sign, uint64_t a, int a_excl, uint64_t b, int b_excl,
                      int b_inf, int integer) {
    if (integer) {
        uint64_t lo = a + (a_excl ? 1 : 0);
        if (!b_inf) {
            if (b_excl) {
                if (b == 0) return n;
                b--;
            }
            if (lo > b) return n;
        }
        if (n++) buf_puts(alts, " | ");
        buf_printf(alts, "%s(", sign);
        put_uint_range(alts, 0, lo, b, b_inf);
        buf_puts(alts, ")");
        return n;
    }
    if (!b_inf && a == b) {
        if (a_excl || b_excl) return n;
        if (n++) buf_puts(alts, " | ");
        buf_printf(alts, "%s\"%llu\" %s", sign, (unsigned long long)a, frac_zero);
        return n;
    }
    if (!b_inf && a > b) return n;
    if (n++) buf_puts(alts, " | ");
    buf_printf(alts, "%s\"%llu\" %s", sign, (unsigned long long)a, a_excl ? frac_nonzero : frac_any);
    if (b_inf || a + 1 <= b - 1) {
        if (n++) buf_puts(alts, " | ");
        buf_printf(alts, "%s(", sign);
        put_uint_range(alts, 0, a + 1, b_inf ? 0 : b - 1, b_inf);
        buf_printf(alts, ") %s", frac_any);
    }
    if (!b_inf && !b_excl) {
        if (n++) buf_puts(alts, " | ");
        buf_printf(alts, "%s\"%llu\" %s", sign, (unsigned long long)b, frac_zero);
    }
    return n;
}

int js_gen_number(struct js_ctx *c, const json_t *s, int integer, struct buf *out) {
    struct bound lo, hi;
    if (get_bound(c, s, 0, &lo) || get_bound(c, s, 1, &hi)) return JS_ERR;
    if (!lo.has && !hi.has) {
        c->used |= integer ? JSC_INT : JSC_NUMBER;
        buf_puts(out, integer ? "integer" : "number");
        return JS_OK;
    }
    if (integer) {
        /* to inclusive integer bounds */
        if (lo.has) {
            double v = lo.excl ? floor(lo.v) + 1 : ceil(lo.v);
            lo.v = v, lo.excl = 0;
        }
        if (hi.has) {
            double v = hi.excl ? ceil(hi.v) - 1 : floor(hi.v);
            hi.v = v, hi.excl = 0;
        }
    } else if ((lo.has && lo.v != floor(lo.v)) || (hi.has && hi.v != floor(hi.v))) {
        const struct bound *b = lo.has && lo.v != floor(lo.v) ? &lo : &hi;
        return kiln_errorc(c->err, KILN_ERR_UNSUPPORTED,
                           "json_schema: '%s': %g at %s is not supported (a 'number' bound must be an integer)",
                           b->key, b->v, js_where(c));
    }
    if (lo.has && hi.has && (lo.v > hi.v || (lo.v == hi.v && (lo.excl || hi.excl)))) return JS_NEVER;
    struct buf alts = {0};
    int n = 0;
    /* x >= 0 */
    if (!hi.has || hi.v >= 0) {
        int lo_pos = lo.has && lo.v >= 0;
        n = put_nonneg(&alts, n, "", lo_pos ? (uint64_t)lo.v : 0, lo_pos ? lo.excl : 0, hi.has ? (uint64_t)hi.v : 0,
                       hi.excl, !hi.has, integer);
    }
    /* x < 0, written as "-" y with y > 0 */
    if (!lo.has || lo.v < 0) {
        int hi_neg = hi.has && hi.v < 0;
        uint64_t a = hi_neg ? (uint64_t)-hi.v : 0;
        int a_excl = hi_neg ? hi.excl : 1;
        n = put_nonneg(&alts, n, "\"-\" ", a, a_excl, lo.has ? (uint64_t)-lo.v : 0, lo.excl, !lo.has, integer);
    }
    if (n == 0) {
        buf_free(&alts);
        return JS_NEVER;
    }
    int r = js_new_rule(c);
    js_add_rule(c, r, alts.data, alts.len);
    buf_free(&alts);
    js_put_rule_ref(out, r);
    return JS_OK;
}

/* A double as JSON.stringify writes it (ECMAScript Number::toString): the
 * shortest digits that read back the same, positional notation for
 * exponents -7 < e < 21. */
static void put_js_number(struct buf *out, double v) {
    if (v == 0) {
        buf_push(out, '0');
        return;
    }
    if (v < 0) {
        buf_push(out, '-');
        v = -v;
    }
    char tmp[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    char digits[24];
    int k = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0') k--;
    int e = atoi(p + 1), nn = e + 1;
    if (k <= nn && nn <= 21) {
        buf_append(out, digits, (size_t)k);
        for (int i = k; i < nn; i++) buf_push(out, '0');
    } else if (0 < nn && nn <= 21) {
        buf_append(out, digits, (size_t)nn);
        buf_push(out, '.');
        buf_append(out, digits + nn, (size_t)(k - nn));
    } else if (-6 < nn && nn <= 0) {
        buf_puts(out, "0.");
        for (int i = 0; i < -nn; i++) buf_push(out, '0');
        buf_append(out, digits, (size_t)k);
    } else {
        buf_push(out, digits[0]);
        if (k > 1) {
            buf_push(out, '.');
            buf_append(out, digits + 1, (size_t)(k - 1));
        }
        buf_printf(out, "e%c%d", nn - 1 >= 0 ? '+' : '-', abs(nn - 1));
    }
}

void js_put_const(struct js_ctx *c, const json_t *v, struct buf *out) {
    struct buf t = {0};
    const char *w = js_w(c);
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        buf_puts(out, "\"{\"");
        const char *key;
        json_t *x;
        int i = 0;
        json_object_foreach((json_t *)v, key, x) {
            if (i++) buf_printf(out, "%s\",\"", w);
            buf_puts(out, w);
            js_canon_string(&t, key, strlen(key));
            ebnf_put_lit(out, t.data, t.len);
            buf_clear(&t);
            buf_printf(out, "%s\":\"%s", w, w);
            js_put_const(c, x, out);
        }
        buf_printf(out, "%s\"}\"", w);
        break;
    }
    case JSON_ARRAY: {
        buf_puts(out, "\"[\"");
        for (size_t i = 0; i < json_array_size(v); i++) {
            buf_puts(out, w);
            if (i) buf_printf(out, "\",\"%s", w);
            js_put_const(c, json_array_get(v, i), out);
        }
        buf_printf(out, "%s\"]\"", w);
        break;
    }
    case JSON_STRING:
        js_canon_string(&t, json_string_value(v), json_string_length(v));
        ebnf_put_lit(out, t.data, t.len);
        break;
    case JSON_INTEGER: buf_printf(out, "\"%lld\"", (long long)json_integer_value(v)); break;
    case JSON_REAL:
        buf_push(out, '"');
        put_js_number(out, json_real_value(v));
        buf_push(out, '"');
        break;
    case JSON_TRUE: buf_puts(out, "\"true\""); break;
    case JSON_FALSE: buf_puts(out, "\"false\""); break;
    case JSON_NULL: buf_puts(out, "\"null\""); break;
    }
    buf_free(&t);
}

void js_put_common(struct js_ctx *c, struct buf *out) {
    unsigned u = c->used;
    if (u & JSC_VALUE) u |= JSC_STRING | JSC_NUMBER;
    if (u & JSC_STRING) u |= JSC_CHAR;
    const char *w = js_w(c);
    if (c->ws) buf_puts(out, "ws ::= [ \\t\\n\\r]*\n");
    if (u & JSC_VALUE) {
        buf_puts(out, "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n");
        buf_printf(out, "object ::= \"{\"%s(member (%s\",\"%smember)*)?%s\"}\"\n", w, w, w, w);
        buf_printf(out, "member ::= string%s\":\"%svalue\n", w, w);
        buf_printf(out, "array ::= \"[\"%s(value (%s\",\"%svalue)*)?%s\"]\"\n", w, w, w, w);
    }
    if (u & JSC_STRING) buf_puts(out, "string ::= \"\\\"\" char* \"\\\"\"\n");
    if (u & JSC_CHAR)
        /* one character: raw, a short escape, or \u with surrogates paired */
        buf_puts(out, "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3}"
                      " | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}))\n");
    if (u & JSC_CCHAR)
        /* one character as JSON.stringify writes it: raw, a short escape,
         * \u00XX for the other control characters */
        buf_puts(out, "cchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u00\" [01] [0-9a-fA-F])\n");
    if (u & JSC_NUMBER)
        buf_puts(out, "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\x2D]? [0-9]+)?\n");
    if (u & JSC_INT) buf_puts(out, "integer ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n");
}
