/* tok_util.h — small building blocks shared by the tokenizer files.
 *
 * Owns nothing global. Provides: a block arena whose pointers stay valid
 * until reset (pieces of text point into it while an input is encoded), the
 * character classes that `tokenizers` takes from Rust's char methods, and the
 * string hash used by every table. Text is built in base/buf.h buffers and
 * checked and converted with base/utf8.h.
 */
#ifndef KILN_TOKENIZER_TOK_UTIL_H
#define KILN_TOKENIZER_TOK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"

struct tok_arena_block;
struct tok_arena {
    struct tok_arena_block *head;
    size_t block_size;
};
void tok_arena_free(struct tok_arena *a);
/* Frees all but one block; earlier pointers become invalid. */
void tok_arena_reset(struct tok_arena *a);
char *tok_arena_alloc(struct tok_arena *a, size_t n);



/* Character classes, as Rust's char methods define them. */
int uc_is_whitespace(uint32_t cp);  /* char::is_whitespace (White_Space) */
int uc_is_numeric(uint32_t cp);     /* char::is_numeric (N*) */
int uc_is_punctuation(uint32_t cp); /* ASCII punctuation or P* */
int uc_is_word(uint32_t cp);        /* regex \w: L, M, Nd, Pc, joiners */
int uc_is_mark(uint32_t cp);        /* M* */

/* GPT-2's byte-level alphabet: every byte gets a printable code point;
 * printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in
 * byte order. */
static inline uint32_t bytelevel_cp(unsigned char b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xA0) return 0x100u + 33 + (b - 0x7Fu);
    return 0x100u + 67; /* 0xAD */
}
/* Inverse of bytelevel_cp; -1 for code points outside the alphabet. */
static inline int bytelevel_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 0x100 || cp > 0x100 + 67) return -1;
    uint32_t n = cp - 0x100;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(0x7F + n - 33);
    return 0xAD;
}

/* 64-bit hash of a byte string. */
uint64_t tok_hash(const void *p, size_t n);

#endif
