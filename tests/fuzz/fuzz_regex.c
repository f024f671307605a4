/* fuzz_regex.c — arbitrary bytes as a regular expression through the
 * translator (src/grammar/regex.c), as a whole-text pattern and as a JSON
 * Schema string pattern. A pattern is either refused with its byte offset
 * (an offset inside the pattern), or translated to EBNF that the grammar
 * engine compiles, or refuses only for its size limits (KILN_ERR_TOO_LARGE:
 * nested counted repetitions can pass a million states). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *text, size_t len, int ok, struct kiln_error *err, size_t size) {
    if (!ok) {
        const char *at = strstr(err->msg, "at offset ");
        KILN_ASSERT(at != NULL);
        KILN_ASSERT(strtoul(at + 10, NULL, 10) <= size);
        return;
    }
    struct grammar *g = grammar_compile_ebnf(text, len, "root", err);
    if (!g && err->code != KILN_ERR_TOO_LARGE)
        kiln_assert_fail("translated pattern compiles", __FILE__, __LINE__, err->msg);
    grammar_unref(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1024) return 0;
    const char *p = (const char *)data;
    struct kiln_error err = {0};
    struct buf b = {0};
    int ok = grammar_ebnf_from_regex(p, size, &b, &err) == 0;
    check(b.data, b.len, ok, &err, size);
    buf_clear(&b);
    buf_puts(&b, "root ::= \"\\\"\" ");
    ok = regex_to_ebnf_expr(p, size, REGEX_JSON, &b, &err) == 0;
    buf_puts(&b, " \"\\\"\"\n");
    check(b.data, b.len, ok, &err, size);
    buf_free(&b);
    return 0;
}
