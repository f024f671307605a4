#include "cache/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tensor/backend.h"

size_t kv_pool_page_bytes(const struct kv_layer_layout *layout, int n_layers, int page_size,
                          enum dtype dtype) {
    size_t per_slot = 0, es = dtype_size(dtype);
    for (int l = 0; l < n_layers; l++)
        per_slot += (size_t)(layout[l].k_width + (layout[l].v_in_k ? 0 : layout[l].v_width)) * es;
    return per_slot * (size_t)page_size;
}

size_t kv_pool_token_bytes_part(const struct kv_layer_layout *layout, const unsigned char *layer_swa,
                                int n_layers, enum dtype dtype, int swa) {
    size_t per_slot = 0, es = dtype_size(dtype);
    for (int l = 0; l < n_layers; l++)
        if (!!layer_swa[l] == !!swa)
            per_slot += (size_t)(layout[l].k_width + (layout[l].v_in_k ? 0 : layout[l].v_width)) * es;
    return per_slot;
}

static int init_pool(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                     const unsigned char *layer_swa, int n_layers, int page_size, int n_pages, int n_swa_pages,
                     struct kiln_error *err) {
    memset(p, 0, sizeof *p);
    if (page_size < 1) return kiln_errorf(err, "page size must be at least 1, got %d", page_size);
    if (n_pages < 1) return kiln_errorf(err, "KV pool needs at least one page, got %d", n_pages);
    p->be = be;
    p->n_layers = n_layers;
    p->page_size = page_size;
    p->n_pages = n_pages;
    p->dtype = backend_kv_dtype(be);
    size_t es = dtype_size(p->dtype);
    p->layout = xmalloc((size_t)n_layers * sizeof *layout);
    memcpy(p->layout, layout, (size_t)n_layers * sizeof *layout);
    p->k = xcalloc((size_t)n_layers, sizeof *p->k);
    p->v = xcalloc((size_t)n_layers, sizeof *p->v);
    for (int l = 0; l < n_layers; l++) {
        size_t slots = (size_t)(layer_swa && layer_swa[l] ? n_swa_pages : n_pages) * (size_t)page_size;
        p->k[l] = be->ops->alloc(be->ctx, slots * (size_t)layout[l].k_width * es);
        if (!p->k[l]) goto oom;
        if (layout[l].v_in_k) {
            p->v[l] = p->k[l];
        } else {
            p->v[l] = be->ops->alloc(be->ctx, slots * (size_t)layout[l].v_width * es);
            if (!p->v[l]) goto oom;
        }
    }
    p->free_list = xmalloc((size_t)n_pages * sizeof *p->free_list);
    /* a stack popped from the end: page 0 comes out first */
    for (int i = 0; i < n_pages; i++) p->free_list[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    p->scratch_page = -1;
    p->zero_page = -1;
    return 0;
oom:
    kv_pool_free(p);
    return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for a KV pool of %d pages of %d slots", n_pages,
                       page_size);
}

int kv_pool_init(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                 int n_layers, int page_size, int n_pages, struct kiln_error *err) {
    return init_pool(p, be, layout, NULL, n_layers, page_size, n_pages, 0, err);
}

int kv_pool_init_hybrid(struct kv_pool *p, struct backend *be, const struct kv_layer_layout *layout,
                        const unsigned char *layer_swa, int n_layers, int page_size, int n_pages,
                        int swa_window, int n_swa_pages, struct kiln_error *err) {
    if (swa_window < 1 || n_swa_pages < 3)
        return kiln_errorf(err, "a hybrid KV pool needs a window of at least 1 and three sliding pages, got %d and %d",
                           swa_window, n_swa_pages);
    if (init_pool(p, be, layout, layer_swa, n_layers, page_size, n_pages, n_swa_pages, err)) return -1;
    p->swa_window = swa_window;
    p->n_swa_pages = n_swa_pages;
    p->layer_swa = xmalloc((size_t)n_layers);
    memcpy(p->layer_swa, layer_swa, (size_t)n_layers);
    p->swa_of = xcalloc((size_t)n_pages, sizeof *p->swa_of);
    p->swa_pins = xcalloc((size_t)n_pages, sizeof *p->swa_pins);
    p->swa_free = xmalloc((size_t)n_swa_pages * sizeof *p->swa_free);
    /* page 0 is the zero page, page 1 the padding rows'; the stack pops page 2 first */
    for (int i = 0; i < n_swa_pages - 2; i++) p->swa_free[i] = n_swa_pages - 1 - i;
    p->n_swa_free = n_swa_pages - 2;
    return 0;
}

int kv_pool_init_ids(struct kv_pool *p, int page_size, int n_pages, struct kiln_error *err) {
    memset(p, 0, sizeof *p);
    if (page_size < 1) return kiln_errorf(err, "page size must be at least 1, got %d", page_size);
    if (n_pages < 1) return kiln_errorf(err, "KV pool needs at least one page, got %d", n_pages);
    p->page_size = page_size;
    p->n_pages = n_pages;
    p->free_list = xmalloc((size_t)n_pages * sizeof *p->free_list);
    for (int i = 0; i < n_pages; i++) p->free_list[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    p->scratch_page = -1;
    p->zero_page = -1;
    return 0;
}

int kv_pool_set_window(struct kv_pool *p, int window, struct kiln_error *err) {
    if (window < 1) return kiln_errorf(err, "a KV pool's sliding window must be at least 1, got %d", window);
    if (p->n_free != p->n_pages || p->n_pages < 2 || p->zero_page >= 0)
        return kiln_errorf(err, "the KV pool's window is set on a fresh pool of at least two pages");
    /* the stack pops page 0 first: it is at the end */
    KILN_ASSERT(p->free_list[p->n_free - 1] == 0);
    p->n_free--;
    p->zero_page = 0;
    p->window = window;
    return 0;
}

void kv_pool_free(struct kv_pool *p) {
    if (!p) return;
    for (int l = 0; p->k && l < p->n_layers; l++) {
        if (p->v && p->v[l] && p->v[l] != p->k[l]) p->be->ops->free(p->be->ctx, p->v[l]);
        if (p->k[l]) p->be->ops->free(p->be->ctx, p->k[l]);
    }
    free(p->k);
    free(p->v);
    free(p->layout);
    free(p->free_list);
    free(p->layer_swa);
    free(p->swa_of);
    free(p->swa_free);
    free(p->swa_pins);
    memset(p, 0, sizeof *p);
}

int kv_pool_alloc(struct kv_pool *p, int n, int32_t *out) {
    if (n > kv_pool_available(p)) return -1;
    for (int i = 0; i < n; i++) {
        out[i] = p->free_list[--p->n_free];
        if (p->swa_window > 0) p->swa_of[out[i]] = p->swa_free[--p->n_swa_free];
    }
    return 0;
}

void kv_pool_drop_swa(struct kv_pool *p, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++) {
        int32_t s = p->swa_of[pages[i]];
        KILN_ASSERT(p->swa_pins[pages[i]] == 0);
        if (!s) continue;
        KILN_ASSERT(p->n_swa_free < p->n_swa_pages - 2);
        p->swa_free[p->n_swa_free++] = s;
        p->swa_of[pages[i]] = 0;
    }
}

void kv_pool_release(struct kv_pool *p, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++) {
        KILN_ASSERT(pages[i] >= 0 && pages[i] < p->n_pages && pages[i] != p->zero_page && p->n_free < p->n_pages);
        p->free_list[p->n_free++] = pages[i];
    }
    if (p->swa_window > 0) kv_pool_drop_swa(p, pages, n);
}

void kv_pool_swa_pin(struct kv_pool *p, const int32_t *pages, int n, int delta) {
    for (int i = 0; i < n; i++) {
        p->swa_pins[pages[i]] += delta;
        KILN_ASSERT(p->swa_pins[pages[i]] >= 0);
    }
}

int kv_pool_swa_shed(struct kv_pool *p, const int32_t *pages, int n, int want) {
    int got = 0;
    for (int i = 0; i < n && got < want; i++)
        if (p->swa_of[pages[i]] && !p->swa_pins[pages[i]]) {
            kv_pool_drop_swa(p, pages + i, 1);
            got++;
        }
    return got;
}

void kv_pool_swa_adopt(struct kv_pool *p, int32_t dst, int32_t src) {
    if (dst == src || p->swa_of[dst] || !p->swa_of[src]) return;
    p->swa_of[dst] = p->swa_of[src];
    p->swa_of[src] = 0;
}

int kv_pool_swa_dead(const struct kv_pool *p, int next, int n_pages) {
    if (p->swa_window <= 0) return 0;
    int first = next - p->swa_window + 1;
    int dead = first >= p->page_size ? first / p->page_size : 0;
    return dead < n_pages ? dead : n_pages;
}

int kv_pool_window_dead(const struct kv_pool *p, int next, int n_pages) {
    if (p->window <= 0) return 0;
    int first = next - p->window + 1; /* the window's first position */
    int dead = first >= p->page_size ? first / p->page_size : 0;
    return dead < n_pages ? dead : n_pages;
}

void kv_pool_drop(struct kv_pool *p, int32_t *pages, int *n_dropped, int dead) {
    if (dead <= *n_dropped) return;
    kv_pool_release(p, pages + *n_dropped, dead - *n_dropped);
    for (int i = *n_dropped; i < dead; i++) pages[i] = p->zero_page;
    *n_dropped = dead;
}

/* A fixed permutation of v[0 .. n) from the generator state *s. */
static void shuffle(int32_t *v, int n, uint64_t *s) {
    for (int i = n - 1; i > 0; i--) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((*s >> 33) % (uint64_t)(i + 1));
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

void kv_pool_scramble(struct kv_pool *p, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    shuffle(p->free_list, p->n_free, &s);
    shuffle(p->swa_free, p->n_swa_free, &s);
}

/* One layer's part of a page: its K rows, then its V rows unless V is in K. */
static void page_copy(const struct kv_pool *p, int32_t page, unsigned char *host, int save) {
    KILN_ASSERT(p->k && !p->swa_window && page >= 0 && page < p->n_pages);
    size_t es = dtype_size(p->dtype), at = 0;
    for (int l = 0; l < p->n_layers; l++) {
        for (int part = 0; part < 2; part++) {
            if (part && p->layout[l].v_in_k) break;
            long w = part ? p->layout[l].v_width : p->layout[l].k_width;
            size_t n = (size_t)p->page_size * (size_t)w * es;
            unsigned char *dev = (unsigned char *)(part ? p->v[l] : p->k[l]) + (size_t)page * n;
            if (save) p->be->ops->download(p->be->ctx, host + at, dev, n);
            else p->be->ops->upload(p->be->ctx, dev, host + at, n);
            at += n;
        }
    }
}

void kv_pool_page_save(const struct kv_pool *p, int32_t page, void *host) { page_copy(p, page, host, 1); }

void kv_pool_page_load(struct kv_pool *p, int32_t page, const void *host) {
    page_copy(p, page, (unsigned char *)host, 0);
}
