/* tok_ctx.h — per-thread working state for encoding, and the text pieces
 * that flow from the added-token split through normalizers and
 * pre-tokenizers to the model.
 *
 * A `struct tok_ctx` owns an arena (normalized and transformed text lives
 * there until the encode call ends), the PCRE2 match data and JIT stack,
 * scratch vectors, and optionally the BPE word cache. The tokenizer keeps a
 * few, each behind a mutex taken with trylock; a thread that finds them all
 * busy builds a temporary one, so encoding never blocks on another thread.
 *
 * A `struct tok_piece` is a slice of text plus `zp`, the number of its
 * leading bytes that map back to offset 0 of the original input — what
 * `tokenizers` consults (offsets_original().0 == 0) for Metaspace's
 * prepend_scheme "first".
 */
#ifndef KILN_TOKENIZER_TOK_CTX_H
#define KILN_TOKENIZER_TOK_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok_regex.h"
#include "tokenizer/tok_util.h"

struct bpe_cache;

#define TOK_NF_MEMO_BITS 10

struct tok_piece {
    const char *s;
    size_t len;
    size_t zp;
};

struct tok_pieces {
    struct tok_piece *v;
    size_t n, cap;
};
void tok_pieces_push(struct tok_pieces *p, const char *s, size_t len, size_t zp);

/* BPE symbols and merge heap, reused across words. */
struct bpe_symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* 0 once merged into its left neighbour */
};
struct bpe_merge {
    int32_t rank;
    int32_t pos;
    int32_t merged;
};

struct tok_ctx {
    struct tok_arena arena;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *jit;
    struct tok_spans spans;
    struct tok_pieces pieces[2];
    struct buf tmp;
    struct bpe_symbol *syms;
    size_t syms_cap;
    struct bpe_merge *heap;
    size_t heap_cap;
    struct bpe_cache *cache; /* not owned; NULL to run without */
    uint32_t nf_memo[1u << TOK_NF_MEMO_BITS]; /* normalizer quick-check answers */
};

void tok_ctx_init(struct tok_ctx *c);
void tok_ctx_free(struct tok_ctx *c);

#endif
