/* ctrl_msg.h — the lockstep messages rank 0's runner sends the other ranks
 * of a job on its control communicator (runner_options.ctrl), as bytes.
 *
 * Pure encoding and parsing, no sockets (runner_follow.c moves the bytes;
 * tests/fuzz/fuzz_ctrl_msg.c feeds the parser arbitrary input, which it
 * must refuse unless every size and index is within the runner's
 * limits: it comes from a socket). Integers are little-endian whatever
 * the host; the layout is in docs/distributed.md:
 *
 *   header  u32 magic 0x5054534b ("KSTP") | u16 version (3) | u16 type
 *           | u32 body length | u32 sequence number (one per message)
 *   LOAD    what rank 0's runner_load was given (model and runner sizes)
 *   STEP    one forward: its kind and the batch's host arrays
 *   STOP    the runner is freed
 *   END     the job ends: no runner follows
 *
 * A parsed message is exactly the bytes its encoder writes (the fuzz target
 * checks the round trip).
 */
#ifndef KILN_RUNNER_CTRL_MSG_H
#define KILN_RUNNER_CTRL_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "model/batch.h"

struct buf;
struct kiln_error;

#define CTRL_MSG_MAGIC 0x5054534bu
#define CTRL_MSG_VERSION 3
#define CTRL_MSG_HEADER 16
/* Every message goes out as one broadcast of CTRL_MSG_FRAME bytes (the
 * header and the body's start, zero-padded) and, when longer, a second of
 * the rest; LOAD, STOP and END always fit the first. */
#define CTRL_MSG_FRAME 1024
#define CTRL_MSG_NAME_MAX 32 /* load_format, quantization: at most 31 bytes */

enum ctrl_msg_type { CTRL_MSG_LOAD = 1, CTRL_MSG_STEP = 2, CTRL_MSG_STOP = 3, CTRL_MSG_END = 4 };

/* STEP flags */
enum {
    CTRL_STEP_SAMPLE = 1, /* runner_forward_sample (else runner_forward) */
    CTRL_STEP_MASKED = 2, /* with grammar masks filled during the step (SAMPLE only) */
    CTRL_STEP_WANT = 4,   /* want_logits[n_logit_rows] follows (SAMPLE only) */
    CTRL_STEP_GROUPS = 8, /* seq_group[n_seqs] follows logit_rows (DP attention; the
                             encoder sets it when the batch has seq_group) */
    CTRL_STEP_SWA = 16,   /* swa_out_slot[n_tokens] and swa_kv_pages[pages] follow (a
                             hybrid KV pool; the encoder sets it when the batch has them) */
};

/* The sizes of rank 0's runner_load: what model_options and
 * runner_options said, so every rank builds the same runner. */
struct ctrl_load {
    int max_batch_tokens, max_seqs, max_context; /* 0 .. INT32_MAX */
    uint64_t seed;
    int no_shared_expert_fusion, moe_count, no_graphs, skip_warmup, disable_hybrid_swa; /* 0 or 1 */
    int dummy_routing;                           /* enum model_routing */
    char load_format[CTRL_MSG_NAME_MAX];         /* "" for NULL */
    char quantization[CTRL_MSG_NAME_MAX];        /* "" for NULL */
    int page_size;                               /* 0 .. 1 << 20 */
    long kv_tokens;                              /* 0 .. 1 << 40 */
    double mem_fraction_static;                  /* 0 .. 1 */
    int max_running_requests, chunked_prefill_size; /* 0 .. INT32_MAX */
    double swa_full_tokens_ratio;                /* 0 .. 1 */
};

/* What a STEP may hold: the receiving runner's reserved sizes. */
struct ctrl_limits {
    int max_tokens, max_seqs;
    long max_pages;  /* page-list entries of one batch */
    long vocab;
    int max_context;
    int page_size;
    int pool_pages;  /* the KV pool's pages (slots: pool_pages * page_size) */
    int swa_pages;   /* a hybrid pool's sliding pages (0: none, CTRL_STEP_SWA refused) */
    int dp_groups;   /* DP attention groups: seq_group entries below it (0, 1: no seq_group) */
};

/* A parsed message. A STEP's batch arrays live in the message's storage,
 * which grows to the largest step seen and is kept for the next parse. */
struct ctrl_msg {
    enum ctrl_msg_type type;
    uint32_t seq;
    struct ctrl_load load;          /* LOAD */
    int flags, scratch_page;        /* STEP: CTRL_STEP_*, the KV page padding rows write (-1: none) */
    struct batch b;                 /* STEP */
    const unsigned char *want_logits; /* STEP with CTRL_STEP_WANT, else NULL */
    int32_t *i32;                   /* storage */
    size_t i32_cap;
    unsigned char *u8;
    size_t u8_cap;
};

/* Checks a header (CTRL_MSG_HEADER bytes): magic, version, a known type.
 * Returns the body length (at most CTRL_MSG_FRAME - CTRL_MSG_HEADER for
 * LOAD, STOP and END), or -1 with a message in err. */
long ctrl_msg_header(const uint8_t *hdr, enum ctrl_msg_type *type, uint32_t *seq, struct kiln_error *err);

/* Parses one whole message (exactly len bytes). A STEP needs lim (NULL:
 * refused, no runner yet) and is refused unless its batch is one the
 * runner may run: counts within lim, prefix sums that start at 0, do not
 * decrease and end at the counts, token ids, positions, slots and pages in
 * range, every position below its sequence's KV length and every KV
 * length within its pages and the context, one token per sequence in a
 * DECODE batch, at most lim->max_seqs rows sampled, groups below
 * lim->dp_groups. Returns 0, or -1 with
 * a message in err. */
int ctrl_msg_parse(const uint8_t *data, size_t len, const struct ctrl_limits *lim, struct ctrl_msg *m,
                   struct kiln_error *err);
void ctrl_msg_free(struct ctrl_msg *m);
/* The longest STEP (header included) a runner of these limits accepts. */
size_t ctrl_msg_step_max(const struct ctrl_limits *lim);

/* 1 when s may be a LOAD name (load format, quantization): at most
 * CTRL_MSG_NAME_MAX - 1 printable bytes, no space. */
int ctrl_msg_name_ok(const char *s);

/* Encoders append one whole message to out (values are the caller's own:
 * out-of-range ones are asserted). */
void ctrl_msg_load(struct buf *out, uint32_t seq, const struct ctrl_load *l);
void ctrl_msg_step(struct buf *out, uint32_t seq, int flags, int scratch_page, const struct batch *b,
                   const unsigned char *want_logits);
void ctrl_msg_stop(struct buf *out, uint32_t seq);
void ctrl_msg_end(struct buf *out, uint32_t seq);

#endif
