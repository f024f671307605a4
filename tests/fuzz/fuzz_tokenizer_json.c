/* libFuzzer target: arbitrary bytes as tokenizer.json. Loading must either
 * succeed or fail with a message; a loaded tokenizer must encode and decode
 * (whole and streamed, which must agree) without crashing. Seeds:
 * tests/fuzz/corpus_tokenizer_json/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/tokenizer.h"

static void exercise(struct kiln_tokenizer *tok, const char *text, size_t len) {
    struct kiln_error err;
    struct kiln_token_ids ids = {0};
    for (int special = 0; special < 2; special++) {
        if (kiln_tokenizer_encode(tok, text, len, special, &ids, &err)) continue;
        char *dec;
        size_t dec_len;
        if (kiln_tokenizer_decode(tok, ids.ids, ids.n, special, &dec, &dec_len, &err)) continue;
        struct kiln_detok_stream *st;
        kiln_detok_stream_init(&st, tok, special);
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
    }
    kiln_token_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct kiln_error err;
    struct kiln_tokenizer *tok;
    if (kiln_tokenizer_load_buffer(&tok, (const char *)data, size, NULL, 0, &err)) {
        if (!err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    static const char *const texts[] = {
        "Hello world, it's 2024!  Ünïcödé 你好 😀\n\ttabs <s> <|endoftext|> <mask>",
        "   ",
        "",
        "\xE2\x96\x81 a\xE2\x96\x81\xE2\x96\x81\x62 123 <0x41>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) exercise(tok, texts[i], strlen(texts[i]));
    /* Random ids, including byte and special tokens. */
    int32_t ids[64];
    int32_t limit = kiln_tokenizer_id_limit(tok);
    for (int i = 0; i < 64 && limit > 0; i++) ids[i] = (int32_t)((size_t)(i * 7919 + (int)size) % (size_t)limit);
    char *dec;
    size_t n;
    if (limit > 0 && !kiln_tokenizer_decode(tok, ids, 64, 0, &dec, &n, &err)) free(dec);
    kiln_tokenizer_free(tok);
    return 0;
}
