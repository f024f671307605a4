/* fuzz_ebnf.c — compiles arbitrary EBNF text and, when it compiles, runs a
 * matcher over the bytes after the first NUL of the input, filling token
 * masks of a small fixed vocabulary along the way. Nothing may crash, leak
 * or hang; a grammar past the compiler's limits must end with an error.
 * The mask from the per-state cache must equal the mask of the plain trie
 * walk at every step (abort otherwise). Seed corpus: tests/fuzz/corpus/fuzz_ebnf/;
 * dictionary: tests/fuzz/fuzz_ebnf.dict. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

static const char *const toks[] = {"a", "b", "ab", "\"", "{\"", "\":", "\",", "}", "]", " ", "\n", "0", "12", "x.",
                                   "\xC3", "\xA9", "\xC3\xA9", "\xF0\x9F\x98\x80", "(", ")", "()", ",", "[", "a\"",
                                   "true", "-", "\\", "<s>"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct grammar_vocab *v;
    enum { N = sizeof toks / sizeof *toks };
    if (!v) {
        size_t lens[N];
        uint8_t special[N] = {0};
        for (int k = 0; k < N; k++) lens[k] = strlen(toks[k]);
        special[N - 1] = 1;
        v = grammar_vocab_create(N, toks, lens, special);
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    struct kiln_error err = {0};
    struct grammar *g = grammar_compile_ebnf((const char *)data, glen, NULL, &err);
    if (!g) {
        if (!err.msg[0]) abort(); /* a refusal always says why */
        return 0;
    }
    struct grammar_matcher *m = grammar_matcher_create(g, v, &err);
    const uint8_t *rest = nul ? nul + 1 : data + size;
    size_t n = (size_t)(data + size - rest);
    uint32_t a[1], b[1];
    for (size_t i = 0; i <= n && i < 64; i++) {
        m->use_cache = 1;
        grammar_matcher_fill_mask(m, a);
        m->use_cache = 0;
        grammar_matcher_fill_mask(m, b);
        if (a[0] != b[0] || (a[0] >> (N - 1) & 1)) abort();
        if (i == n || grammar_matcher_accept_bytes(m, (const char *)rest + i, 1)) break;
    }
    grammar_matcher_free(m);
    grammar_unref(g);
    return 0;
}
