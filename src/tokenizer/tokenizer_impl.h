/* tokenizer_impl.h — the inside of `struct kiln_tokenizer`, shared by
 * tokenizer.c (loading, encode, decode, lookups) and detok_stream.c.
 *
 * After loading nothing changes except the encode contexts and their BPE
 * caches: TOK_SLOTS of them, each behind a mutex taken with trylock, so up
 * to that many threads encode at once with warm caches and a further one
 * builds a temporary context instead of waiting.
 */
#ifndef KILN_TOKENIZER_TOKENIZER_IMPL_H
#define KILN_TOKENIZER_TOKENIZER_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "kiln/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/postprocess.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tok_ctx.h"

#define TOK_SLOTS 4

struct kiln_tokenizer {
    struct bpe model;
    struct normalizer *normalizer;
    struct pretokenizer *pretokenizer;
    struct postprocess *post;
    struct decoder *decoder;
    struct added_vocab added;
    int32_t id_limit;
    size_t vocab_size;
    /* Per id: the text decoding starts from (an added token's normalized
     * form, its content, or the model token), NULL for unused ids. */
    const char **dec_str;   /* [id_limit] */
    uint32_t *dec_len;      /* [id_limit] */
    uint8_t *special;       /* [id_limit] dropped by skip_special_tokens */
    int32_t bos_id, eos_id;
    int add_bos, add_eos;
    struct tok_slot {
        pthread_mutex_t lock;
        int lock_init;
        struct tok_ctx ctx;
        struct bpe_cache *cache;
    } slots[TOK_SLOTS];
};

/* The decode text of an id; 0 when the id is unknown (then skipped). */
static inline int tok_decode_str(const struct kiln_tokenizer *t, int32_t id, const char **s, size_t *n) {
    if (id < 0 || id >= t->id_limit || !t->dec_str[id]) return 0;
    *s = t->dec_str[id];
    *n = t->dec_len[id];
    return 1;
}

#endif
