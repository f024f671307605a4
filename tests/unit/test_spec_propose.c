/* test_spec_propose.c — NGRAM drafts (scheduler/spec.c spec_propose)
 * against hand-worked histories: the continuation of the earlier place
 * that matches the most of the last tokens (up to the max window; the
 * latest among equals), at least the min window, at most max tokens and
 * never past the history; nothing without a match. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "scheduler/engine_internal.h"
#include "scheduler/request.h"

static int propose(const int32_t *h, int n, int wmin, int wmax, int max, int32_t *out) {
    struct engine e;
    memset(&e, 0, sizeof e);
    e.opt.spec_draft_tokens = max;
    e.opt.spec_min_window = wmin;
    e.opt.spec_max_window = wmax;
    struct req r;
    memset(&r, 0, sizeof r);
    r.tokens = (int32_t *)h;
    r.n_tokens = n;
    return spec_propose(&e, &r, max, out);
}

#define H(...) (const int32_t[]){__VA_ARGS__}, (int)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static void expect(const int32_t *h, int n, int wmin, int wmax, int max, const int32_t *want, int n_want) {
    int32_t out[SPEC_MAX_DRAFT];
    int got = propose(h, n, wmin, wmax, max, out);
    assert_int_equal(got, n_want);
    for (int i = 0; i < n_want; i++) assert_int_equal(out[i], want[i]);
}

static void test_propose(void **state) {
    (void)state;
    /* no earlier 9: nothing */
    expect(H(1, 2, 3, 9), 1, 12, 4, NULL, 0);
    /* the last token alone matches at 3 (then 4 5): a one-token match */
    expect(H(1, 3, 4, 5, 3), 1, 12, 4, (const int32_t[]){4, 5, 3}, 3);
    /* "7 3" matches at 1..2 (then 8), "3" alone later at 4 (then 6): the longer wins */
    expect(H(0, 7, 3, 8, 3, 6, 7, 3), 1, 12, 2, (const int32_t[]){8, 3}, 2);
    /* with a min window of 3 neither counts */
    expect(H(0, 7, 3, 8, 3, 6, 7, 3), 3, 12, 2, NULL, 0);
    /* two equal matches of "5 6": the latest (then 2) */
    expect(H(5, 6, 1, 5, 6, 2, 5, 6), 1, 12, 1, (const int32_t[]){2}, 1);
    /* a max window of 1: the latest place of the last token */
    expect(H(4, 9, 4, 1, 4, 2, 9, 4), 1, 1, 1, (const int32_t[]){2}, 1);
    /* a run: its own earlier part, clipped by the history's end */
    expect(H(8, 8, 8, 8), 1, 12, 5, (const int32_t[]){8}, 1);
    expect(H(1, 2, 1, 2, 1, 2), 1, 12, 6, (const int32_t[]){1, 2}, 2);
    /* at most max tokens */
    expect(H(1, 2, 3, 4, 5, 6, 1), 1, 12, 3, (const int32_t[]){2, 3, 4}, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_propose)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
