/* ebnf.c — the EBNF parser: text to rules of syntax trees, with the checks
 * that need only the text (undefined and duplicate names, left recursion).
 *
 * The dialect is llama.cpp's GBNF with what xgrammar's EBNF adds:
 *   name ::= alternatives            rule names of letters, digits, - and _
 *   "text" 'text'                    literals (code points, stored as UTF-8)
 *   [a-z] [^"\\] .                   code point classes, negation, any code point
 *   ( ... )  a | b                   groups and alternation
 *   x* x+ x? x{m} x{m,} x{m,n} x{,n} repetition
 *   # comment                        to the end of the line
 * Escapes in literals and classes: \n \t \r \f \v \0, \xHH, \uHHHH,
 * \UHHHHHHHH (code points), and a backslash before any ASCII punctuation
 * stands for that character. Newlines are white space everywhere; a rule
 * ends where the next `name ::=` begins, at an optional `;`, or at the end
 * of the text. xgrammar's lookahead assertions `(= ...)` are refused.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar_internal.h"

int gr_errorf_at(struct kiln_error *err, const char *text, size_t len, uint32_t pos, const char *fmt, ...) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)text[i] & 0xC0) != 0x80) {
            col++;
        }
    }
    char msg[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_errorf(err, "grammar:%d:%d: %s", line, col, msg);
}

struct parser {
    const char *s;
    size_t n, i;
    int depth;
    struct gr_parsed *p;
    struct kiln_error *err;
};

#define MAX_NESTING 256

static int perr(struct parser *ps, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(struct parser *ps, size_t pos, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gr_errorf_at(ps->err, ps->s, ps->n, (uint32_t)pos, "%s", msg);
}

static struct gr_ast *new_ast(struct parser *ps, enum gr_ast_kind kind, size_t pos) {
    struct gr_parsed *p = ps->p;
    struct gr_ast *a = xcalloc(1, sizeof *a);
    a->kind = kind;
    a->pos = (uint32_t)pos;
    a->rule = -1;
    if (p->n_all == p->cap_all) {
        p->cap_all = p->cap_all ? p->cap_all * 2 : 64;
        p->all = xrealloc(p->all, p->cap_all * sizeof *p->all);
    }
    p->all[p->n_all++] = a;
    return a;
}

static void add_kid(struct gr_ast *a, struct gr_ast *k) {
    if ((a->n_kids & (a->n_kids - 1)) == 0) /* 0, 1, 2, 4, ...: grow by doubling */
        a->kids = xrealloc(a->kids, (a->n_kids ? a->n_kids * 2 : 1) * sizeof *a->kids);
    a->kids[a->n_kids++] = k;
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void skip_ws(struct parser *ps) {
    while (ps->i < ps->n) {
        char c = ps->s[ps->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            ps->i++;
        } else if (c == '#') {
            while (ps->i < ps->n && ps->s[ps->i] != '\n') ps->i++;
        } else {
            break;
        }
    }
}

static size_t name_end(const struct parser *ps, size_t i) {
    while (i < ps->n && is_name_char(ps->s[i])) i++;
    return i;
}

/* Whether a rule definition `name ::=` starts at i. */
static int at_rule_start(struct parser *ps, size_t i) {
    size_t e = name_end(ps, i);
    if (e == i) return 0;
    size_t save = ps->i;
    ps->i = e;
    skip_ws(ps);
    int yes = ps->n - ps->i >= 3 && memcmp(ps->s + ps->i, "::=", 3) == 0;
    ps->i = save;
    return yes;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 code point of the grammar text. -1 when invalid. */
static int32_t read_utf8(struct parser *ps) {
    const unsigned char *u = (const unsigned char *)ps->s + ps->i;
    size_t left = ps->n - ps->i;
    unsigned char c = u[0];
    if (c < 0x80) {
        ps->i++;
        return c;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (!len || (size_t)len > left || c > 0xF4) return -1;
    uint32_t cp = c & (0x3F >> (len - 1));
    for (int k = 1; k < len; k++) {
        if ((u[k] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (u[k] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    ps->i += (size_t)len;
    return (int32_t)cp;
}

/* One character of a literal or class, escapes decoded. -1 with err set. */
static int32_t read_char(struct parser *ps) {
    size_t at = ps->i;
    if (ps->s[ps->i] != '\\') {
        int32_t cp = read_utf8(ps);
        if (cp < 0) return perr(ps, at, "invalid UTF-8 in the grammar text");
        return cp;
    }
    if (ps->i + 1 >= ps->n) return perr(ps, at, "a backslash ends the grammar");
    char e = ps->s[ps->i + 1];
    ps->i += 2;
    int digits = 0;
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        if ((unsigned char)e < 0x80 && e > ' ' && !is_name_char(e)) return (unsigned char)e;
        if (e == '-' || e == '_') return (unsigned char)e;
        return perr(ps, at, "unknown escape '\\%c'", e);
    }
    uint32_t cp = 0;
    for (int k = 0; k < digits; k++) {
        int h = ps->i < ps->n ? hexval(ps->s[ps->i]) : -1;
        if (h < 0) return perr(ps, at, "'\\%c' needs %d hex digits", e, digits);
        cp = cp << 4 | (uint32_t)h;
        ps->i++;
    }
    if (cp > 0x10FFFF) return perr(ps, at, "code point U+%X is past U+10FFFF", cp);
    if (cp >= 0xD800 && cp <= 0xDFFF) return perr(ps, at, "U+%04X is a surrogate, not a character", cp);
    return (int32_t)cp;
}

static void push_utf8(uint8_t **b, uint32_t *n, uint32_t cp) {
    uint8_t t[4];
    int k;
    if (cp < 0x80) {
        t[0] = (uint8_t)cp;
        k = 1;
    } else if (cp < 0x800) {
        t[0] = (uint8_t)(0xC0 | cp >> 6);
        t[1] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        t[0] = (uint8_t)(0xE0 | cp >> 12);
        t[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        t[2] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        t[0] = (uint8_t)(0xF0 | cp >> 18);
        t[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        t[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        t[3] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 4;
    }
    *b = xrealloc(*b, *n + 4);
    memcpy(*b + *n, t, (size_t)k);
    *n += (uint32_t)k;
}

static struct gr_ast *parse_literal(struct parser *ps) {
    size_t at = ps->i;
    char q = ps->s[ps->i++];
    struct gr_ast *a = new_ast(ps, GR_AST_BYTES, at);
    for (;;) {
        if (ps->i >= ps->n) {
            perr(ps, at, "unterminated literal");
            return NULL;
        }
        if (ps->s[ps->i] == q) {
            ps->i++;
            return a;
        }
        int32_t cp = read_char(ps);
        if (cp < 0) return NULL;
        push_utf8(&a->bytes, &a->n_bytes, (uint32_t)cp);
    }
}

static int cmp_range(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Sorts and merges [lo, hi] pairs, complements them when `negate`, and
 * removes the surrogates (not encodable in UTF-8). */
static void normalize_ranges(struct gr_ast *a, int negate) {
    uint32_t *r = a->ranges, n = a->n_ranges;
    if (n > 1) qsort(r, n, 2 * sizeof *r, cmp_range);
    uint32_t m = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (m && r[2 * k] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * k + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * k + 1];
        } else {
            r[2 * m] = r[2 * k];
            r[2 * m + 1] = r[2 * k + 1];
            m++;
        }
    }
    uint32_t *out = xmalloc((2 * m + 6) * sizeof *out), o = 0;
    uint32_t *src = r, ns = m;
    uint32_t *comp = NULL;
    if (negate) {
        comp = xmalloc((2 * m + 2) * sizeof *comp);
        uint32_t c = 0, next = 0;
        for (uint32_t k = 0; k < m; k++) {
            if (r[2 * k] > next) {
                comp[2 * c] = next;
                comp[2 * c + 1] = r[2 * k] - 1;
                c++;
            }
            next = r[2 * k + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            comp[2 * c] = next;
            comp[2 * c + 1] = 0x10FFFF;
            c++;
        }
        src = comp;
        ns = c;
    }
    for (uint32_t k = 0; k < ns; k++) {
        uint32_t lo = src[2 * k], hi = src[2 * k + 1];
        if (lo < 0xD800 && hi > 0xDFFF) { /* split around the surrogates */
            out[o++] = lo;
            out[o++] = 0xD7FF;
            out[o++] = 0xE000;
            out[o++] = hi;
            continue;
        }
        if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
        if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
        if (lo > hi) continue;
        out[o++] = lo;
        out[o++] = hi;
    }
    free(comp);
    free(a->ranges);
    a->ranges = out;
    a->n_ranges = o / 2;
}

static void add_range(struct gr_ast *a, uint32_t lo, uint32_t hi) {
    a->ranges = xrealloc(a->ranges, (a->n_ranges + 1) * 2 * sizeof *a->ranges);
    a->ranges[2 * a->n_ranges] = lo;
    a->ranges[2 * a->n_ranges + 1] = hi;
    a->n_ranges++;
}

static struct gr_ast *parse_class(struct parser *ps) {
    size_t at = ps->i++;
    struct gr_ast *a = new_ast(ps, GR_AST_CLASS, at);
    int negate = 0;
    if (ps->i < ps->n && ps->s[ps->i] == '^') {
        negate = 1;
        ps->i++;
    }
    for (;;) {
        if (ps->i >= ps->n) {
            perr(ps, at, "unterminated character class");
            return NULL;
        }
        if (ps->s[ps->i] == ']') {
            ps->i++;
            break;
        }
        size_t cat = ps->i;
        int32_t lo = read_char(ps);
        if (lo < 0) return NULL;
        int32_t hi = lo;
        if (ps->i + 1 < ps->n && ps->s[ps->i] == '-' && ps->s[ps->i + 1] != ']') {
            ps->i++;
            hi = read_char(ps);
            if (hi < 0) return NULL;
            if (hi < lo) {
                perr(ps, cat, "range out of order in character class");
                return NULL;
            }
        }
        add_range(a, (uint32_t)lo, (uint32_t)hi);
    }
    normalize_ranges(a, negate);
    return a;
}

static int parse_int(struct parser *ps, int *out) {
    size_t at = ps->i;
    long v = 0;
    if (ps->i >= ps->n || ps->s[ps->i] < '0' || ps->s[ps->i] > '9') return perr(ps, at, "expected a number");
    while (ps->i < ps->n && ps->s[ps->i] >= '0' && ps->s[ps->i] <= '9') {
        v = v * 10 + (ps->s[ps->i++] - '0');
        if (v > GR_MAX_REPEAT) return perr(ps, at, "repetition count is larger than %d", GR_MAX_REPEAT);
    }
    *out = (int)v;
    return 0;
}

static struct gr_ast *parse_alternatives(struct parser *ps);

static struct gr_ast *parse_term(struct parser *ps) {
    size_t at = ps->i;
    char c = ps->s[ps->i];
    if (c == '"' || c == '\'') return parse_literal(ps);
    if (c == '[') return parse_class(ps);
    if (c == '.') {
        ps->i++;
        struct gr_ast *a = new_ast(ps, GR_AST_CLASS, at);
        normalize_ranges(a, 1);
        return a;
    }
    if (c == '(') {
        ps->i++;
        skip_ws(ps);
        if (ps->i < ps->n && ps->s[ps->i] == '=') {
            perr(ps, at, "lookahead assertions '(= ...)' are not supported");
            return NULL;
        }
        if (++ps->depth > MAX_NESTING) {
            perr(ps, at, "groups nested deeper than %d", MAX_NESTING);
            return NULL;
        }
        struct gr_ast *a = parse_alternatives(ps);
        ps->depth--;
        if (!a) return NULL;
        skip_ws(ps);
        if (ps->i >= ps->n || ps->s[ps->i] != ')') {
            perr(ps, ps->i, "expected ')' to close the '(' at offset %zu", at);
            return NULL;
        }
        ps->i++;
        return a;
    }
    if (is_name_char(c)) {
        size_t e = name_end(ps, ps->i);
        struct gr_ast *a = new_ast(ps, GR_AST_REF, at);
        a->name = xstrndup(ps->s + at, e - at);
        ps->i = e;
        return a;
    }
    if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F)
        perr(ps, at, "unexpected '%c'", c);
    else
        perr(ps, at, "unexpected byte 0x%02X", (unsigned char)c);
    return NULL;
}

static struct gr_ast *parse_quantified(struct parser *ps, struct gr_ast *a) {
    for (;;) {
        skip_ws(ps);
        if (ps->i >= ps->n) return a;
        char c = ps->s[ps->i];
        size_t at = ps->i;
        int min, max;
        if (c == '*') {
            min = 0, max = -1;
            ps->i++;
        } else if (c == '+') {
            min = 1, max = -1;
            ps->i++;
        } else if (c == '?') {
            min = 0, max = 1;
            ps->i++;
        } else if (c == '{') {
            ps->i++;
            skip_ws(ps);
            min = 0;
            max = -1;
            if (ps->i < ps->n && ps->s[ps->i] != ',') {
                if (parse_int(ps, &min)) return NULL;
                max = min;
                skip_ws(ps);
            }
            if (ps->i < ps->n && ps->s[ps->i] == ',') {
                ps->i++;
                skip_ws(ps);
                max = -1;
                if (ps->i < ps->n && ps->s[ps->i] != '}') {
                    if (parse_int(ps, &max)) return NULL;
                    skip_ws(ps);
                }
            }
            if (ps->i >= ps->n || ps->s[ps->i] != '}') {
                perr(ps, ps->i, "expected '}' to close the repetition");
                return NULL;
            }
            ps->i++;
            if (max >= 0 && max < min) {
                perr(ps, at, "repetition {%d,%d}: the maximum is below the minimum", min, max);
                return NULL;
            }
        } else {
            return a;
        }
        struct gr_ast *r = new_ast(ps, GR_AST_REPEAT, at);
        r->min = min;
        r->max = max;
        add_kid(r, a);
        a = r;
    }
}

static struct gr_ast *parse_sequence(struct parser *ps) {
    struct gr_ast *seq = new_ast(ps, GR_AST_SEQ, ps->i);
    for (;;) {
        skip_ws(ps);
        if (ps->i >= ps->n) break;
        char c = ps->s[ps->i];
        if (c == '|' || c == ')' || c == ';') break;
        if (is_name_char(c) && at_rule_start(ps, ps->i)) break;
        struct gr_ast *t = parse_term(ps);
        if (!t) return NULL;
        t = parse_quantified(ps, t);
        if (!t) return NULL;
        add_kid(seq, t);
    }
    return seq->n_kids == 1 ? seq->kids[0] : seq;
}

static struct gr_ast *parse_alternatives(struct parser *ps) {
    struct gr_ast *first = parse_sequence(ps);
    if (!first) return NULL;
    skip_ws(ps);
    if (ps->i >= ps->n || ps->s[ps->i] != '|') return first;
    struct gr_ast *alt = new_ast(ps, GR_AST_ALT, first->pos);
    add_kid(alt, first);
    while (ps->i < ps->n && ps->s[ps->i] == '|') {
        ps->i++;
        struct gr_ast *s = parse_sequence(ps);
        if (!s) return NULL;
        add_kid(alt, s);
        skip_ws(ps);
    }
    return alt;
}

static int find_rule(const struct gr_parsed *p, const char *name) {
    for (uint32_t k = 0; k < p->n_rules; k++)
        if (strcmp(p->rules[k].name, name) == 0) return (int)k;
    return -1;
}

/* ---- checks on the parsed rules ---- */

static int ast_nullable(const struct gr_ast *a, const uint8_t *rule_nullable) {
    switch (a->kind) {
    case GR_AST_SEQ:
        for (uint32_t k = 0; k < a->n_kids; k++)
            if (!ast_nullable(a->kids[k], rule_nullable)) return 0;
        return 1;
    case GR_AST_ALT:
        for (uint32_t k = 0; k < a->n_kids; k++)
            if (ast_nullable(a->kids[k], rule_nullable)) return 1;
        return 0;
    case GR_AST_BYTES: return a->n_bytes == 0;
    case GR_AST_CLASS: return 0;
    case GR_AST_REF: return rule_nullable[a->rule];
    case GR_AST_REPEAT: return a->min == 0 || ast_nullable(a->kids[0], rule_nullable);
    }
    return 0;
}

/* Marks in `out` the rules a can call before consuming any byte. */
static void ast_first_refs(const struct gr_ast *a, const uint8_t *rule_nullable, uint8_t *out) {
    switch (a->kind) {
    case GR_AST_SEQ:
        for (uint32_t k = 0; k < a->n_kids; k++) {
            ast_first_refs(a->kids[k], rule_nullable, out);
            if (!ast_nullable(a->kids[k], rule_nullable)) break;
        }
        break;
    case GR_AST_ALT:
        for (uint32_t k = 0; k < a->n_kids; k++) ast_first_refs(a->kids[k], rule_nullable, out);
        break;
    case GR_AST_REF: out[a->rule] = 1; break;
    case GR_AST_REPEAT:
        if (a->max != 0) ast_first_refs(a->kids[0], rule_nullable, out);
        break;
    default: break;
    }
}

/* A cycle in the "calls before consuming" graph (adjacency lists adj_off /
 * adj), found by an iterative depth-first search; returns a rule on it or
 * -1. */
static int find_left_cycle(uint32_t n, const uint32_t *adj_off, const uint32_t *adj) {
    uint8_t *color = xcalloc(n, 1);
    uint32_t *stack = xmalloc(n * sizeof *stack), *next = xmalloc(n * sizeof *next);
    int bad = -1;
    for (uint32_t s = 0; s < n && bad < 0; s++) {
        if (color[s]) continue;
        uint32_t sp = 0;
        stack[sp++] = s;
        color[s] = 1;
        next[s] = adj_off[s];
        while (sp && bad < 0) {
            uint32_t r = stack[sp - 1];
            if (next[r] == adj_off[r + 1]) {
                color[r] = 2;
                sp--;
                continue;
            }
            uint32_t q = adj[next[r]++];
            if (color[q] == 1) {
                bad = (int)q;
            } else if (color[q] == 0) {
                color[q] = 1;
                next[q] = adj_off[q];
                stack[sp++] = q;
            }
        }
    }
    free(color);
    free(stack);
    free(next);
    return bad;
}

static int check_rules(struct parser *ps) {
    struct gr_parsed *p = ps->p;
    for (uint32_t k = 0; k < p->n_all; k++) {
        struct gr_ast *a = p->all[k];
        if (a->kind != GR_AST_REF) continue;
        a->rule = find_rule(p, a->name);
        if (a->rule < 0) return perr(ps, a->pos, "undefined rule '%s'", a->name);
    }
    uint32_t n = p->n_rules;
    uint8_t *nullable = xcalloc(n, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < n; r++) {
            if (!nullable[r] && ast_nullable(p->rules[r].body, nullable)) {
                nullable[r] = 1;
                changed = 1;
            }
        }
    }
    uint8_t *mark = xcalloc(n, 1);
    uint32_t *adj_off = xmalloc((n + 1) * sizeof *adj_off), *adj = NULL, n_adj = 0, cap_adj = 0;
    for (uint32_t r = 0; r < n; r++) {
        adj_off[r] = n_adj;
        memset(mark, 0, n);
        ast_first_refs(p->rules[r].body, nullable, mark);
        for (uint32_t q = 0; q < n; q++) {
            if (!mark[q]) continue;
            if (n_adj == cap_adj) {
                cap_adj = cap_adj ? cap_adj * 2 : 64;
                adj = xrealloc(adj, cap_adj * sizeof *adj);
            }
            adj[n_adj++] = q;
        }
    }
    adj_off[n] = n_adj;
    int bad = find_left_cycle(n, adj_off, adj);
    free(nullable);
    free(mark);
    free(adj_off);
    free(adj);
    if (bad >= 0)
        return perr(ps, p->rules[bad].pos,
                    "rule '%s' is left-recursive (it can reach itself before consuming any text)",
                    p->rules[bad].name);
    return 0;
}

int gr_parse(const char *text, size_t len, struct gr_parsed *p, struct kiln_error *err) {
    memset(p, 0, sizeof *p);
    p->text = text;
    p->len = len;
    struct parser ps = {.s = text, .n = len, .p = p, .err = err};
    if (len > UINT32_MAX / 2) return kiln_errorf(err, "grammar: the text is too long");
    for (;;) {
        skip_ws(&ps);
        if (ps.i >= ps.n) break;
        size_t at = ps.i;
        size_t e = name_end(&ps, ps.i);
        if (e == ps.i) {
            char c = ps.s[ps.i];
            if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F)
                return perr(&ps, at, "expected a rule name, found '%c'", c);
            return perr(&ps, at, "expected a rule name");
        }
        char *name = xstrndup(text + at, e - at);
        ps.i = e;
        skip_ws(&ps);
        if (ps.n - ps.i < 3 || memcmp(ps.s + ps.i, "::=", 3) != 0) {
            free(name);
            return perr(&ps, ps.i, "expected '::='");
        }
        int dup = find_rule(p, name);
        if (dup >= 0) {
            free(name);
            return perr(&ps, at, "rule '%s' is defined twice", p->rules[dup].name);
        }
        if (p->n_rules == p->cap_rules) {
            p->cap_rules = p->cap_rules ? p->cap_rules * 2 : 16;
            p->rules = xrealloc(p->rules, p->cap_rules * sizeof *p->rules);
        }
        struct gr_ast_rule *r = &p->rules[p->n_rules++];
        r->name = name;
        r->pos = (uint32_t)at;
        r->body = NULL;
        ps.i += 3;
        r->body = parse_alternatives(&ps);
        if (!r->body) return -1;
        skip_ws(&ps);
        if (ps.i < ps.n && ps.s[ps.i] == ';') {
            ps.i++;
        } else if (ps.i < ps.n && ps.s[ps.i] == ')') {
            return perr(&ps, ps.i, "unexpected ')'");
        }
    }
    if (p->n_rules == 0) return kiln_errorf(err, "grammar:1:1: no rules");
    return check_rules(&ps);
}

void gr_parsed_free(struct gr_parsed *p) {
    for (uint32_t k = 0; k < p->n_all; k++) {
        struct gr_ast *a = p->all[k];
        free(a->kids);
        free(a->bytes);
        free(a->ranges);
        free(a->name);
        gr_class_dfa_free(a->class_dfa);
        free(a);
    }
    free(p->all);
    for (uint32_t k = 0; k < p->n_rules; k++) free(p->rules[k].name);
    free(p->rules);
    memset(p, 0, sizeof *p);
}
