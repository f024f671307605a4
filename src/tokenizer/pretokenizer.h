/* pretokenizer.h — the `pre_tokenizer` of tokenizer.json.
 *
 * Supported types: Split (String or Regex pattern, every behavior, invert),
 * ByteLevel (add_prefix_space, use_regex with the GPT-2 regex), Metaspace
 * (replacement, prepend_scheme always/first/never, split), Digits,
 * Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer,
 * CharDelimiterSplit and Sequence. Others fail to load, naming the type.
 *
 * pretokenizer_run splits every piece of *cur (results go to *other, then
 * the two are swapped), the way PreTokenizedString::split applies one
 * pre-tokenizer to all splits before the next one runs.
 */
#ifndef KILN_TOKENIZER_PRETOKENIZER_H
#define KILN_TOKENIZER_PRETOKENIZER_H

#include <jansson.h>
#include <stdint.h>

#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_pattern.h"

struct kiln_error;

enum pretokenizer_type {
    PRETOKENIZER_TYPE_SEQUENCE,
    PRETOKENIZER_TYPE_SPLIT,
    PRETOKENIZER_TYPE_BYTE_LEVEL,
    PRETOKENIZER_TYPE_METASPACE,
    PRETOKENIZER_TYPE_DIGITS,
    PRETOKENIZER_TYPE_PUNCTUATION,
    PRETOKENIZER_TYPE_WHITESPACE,
    PRETOKENIZER_TYPE_WHITESPACE_SPLIT,
    PRETOKENIZER_TYPE_BERT,
    PRETOKENIZER_TYPE_CHAR_DELIMITER,
};

enum prepend_scheme {
    PREPEND_SCHEME_ALWAYS,
    PREPEND_SCHEME_FIRST,
    PREPEND_SCHEME_NEVER,
};

struct pretokenizer {
    enum pretokenizer_type type;
    struct pretokenizer *children;   /* Sequence */
    size_t n_children;
    struct tok_pattern pattern;      /* Split; ByteLevel and Whitespace regexes */
    int has_pattern;
    enum split_behavior behavior;    /* Split, Punctuation */
    int invert;                      /* Split */
    int add_prefix_space, use_regex; /* ByteLevel */
    uint32_t replacement;            /* Metaspace; CharDelimiterSplit delimiter */
    char rep[4];
    size_t rep_len;
    enum prepend_scheme prepend_scheme;
    int split;                       /* Metaspace */
    int individual_digits;           /* Digits */
};

int pretokenizer_parse(struct pretokenizer **out, json_t *json, const char *path, struct kiln_error *err);
void pretokenizer_free(struct pretokenizer *p);
int pretokenizer_run(const struct pretokenizer *p, struct tok_ctx *ctx, struct tok_pieces **cur,
                     struct tok_pieces **other, struct kiln_error *err);

#endif
