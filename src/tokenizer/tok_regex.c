#include "tokenizer/tok_regex.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_util.h"

void tok_spans_free(struct tok_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

void tok_spans_push(struct tok_spans *s, size_t start, size_t end) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = xrealloc(s->v, s->cap * 2 * sizeof *s->v);
    }
    s->v[2 * s->n] = start;
    s->v[2 * s->n + 1] = end;
    s->n++;
}

#define WORD_SET "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

/* Rewrites the Oniguruma escapes whose meaning differs in PCRE2; everything
 * else is copied. Tracks whether we are inside a character class, where the
 * replacement must be a class body instead of a bracketed class. */
static char *translate(const char *p, size_t n) {
    struct buf b = {0};
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]"; break;
            case 'S': rep = in_class ? "\\S" : "[^\\s\\x{85}]"; break;
            case 'h': rep = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
            case 'H': rep = in_class ? "\\x00-\\x2f\\x3a-\\x40\\x47-\\x60\\x67-\\x{10ffff}" : "[^0-9a-fA-F]"; break;
            case 'w': rep = in_class ? WORD_SET : "[" WORD_SET "]"; break;
            case 'W': rep = in_class ? "\\W" : "[^" WORD_SET "]"; break;
            default: break;
            }
            if (rep) {
                buf_append(&b, rep, strlen(rep));
            } else {
                buf_append(&b, p + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            buf_push(&b, c);
            /* A ']' right after '[' or '[^' is a literal, not the end. */
            if (i + 1 < n && p[i + 1] == '^') buf_push(&b, p[++i]);
            if (i + 1 < n && p[i + 1] == ']') buf_push(&b, p[++i]);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class like [:alpha:] inside a class: copy through ":]". */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    end = p + j + 2;
                    break;
                }
            if (end) {
                buf_append(&b, p + i, (size_t)(end - (p + i)));
                i = (size_t)(end - p) - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        buf_push(&b, c);
    }
    if (!b.data) buf_reserve(&b, 0);
    return b.data;
}

static int compile_raw(struct tok_regex *re, const char *pat, size_t len, const char *shown, struct kiln_error *err) {
    int ec;
    PCRE2_SIZE eo;
    re->jit = 0;
    re->code = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kiln_errorf(err, "regex '%.200s' does not compile: %s (at offset %zu)", shown, (char *)msg, (size_t)eo);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, struct kiln_error *err) {
    re->code = NULL;
    if (utf8_validate(pattern, len) != len) return kiln_errorf(err, "regex is not valid UTF-8");
    char *t = translate(pattern, len);
    int rc = compile_raw(re, t, strlen(t), pattern, err);
    free(t);
    return rc;
}

void tok_regex_free(struct tok_regex *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

int tok_regex_find_all(const struct tok_regex *re, pcre2_match_data *md, pcre2_match_context *mc, const char *s,
                       size_t n, struct tok_spans *out, struct kiln_error *err) {
    size_t pos = 0;
    size_t last_end = (size_t)-1;
    while (pos <= n) {
        int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, pos, 0, md, mc)
                         : pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_errorf(err, "regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], e = ov[1];
        if (e < a) e = a; /* \K tricks; treat as empty */
        if (a == e && last_end == e) {
            /* Oniguruma's iterator refuses an empty match where the last one
             * ended and moves on by one character. */
            if (pos >= n) break;
            pos += utf8_seq_len((unsigned char)s[pos]);
            continue;
        }
        tok_spans_push(out, a, e);
        last_end = e;
        pos = e;
    }
    return 0;
}
