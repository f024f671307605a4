/* radix.h — the prefix cache: a radix tree from token-id sequences to the
 * KV pages that hold them, so requests sharing a prefix compute it once.
 *
 *   root ─ extra key "" ─┬─ [The quick brown] ─┬─ [fox jumps]   (leaf)
 *                        │   pages 3 9 4       └─ [cat sat]     (leaf)
 *                        └─ [Once upon]
 *        ─ extra key "tenant-b" ─ [The quick brown]   (never shared with "")
 *
 * - Keys are page-aligned: every edge holds a multiple of page_size tokens
 *   and one page id per page_size tokens; a match returns whole pages only.
 * - Requests using a cached path lock it (a lock count on every node from
 *   the root to the matched node); locked nodes are never evicted.
 * - Eviction frees unlocked leaves in least-recently-used order (a match or
 *   insert touches the path), handing the pages back through the release
 *   callback; a parent whose last child went becomes a leaf in turn.
 * - Different extra keys (cache_salt, ...) live in separate subtrees and
 *   never share entries; equal keys share.
 * The tree owns the pages inserted into it; the caller owns the rest.
 * Single-threaded: the engine thread owns it.
 *
 * A node pointer from radix_match / radix_insert stays valid while it is
 * locked; an unlocked one may be freed by the next radix_evict (empty
 * subtree roots included: they are zero-page leaves, evicted in LRU order
 * so that one-off extra keys do not pile up). Splits never move a node:
 * the new node goes above the split point, so a held node still ends where
 * it did.
 */
#ifndef KILN_CACHE_RADIX_H
#define KILN_CACHE_RADIX_H

#include <stdint.h>

struct radix_tree;
struct radix_node;

typedef void (*radix_release_fn)(void *user, const int32_t *pages, int n);

struct radix_tree *radix_create(int page_size, radix_release_fn release, void *user);
/* Releases every page the tree owns through the callback. */
void radix_destroy(struct radix_tree *t);

/* Longest cached page-aligned prefix of ids[0..n) under extra_key (NULL =
 * ""). Writes its pages to pages_out (room for n / page_size) and the node
 * where it ends to *node (the subtree root when nothing matched; never
 * NULL). Returns the matched token count (a multiple of page_size).
 * Splits an edge when the match ends inside it. */
int radix_match(struct radix_tree *t, const char *extra_key, const int32_t *ids, int n,
                int32_t *pages_out, struct radix_node **node);

/* Lock counts on the path root..node (node may be a subtree root). */
void radix_lock(struct radix_tree *t, struct radix_node *node);
void radix_unlock(struct radix_tree *t, struct radix_node *node);

/* Inserts ids[0..n) (n a multiple of page_size) with their pages. The
 * leading part already in the tree keeps the tree's pages: the return value
 * is that part's token count, and the caller must free its own pages for it
 * (pages[0 .. ret/page_size) that differ from the tree's). *node receives
 * the node where the key ends (for locking). */
int radix_insert(struct radix_tree *t, const char *extra_key, const int32_t *ids, int n,
                 const int32_t *pages, struct radix_node **node);

/* Evicts unlocked leaves, least recently used first, until at least n_pages
 * pages were released or nothing evictable is left. Returns pages released. */
int radix_evict(struct radix_tree *t, int n_pages);

/* Calls fn with each node's pages, least recently used node first (every
 * node, locked or not), until fn returns nonzero. O(nodes log nodes): for
 * freeing what the pages carry besides themselves (a hybrid KV pool's
 * sliding pages), not for every step. */
typedef int (*radix_visit_fn)(void *user, int32_t *pages, int n);
void radix_visit_lru(const struct radix_tree *t, radix_visit_fn fn, void *user);

int radix_total_pages(const struct radix_tree *t);     /* pages the tree owns */
int radix_evictable_pages(const struct radix_tree *t); /* of those, not locked */

/* Checks every internal invariant (parent links, child maps, lock counts,
 * heap membership and order, page counts) with KILN_ASSERT. O(tree size):
 * for tests and debugging, not for the serving loop. */
void radix_validate(const struct radix_tree *t);

#endif
