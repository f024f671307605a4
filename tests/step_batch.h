/* step_batch.h — the model tests' way of building one forward step:
 * sequences with KV pages from a pool, each adding its new tokens (a whole
 * prompt, or one decode token) to a ragged batch whose last row per
 * sequence wants logits. Included by one test file each (static
 * definitions), after <cmocka.h>. */
#ifndef KILN_TESTS_CUDA_STEP_BATCH_H
#define KILN_TESTS_CUDA_STEP_BATCH_H

#include <stdint.h>
#include <string.h>

#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/batch.h"

/* A sequence's KV state: len positions have K/V; pages [cap] */
struct sb_seq {
    int len, n_pages;
    int32_t *pages;
    const int32_t *ids; /* every token it will feed */
};

struct step_batch {
    int page, max_tokens, max_seqs;
    int32_t *ids, *pos, *slot, *q_start, *kv_len, *page_start, *rows, *pages;
    int nt, ns, np;
};

static void sb_init(struct step_batch *b, int page, int max_tokens, int max_seqs, int max_pages) {
    memset(b, 0, sizeof *b);
    b->page = page, b->max_tokens = max_tokens, b->max_seqs = max_seqs;
    b->ids = xmalloc((size_t)max_tokens * 4), b->pos = xmalloc((size_t)max_tokens * 4);
    b->slot = xmalloc((size_t)max_tokens * 4);
    b->q_start = xmalloc((size_t)(max_seqs + 1) * 4), b->page_start = xmalloc((size_t)(max_seqs + 1) * 4);
    b->kv_len = xmalloc((size_t)max_seqs * 4), b->rows = xmalloc((size_t)max_seqs * 4);
    b->pages = xmalloc((size_t)max_pages * 4);
}

static void sb_free(struct step_batch *b) {
    free(b->ids), free(b->pos), free(b->slot), free(b->q_start), free(b->page_start), free(b->kv_len);
    free(b->rows), free(b->pages);
}

static void sb_begin(struct step_batch *b) { b->nt = b->ns = b->np = 0; }

/* Adds s's next new_tokens tokens (pages from kv as needed); returns its row. */
static int sb_add(struct step_batch *b, struct kv_pool *kv, struct sb_seq *s, int new_tokens) {
    assert_true(b->ns < b->max_seqs && b->nt + new_tokens <= b->max_tokens);
    int need = (s->len + new_tokens + b->page - 1) / b->page;
    if (need > s->n_pages) {
        assert_int_equal(kv_pool_alloc(kv, need - s->n_pages, s->pages + s->n_pages), 0);
        s->n_pages = need;
    }
    b->q_start[b->ns] = b->nt;
    b->page_start[b->ns] = b->np;
    memcpy(b->pages + b->np, s->pages, (size_t)s->n_pages * 4);
    b->np += s->n_pages;
    for (int k = 0; k < new_tokens; k++) {
        int p = s->len + k;
        b->ids[b->nt] = s->ids[p];
        b->pos[b->nt] = p;
        b->slot[b->nt] = s->pages[p / b->page] * b->page + p % b->page;
        b->nt++;
    }
    s->len += new_tokens;
    b->kv_len[b->ns] = s->len;
    b->rows[b->ns] = b->nt - 1;
    return b->ns++;
}

/* The step as a batch (every sequence's last row wants logits). */
static struct batch sb_batch(struct step_batch *b) {
    b->q_start[b->ns] = b->nt;
    b->page_start[b->ns] = b->np;
    return (struct batch){.mode = BATCH_MODE_EXTEND, .n_tokens = b->nt, .input_ids = b->ids,
                          .positions = b->pos, .out_slot = b->slot, .n_seqs = b->ns, .q_start = b->q_start,
                          .kv_len = b->kv_len, .kv_page_start = b->page_start, .kv_pages = b->pages,
                          .page_size = b->page, .n_logit_rows = b->ns, .logit_rows = b->rows};
}

#endif
