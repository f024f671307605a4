/* host_cache.c — the host tier of the prefix cache (see host_cache.h).
 *
 * Entries are slots [0, capacity): a slot's page bytes, key, parent key
 * and tokens. A chained hash table (buckets of slot indices, a next index
 * per slot) finds a key; a doubly linked list over the slots in use orders
 * them by last use (head: most recent); free slots are a stack. */
#include "cache/host_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "cache/kv_pool.h"

struct host_cache {
    size_t page_bytes;
    int page_size;
    long capacity, used;
    unsigned char *data; /* [capacity][page_bytes] */
    uint64_t *key, *parent;
    int32_t *tokens;     /* [capacity][page_size] */
    long *next;          /* hash chain */
    long *prev_lru, *next_lru;
    long lru_head, lru_tail;
    long *bucket;        /* [n_buckets] first slot, -1 */
    long n_buckets;
    long *free_slots;
    long n_free;
};

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t host_cache_root(const char *salt) {
    uint64_t h = 0x6b696c6e2d686963ull; /* any constant: the root of "" */
    for (const unsigned char *s = (const unsigned char *)(salt ? salt : ""); *s; s++) h = mix(h ^ *s);
    return mix(h ^ 0xffu);
}

uint64_t host_cache_key(uint64_t parent, const int32_t *tokens, int page_size) {
    uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < page_size; i++) h = mix(h ^ (uint32_t)tokens[i]);
    return h;
}

struct host_cache *host_cache_create(const struct kv_pool *p, long capacity) {
    if (capacity < 1) return NULL;
    struct host_cache *h = xcalloc(1, sizeof *h);
    h->page_bytes = kv_pool_page_bytes(p->layout, p->n_layers, p->page_size, p->dtype);
    h->page_size = p->page_size;
    h->capacity = capacity;
    /* untouched pages of this allocation cost no memory until a slot fills */
    h->data = malloc((size_t)capacity * h->page_bytes);
    if (!h->data) {
        free(h);
        return NULL;
    }
    h->key = xmalloc((size_t)capacity * sizeof *h->key);
    h->parent = xmalloc((size_t)capacity * sizeof *h->parent);
    h->tokens = xmalloc((size_t)capacity * (size_t)p->page_size * sizeof *h->tokens);
    h->next = xmalloc((size_t)capacity * sizeof *h->next);
    h->prev_lru = xmalloc((size_t)capacity * sizeof *h->prev_lru);
    h->next_lru = xmalloc((size_t)capacity * sizeof *h->next_lru);
    h->free_slots = xmalloc((size_t)capacity * sizeof *h->free_slots);
    for (long i = 0; i < capacity; i++) h->free_slots[i] = capacity - 1 - i;
    h->n_free = capacity;
    h->n_buckets = 1;
    while (h->n_buckets < 2 * capacity) h->n_buckets *= 2;
    h->bucket = xmalloc((size_t)h->n_buckets * sizeof *h->bucket);
    for (long i = 0; i < h->n_buckets; i++) h->bucket[i] = -1;
    h->lru_head = h->lru_tail = -1;
    return h;
}

void host_cache_destroy(struct host_cache *h) {
    if (!h) return;
    free(h->data);
    free(h->key);
    free(h->parent);
    free(h->tokens);
    free(h->next);
    free(h->prev_lru);
    free(h->next_lru);
    free(h->free_slots);
    free(h->bucket);
    free(h);
}

static long find(const struct host_cache *h, uint64_t key, uint64_t parent, const int32_t *tokens) {
    for (long s = h->bucket[key & (uint64_t)(h->n_buckets - 1)]; s >= 0; s = h->next[s])
        if (h->key[s] == key && h->parent[s] == parent &&
            !memcmp(h->tokens + (size_t)s * (size_t)h->page_size, tokens, (size_t)h->page_size * sizeof *tokens))
            return s;
    return -1;
}

static void lru_unlink(struct host_cache *h, long s) {
    if (h->prev_lru[s] >= 0) h->next_lru[h->prev_lru[s]] = h->next_lru[s];
    else h->lru_head = h->next_lru[s];
    if (h->next_lru[s] >= 0) h->prev_lru[h->next_lru[s]] = h->prev_lru[s];
    else h->lru_tail = h->prev_lru[s];
}

static void lru_front(struct host_cache *h, long s) {
    h->prev_lru[s] = -1;
    h->next_lru[s] = h->lru_head;
    if (h->lru_head >= 0) h->prev_lru[h->lru_head] = s;
    h->lru_head = s;
    if (h->lru_tail < 0) h->lru_tail = s;
}

/* Drops slot s (in use) from the table and the list; it becomes free. */
static void drop(struct host_cache *h, long s) {
    long *at = &h->bucket[h->key[s] & (uint64_t)(h->n_buckets - 1)];
    while (*at != s) {
        KILN_ASSERT(*at >= 0);
        at = &h->next[*at];
    }
    *at = h->next[s];
    lru_unlink(h, s);
    h->free_slots[h->n_free++] = s;
    h->used--;
}

int host_cache_put(struct host_cache *h, const struct kv_pool *p, int32_t page, uint64_t key, uint64_t parent,
                    const int32_t *tokens) {
    long s = find(h, key, parent, tokens);
    if (s >= 0) { /* the same prefix, so the same K/V: touched only */
        lru_unlink(h, s);
        lru_front(h, s);
        return 0;
    }
    if (!h->n_free) drop(h, h->lru_tail);
    s = h->free_slots[--h->n_free];
    kv_pool_page_save(p, page, h->data + (size_t)s * h->page_bytes);
    h->key[s] = key;
    h->parent[s] = parent;
    memcpy(h->tokens + (size_t)s * (size_t)h->page_size, tokens, (size_t)h->page_size * sizeof *tokens);
    long *b = &h->bucket[key & (uint64_t)(h->n_buckets - 1)];
    h->next[s] = *b;
    *b = s;
    lru_front(h, s);
    h->used++;
    return 1;
}

int host_cache_has(const struct host_cache *h, uint64_t key, uint64_t parent, const int32_t *tokens) {
    return find(h, key, parent, tokens) >= 0;
}

int host_cache_touch(struct host_cache *h, uint64_t key, uint64_t parent, const int32_t *tokens) {
    long s = find(h, key, parent, tokens);
    if (s < 0) return 0;
    lru_unlink(h, s);
    lru_front(h, s);
    return 1;
}

int host_cache_load(struct host_cache *h, struct kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens,
                    int32_t page) {
    long s = find(h, key, parent, tokens);
    if (s < 0) return -1;
    kv_pool_page_load(p, page, h->data + (size_t)s * h->page_bytes);
    lru_unlink(h, s);
    lru_front(h, s);
    return 0;
}

long host_cache_pages(const struct host_cache *h) { return h ? h->used : 0; }
long host_cache_capacity(const struct host_cache *h) { return h ? h->capacity : 0; }
