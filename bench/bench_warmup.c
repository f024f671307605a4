/* bench_warmup.c — does start-up warm-up leave no first-seen cost? Loads a
 * model, runs runner_warmup (unless --no-warmup), then for each decode
 * bucket times the first step at that batch size against the median of
 * the next five: the bar is "within 10% of the steady state".
 * Steps end as serving steps do: sampled greedily on the device with only
 * the token ids copied back (runner_forward_sample), where the backend
 * samples; --logits downloads every row's logits instead (megabytes into
 * pageable memory per step, whose copy time varies by tens of percent from
 * step to step and hides the step itself).
 *
 *   bench_warmup --model DIR|config.json [--load-format dummy] [--device cuda]
 *                [--no-warmup] [--max-batch 256] [--logits]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One decode step of n sequences, sequence s at position `pos` on page s. */
static double step(struct runner *run, struct kv_pool *kv, int n, int pos, const int32_t *pages,
                   float *logits, const struct runner_sampling *smp, int32_t *tokens,
                   struct kiln_error *err) {
    int32_t *buf = xmalloc((size_t)n * 9 * 4 + 8);
    int32_t *ids = buf, *p = ids + n, *slot = p + n, *rows = slot + n, *qs = rows + n,
            *kvl = qs + n + 1, *pst = kvl + n, *pg = pst + n + 1;
    for (int s = 0; s < n; s++) {
        ids[s] = 100 + s;
        p[s] = pos;
        slot[s] = pages[s] * kv->page_size + pos;
        rows[s] = s;
        qs[s] = s;
        kvl[s] = pos + 1;
        pst[s] = s;
        pg[s] = pages[s];
    }
    qs[n] = n;
    pst[n] = n;
    struct batch b = {.mode = BATCH_MODE_DECODE, .n_tokens = n, .input_ids = ids, .positions = p,
                      .out_slot = slot, .n_seqs = n, .q_start = qs, .kv_len = kvl,
                      .kv_page_start = pst, .kv_pages = pg, .page_size = kv->page_size,
                      .n_logit_rows = n, .logit_rows = rows};
    double t0 = time_now();
    /* both wait for the step: the token ids or the logits come back */
    int rc = smp ? runner_forward_sample(run, &b, smp, tokens, logits, err)
                 : runner_forward(run, &b, logits, err);
    double t = time_now() - t0;
    free(buf);
    return rc ? -1 : t;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *format = "auto", *device = "cuda";
    int warm = 1, max_batch = 256, want_logits = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--model")) model_dir = v, i++;
        else if (!strcmp(a, "--load-format")) format = v, i++;
        else if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--no-warmup")) warm = 0;
        else if (!strcmp(a, "--max-batch")) max_batch = atoi(v), i++;
        else if (!strcmp(a, "--logits")) want_logits = 1;
        else {
            fprintf(stderr, "bench_warmup: unknown option %s\n", a);
            return 2;
        }
    }
    if (!model_dir || max_batch < 1) {
        fprintf(stderr, "usage: bench_warmup --model DIR|config.json [--load-format dummy] "
                        "[--device cuda] [--no-warmup] [--max-batch N] [--logits]\n");
        return 2;
    }
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    if (backend_create(&be, device, &bo, &err)) goto fail;
    struct model *m;
    /* page size 64: each sequence owns one page, positions 0..63 */
    struct model_options mo = {.load_format = format, .max_batch_tokens = 2048,
                               .max_seqs = max_batch, .max_context = 4096};
    if (model_load(&m, model_dir, &be, &mo, &err)) goto fail;
    struct runner_options ro = {.page_size = 64, .kv_tokens = (long)(max_batch + 4096 / 64 + 2) * 64,
                                .swa_full_tokens_ratio = 1};
    struct runner *run;
    if (runner_create(&run, m, &ro, &err)) goto fail;
    struct kv_pool *kv = runner_kv(run);
    double t0 = time_now();
    if (warm && runner_warmup(run, &err)) goto fail;
    printf("warm-up: %.2f s (%s)\n", time_now() - t0, warm ? "on" : "off");
    int32_t *pages = xmalloc((size_t)max_batch * 4);
    if (kv_pool_alloc(kv, max_batch, pages)) {
        kiln_errorf(&err, "KV pool too small");
        goto fail;
    }
    /* touched once up front: first-touch page faults on a fresh host
     * buffer would otherwise be charged to the first step of each size */
    size_t lbytes = (size_t)max_batch * model_config(m)->vocab_size * 4;
    float *logits = xmalloc(lbytes);
    memset(logits, 0, lbytes);
    int32_t *tokens = xmalloc((size_t)max_batch * 4);
    struct backend_sample_row *srows = xcalloc((size_t)max_batch, sizeof *srows); /* greedy */
    struct runner_sampling greedy = {.rows = srows};
    const struct runner_sampling *smp = !want_logits && runner_can_sample(run) ? &greedy : NULL;
    printf("steps end with: %s\n", smp ? "greedy sampling on the device, token ids downloaded"
                                        : "every row's logits downloaded");
    int sizes[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
    printf("%6s %12s %12s %12s %8s\n", "batch", "first (ms)", "second (ms)", "steady (ms)", "ratio");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        if (n > max_batch) break;
        double first = step(run, kv, n, 0, pages, logits, smp, tokens, &err), rest[5];
        for (int r = 0; r < 5; r++) rest[r] = step(run, kv, n, 1 + r, pages, logits, smp, tokens, &err);
        if (first < 0 || rest[4] < 0) goto fail;
        double second = rest[0];
        qsort(rest, 5, sizeof rest[0], cmp_double);
        printf("%6d %12.3f %12.3f %12.3f %8.2f\n", n, first * 1e3, second * 1e3, rest[2] * 1e3,
               first / rest[2]);
    }
    return 0;
fail:
    fprintf(stderr, "bench_warmup: %s\n", err.msg);
    return 1;
}
