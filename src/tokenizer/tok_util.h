/* tok_util.h — small building blocks shared by the tokenizer files.
 *
 * Owns nothing global. Provides: a growable byte buffer (`struct tok_buf`,
 * always NUL-terminated once used), a block arena whose pointers stay valid
 * until reset (pieces of text point into it while an input is encoded),
 * Rust-compatible lossy conversion
 * (String::from_utf8_lossy: one U+FFFD per maximal invalid subpart), the
 * character classes that `tokenizers` takes from Rust's char methods, and the
 * string hash used by every table.
 */
#ifndef KILN_TOKENIZER_TOK_UTIL_H
#define KILN_TOKENIZER_TOK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/utf8.h"

struct tok_buf {
    char *data;
    size_t len;
    size_t cap;
};

void tok_buf_free(struct tok_buf *b);
void tok_buf_reserve(struct tok_buf *b, size_t extra);
void tok_buf_append(struct tok_buf *b, const void *p, size_t n);
static inline void tok_buf_clear(struct tok_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}
static inline void tok_buf_push(struct tok_buf *b, char c) {
    if (b->len + 2 > b->cap) tok_buf_reserve(b, 1);
    b->data[b->len++] = c;
    b->data[b->len] = 0;
}
/* Appends the UTF-8 encoding of `cp`. */
void tok_buf_push_cp(struct tok_buf *b, uint32_t cp);

struct tok_arena_block;
struct tok_arena {
    struct tok_arena_block *head;
    size_t block_size;
};
void tok_arena_free(struct tok_arena *a);
/* Frees all but one block; earlier pointers become invalid. */
void tok_arena_reset(struct tok_arena *a);
char *tok_arena_alloc(struct tok_arena *a, size_t n);


/* Appends the lossy conversion of s[0..n) to out. With `final` 0 a valid
 * but incomplete sequence at the end is not converted; returns the number of
 * input bytes consumed. */
size_t utf8_lossy_append(struct tok_buf *out, const char *s, size_t n, int final);

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
