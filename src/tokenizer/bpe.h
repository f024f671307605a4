/* bpe.h — the BPE model of tokenizer.json and its word cache.
 *
 * `struct bpe` holds the vocabulary (token text -> id, and id -> text), the
 * merges as a hash map from an id pair to (rank, merged id), and the options
 * of `tokenizers`' BPE: unk_token with fuse_unk, byte_fallback ("<0xAB>"
 * tokens for characters outside the vocabulary), ignore_merges (a word that
 * is itself a token is emitted whole), continuing_subword_prefix and
 * end_of_word_suffix. Dropout is refused: it is random by design.
 *
 * bpe_word turns one pre-tokenized word into ids: symbols per character,
 * then repeatedly the lowest-ranked adjacent pair is merged (a binary heap
 * keyed by rank then position, with stale entries skipped), the same order
 * `tokenizers`' Word::merge_all uses. Results of words shorter than 256
 * bytes go into a bounded cache, emptied when full.
 */
#ifndef KILN_TOKENIZER_BPE_H
#define KILN_TOKENIZER_BPE_H

#include <jansson.h>
#include <stdint.h>

#include "kiln/tokenizer.h"
#include "tokenizer/tok_ctx.h"
#include "tokenizer/tok_map.h"

struct kiln_error;

/* Ids must stay below this so id-indexed tables remain small. */
#define BPE_MAX_ID (1 << 24)

struct bpe {
    struct tok_strmap vocab;
    uint32_t *id_slot;       /* [id_limit] vocab slot of each id, UINT32_MAX if unused */
    int32_t id_limit;        /* largest id + 1 */
    struct tok_pairmap merges;
    char *unk_token;         /* NULL when none */
    int32_t unk_id;          /* -1 when unk_token is not in the vocabulary */
    char *prefix, *suffix;   /* continuing_subword_prefix, end_of_word_suffix */
    size_t prefix_len, suffix_len;
    int fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256];   /* "<0xAB>" token ids, -1 when absent */
    /* SentencePiece-style models see whole texts as one word. When no merge
     * joins a character to a following "▁" (U+2581), a word can be cut
     * before every "▁" that follows another character without changing
     * the result, which makes the pieces short and cacheable. */
    int split_metaspace;
};

struct bpe_cache;

int bpe_parse(struct bpe *m, json_t *json, const char *path, struct kiln_error *err);
void bpe_free(struct bpe *m);
/* Token text of an id of the model vocabulary, NULL if none. */
const char *bpe_id_to_token(const struct bpe *m, int32_t id, size_t *len);
/* Appends the ids of word w[0..n) to out. */
int bpe_word(const struct bpe *m, struct tok_ctx *ctx, const char *w, size_t n, struct kiln_token_ids *out,
             struct kiln_error *err);

struct bpe_cache *bpe_cache_create(void);
void bpe_cache_destroy(struct bpe_cache *c);

/* Appends one id, growing the array. */
void tok_ids_push(struct kiln_token_ids *v, int32_t id);

#endif
