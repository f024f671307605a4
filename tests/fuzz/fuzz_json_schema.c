/* fuzz_json_schema.c — arbitrary bytes as a JSON Schema through the
 * translator (src/grammar/json_schema*.c), in the default, strict and
 * compact modes. A schema is either refused with a message that names
 * json_schema, or translated to EBNF that the grammar engine compiles: the
 * translator must never write a grammar the engine refuses, but for the
 * engine's size limits (KILN_ERR_TOO_LARGE: a pattern of nested counted
 * repetitions can pass them). A compiled grammar is then walked over a few
 * bytes of the input. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/error.h"
#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* deep schemas only make runs slower, not different */
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!s) return 0;
    static const struct grammar_json_opts modes[] = {{-1, 0}, {-1, 1}, {0, 0}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        struct kiln_error err = {0};
        struct buf b = {0};
        if (grammar_ebnf_from_json_schema(s, &modes[i], &b, &err)) {
            KILN_ASSERT(strstr(err.msg, "json_schema") != NULL);
            KILN_ASSERT(err.code != KILN_ERR_NONE);
            buf_free(&b);
            continue;
        }
        struct grammar *g = grammar_compile_ebnf(b.data, b.len, "root", &err);
        if (!g && err.code == KILN_ERR_TOO_LARGE) {
            buf_free(&b);
            continue;
        }
        if (!g) kiln_assert_fail("translated schema compiles", __FILE__, __LINE__, err.msg);
        struct grammar_vocab *v = grammar_vocab_create(0, NULL, NULL, NULL);
        struct grammar_matcher *m = grammar_matcher_create(g, v, &err);
        KILN_ASSERT(m != NULL);
        for (size_t k = 0; k < size && k < 64; k++)
            if (grammar_matcher_accept_bytes(m, (const char *)data + k, 1)) break;
        (void)grammar_matcher_can_end(m);
        grammar_matcher_free(m);
        grammar_vocab_free(v);
        grammar_unref(g);
        buf_free(&b);
    }
    json_decref(s);
    return 0;
}
