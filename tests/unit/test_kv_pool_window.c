/* test_kv_pool_window.c — a KV pool whose every layer slides
 * (cache/kv_pool.h): kv_pool_set_window takes the zero page and refuses a
 * pool already in use; kv_pool_window_dead counts the pages wholly before
 * a position's window, against a count of their slots one by one;
 * kv_pool_drop returns exactly those pages and points the table at the
 * zero page, never twice. A hybrid pool: each page taken has a sliding
 * page of its own (not the zero or padding page), kv_pool_swa_dead counts
 * as the slot count says, kv_pool_drop_swa gives back exactly the sliding
 * pages of those pages, once, release gives back the rest, and the
 * sliding layers' buffers hold the sliding pages' slots (their last slot
 * is writable). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "cache/kv_pool.h"
#include "tensor/backend.h"

/* pages of the table that no position of the window of `next` reads:
 * every slot of the page is before next - window + 1 */
static int dead_by_slots(int window, int page, int next, int n_pages) {
    int dead = 0;
    for (int p = 0; p < n_pages; p++) {
        int last_slot = (p + 1) * page - 1;
        if (last_slot < next - window + 1) dead = p + 1;
    }
    return dead;
}

static void test_window_dead(void **state) {
    (void)state;
    const int pages[] = {1, 4, 16}, windows[] = {1, 3, 8, 33};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            struct kv_pool p;
            struct kiln_error err = {0};
            assert_int_equal(kv_pool_init_ids(&p, pages[a], 64, &err), 0);
            assert_int_equal(kv_pool_window_dead(&p, 500, 40), 0); /* no window yet */
            assert_int_equal(kv_pool_set_window(&p, windows[b], &err), 0);
            for (int next = 0; next < 300; next++)
                for (int n = 0; n <= 40; n += 13)
                    assert_int_equal(kv_pool_window_dead(&p, next, n), dead_by_slots(windows[b], pages[a], next, n));
            kv_pool_free(&p);
        }
}

static void test_drop(void **state) {
    (void)state;
    struct kv_pool p;
    struct kiln_error err = {0};
    assert_int_equal(kv_pool_init_ids(&p, 4, 16, &err), 0);
    assert_int_equal(kv_pool_set_window(&p, 8, &err), 0);
    assert_int_equal(p.zero_page, 0);
    assert_int_equal(kv_pool_usable(&p), 15);
    assert_int_equal(p.n_free, 15);
    int32_t table[6];
    assert_int_equal(kv_pool_alloc(&p, 6, table), 0);
    for (int i = 0; i < 6; i++) assert_int_not_equal(table[i], p.zero_page);
    int32_t kept[6];
    for (int i = 0; i < 6; i++) kept[i] = table[i];
    int dropped = 0;
    /* next 20: the window starts at 13, so pages 0..2 (slots 0..11) go */
    int dead = kv_pool_window_dead(&p, 20, 6);
    assert_int_equal(dead, 3);
    kv_pool_drop(&p, table, &dropped, dead);
    assert_int_equal(dropped, 3);
    assert_int_equal(p.n_free, 15 - 6 + 3);
    for (int i = 0; i < 3; i++) assert_int_equal(table[i], p.zero_page);
    for (int i = 3; i < 6; i++) assert_int_equal(table[i], kept[i]);
    /* the same or an earlier count drops nothing more */
    kv_pool_drop(&p, table, &dropped, 3);
    kv_pool_drop(&p, table, &dropped, 1);
    assert_int_equal(p.n_free, 12);
    kv_pool_drop(&p, table, &dropped, 5);
    assert_int_equal(dropped, 5);
    assert_int_equal(p.n_free, 14);
    /* the pages that came back are handed out again, the zero page never */
    int32_t again[14];
    assert_int_equal(kv_pool_alloc(&p, 14, again), 0);
    for (int i = 0; i < 14; i++) assert_int_not_equal(again[i], p.zero_page);
    assert_int_equal(kv_pool_alloc(&p, 1, again), -1);
    kv_pool_free(&p);
}

static void test_set_window_refusals(void **state) {
    (void)state;
    struct kv_pool p;
    struct kiln_error err = {0};
    assert_int_equal(kv_pool_init_ids(&p, 4, 8, &err), 0);
    assert_int_equal(kv_pool_set_window(&p, 0, &err), -1);
    assert_non_null(strstr(err.msg, "at least 1"));
    int32_t one;
    assert_int_equal(kv_pool_alloc(&p, 1, &one), 0);
    assert_int_equal(kv_pool_set_window(&p, 8, &err), -1); /* a page is out */
    assert_non_null(strstr(err.msg, "fresh pool"));
    kv_pool_release(&p, &one, 1);
    assert_int_equal(kv_pool_set_window(&p, 8, &err), 0);
    assert_int_equal(kv_pool_set_window(&p, 8, &err), -1); /* twice */
    kv_pool_free(&p);
}

static void test_hybrid(void **state) {
    (void)state;
    struct backend be;
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 1};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    /* layers 0 and 1 slide, layer 2 does not; 4-slot pages, 20 pages, 7 sliding ones */
    const struct kv_layer_layout layout[3] = {{6, 6, 0}, {6, 6, 0}, {10, 10, 0}};
    const unsigned char swa[3] = {1, 1, 0};
    struct kv_pool p;
    assert_int_equal(kv_pool_init_hybrid(&p, &be, layout, swa, 3, 4, 20, 8, 2, &err), -1);
    assert_int_equal(kv_pool_init_hybrid(&p, &be, layout, swa, 3, 4, 20, 8, 7, &err), 0);
    assert_int_equal(kv_pool_token_bytes_part(layout, swa, 3, p.dtype, 0), 20 * dtype_size(p.dtype));
    assert_int_equal(kv_pool_token_bytes_part(layout, swa, 3, p.dtype, 1), 24 * dtype_size(p.dtype));
    /* the last slot of every layer's buffer is there (ASan would tell) */
    const long last[3] = {7 * 4 - 1, 7 * 4 - 1, 20 * 4 - 1};
    for (int l = 0; l < 3; l++) ((float *)p.k[l])[last[l] * layout[l].k_width + layout[l].k_width - 1] = 1;
    assert_int_equal(kv_pool_available(&p), 5); /* the sliding pages bind: 7 less zero and padding */
    int32_t a[5];
    assert_int_equal(kv_pool_alloc(&p, 6, a), -1);
    assert_int_equal(kv_pool_alloc(&p, 5, a), 0);
    unsigned seen = 0;
    for (int i = 0; i < 5; i++) {
        int32_t s = kv_pool_swa_page(&p, a[i]);
        assert_true(s >= 2 && s < 7 && !(seen & 1u << s));
        seen |= 1u << s;
    }
    assert_int_equal(kv_pool_available(&p), 0);
    assert_int_equal(p.n_free, 15);
    /* a sequence of 5 pages at position 19: positions 0..11 are out of the window of 8 */
    for (int next = 0; next < 60; next++)
        assert_int_equal(kv_pool_swa_dead(&p, next, 5), dead_by_slots(8, 4, next, 5));
    int dead = kv_pool_swa_dead(&p, 19, 5);
    assert_int_equal(dead, 3);
    kv_pool_drop_swa(&p, a, dead);
    kv_pool_drop_swa(&p, a, dead); /* nothing twice */
    assert_int_equal(kv_pool_swa_available(&p), 3);
    for (int i = 0; i < 5; i++) assert_int_equal(kv_pool_swa_alive(&p, a[i]), i >= 3);
    for (int i = 0; i < 3; i++) assert_int_equal(kv_pool_swa_page(&p, a[i]), 0);
    assert_int_equal(kv_pool_available(&p), 3);
    /* pins: shedding spares pinned pages; adoption moves a sliding page */
    kv_pool_swa_pin(&p, a + 3, 1, 1);
    kv_pool_swa_pin(&p, a + 3, 1, 1);
    assert_int_equal(kv_pool_swa_shed(&p, a, 5, 1), 1); /* a[4]: a[3] is pinned, a[0..2] have none */
    assert_true(kv_pool_swa_alive(&p, a[3]) && !kv_pool_swa_alive(&p, a[4]));
    assert_int_equal(kv_pool_swa_shed(&p, a, 5, 5), 0);
    kv_pool_swa_pin(&p, a + 3, 1, -1);
    int32_t s3 = kv_pool_swa_page(&p, a[3]);
    kv_pool_swa_adopt(&p, a[0], a[3]);
    assert_int_equal(kv_pool_swa_page(&p, a[0]), s3);
    assert_false(kv_pool_swa_alive(&p, a[3]));
    kv_pool_swa_adopt(&p, a[0], a[1]); /* a[1] has none: nothing */
    assert_int_equal(kv_pool_swa_page(&p, a[0]), s3);
    kv_pool_swa_pin(&p, a + 3, 1, -1);
    assert_int_equal(kv_pool_swa_shed(&p, a, 5, 5), 1); /* a[0] */
    assert_int_equal(kv_pool_swa_available(&p), 5);
    kv_pool_release(&p, a, 5);
    assert_int_equal(p.n_free, 20);
    assert_int_equal(kv_pool_swa_available(&p), 5);
    kv_pool_free(&p);
    /* one pool: no sliding pages */
    assert_int_equal(kv_pool_init(&p, &be, layout, 3, 4, 20, &err), 0);
    assert_int_equal(kv_pool_available(&p), 20);
    assert_int_equal(kv_pool_swa_dead(&p, 100, 5), 0);
    kv_pool_free(&p);
    backend_destroy(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_dead),
        cmocka_unit_test(test_drop),
        cmocka_unit_test(test_set_window_refusals),
        cmocka_unit_test(test_hybrid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
