/* mem_plan.c — the memory plan's arithmetic (mem_plan.h). */
#include "runner/mem_plan.h"

#include <math.h>

#include "base/error.h"
#include "tensor/backend.h"

#define GIB(x) ((double)(x) / 1073741824.0)

void mem_plan_runner_layout(long T, long S, long max_context, int page_size, int device_sampling, int hybrid,
                            struct mem_plan_runner *l) {
    /* Logits are downloaded 64 rows at a time; a backend that samples on
     * the device keeps a whole decode batch's rows (one lm_head product). */
    long chunk = device_sampling && S > 64 ? S : 64;
    l->logit_chunk = T < chunk ? T : chunk;
    l->pages_cap = S * (max_context / (page_size > 0 ? page_size : 1) + 2);
    /* batch metadata: [ids|pos|slot|rows: T each][q_start|page_start: S+1 each]
     * [sampling row parameters: S, 8-byte aligned][pages] */
    long srow_ints = (long)(sizeof(struct backend_sample_row) / 4);
    l->stage_srows_off = (4 * T + 2 * (S + 1) + 1) & ~1L;
    l->stage_pages_off = l->stage_srows_off + (device_sampling ? S * srow_ints : 0);
    l->stage_swa_off = l->stage_pages_off + l->pages_cap;
    /* a hybrid KV pool's sliding slots [T] and pages [pages_cap] */
    l->stage_ints = l->stage_swa_off + (hybrid ? T + l->pages_cap : 0);
    l->adj_cap = device_sampling ? (int)(S * 512 > 8192 ? S * 512 : 8192) : 0;
}

size_t mem_plan_runner_bytes(long T, long S, long max_context, int page_size, long vocab,
                             int device_sampling, int hybrid) {
    struct mem_plan_runner l;
    mem_plan_runner_layout(T, S, max_context, page_size, device_sampling, hybrid, &l);
    size_t b = (size_t)l.logit_chunk * (size_t)vocab * 4 + (size_t)l.stage_ints * 4;
    if (device_sampling)
        b += (size_t)l.adj_cap * sizeof(struct backend_sample_adj) + (size_t)S * 4 +
             (size_t)S * (size_t)((vocab + 31) / 32) * 4; /* grammar masks */
    return b;
}

long mem_plan_window_tokens(int window, int page_size) {
    long ps = page_size > 0 ? page_size : 1;
    return 2 * (long)window + 2 * ps;
}

double mem_plan_swa_ratio(double ratio) { return ratio > 0 ? ratio : 0.8; }

long mem_plan_swa_tokens(long tokens, double ratio, int window, int page_size, long max_batch_tokens) {
    long ps = page_size > 0 ? page_size : 1;
    long least = mem_plan_window_tokens(window, page_size) + max_batch_tokens;
    long want = (long)ceil(mem_plan_swa_ratio(ratio) * (double)tokens);
    if (want < least) want = least;
    long cap = (tokens + ps - 1) / ps * ps;
    want = (want + ps - 1) / ps * ps;
    return want < cap ? want : cap;
}

int mem_plan_compute(const struct mem_plan_in *in, struct mem_plan *p, struct kiln_error *err) {
    *p = (struct mem_plan){.weights = in->weights};
    p->fraction = in->mem_fraction_static > 0 ? in->mem_fraction_static : 0.88;
    p->counted = in->activations + in->runner + in->workspace + MEM_PLAN_HEADROOM;
    long seqs = in->max_running_requests > 0 ? in->max_running_requests : 1;
    long chunk = in->chunked_prefill_size > 0 ? in->chunked_prefill_size : in->max_context;
    long most = in->max_context * seqs;
    if (in->window > 0) {
        long per_seq = mem_plan_window_tokens(in->window, in->page_size);
        if (per_seq < in->max_context) most = per_seq * seqs + chunk;
    }
    p->need_tokens = (chunk < in->max_context ? chunk : in->max_context) + 1;
    size_t per = in->kv_token_bytes ? in->kv_token_bytes : 1;
    if (in->kv_tokens > 0) {
        p->kv_tokens = in->kv_tokens;
        p->kv_bytes = (size_t)in->kv_tokens * per;
        return 0;
    }
    if (!in->device_total) {
        long tokens = (long)(((size_t)2 << 30) / per);
        p->kv_tokens = tokens < most ? tokens : most;
        p->kv_bytes = (size_t)p->kv_tokens * per;
        return 0;
    }
    double keep = (1.0 - p->fraction) * (double)in->device_total;
    p->reserve = keep > (double)p->counted ? (size_t)keep : p->counted;
    double kv = (double)in->device_free - (double)in->weights - (double)p->reserve;
    if (kv < (double)p->need_tokens * (double)per)
        return kiln_errorf(err,
                           "not enough device memory for the KV cache: the device has %.2f GiB, "
                           "weights take %.2f GiB and activations, scratch and headroom %.2f GiB, "
                           "%.2f GiB were free before loading; --mem-fraction-static %.2f keeps "
                           "%.2f GiB back, leaving %.2f GiB where at least %.3f GiB (%ld tokens of "
                           "%zu bytes) are needed; raise --mem-fraction-static, lower "
                           "--chunked-prefill-size / --max-running-requests, or use a larger device",
                           GIB(in->device_total), GIB(in->weights), GIB(p->counted),
                           GIB(in->device_free), p->fraction, GIB(p->reserve), GIB(kv > 0 ? kv : 0),
                           GIB((double)p->need_tokens * (double)per), p->need_tokens, per);
    long tokens = (long)(kv / (double)per);
    p->kv_tokens = tokens < most ? tokens : most;
    p->kv_bytes = (size_t)p->kv_tokens * per;
    return 0;
}
