/* utf8.h — UTF-8 as the Unicode Standard defines it (chapter 3, D92 and
 * table 3-7): decoding, encoding, validation, code point counts and the
 * "maximal subpart" rule that says how many U+FFFD replace a bad sequence
 * (the rule Rust's String::from_utf8_lossy, Python's errors="replace" and
 * the WHATWG decoder follow). Every module that reads or writes UTF-8 uses
 * these; there is no second decoder.
 *
 * Valid means: no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no
 * surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF), and no
 * sequence cut short. Functions that take a length never read past it;
 * utf8_decode alone trusts its input and is for text validated before.
 */
#ifndef KILN_BASE_UTF8_H
#define KILN_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

struct buf;

/* The length of the sequence a lead byte starts (2..4), 1 for ASCII and for
 * bytes that cannot lead one (continuations, C0, C1, F5..FF). */
static inline size_t utf8_seq_len(unsigned char lead) {
    if (lead < 0xC2) return 1;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF5) return 4;
    return 1;
}

/* Whether c continues a sequence (10xxxxxx) rather than starting one. */
static inline int utf8_is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/* The start of the code point that ends at `end` in s[start..end)
 * (end > start): `end - 1` moved back over continuation bytes, never
 * before `start`. Scans that go backwards (rstrip, a word before a match)
 * use it on valid text. */
static inline size_t utf8_prev(const char *s, size_t start, size_t end) {
    size_t i = end - 1;
    while (i > start && utf8_is_cont((unsigned char)s[i])) i--;
    return i;
}

/* Decodes one code point of text known to be valid UTF-8; returns its
 * length in bytes. Hot loops over validated text use it. */
static inline size_t utf8_decode(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

/* Checks the sequence at s[0..n) (n >= 1): returns its length (1..4) when it
 * is valid, else 0 with `*err_len` the length of its maximal invalid
 * subpart (1..3: the bytes one U+FFFD replaces) and `*incomplete` 1 when
 * those bytes are a valid prefix that the end of the input cut short. */
size_t utf8_next(const unsigned char *s, size_t n, size_t *err_len, int *incomplete);

/* Decodes one code point from s[0..n) (n >= 1), checking it: a maximal
 * invalid subpart decodes as U+FFFD. Returns the bytes consumed (>= 1). */
size_t utf8_decode_lossy(const char *s, size_t n, uint32_t *cp);

/* Writes the encoding of `cp` (at most U+10FFFF; surrogates are the
 * caller's concern) and returns its length, 1..4. Inline: byte-level
 * pre-tokenizers encode every input byte with it. */
static inline size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The offset of the first byte that is not part of valid UTF-8, or n when
 * all of s[0..n) is valid. */
size_t utf8_validate(const char *s, size_t n);

/* Where text cut at n bytes should end so that it does not end inside a
 * character: n, or the start of a last sequence that the cut left
 * incomplete (a valid prefix of one). Bytes that are invalid anyway are
 * kept for the lossy conversion to replace. */
size_t utf8_cut(const char *s, size_t n);

/* The number of code points in s[0..n), each maximal invalid subpart
 * counting as one (as it decodes to one U+FFFD). */
size_t utf8_count(const char *s, size_t n);

/* The byte offset of code point number `index` of s[0..n), counted as
 * utf8_count does; n when the text has fewer code points. */
size_t utf8_offset(const char *s, size_t n, size_t index);

/* Appends s[0..n) to out with each maximal invalid subpart replaced by one
 * U+FFFD (Rust's String::from_utf8_lossy). With `final` 0 a valid prefix
 * cut by the end of s is left for the next call: returns the number of
 * input bytes consumed. */
size_t utf8_lossy_append(struct buf *out, const char *s, size_t n, int final);

#endif
