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
};

/* Bytes one page takes across all layers with elements of `dtype`. */
size_t kv_pool_page_bytes(const struct kv_layer_layout *layout, int n_layers, int page_size,
                          enum dtype dtype);

int kv_pool_init(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                 int n_layers, int page_size, int n_pages, struct kiln_error *err);
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

/* Takes n pages into out[]; returns -1 (taking none) when fewer are free. */
int kv_pool_alloc(struct kv_pool *p, int n, int32_t *out);
void kv_pool_release(struct kv_pool *p, const int32_t *pages, int n);
static inline int kv_pool_available(const struct kv_pool *p) { return p->n_free; }

/* Reorders the free list with a fixed permutation so that consecutive
 * allocations get scattered pages (tests use it to exercise paging). */
void kv_pool_scramble(struct kv_pool *p, uint64_t seed);

#endif
