/* tok_pattern.h — the `pattern` of Split, Replace (normalizer and decoder):
 * either {"String": "..."} (a literal) or {"Regex": "..."}, and the
 * splitting rules (`behavior`, `invert`) that turn its matches into pieces.
 *
 * tok_pattern_find lists non-overlapping matches; tok_split_piece takes any
 * such list (also one made by a character predicate, as Digits and
 * Punctuation do) and appends the resulting non-empty pieces, exactly as
 * NormalizedString::split in `tokenizers` does for each behavior.
 */
#ifndef KILN_TOKENIZER_TOK_PATTERN_H
#define KILN_TOKENIZER_TOK_PATTERN_H

#include <jansson.h>

#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_regex.h"

struct kiln_error;

struct tok_pattern {
    int is_regex;     /* literal patterns use memmem unless empty */
    char *literal;
    size_t literal_len;
    struct tok_regex re;
};

enum split_behavior {
    SPLIT_BEHAVIOR_REMOVED,
    SPLIT_BEHAVIOR_ISOLATED,
    SPLIT_BEHAVIOR_MERGED_WITH_PREVIOUS,
    SPLIT_BEHAVIOR_MERGED_WITH_NEXT,
    SPLIT_BEHAVIOR_CONTIGUOUS,
};

/* Parses obj[key] = {"String": s} | {"Regex": r}; `path` names obj. */
int tok_pattern_parse(struct tok_pattern *p, json_t *obj, const char *path, const char *key, struct kiln_error *err);
int tok_pattern_init_regex(struct tok_pattern *p, const char *re, struct kiln_error *err);
void tok_pattern_free(struct tok_pattern *p);
/* Replaces ctx->spans by the matches in s[0..n). */
int tok_pattern_find(const struct tok_pattern *p, struct tok_ctx *ctx, const char *s, size_t n, struct kiln_error *err);

int tok_split_behavior_parse(json_t *obj, const char *path, const char *key, enum split_behavior dflt,
                             enum split_behavior *out, struct kiln_error *err);
/* Splits `piece` around `matches` (sorted, non-overlapping) and appends the
 * non-empty results to `out`. */
void tok_split_piece(const struct tok_piece *piece, const struct tok_spans *matches, int invert,
                     enum split_behavior behavior, struct tok_pieces *out);

#endif
