/* bench_forward.c — forward-pass speed: prefill of P tokens per sequence,
 * then D decode steps of N sequences decoding together (each with its own
 * KV pages), on any backend. Prints tokens/s, and for decode the bytes
 * read per step (weights once, plus every sequence's cached K/V) per
 * second beside the device's copy bandwidth (GPU) or the memory read
 * bandwidth with the same thread count (CPU) measured in the same run (the
 * roofline for decode is memory bandwidth), and for dense models the
 * prefill's TFLOP/s. --prompt-len takes a list (512,2048,8192): one load,
 * each length in turn; --batch N decodes N sequences together.
 *
 * Decode steps end the way a serving step does: on a backend that samples
 * on the device (CUDA), every row is sampled greedily there and only the
 * token ids come back (runner_forward_sample); --logits downloads every
 * row's logits instead (runner_forward, what a step cost before device
 * sampling). The line "sampling:" says which ran; --both times both in the
 * same run (device sampling first, then the logits download, after each
 * prefill), one decode line each. --prefill-batch prefills the N sequences
 * in one forward (as llama-batched-bench's prompt phase and the engine's
 * chunked prefill do) instead of one after the other.
 *
 * MoE models: after the timed runs of each prompt length, one untimed run
 * of the same prefill and decode steps counts the experts every MoE layer
 * touched per step (on the device, graphs replayed as in the timed runs;
 * the timed runs leave counting off) and prints them with the bytes they
 * hold, and the decode step's bound: the bytes it must read (weights but
 * the routed experts and an untied embedding table, plus the experts
 * touched, plus the K/V) at the copy / read bandwidth. --dummy-routing
 * uniform routes every token to uniformly random experts (dummy weights'
 * routers send most tokens to the same few), so that the figures reflect
 * real traffic.
 *
 *   bench_forward --model DIR|config.json [--load-format dummy] [--prompt-len 128]
 *                 [--decode 32] [--batch 1] [--threads N] [--device cpu] [--repeat 3]
 *                 [--no-graphs] [--logits] [--both] [--prefill-batch]
 *                 [--dummy-routing model|uniform] [--quantization fp8]
 *                 [--kv-cache-dtype auto|fp8_e4m3]
 *
 * --quantization fp8 times FP8 weights (model_options.quantization);
 * --kv-cache-dtype fp8_e4m3 an FP8 KV cache (backend_options.kv_fp8).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "bench_util.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"

struct seqs {
    int n, ctx;
    int32_t *pages;      /* [n][ctx]: sequence s owns pages[s*ctx ..] (page size 1) */
    int32_t *page_start; /* [n + 1] */
};

/* Prefill of sequence s: tokens 0..n-1 */
static int prefill(struct runner *run, const struct seqs *q, int s,
                   const int32_t *ids, int n, float *logits, struct kiln_error *err) {
    int32_t *pos = xmalloc((size_t)n * 4), *slot = xmalloc((size_t)n * 4);
    const int32_t *pg = q->pages + (size_t)s * q->ctx;
    for (int i = 0; i < n; i++) pos[i] = i, slot[i] = pg[i];
    int32_t q_start[2] = {0, n}, kv_len = n, page_start[2] = {0, q->ctx}, row = n - 1;
    struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = n, .input_ids = ids,
                      .positions = pos, .out_slot = slot, .n_seqs = 1, .q_start = q_start,
                      .kv_len = &kv_len, .kv_page_start = page_start, .kv_pages = pg,
                      .page_size = 1, .n_logit_rows = 1, .logit_rows = &row};
    int rc = runner_forward(run, &b, logits, err);
    free(pos);
    free(slot);
    return rc;
}

/* Prefill of every sequence in one batch (as llama-batched-bench's prompt
 * phase, and as the engine's chunked prefill takes short prompts): tokens
 * 0..n-1 of each, one logit row per sequence. */
static int prefill_all(struct runner *run, const struct seqs *q,
                       const int32_t *ids, int n, float *logits, struct kiln_error *err) {
    int S = q->n;
    long T = (long)S * n;
    int32_t *pos = xmalloc((size_t)T * 4), *slot = xmalloc((size_t)T * 4),
            *tok = xmalloc((size_t)T * 4), *q_start = xmalloc((size_t)(S + 1) * 4),
            *kv_len = xmalloc((size_t)S * 4), *rows = xmalloc((size_t)S * 4);
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < n; i++) {
            long t = (long)s * n + i;
            pos[t] = i;
            slot[t] = q->pages[(size_t)s * q->ctx + i];
            tok[t] = ids[s % 7 + i]; /* the sequential prefill's ids */
        }
        q_start[s] = s * n;
        kv_len[s] = n;
        rows[s] = s * n + n - 1;
    }
    q_start[S] = (int32_t)T;
    struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = (int)T, .input_ids = tok,
                      .positions = pos, .out_slot = slot, .n_seqs = S, .q_start = q_start,
                      .kv_len = kv_len, .kv_page_start = q->page_start, .kv_pages = q->pages,
                      .page_size = 1, .n_logit_rows = S, .logit_rows = rows};
    int rc = runner_forward(run, &b, logits, err);
    free(pos);
    free(slot);
    free(tok);
    free(q_start);
    free(kv_len);
    free(rows);
    return rc;
}

/* One decode step of all sequences at position p; with smp, greedy on the
 * device (token ids to tokens). */
static int decode(struct runner *run, const struct seqs *q, const int32_t *ids,
                  int p, int32_t *scratch, float *logits, const struct runner_sampling *smp,
                  int32_t *tokens, struct kiln_error *err) {
    int n = q->n;
    int32_t *pos = scratch, *slot = pos + n, *q_start = slot + n, *kv_len = q_start + n + 1,
            *rows = kv_len + n;
    for (int s = 0; s < n; s++) {
        pos[s] = p;
        slot[s] = q->pages[(size_t)s * q->ctx + p];
        q_start[s] = s;
        kv_len[s] = p + 1;
        rows[s] = s;
    }
    q_start[n] = n;
    struct batch b = {.mode = BATCH_MODE_DECODE, .n_tokens = n, .input_ids = ids,
                      .positions = pos, .out_slot = slot, .n_seqs = n, .q_start = q_start,
                      .kv_len = kv_len, .kv_page_start = q->page_start, .kv_pages = q->pages,
                      .page_size = 1, .n_logit_rows = n, .logit_rows = rows};
    if (smp) return runner_forward_sample(run, &b, smp, tokens, logits, err);
    return runner_forward(run, &b, logits, err);
}

/* The untimed counting run of one prompt length: the timed runs' prefill
 * and decode steps again (the same graphs), with counting on. */
static int count_moe(struct runner *run, struct model *m, const struct seqs *q, const int32_t *ids, int pl,
                     int n_decode, int prefill_batch, int32_t *scratch, float *logits,
                     const struct runner_sampling *smp, int32_t *tokens, struct model_moe_totals *mt,
                     struct kiln_error *err) {
    int n_moe = model_moe_layers(m), rc = 0;
    model_moe_count_set(m, 1, 1);
    if (prefill_batch) {
        rc = prefill_all(run, q, ids, pl, logits, err);
    } else {
        for (int s = 0; !rc && s < q->n; s++) rc = prefill(run, q, s, ids + s % 7, pl, logits, err);
    }
    for (int i = 0; !rc && i < n_decode; i++)
        rc = decode(run, q, ids + pl + i % q->n, pl + i, scratch, logits, smp, tokens, err);
    model_moe_count_set(m, 0, 0);
    if (rc) return rc;
    struct model_moe_layer *mc = xcalloc((size_t)n_moe, sizeof *mc);
    model_moe_counts(m, mc, n_moe);
    *mt = model_moe_report(stdout, mc, n_moe);
    free(mc);
    return 0;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *format = "auto", *device = "cpu", *pp_list = "128", *quant = NULL, *kv_dtype = "auto";
    int prompt_len = 0, n_decode = 32, threads = 0, repeat = 3, batch = 1, no_graphs = 0;
    int deterministic = 0, pps[16], n_pp = 0, want_logits = 0, both = 0, prefill_batch = 0;
    const char *routing_name = "model";
    enum model_routing routing = MODEL_ROUTING_MODEL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--model")) model_dir = v, i++;
        else if (!strcmp(a, "--load-format")) format = v, i++;
        else if (!strcmp(a, "--quantization")) quant = v, i++;
        else if (!strcmp(a, "--kv-cache-dtype")) kv_dtype = v, i++;
        else if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--prompt-len")) pp_list = v, i++;
        else if (!strcmp(a, "--deterministic")) deterministic = 1;
        else if (!strcmp(a, "--decode")) n_decode = atoi(v), i++;
        else if (!strcmp(a, "--batch")) batch = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--repeat")) repeat = atoi(v), i++;
        else if (!strcmp(a, "--no-graphs")) no_graphs = 1;
        else if (!strcmp(a, "--logits")) want_logits = 1;
        else if (!strcmp(a, "--both")) both = 1;
        else if (!strcmp(a, "--prefill-batch")) prefill_batch = 1;
        else if (!strcmp(a, "--dummy-routing")) routing_name = v, i++;
        else {
            fprintf(stderr, "bench_forward: unknown option %s\n", a);
            return 2;
        }
    }
    /* --prompt-len takes a comma-separated list: one load, each length in turn */
    for (const char *p = pp_list; *p && n_pp < 16;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1 << 20 || (*end && *end != ',')) {
            n_pp = 0;
            break;
        }
        pps[n_pp++] = (int)x;
        if (x > prompt_len) prompt_len = (int)x;
        p = *end == ',' ? end + 1 : end;
    }
    if (model_routing_parse(routing_name, &routing)) {
        fprintf(stderr, "bench_forward: --dummy-routing '%s': expected model or uniform\n", routing_name);
        return 2;
    }
    if (!model_dir || n_pp == 0 || n_decode < 0 || repeat < 1 || batch < 1) {
        fprintf(stderr, "usage: bench_forward --model DIR|config.json [--load-format dummy] [--quantization fp8] "
                        "[--prompt-len N[,N...]] [--decode N] [--batch N] [--threads N] [--repeat N] "
                        "[--no-graphs] [--deterministic] [--logits] [--both] [--prefill-batch] "
                        "[--dummy-routing model|uniform] [--kv-cache-dtype auto|fp8_e4m3]\n");
        return 2;
    }
    struct kiln_error err = {0};
    struct backend be = {0};
    struct model *m = NULL;
    struct runner *run = NULL;
    struct seqs q = {0};
    int32_t *ids = NULL, *scratch = NULL, *tokens = NULL;
    float *logits = NULL;
    struct backend_sample_row *srows = NULL;
    int rc = 1;
    if (strcmp(kv_dtype, "auto") && strcmp(kv_dtype, "fp8_e4m3")) {
        fprintf(stderr, "bench_forward: --kv-cache-dtype %s: expected auto or fp8_e4m3\n", kv_dtype);
        return 2;
    }
    struct backend_options bo = {.n_threads = threads, .deterministic = deterministic,
                                 .kv_fp8 = !strcmp(kv_dtype, "fp8_e4m3")};
    if (backend_create(&be, device, &bo, &err)) goto fail;
    int ctx = prompt_len + n_decode + 1;
    struct model_options mo = {.load_format = format, .quantization = quant,
                               .max_batch_tokens = prefill_batch ? prompt_len * batch
                                                   : prompt_len > batch ? prompt_len : batch,
                               .max_seqs = batch, .max_context = ctx, .dummy_routing = routing,
                               .moe_count = 1};
    double t0 = time_now();
    if (model_load(&m, model_dir, &be, &mo, &err)) goto fail;
    double t_load = time_now() - t0;
    const struct model_config *c = model_config(m);
    struct kv_layer_layout layout[512];
    int nl = model_kv_layout(m, layout, 512);
    /* every sequence's pages, and one spare for the padding rows of graphs;
     * each with a sliding page too (a hybrid pool: they are all kept) */
    struct runner_options ro = {.page_size = 1, .kv_tokens = (long)batch * ctx + 1, .no_graphs = no_graphs,
                                .swa_full_tokens_ratio = 1};
    if (runner_create(&run, m, &ro, &err)) goto fail;
    struct kv_pool *kv = runner_kv(run);
    q = (struct seqs){.n = batch, .ctx = ctx, .pages = xmalloc((size_t)batch * ctx * 4),
                      .page_start = xmalloc((size_t)(batch + 1) * 4)};
    for (int s = 0; s < batch; s++) {
        if (kv_pool_alloc(kv, ctx, q.pages + (size_t)s * ctx)) {
            kiln_errorf(&err, "KV pool too small");
            goto fail;
        }
        q.page_start[s] = s * ctx;
    }
    q.page_start[batch] = batch * ctx;
    ids = xmalloc((size_t)(ctx + batch) * 4), scratch = xmalloc((size_t)(5 * batch + 1) * 4);
    for (int i = 0; i < ctx + batch; i++) ids[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    logits = xmalloc((size_t)batch * c->vocab_size * 4);
    /* greedy rows sampled on the device, when the backend can */
    tokens = xmalloc((size_t)batch * 4);
    srows = xcalloc((size_t)batch, sizeof *srows);
    struct runner_sampling smp_greedy = {.rows = srows};
    const struct runner_sampling *smp = !want_logits && runner_can_sample(run) ? &smp_greedy : NULL;
    int n_modes = both && smp ? 2 : 1;
    /* The backend's own copy is a fair ceiling for a GPU; on the CPU it is
     * one thread's memcpy, no limit for two threads streaming weights, so
     * the CPU figure is left out (bench_cpu_matmul measures its bandwidth). */
    double bw = be.ops->weights_in_place ? 0.0 : copy_bandwidth(&be);
    double host_bw = be.ops->weights_in_place ? host_read_bandwidth(threads) : 0.0;
    double gb = (double)model_weight_bytes(m) / 1e9;
    printf("model: %s (%s, %d layers, hidden %d, vocab %d), %.3f GB of weights, loaded in %.2f s\n",
           model_dir, model_arch_name(c->arch), c->n_layers, c->hidden_size, c->vocab_size, gb, t_load);
    printf("device: %s, threads: %d, batch: %d, graphs: %s, KV cache: %s, best of %d%s\n", device,
           threads, batch, no_graphs ? "off" : "on", dtype_name(kv->dtype), repeat,
           deterministic ? ", deterministic" : "");
    printf("sampling: %s\n", n_modes == 2 ? "both: greedy on the device (token ids downloaded), "
                                            "then every row's logits downloaded"
                             : smp ? "greedy on the device, token ids downloaded"
                                   : "logits of every row downloaded (host sampling)");
    int n_moe = model_moe_layers(m);
    if (n_moe) printf("MoE routing: %s\n", routing == MODEL_ROUTING_UNIFORM ? "uniform (--dummy-routing)" : "the model's router");
    if (bw > 0) printf("device copy bandwidth: %.1f GB/s (read + write)\n", bw / 1e9);
    if (host_bw > 0) printf("memory read bandwidth (%d threads): %.1f GB/s\n", threads, host_bw / 1e9);
    /* Dense models: FLOPs of a prefill token = 2 × (weights but the
     * embedding and the lm_head) + causal attention; the lm_head runs for
     * one row per sequence. */
    int dense = c->n_experts == 0 && c->kv_lora_rank == 0;
    size_t es = c->dtype == DTYPE_F32 ? 4 : 2;
    double params = (double)model_weight_bytes(m) / (double)es -
                    (c->tie_word_embeddings ? 1.0 : 2.0) * c->vocab_size * (double)c->hidden_size;
    for (int k = 0; k < n_pp; k++) {
        int pl = pps[k];
        /* K/V bytes a decode step reads per sequence, at the mean context
         * of the decode steps: every cached token of a layer, or its window */
        double kv_seq = 0;
        for (int l = 0; l < nl; l++) {
            double mean_ctx = (double)pl + (n_decode + 1) / 2.0;
            int win = model_config_layer_window(c, l);
            if (win > 0 && win < mean_ctx) mean_ctx = win;
            kv_seq += (double)dtype_size(kv->dtype) *
                      (double)(layout[l].k_width + (layout[l].v_in_k ? 0 : layout[l].v_width)) * mean_ctx;
        }
        double best_pp = 1e30, best_tg[2] = {1e30, 1e30};
        for (int r = 0; r < repeat; r++) {
            t0 = time_now();
            if (prefill_batch) {
                if (prefill_all(run, &q, ids, pl, logits, &err)) goto fail;
            } else {
                for (int s = 0; s < batch; s++)
                    if (prefill(run, &q, s, ids + s % 7, pl, logits, &err)) goto fail;
            }
            double t1 = time_now();
            if (t1 - t0 < best_pp) best_pp = t1 - t0;
            /* mode 0: as chosen; mode 1 (--both): the logits download too,
             * over the same positions (the decode rewrites the same K/V) */
            for (int mode = 0; mode < n_modes; mode++) {
                const struct runner_sampling *sm = mode ? NULL : smp;
                t1 = time_now();
                for (int i = 0; i < n_decode; i++)
                    if (decode(run, &q, ids + pl + i % batch, pl + i, scratch, logits, sm, tokens,
                               &err))
                        goto fail;
                double t2 = time_now();
                if (n_decode && t2 - t1 < best_tg[mode]) best_tg[mode] = t2 - t1;
            }
        }
        printf("prefill pp%d x %d%s: %.1f tok/s (%.1f ms)", pl, batch,
               prefill_batch && batch > 1 ? " in one batch" : "", (double)pl * batch / best_pp,
               best_pp * 1e3);
        if (dense) {
            double mm = batch * (2.0 * pl * params + 2.0 * c->vocab_size * (double)c->hidden_size);
            /* QKᵀ and PV: 4 · head_dim · heads FLOP per (query, key) pair a
             * layer computes, causal, a windowed layer's keys within its window */
            double pairs = 0;
            for (int l = 0; l < c->n_layers; l++) {
                double w = model_config_layer_window(c, l);
                pairs += w > 0 && w < pl ? w * (w + 1.0) / 2.0 + ((double)pl - w) * w : pl * (pl + 1.0) / 2.0;
            }
            double at = batch * 4.0 * c->head_dim * (double)c->n_heads * pairs;
            printf(", %.1f TFLOP/s (%.2f TFLOP: matmul %.2f + attention %.2f)",
                   (mm + at) / best_pp / 1e12, (mm + at) / 1e12, mm / 1e12, at / 1e12);
        }
        printf("\n");
        for (int mode = 0; n_decode && mode < n_modes; mode++) {
            /* bytes a decode step must read: the weights once, each sequence's K/V */
            double kv_gb = kv_seq * batch / 1e9;
            double step = best_tg[mode] / n_decode, rate = (gb + kv_gb) / step;
            printf("decode tg%d batch %d at context %d: %.2f tok/s (%.3f ms/step, %.2f tok/s per "
                   "sequence), %.1f GB/s of weights + KV (%.3f + %.3f GB/step)",
                   n_decode, batch, pl, batch / step, step * 1e3, 1.0 / step, rate, gb, kv_gb);
            if (bw > 0) printf(" = %.0f%% of the copy bandwidth", 100.0 * rate * 1e9 / bw);
            if (host_bw > 0) printf(" = %.0f%% of the read bandwidth", 100.0 * rate * 1e9 / host_bw);
            printf("; %s\n", smp && !mode ? "device sampling" : "logits downloaded");
        }
        if (n_moe) {
            struct model_moe_totals mt;
            if (count_moe(run, m, &q, ids, pl, n_decode, prefill_batch, scratch, logits, smp, tokens, &mt, &err))
                goto fail;
            if (n_decode) {
                /* what a decode step must read: every weight but the routed
                 * experts and an untied embedding table (n rows of it), the
                 * experts touched, each sequence's K/V */
                double embed = c->tie_word_embeddings ? 0.0 : (double)c->vocab_size * c->hidden_size * (double)es;
                double fixed = (double)model_weight_bytes(m) - mt.routed_bytes - embed;
                double kv_b = kv_seq * batch;
                double total = fixed + mt.decode_bytes + kv_b, step = best_tg[0] / n_decode;
                double ceil_bw = bw > 0 ? bw : host_bw;
                printf("decode bound batch %d at context %d: %.4f GB/step (weights but routed experts and "
                       "embedding %.4f + experts touched %.4f + KV %.4f)",
                       batch, pl, total / 1e9, fixed / 1e9, mt.decode_bytes / 1e9, kv_b / 1e9);
                if (ceil_bw > 0)
                    printf(" / %.1f GB/s %s = %.3f ms/step, %.1f tok/s; measured %.3f ms/step = %.0f%% of the bound",
                           ceil_bw / 1e9, bw > 0 ? "copy" : "read", total / ceil_bw * 1e3,
                           batch * ceil_bw / total, step * 1e3, 100.0 * total / ceil_bw / step);
                printf("\n");
            }
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_forward: %s\n", err.msg);
done:
    free(q.pages), free(q.page_start), free(ids), free(scratch), free(logits), free(tokens), free(srows);
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
    return rc;
}
