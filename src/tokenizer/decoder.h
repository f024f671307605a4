/* decoder.h — the `decoder` of tokenizer.json, run as a stream.
 *
 * Supported types: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace
 * and Sequence (no decoder joins tokens with spaces, as `tokenizers` does).
 * Others fail to load, naming the type.
 *
 * `tokenizers` decodes a whole token list at once; each decoder maps a list
 * of strings to a list of strings. Here every decoder is a stage that gets
 * tokens as events (begin, text, end) and passes its output tokens on as
 * soon as later input can no longer change them: ByteFallback keeps a byte
 * run until it is known to be valid or not, ByteLevel keeps an unfinished
 * UTF-8 sequence, Strip keeps the trailing characters it might remove, and
 * Fuse makes one token of everything. Whole-list decoding is the same
 * pipeline run to its end, so streaming and batch decoding agree by
 * construction.
 *
 *     struct dec_run r;
 *     dec_run_init(&r, decoder);
 *     for each token: dec_run_token(&r, text, len);   // output in r.out
 *     dec_run_finish(&r);                             // the rest
 */
#ifndef KILN_TOKENIZER_DECODER_H
#define KILN_TOKENIZER_DECODER_H

#include <jansson.h>
#include <stdint.h>

#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_pattern.h"

struct kiln_error;

enum decoder_type {
    DECODER_TYPE_SEQUENCE,
    DECODER_TYPE_BYTE_LEVEL,
    DECODER_TYPE_METASPACE,
    DECODER_TYPE_BYTE_FALLBACK,
    DECODER_TYPE_FUSE,
    DECODER_TYPE_STRIP,
    DECODER_TYPE_REPLACE,
    DECODER_TYPE_JOIN, /* internal: no decoder, tokens joined by spaces */
};

struct decoder {
    enum decoder_type type;
    struct decoder *children;  /* Sequence */
    size_t n_children;
    struct tok_pattern pattern; /* Replace */
    char *content;              /* Replace */
    size_t content_len;
    uint32_t strip_char;        /* Strip */
    size_t strip_start, strip_stop;
    char rep[4];                /* Metaspace replacement */
    size_t rep_len;
    int prepend;                /* Metaspace: prepend_scheme != never */
};

int decoder_parse(struct decoder **out, json_t *json, const char *path, struct kiln_error *err);
void decoder_free(struct decoder *d);

/* Per-stage state of one decoding run. */
struct dec_stage {
    const struct decoder *d;
    struct buf buf;   /* token being collected, or held-back text */
    struct buf bytes; /* ByteFallback run; ByteLevel pending bytes */
    size_t index;         /* tokens seen (Metaspace, Join) */
    size_t lead;          /* Strip: leading chars removed so far */
    size_t held;          /* Strip: trailing chars held back */
    size_t checked;       /* ByteFallback: bytes of the run known to be whole valid characters */
    int lead_done, open, invalid;
};

struct dec_run {
    struct dec_stage *stages;
    size_t n_stages;
    struct buf out;   /* final text produced so far */
    struct tok_ctx *ctx;  /* for Replace patterns; owned */
};

/* `d` NULL means no decoder. */
void dec_run_init(struct dec_run *r, const struct decoder *d);
void dec_run_free(struct dec_run *r);
int dec_run_token(struct dec_run *r, const char *s, size_t n);
int dec_run_finish(struct dec_run *r);

#endif
