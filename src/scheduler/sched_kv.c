/* sched_kv.c — a request's KV on the scheduler's side: its pages, the
 * prefix cache's share of them, the pages a sliding window gives back (one
 * pool whose every layer slides, or a hybrid pool's sliding pages, with the
 * prefix cache's pins and shedding), the prefix cache's host tier, and
 * freeing pages for a step (cache/kv_pool.h, cache/radix.h,
 * cache/host_cache.h, engine_internal.h). Engine thread only. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/host_cache.h"
#include "cache/kv_pool.h"
#include "cache/radix.h"
#include "scheduler/engine_internal.h"
#include "scheduler/request.h"

void sched_release_pages(void *user, const int32_t *pages, int n) {
    kv_pool_release(user, pages, n);
}

int sched_pages_for(const struct engine *e, int tokens) {
    return (tokens + e->page_size - 1) / e->page_size;
}

/* The part of r's computed tokens the prefix cache may hold: every full
 * page, or with a window the first W tokens' while none was dropped. */
static int cacheable(const struct engine *e, const struct req *r) {
    int ps = e->page_size, aligned = r->n_computed / ps * ps;
    if (!e->window) return aligned;
    int cap = e->window / ps * ps;
    return r->n_dropped ? 0 : aligned < cap ? aligned : cap;
}

/* A hybrid pool: pins the tree's pages (r->pages[0 .. n_tree_tokens /
 * ps)) that the window of r's next position reads, unpinning those it
 * left. Both ends only move forward (n_computed and the tree's part grow;
 * where the page ids change, swa_unpin ran first), so the pages leaving
 * are [pin0, lo) and those coming [max(pin1, lo), hi). */
static void swa_pin(struct engine *e, struct req *r) {
    if (!e->swa_window) return;
    struct kv_pool *kv = e->gkv[r->dp_group];
    int lo = kv_pool_swa_dead(kv, r->n_computed, r->n_pages), hi = r->n_tree_tokens / e->page_size;
    if (lo > hi) lo = hi;
    int o0 = r->swa_pin0, o1 = r->swa_pin1;
    KILN_ASSERT(lo >= o0 && hi >= o1);
    int gone = lo < o1 ? lo : o1, from = lo > o1 ? lo : o1;
    if (gone > o0) kv_pool_swa_pin(kv, r->pages + o0, gone - o0, -1);
    if (hi > from) kv_pool_swa_pin(kv, r->pages + from, hi - from, 1);
    r->swa_pin0 = lo, r->swa_pin1 = hi;
}

static void swa_unpin(struct engine *e, struct req *r) {
    if (r->swa_pin1 > r->swa_pin0)
        kv_pool_swa_pin(e->gkv[r->dp_group], r->pages + r->swa_pin0, r->swa_pin1 - r->swa_pin0, -1);
    r->swa_pin0 = r->swa_pin1 = 0;
}

/* The tree now has its own pages for r's tokens [keep * ps, dup): r's
 * copies go back, a hybrid pool's tree pages that lost their sliding page
 * first taking r's (so the tree's copy of r's window stays usable). */
static void release_dups(struct engine *e, struct req *r, int keep, int dup) {
    struct kv_pool *kv = e->gkv[r->dp_group];
    int ps = e->page_size;
    if (dup / ps <= keep) return;
    if (e->swa_window) {
        KILN_ASSERT(radix_match(e->grx[r->dp_group], r->salt, r->tokens, dup, e->match_pages, NULL) == dup);
        for (int i = keep; i < dup / ps; i++) kv_pool_swa_adopt(kv, e->match_pages[i], r->pages[i]);
    }
    kv_pool_release(kv, r->pages + keep, dup / ps - keep);
}

/* The host tier: the tree's pages[0 .. n) of salt's tokens get their
 * prefix keys (what eviction stores them under). */
static void hc_register(struct engine *e, const char *salt, const int32_t *tokens, const int32_t *pages, int n) {
    int ps = e->page_size;
    uint64_t parent = host_cache_root(salt);
    for (int i = 0; i < n; i++) {
        uint64_t key = host_cache_key(parent, tokens + (size_t)i * ps, ps);
        int32_t pg = pages[i];
        e->hc_key[pg] = key;
        e->hc_parent[pg] = parent;
        memcpy(e->hc_tokens + (size_t)pg * ps, tokens + (size_t)i * ps, (size_t)ps * sizeof *tokens);
        e->hc_set[pg] = 1;
        parent = key;
    }
}

/* Gives the request's KV back: computed full pages go to the radix cache
 * (unlocked, evictable), everything else to the pool. */
void sched_release_kv(struct engine *e, struct req *r) {
    int ps = e->page_size, keep = 0;
    struct kv_pool *kv = e->gkv[r->dp_group];
    struct radix_tree *rx = e->grx[r->dp_group];
    swa_unpin(e, r);
    if (rx) {
        int aligned = cacheable(e, r);
        keep = r->n_tree_tokens / ps;
        if (aligned > r->n_tree_tokens) {
            struct radix_node *node;
            int dup = radix_insert(rx, r->salt, r->tokens, aligned, r->pages, &node);
            if (dup > r->n_tree_tokens) release_dups(e, r, keep, dup);
            keep = aligned / ps;
            if (e->hc && r->dp_group == 0) {
                KILN_ASSERT(radix_match(rx, r->salt, r->tokens, aligned, e->hc_pages, NULL) == aligned);
                hc_register(e, r->salt, r->tokens, e->hc_pages, aligned / ps);
            }
        }
        if (r->lock_node) radix_unlock(rx, r->lock_node);
    }
    if (keep < r->n_dropped) keep = r->n_dropped; /* the zero page stands there */
    kv_pool_release(kv, r->pages + keep, r->n_pages - keep);
    r->n_pages = 0;
    r->n_dropped = 0;
    r->n_swa_dropped = 0;
    r->n_tree_tokens = 0;
    r->lock_node = NULL;
    r->n_computed = 0;
}

/* After a prefill chunk: the computed full pages join the radix cache now,
 * so requests arriving meanwhile can share them. */
void sched_cache_unfinished(struct engine *e, struct req *r) {
    int ps = e->page_size, aligned = cacheable(e, r);
    struct radix_tree *rx = e->grx[r->dp_group];
    if (!rx || aligned <= r->n_tree_tokens) return;
    swa_unpin(e, r); /* page ids change below */
    struct radix_node *node;
    int dup = radix_insert(rx, r->salt, r->tokens, aligned, r->pages, &node);
    int keep = r->n_tree_tokens / ps;
    if (dup > r->n_tree_tokens) release_dups(e, r, keep, dup);
    /* the tree's pages replace the duplicates we just freed */
    int got = radix_match(rx, r->salt, r->tokens, aligned, r->pages, &node);
    KILN_ASSERT(got == aligned);
    if (e->hc && r->dp_group == 0) hc_register(e, r->salt, r->tokens, r->pages, aligned / ps);
    radix_lock(rx, node);
    if (r->lock_node) radix_unlock(rx, r->lock_node);
    r->lock_node = node;
    r->n_tree_tokens = aligned;
    swa_pin(e, r);
}

/* After a step (every layer slides over W): the pages wholly before the
 * window of r's next position, n_computed, go back; the cached prefix is
 * unlocked once the window has left all of it. */
void sched_window_drop(struct engine *e, struct req *r) {
    if (!e->window) return;
    int ps = e->page_size;
    struct kv_pool *kv = e->gkv[r->dp_group];
    int dead = kv_pool_window_dead(kv, r->n_computed, r->n_pages);
    if (dead <= r->n_dropped) return;
    if (r->n_tree_tokens > 0) {
        if (dead * ps < r->n_tree_tokens) return; /* the window still reads the cached prefix */
        radix_unlock(e->grx[r->dp_group], r->lock_node);
        r->lock_node = NULL;
        r->n_dropped = r->n_tree_tokens / ps;
        r->n_tree_tokens = 0;
        for (int i = 0; i < r->n_dropped; i++) r->pages[i] = kv->zero_page;
    }
    kv_pool_drop(kv, r->pages, &r->n_dropped, dead);
}

/* After a step (a hybrid pool): the sliding pages of r's own pages wholly
 * before the sliding window of its next position go back; of the tree's
 * pages, those the window left are unpinned (the tree keeps their sliding
 * pages until it sheds them). */
void sched_swa_drop(struct engine *e, struct req *r) {
    if (!e->swa_window) return;
    struct kv_pool *kv = e->gkv[r->dp_group];
    int dead = kv_pool_swa_dead(kv, r->n_computed, r->n_pages), from = r->n_tree_tokens / e->page_size;
    if (from < r->n_swa_dropped) from = r->n_swa_dropped;
    if (dead > from) {
        kv_pool_drop_swa(kv, r->pages + from, dead - from);
        r->n_swa_dropped = dead;
    }
    swa_pin(e, r);
}

/* radix_visit_lru's callback: sheds the unpinned sliding pages of a node's
 * pages until sh->want went back. */
struct shed {
    struct kv_pool *kv;
    int want;
};
static int shed_node(void *user, int32_t *pages, int n) {
    struct shed *sh = user;
    sh->want -= kv_pool_swa_shed(sh->kv, pages, n, sh->want);
    return sh->want <= 0;
}

/* The cached prefix of r's first n tokens in group g's tree (radix_match
 * into e->match_pages). With a hybrid pool, only as far as the sliding
 * layers still have the pages the window of the next position reads: a
 * match that ends past them is cut back to where they are. */
int sched_match_prefix(struct engine *e, int g, const struct req *r, int n, struct radix_node **node) {
    struct radix_tree *rx = e->grx[g];
    int got = radix_match(rx, r->salt, r->tokens, n, e->match_pages, node);
    if (!e->swa_window || got == 0) return got;
    const struct kv_pool *kv = e->gkv[g];
    int ps = e->page_size, j = got / ps;
    for (; j > 0; j--) { /* a match of j pages: the window of position j * ps */
        int first = j * ps - e->swa_window + 1, i = first > 0 ? first / ps : 0, ok = 1;
        for (; i < j && ok; i++) ok = kv_pool_swa_alive(kv, e->match_pages[i]);
        if (ok) break;
    }
    if (j * ps == got) return got;
    return radix_match(rx, r->salt, r->tokens, j * ps, e->match_pages, node);
}

/* sched_match_prefix, then the pages after the match that the host tier
 * holds, as far as they go on in a row (whole pages of the first n
 * tokens): loaded into fresh device pages, which join the tree, so the
 * match covers them. The matched path is locked while pages are freed for
 * them; without room for all of them, or when the pool could not take
 * them and one more page beside `reserve` (what admission keeps for the
 * running requests: the request could not be admitted this step, and a
 * load now would be copied for nothing), the device match alone. */
int sched_match_load(struct engine *e, int g, const struct req *r, int n, int reserve, struct radix_node **node) {
    int got = sched_match_prefix(e, g, r, n, node);
    if (!e->hc || g != 0) return got;
    int ps = e->page_size, j0 = got / ps, h = 0;
    /* the matched pages are the tree's, whose keys are known */
    int32_t last = j0 ? e->match_pages[j0 - 1] : -1;
    KILN_ASSERT(!j0 || e->hc_set[last]);
    uint64_t base = j0 ? e->hc_key[last] : host_cache_root(r->salt);
    for (uint64_t parent = base; (j0 + h + 1) * ps <= n; h++) {
        const int32_t *tok = r->tokens + (size_t)(j0 + h) * ps;
        uint64_t key = host_cache_key(parent, tok, ps);
        if (!host_cache_has(e->hc, key, parent, tok)) break;
        e->hc_keys[h] = key;
        parent = key;
    }
    if (!h) return got;
    struct radix_tree *rx = e->grx[g];
    struct kv_pool *kv = e->gkv[g];
    if (*node) radix_lock(rx, *node);
    int fits = sched_available_pages(e, g) >= h + 1 + reserve;
    if (*node) radix_unlock(rx, *node);
    if (!fits) return got;
    /* the pages to load become the most recently used, the first of them
     * last, so that what eviction stores meanwhile pushes out the others
     * first; what is left of the run after it is loaded */
    for (int i = h - 1; i >= 0; i--)
        host_cache_touch(e->hc, e->hc_keys[i], i ? e->hc_keys[i - 1] : base, r->tokens + (size_t)(j0 + i) * ps);
    if (*node) radix_lock(rx, *node);
    int room = sched_make_free(e, g, h) == 0;
    if (*node) radix_unlock(rx, *node);
    if (!room) return got;
    for (int i = 0; i < h; i++)
        if (!host_cache_has(e->hc, e->hc_keys[i], i ? e->hc_keys[i - 1] : base, r->tokens + (size_t)(j0 + i) * ps)) {
            h = i;
            break;
        }
    if (!h) return got;
    /* the device match's pages, then the loaded ones */
    memcpy(e->hc_pages, e->match_pages, (size_t)j0 * sizeof *e->hc_pages);
    int32_t *fresh = e->hc_pages + j0;
    KILN_ASSERT(kv_pool_alloc(kv, h, fresh) == 0);
    for (int i = 0; i < h; i++) {
        uint64_t parent = i ? e->hc_keys[i - 1] : base;
        KILN_ASSERT(host_cache_load(e->hc, kv, e->hc_keys[i], parent, r->tokens + (size_t)(j0 + i) * ps, fresh[i]) == 0);
    }
    int total = (j0 + h) * ps;
    struct radix_node *nd;
    KILN_ASSERT(radix_insert(rx, r->salt, r->tokens, total, e->hc_pages, &nd) == got);
    hc_register(e, r->salt, r->tokens, e->hc_pages, j0 + h);
    e->counters.hicache_loaded_tokens_total += (long)h * ps;
    KILN_ASSERT(radix_match(rx, r->salt, r->tokens, total, e->match_pages, node) == total);
    return total;
}

void sched_evict_pages(void *user, const int32_t *pages, int n) {
    struct engine *e = user;
    struct kv_pool *kv = e->gkv[0];
    int ps = e->page_size;
    for (int i = 0; i < n; i++) {
        int32_t pg = pages[i];
        if (!e->hc_set[pg]) continue;
        if (!e->hc_closing &&
            host_cache_put(e->hc, kv, pg, e->hc_key[pg], e->hc_parent[pg], e->hc_tokens + (size_t)pg * ps))
            e->counters.hicache_saved_pages_total++;
        e->hc_set[pg] = 0;
    }
    kv_pool_release(kv, pages, n);
}

int sched_hicache_init(struct engine *e, struct kiln_error *err) {
    const struct engine_options *o = &e->opt;
    if (!o->enable_hicache) return 0;
    if (o->disable_radix_cache)
        return kiln_errorf(err, "--enable-hierarchical-cache keeps the radix cache's evicted pages: it needs the "
                                "radix cache (drop --disable-radix-cache)");
    if (e->dp_size > 1 || (o->par && (o->par->tp_size > 1 || o->par->pp_size > 1)))
        return kiln_errorf(err, "--enable-hierarchical-cache is not supported with several ranks (--tp, --pp, --dp) yet");
    if (e->window || e->swa_window)
        return kiln_errorf(err, "--enable-hierarchical-cache is not supported for models with sliding-window layers yet");
    if (o->hicache_ratio < 0 || o->hicache_size_gb < 0)
        return kiln_errorf(err, "--hicache-ratio and --hicache-size must not be negative");
    const struct kv_pool *kv = e->kv;
    size_t page_bytes = kv_pool_page_bytes(kv->layout, kv->n_layers, kv->page_size, kv->dtype);
    double pages = o->hicache_size_gb > 0 ? o->hicache_size_gb * 1073741824.0 / (double)page_bytes
                                          : (o->hicache_ratio > 0 ? o->hicache_ratio : 2.0) * kv_pool_usable(kv);
    if (pages < 1)
        return kiln_errorf(err, "--hicache-size %.3g GB holds no page of %zu bytes", o->hicache_size_gb, page_bytes);
    if (pages > 1e12) pages = 1e12;
    if (!(e->hc = host_cache_create(kv, (long)pages)))
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of host memory for a host KV cache of %.0f pages (%.2f GB)",
                           pages, pages * (double)page_bytes / 1073741824.0);
    size_t np = (size_t)kv->n_pages;
    e->hc_key = xmalloc(np * sizeof *e->hc_key);
    e->hc_parent = xmalloc(np * sizeof *e->hc_parent);
    e->hc_tokens = xmalloc(np * (size_t)e->page_size * sizeof *e->hc_tokens);
    e->hc_set = xcalloc(np, 1);
    log_info("hierarchical cache: host memory for %ld evicted KV pages (%.2f GB, %.3g x the device pool)",
             host_cache_capacity(e->hc), pages * (double)page_bytes / 1073741824.0, pages / kv_pool_usable(kv));
    size_t most = (size_t)e->context_length / (size_t)e->page_size + 2;
    e->hc_keys = xmalloc(most * sizeof *e->hc_keys);
    e->hc_pages = xmalloc(most * sizeof *e->hc_pages);
    return 0;
}

void sched_hicache_free(struct engine *e) {
    host_cache_destroy(e->hc);
    e->hc = NULL;
    free(e->hc_key), free(e->hc_parent), free(e->hc_tokens), free(e->hc_set), free(e->hc_keys), free(e->hc_pages);
    e->hc_key = e->hc_parent = e->hc_keys = NULL;
    e->hc_tokens = e->hc_pages = NULL;
    e->hc_set = NULL;
}

/* Group g's free pages, counting its prefix cache's evictable ones. */
int sched_available_pages(const struct engine *e, int g) {
    return e->gkv[g]->n_free + (e->grx[g] ? radix_evictable_pages(e->grx[g]) : 0);
}

/* A hybrid pool: the free sliding pages, counting the prefix cache's
 * evictable pages as if each had one (an upper bound: sched_make_free tells). */
int sched_available_swa(const struct engine *e, int g) {
    if (!e->swa_window) return sched_available_pages(e, g);
    return kv_pool_swa_available(e->gkv[g]) + (e->grx[g] ? radix_total_pages(e->grx[g]) : 0);
}

/* Makes `n` pages free in group g's pool, evicting cached prefixes if needed. */
int sched_make_free(struct engine *e, int g, int n) {
    struct kv_pool *kv = e->gkv[g];
    struct radix_tree *rx = e->grx[g];
    /* a hybrid pool: the prefix cache's sliding pages no window reads go
     * first, least recently used first (the cached prefixes stay, usable
     * as far as their last window still has them); then whole prefixes,
     * until both kinds suffice (an evicted page may have no sliding page) */
    if (e->swa_window && rx && kv_pool_swa_available(kv) < n) {
        /* at least 1/32 of the pool at once: each call sorts the tree */
        int want = n - kv_pool_swa_available(kv), batch = kv->n_swa_pages / 32;
        struct shed sh = {kv, want > batch ? want : batch};
        const int asked = sh.want;
        radix_visit_lru(rx, shed_node, &sh);
        e->counters.kv_swa_pages_shed_total += asked - (sh.want > 0 ? sh.want : 0);
    }
    for (int missing; rx && (missing = n - kv_pool_available(kv)) > 0;)
        if (radix_evict(rx, missing) == 0) break;
    return kv_pool_available(kv) >= n ? 0 : -1;
}

/* Gives request r pages for positions [0, len). */
int sched_grow_pages(struct engine *e, struct req *r, int len) {
    int need = sched_pages_for(e, len) - r->n_pages;
    if (need <= 0) return 0;
    if (sched_make_free(e, r->dp_group, need)) return -1;
    if (r->n_pages + need > r->cap_pages) {
        r->cap_pages = (r->n_pages + need) * 2;
        r->pages = xrealloc(r->pages, (size_t)r->cap_pages * sizeof *r->pages);
    }
    KILN_ASSERT(kv_pool_alloc(e->gkv[r->dp_group], need, r->pages + r->n_pages) == 0);
    r->n_pages += need;
    return 0;
}
