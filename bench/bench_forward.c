/* bench_forward.c — forward-pass speed of one sequence: prefill of P
 * tokens, then D decode steps, on any backend. Prints tokens/s, for dense
 * models the prefill's TFLOP/s (matrix products of every weight but the
 * embedding, the lm_head for one row, and causal attention), and for
 * decode the bytes of weights read per second (the roofline for batch-1
 * decode is memory bandwidth). --prompt-len takes a comma-separated list:
 * one model load, each length measured in turn (decode then runs at that
 * context).
 *
 *   bench_forward --model DIR|config.json [--load-format dummy] [--prompt-len 128[,8192...]]
 *                 [--decode 32] [--threads N] [--device cpu] [--repeat 3] [--deterministic]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/model.h"
#include "tensor/backend.h"

static int step(struct model *m, struct kv_pool *kv, const int32_t *ids, int from, int n,
                const int32_t *pages, int n_pages, float *logits, struct kiln_error *err) {
    int32_t *pos = xmalloc((size_t)n * 4), *slot = xmalloc((size_t)n * 4);
    for (int i = 0; i < n; i++) pos[i] = slot[i] = from + i; /* page size 1, pages 0.. in order */
    int32_t q_start[2] = {0, n}, kv_len = from + n, page_start[2] = {0, n_pages}, row = n - 1;
    struct batch b = {.mode = from ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = n,
                      .input_ids = ids, .positions = pos, .out_slot = slot, .n_seqs = 1,
                      .q_start = q_start, .kv_len = &kv_len, .kv_page_start = page_start,
                      .kv_pages = pages, .page_size = 1, .n_logit_rows = 1, .logit_rows = &row};
    int rc = model_forward(m, kv, &b, logits, err);
    free(pos);
    free(slot);
    return rc;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *format = "auto", *device = "cpu", *pp_list = "128";
    int prompt_len = 0, decode = 32, threads = 0, repeat = 3, deterministic = 0;
    int pps[16], n_pp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--model")) model_dir = v, i++;
        else if (!strcmp(a, "--load-format")) format = v, i++;
        else if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--prompt-len")) pp_list = v, i++;
        else if (!strcmp(a, "--decode")) decode = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--repeat")) repeat = atoi(v), i++;
        else if (!strcmp(a, "--deterministic")) deterministic = 1;
        else {
            fprintf(stderr, "bench_forward: unknown option %s\n", a);
            return 2;
        }
    }
    for (const char *p = pp_list; *p && n_pp < 16;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1 << 20) break;
        pps[n_pp++] = (int)x;
        if (x > prompt_len) prompt_len = (int)x;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') n_pp = 0, p = "";
    }
    if (!model_dir || n_pp == 0 || decode < 0 || repeat < 1) {
        fprintf(stderr, "usage: bench_forward --model DIR|config.json [--load-format dummy] "
                        "[--prompt-len N] [--decode N] [--threads N] [--repeat N]\n");
        return 2;
    }
    struct kiln_error err = {{0}};
    struct backend be;
    struct backend_options bo = {.n_threads = threads, .deterministic = deterministic};
    if (backend_create(&be, device, &bo, &err)) goto fail;
    int ctx = prompt_len + decode + 1;
    struct model *m;
    struct model_options mo = {.load_format = format, .max_batch_tokens = prompt_len, .max_seqs = 1,
                               .max_context = ctx, .page_size = 1};
    double t0 = time_now();
    if (model_load(&m, model_dir, &be, &mo, &err)) goto fail;
    double t_load = time_now() - t0;
    const struct model_config *c = model_config(m);
    struct kv_layer_layout layout[512];
    int nl = model_kv_layout(m, layout, 512);
    struct kv_pool kv;
    if (kv_pool_init(&kv, &be, layout, nl, 1, ctx, &err)) goto fail;
    int32_t *pages = xmalloc((size_t)ctx * 4), *ids = xmalloc((size_t)ctx * 4);
    for (int i = 0; i < ctx; i++) pages[i] = i, ids[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    float *logits = xmalloc((size_t)c->vocab_size * 4);
    double gb = (double)model_weight_bytes(m) / 1e9;
    printf("model: %s (%s, %d layers, hidden %d, vocab %d), %.3f GB of weights, loaded in %.2f s\n",
           model_dir, model_arch_name(c->arch), c->n_layers, c->hidden_size, c->vocab_size, gb, t_load);
    printf("device: %s, threads: %d, best of %d%s\n", device, threads, repeat,
           deterministic ? ", deterministic" : "");
    /* Dense models: every matrix but the embedding (and the lm_head past
     * the one logit row) is multiplied by each token. */
    int dense = c->n_experts == 0 && c->kv_lora_rank == 0;
    double per_tok = (double)model_weight_bytes(m) / 2.0 -
                     (c->tie_word_embeddings ? 1.0 : 2.0) * c->vocab_size * (double)c->hidden_size;
    for (int k = 0; k < n_pp; k++) {
        int pl = pps[k];
        double best_pp = 1e30, best_tg = 1e30;
        for (int r = 0; r < repeat; r++) {
            t0 = time_now();
            if (step(m, &kv, ids, 0, pl, pages, ctx, logits, &err)) goto fail;
            double t1 = time_now();
            for (int i = 0; i < decode; i++)
                if (step(m, &kv, ids + pl + i, pl + i, 1, pages, ctx, logits, &err)) goto fail;
            double t2 = time_now();
            if (t1 - t0 < best_pp) best_pp = t1 - t0;
            if (decode && t2 - t1 < best_tg) best_tg = t2 - t1;
        }
        printf("prefill pp%d: %.1f tok/s (%.1f ms)", pl, pl / best_pp, best_pp * 1e3);
        if (dense) {
            double mm = 2.0 * pl * per_tok + 2.0 * c->vocab_size * (double)c->hidden_size;
            double at = 2.0 * c->head_dim * (double)c->n_heads * pl * (pl + 1.0) * c->n_layers;
            printf(", %.1f TFLOP/s (%.2f TFLOP: matmul %.2f + attention %.2f)", (mm + at) / best_pp / 1e12,
                   (mm + at) / 1e12, mm / 1e12, at / 1e12);
        }
        printf("\n");
        if (decode)
            printf("decode tg%d at context %d: %.2f tok/s (%.2f ms/token, %.1f GB/s of weights)\n", decode,
                   pl, decode / best_tg, best_tg / decode * 1e3, gb * decode / best_tg);
    }
    return 0;
fail:
    fprintf(stderr, "bench_forward: %s\n", err.msg);
    return 1;
}
