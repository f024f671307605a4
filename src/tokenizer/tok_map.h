/* tok_map.h — the hash tables behind vocabulary and merge lookups.
 *
 * `struct tok_strmap` maps byte strings to int32 values (token text to id).
 * It copies the keys into its own pool, so callers may pass transient
 * strings. `struct tok_pairmap` maps a pair of ids to a merge (rank and the
 * id of the merged token). Both use open addressing with linear probing and
 * grow at 50 % load, so a lookup is one hash and usually one probe.
 */
#ifndef KILN_TOKENIZER_TOK_MAP_H
#define KILN_TOKENIZER_TOK_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

struct tok_strmap_slot {
    uint64_t hash;   /* 0 marks an empty slot */
    uint32_t off;    /* key offset in the pool */
    uint32_t len;
    int32_t value;
};

struct tok_strmap {
    struct tok_strmap_slot *slots;
    size_t mask;     /* slot count - 1 */
    size_t count;
    struct buf pool; /* keys, each NUL-terminated */
};

void tok_strmap_init(struct tok_strmap *m, size_t expected);
void tok_strmap_free(struct tok_strmap *m);
/* Inserts or overwrites; returns the pool offset of the stored key. */
uint32_t tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t value);
/* Returns the value or -1. */
int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len);
/* Pointer to a key stored at `off` (from put). */
static inline const char *tok_strmap_key(const struct tok_strmap *m, uint32_t off) { return m->pool.data + off; }

struct tok_pairmap_slot {
    uint64_t key;    /* (a << 32) | b; UINT64_MAX marks an empty slot */
    int32_t rank;
    int32_t merged;
};

struct tok_pairmap {
    struct tok_pairmap_slot *slots;
    size_t mask;
    size_t count;
};

void tok_pairmap_init(struct tok_pairmap *m, size_t expected);
void tok_pairmap_free(struct tok_pairmap *m);
void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);

static inline uint64_t tok_pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
/* Both halves of the key must reach the slot bits: ids are small, so a
 * plain multiply would leave the left id out of the low bits. */
static inline size_t tok_pair_slot(uint64_t key, size_t mask) {
    uint64_t h = (key ^ (key >> 29)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (size_t)h & mask;
}
/* Returns the slot or NULL. Inline: it is the inner loop of BPE. */
static inline const struct tok_pairmap_slot *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b) {
    if (!m->slots) return NULL;
    uint64_t key = tok_pair_key(a, b);
    size_t i = tok_pair_slot(key, m->mask);
    for (;;) {
        const struct tok_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}

#endif
