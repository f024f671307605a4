/* kv_pool.h — the paged KV cache: one allocation per layer, sized once.
 *
 * Slots are grouped into pages of `page_size` consecutive slots; page p
 * owns slots [p * page_size, (p + 1) * page_size). Per layer, K holds
 * `k_width` floats per slot and V `v_width` floats per slot ([slot][kv_heads]
 * [head_dim] for ordinary attention). For MLA the layer keeps a single
 * latent row per slot ([kv_lora_rank + rope_dim]) and V is the leading
 * kv_lora_rank floats of K (`v_in_k`), so no V buffer exists.
 *
 * Elements are of the backend's KV type (backend_kv_dtype: fp32 on the
 * CPU, bf16 on CUDA by default; e4m3 with --kv-cache-dtype fp8_e4m3, one
 * byte per element, the model keeping each layer's scales).
 *
 * Pages are handed out from a free list; the radix cache and the scheduler
 * decide who owns them. The pool itself is single-threaded (the engine
 * thread owns it).
 *
 * Sliding windows: when every layer slides over the same window W
 * (kv_pool_set_window), no query at position pos reads a key before
 * pos - W + 1, so the scheduler returns the pages wholly before a running
 * sequence's window to the free list. Its page table keeps their indices,
 * pointing at the zero page: a page taken out of the free list at start-up,
 * never written, all zeros (backend_ops.alloc zeroes), so a kernel that
 * loads a whole tile across the window's start reads finite keys and
 * values there, which the window's mask then drops.
 *
 * Hybrid pools (SGLang's hybrid SWA memory): when some layers slide over
 * a window and others attend to the whole context (Gemma-3, gpt-oss), the
 * sliding layers' K/V live in pages of their own, fewer than the full
 * layers' (kv_pool_init_hybrid). Page ids stay the full layers' ones
 * everywhere (requests, the prefix cache, batches); each page id has a
 * sliding page beside it (swa_of), taken with it by kv_pool_alloc and
 * given back with it by kv_pool_release, or earlier, by kv_pool_drop_swa,
 * once the window of every position still to come has left it. A dropped
 * page's sliding page is the sliding pool's zero page (page 0, never
 * written). The runner turns a batch's pages and slots into the sliding
 * pool's (kv_pool_swa_page) for the sliding layers.
 */
#ifndef KILN_CACHE_KV_POOL_H
#define KILN_CACHE_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

struct backend;
struct kiln_error;

struct kv_layer_layout {
    long k_width; /* elements per slot in K */
    long v_width; /* elements per slot in V */
    int v_in_k;   /* V is the first v_width elements of K's row (MLA) */
};

struct kv_pool {
    struct backend *be;
    int n_layers;
    int page_size;
    int n_pages;
    struct kv_layer_layout *layout; /* [n_layers] */
    enum dtype dtype;               /* element type (the backend's kv_dtype) */
    void **k;                       /* [n_layers] device [n_pages * page_size][k_width] */
    void **v;                       /* [n_layers] device [...][v_width] or == k */
    int32_t *free_list;             /* stack of free page ids */
    int n_free;
    /* A page taken by the model for rows whose K/V nobody reads (the
     * padding rows of a decode graph); -1 until one is needed. */
    int32_t scratch_page;
    /* Every layer's sliding window (0: some layer attends to the whole
     * context) and the all-zero page that stands for returned pages in
     * page tables (-1 without a window). */
    int window;
    int32_t zero_page;
    /* Hybrid (swa_window > 0): the sliding layers (layer_swa[l]) hold
     * n_swa_pages pages, page 0 the zero page, page 1 the padding rows';
     * swa_of[n_pages] is each
     * page's sliding page (0 while it has none) and swa_free the free
     * ones. Everything else describes the full layers' pages. */
    int swa_window, n_swa_pages, n_swa_free;
    unsigned char *layer_swa; /* [n_layers] */
    int32_t *swa_of, *swa_free;
    /* [n_pages] the running requests whose window reads the page's
     * sliding page (the prefix cache's pages: kv_pool_swa_shed spares them) */
    int32_t *swa_pins;
};

/* Bytes one page takes across all layers with elements of `dtype`. */
size_t kv_pool_page_bytes(const struct kv_layer_layout *layout, int n_layers, int page_size,
                          enum dtype dtype);

int kv_pool_init(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                 int n_layers, int page_size, int n_pages, struct kiln_error *err);
/* A hybrid pool: layer l's K/V take n_swa_pages pages where layer_swa[l]
 * (page 0 the zero page, page 1 where the padding rows of a decode graph
 * write, KV_SWA_PAD), n_pages elsewhere; the sliding layers see positions
 * within swa_window of the query. n_swa_pages >= 3. */
enum { KV_SWA_PAD = 1 };
int kv_pool_init_hybrid(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                        const unsigned char *layer_swa, int n_layers, int page_size, int n_pages,
                        int swa_window, int n_swa_pages, struct kiln_error *err);
/* The bytes a token takes in the full layers (swa 0) or in the sliding
 * ones (swa 1) of a hybrid layout. */
size_t kv_pool_token_bytes_part(const struct kv_layer_layout *layout, const unsigned char *layer_swa,
                                int n_layers, enum dtype dtype, int swa);
/* A free list of page ids [0, n_pages) without storage: the pages of a
 * pool that lives on other ranks (DP attention groups), which the caller
 * allocates and releases here like a pool's. */
int kv_pool_init_ids(struct kv_pool *p, int page_size, int n_pages, struct kiln_error *err);
void kv_pool_free(struct kv_pool *p); /* also accepts a half-built or zeroed pool */

/* Every layer slides over `window` positions (> 0): takes page 0 off the
 * free list as the zero page, so pools made alike (the ranks' pools, DP
 * groups' id lists) agree on it. Right after kv_pool_init / _init_ids,
 * before any page was handed out or written. */
int kv_pool_set_window(struct kv_pool *p, int window, struct kiln_error *err);
/* With a window: how many of a sequence's pages, pages[0 .. n_pages),
 * lie wholly before the window of its position `next` (0 without one). */
int kv_pool_window_dead(const struct kv_pool *p, int next, int n_pages);
/* Returns pages[*n_dropped .. dead) to the free list and points the table
 * there at the zero page; *n_dropped becomes dead (nothing when it is
 * already that far). */
void kv_pool_drop(struct kv_pool *p, int32_t *pages, int *n_dropped, int dead);
/* Pages that can hold KV (the zero page is not one). */
static inline int kv_pool_usable(const struct kv_pool *p) { return p->n_pages - (p->zero_page >= 0); }

/* Hybrid pools. The sliding page of page `page` (the zero page when it has
 * none); whether it still has one. */
static inline int32_t kv_pool_swa_page(const struct kv_pool *p, int32_t page) { return p->swa_of[page]; }
static inline int kv_pool_swa_alive(const struct kv_pool *p, int32_t page) { return p->swa_of[page] != 0; }
/* How many of a sequence's pages, pages[0 .. n_pages), lie wholly before
 * the sliding window of its position `next` (0 unless hybrid). */
int kv_pool_swa_dead(const struct kv_pool *p, int next, int n_pages);
/* Gives back the sliding pages of pages[0 .. n) that still have one. */
void kv_pool_drop_swa(struct kv_pool *p, const int32_t *pages, int n);
/* The pins of pages[0 .. n) go up (delta 1) or down (-1). */
void kv_pool_swa_pin(struct kv_pool *p, const int32_t *pages, int n, int delta);
/* Gives back the sliding pages of the unpinned pages of pages[0 .. n)
 * that have one, until `want` went back; returns how many did. */
int kv_pool_swa_shed(struct kv_pool *p, const int32_t *pages, int n, int want);
/* Page dst, which has no sliding page, takes src's (src then has none);
 * nothing when dst has one or src has none. */
void kv_pool_swa_adopt(struct kv_pool *p, int32_t dst, int32_t src);
/* The sliding pages free (sliding pages usable: n_swa_pages - 2). */
static inline int kv_pool_swa_available(const struct kv_pool *p) { return p->n_swa_free; }

/* Takes n pages into out[] (in a hybrid pool, each with a sliding page);
 * returns -1 (taking none) when fewer are free. */
int kv_pool_alloc(struct kv_pool *p, int n, int32_t *out);
void kv_pool_release(struct kv_pool *p, const int32_t *pages, int n);
/* Pages kv_pool_alloc can hand out now. */
static inline int kv_pool_available(const struct kv_pool *p) {
    return p->swa_window > 0 && p->n_swa_free < p->n_free ? p->n_swa_free : p->n_free;
}

/* Copies page `page`'s K/V, every layer, to host[kv_pool_page_bytes] and
 * back (the host tier of the prefix cache, cache/host_cache.h). Not for
 * hybrid pools or id lists without storage. */
void kv_pool_page_save(const struct kv_pool *p, int32_t page, void *host);
void kv_pool_page_load(struct kv_pool *p, int32_t page, const void *host);

/* Reorders the free list with a fixed permutation so that consecutive
 * allocations get scattered pages (tests use it to exercise paging). */
void kv_pool_scramble(struct kv_pool *p, uint64_t seed);

#endif
