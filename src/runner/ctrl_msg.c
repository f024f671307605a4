/* ctrl_msg.c — the lockstep messages' bytes (ctrl_msg.h). */
#include "runner/ctrl_msg.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"

#define STEP_FIXED 28 /* mode, flags, reserved, page size, scratch page, four counts */
#define LOAD_FIXED 64 /* the LOAD body before its two names */

static void put_i32s(struct buf *b, const int32_t *v, size_t n) {
    uint8_t *p = (uint8_t *)buf_grow(b, n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)v[i];
        p[4 * i] = (uint8_t)x, p[4 * i + 1] = (uint8_t)(x >> 8), p[4 * i + 2] = (uint8_t)(x >> 16),
        p[4 * i + 3] = (uint8_t)(x >> 24);
    }
}
static void get_i32s(int32_t *dst, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (int32_t)le_get32(p + 4 * i);
}

static size_t begin(struct buf *b, enum ctrl_msg_type type, uint32_t seq) {
    buf_put_le32(b, CTRL_MSG_MAGIC);
    buf_put_le16(b, CTRL_MSG_VERSION);
    buf_put_le16(b, (uint32_t)type);
    size_t at = b->len;
    buf_put_le32(b, 0);
    buf_put_le32(b, seq);
    return at;
}
static void end(struct buf *b, size_t at) {
    size_t body = b->len - at - 8;
    KILN_ASSERT(body <= UINT32_MAX);
    uint8_t *p = (uint8_t *)b->data + at;
    p[0] = (uint8_t)body, p[1] = (uint8_t)(body >> 8), p[2] = (uint8_t)(body >> 16), p[3] = (uint8_t)(body >> 24);
}

static int name_ok(const char *s, size_t n) {
    if (n >= CTRL_MSG_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e) return 0;
    return 1;
}
int ctrl_msg_name_ok(const char *s) { return strlen(s) < CTRL_MSG_NAME_MAX && name_ok(s, strlen(s)); }

static void put_name(struct buf *b, const char *s) {
    size_t n = strlen(s);
    KILN_ASSERT(name_ok(s, n));
    buf_put_le16(b, (uint32_t)n);
    buf_append(b, s, n);
}

void ctrl_msg_load(struct buf *out, uint32_t seq, const struct ctrl_load *l) {
    KILN_ASSERT(l->max_batch_tokens >= 0 && l->max_seqs >= 0 && l->max_context >= 0 && l->page_size >= 0 &&
                l->page_size <= (1 << 20) && l->kv_tokens >= 0 && l->kv_tokens <= (1L << 40) &&
                l->max_running_requests >= 0 && l->chunked_prefill_size >= 0 && l->dummy_routing >= 0 &&
                l->dummy_routing <= 1 && l->mem_fraction_static >= 0 && l->mem_fraction_static <= 1 &&
                l->swa_full_tokens_ratio >= 0 && l->swa_full_tokens_ratio <= 1);
    size_t at = begin(out, CTRL_MSG_LOAD, seq);
    buf_put_le32(out, (uint32_t)l->max_batch_tokens);
    buf_put_le32(out, (uint32_t)l->max_seqs);
    buf_put_le32(out, (uint32_t)l->max_context);
    buf_put_le64(out, l->seed);
    buf_put_le32(out, (uint32_t)(l->no_shared_expert_fusion | l->moe_count << 1 | l->no_graphs << 2 | l->skip_warmup << 3 |
                                 l->disable_hybrid_swa << 4));
    buf_put_le32(out, (uint32_t)l->dummy_routing);
    buf_put_le32(out, (uint32_t)l->page_size);
    buf_put_le64(out, (uint64_t)l->kv_tokens);
    uint64_t f;
    memcpy(&f, &l->mem_fraction_static, 8);
    buf_put_le64(out, f);
    buf_put_le32(out, (uint32_t)l->max_running_requests);
    buf_put_le32(out, (uint32_t)l->chunked_prefill_size);
    memcpy(&f, &l->swa_full_tokens_ratio, 8);
    buf_put_le64(out, f);
    put_name(out, l->load_format);
    put_name(out, l->quantization);
    end(out, at);
    KILN_ASSERT(out->len - (at - 8) <= CTRL_MSG_FRAME);
}

void ctrl_msg_step(struct buf *out, uint32_t seq, int flags, int scratch_page, const struct batch *b,
                   const unsigned char *want_logits) {
    KILN_ASSERT((flags & ~31) == 0 && !!want_logits == !!(flags & CTRL_STEP_WANT) && !b->swa_out_slot == !b->swa_kv_pages);
    flags = (flags & ~(CTRL_STEP_GROUPS | CTRL_STEP_SWA)) | (b->seq_group ? CTRL_STEP_GROUPS : 0) |
            (b->swa_out_slot ? CTRL_STEP_SWA : 0);
    int T = b->n_tokens, S = b->n_seqs, P = b->kv_page_start[b->n_seqs], L = b->n_logit_rows;
    size_t at = begin(out, CTRL_MSG_STEP, seq);
    buf_reserve(out, STEP_FIXED + 4 * ((size_t)4 * T + 4 * (size_t)S + 2 + (size_t)2 * P + (size_t)L) + (size_t)L);
    uint8_t head[4] = {(uint8_t)b->mode, (uint8_t)flags, 0, 0};
    buf_append(out, head, 4);
    buf_put_le32(out, (uint32_t)b->page_size);
    buf_put_le32(out, (uint32_t)scratch_page);
    buf_put_le32(out, (uint32_t)T);
    buf_put_le32(out, (uint32_t)S);
    buf_put_le32(out, (uint32_t)P);
    buf_put_le32(out, (uint32_t)L);
    put_i32s(out, b->input_ids, (size_t)T);
    put_i32s(out, b->positions, (size_t)T);
    put_i32s(out, b->out_slot, (size_t)T);
    put_i32s(out, b->q_start, (size_t)S + 1);
    put_i32s(out, b->kv_len, (size_t)S);
    put_i32s(out, b->kv_page_start, (size_t)S + 1);
    put_i32s(out, b->kv_pages, (size_t)P);
    put_i32s(out, b->logit_rows, (size_t)L);
    if (b->seq_group) put_i32s(out, b->seq_group, (size_t)S);
    if (b->swa_out_slot) {
        put_i32s(out, b->swa_out_slot, (size_t)T);
        put_i32s(out, b->swa_kv_pages, (size_t)P);
    }
    if (want_logits)
        for (int j = 0; j < L; j++) buf_push(out, (char)(want_logits[j] ? 1 : 0));
    end(out, at);
}

void ctrl_msg_stop(struct buf *out, uint32_t seq) { end(out, begin(out, CTRL_MSG_STOP, seq)); }
void ctrl_msg_end(struct buf *out, uint32_t seq) { end(out, begin(out, CTRL_MSG_END, seq)); }

long ctrl_msg_header(const uint8_t *hdr, enum ctrl_msg_type *type, uint32_t *seq, struct kiln_error *err) {
    if (le_get32(hdr) != CTRL_MSG_MAGIC) return kiln_errorf(err, "not a lockstep message (bad magic)");
    if (le_get16(hdr + 4) != CTRL_MSG_VERSION)
        return kiln_errorf(err, "lockstep message version %u; this kiln speaks %d (mixed builds?)", le_get16(hdr + 4),
                           CTRL_MSG_VERSION);
    uint32_t t = le_get16(hdr + 6);
    if (t < CTRL_MSG_LOAD || t > CTRL_MSG_END) return kiln_errorf(err, "unknown lockstep message type %u", t);
    uint32_t body = le_get32(hdr + 8);
    if (t != CTRL_MSG_STEP && body > CTRL_MSG_FRAME - CTRL_MSG_HEADER)
        return kiln_errorf(err, "lockstep message of type %u has a body of %u bytes, more than %d", t, body,
                           CTRL_MSG_FRAME - CTRL_MSG_HEADER);
    *type = (enum ctrl_msg_type)t;
    *seq = le_get32(hdr + 12);
    return (long)body;
}

static int parse_name(const uint8_t **p, const uint8_t *e, char *out, struct kiln_error *err) {
    if (e - *p < 2) return kiln_errorf(err, "LOAD: truncated");
    size_t n = le_get16(*p);
    *p += 2;
    if ((size_t)(e - *p) < n) return kiln_errorf(err, "LOAD: truncated");
    if (!name_ok((const char *)*p, n)) return kiln_errorf(err, "LOAD: a name is not 0..%d printable bytes", CTRL_MSG_NAME_MAX - 1);
    memcpy(out, *p, n);
    out[n] = 0;
    *p += n;
    return 0;
}

static int parse_load(const uint8_t *p, size_t n, struct ctrl_load *l, struct kiln_error *err) {
    if (n < LOAD_FIXED + 4) return kiln_errorf(err, "LOAD: %zu bytes, fewer than %d", n, LOAD_FIXED + 4);
    memset(l, 0, sizeof *l);
    uint32_t mbt = le_get32(p), ms = le_get32(p + 4), mc = le_get32(p + 8);
    l->seed = le_get64(p + 12);
    uint32_t flags = le_get32(p + 20), routing = le_get32(p + 24), ps = le_get32(p + 28);
    uint64_t kv = le_get64(p + 32), fbits = le_get64(p + 40);
    uint32_t mrr = le_get32(p + 48), cps = le_get32(p + 52);
    uint64_t rbits = le_get64(p + 56);
    const uint32_t big = INT32_MAX;
    if (mbt > big || ms > big || mc > big || mrr > big || cps > big)
        return kiln_errorf(err, "LOAD: a batch or context size above %u", big);
    if (flags & ~31u) return kiln_errorf(err, "LOAD: unknown flags 0x%x", flags);
    if (routing > 1) return kiln_errorf(err, "LOAD: unknown routing %u", routing);
    if (ps > (1u << 20)) return kiln_errorf(err, "LOAD: page size %u", ps);
    if (kv > ((uint64_t)1 << 40)) return kiln_errorf(err, "LOAD: a KV pool of %llu tokens", (unsigned long long)kv);
    double f;
    memcpy(&f, &fbits, 8);
    if (!(f >= 0 && f <= 1)) return kiln_errorf(err, "LOAD: memory fraction not in 0..1");
    double ratio;
    memcpy(&ratio, &rbits, 8);
    if (!(ratio >= 0 && ratio <= 1)) return kiln_errorf(err, "LOAD: SWA to full tokens ratio not in 0..1");
    l->swa_full_tokens_ratio = ratio;
    l->disable_hybrid_swa = flags >> 4 & 1;
    l->max_batch_tokens = (int)mbt, l->max_seqs = (int)ms, l->max_context = (int)mc;
    l->no_shared_expert_fusion = flags & 1, l->moe_count = flags >> 1 & 1, l->no_graphs = flags >> 2 & 1,
    l->skip_warmup = flags >> 3 & 1;
    l->dummy_routing = (int)routing, l->page_size = (int)ps, l->kv_tokens = (long)kv;
    l->mem_fraction_static = f;
    l->max_running_requests = (int)mrr, l->chunked_prefill_size = (int)cps;
    const uint8_t *q = p + LOAD_FIXED;
    if (parse_name(&q, p + n, l->load_format, err) || parse_name(&q, p + n, l->quantization, err)) return -1;
    if (q != p + n) return kiln_errorf(err, "LOAD: %zu bytes after the names", (size_t)(p + n - q));
    return 0;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    *cap = need;
    return xrealloc(p, need * elem);
}

/* The batch's arrays against each other and lim. */
static int check_step(const struct ctrl_msg *m, const struct ctrl_limits *lim, struct kiln_error *err) {
    const struct batch *b = &m->b;
    int T = b->n_tokens, S = b->n_seqs, P = b->kv_page_start[S], L = b->n_logit_rows;
    long slots = (long)lim->pool_pages * lim->page_size;
    if (b->q_start[0] != 0 || b->kv_page_start[0] != 0 || b->q_start[S] != T)
        return kiln_errorf(err, "STEP: q_start / kv_page_start must start at 0 and q_start end at %d", T);
    for (int s = 0; s < S; s++) {
        int q0 = b->q_start[s], q1 = b->q_start[s + 1], p0 = b->kv_page_start[s], p1 = b->kv_page_start[s + 1];
        if (q1 < q0 || p1 < p0) return kiln_errorf(err, "STEP: sequence %d: q_start or kv_page_start decreases", s);
        if (b->mode == BATCH_MODE_DECODE && q1 - q0 != 1)
            return kiln_errorf(err, "STEP: DECODE sequence %d has %d tokens", s, q1 - q0);
        long kl = b->kv_len[s];
        if (kl < q1 - q0 || kl > lim->max_context || kl > (long)(p1 - p0) * lim->page_size)
            return kiln_errorf(err, "STEP: sequence %d: KV length %ld outside %d..min(context %d, %d pages)", s, kl,
                               q1 - q0, lim->max_context, p1 - p0);
        for (int t = q0; t < q1; t++)
            if (b->positions[t] < 0 || b->positions[t] >= kl)
                return kiln_errorf(err, "STEP: token %d: position %d outside its sequence's 0..%ld", t,
                                   b->positions[t], kl - 1);
    }
    if (b->kv_page_start[S] != P) return kiln_errorf(err, "STEP: kv_page_start ends at %d, not %d", b->kv_page_start[S], P);
    for (int t = 0; t < T; t++) {
        if (b->input_ids[t] < 0 || b->input_ids[t] >= lim->vocab)
            return kiln_errorf(err, "STEP: token %d: id %d outside the vocabulary of %ld", t, b->input_ids[t], lim->vocab);
        if (b->out_slot[t] < 0 || b->out_slot[t] >= slots)
            return kiln_errorf(err, "STEP: token %d: KV slot %d outside 0..%ld", t, b->out_slot[t], slots - 1);
    }
    for (int i = 0; i < P; i++)
        if (b->kv_pages[i] < 0 || b->kv_pages[i] >= lim->pool_pages)
            return kiln_errorf(err, "STEP: KV page %d outside the pool's %d", b->kv_pages[i], lim->pool_pages);
    int want = 0;
    for (int j = 0; j < L; j++) {
        if (b->logit_rows[j] < 0 || b->logit_rows[j] >= T)
            return kiln_errorf(err, "STEP: logit row %d outside 0..%d", b->logit_rows[j], T - 1);
        if (m->want_logits && m->want_logits[j] > 1) return kiln_errorf(err, "STEP: want_logits %d is not 0 or 1", m->want_logits[j]);
        want += m->want_logits ? m->want_logits[j] : 0;
    }
    for (int s = 0; b->seq_group && s < S; s++)
        if (b->seq_group[s] < 0 || b->seq_group[s] >= lim->dp_groups)
            return kiln_errorf(err, "STEP: sequence %d: DP attention group %d outside 0..%d", s, b->seq_group[s],
                               lim->dp_groups - 1);
    long swa_slots = (long)lim->swa_pages * lim->page_size;
    for (int t = 0; b->swa_out_slot && t < T; t++)
        if (b->swa_out_slot[t] < 0 || b->swa_out_slot[t] >= swa_slots)
            return kiln_errorf(err, "STEP: token %d: sliding KV slot %d outside 0..%ld", t, b->swa_out_slot[t], swa_slots - 1);
    for (int i = 0; b->swa_kv_pages && i < P; i++)
        if (b->swa_kv_pages[i] < 0 || b->swa_kv_pages[i] >= lim->swa_pages)
            return kiln_errorf(err, "STEP: sliding KV page %d outside the pool's %d", b->swa_kv_pages[i], lim->swa_pages);
    if ((m->flags & CTRL_STEP_SAMPLE) && L - want > lim->max_seqs)
        return kiln_errorf(err, "STEP: %d rows to sample, more than %d", L - want, lim->max_seqs);
    return 0;
}

static int parse_step(const uint8_t *p, size_t n, const struct ctrl_limits *lim, struct ctrl_msg *m,
                      struct kiln_error *err) {
    if (!lim) return kiln_errorf(err, "a STEP before the runner exists");
    if (n < STEP_FIXED) return kiln_errorf(err, "STEP: %zu bytes, fewer than %d", n, STEP_FIXED);
    int mode = p[0], flags = p[1];
    if (mode != BATCH_MODE_EXTEND && mode != BATCH_MODE_DECODE) return kiln_errorf(err, "STEP: mode %d", mode);
    if ((flags & ~31) || p[2] || p[3] || ((flags & (CTRL_STEP_MASKED | CTRL_STEP_WANT)) && !(flags & CTRL_STEP_SAMPLE)))
        return kiln_errorf(err, "STEP: flags 0x%x / reserved bytes", flags);
    if (!(flags & CTRL_STEP_SWA) != !(lim->swa_pages > 0))
        return kiln_errorf(err, "STEP: %s sliding pages, but the runner's KV pool is %s", flags & CTRL_STEP_SWA ? "with" : "without",
                           lim->swa_pages > 0 ? "hybrid" : "not hybrid");
    if ((flags & CTRL_STEP_GROUPS) && lim->dp_groups <= 1)
        return kiln_errorf(err, "STEP: DP attention groups, but the runner has no DP attention");
    int32_t ps = (int32_t)le_get32(p + 4), scratch = (int32_t)le_get32(p + 8);
    uint32_t T = le_get32(p + 12), S = le_get32(p + 16), P = le_get32(p + 20), L = le_get32(p + 24);
    if (ps != lim->page_size) return kiln_errorf(err, "STEP: page size %d, the pool's is %d", ps, lim->page_size);
    if (scratch < -1 || scratch >= lim->pool_pages) return kiln_errorf(err, "STEP: scratch page %d", scratch);
    if (T < 1 || T > (uint32_t)lim->max_tokens || S < 1 || S > (uint32_t)lim->max_seqs || P > (uint64_t)lim->max_pages ||
        L > (uint32_t)lim->max_tokens)
        return kiln_errorf(err, "STEP: %u tokens, %u sequences, %u pages, %u logit rows: beyond %d, %d, %ld, %d", T, S,
                           P, L, lim->max_tokens, lim->max_seqs, lim->max_pages, lim->max_tokens);
    size_t ints = 3 * (size_t)T + 3 * (size_t)S + 2 + P + L + ((flags & CTRL_STEP_GROUPS) ? S : 0) +
                  ((flags & CTRL_STEP_SWA) ? (size_t)T + P : 0);
    size_t want = (flags & CTRL_STEP_WANT) ? L : 0;
    if (n != STEP_FIXED + 4 * ints + want)
        return kiln_errorf(err, "STEP: %zu bytes, its counts make %zu", n, STEP_FIXED + 4 * ints + want);
    m->i32 = grow(m->i32, &m->i32_cap, ints, 4);
    m->u8 = grow(m->u8, &m->u8_cap, want ? want : 1, 1);
    get_i32s(m->i32, p + STEP_FIXED, ints);
    int32_t *ids = m->i32, *pos = ids + T, *slot = pos + T, *qs = slot + T, *kvl = qs + S + 1, *pst = kvl + S,
            *pages = pst + S + 1, *rows = pages + P;
    if (want) memcpy(m->u8, p + STEP_FIXED + 4 * ints, want);
    m->flags = flags, m->scratch_page = scratch;
    m->want_logits = (flags & CTRL_STEP_WANT) ? m->u8 : NULL; /* the flag, even over zero rows */
    m->b = (struct batch){.mode = (enum batch_mode)mode, .n_tokens = (int)T, .input_ids = ids, .positions = pos,
                          .out_slot = slot, .n_seqs = (int)S, .q_start = qs, .kv_len = kvl, .kv_page_start = pst,
                          .kv_pages = pages, .page_size = ps, .n_logit_rows = (int)L, .logit_rows = rows,
                          .seq_group = (flags & CTRL_STEP_GROUPS) ? rows + L : NULL};
    if (flags & CTRL_STEP_SWA) {
        int32_t *sw = rows + L + ((flags & CTRL_STEP_GROUPS) ? S : 0);
        m->b.swa_out_slot = sw;
        m->b.swa_kv_pages = sw + T;
    }
    if ((long)pst[S] != (long)P) return kiln_errorf(err, "STEP: kv_page_start ends at %d, not %u", pst[S], P);
    return check_step(m, lim, err);
}

int ctrl_msg_parse(const uint8_t *data, size_t len, const struct ctrl_limits *lim, struct ctrl_msg *m,
                   struct kiln_error *err) {
    if (len < CTRL_MSG_HEADER) return kiln_errorf(err, "a lockstep message of %zu bytes, shorter than its header", len);
    enum ctrl_msg_type type = CTRL_MSG_STOP;
    uint32_t seq = 0;
    long body = ctrl_msg_header(data, &type, &seq, err);
    if (body < 0) return -1;
    if ((size_t)body != len - CTRL_MSG_HEADER)
        return kiln_errorf(err, "lockstep message: the header says %ld body bytes, %zu came", body,
                           len - CTRL_MSG_HEADER);
    m->type = type;
    m->seq = seq;
    m->want_logits = NULL;
    const uint8_t *p = data + CTRL_MSG_HEADER;
    switch (type) {
    case CTRL_MSG_LOAD: return parse_load(p, (size_t)body, &m->load, err);
    case CTRL_MSG_STEP: return parse_step(p, (size_t)body, lim, m, err);
    case CTRL_MSG_STOP:
    case CTRL_MSG_END:
        if (body) return kiln_errorf(err, "STOP / END with a body of %ld bytes", body);
        return 0;
    }
    return kiln_errorf(err, "unknown lockstep message");
}

size_t ctrl_msg_step_max(const struct ctrl_limits *lim) {
    size_t T = (size_t)lim->max_tokens, S = (size_t)lim->max_seqs, P = (size_t)lim->max_pages;
    size_t swa = lim->swa_pages > 0 ? T + P : 0;
    return CTRL_MSG_HEADER + STEP_FIXED + 4 * (4 * T + 4 * S + 2 + P + swa) + T;
}

void ctrl_msg_free(struct ctrl_msg *m) {
    free(m->i32);
    free(m->u8);
    memset(m, 0, sizeof *m);
}
