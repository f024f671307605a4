/* radix.c — the prefix cache tree (see radix.h for the picture).
 *
 * Layout choices and the reasons for them:
 * - Each node owns one edge: key[n_tokens] and pages[n_tokens / page_size]
 *   in one allocation. Splitting allocates fresh arrays for both halves but
 *   keeps the lower node's identity, because callers hold pointers to it
 *   (their lock) and those must still name the same position afterwards.
 * - Children sit in an open-addressing hash map keyed by the hash of the
 *   child's first page. Page-aligned edges mean two children never share a
 *   first page, so (hash, first page compared exactly) identifies a child.
 *   A prompt-heavy root may have thousands of children; a sorted array would
 *   cost a memmove per insert and several cache misses per lookup.
 * - Subtree roots (one per extra key) live in a map of their own, compared
 *   with strcmp. They hold no pages; once empty and unlocked they are
 *   ordinary zero-page leaves, evicted in LRU order like the rest, so
 *   one-off cache salts do not accumulate.
 * - Evictable leaves (no children, lock count 0) sit in a binary min-heap on
 *   (last access, serial). Every node on a touched path gets the same stamp
 *   from a logical clock, so order is exact and deterministic.
 * - Only the last node of a path can be a leaf, so a touch re-sifts at most
 *   one heap entry; lock/unlock add or remove nodes as lock counts cross 0.
 */
#include "cache/radix.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

struct child_slot {
    uint64_t hash;
    struct radix_node *node; /* NULL: empty slot */
};

struct child_map {
    struct child_slot *slots; /* [cap], cap a power of two, or NULL when empty */
    int cap, n;
};

struct radix_node {
    struct radix_node *parent; /* NULL for a subtree root */
    int32_t *key;              /* [n_tokens] the edge's token ids */
    int32_t *pages;            /* [n_tokens / page_size], same allocation as key */
    int n_tokens;
    int lock;                  /* locks taken on this node or any descendant */
    int heap_idx;              /* index in the LRU heap; -1 when not an evictable leaf */
    uint64_t hash;             /* first page's hash (subtree root: the extra key's) */
    uint64_t last_access;      /* logical clock of the last match/insert through it */
    uint64_t serial;           /* creation order; breaks ties in the heap */
    struct child_map children;
    char *extra_key; /* subtree roots only */
};

struct radix_tree {
    int page_size;
    radix_release_fn release;
    void *user;
    struct child_map roots; /* extra key -> subtree root */
    struct radix_node **heap; /* [heap_cap] evictable leaves, min (last_access, serial) first */
    int heap_n, heap_cap;
    int total_pages, evictable_pages;
    uint64_t clock, next_serial;
};

static inline int node_pages(const struct radix_tree *t, const struct radix_node *x) {
    return x->n_tokens / t->page_size;
}

/* ---- hashing ---- */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_page(const int32_t *ids, int page_size) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < page_size; i++) h = mix64(h ^ (uint32_t)ids[i]) + (uint64_t)i;
    return h;
}

static uint64_t hash_string(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed: map indices use the low bits */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return mix64(h);
}

/* ---- child map (linear probing, backward-shift deletion: no tombstones) ---- */

static void cmap_free(struct child_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static struct radix_node *cmap_find_page(const struct child_map *m, uint64_t hash,
                                         const int32_t *ids, int page_size) {
    if (!m->n) return NULL;
    int mask = m->cap - 1;
    for (int i = (int)(hash & (uint64_t)mask);; i = (i + 1) & mask) {
        const struct child_slot *s = &m->slots[i];
        if (!s->node) return NULL;
        if (s->hash == hash && !memcmp(s->node->key, ids, (size_t)page_size * sizeof *ids))
            return s->node;
    }
}

static struct radix_node *cmap_find_root(const struct child_map *m, uint64_t hash,
                                         const char *extra_key) {
    if (!m->n) return NULL;
    int mask = m->cap - 1;
    for (int i = (int)(hash & (uint64_t)mask);; i = (i + 1) & mask) {
        const struct child_slot *s = &m->slots[i];
        if (!s->node) return NULL;
        if (s->hash == hash && !strcmp(s->node->extra_key, extra_key)) return s->node;
    }
}

static void cmap_put_nogrow(struct child_map *m, uint64_t hash, struct radix_node *x) {
    int mask = m->cap - 1;
    int i = (int)(hash & (uint64_t)mask);
    while (m->slots[i].node) i = (i + 1) & mask;
    m->slots[i].hash = hash;
    m->slots[i].node = x;
    m->n++;
}

static void cmap_put(struct child_map *m, uint64_t hash, struct radix_node *x) {
    if ((m->n + 1) * 4 > m->cap * 3) { /* keep load <= 3/4 so probes stay short */
        struct child_map g = {xcalloc((size_t)(m->cap ? m->cap * 2 : 4), sizeof *g.slots),
                              m->cap ? m->cap * 2 : 4, 0};
        for (int i = 0; i < m->cap; i++)
            if (m->slots[i].node) cmap_put_nogrow(&g, m->slots[i].hash, m->slots[i].node);
        free(m->slots);
        *m = g;
    }
    cmap_put_nogrow(m, hash, x);
}

static int cmap_slot_of(const struct child_map *m, uint64_t hash, const struct radix_node *x) {
    int mask = m->cap - 1;
    for (int i = (int)(hash & (uint64_t)mask);; i = (i + 1) & mask) {
        KILN_ASSERT_MSG(m->slots[i].node, "radix: child missing from its parent's map");
        if (m->slots[i].node == x) return i;
    }
}

static void cmap_replace(struct child_map *m, uint64_t hash, const struct radix_node *old,
                         struct radix_node *x) {
    m->slots[cmap_slot_of(m, hash, old)].node = x;
}

static void cmap_remove(struct child_map *m, uint64_t hash, const struct radix_node *x) {
    int mask = m->cap - 1;
    int hole = cmap_slot_of(m, hash, x);
    m->slots[hole].node = NULL;
    m->n--;
    /* Pull later entries of the probe run back into the hole unless their
     * home slot lies cyclically after the hole (then they must stay). */
    for (int j = (hole + 1) & mask; m->slots[j].node; j = (j + 1) & mask) {
        int home = (int)(m->slots[j].hash & (uint64_t)mask);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            m->slots[hole] = m->slots[j];
            m->slots[j].node = NULL;
            hole = j;
        }
    }
    if (!m->n) cmap_free(m); /* leaves keep no table */
}

/* ---- LRU heap ---- */

static inline int heap_less(const struct radix_node *a, const struct radix_node *b) {
    return a->last_access != b->last_access ? a->last_access < b->last_access
                                            : a->serial < b->serial;
}

static inline void heap_set(struct radix_tree *t, int i, struct radix_node *x) {
    t->heap[i] = x;
    x->heap_idx = i;
}

static void heap_up(struct radix_tree *t, int i) {
    struct radix_node *x = t->heap[i];
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_less(x, t->heap[p])) break;
        heap_set(t, i, t->heap[p]);
        i = p;
    }
    heap_set(t, i, x);
}

static void heap_down(struct radix_tree *t, int i) {
    struct radix_node *x = t->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= t->heap_n) break;
        if (c + 1 < t->heap_n && heap_less(t->heap[c + 1], t->heap[c])) c++;
        if (!heap_less(t->heap[c], x)) break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, x);
}

static void heap_push(struct radix_tree *t, struct radix_node *x) {
    KILN_ASSERT(x->heap_idx < 0);
    if (t->heap_n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 64;
        t->heap = xrealloc(t->heap, (size_t)t->heap_cap * sizeof *t->heap);
    }
    heap_set(t, t->heap_n++, x);
    heap_up(t, x->heap_idx);
}

static void heap_remove(struct radix_tree *t, struct radix_node *x) {
    int i = x->heap_idx;
    KILN_ASSERT(i >= 0 && i < t->heap_n && t->heap[i] == x);
    x->heap_idx = -1;
    struct radix_node *last = t->heap[--t->heap_n];
    if (i == t->heap_n) return;
    heap_set(t, i, last);
    heap_up(t, i);
    heap_down(t, last->heap_idx);
}

/* ---- nodes ---- */

static struct radix_node *node_new(struct radix_tree *t, struct radix_node *parent,
                                   const int32_t *key, const int32_t *pages, int n_tokens) {
    struct radix_node *x = xcalloc(1, sizeof *x);
    int np = n_tokens / t->page_size;
    x->parent = parent;
    x->n_tokens = n_tokens;
    x->heap_idx = -1;
    x->serial = t->next_serial++;
    if (n_tokens) {
        x->key = xmalloc((size_t)(n_tokens + np) * sizeof *x->key);
        x->pages = x->key + n_tokens;
        memcpy(x->key, key, (size_t)n_tokens * sizeof *key);
        memcpy(x->pages, pages, (size_t)np * sizeof *pages);
        x->hash = hash_page(key, t->page_size);
    }
    return x;
}

static void node_free(struct radix_node *x) {
    cmap_free(&x->children);
    free(x->key);
    free(x->extra_key);
    free(x);
}

static struct radix_node *subtree_root(struct radix_tree *t, const char *extra_key) {
    if (!extra_key) extra_key = "";
    uint64_t h = hash_string(extra_key);
    struct radix_node *r = cmap_find_root(&t->roots, h, extra_key);
    if (r) return r;
    r = node_new(t, NULL, NULL, NULL, 0);
    r->extra_key = xstrdup(extra_key);
    r->hash = h;
    cmap_put(&t->roots, h, r);
    heap_push(t, r); /* an empty unlocked root is a zero-page leaf */
    return r;
}

/* Splits child x after its first m tokens (0 < m < n_tokens, page-aligned);
 * returns the new upper node, which takes x's place under x's parent. */
static struct radix_node *split(struct radix_tree *t, struct radix_node *x, int m) {
    int ps = t->page_size;
    struct radix_node *up = node_new(t, x->parent, x->key, x->pages, m);
    up->lock = x->lock; /* every lock through x also passes through up */
    up->last_access = x->last_access;
    cmap_replace(&x->parent->children, x->hash, x, up);

    int rest = x->n_tokens - m, rest_pages = rest / ps;
    int32_t *buf = xmalloc((size_t)(rest + rest_pages) * sizeof *buf);
    memcpy(buf, x->key + m, (size_t)rest * sizeof *buf);
    memcpy(buf + rest, x->pages + m / ps, (size_t)rest_pages * sizeof *buf);
    free(x->key);
    x->key = buf;
    x->pages = buf + rest;
    x->n_tokens = rest;
    x->hash = hash_page(x->key, ps);
    x->parent = up;
    cmap_put(&up->children, x->hash, x);
    return up;
}

/* Follows ids[0..n) from root as far as whole pages match, splitting the
 * last edge if the match ends inside it. Returns the matched token count;
 * *end gets the deepest node reached. Copies pages when pages_out != NULL. */
static int walk(struct radix_tree *t, struct radix_node *root, const int32_t *ids, int n,
                int32_t *pages_out, struct radix_node **end) {
    int ps = t->page_size, pos = 0;
    struct radix_node *x = root;
    while (n - pos >= ps) {
        struct radix_node *c =
            cmap_find_page(&x->children, hash_page(ids + pos, ps), ids + pos, ps);
        if (!c) break;
        int lim = n - pos < c->n_tokens ? (n - pos) / ps * ps : c->n_tokens;
        int m = lim; /* the first page already matched through the map */
        if (memcmp(c->key + ps, ids + pos + ps, (size_t)(lim - ps) * sizeof *ids)) {
            int k = ps; /* rare path: find the first differing token, keep whole pages */
            while (c->key[k] == ids[pos + k]) k++;
            m = k / ps * ps;
        }
        int whole = m == c->n_tokens;
        if (!whole) c = split(t, c, m);
        if (pages_out) memcpy(pages_out + pos / ps, c->pages, (size_t)(m / ps) * sizeof *pages_out);
        pos += m;
        x = c;
        if (!whole) break; /* the key diverges (or ends) inside this edge */
    }
    *end = x;
    return pos;
}

/* Stamps the path x..root as just used. Only x can be a leaf in the heap. */
static void touch(struct radix_tree *t, struct radix_node *x) {
    uint64_t now = ++t->clock;
    for (struct radix_node *y = x; y; y = y->parent) y->last_access = now;
    if (x->heap_idx >= 0) heap_down(t, x->heap_idx);
}

/* ---- public API ---- */

struct radix_tree *radix_create(int page_size, radix_release_fn release, void *user) {
    KILN_ASSERT(page_size >= 1);
    struct radix_tree *t = xcalloc(1, sizeof *t);
    t->page_size = page_size;
    t->release = release;
    t->user = user;
    return t;
}

/* Every node of the tree (subtree roots included), parents before their
 * children, into a new array of *n. Iterative: with page size 1 a long
 * prompt can make a deep tree. */
static struct radix_node **all_nodes(const struct radix_tree *t, int *n) {
    int m = 0, cap = 64;
    struct radix_node **v = xmalloc((size_t)cap * sizeof *v);
    for (int i = 0; i < t->roots.cap; i++)
        if (t->roots.slots[i].node) {
            if (m == cap) v = xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
            v[m++] = t->roots.slots[i].node;
        }
    for (int k = 0; k < m; k++) { /* v grows behind k: a breadth-first walk */
        const struct radix_node *x = v[k];
        for (int i = 0; i < x->children.cap; i++)
            if (x->children.slots[i].node) {
                if (m == cap) v = xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
                v[m++] = x->children.slots[i].node;
            }
    }
    *n = m;
    return v;
}

void radix_destroy(struct radix_tree *t) {
    if (!t) return;
    int n;
    struct radix_node **all = all_nodes(t, &n);
    for (int k = 0; k < n; k++) {
        int np = node_pages(t, all[k]);
        if (np && t->release) t->release(t->user, all[k]->pages, np);
    }
    for (int k = 0; k < n; k++) node_free(all[k]);
    free(all);
    cmap_free(&t->roots);
    free(t->heap);
    free(t);
}

int radix_match(struct radix_tree *t, const char *extra_key, const int32_t *ids, int n,
                int32_t *pages_out, struct radix_node **node) {
    KILN_ASSERT(n >= 0);
    struct radix_node *end;
    int matched = walk(t, subtree_root(t, extra_key), ids, n, pages_out, &end);
    touch(t, end);
    if (node) *node = end;
    return matched;
}

void radix_lock(struct radix_tree *t, struct radix_node *node) {
    for (struct radix_node *x = node; x; x = x->parent)
        if (x->lock++ == 0) {
            t->evictable_pages -= node_pages(t, x);
            if (x->heap_idx >= 0) heap_remove(t, x);
        }
}

void radix_unlock(struct radix_tree *t, struct radix_node *node) {
    for (struct radix_node *x = node; x; x = x->parent) {
        KILN_ASSERT_MSG(x->lock > 0, "radix: unlock without a matching lock");
        if (--x->lock == 0) {
            t->evictable_pages += node_pages(t, x);
            if (!x->children.n) heap_push(t, x);
        }
    }
}

int radix_insert(struct radix_tree *t, const char *extra_key, const int32_t *ids, int n,
                 const int32_t *pages, struct radix_node **node) {
    int ps = t->page_size;
    KILN_ASSERT_MSG(n >= 0 && n % ps == 0, "radix_insert: key length must be page-aligned");
    struct radix_node *x;
    int matched = walk(t, subtree_root(t, extra_key), ids, n, NULL, &x);
    if (matched < n) {
        struct radix_node *leaf = node_new(t, x, ids + matched, pages + matched / ps, n - matched);
        if (x->heap_idx >= 0) heap_remove(t, x); /* no longer a leaf */
        cmap_put(&x->children, leaf->hash, leaf);
        t->total_pages += node_pages(t, leaf);
        t->evictable_pages += node_pages(t, leaf);
        heap_push(t, leaf);
        x = leaf;
    }
    touch(t, x);
    if (node) *node = x;
    return matched;
}

int radix_evict(struct radix_tree *t, int n_pages) {
    int released = 0;
    while (released < n_pages && t->heap_n) {
        struct radix_node *x = t->heap[0];
        heap_remove(t, x);
        int np = node_pages(t, x);
        if (np && t->release) t->release(t->user, x->pages, np);
        released += np;
        t->total_pages -= np;
        t->evictable_pages -= np;
        struct radix_node *p = x->parent;
        if (p) {
            cmap_remove(&p->children, x->hash, x);
            if (!p->children.n && !p->lock) heap_push(t, p); /* the parent is a leaf now */
        } else {
            cmap_remove(&t->roots, x->hash, x);
        }
        node_free(x);
    }
    return released;
}

static int lru_cmp(const void *a, const void *b) {
    const struct radix_node *x = *(struct radix_node *const *)a, *y = *(struct radix_node *const *)b;
    return heap_less(x, y) ? -1 : heap_less(y, x);
}

void radix_visit_lru(const struct radix_tree *t, radix_visit_fn fn, void *user) {
    int n, m = 0;
    struct radix_node **all = all_nodes(t, &n);
    for (int k = 0; k < n; k++) /* the subtree roots hold no pages */
        if (node_pages(t, all[k])) all[m++] = all[k];
    qsort(all, (size_t)m, sizeof *all, lru_cmp);
    for (int i = 0; i < m && !fn(user, all[i]->pages, node_pages(t, all[i])); i++) {}
    free(all);
}

int radix_total_pages(const struct radix_tree *t) { return t->total_pages; }
int radix_evictable_pages(const struct radix_tree *t) { return t->evictable_pages; }

void radix_validate(const struct radix_tree *t) {
    int ps = t->page_size, total = 0, evictable = 0, n = 0, cap = 64, leaves = 0;
    const struct radix_node **stack = xmalloc((size_t)cap * sizeof *stack);
    for (int i = 0; i < t->roots.cap; i++) {
        const struct radix_node *r = t->roots.slots[i].node;
        if (!r) continue;
        KILN_ASSERT(!r->parent && r->extra_key && !r->n_tokens);
        KILN_ASSERT(t->roots.slots[i].hash == hash_string(r->extra_key));
        if (n == cap) stack = xrealloc(stack, (size_t)(cap *= 2) * sizeof *stack);
        stack[n++] = r;
    }
    while (n) {
        const struct radix_node *x = stack[--n];
        int child_locks = 0, n_children = 0;
        for (int i = 0; i < x->children.cap; i++) {
            const struct radix_node *c = x->children.slots[i].node;
            if (!c) continue;
            KILN_ASSERT(c->parent == x && !c->extra_key);
            KILN_ASSERT(c->n_tokens > 0 && c->n_tokens % ps == 0);
            KILN_ASSERT(c->hash == x->children.slots[i].hash && c->hash == hash_page(c->key, ps));
            KILN_ASSERT(cmap_find_page(&x->children, c->hash, c->key, ps) == c);
            KILN_ASSERT(c->last_access <= x->last_access);
            child_locks += c->lock;
            n_children++;
            if (n == cap) stack = xrealloc(stack, (size_t)(cap *= 2) * sizeof *stack);
            stack[n++] = c;
        }
        KILN_ASSERT(n_children == x->children.n && (x->children.cap == 0) == (n_children == 0));
        KILN_ASSERT(x->lock >= child_locks);
        int in_heap = !n_children && !x->lock;
        KILN_ASSERT(in_heap ? x->heap_idx >= 0 && x->heap_idx < t->heap_n &&
                                  t->heap[x->heap_idx] == x
                            : x->heap_idx == -1);
        leaves += in_heap;
        total += node_pages(t, x);
        if (!x->lock) evictable += node_pages(t, x);
    }
    free(stack);
    KILN_ASSERT(leaves == t->heap_n);
    for (int i = 1; i < t->heap_n; i++) KILN_ASSERT(!heap_less(t->heap[i], t->heap[(i - 1) / 2]));
    KILN_ASSERT(total == t->total_pages && evictable == t->evictable_pages);
}
