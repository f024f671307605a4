#include "tokenizer/tok_util.h"

#include <stdlib.h>
#include <utf8proc.h>

#include "base/error.h"
#include "base/mem.h"

/* Blocks are chained newest first; a request larger than the block size
 * gets a block of its own. */
struct tok_arena_block {
    struct tok_arena_block *next;
    size_t used, size;
    char data[];
};

void tok_arena_free(struct tok_arena *a) {
    struct tok_arena_block *b = a->head;
    while (b) {
        struct tok_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

void tok_arena_reset(struct tok_arena *a) {
    if (!a->head) return;
    /* Keep the largest block: the next input is likely similar in size. */
    struct tok_arena_block *keep = a->head, *b;
    for (b = a->head; b; b = b->next)
        if (b->size > keep->size) keep = b;
    b = a->head;
    while (b) {
        struct tok_arena_block *n = b->next;
        if (b != keep) free(b);
        b = n;
    }
    keep->next = NULL;
    keep->used = 0;
    a->head = keep;
}

char *tok_arena_alloc(struct tok_arena *a, size_t n) {
    struct tok_arena_block *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t bs = a->block_size ? a->block_size : (size_t)1 << 16;
        size_t size = n > bs ? n : bs;
        struct tok_arena_block *nb = xmalloc(sizeof *nb + size);
        nb->used = 0;
        nb->size = size;
        nb->next = a->head;
        a->head = nb;
        b = nb;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

int uc_is_whitespace(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static utf8proc_category_t category(uint32_t cp) {
    if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
    return utf8proc_category((utf8proc_int32_t)cp);
}

int uc_is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static int is_letter_cat(utf8proc_category_t c) {
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

int uc_is_mark(uint32_t cp) {
    utf8proc_category_t c = category(cp);
    return c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME;
}

int uc_is_punctuation(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
               (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = category(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

int uc_is_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1;
    utf8proc_category_t c = category(cp);
    return is_letter_cat(c) || (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME) ||
           c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

/* A multiply-xorshift hash over 8-byte words: fast for the short strings
 * (tokens, words) that dominate, and well mixed for open addressing. */
uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * k);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
        h ^= h >> 29;
    }
    h *= k;
    h ^= h >> 31;
    return h;
}
