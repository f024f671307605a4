/* ebnf_prefix.c — grammar_ebnf_prefix_rules: one namespace per translated
 * grammar, so that a tool-call grammar can hold every tool's parameter
 * schema (each translation names its rules root, value, r0, ...). */
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"

static int name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int name_char(char c) { return name_start(c) || (c >= '0' && c <= '9') || c == '-'; }

/* The end of the literal or class opened at s[i] (its closing byte's index
 * + 1), or 0 when it is not closed. */
static size_t skip_quoted(const char *s, size_t len, size_t i, char close) {
    for (size_t j = i + 1; j < len; j++) {
        if (s[j] == '\\') j++;
        else if (s[j] == close) return j + 1;
    }
    return 0;
}

int grammar_ebnf_prefix_rules(const char *text, size_t len, const char *prefix, struct buf *out,
                              struct kiln_error *err) {
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"' || c == '\'' || c == '[') {
            size_t end = skip_quoted(text, len, i, c == '[' ? ']' : c);
            if (!end) return kiln_errorf(err, "grammar: unterminated %s at byte %zu", c == '[' ? "class" : "literal", i);
            buf_append(out, text + i, end - i);
            i = end;
        } else if (c == '#') { /* a comment runs to the end of the line */
            size_t end = i;
            while (end < len && text[end] != '\n') end++;
            buf_append(out, text + i, end - i);
            i = end;
        } else if (c == '{') { /* a bound: digits and commas */
            size_t end = i;
            while (end < len && text[end] != '}') end++;
            end = end < len ? end + 1 : end;
            buf_append(out, text + i, end - i);
            i = end;
        } else if (name_start(c)) {
            size_t end = i;
            while (end < len && name_char(text[end])) end++;
            buf_puts(out, prefix);
            buf_append(out, text + i, end - i);
            i = end;
        } else {
            buf_push(out, c);
            i++;
        }
    }
    return 0;
}
