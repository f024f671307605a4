/* test_radix.c — the radix prefix cache, at page sizes 1, 4 and 16:
 * directed cases (sharing, splits, extra keys, locking, LRU order, the
 * visit of every node in LRU order, parents exposed by eviction, exact page accounting) and a randomized model check
 * against a naive reference that keeps one record per cached page, with the
 * pages coming from a real kv_pool so that leaks and double frees show. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/mem.h"
#include "cache/kv_pool.h"
#include "cache/radix.h"
#include "tensor/backend.h"

static const int page_sizes[] = {1, 4, 16};

/* ---- directed tests: pages are plain ids, releases are recorded ---- */

#define MAX_ID 4096

struct recorder {
    int count[MAX_ID]; /* times each page id was released */
    int32_t order[MAX_ID];
    int n;             /* releases so far, in order[] */
    int calls;
};

static void record_release(void *user, const int32_t *pages, int n) {
    struct recorder *r = user;
    assert_true(n > 0);
    r->calls++;
    for (int i = 0; i < n; i++) {
        assert_true(pages[i] >= 0 && pages[i] < MAX_ID);
        r->count[pages[i]]++;
        assert_int_equal(r->count[pages[i]], 1); /* never released twice */
        r->order[r->n++] = pages[i];
    }
}

/* A sequence of "units": unit u, page-offset j becomes token u * 1000 + j,
 * so sequences that share units share whole pages. */
static int seq(int ps, int32_t *out, const int *units, int n_units) {
    for (int u = 0; u < n_units; u++)
        for (int j = 0; j < ps; j++) out[u * ps + j] = units[u] * 1000 + j;
    return n_units * ps;
}

static void expect_counts(struct radix_tree *t, int total, int evictable) {
    radix_validate(t);
    assert_int_equal(radix_total_pages(t), total);
    assert_int_equal(radix_evictable_pages(t), evictable);
}

static void expect_pages(const int32_t *got, const int32_t *want, int n) {
    for (int i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
}

#define UNITS(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))

static void test_insert_match(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t ids[64 * 16], got[64];
    struct radix_node *node, *node2;

    int n = seq(ps, ids, UNITS(1, 2, 3, 4));
    assert_int_equal(radix_insert(t, NULL, ids, n, (int32_t[]){10, 11, 12, 13}, &node), 0);
    expect_counts(t, 4, 4);
    assert_int_equal(radix_match(t, NULL, ids, n, got, &node2), n);
    assert_ptr_equal(node, node2);
    expect_pages(got, (int32_t[]){10, 11, 12, 13}, 4);

    /* a longer query matches the cached part; a token past the last whole
     * page changes nothing */
    n = seq(ps, ids, UNITS(1, 2, 3, 4, 5));
    assert_int_equal(radix_match(t, NULL, ids, n, got, &node2), 4 * ps);
    assert_ptr_equal(node, node2);
    assert_int_equal(radix_match(t, NULL, ids, 4 * ps + ps - 1, got, &node2), 4 * ps);

    /* a second sequence sharing two pages: the caller's copies of those two
     * stay the caller's, the rest becomes the tree's */
    n = seq(ps, ids, UNITS(1, 2, 7, 8));
    assert_int_equal(radix_insert(t, "", ids, n, (int32_t[]){20, 21, 22, 23}, &node2), 2 * ps);
    expect_counts(t, 6, 6);
    assert_int_equal(radix_match(t, NULL, ids, n, got, &node), n);
    assert_ptr_equal(node, node2);
    expect_pages(got, (int32_t[]){10, 11, 22, 23}, 4);
    n = seq(ps, ids, UNITS(1, 2, 3, 4));
    assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), n);
    expect_pages(got, (int32_t[]){10, 11, 12, 13}, 4);

    /* reinserting what is there adds nothing */
    assert_int_equal(radix_insert(t, NULL, ids, n, (int32_t[]){30, 31, 32, 33}, NULL), n);
    expect_counts(t, 6, 6);

    /* unrelated first page */
    n = seq(ps, ids, UNITS(9, 2, 3));
    assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), 0);
    assert_int_equal(radix_insert(t, NULL, ids, n, (int32_t[]){40, 41, 42}, NULL), 0);
    expect_counts(t, 9, 9);

    radix_destroy(t);
    assert_int_equal(rec->n, 9);
    for (int p = 0; p < MAX_ID; p++)
        assert_int_equal(rec->count[p], (p >= 10 && p <= 13) || p == 22 || p == 23 ||
                                            (p >= 40 && p <= 42));
    free(rec);
}

static void test_split_mid_edge(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t ids[64 * 16], got[64];
    struct radix_node *leaf, *mid, *root;

    int n = seq(ps, ids, UNITS(1, 2, 3, 4, 5, 6, 7, 8));
    radix_insert(t, NULL, ids, n, (int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, &leaf);
    radix_match(t, NULL, ids, 0, NULL, &root);

    /* a match ending inside the edge splits it: the held leaf keeps ending
     * where it did, the new node sits above it */
    assert_int_equal(radix_match(t, NULL, ids, 3 * ps, got, &mid), 3 * ps);
    expect_pages(got, (int32_t[]){0, 1, 2}, 3);
    assert_ptr_not_equal(mid, leaf);
    assert_ptr_not_equal(mid, root);
    expect_counts(t, 8, 8);
    assert_int_equal(radix_match(t, NULL, ids, n, got, &leaf), n);
    expect_pages(got, (int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);

    /* locking the upper part leaves the tail evictable on its own */
    radix_lock(t, mid);
    expect_counts(t, 8, 5);
    assert_int_equal(radix_evict(t, 1000), 5);
    expect_counts(t, 3, 0);
    expect_pages(rec->order, (int32_t[]){3, 4, 5, 6, 7}, 5);
    radix_unlock(t, mid);
    expect_counts(t, 3, 3);

    /* an insert diverging mid-edge splits at the page boundary before it */
    int32_t ids2[64 * 16];
    n = seq(ps, ids2, UNITS(1, 2, 9, 9));
    assert_int_equal(radix_insert(t, NULL, ids2, n, (int32_t[]){50, 51, 52, 53}, &leaf), 2 * ps);
    expect_counts(t, 5, 5);
    assert_int_equal(radix_match(t, NULL, ids, 3 * ps, got, NULL), 3 * ps);
    expect_pages(got, (int32_t[]){0, 1, 2}, 3);
    assert_int_equal(radix_match(t, NULL, ids2, n, got, NULL), n);
    expect_pages(got, (int32_t[]){0, 1, 52, 53}, 4);

    /* an insert ending mid-edge splits too and hands back the upper node */
    struct radix_node *up;
    assert_int_equal(radix_insert(t, NULL, ids, ps, (int32_t[]){60}, &up), ps);
    radix_lock(t, up);
    expect_counts(t, 5, 4);
    assert_int_equal(radix_evict(t, 1000), 4);
    expect_counts(t, 1, 0);
    radix_unlock(t, up);

    if (ps > 1) {
        /* a token that differs inside the second page: only the first page
         * counts as matched, and the split lands at the page boundary */
        n = seq(ps, ids, UNITS(1, 2, 3));
        radix_insert(t, NULL, ids, n, (int32_t[]){0, 70, 71}, NULL);
        ids[ps + ps / 2] = -5;
        assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), ps);
        expect_pages(got, (int32_t[]){0}, 1);
        expect_counts(t, 3, 3);
    }
    radix_destroy(t);
    free(rec);
}

static void test_short_prefix(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t ids[64 * 16], got[64] = {-1};
    struct radix_node *root, *node;

    int n = seq(ps, ids, UNITS(1, 2));
    radix_insert(t, "k", ids, n, (int32_t[]){5, 6}, NULL);
    radix_match(t, "k", ids, 0, got, &root);
    assert_non_null(root);
    for (int len = 0; len < ps; len++) {
        assert_int_equal(radix_match(t, "k", ids, len, got, &node), 0);
        assert_ptr_equal(node, root);
        assert_int_equal(got[0], -1);
    }
    /* one page and a bit matches one page */
    assert_int_equal(radix_match(t, "k", ids, 2 * ps - 1, got, &node), ps);
    assert_int_equal(got[0], 5);
    /* locking the bare subtree root is allowed and pins no pages */
    radix_lock(t, root);
    expect_counts(t, 2, 2);
    radix_unlock(t, root);
    expect_counts(t, 2, 2);
    radix_destroy(t);
    assert_int_equal(rec->n, 2);
    free(rec);
}

static void test_extra_keys(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t ids[64 * 16], got[64];
    int n = seq(ps, ids, UNITS(1, 2, 3));

    assert_int_equal(radix_insert(t, "tenant-a", ids, n, (int32_t[]){1, 2, 3}, NULL), 0);
    assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), 0);
    assert_int_equal(radix_match(t, "", ids, n, got, NULL), 0);
    assert_int_equal(radix_match(t, "tenant-b", ids, n, got, NULL), 0);
    assert_int_equal(radix_match(t, "tenant-", ids, n, got, NULL), 0);
    assert_int_equal(radix_match(t, "tenant-aa", ids, n, got, NULL), 0);
    /* equal strings share, whatever buffer they sit in */
    char key[16];
    strcpy(key, "tenant-a");
    assert_int_equal(radix_match(t, key, ids, n, got, NULL), n);
    expect_pages(got, (int32_t[]){1, 2, 3}, 3);

    /* NULL and "" are the same key */
    assert_int_equal(radix_insert(t, NULL, ids, n, (int32_t[]){11, 12, 13}, NULL), 0);
    assert_int_equal(radix_insert(t, "", ids, n, (int32_t[]){21, 22, 23}, NULL), n);
    assert_int_equal(radix_match(t, "", ids, n, got, NULL), n);
    expect_pages(got, (int32_t[]){11, 12, 13}, 3);
    expect_counts(t, 6, 6);

    /* many keys, each with its own pages: none leaks into another */
    for (int k = 0; k < 300; k++) {
        snprintf(key, sizeof key, "s%d", k);
        int32_t pages[3] = {100 + 3 * k, 101 + 3 * k, 102 + 3 * k};
        assert_int_equal(radix_insert(t, key, ids, n, pages, NULL), 0);
    }
    for (int k = 0; k < 300; k++) {
        snprintf(key, sizeof key, "s%d", k);
        assert_int_equal(radix_match(t, key, ids, n, got, NULL), n);
        expect_pages(got, (int32_t[]){100 + 3 * k, 101 + 3 * k, 102 + 3 * k}, 3);
    }
    expect_counts(t, 906, 906);
    /* evicting everything also drops the emptied subtree roots */
    assert_int_equal(radix_evict(t, 1 << 30), 906);
    expect_counts(t, 0, 0);
    radix_destroy(t);
    assert_int_equal(rec->n, 906);
    free(rec);
}

static void test_lock_prevents_eviction(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t a[64 * 16], b[64 * 16];
    struct radix_node *na, *nb, *m;
    int n = seq(ps, a, UNITS(1, 2, 3));
    seq(ps, b, UNITS(1, 2, 4));
    radix_insert(t, NULL, a, n, (int32_t[]){1, 2, 3}, &na);
    radix_insert(t, NULL, b, n, (int32_t[]){1, 2, 4}, &nb);
    expect_counts(t, 4, 4);

    radix_lock(t, na);
    radix_lock(t, na); /* counts, not flags */
    expect_counts(t, 4, 1);
    assert_int_equal(radix_evict(t, 100), 1); /* only b's own page */
    assert_int_equal(rec->order[0], 4);
    expect_counts(t, 3, 0);
    assert_int_equal(radix_evict(t, 100), 0);
    radix_unlock(t, na);
    expect_counts(t, 3, 0);
    assert_int_equal(radix_evict(t, 100), 0);

    /* a second holder of the shared prefix */
    assert_int_equal(radix_match(t, NULL, b, n, NULL, &m), 2 * ps);
    radix_lock(t, m);
    radix_unlock(t, na);
    expect_counts(t, 3, 1);
    assert_int_equal(radix_evict(t, 100), 1);
    assert_int_equal(rec->order[1], 3);
    expect_counts(t, 2, 0);
    radix_unlock(t, m);
    expect_counts(t, 2, 2);
    assert_int_equal(radix_evict(t, 100), 2);
    expect_counts(t, 0, 0);
    radix_destroy(t);
    assert_int_equal(rec->n, 4);
    free(rec);
}

static void test_lru_order(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t a[64 * 16], b[64 * 16], c[64 * 16];
    int n = seq(ps, a, UNITS(1, 1));
    seq(ps, b, UNITS(2, 2));
    seq(ps, c, UNITS(3, 3));
    radix_insert(t, NULL, a, n, (int32_t[]){10, 11}, NULL);
    radix_insert(t, NULL, b, n, (int32_t[]){20, 21}, NULL);
    radix_insert(t, NULL, c, n, (int32_t[]){30, 31}, NULL);
    /* without the match a would go first; now b does */
    assert_int_equal(radix_match(t, NULL, a, n, NULL, NULL), n);
    expect_counts(t, 6, 6);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_pages(rec->order, (int32_t[]){20, 21}, 2);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_pages(rec->order + 2, (int32_t[]){30, 31}, 2);

    /* inserting touches as well; a match of only the first page touches
     * only that page: the split-off tail keeps its older stamp */
    radix_insert(t, NULL, b, n, (int32_t[]){22, 23}, NULL);
    radix_insert(t, NULL, c, n, (int32_t[]){32, 33}, NULL);
    assert_int_equal(radix_match(t, NULL, b, ps, NULL, NULL), ps);
    expect_counts(t, 6, 6);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_pages(rec->order + 4, (int32_t[]){10, 11}, 2);
    assert_int_equal(radix_evict(t, 1), 1);
    assert_int_equal(rec->order[6], 23);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_pages(rec->order + 7, (int32_t[]){32, 33}, 2);
    expect_counts(t, 1, 1);
    assert_int_equal(radix_evict(t, 1), 1);
    assert_int_equal(rec->order[9], 22);
    expect_counts(t, 0, 0);
    radix_destroy(t);
    assert_int_equal(rec->n, 10);
    free(rec);
}

/* radix_visit_lru: every node with pages, locked ones too, least
 * recently used first; the visitor stops it. */
struct visits {
    int32_t first[16];
    int n, stop_after;
};
static int visit(void *user, int32_t *pages, int n) {
    struct visits *v = user;
    assert_true(n > 0);
    v->first[v->n++] = pages[0];
    return v->n == v->stop_after;
}

static void test_visit_lru(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t a[64 * 16], b[64 * 16], c[64 * 16];
    int n = seq(ps, a, UNITS(1, 1));
    seq(ps, b, UNITS(1, 2)); /* splits a's edge: [1] then [1] / [2] */
    seq(ps, c, UNITS(3, 3));
    radix_insert(t, NULL, a, n, (int32_t[]){10, 11}, NULL);
    radix_insert(t, NULL, b, n, (int32_t[]){10, 21}, NULL);
    struct radix_node *cn;
    radix_insert(t, NULL, c, n, (int32_t[]){30, 31}, &cn);
    radix_lock(t, cn);
    assert_int_equal(radix_match(t, NULL, a, n, NULL, NULL), n); /* a's tail, then the shared page */
    struct visits v = {.stop_after = 99};
    radix_visit_lru(t, visit, &v);
    /* b's tail (21) is the oldest, then c (30, locked), then the shared page and a's tail, touched together */
    assert_int_equal(v.n, 4);
    assert_int_equal(v.first[0], 21);
    assert_int_equal(v.first[1], 30);
    assert_true((v.first[2] == 10 && v.first[3] == 11) || (v.first[2] == 11 && v.first[3] == 10));
    struct visits w = {.stop_after = 2};
    radix_visit_lru(t, visit, &w);
    assert_int_equal(w.n, 2);
    radix_unlock(t, cn);
    radix_destroy(t);
    free(rec);
}

static void test_evict_exposes_parent(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    int32_t a[64 * 16], b[64 * 16], c[64 * 16];
    int n = seq(ps, a, UNITS(1, 2, 3, 4));
    seq(ps, b, UNITS(1, 2, 5, 6));
    seq(ps, c, UNITS(7, 7));
    radix_insert(t, NULL, a, n, (int32_t[]){1, 2, 3, 4}, NULL);
    radix_insert(t, NULL, b, n, (int32_t[]){1, 2, 5, 6}, NULL);
    radix_insert(t, NULL, c, 2 * ps, (int32_t[]){7, 8}, NULL); /* newest */
    expect_counts(t, 8, 8);
    /* [1 2] has two children, so a's tail, then b's, then (being a leaf
     * now, and older than c) [1 2] itself, then c */
    assert_int_equal(radix_evict(t, 2), 2);
    assert_int_equal(radix_evict(t, 2), 2);
    expect_counts(t, 4, 4);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_counts(t, 2, 2);
    assert_int_equal(radix_evict(t, 1), 2);
    expect_pages(rec->order, (int32_t[]){3, 4, 5, 6, 1, 2, 7, 8}, 8);
    expect_counts(t, 0, 0);
    assert_int_equal(rec->calls, 4);
    /* evict asks for at least n pages, so one call can span several leaves */
    radix_insert(t, NULL, a, n, (int32_t[]){1, 2, 3, 4}, NULL);
    radix_insert(t, NULL, b, n, (int32_t[]){1, 2, 5, 6}, NULL);
    memset(rec, 0, sizeof *rec);
    assert_int_equal(radix_evict(t, 3), 4);
    expect_counts(t, 2, 2);
    radix_destroy(t);
    free(rec);
}

static void test_many_children(void **state) {
    int ps = *(const int *)*state;
    struct recorder *rec = xcalloc(1, sizeof *rec);
    struct radix_tree *t = radix_create(ps, record_release, rec);
    enum { N = 2000 };
    int32_t ids[2 * 16], got[2];
    /* N siblings under the root and N under one shared page, inserted in a
     * scrambled order, then evicted oldest first: the child maps grow and
     * shrink through many deletions */
    for (int i = 0; i < N; i++) {
        int u = (i * 7919) % N;
        int n = seq(ps, ids, UNITS(u + 1));
        radix_insert(t, NULL, ids, n, (int32_t[]){u}, NULL);
    }
    expect_counts(t, N, N);
    for (int u = 0; u < N; u++) {
        int n = seq(ps, ids, UNITS(u + 1));
        assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), n);
        assert_int_equal(got[0], u);
    }
    /* matched in order 0..N-1, so they leave in that order */
    assert_int_equal(radix_evict(t, N / 2), N / 2);
    for (int i = 0; i < N / 2; i++) assert_int_equal(rec->order[i], i);
    radix_validate(t);
    for (int u = 0; u < N; u++) {
        int n = seq(ps, ids, UNITS(u + 1));
        assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), u < N / 2 ? 0 : n);
        if (u >= N / 2) assert_int_equal(got[0], u);
    }
    /* children of a non-root node: one prefix page shared by all */
    for (int i = 0; i < N / 2; i++) {
        int n = seq(ps, ids, UNITS(N + 5, i + 1));
        assert_int_equal(radix_insert(t, NULL, ids, n, (int32_t[]){N, N + 1 + i}, NULL),
                         i ? ps : 0);
    }
    expect_counts(t, N / 2 + 1 + N / 2, N / 2 + 1 + N / 2);
    for (int i = 0; i < N / 2; i++) {
        int n = seq(ps, ids, UNITS(N + 5, i + 1));
        assert_int_equal(radix_match(t, NULL, ids, n, got, NULL), n);
        assert_int_equal(got[1], N + 1 + i);
    }
    assert_int_equal(radix_evict(t, 1 << 30), N + 1);
    expect_counts(t, 0, 0);
    radix_destroy(t);
    for (int p = 0; p <= N + N / 2; p++) assert_int_equal(rec->count[p], 1);
    free(rec);
}

/* ---- randomized model check ---- */

#define MC_PAGES 64
#define MC_MAX_TOKENS (6 * 16 + 16)
#define MC_MAX_ACTIVE 4
#define MC_MAX_PINS 4

enum page_state { PAGE_FREE = 0, PAGE_HELD, PAGE_TREE };

/* The reference: one record per page the tree owns, naming the whole token
 * prefix that page completes. Looked up by brute force. */
struct mc_record {
    char key[8];
    int len; /* tokens up to and including this page */
    int32_t ids[MC_MAX_TOKENS];
    int lock;       /* locks whose path covers this page */
    uint64_t stamp; /* model clock of the last match/insert through it */
};

struct mc_req {
    char key[8];
    int null_key;
    int32_t ids[MC_MAX_TOKENS];
    int n, matched;
    struct radix_node *node;
    int32_t pages[MC_MAX_TOKENS];
};

struct mc_pin {
    char key[8];
    int32_t ids[MC_MAX_TOKENS];
    int len;
    struct radix_node *node;
};

struct mc {
    int ps, max_tokens;
    struct kv_pool pool;
    struct radix_tree *t;
    enum page_state state[MC_PAGES];
    struct mc_record rec[MC_PAGES]; /* valid where state == PAGE_TREE */
    uint64_t clock, rng;
    int in_evict, destroying;
    struct mc_req active[MC_MAX_ACTIVE];
    int n_active;
    struct mc_pin pins[MC_MAX_PINS];
    int n_pins;
    int32_t bases[4][MC_MAX_TOKENS];
    long n_released, n_evict_calls;
};

static uint32_t mc_rand(struct mc *m) {
    m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(m->rng >> 33);
}

static int mc_find(const struct mc *m, const char *key, const int32_t *ids, int len) {
    for (int p = 0; p < MC_PAGES; p++)
        if (m->state[p] == PAGE_TREE && m->rec[p].len == len && !strcmp(m->rec[p].key, key) &&
            !memcmp(m->rec[p].ids, ids, (size_t)len * sizeof *ids))
            return p;
    return -1;
}

static int mc_match(const struct mc *m, const char *key, const int32_t *ids, int n,
                    int32_t *pages) {
    int len = 0;
    for (; len + m->ps <= n; len += m->ps) {
        int p = mc_find(m, key, ids, len + m->ps);
        if (p < 0) break;
        pages[len / m->ps] = p;
    }
    return len;
}

static void mc_touch(struct mc *m, const char *key, const int32_t *ids, int len) {
    m->clock++;
    for (int l = m->ps; l <= len; l += m->ps) m->rec[mc_find(m, key, ids, l)].stamp = m->clock;
}

static void mc_lock(struct mc *m, const char *key, const int32_t *ids, int len, int delta) {
    for (int l = m->ps; l <= len; l += m->ps) {
        struct mc_record *r = &m->rec[mc_find(m, key, ids, l)];
        r->lock += delta;
        assert_true(r->lock >= 0);
    }
}

static int mc_has_child(const struct mc *m, int p) {
    const struct mc_record *r = &m->rec[p];
    for (int q = 0; q < MC_PAGES; q++)
        if (m->state[q] == PAGE_TREE && m->rec[q].len == r->len + m->ps &&
            !strcmp(m->rec[q].key, r->key) &&
            !memcmp(m->rec[q].ids, r->ids, (size_t)r->len * sizeof *r->ids))
            return 1;
    return 0;
}

/* The tree hands back one node's pages per call. During eviction that node
 * must be an unlocked leaf, and the least recently used one. */
static void mc_release(void *user, const int32_t *pages, int n) {
    struct mc *m = user;
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        assert_true(pages[i] >= 0 && pages[i] < MC_PAGES);
        assert_int_equal(m->state[pages[i]], PAGE_TREE); /* once, and only tree pages */
    }
    if (!m->destroying) {
        assert_true(m->in_evict);
        const struct mc_record *first = &m->rec[pages[0]];
        for (int i = 0; i < n; i++) {
            const struct mc_record *r = &m->rec[pages[i]];
            assert_int_equal(r->lock, 0);
            assert_string_equal(r->key, first->key);
            assert_int_equal(r->len, first->len + i * m->ps);
            assert_true(!memcmp(r->ids, first->ids, (size_t)first->len * sizeof *r->ids));
            assert_true(r->stamp == first->stamp);
        }
        assert_false(mc_has_child(m, pages[n - 1])); /* a leaf */
        for (int q = 0; q < MC_PAGES; q++) /* LRU: no unlocked leaf is older */
            if (m->state[q] == PAGE_TREE && !m->rec[q].lock && !mc_has_child(m, q))
                assert_true(m->rec[q].stamp >= first->stamp);
    }
    for (int i = 0; i < n; i++) m->state[pages[i]] = PAGE_FREE;
    kv_pool_release(&m->pool, pages, n);
    m->n_released += n;
}

static void mc_check(struct mc *m) {
    radix_validate(m->t);
    int tree = 0, unlocked = 0, held = 0, free_ = 0;
    for (int p = 0; p < MC_PAGES; p++) {
        if (m->state[p] == PAGE_TREE) {
            tree++;
            unlocked += !m->rec[p].lock;
            /* prefix closure: the page before this one is cached too */
            const struct mc_record *r = &m->rec[p];
            if (r->len > m->ps) assert_true(mc_find(m, r->key, r->ids, r->len - m->ps) >= 0);
        }
        held += m->state[p] == PAGE_HELD;
        free_ += m->state[p] == PAGE_FREE;
    }
    assert_int_equal(radix_total_pages(m->t), tree);
    assert_int_equal(radix_evictable_pages(m->t), unlocked);
    assert_int_equal(kv_pool_available(&m->pool), free_);
    assert_int_equal(kv_pool_available(&m->pool) + radix_total_pages(m->t) + held, MC_PAGES);
    int32_t seen[MC_PAGES] = {0}; /* the pool's free list holds exactly the free pages */
    for (int i = 0; i < m->pool.n_free; i++) {
        int32_t p = m->pool.free_list[i];
        assert_int_equal(m->state[p], PAGE_FREE);
        assert_int_equal(seen[p]++, 0);
    }
}

static void mc_gen(struct mc *m, char *key, int *null_key, int32_t *ids, int *n) {
    static const char *const keys[] = {"", "", "a", "b", "ab"};
    int k = (int)(mc_rand(m) % 5);
    strcpy(key, keys[k]);
    *null_key = k == 0; /* NULL and "" must land in the same subtree */
    /* a prefix of one of a few base sequences, then a random tail: prefixes
     * collide often and diverge anywhere, also inside a page */
    const int32_t *base = m->bases[mc_rand(m) % 4];
    int len = (int)(mc_rand(m) % (unsigned)(m->max_tokens + 1));
    int cut = (int)(mc_rand(m) % (unsigned)(len + 1));
    if (mc_rand(m) % 3) cut = len;
    for (int i = 0; i < len; i++) ids[i] = i < cut ? base[i] : (int32_t)(mc_rand(m) % 3);
    *n = len;
}

static int mc_evict(struct mc *m, int want) {
    int total = radix_total_pages(m->t);
    m->in_evict = 1;
    int got = radix_evict(m->t, want);
    m->in_evict = 0;
    m->n_evict_calls++;
    assert_int_equal(got, total - radix_total_pages(m->t));
    if (got < want) assert_int_equal(radix_evictable_pages(m->t), 0);
    return got;
}

static void mc_probe(struct mc *m) {
    char key[8];
    int null_key, n;
    int32_t ids[MC_MAX_TOKENS], pages[MC_MAX_TOKENS], want[MC_MAX_TOKENS];
    struct radix_node *node;
    mc_gen(m, key, &null_key, ids, &n);
    int got = radix_match(m->t, null_key ? NULL : key, ids, n, pages, &node);
    assert_non_null(node);
    assert_int_equal(got, mc_match(m, key, ids, n, want));
    expect_pages(pages, want, got / m->ps);
    mc_touch(m, key, ids, got);
    if (m->n_pins < MC_MAX_PINS && mc_rand(m) % 3 == 0) { /* hold it for a while */
        struct mc_pin *pin = &m->pins[m->n_pins++];
        strcpy(pin->key, key);
        memcpy(pin->ids, ids, (size_t)got * sizeof *ids);
        pin->len = got;
        pin->node = node;
        radix_lock(m->t, node);
        mc_lock(m, key, ids, got, +1);
    }
}

static void mc_unpin(struct mc *m) {
    if (!m->n_pins) return;
    int i = (int)(mc_rand(m) % (unsigned)m->n_pins);
    struct mc_pin *pin = &m->pins[i];
    radix_unlock(m->t, pin->node);
    mc_lock(m, pin->key, pin->ids, pin->len, -1);
    *pin = m->pins[--m->n_pins];
}

static void mc_start(struct mc *m) {
    if (m->n_active == MC_MAX_ACTIVE) return;
    struct mc_req *r = &m->active[m->n_active];
    int32_t want[MC_MAX_TOKENS];
    mc_gen(m, r->key, &r->null_key, r->ids, &r->n);
    r->matched = radix_match(m->t, r->null_key ? NULL : r->key, r->ids, r->n, r->pages, &r->node);
    assert_int_equal(r->matched, mc_match(m, r->key, r->ids, r->n, want));
    expect_pages(r->pages, want, r->matched / m->ps);
    mc_touch(m, r->key, r->ids, r->matched);
    radix_lock(m->t, r->node);
    mc_lock(m, r->key, r->ids, r->matched, +1);
    mc_check(m);

    int have = r->matched / m->ps, need = (r->n + m->ps - 1) / m->ps - have;
    if (kv_pool_available(&m->pool) < need) mc_evict(m, need - kv_pool_available(&m->pool));
    if (kv_pool_alloc(&m->pool, need, r->pages + have) < 0) { /* no room: give up */
        radix_unlock(m->t, r->node);
        mc_lock(m, r->key, r->ids, r->matched, -1);
        return;
    }
    for (int i = 0; i < need; i++) {
        assert_int_equal(m->state[r->pages[have + i]], PAGE_FREE);
        m->state[r->pages[have + i]] = PAGE_HELD;
    }
    m->n_active++;
}

static void mc_end(struct mc *m, int abort) {
    if (!m->n_active) return;
    int i = (int)(mc_rand(m) % (unsigned)m->n_active);
    struct mc_req *r = &m->active[i];
    int ps = m->ps, aligned = r->n / ps * ps, n_pages = (r->n + ps - 1) / ps, from = 0;
    if (!abort) {
        int32_t tree_pages[MC_MAX_TOKENS];
        int cached = mc_match(m, r->key, r->ids, aligned, tree_pages);
        struct radix_node *node;
        int ret = radix_insert(m->t, r->null_key ? NULL : r->key, r->ids, aligned, r->pages, &node);
        assert_int_equal(ret, cached);
        assert_true(ret >= r->matched); /* the locked prefix cannot have gone */
        for (int j = 0; j < ret / ps; j++) {
            if (r->pages[j] == tree_pages[j]) {
                assert_true(j < r->matched / ps);
                continue;
            }
            assert_int_equal(m->state[r->pages[j]], PAGE_HELD); /* our duplicate */
            m->state[r->pages[j]] = PAGE_FREE;
            kv_pool_release(&m->pool, &r->pages[j], 1);
        }
        for (int j = ret / ps; j < aligned / ps; j++) {
            int32_t p = r->pages[j];
            assert_int_equal(m->state[p], PAGE_HELD);
            m->state[p] = PAGE_TREE;
            struct mc_record *rec = &m->rec[p];
            strcpy(rec->key, r->key);
            rec->len = (j + 1) * ps;
            memcpy(rec->ids, r->ids, (size_t)rec->len * sizeof *r->ids);
            rec->lock = 0;
        }
        mc_touch(m, r->key, r->ids, aligned);
        from = aligned / ps;
        if (m->n_pins < MC_MAX_PINS && mc_rand(m) % 4 == 0) {
            struct mc_pin *pin = &m->pins[m->n_pins++];
            strcpy(pin->key, r->key);
            memcpy(pin->ids, r->ids, (size_t)aligned * sizeof *r->ids);
            pin->len = aligned;
            pin->node = node;
            radix_lock(m->t, node);
            mc_lock(m, r->key, r->ids, aligned, +1);
        }
    } else {
        from = r->matched / ps;
    }
    /* what the request still owns: the partial last page, or on abort all
     * its own pages */
    for (int j = from; j < n_pages; j++) {
        assert_int_equal(m->state[r->pages[j]], PAGE_HELD);
        m->state[r->pages[j]] = PAGE_FREE;
        kv_pool_release(&m->pool, &r->pages[j], 1);
    }
    radix_unlock(m->t, r->node);
    mc_lock(m, r->key, r->ids, r->matched, -1);
    *r = m->active[--m->n_active];
}

static void fake_free(void *ctx, void *p) { free(p); }
static void *fake_alloc(void *ctx, size_t bytes) { return calloc(1, bytes ? bytes : 1); }

static void model_check(int ps, uint64_t seed, int n_ops) {
    static const struct backend_ops fake_ops = {.name = "fake", .alloc = fake_alloc,
                                                .free = fake_free};
    struct backend be = {&fake_ops, NULL};
    struct mc *m = xcalloc(1, sizeof *m);
    m->ps = ps;
    m->max_tokens = ps == 1 ? 16 : 6 * ps + ps - 1;
    m->rng = seed;
    struct kv_layer_layout layout = {1, 1, 0};
    assert_int_equal(kv_pool_init(&m->pool, &be, &layout, 1, ps, MC_PAGES, NULL), 0);
    kv_pool_scramble(&m->pool, seed);
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < MC_MAX_TOKENS; i++) m->bases[b][i] = (int32_t)(mc_rand(m) % 2);
    m->t = radix_create(ps, mc_release, m);

    for (int op = 0; op < n_ops; op++) {
        unsigned r = mc_rand(m) % 100;
        if (r < 30) mc_start(m);
        else if (r < 55) mc_end(m, 0);
        else if (r < 60) mc_end(m, 1);
        else if (r < 75) mc_probe(m);
        else if (r < 85) mc_unpin(m);
        else mc_evict(m, (int)(mc_rand(m) % 8));
        mc_check(m);
    }
    /* Wind down: with nothing held, everything cached is evictable, and
     * evicting it all returns every page to the pool. */
    while (m->n_active) mc_end(m, mc_rand(m) % 2), mc_check(m);
    while (m->n_pins) mc_unpin(m), mc_check(m);
    assert_int_equal(radix_evictable_pages(m->t), radix_total_pages(m->t));
    int total = radix_total_pages(m->t);
    assert_int_equal(mc_evict(m, 1 << 30), total);
    mc_check(m);
    assert_int_equal(kv_pool_available(&m->pool), MC_PAGES);
    /* Refill a little and let destroy hand the rest back. */
    for (int i = 0; i < 6; i++) mc_start(m), mc_end(m, 0), mc_check(m);
    while (m->n_pins) mc_unpin(m);
    m->destroying = 1;
    radix_destroy(m->t);
    for (int p = 0; p < MC_PAGES; p++) assert_int_equal(m->state[p], PAGE_FREE);
    assert_int_equal(kv_pool_available(&m->pool), MC_PAGES);
    assert_true(m->n_evict_calls > 0 && m->n_released > MC_PAGES);
    kv_pool_free(&m->pool);
    free(m);
}

static void test_model_check(void **state) {
    int ps = *(const int *)*state;
    for (uint64_t seed = 1; seed <= 4; seed++) model_check(ps, seed * 7919 + (uint64_t)ps, 5000);
}

#define PER_PAGE_SIZE(f)                                                                    \
    cmocka_unit_test_prestate(f, (void *)&page_sizes[0]),                                   \
        cmocka_unit_test_prestate(f, (void *)&page_sizes[1]),                               \
        cmocka_unit_test_prestate(f, (void *)&page_sizes[2])

int main(void) {
    const struct CMUnitTest tests[] = {
        PER_PAGE_SIZE(test_insert_match),
        PER_PAGE_SIZE(test_split_mid_edge),
        PER_PAGE_SIZE(test_short_prefix),
        PER_PAGE_SIZE(test_extra_keys),
        PER_PAGE_SIZE(test_lock_prevents_eviction),
        PER_PAGE_SIZE(test_lru_order),
        PER_PAGE_SIZE(test_visit_lru),
        PER_PAGE_SIZE(test_evict_exposes_parent),
        PER_PAGE_SIZE(test_many_children),
        PER_PAGE_SIZE(test_model_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
