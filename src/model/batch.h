/* batch.h — one forward step's work: the contract between the scheduler,
 * the model and every backend (the "ragged" layout of FlashInfer/SGLang).
 *
 * Tokens of all sequences are flattened into one list. Sequence s owns token
 * rows [q_start[s], q_start[s+1]); each token has an absolute position in its
 * sequence and attends causally to positions 0..position of that sequence.
 * The K/V of position p of sequence s lives in slot
 *     kv_pages[kv_page_start[s] + p / page_size] * page_size + p % page_size
 * and out_slot[t] is the slot where token t's new K/V is written (the
 * scheduler computes it from the same page list). kv_len[s] is the sequence's
 * KV length after this step. A decode row is simply a sequence with one new
 * token; prefill, chunked prefill and decode rows mix freely.
 *
 *   seq 0: prefill chunk of 3    seq 1: decode   seq 2: decode
 *   rows   0 1 2                 3               4
 *   q_start = {0, 3, 4, 5}
 *
 * logit_rows lists the token rows whose logits the caller wants (the last
 * row of each sequence when sampling, every row for scoring/verification).
 * All arrays are host memory owned by the caller; a backend copies what it
 * needs to its device.
 */
#ifndef KILN_MODEL_BATCH_H
#define KILN_MODEL_BATCH_H

#include <stdint.h>

enum batch_mode {
    BATCH_MODE_EXTEND = 0, /* prefill / chunked prefill, decode rows may be mixed in */
    BATCH_MODE_DECODE,     /* exactly one new token per sequence */
    BATCH_MODE_IDLE,       /* no work (a data-parallel rank without requests) */
};

struct batch {
    enum batch_mode mode;
    int n_tokens;
    const int32_t *input_ids;     /* [n_tokens] */
    const int32_t *positions;     /* [n_tokens] */
    const int32_t *out_slot;      /* [n_tokens] */
    int n_seqs;
    const int32_t *q_start;       /* [n_seqs + 1] */
    const int32_t *kv_len;        /* [n_seqs] */
    const int32_t *kv_page_start; /* [n_seqs + 1] */
    const int32_t *kv_pages;      /* [kv_page_start[n_seqs]] */
    int page_size;
    /* DP attention (model_parallel.dp_size > 1): the data parallel group
     * that computes sequence s's attention and holds its KV, [n_seqs]
     * below dp_size; NULL: every sequence is group 0's. Ignored otherwise. */
    const int32_t *seq_group;
    /* A hybrid KV pool (cache/kv_pool.h): the sliding layers' slot of each
     * token and page of each kv_pages entry, in their own pool (same
     * kv_page_start). NULL: the runner fills them from the pool
     * (kv_pool_swa_page) when it has one. */
    const int32_t *swa_out_slot; /* [n_tokens] */
    const int32_t *swa_kv_pages; /* [kv_page_start[n_seqs]] */
    int n_logit_rows;
    const int32_t *logit_rows;    /* [n_logit_rows], ascending */
};

#endif
