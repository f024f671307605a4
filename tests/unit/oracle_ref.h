/* oracle_ref.h — an oracle model's sequences and Hugging Face's logits of
 * them (its reference.safetensors: p<i>.ids, p<i>.logits), for the tests
 * that check a model or the engine against them. Needs cmocka. */
#ifndef KILN_TESTS_ORACLE_REF_H
#define KILN_TESTS_ORACLE_REF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "model/safetensors.h"
#include "tensor/dtype.h"

enum { REF_MAX_SEQS = 4 };

/* A path under $KILN_FIXTURES (else tests/fixtures); the caller frees it. */
static inline char *fixture(const char *rel) {
    const char *fx = getenv("KILN_FIXTURES");
    return path_join(fx ? fx : "tests/fixtures", rel);
}

/* Hugging Face's sequences and logits (reference.safetensors). */
struct ref {
    struct st_set st;
    int n, V;
    int len[REF_MAX_SEQS];
    const int32_t *ids[REF_MAX_SEQS];
    const float *logits[REF_MAX_SEQS]; /* [len][V] */
};

/* The first sequences (up to REF_MAX_SEQS) of dir/reference.safetensors;
 * at least one. st_close(&r->st) when done. */
static inline void ref_open(struct ref *r, const char *dir) {
    struct kiln_error err = {0};
    char *path = path_join(dir, "reference.safetensors");
    memset(r, 0, sizeof *r);
    if (st_open_file(&r->st, path, &err)) fail_msg("%s", err.msg);
    free(path);
    for (r->n = 0; r->n < REF_MAX_SEQS; r->n++) {
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
    assert_true(r->n > 0);
}

#endif
