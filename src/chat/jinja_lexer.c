/* jinja_lexer.c — template text to tokens, with jinja2's whitespace rules
 * as transformers sets them: trim_blocks (drop the newline after a block or
 * comment tag), lstrip_blocks (drop the indentation before a block or
 * comment tag that starts a line), `-` and `+` modifiers on tags, and
 * keep_trailing_newline=False (one final newline of the source is dropped).
 * All line endings are normalized to \n first, as jinja2 does. */
#include "chat/jinja.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

struct lexer {
    const char *s;
    size_t n;
    size_t pos;
    /* line/col of `mark`, advanced lazily since positions only grow */
    size_t mark;
    int line, col;
    struct jtokens *out;
    struct kiln_error *err;
    char brackets[256];
    int depth;
};

static void lex_where(struct lexer *lx, size_t pos, int *line, int *col) {
    if (pos < lx->mark) {
        lx->mark = 0;
        lx->line = 1;
        lx->col = 1;
    }
    for (; lx->mark < pos && lx->mark < lx->n; lx->mark++) {
        unsigned char c = (unsigned char)lx->s[lx->mark];
        if (c == '\n') {
            lx->line++;
            lx->col = 1;
        } else if (!utf8_is_cont(c)) {
            lx->col++;
        }
    }
    *line = lx->line;
    *col = lx->col;
}

static int lex_fail(struct lexer *lx, size_t pos, const char *msg, const char *arg) {
    int line, col;
    lex_where(lx, pos, &line, &col);
    return kiln_errorf(lx->err, "template:%d:%d: %s%s", line, col, msg, arg ? arg : "");
}

static struct jtoken *emit(struct lexer *lx, enum jtok_type type, size_t pos) {
    struct jtokens *t = lx->out;
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->v = xrealloc(t->v, t->cap * sizeof *t->v);
    }
    struct jtoken *k = &t->v[t->n++];
    memset(k, 0, sizeof *k);
    k->type = type;
    lex_where(lx, pos, &k->line, &k->col);
    return k;
}

static void emit_data(struct lexer *lx, size_t start, size_t end) {
    if (end <= start) return;
    struct jtoken *k = emit(lx, JTOK_DATA, start);
    k->text = xstrndup(lx->s + start, end - start);
    k->len = end - start;
}

static int is_ws_at(const char *s, size_t n, size_t i, size_t *len) {
    uint32_t cp;
    *len = utf8_decode_lossy(s + i, n - i, &cp);
    return py_isspace(cp);
}

/* End of whitespace starting at i. */
static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && is_ws_at(s, n, i, &k)) i += k;
    return i;
}

/* Start of the trailing whitespace of s[start, end). */
static size_t rstrip_pos(const char *s, size_t start, size_t end) {
    while (end > start) {
        size_t b = utf8_prev(s, start, end);
        size_t k;
        if (!is_ws_at(s, end, b, &k) || b + k != end) break;
        end = b;
    }
    return end;
}

/* The data before a tag, after the tag's `-` or lstrip_blocks. */
static size_t data_end(struct lexer *lx, size_t start, size_t end, char sign, int lstrip, int line_starting) {
    if (sign == '-') return rstrip_pos(lx->s, start, end);
    if (sign == '+' || !lstrip) return end;
    size_t l_pos = start;
    for (size_t i = end; i > start; i--)
        if (lx->s[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    if (l_pos > start || line_starting) {
        if (l_pos < end && skip_ws(lx->s, end, l_pos) == end) return l_pos;
    }
    return end;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Python's unicode-escape decoding of a string literal's body. */
static int decode_string(struct lexer *lx, size_t pos, const char *s, size_t n, struct jtoken *tok) {
    struct buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            buf_push(&b, s[i]);
            continue;
        }
        char c = s[++i];
        int digits = 0;
        switch (c) {
        case '\n': break;
        case '\\': buf_push(&b, '\\'); break;
        case '\'': buf_push(&b, '\''); break;
        case '"': buf_push(&b, '"'); break;
        case 'a': buf_push(&b, '\a'); break;
        case 'b': buf_push(&b, '\b'); break;
        case 'f': buf_push(&b, '\f'); break;
        case 'n': buf_push(&b, '\n'); break;
        case 'r': buf_push(&b, '\r'); break;
        case 't': buf_push(&b, '\t'); break;
        case 'v': buf_push(&b, '\v'); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                int v = 0, k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') v = v * 8 + (s[i++] - '0'), k++;
                i--;
                buf_push_cp(&b, v);
            } else {
                buf_push(&b, '\\');
                buf_push(&b, c);
            }
        }
        if (digits) {
            int32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = i + 1 < n ? hexval(s[i + 1]) : -1;
                if (h < 0) {
                    buf_free(&b);
                    return lex_fail(lx, pos, "truncated \\", digits == 2 ? "xXX escape" : "uXXXX escape");
                }
                v = v * 16 + h;
                i++;
            }
            if (v > 0x10ffff || v < 0) {
                buf_free(&b);
                return lex_fail(lx, pos, "illegal Unicode character in string", NULL);
            }
            buf_push_cp(&b, v);
        }
    }
    tok->text = b.data ? b.data : xstrdup("");
    tok->len = b.len;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Digits with single '_' separators; returns the end or `i` when none. */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n && is_digit(s[j])) {
        j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) j++;
    }
    return j;
}

static char *strip_underscores(const char *s, size_t n) {
    char *t = xmalloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] != '_') t[k++] = s[i];
    t[k] = 0;
    return t;
}

static int lex_number(struct lexer *lx, size_t *pos) {
    const char *s = lx->s;
    size_t n = lx->n, i = *pos;
    /* float: digits then (.digits)?(e[+-]digits) or .digits */
    if (i == 0 || s[i - 1] != '.') {
        size_t j = scan_digits(s, n, i), k = j;
        int is_float = 0;
        if (k < n && s[k] == '.' && k + 1 < n && is_digit(s[k + 1])) {
            k = scan_digits(s, n, k + 1);
            is_float = 1;
        }
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
            size_t e = k + 1;
            if (e < n && (s[e] == '+' || s[e] == '-')) e++;
            size_t f = scan_digits(s, n, e);
            if (f > e) {
                k = f;
                is_float = 1;
            }
        }
        if (is_float) {
            char *t = strip_underscores(s + i, k - i);
            struct jtoken *tok = emit(lx, JTOK_FLOAT, i);
            tok->f = strtod(t, NULL);
            free(t);
            *pos = k;
            return 0;
        }
    }
    int base = 10;
    size_t start = i;
    if (s[i] == '0' && i + 1 < n && (s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == 'o' || s[i + 1] == 'O' ||
                                     s[i + 1] == 'b' || s[i + 1] == 'B')) {
        char p = (char)(s[i + 1] | 0x20);
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        size_t j = i + 2;
        size_t d0 = j;
        while (j < n) {
            if (s[j] == '_' && j + 1 < n) j++;
            int h = hexval(s[j]);
            if (h < 0 || h >= base) {
                if (s[j - 1] == '_') j--;
                break;
            }
            j++;
        }
        if (j == d0) {
            base = 10;
            i = i + 1; /* "0" then a name */
        } else {
            i = j;
            start += 2;
        }
    } else if (s[i] == '0') {
        i++;
        while (i < n && (s[i] == '0' || (s[i] == '_' && i + 1 < n && s[i + 1] == '0'))) i++;
    } else {
        i = scan_digits(s, n, i);
    }
    char *t = strip_underscores(s + start, i - start);
    errno = 0;
    long long v = strtoll(base == 10 ? t : t, NULL, base);
    int overflow = errno == ERANGE;
    free(t);
    if (overflow) return lex_fail(lx, *pos, "integer literal too large", NULL);
    struct jtoken *tok = emit(lx, JTOK_INT, *pos);
    tok->i = v;
    *pos = i;
    return 0;
}

static const struct {
    const char *text;
    enum jop op;
} operators[] = {
    {"//", JOP_FLOORDIV}, {"**", JOP_POW}, {"==", JOP_EQ}, {"!=", JOP_NE}, {">=", JOP_GE}, {"<=", JOP_LE},
    {"+", JOP_ADD},       {"-", JOP_SUB},  {"/", JOP_DIV}, {"*", JOP_MUL}, {"%", JOP_MOD}, {"~", JOP_TILDE},
    {"[", JOP_LBRACKET},  {"]", JOP_RBRACKET}, {"(", JOP_LPAREN}, {")", JOP_RPAREN}, {"{", JOP_LBRACE},
    {"}", JOP_RBRACE},    {">", JOP_GT},   {"<", JOP_LT},  {"=", JOP_ASSIGN}, {".", JOP_DOT}, {":", JOP_COLON},
    {"|", JOP_PIPE},      {",", JOP_COMMA}, {";", JOP_SEMICOLON},
};

/* Tokens inside {{ }} or {% %} up to the closing tag; *line_starting says
 * whether the closing tag consumed a newline (for lstrip_blocks). */
static int lex_tag(struct lexer *lx, int block, size_t open_pos, int *line_starting) {
    const char *s = lx->s;
    size_t n = lx->n, i = lx->pos;
    lx->depth = 0;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n) return lex_fail(lx, open_pos, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", NULL);
        if (lx->depth == 0) {
            const char *close = block ? "%}" : "}}";
            size_t end = 0;
            int found = 0;
            if (s[i] == '-' && i + 2 < n + 0 && i + 3 <= n && !memcmp(s + i + 1, close, 2)) {
                end = skip_ws(s, n, i + 3);
                found = 1;
            } else if (block && s[i] == '+' && i + 3 <= n && !memcmp(s + i + 1, close, 2)) {
                end = i + 3;
                found = 1;
            } else if (i + 2 <= n && !memcmp(s + i, close, 2)) {
                end = i + 2;
                if (block && end < n && s[end] == '\n') end++;
                found = 1;
            }
            if (found) {
                emit(lx, block ? JTOK_BLOCK_END : JTOK_VAR_END, i);
                *line_starting = end > 0 && s[end - 1] == '\n';
                lx->pos = end;
                return 0;
            }
        }
        char c = s[i];
        if (is_digit(c)) {
            if (lex_number(lx, &i)) return -1;
        } else if (is_name_start(c)) {
            size_t j = i;
            while (j < n && is_name_char(s[j])) j++;
            struct jtoken *tok = emit(lx, JTOK_NAME, i);
            tok->text = xstrndup(s + i, j - i);
            tok->len = j - i;
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) j += s[j] == '\\' ? 2 : 1;
            if (j >= n) return lex_fail(lx, i, "unexpected end of string", NULL);
            struct jtoken *tok = emit(lx, JTOK_STRING, i);
            if (decode_string(lx, i, s + i + 1, j - i - 1, tok)) return -1;
            i = j + 1;
        } else {
            size_t k;
            for (k = 0; k < sizeof operators / sizeof operators[0]; k++) {
                size_t len = strlen(operators[k].text);
                if (i + len <= n && !memcmp(s + i, operators[k].text, len)) break;
            }
            if (k == sizeof operators / sizeof operators[0]) {
                char what[8] = {c, 0};
                return lex_fail(lx, i, "unexpected char ", c == '\'' ? "quote" : what);
            }
            enum jop op = operators[k].op;
            if (op == JOP_LPAREN || op == JOP_LBRACKET || op == JOP_LBRACE) {
                if (lx->depth >= (int)sizeof lx->brackets) return lex_fail(lx, i, "brackets nested too deeply", NULL);
                lx->brackets[lx->depth++] = op == JOP_LPAREN ? ')' : op == JOP_LBRACKET ? ']' : '}';
            } else if (op == JOP_RPAREN || op == JOP_RBRACKET || op == JOP_RBRACE) {
                char want[2] = {c, 0};
                if (lx->depth == 0) return lex_fail(lx, i, "unexpected ", want[0] == ')' ? "')'" : want[0] == ']' ? "']'" : "'}'");
                if (lx->brackets[lx->depth - 1] != c) return lex_fail(lx, i, "unexpected closing bracket ", want);
                lx->depth--;
            }
            struct jtoken *tok = emit(lx, JTOK_OP, i);
            tok->op = op;
            i += strlen(operators[k].text);
        }
    }
}

/* {% raw %}: everything up to {% endraw %} is data. */
static int lex_raw(struct lexer *lx, size_t open_pos, int *line_starting) {
    const char *s = lx->s;
    size_t n = lx->n;
    for (size_t i = lx->pos; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t j = i + 2;
        char sign = j < n && (s[j] == '-' || s[j] == '+') ? s[j++] : 0;
        j = skip_ws(s, n, j);
        if (j + 6 > n || memcmp(s + j, "endraw", 6)) continue;
        j = skip_ws(s, n, j + 6);
        size_t end;
        if (j + 3 <= n && (s[j] == '-' || s[j] == '+') && !memcmp(s + j + 1, "%}", 2))
            end = s[j] == '-' ? skip_ws(s, n, j + 3) : j + 3;
        else if (j + 2 <= n && !memcmp(s + j, "%}", 2))
            end = j + 2 + (j + 2 < n && s[j + 2] == '\n');
        else
            continue;
        emit_data(lx, lx->pos, data_end(lx, lx->pos, i, sign, 1, 0));
        *line_starting = s[end - 1] == '\n';
        lx->pos = end;
        return 0;
    }
    return lex_fail(lx, open_pos, "missing end of raw directive", NULL);
}

int jinja_lex(const char *src, size_t len, struct jtokens *out, struct kiln_error *err) {
    /* Normalize newlines and drop one trailing newline (keep_trailing_newline=False). */
    char *s = xmalloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;

    struct lexer lx = {.s = s, .n = n, .line = 1, .col = 1, .out = out, .err = err};
    memset(out, 0, sizeof *out);
    int line_starting = 1;
    while (lx.pos < n) {
        size_t t = lx.pos;
        int kind = 0; /* '{', '%', '#' */
        for (; t + 1 < n; t++)
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) {
                kind = s[t + 1];
                break;
            }
        if (!kind) {
            emit_data(&lx, lx.pos, n);
            break;
        }
        size_t after = t + 2;
        char sign = after < n && (s[after] == '-' || s[after] == '+') ? s[after] : 0;
        if (sign) after++;
        emit_data(&lx, lx.pos, data_end(&lx, lx.pos, t, sign, kind != '{', line_starting));
        if (kind == '#') {
            size_t e = after;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) {
                lex_fail(&lx, t, "missing end of comment tag", NULL);
                goto fail;
            }
            size_t end = e + 2;
            if (e > after && s[e - 1] == '-')
                end = skip_ws(s, n, end);
            else if (!(e > after && s[e - 1] == '+') && end < n && s[end] == '\n')
                end++;
            line_starting = s[end - 1] == '\n';
            lx.pos = end;
            continue;
        }
        if (kind == '%') {
            size_t j = skip_ws(s, n, after);
            if (j + 3 <= n && !memcmp(s + j, "raw", 3) && (j + 3 == n || !is_name_char(s[j + 3]))) {
                size_t k = skip_ws(s, n, j + 3);
                size_t end = 0;
                if (k + 3 <= n && s[k] == '-' && !memcmp(s + k + 1, "%}", 2))
                    end = skip_ws(s, n, k + 3);
                else if (k + 2 <= n && !memcmp(s + k, "%}", 2))
                    end = k + 2;
                if (end) {
                    lx.pos = end;
                    if (lex_raw(&lx, t, &line_starting)) goto fail;
                    continue;
                }
            }
        }
        emit(&lx, kind == '{' ? JTOK_VAR_BEGIN : JTOK_BLOCK_BEGIN, t);
        lx.pos = after;
        if (lex_tag(&lx, kind == '%', t, &line_starting)) goto fail;
    }
    emit(&lx, JTOK_EOF, n);
    free(s);
    return 0;
fail:
    free(s);
    jtokens_free(out);
    return -1;
}

void jtokens_free(struct jtokens *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->v[i].text);
    free(t->v);
    memset(t, 0, sizeof *t);
}
