/* added_tokens.h — the `added_tokens` of tokenizer.json and how they are cut
 * out of the input before the model runs.
 *
 * Like `tokenizers`' AddedVocabulary: tokens with normalized=false are found
 * in the raw input, those with normalized=true in the normalized text (their
 * pattern is their own normalized form). Matching is leftmost-longest over a
 * byte trie; a match is then subject to single_word (no word character
 * right before or after), lstrip/rstrip (the match swallows neighbouring
 * whitespace). Ids come from the model vocabulary when the content is a
 * token there, otherwise they continue after it, as `tokenizers` assigns
 * them (the "id" field in the file is not trusted).
 */
#ifndef KILN_TOKENIZER_ADDED_TOKENS_H
#define KILN_TOKENIZER_ADDED_TOKENS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_map.h"

struct kiln_error;
struct bpe;
struct normalizer;

struct added_token {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
    char *norm;       /* normalized form when it differs from content, else NULL */
    size_t norm_len;
};

/* Trie over token bytes: edges are (node, byte) -> child in a pair map. */
struct added_trie {
    struct tok_pairmap edges; /* key (node, byte), rank = child node */
    int32_t *term;            /* [n_nodes] index of the token ending here, -1 */
    size_t n_nodes, cap_nodes;
    uint8_t first[256];       /* bytes some token starts with */
    int empty;
};

struct added_vocab {
    struct added_token *tokens; /* one per distinct id, in file order */
    size_t n;
    struct tok_strmap by_content; /* content -> id */
    struct tok_strmap specials;   /* contents of special tokens */
    int32_t *index_of_id;         /* [id_limit] index into tokens, -1 */
    int32_t id_limit;             /* largest added id + 1 (0 if none) */
    struct added_trie raw, normalized;
};

/* A piece of input: an added token (id >= 0) or text to tokenize (id -1). */
struct added_split {
    size_t a, b;
    int32_t id;
};
struct added_splits {
    struct added_split *v;
    size_t n, cap;
};
void added_splits_free(struct added_splits *s);

int added_vocab_parse(struct added_vocab *av, json_t *arr, const struct bpe *model, const struct normalizer *norm,
                      struct tok_ctx *ctx, struct kiln_error *err);
void added_vocab_free(struct added_vocab *av);
/* Token of an added id, NULL if the id is not an added token. */
const struct added_token *added_vocab_token(const struct added_vocab *av, int32_t id);
/* Splits s[0..n) with the raw (normalized = 0) or normalized trie. */
void added_vocab_split(const struct added_vocab *av, int normalized, const char *s, size_t n, struct added_splits *out);

#endif
