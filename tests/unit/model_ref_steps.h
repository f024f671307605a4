/* model_ref_steps.h — the oracle's sequences and logits (reference.safetensors
 * of a tiny model) and a fixed schedule of steps over them, for the tests
 * that run a model split over ranks as threads (test_model_tp,
 * test_model_dp): a prefill, a mixed step and decode steps (oracle_ref.h
 * reads them), and the runner of those steps. Needs cmocka. */
#ifndef KILN_TESTS_MODEL_REF_STEPS_H
#define KILN_TESTS_MODEL_REF_STEPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cache/kv_pool.h"
#include "oracle_ref.h"
#include "runner/runner.h"

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

/* Runs the schedule's STEPS on run (KV page size `page`) and writes the
 * logits of every row, in want_rows' order, to out[rows][V]; sequence s
 * runs on DP group group[s] when group is not NULL. pages[s] and
 * n_pages[s] hold each sequence's KV pages, taken from the runner's pool
 * as the steps need them (the caller gives them back). */
static int ref_run_steps(struct runner *run, const struct ref *r, int page, const int32_t *group,
                         int32_t (*pages)[MAX_CTX], int *n_pages, float *out, struct kiln_error *err) {
    struct kv_pool *kv = runner_kv(run);
    int32_t ids[MAX_TOKENS], pos[MAX_TOKENS], slot[MAX_TOKENS], rows[MAX_TOKENS];
    int32_t q_start[MAX_SEQS + 1], kv_len[MAX_SEQS], page_start[MAX_SEQS + 1], plist[MAX_SEQS * MAX_CTX];
    size_t done = 0;
    for (int k = 0; k < STEPS; k++) {
        int nt = 0, np = 0;
        for (int s = 0; s < r->n; s++) {
            int from, to;
            schedule(r, k, s, &from, &to);
            int need = (to + page - 1) / page;
            if (need > n_pages[s]) {
                if (kv_pool_alloc(kv, need - n_pages[s], pages[s] + n_pages[s]))
                    return kiln_errorf(err, "KV pool exhausted");
                n_pages[s] = need;
            }
            q_start[s] = nt;
            page_start[s] = np;
            memcpy(plist + np, pages[s], (size_t)n_pages[s] * 4);
            np += n_pages[s];
            kv_len[s] = to;
            for (int p = from; p < to; p++, nt++) {
                ids[nt] = r->ids[s][p];
                pos[nt] = p;
                slot[nt] = pages[s][p / page] * page + p % page;
                rows[nt] = nt;
            }
        }
        q_start[r->n] = nt;
        page_start[r->n] = np;
        struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = nt, .input_ids = ids, .positions = pos,
                          .out_slot = slot, .n_seqs = r->n, .q_start = q_start, .kv_len = kv_len,
                          .kv_page_start = page_start, .kv_pages = plist, .page_size = page,
                          .seq_group = group, .n_logit_rows = nt, .logit_rows = rows};
        if (runner_forward(run, &b, out + done * (size_t)r->V, err)) return -1;
        done += (size_t)nt;
    }
    return 0;
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
