/* model_ref_steps.h — the oracle's sequences and logits (reference.safetensors
 * of a tiny model) and a fixed schedule of steps over them, for the tests
 * that run a model split over ranks as threads (test_model_tp,
 * test_model_dp): a prefill, a mixed step and decode steps. Needs cmocka. */
#ifndef KILN_TESTS_MODEL_REF_STEPS_H
#define KILN_TESTS_MODEL_REF_STEPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "model/safetensors.h"
#include "tensor/dtype.h"

enum { MAX_CTX = 128, MAX_SEQS = 4, MAX_TOKENS = 256, STEPS = 5, MAX_ROWS = 512 };

static char *fixture(const char *rel) {
    const char *fx = getenv("KILN_FIXTURES");
    return path_join(fx ? fx : "tests/fixtures", rel);
}

/* Hugging Face's sequences and logits (reference.safetensors). */
struct ref {
    struct st_set st;
    int n, V;
    int len[MAX_SEQS];
    const int32_t *ids[MAX_SEQS];
    const float *logits[MAX_SEQS]; /* [len][V] */
};

static void ref_open(struct ref *r, const char *dir) {
    struct kiln_error err = {0};
    char *path = path_join(dir, "reference.safetensors");
    memset(r, 0, sizeof *r);
    if (st_open_file(&r->st, path, &err)) fail_msg("%s", err.msg);
    free(path);
    for (r->n = 0; r->n < MAX_SEQS; r->n++) {
        char name[32];
        snprintf(name, sizeof name, "p%d.ids", r->n);
        const struct st_tensor *ids = st_find(&r->st, name);
        snprintf(name, sizeof name, "p%d.logits", r->n);
        const struct st_tensor *lg = st_find(&r->st, name);
        if (!ids || !lg) break;
        assert_int_equal(ids->dtype, DTYPE_I32);
        assert_int_equal(lg->dtype, DTYPE_F32);
        r->len[r->n] = (int)ids->shape[0];
        r->V = (int)lg->shape[1];
        r->ids[r->n] = ids->data;
        r->logits[r->n] = lg->data;
    }
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
