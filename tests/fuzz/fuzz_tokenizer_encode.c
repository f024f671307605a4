/* libFuzzer target: arbitrary text through a real tokenizer (the tiny
 * byte-level BPE of the fixtures, or the folder in KILN_FUZZ_TOKENIZER, e.g.
 * a fetched llama2 for byte fallback). Invalid UTF-8 must be refused; valid
 * text must encode, decode to the same text when the tokenizer is
 * byte-level lossless, and stream exactly like decode. With
 * KILN_FUZZ_LOSSLESS=1 (for tokenizers without a normalizer, e.g. llama3)
 * every valid input must decode back to itself. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/tokenizer.h"

static struct kiln_tokenizer *tok;
static int lossless, lossless_all;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    struct kiln_error err;
    char path[4096];
    const char *dir = getenv("KILN_FUZZ_TOKENIZER");
    if (!dir) {
        /* tests/fuzz/ -> tests/fixtures/... next to this source file */
        const char *f = __FILE__, *slash = strrchr(f, '/');
        snprintf(path, sizeof path, "%.*s/../fixtures/oracle/tiny-models/_tokenizer", (int)(slash ? slash - f : 1),
                 slash ? f : ".");
        dir = path;
        lossless = 1; /* byte-level and NFC only: decode(encode(x)) == NFC(x) */
    }
    lossless_all = getenv("KILN_FUZZ_LOSSLESS") && !strcmp(getenv("KILN_FUZZ_LOSSLESS"), "1");
    if (kiln_tokenizer_load(&tok, dir, &err)) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct kiln_error err;
    struct kiln_token_ids ids = {0};
    const char *text = (const char *)data;
    if (kiln_tokenizer_encode(tok, text, size, 1, &ids, &err)) {
        if (!strstr(err.msg, "UTF-8")) abort();
        return 0;
    }
    char *dec;
    size_t dec_len;
    if (kiln_tokenizer_decode(tok, ids.ids, ids.n, 0, &dec, &dec_len, &err)) abort();
    /* ASCII has no normalization, so it must come back unchanged. */
    int ascii = 1;
    for (size_t i = 0; i < size; i++) ascii &= data[i] < 0x80;
    if (((lossless && ascii) || lossless_all) && (dec_len != size || memcmp(dec, data, size))) abort();
    struct kiln_detok_stream *st;
    kiln_detok_stream_init(&st, tok, 0);
    size_t at = 0;
    for (size_t i = 0; i < ids.n; i++) {
        const char *t;
        size_t n;
        kiln_detok_stream_push(st, ids.ids[i], &t, &n);
        if (at + n > dec_len || memcmp(dec + at, t, n)) abort();
        at += n;
    }
    const char *t;
    size_t n;
    kiln_detok_stream_flush(st, &t, &n);
    if (at + n != dec_len || memcmp(dec + at, t, n)) abort();
    kiln_detok_stream_free(st);
    free(dec);
    kiln_token_ids_free(&ids);
    return 0;
}
