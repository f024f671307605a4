/* fuzz_ctrl_msg.c — arbitrary bytes as a lockstep message
 * (runner/ctrl_msg.h) for a small runner: parsed or refused, never read
 * past its end, a parsed STEP always a batch the runner may run, and a
 * parsed message encodes back to exactly the same bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "runner/ctrl_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The limits the seeds in tests/fuzz/corpus/fuzz_ctrl_msg/ are made for:
 * a runner with one KV pool, and one with a hybrid pool (sliding pages). */
static const struct ctrl_limits lims[2] = {
    {.max_tokens = 64, .max_seqs = 8, .max_pages = 64, .vocab = 512, .max_context = 256, .page_size = 4,
     .pool_pages = 32, .dp_groups = 2},
    {.max_tokens = 64, .max_seqs = 8, .max_pages = 64, .vocab = 512, .max_context = 256, .page_size = 4,
     .pool_pages = 32, .swa_pages = 12, .dp_groups = 2}};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct kiln_error err;
    if (size >= CTRL_MSG_HEADER) {
        enum ctrl_msg_type t = CTRL_MSG_STOP;
        uint32_t seq = 0;
        long body = ctrl_msg_header(data, &t, &seq, &err);
        KILN_ASSERT(body >= -1);
    }
    struct ctrl_msg m = {0};
    const struct ctrl_limits *lp = &lims[0];
    if (ctrl_msg_parse(data, size, lp, &m, &err) && ctrl_msg_parse(data, size, lp = &lims[1], &m, &err)) {
        ctrl_msg_free(&m);
        return 0;
    }
    const struct ctrl_limits lim = *lp;
    struct buf b = {0};
    switch (m.type) {
    case CTRL_MSG_LOAD: ctrl_msg_load(&b, m.seq, &m.load); break;
    case CTRL_MSG_STEP: {
        const struct batch *s = &m.b;
        /* what the runner relies on */
        KILN_ASSERT(size <= ctrl_msg_step_max(&lim));
        KILN_ASSERT(s->n_tokens >= 1 && s->n_tokens <= lim.max_tokens && s->n_seqs <= lim.max_seqs);
        for (int i = 0; i < s->n_tokens; i++)
            KILN_ASSERT(s->out_slot[i] >= 0 && s->out_slot[i] < lim.pool_pages * lim.page_size);
        KILN_ASSERT(!s->swa_out_slot == !lim.swa_pages && !s->swa_kv_pages == !lim.swa_pages);
        for (int i = 0; s->swa_out_slot && i < s->n_tokens; i++)
            KILN_ASSERT(s->swa_out_slot[i] >= 0 && s->swa_out_slot[i] < lim.swa_pages * lim.page_size);
        for (int i = 0; s->swa_kv_pages && i < s->kv_page_start[s->n_seqs]; i++)
            KILN_ASSERT(s->swa_kv_pages[i] >= 0 && s->swa_kv_pages[i] < lim.swa_pages);
        KILN_ASSERT(s->q_start[s->n_seqs] == s->n_tokens);
        ctrl_msg_step(&b, m.seq, m.flags, m.scratch_page, s, m.want_logits);
        break;
    }
    case CTRL_MSG_STOP: ctrl_msg_stop(&b, m.seq); break;
    case CTRL_MSG_END: ctrl_msg_end(&b, m.seq); break;
    }
    KILN_ASSERT(b.len == size && memcmp(b.data, data, size) == 0);
    buf_free(&b);
    ctrl_msg_free(&m);
    return 0;
}
