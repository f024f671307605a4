/* host_cache.h — the host tier of the prefix cache (SGLang's hierarchical
 * cache): KV pages the radix cache evicts from the device pool are kept in
 * host memory, and a later request whose prefix continues past what the
 * device still caches loads them back instead of computing them again.
 *
 * A page is known by its prefix: the chained key of every page before it
 * and its own page_size tokens, under the request's extra key (cache_salt),
 * as the radix tree tells prefixes apart. An entry stores the key, its
 * parent's key and the page's tokens, so a lookup checks the tokens and
 * the chain, not the 64-bit hash alone. The store holds `capacity` pages of
 * the pool's page size (every layer's K and V), least recently used first
 * out when full; an entry stays after it was loaded (the device copy may be
 * evicted again, and then costs no copy).
 *
 * Copies go through the pool's backend (kv_pool_page_save / _load). Engine
 * thread only. */
#ifndef KILN_CACHE_HOST_CACHE_H
#define KILN_CACHE_HOST_CACHE_H

#include <stddef.h>
#include <stdint.h>

struct kv_pool;
struct host_cache;

/* A store of `capacity` pages of pool p's page size; NULL when the host
 * memory cannot be had. */
struct host_cache *host_cache_create(const struct kv_pool *p, long capacity);
void host_cache_destroy(struct host_cache *h);

/* The key chain: the root of extra key `salt` (NULL = ""), and the key of
 * a page after `parent` holding tokens[0 .. page_size). */
uint64_t host_cache_root(const char *salt);
uint64_t host_cache_key(uint64_t parent, const int32_t *tokens, int page_size);

/* Keeps device page `page` of p under (key, parent, tokens): a copy into
 * host memory, the least recently used entry going when the store is full;
 * an entry already there is only touched. 1 when it copied. */
int host_cache_put(struct host_cache *h, const struct kv_pool *p, int32_t page, uint64_t key, uint64_t parent,
                    const int32_t *tokens);
/* Whether (key, parent, tokens) is stored; _touch also makes it the most
 * recently used. */
int host_cache_has(const struct host_cache *h, uint64_t key, uint64_t parent, const int32_t *tokens);
int host_cache_touch(struct host_cache *h, uint64_t key, uint64_t parent, const int32_t *tokens);
/* Copies the stored page into device page `page` of p (touching it);
 * 0, or -1 when it is not stored. */
int host_cache_load(struct host_cache *h, struct kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens,
                    int32_t page);

long host_cache_pages(const struct host_cache *h);    /* stored */
long host_cache_capacity(const struct host_cache *h);

#endif
