/* model_ref_steps.h — the oracle's sequences and logits (reference.safetensors
 * of a tiny model) and a fixed schedule of steps over them, for the tests
 * that run a model split over ranks as threads (test_model_tp,
 * test_model_dp): a prefill, a mixed step and decode steps (oracle_ref.h
 * reads them). Needs cmocka. */
#ifndef KILN_TESTS_MODEL_REF_STEPS_H
#define KILN_TESTS_MODEL_REF_STEPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle_ref.h"

enum { MAX_CTX = 128, MAX_SEQS = REF_MAX_SEQS, MAX_TOKENS = 256, STEPS = 5, MAX_ROWS = 512 };

/* All MAX_SEQS sequences of dir's reference, which the schedule below
 * runs. */
static void ref_open_steps(struct ref *r, const char *dir) {
    ref_open(r, dir);
    assert_int_equal(r->n, MAX_SEQS);
}

/* The tokens sequence s feeds at step k: [from, to). A prefill of the
 * first half of each, then sequence 0 takes a chunk of 3 while the others
 * decode, then one token each. */
static void schedule(const struct ref *r, int k, int s, int *from, int *to) {
    int half = r->len[s] / 2;
    if (k == 0) *from = 0, *to = half;
    else if (k == 1) *from = half, *to = half + (s == 0 ? 3 : 1);
    else *from = half + (s == 0 ? 3 : 1) + (k - 2), *to = *from + 1;
}

/* The reference row of every logits row the steps give, in order. */
static int want_rows(const struct ref *r, const float **want) {
    int n = 0;
    for (int k = 0; k < STEPS; k++)
        for (int s = 0; s < r->n; s++) {
            int from, to;
            schedule(r, k, s, &from, &to);
            for (int p = from; p < to; p++) want[n++] = r->logits[s] + (size_t)p * (size_t)r->V;
        }
    return n;
}

#endif
