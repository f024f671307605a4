/* tok_regex.h — the regexes of tokenizer.json on PCRE2.
 *
 * `tokenizers` compiles its patterns with Oniguruma; PCRE2 (JIT, UTF, UCP)
 * reads the same syntax except a few escapes, which tok_regex_compile
 * rewrites: Oniguruma's \h is a hex digit (PCRE2: horizontal space), its \s
 * also matches U+0085, and its \w is letters, marks, decimal digits and
 * connector punctuation (PCRE2 10.42: letters, all numbers, underscore).
 *
 * A compiled `struct tok_regex` is immutable and shared between threads;
 * matching needs a `pcre2_match_data` and a match context (with a JIT stack)
 * owned by the caller, one per thread.
 * tok_regex_find_all lists non-overlapping matches the way Oniguruma's
 * find_iter does (an empty match right after the previous match is skipped).
 */
#ifndef KILN_TOKENIZER_TOK_REGEX_H
#define KILN_TOKENIZER_TOK_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct kiln_error;

struct tok_regex {
    pcre2_code *code;
    int jit;
};

/* A match list: pairs of byte offsets [start, end). */
struct tok_spans {
    size_t *v;   /* 2 * n entries */
    size_t n, cap;
};
void tok_spans_free(struct tok_spans *s);
void tok_spans_push(struct tok_spans *s, size_t start, size_t end);

int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, struct kiln_error *err);
void tok_regex_free(struct tok_regex *re);
/* Appends all matches in s[0..n) (valid UTF-8) to `out`. Returns 0, or -1
 * when PCRE2 gives up (match limit), with a message in err. */
int tok_regex_find_all(const struct tok_regex *re, pcre2_match_data *md, pcre2_match_context *mc, const char *s,
                       size_t n, struct tok_spans *out, struct kiln_error *err);

#endif
