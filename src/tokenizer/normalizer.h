/* normalizer.h — the `normalizer` of tokenizer.json.
 *
 * Supported types: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Strip,
 * StripAccents, Replace, Prepend and Sequence; anything else fails to load
 * with a message naming the type. normalizer_apply maps one piece of text
 * (never containing an added token) to its normalized form in ctx's arena,
 * carrying `zp` (see tok_ctx.h) along.
 */
#ifndef KILN_TOKENIZER_NORMALIZER_H
#define KILN_TOKENIZER_NORMALIZER_H

#include <jansson.h>
#include <stdint.h>

#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_pattern.h"

struct kiln_error;

enum normalizer_type {
    NORMALIZER_TYPE_SEQUENCE,
    NORMALIZER_TYPE_NFC,
    NORMALIZER_TYPE_NFD,
    NORMALIZER_TYPE_NFKC,
    NORMALIZER_TYPE_NFKD,
    NORMALIZER_TYPE_LOWERCASE,
    NORMALIZER_TYPE_STRIP,
    NORMALIZER_TYPE_STRIP_ACCENTS,
    NORMALIZER_TYPE_REPLACE,
    NORMALIZER_TYPE_PREPEND,
};

struct normalizer {
    enum normalizer_type type;
    struct normalizer *children; /* Sequence */
    size_t n_children;
    int strip_left, strip_right;  /* Strip */
    struct tok_pattern pattern;   /* Replace */
    char *content;                /* Replace content, Prepend text */
    size_t content_len;
};

/* `json` may be null (no normalizer): *out is then NULL. */
int normalizer_parse(struct normalizer **out, json_t *json, const char *path, struct kiln_error *err);
void normalizer_free(struct normalizer *n);
/* Quick check: 1 when s[0..n) is certainly unchanged by the unicode form
 * `t` (NFC, NFD, NFKC or NFKD), 0 when it may change. `memo` (NULL or
 * ctx->nf_memo) remembers per-character answers. */
int normalizer_is_stable(enum normalizer_type t, const char *s, size_t n, uint32_t *memo);
int normalizer_apply(const struct normalizer *n, struct tok_ctx *ctx, struct tok_piece *p, struct kiln_error *err);

#endif
