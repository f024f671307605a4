/* regex.c — regular expressions (an ECMAScript / Python `re` subset) to EBNF.
 *
 * The pattern is parsed into a tree whose leaves are sets of code points
 * (a literal is a one-element set), so `.`, \d, [^a-z] and friends are all
 * one kind of node; negation is computed here over the whole Unicode range
 * less the surrogates, never left to the grammar engine. Anything whose
 * meaning differs between ECMAScript and Python in a way that matters
 * ("[]" and "[^]", a possessive quantifier) or that no context-free grammar
 * of this form can express (backreferences, lookaround, anchors inside the
 * pattern) is refused with its byte offset. See regex.h for the two output
 * modes.
 */
#include "grammar/regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "grammar/grammar.h"

enum {
    RX_MAX_DEPTH = 64,     /* nested groups: a bound for the recursive parser */
    RX_MAX_REPEAT = 1000,  /* {m,n} bounds: the grammar engine expands them */
    CP_MAX = 0x10FFFF,
};

struct rx_range {
    uint32_t lo, hi;
};

enum rx_kind { RX_SET, RX_CAT, RX_ALT, RX_REP };

struct rx_node {
    enum rx_kind kind;
    int min, max;          /* RX_REP; max < 0: no upper bound */
    struct rx_range *r;    /* RX_SET: sorted, disjoint, not adjacent */
    int nr;
    struct rx_node **kid;  /* RX_CAT, RX_ALT: the parts; RX_REP: kid[0] */
    int nkid, capkid;
    int anchor_start, anchor_end; /* a top-level alternative's ^ and $ */
};

struct rx_parser {
    const char *s;
    size_t n, pos;
    int depth;
    struct kiln_error *err;
    struct rx_node **all; /* every node, for freeing */
    int nall, capall;
};

static int rx_fail(struct rx_parser *p, enum kiln_error_code code, size_t at, const char *what) {
    return kiln_errorc(p->err, code, "regex: %s at offset %zu", what, at);
}

static struct rx_node *rx_new(struct rx_parser *p, enum rx_kind kind) {
    struct rx_node *nd = xcalloc(1, sizeof *nd);
    nd->kind = kind;
    if (p->nall == p->capall) {
        p->capall = p->capall ? 2 * p->capall : 32;
        p->all = xrealloc(p->all, (size_t)p->capall * sizeof *p->all);
    }
    p->all[p->nall++] = nd;
    return nd;
}

static void rx_add_kid(struct rx_node *nd, struct rx_node *k) {
    if (nd->nkid == nd->capkid) {
        nd->capkid = nd->capkid ? 2 * nd->capkid : 4;
        nd->kid = xrealloc(nd->kid, (size_t)nd->capkid * sizeof *nd->kid);
    }
    nd->kid[nd->nkid++] = k;
}

static void rx_free_all(struct rx_parser *p) {
    for (int i = 0; i < p->nall; i++) {
        free(p->all[i]->r);
        free(p->all[i]->kid);
        free(p->all[i]);
    }
    free(p->all);
}

/* ---- code-point sets ---- */

struct cpset {
    struct rx_range *r;
    int n, cap;
};

static void cps_add(struct cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->r = xrealloc(s->r, (size_t)s->cap * sizeof *s->r);
    }
    s->r[s->n++] = (struct rx_range){lo, hi};
}

static int range_cmp(const void *a, const void *b) {
    const struct rx_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or adjacent ranges. */
static void cps_normalize(struct cpset *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, range_cmp);
    int w = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi) s->r[w].hi = s->r[i].hi;
        } else {
            s->r[++w] = s->r[i];
        }
    }
    s->n = w + 1;
}

/* The complement over U+0000..U+10FFFF less the surrogates (which UTF-8
 * cannot carry); s must be normalized. */
static void cps_negate(struct cpset *s) {
    struct cpset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) cps_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX) cps_add(&o, next, CP_MAX);
    free(s->r);
    *s = o;
    /* cut the surrogates out */
    struct cpset c = {0};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        if (hi < 0xD800 || lo > 0xDFFF) {
            cps_add(&c, lo, hi);
            continue;
        }
        if (lo < 0xD800) cps_add(&c, lo, 0xD7FF);
        if (hi > 0xDFFF) cps_add(&c, 0xE000, hi);
    }
    free(s->r);
    *s = c;
}

static void cps_class_escape(struct cpset *s, char c) {
    switch (c) {
    case 'd': cps_add(s, '0', '9'); break;
    case 'w':
        cps_add(s, '0', '9');
        cps_add(s, 'A', 'Z');
        cps_add(s, '_', '_');
        cps_add(s, 'a', 'z');
        break;
    case 's': /* ECMAScript WhiteSpace and LineTerminator */
        cps_add(s, 0x09, 0x0D);
        cps_add(s, 0x20, 0x20);
        cps_add(s, 0xA0, 0xA0);
        cps_add(s, 0x1680, 0x1680);
        cps_add(s, 0x2000, 0x200A);
        cps_add(s, 0x2028, 0x2029);
        cps_add(s, 0x202F, 0x202F);
        cps_add(s, 0x205F, 0x205F);
        cps_add(s, 0x3000, 0x3000);
        cps_add(s, 0xFEFF, 0xFEFF);
        break;
    default: { /* D W S: the complement of the lower-case set */
        struct cpset t = {0};
        cps_class_escape(&t, (char)(c + ('a' - 'A')));
        cps_normalize(&t);
        cps_negate(&t);
        for (int i = 0; i < t.n; i++) cps_add(s, t.r[i].lo, t.r[i].hi);
        free(t.r);
    }
    }
}

static struct rx_node *rx_set_node(struct rx_parser *p, struct cpset *s) {
    cps_normalize(s);
    struct rx_node *nd = rx_new(p, RX_SET);
    nd->r = s->r;
    nd->nr = s->n;
    s->r = NULL;
    s->n = s->cap = 0;
    return nd;
}

/* ---- parsing ---- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads exactly `digits` hex digits at p->pos; -1 when they are not there. */
static long rx_hex(struct rx_parser *p, int digits) {
    if (p->pos + (size_t)digits > p->n) return -1;
    long v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexval(p->s[p->pos + (size_t)i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    p->pos += (size_t)digits;
    return v;
}

/* One code point of the pattern at p->pos (a literal, UTF-8 checked). */
static int rx_literal_cp(struct rx_parser *p, uint32_t *cp) {
    size_t el;
    int inc;
    size_t k = utf8_next((const unsigned char *)p->s + p->pos, p->n - p->pos, &el, &inc);
    if (!k) return rx_fail(p, KILN_ERR_BAD_INPUT, p->pos, "invalid UTF-8");
    utf8_decode(p->s + p->pos, cp);
    p->pos += k;
    return 0;
}

/* An escape after the backslash (p->pos is past it). Sets *cp for a single
 * character, or fills *set (and *is_set = 1) for a class escape.
 * in_class: inside [...], where \b is a backspace. */
static int rx_escape(struct rx_parser *p, int in_class, uint32_t *cp, struct cpset *set, int *is_set) {
    size_t at = p->pos - 1;
    *is_set = 0;
    if (p->pos >= p->n) return rx_fail(p, KILN_ERR_BAD_INPUT, at, "'\\' at the end of the pattern");
    char c = p->s[p->pos++];
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        cps_class_escape(set, c);
        *is_set = 1;
        return 0;
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0':
        if (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
            return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "octal escape is not supported");
        *cp = 0;
        return 0;
    case 'x': {
        long v = rx_hex(p, 2);
        if (v < 0) return rx_fail(p, KILN_ERR_BAD_INPUT, at, "'\\x' needs two hex digits");
        *cp = (uint32_t)v;
        return 0;
    }
    case 'u': {
        long v;
        if (p->pos < p->n && p->s[p->pos] == '{') {
            p->pos++;
            v = 0;
            size_t start = p->pos;
            while (p->pos < p->n && hexval(p->s[p->pos]) >= 0 && v <= CP_MAX) v = v * 16 + hexval(p->s[p->pos++]);
            if (p->pos == start || p->pos >= p->n || p->s[p->pos] != '}' || v > CP_MAX)
                return rx_fail(p, KILN_ERR_BAD_INPUT, at, "bad '\\u{...}' escape");
            p->pos++;
        } else {
            v = rx_hex(p, 4);
            if (v < 0) return rx_fail(p, KILN_ERR_BAD_INPUT, at, "'\\u' needs four hex digits");
            /* a surrogate pair written as two escapes is one code point */
            if (v >= 0xD800 && v <= 0xDBFF && p->pos + 6 <= p->n && p->s[p->pos] == '\\' &&
                p->s[p->pos + 1] == 'u') {
                size_t save = p->pos;
                p->pos += 2;
                long lo = rx_hex(p, 4);
                if (lo >= 0xDC00 && lo <= 0xDFFF) v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                else p->pos = save;
            }
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "a lone surrogate escape is not supported");
        *cp = (uint32_t)v;
        return 0;
    }
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "word boundary '\\b' is not supported");
    case 'B': return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "'\\B' is not supported");
    case 'A': case 'Z': case 'z': case 'G':
        return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "anchor escapes are not supported");
    case 'k':
        return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "backreference is not supported");
    case 'p': case 'P':
        return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "Unicode property escapes are not supported");
    case 'c': return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "'\\c' control escapes are not supported");
    default:
        if (c >= '1' && c <= '9') return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "backreference is not supported");
        /* identity escapes: ASCII punctuation only (ECMAScript's u flag
         * refuses \a, \e, \q...; Python gives some of them other meanings) */
        if ((unsigned char)c < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) &&
            c > 0x20 && c < 0x7F) {
            *cp = (uint32_t)(unsigned char)c;
            return 0;
        }
        return rx_fail(p, KILN_ERR_BAD_INPUT, at, "unknown escape");
    }
}

static int rx_class(struct rx_parser *p, struct rx_node **out) {
    size_t at = p->pos; /* at '[' */
    p->pos++;
    int neg = 0;
    if (p->pos < p->n && p->s[p->pos] == '^') {
        neg = 1;
        p->pos++;
    }
    if (p->pos < p->n && p->s[p->pos] == ']')
        return rx_fail(p, KILN_ERR_UNSUPPORTED, p->pos,
                       "']' first in a class (ECMAScript and Python read it differently)");
    struct cpset s = {0};
    for (;;) {
        if (p->pos >= p->n) {
            free(s.r);
            return rx_fail(p, KILN_ERR_BAD_INPUT, at, "unterminated '['");
        }
        if (p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        uint32_t lo;
        int is_set = 0;
        size_t item_at = p->pos;
        if (p->s[p->pos] == '\\') {
            p->pos++;
            if (rx_escape(p, 1, &lo, &s, &is_set)) goto fail;
        } else if (rx_literal_cp(p, &lo)) {
            goto fail;
        }
        /* a range a-z (a '-' before ']' is a literal) */
        if (p->pos + 1 < p->n && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            if (is_set) {
                rx_fail(p, KILN_ERR_BAD_INPUT, item_at, "a class escape cannot start a range");
                goto fail;
            }
            p->pos++;
            uint32_t hi;
            int hi_set = 0;
            size_t hi_at = p->pos;
            if (p->s[p->pos] == '\\') {
                p->pos++;
                struct cpset junk = {0};
                int r = rx_escape(p, 1, &hi, &junk, &hi_set);
                free(junk.r);
                if (r) goto fail;
            } else if (rx_literal_cp(p, &hi)) {
                goto fail;
            }
            if (hi_set) {
                rx_fail(p, KILN_ERR_BAD_INPUT, hi_at, "a class escape cannot end a range");
                goto fail;
            }
            if (hi < lo) {
                rx_fail(p, KILN_ERR_BAD_INPUT, item_at, "range out of order in class");
                goto fail;
            }
            cps_add(&s, lo, hi);
        } else if (!is_set) {
            cps_add(&s, lo, lo);
        }
    }
    cps_normalize(&s);
    if (neg) cps_negate(&s);
    *out = rx_set_node(p, &s);
    return 0;
fail:
    free(s.r);
    return -1;
}

static int rx_alt(struct rx_parser *p, int top, struct rx_node **out);

/* Reads a decimal number for {m,n}; -1 when there is none. */
static long rx_number(struct rx_parser *p) {
    size_t start = p->pos;
    long v = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        if (v <= 100000) v = v * 10 + (p->s[p->pos] - '0');
        p->pos++;
    }
    return p->pos == start ? -1 : v;
}

/* A {m}, {m,} or {m,n} at p->pos: 1 and the bounds when it is one, 0 (pos
 * unchanged) when the '{' is a literal brace. */
static int rx_braces(struct rx_parser *p, long *mn, long *mx) {
    size_t save = p->pos;
    p->pos++;
    long a = rx_number(p), b;
    if (a < 0) goto literal;
    if (p->pos < p->n && p->s[p->pos] == '}') {
        b = a;
    } else if (p->pos < p->n && p->s[p->pos] == ',') {
        p->pos++;
        b = rx_number(p);
        if (p->pos >= p->n || p->s[p->pos] != '}') goto literal;
    } else {
        goto literal;
    }
    p->pos++;
    *mn = a;
    *mx = b;
    return 1;
literal:
    p->pos = save;
    return 0;
}

static int rx_cat(struct rx_parser *p, int top, struct rx_node **out) {
    struct rx_node *cat = rx_new(p, RX_CAT);
    if (top && p->pos < p->n && p->s[p->pos] == '^') {
        cat->anchor_start = 1;
        p->pos++;
    }
    while (p->pos < p->n && p->s[p->pos] != '|' && p->s[p->pos] != ')') {
        size_t at = p->pos;
        char c = p->s[p->pos];
        struct rx_node *atom = NULL;
        if (c == '$') {
            p->pos++;
            if (top && (p->pos == p->n || p->s[p->pos] == '|')) {
                cat->anchor_end = 1;
                break;
            }
            return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "'$' is supported only at the end");
        }
        if (c == '^') return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "'^' is supported only at the start");
        if (c == '*' || c == '+' || c == '?')
            return rx_fail(p, KILN_ERR_BAD_INPUT, at, "nothing to repeat");
        if (c == '(') {
            p->pos++;
            if (p->pos < p->n && p->s[p->pos] == '?') {
                const char *q = p->s + p->pos + 1;
                size_t left = p->n - p->pos - 1;
                if (left >= 1 && q[0] == ':') {
                    p->pos += 2;
                } else if (left >= 1 && (q[0] == '=' || q[0] == '!')) {
                    return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "lookahead is not supported");
                } else if (left >= 2 && q[0] == '<' && (q[1] == '=' || q[1] == '!')) {
                    return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "lookbehind is not supported");
                } else if (left >= 1 && (q[0] == '<' || (q[0] == 'P' && left >= 2 && q[1] == '<'))) {
                    /* a named group: (?<name>...) or Python's (?P<name>...) */
                    size_t i = p->pos + 1 + (q[0] == 'P' ? 2 : 1);
                    size_t name = i;
                    while (i < p->n && (p->s[i] == '_' || (p->s[i] >= 'a' && p->s[i] <= 'z') ||
                                        (p->s[i] >= 'A' && p->s[i] <= 'Z') || (i > name && p->s[i] >= '0' && p->s[i] <= '9')))
                        i++;
                    if (i == name || i >= p->n || p->s[i] != '>')
                        return rx_fail(p, KILN_ERR_BAD_INPUT, at, "bad group name");
                    p->pos = i + 1;
                } else if (left >= 2 && q[0] == 'P' && q[1] == '=') {
                    return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "backreference is not supported");
                } else {
                    return rx_fail(p, KILN_ERR_UNSUPPORTED, at, "group flags and extensions '(?...)' are not supported");
                }
            }
            if (++p->depth > RX_MAX_DEPTH) return rx_fail(p, KILN_ERR_TOO_LARGE, at, "groups nested too deeply");
            if (rx_alt(p, 0, &atom)) return -1;
            p->depth--;
            if (p->pos >= p->n || p->s[p->pos] != ')') return rx_fail(p, KILN_ERR_BAD_INPUT, at, "unterminated '('");
            p->pos++;
        } else if (c == '[') {
            if (rx_class(p, &atom)) return -1;
        } else if (c == '.') {
            p->pos++;
            struct cpset s = {0};
            cps_add(&s, '\n', '\n');
            cps_add(&s, '\r', '\r');
            cps_add(&s, 0x2028, 0x2029);
            cps_normalize(&s);
            cps_negate(&s);
            atom = rx_set_node(p, &s);
        } else {
            struct cpset s = {0};
            uint32_t cp;
            int is_set = 0;
            if (c == '\\') {
                p->pos++;
                if (rx_escape(p, 0, &cp, &s, &is_set)) {
                    free(s.r);
                    return -1;
                }
            } else {
                long mn, mx;
                if (c == '{' && rx_braces(p, &mn, &mx)) return rx_fail(p, KILN_ERR_BAD_INPUT, at, "nothing to repeat");
                if (c == ']' || c == '}' || c == '{') {
                    /* ECMAScript's u flag refuses them bare; Python reads a
                     * literal: the literal is the only reading both allow
                     * to mean anything */
                    cp = (uint32_t)c;
                    p->pos++;
                } else if (rx_literal_cp(p, &cp)) {
                    return -1;
                }
            }
            if (!is_set) cps_add(&s, cp, cp);
            atom = rx_set_node(p, &s);
        }
        /* quantifiers */
        while (p->pos < p->n) {
            size_t qat = p->pos;
            long mn, mx;
            char q = p->s[p->pos];
            if (q == '*') mn = 0, mx = -1, p->pos++;
            else if (q == '+') mn = 1, mx = -1, p->pos++;
            else if (q == '?') mn = 0, mx = 1, p->pos++;
            else if (q == '{' && rx_braces(p, &mn, &mx)) {
                if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT)
                    return rx_fail(p, KILN_ERR_TOO_LARGE, qat, "repetition count above 1000");
                if (mx >= 0 && mx < mn) return rx_fail(p, KILN_ERR_BAD_INPUT, qat, "numbers out of order in {m,n}");
            } else break;
            if (atom->kind == RX_REP) return rx_fail(p, KILN_ERR_BAD_INPUT, qat, "nothing to repeat");
            /* lazy: the same language */
            if (p->pos < p->n && p->s[p->pos] == '?') p->pos++;
            else if (p->pos < p->n && p->s[p->pos] == '+')
                return rx_fail(p, KILN_ERR_UNSUPPORTED, p->pos, "possessive quantifier is not supported");
            struct rx_node *rep = rx_new(p, RX_REP);
            rep->min = (int)mn;
            rep->max = (int)mx;
            rx_add_kid(rep, atom);
            atom = rep;
            if (p->pos < p->n && (p->s[p->pos] == '*' || p->s[p->pos] == '+' || p->s[p->pos] == '?' ||
                                  p->s[p->pos] == '{')) {
                long a, b;
                if (p->s[p->pos] != '{' || rx_braces(p, &a, &b))
                    return rx_fail(p, KILN_ERR_BAD_INPUT, p->pos, "nothing to repeat");
            }
        }
        rx_add_kid(cat, atom);
    }
    *out = cat;
    return 0;
}

static int rx_alt(struct rx_parser *p, int top, struct rx_node **out) {
    struct rx_node *alt = rx_new(p, RX_ALT);
    for (;;) {
        struct rx_node *c = NULL;
        if (rx_cat(p, top, &c)) return -1;
        rx_add_kid(alt, c);
        if (p->pos < p->n && p->s[p->pos] == '|') {
            p->pos++;
            continue;
        }
        break;
    }
    *out = alt;
    return 0;
}

/* ---- writing EBNF ---- */

void ebnf_put_lit_cp(struct buf *out, uint32_t cp) {
    if (cp == '"') buf_puts(out, "\\\"");
    else if (cp == '\\') buf_puts(out, "\\\\");
    else if (cp < 0x20 || cp == 0x7F) buf_printf(out, "\\x%02X", cp);
    else if (cp < 0x80) buf_push(out, (char)cp);
    else if (cp < 0x10000) buf_printf(out, "\\u%04X", cp);
    else buf_printf(out, "\\U%08X", cp);
}

void ebnf_put_class_cp(struct buf *out, uint32_t cp) {
    if (cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' || cp == '"') buf_printf(out, "\\x%02X", cp);
    else ebnf_put_lit_cp(out, cp);
}

void ebnf_put_lit(struct buf *out, const char *s, size_t n) {
    buf_push(out, '"');
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode(s + i, &cp);
        ebnf_put_lit_cp(out, cp);
    }
    buf_push(out, '"');
}

static void put_class(struct buf *out, const struct rx_range *r, int nr) {
    buf_push(out, '[');
    for (int i = 0; i < nr; i++) {
        ebnf_put_class_cp(out, r[i].lo);
        if (r[i].hi != r[i].lo) {
            if (r[i].hi > r[i].lo + 1) buf_push(out, '-');
            ebnf_put_class_cp(out, r[i].hi);
        }
    }
    buf_push(out, ']');
}

static int set_has(const struct rx_node *nd, uint32_t cp) {
    for (int i = 0; i < nd->nr; i++)
        if (cp >= nd->r[i].lo && cp <= nd->r[i].hi) return 1;
    return 0;
}

/* The escape of '"', '\\' or a short-escaped control character, as EBNF. */
static void put_json_escape(struct buf *out, uint32_t cp) {
    if (cp == '"') buf_puts(out, "\"\\\\\\\"\"");
    else if (cp == '\\') buf_puts(out, "\"\\\\\\\\\"");
    else buf_printf(out, "\"\\\\%c\"", cp == '\b' ? 'b' : cp == '\f' ? 'f' : cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
}

/* \b \f \n \r \t: the control characters JSON writes with a letter. */
static int is_short_escape(uint32_t cp) {
    return cp == '\b' || cp == '\f' || cp == '\n' || cp == '\r' || cp == '\t';
}

/* A code-point set inside a JSON string: the raw characters as a class,
 * the rest as their escapes. */
static void put_json_set(struct buf *out, const struct rx_node *nd) {
    struct cpset raw = {0};
    for (int i = 0; i < nd->nr; i++) {
        uint32_t lo = nd->r[i].lo, hi = nd->r[i].hi;
        if (lo < 0x20) lo = 0x20;
        if (lo > hi) continue;
        /* cut out '"' and '\\' */
        uint32_t cuts[2] = {'"', '\\'};
        for (int c = 0; c < 2 && lo <= hi; c++) {
            if (cuts[c] < lo || cuts[c] > hi) continue;
            if (cuts[c] > lo) cps_add(&raw, lo, cuts[c] - 1);
            lo = cuts[c] + 1;
        }
        if (lo <= hi) cps_add(&raw, lo, hi);
    }
    int n_alt = 0;
    struct buf alts = {0};
    if (raw.n == 1 && raw.r[0].lo == raw.r[0].hi) {
        buf_push(&alts, '"');
        ebnf_put_lit_cp(&alts, raw.r[0].lo);
        buf_push(&alts, '"');
        n_alt++;
    } else if (raw.n) {
        put_class(&alts, raw.r, raw.n);
        n_alt++;
    }
    free(raw.r);
    for (uint32_t cp = 0; cp < 0x60; cp++) {
        if (!(cp == '"' || cp == '\\' || cp == '/' || is_short_escape(cp)) || !set_has(nd, cp)) continue;
        if (n_alt++) buf_puts(&alts, " | ");
        if (cp == '/') buf_puts(&alts, "\"\\\\/\"");
        else put_json_escape(&alts, cp);
    }
    /* the other control characters as \u00XX, one alternative per first
     * hex digit: "\\u000" [0-7bBeEfF] */
    for (uint32_t hi = 0; hi < 2; hi++) {
        struct buf cls = {0};
        for (uint32_t lo = 0; lo < 16; lo++) {
            uint32_t cp = hi * 16 + lo;
            if (is_short_escape(cp) || !set_has(nd, cp)) continue;
            if (lo < 10) buf_push(&cls, (char)('0' + lo));
            else buf_printf(&cls, "%c%c", 'a' + (lo - 10), 'A' + (lo - 10));
        }
        if (cls.len) {
            if (n_alt++) buf_puts(&alts, " | ");
            buf_printf(&alts, "\"\\\\u00%u\" [%s]", hi, cls.data);
        }
        buf_free(&cls);
    }
    if (n_alt == 0) buf_puts(out, "[^\\x00-\\U0010FFFF]"); /* an empty set: matches nothing */
    else if (n_alt == 1) buf_append(out, alts.data, alts.len);
    else {
        buf_puts(out, "(");
        buf_append(out, alts.data, alts.len);
        buf_puts(out, ")");
    }
    buf_free(&alts);
}

void regex_put_json_char_except(struct buf *out, const uint32_t *cps, int n) {
    struct cpset s = {0};
    for (int i = 0; i < n; i++) cps_add(&s, cps[i], cps[i]);
    cps_normalize(&s);
    cps_negate(&s);
    struct rx_node nd = {.kind = RX_SET, .r = s.r, .nr = s.n};
    put_json_set(out, &nd);
    free(s.r);
}

static void rx_emit(struct buf *out, const struct rx_node *nd, enum regex_mode mode);

static int is_single(const struct rx_node *nd) {
    return nd->kind == RX_SET && nd->nr == 1 && nd->r[0].lo == nd->r[0].hi;
}

/* Returns the number of items written (a literal run is one). */
static int rx_emit_cat(struct buf *out, const struct rx_node *nd, enum regex_mode mode) {
    int first = 1, items = 0;
    for (int i = 0; i < nd->nkid;) {
        if (!first) buf_push(out, ' ');
        first = 0;
        items++;
        /* a run of plain characters becomes one literal */
        int j = i;
        if (mode == REGEX_RAW) {
            while (j < nd->nkid && is_single(nd->kid[j])) j++;
        } else {
            while (j < nd->nkid && is_single(nd->kid[j]) && nd->kid[j]->r[0].lo >= 0x20 &&
                   nd->kid[j]->r[0].lo != '"' && nd->kid[j]->r[0].lo != '\\' && nd->kid[j]->r[0].lo != '/')
                j++;
        }
        if (j > i) {
            buf_push(out, '"');
            for (int k = i; k < j; k++) ebnf_put_lit_cp(out, nd->kid[k]->r[0].lo);
            buf_push(out, '"');
            i = j;
            continue;
        }
        rx_emit(out, nd->kid[i], mode);
        i++;
    }
    if (first) buf_puts(out, "\"\"");
    return items;
}

static void rx_emit(struct buf *out, const struct rx_node *nd, enum regex_mode mode) {
    switch (nd->kind) {
    case RX_SET:
        if (mode == REGEX_JSON) put_json_set(out, nd);
        else if (is_single(nd)) {
            buf_push(out, '"');
            ebnf_put_lit_cp(out, nd->r[0].lo);
            buf_push(out, '"');
        } else if (nd->nr == 0) {
            buf_puts(out, "[^\\x00-\\U0010FFFF]");
        } else {
            put_class(out, nd->r, nd->nr);
        }
        break;
    case RX_CAT: {
        struct buf t = {0};
        if (rx_emit_cat(&t, nd, mode) > 1) buf_printf(out, "(%s)", t.data);
        else buf_append(out, t.data, t.len);
        buf_free(&t);
        break;
    }
    case RX_ALT:
        if (nd->nkid == 1) {
            rx_emit(out, nd->kid[0], mode);
            break;
        }
        buf_push(out, '(');
        for (int i = 0; i < nd->nkid; i++) {
            if (i) buf_puts(out, " | ");
            rx_emit_cat(out, nd->kid[i], mode);
        }
        buf_push(out, ')');
        break;
    case RX_REP:
        if (nd->kid[0]->kind == RX_SET && (mode == REGEX_RAW || nd->kid[0]->nr == 0)) {
            rx_emit(out, nd->kid[0], mode); /* one literal character or class */
        } else {
            buf_push(out, '(');
            rx_emit(out, nd->kid[0], mode);
            buf_push(out, ')');
        }
        if (nd->min == 0 && nd->max < 0) buf_push(out, '*');
        else if (nd->min == 1 && nd->max < 0) buf_push(out, '+');
        else if (nd->min == 0 && nd->max == 1) buf_push(out, '?');
        else if (nd->max < 0) buf_printf(out, "{%d,}", nd->min);
        else if (nd->max == nd->min) buf_printf(out, "{%d}", nd->min);
        else buf_printf(out, "{%d,%d}", nd->min, nd->max);
        break;
    }
}

/* Whether no text matches nd (an empty class such as [^\s\S] in every way
 * through it): the grammar engine refuses a rule that matches nothing, so
 * the pattern is refused here, with a clearer message. */
static int rx_matches_nothing(const struct rx_node *nd) {
    switch (nd->kind) {
    case RX_SET: return nd->nr == 0;
    case RX_REP: return nd->min > 0 && rx_matches_nothing(nd->kid[0]);
    case RX_CAT:
        for (int i = 0; i < nd->nkid; i++)
            if (rx_matches_nothing(nd->kid[i])) return 1;
        return 0;
    case RX_ALT:
        for (int i = 0; i < nd->nkid; i++)
            if (!rx_matches_nothing(nd->kid[i])) return 0;
        return 1;
    }
    return 0;
}

/* Any JSON string character, in any of its forms (the text around an
 * unanchored pattern). */
static const char json_any_char[] =
    "([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))*";

int regex_to_ebnf_expr(const char *pattern, size_t len, enum regex_mode mode, struct buf *out,
                       struct kiln_error *err) {
    struct rx_parser p = {.s = pattern, .n = len, .err = err};
    struct rx_node *root = NULL;
    int rc = -1;
    if (rx_alt(&p, 1, &root)) goto done;
    if (p.pos < p.n) { /* only a ')' stops the top level early */
        rx_fail(&p, KILN_ERR_BAD_INPUT, p.pos, "unmatched ')'");
        goto done;
    }
    if (rx_matches_nothing(root)) {
        rx_fail(&p, KILN_ERR_BAD_INPUT, 0, "the pattern matches no text (an empty class)");
        goto done;
    }
    if (mode == REGEX_RAW) {
        /* the caller puts it at the top of a rule: a sequence needs no parentheses */
        if (root->nkid == 1) rx_emit_cat(out, root->kid[0], mode);
        else rx_emit(out, root, mode);
    } else {
        buf_push(out, '(');
        for (int i = 0; i < root->nkid; i++) {
            const struct rx_node *alt = root->kid[i];
            if (i) buf_puts(out, " | ");
            buf_push(out, '(');
            if (!alt->anchor_start) buf_printf(out, "%s ", json_any_char);
            rx_emit_cat(out, alt, mode);
            if (!alt->anchor_end) buf_printf(out, " %s", json_any_char);
            buf_push(out, ')');
        }
        buf_push(out, ')');
    }
    rc = 0;
done:
    rx_free_all(&p);
    return rc;
}

int grammar_ebnf_from_regex(const char *pattern, size_t len, struct buf *out, struct kiln_error *err) {
    size_t start = out->len;
    buf_puts(out, "root ::= ");
    if (regex_to_ebnf_expr(pattern, len, REGEX_RAW, out, err)) {
        buf_truncate(out, start);
        return -1;
    }
    buf_push(out, '\n');
    return 0;
}

struct grammar *grammar_compile_regex(const char *pattern, size_t len, struct kiln_error *err) {
    struct buf b = {0};
    struct grammar *g = NULL;
    if (grammar_ebnf_from_regex(pattern, len, &b, err) == 0) g = grammar_compile_ebnf(b.data, b.len, "root", err);
    buf_free(&b);
    return g;
}
