/* test_host_cache.c — the prefix cache's host tier (cache/host_cache.h) on
 * a CPU KV pool of three layers (one of them MLA-shaped, V inside K):
 *
 *  - a page put under its prefix comes back byte for byte into another
 *    device page, every layer's K and V;
 *  - a lookup checks the tokens and the parent key, not the hash alone:
 *    the same key with other tokens or another parent is a miss;
 *  - the key chain depends on the salt, the parent and every token;
 *  - a full store drops its least recently used entry (a put or load of
 *    an entry, or a touch, makes it the most recent); putting a stored
 *    prefix again copies nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "cache/host_cache.h"
#include "cache/kv_pool.h"
#include "tensor/backend.h"

enum { PS = 4, PAGES = 16 };

struct fixture {
    struct backend be;
    struct kv_pool pool;
    size_t page_bytes;
};

static void setup(struct fixture *f) {
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 1};
    assert_int_equal(backend_create(&f->be, "cpu", &bo, &err), 0);
    const struct kv_layer_layout layout[3] = {{24, 16, 0}, {40, 32, 1}, {8, 8, 0}};
    assert_int_equal(kv_pool_init(&f->pool, &f->be, layout, 3, PS, PAGES, &err), 0);
    f->page_bytes = kv_pool_page_bytes(layout, 3, PS, f->pool.dtype);
}

static void teardown(struct fixture *f) {
    kv_pool_free(&f->pool);
    backend_destroy(&f->be);
}

/* page `page` of every layer filled with values from `seed` */
static void fill(struct fixture *f, int32_t page, unsigned seed) {
    unsigned char *h = xmalloc(f->page_bytes);
    for (size_t i = 0; i < f->page_bytes; i++) h[i] = (unsigned char)((seed * 2654435761u + i * 40503u) >> 13);
    kv_pool_page_load(&f->pool, page, h);
    free(h);
}

static void expect_same(struct fixture *f, int32_t a, int32_t b) {
    unsigned char *ha = xmalloc(f->page_bytes), *hb = xmalloc(f->page_bytes);
    kv_pool_page_save(&f->pool, a, ha);
    kv_pool_page_save(&f->pool, b, hb);
    assert_memory_equal(ha, hb, f->page_bytes);
    free(ha), free(hb);
}

static void test_round_trip(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct host_cache *h = host_cache_create(&f.pool, 8);
    assert_non_null(h);
    int32_t tok[PS] = {5, 6, 7, 8};
    uint64_t root = host_cache_root(NULL), k = host_cache_key(root, tok, PS);
    fill(&f, 3, 11);
    fill(&f, 9, 12);
    assert_int_equal(host_cache_put(h, &f.pool, 3, k, root, tok), 1);
    assert_int_equal(host_cache_pages(h), 1);
    assert_int_equal(host_cache_load(h, &f.pool, k, root, tok, 9), 0);
    expect_same(&f, 3, 9);
    /* the same prefix again: touched, not copied */
    fill(&f, 3, 13);
    assert_int_equal(host_cache_put(h, &f.pool, 3, k, root, tok), 0);
    assert_int_equal(host_cache_load(h, &f.pool, k, root, tok, 10), 0);
    expect_same(&f, 9, 10);
    host_cache_destroy(h);
    teardown(&f);
}

static void test_checked_lookup(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct host_cache *h = host_cache_create(&f.pool, 8);
    int32_t tok[PS] = {5, 6, 7, 8}, other[PS] = {5, 6, 7, 9};
    uint64_t root = host_cache_root(NULL), k = host_cache_key(root, tok, PS);
    host_cache_put(h, &f.pool, 1, k, root, tok);
    assert_true(host_cache_has(h, k, root, tok));
    assert_false(host_cache_has(h, k, root, other));    /* same key, other tokens */
    assert_false(host_cache_has(h, k, root + 1, tok));  /* same key, other parent */
    assert_false(host_cache_has(h, k + 1, root, tok));
    assert_int_equal(host_cache_load(h, &f.pool, k, root, other, 2), -1);
    /* the chain: salt, parent and every token move the key */
    assert_true(host_cache_root("a") != root && host_cache_root("a") != host_cache_root("b"));
    assert_true(host_cache_key(root, other, PS) != k);
    assert_true(host_cache_key(host_cache_root("a"), tok, PS) != k);
    assert_true(host_cache_key(k, tok, PS) != k);
    host_cache_destroy(h);
    teardown(&f);
}

static void test_lru(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct host_cache *h = host_cache_create(&f.pool, 3);
    int32_t tok[5][PS];
    uint64_t root = host_cache_root("s"), key[5];
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < PS; j++) tok[i][j] = 100 * i + j;
        key[i] = host_cache_key(root, tok[i], PS);
        fill(&f, i, 20 + (unsigned)i);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(host_cache_put(h, &f.pool, i, key[i], root, tok[i]), 1);
    assert_int_equal(host_cache_pages(h), 3);
    /* 0 used last: 1 is the least recent and goes first */
    assert_true(host_cache_touch(h, key[0], root, tok[0]));
    host_cache_put(h, &f.pool, 3, key[3], root, tok[3]);
    assert_false(host_cache_has(h, key[1], root, tok[1]));
    assert_true(host_cache_has(h, key[0], root, tok[0]) && host_cache_has(h, key[2], root, tok[2]));
    /* a load is a use too: 2 then 0 loaded, so 3 goes next */
    assert_int_equal(host_cache_load(h, &f.pool, key[2], root, tok[2], 10), 0);
    assert_int_equal(host_cache_load(h, &f.pool, key[0], root, tok[0], 11), 0);
    host_cache_put(h, &f.pool, 4, key[4], root, tok[4]);
    assert_false(host_cache_has(h, key[3], root, tok[3]));
    assert_int_equal(host_cache_pages(h), 3);
    assert_int_equal(host_cache_capacity(h), 3);
    /* what stayed is what was put */
    assert_int_equal(host_cache_load(h, &f.pool, key[4], root, tok[4], 12), 0);
    expect_same(&f, 4, 12);
    expect_same(&f, 0, 11);
    expect_same(&f, 2, 10);
    host_cache_destroy(h);
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_checked_lookup),
        cmocka_unit_test(test_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
