#include "tokenizer/tok_map.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_util.h"

static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < expected * 2) n *= 2;
    return n;
}

void tok_strmap_init(struct tok_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t n = table_size(expected);
    m->slots = xcalloc(n, sizeof *m->slots);
    m->mask = n - 1;
}

void tok_strmap_free(struct tok_strmap *m) {
    free(m->slots);
    buf_free(&m->pool);
    memset(m, 0, sizeof *m);
}

static uint64_t key_hash(const char *key, size_t len) {
    uint64_t h = tok_hash(key, len);
    return h ? h : 1;
}

static void strmap_grow(struct tok_strmap *m) {
    size_t n = (m->mask + 1) * 2;
    struct tok_strmap_slot *slots = xcalloc(n, sizeof *slots);
    for (size_t i = 0; i <= m->mask; i++) {
        struct tok_strmap_slot *s = &m->slots[i];
        if (!s->hash) continue;
        size_t j = (size_t)s->hash & (n - 1);
        while (slots[j].hash) j = (j + 1) & (n - 1);
        slots[j] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = n - 1;
}

uint32_t tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t value) {
    KILN_ASSERT(len < UINT32_MAX);
    if ((m->count + 1) * 2 > m->mask + 1) strmap_grow(m);
    uint64_t h = key_hash(key, len);
    size_t i = (size_t)h & m->mask;
    for (;;) {
        struct tok_strmap_slot *s = &m->slots[i];
        if (!s->hash) break;
        if (s->hash == h && s->len == len && !memcmp(m->pool.data + s->off, key, len)) {
            s->value = value;
            return s->off;
        }
        i = (i + 1) & m->mask;
    }
    KILN_ASSERT(m->pool.len + len + 1 <= UINT32_MAX);
    uint32_t off = (uint32_t)m->pool.len;
    buf_append(&m->pool, key, len);
    buf_push(&m->pool, 0); /* the key's end is part of the pool */
    struct tok_strmap_slot *s = &m->slots[i];
    s->hash = h;
    s->off = off;
    s->len = (uint32_t)len;
    s->value = value;
    m->count++;
    return off;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = key_hash(key, len);
    size_t i = (size_t)h & m->mask;
    for (;;) {
        const struct tok_strmap_slot *s = &m->slots[i];
        if (!s->hash) return -1;
        if (s->hash == h && s->len == len && !memcmp(m->pool.data + s->off, key, len)) return s->value;
        i = (i + 1) & m->mask;
    }
}

void tok_pairmap_init(struct tok_pairmap *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = xmalloc(n * sizeof *m->slots);
    for (size_t i = 0; i < n; i++) m->slots[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->count = 0;
}

void tok_pairmap_free(struct tok_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static void pairmap_insert(struct tok_pairmap_slot *slots, size_t mask, const struct tok_pairmap_slot *v) {
    size_t i = tok_pair_slot(v->key, mask);
    while (slots[i].key != UINT64_MAX && slots[i].key != v->key) i = (i + 1) & mask;
    slots[i] = *v;
}

void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    if ((m->count + 1) * 2 > m->mask + 1) {
        size_t n = (m->mask + 1) * 2;
        struct tok_pairmap_slot *slots = xmalloc(n * sizeof *slots);
        for (size_t i = 0; i < n; i++) slots[i].key = UINT64_MAX;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->slots[i].key != UINT64_MAX) pairmap_insert(slots, n - 1, &m->slots[i]);
        free(m->slots);
        m->slots = slots;
        m->mask = n - 1;
    }
    struct tok_pairmap_slot v = {tok_pair_key(a, b), rank, merged};
    size_t i = tok_pair_slot(v.key, m->mask);
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != v.key) i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX) m->count++;
    m->slots[i] = v;
}
