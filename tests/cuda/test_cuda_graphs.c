/* test_cuda_graphs.c — decode steps replayed from CUDA graphs give the
 * logits eager execution gives, on one stream or two.
 *
 * Two copies of one tiny oracle model (same weights), each on its own
 * CUDA backend: A runs every step eagerly (no_graphs) on one stream
 * (KILN_CUDA_DUAL_STREAM=0), B pads decode batches to a graph bucket and
 * replays them (its first step of a size runs eagerly, the second
 * records, the rest replay) with the MoE models' shared experts on the
 * second stream (the default). Dense, MoE and MLA models. Both prefill the same sequences, then
 * decode the same tokens; their logits must match: bitwise where both take
 * the GEMV path (≤ 8 rows: each row's sums run in a fixed order whatever
 * the batch), within 1e-6 of the logit range where cuBLAS sees different
 * row counts (13 rows vs a 16-row bucket may choose another kernel).
 * Batch sizes 1, 3 (padded to 4), 8 and 13 (padded to 16), page sizes 1
 * and 4, a new KV pool per size (graphs must follow the pool). Skips
 * without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"

static struct backend gpu, gpu1; /* default; one stream */
static int have_gpu;

enum { MAX_SEQS = 16, MAX_CTX = 64, PROMPT = 6, STEPS = 5 };

static void run_arch(const char *arch, int page_size) {
    const char *fx = getenv("KILN_FIXTURES");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/oracle/tiny-models/%s", fx ? fx : "tests/fixtures", arch);
    struct kiln_error err = {0};
    struct model *ma, *mb;
    struct model_options o = {.max_batch_tokens = MAX_SEQS * PROMPT, .max_seqs = MAX_SEQS,
                              .max_context = MAX_CTX};
    if (model_load(&ma, dir, &gpu1, &o, &err) || model_load(&mb, dir, &gpu, &o, &err))
        fail_msg("%s: %s", dir, err.msg);
    const struct model_config *c = model_config(ma);
    long V = c->vocab_size;
    int ppseq = MAX_CTX / page_size;
    const int sizes[] = {1, 3, 8, 13};
    for (int si = 0; si < 4; si++) {
        int N = sizes[si];
        struct runner *ra, *rb;
        struct runner_options roa = {.page_size = page_size, .kv_tokens = (long)(N * ppseq + 1) * page_size,
                                     .no_graphs = 1};
        struct runner_options rob = roa;
        rob.no_graphs = 0;
        if (runner_create(&ra, ma, &roa, &err) || runner_create(&rb, mb, &rob, &err))
            fail_msg("runner: %s", err.msg);
        struct kv_pool *ka = runner_kv(ra), *kb = runner_kv(rb);
        int32_t *pa = xmalloc((size_t)N * ppseq * 4), *pb = xmalloc((size_t)N * ppseq * 4);
        int32_t ps[MAX_SEQS + 1];
        for (int s = 0; s < N; s++) {
            assert_int_equal(kv_pool_alloc(ka, ppseq, pa + s * ppseq), 0);
            assert_int_equal(kv_pool_alloc(kb, ppseq, pb + s * ppseq), 0);
            ps[s] = s * ppseq;
        }
        ps[N] = N * ppseq;
        float *la = xmalloc((size_t)N * V * 4), *lb = xmalloc((size_t)N * V * 4);
        /* prefill: all sequences in one extend batch, every row's logits */
        int T = N * PROMPT;
        int32_t ids[MAX_SEQS * PROMPT], pos[MAX_SEQS * PROMPT], sa[MAX_SEQS * PROMPT],
            sb[MAX_SEQS * PROMPT], qs[MAX_SEQS + 1], kl[MAX_SEQS], rows[MAX_SEQS];
        for (int s = 0; s < N; s++) {
            qs[s] = s * PROMPT;
            kl[s] = PROMPT;
            rows[s] = s * PROMPT + PROMPT - 1;
            for (int p = 0; p < PROMPT; p++) {
                int t = s * PROMPT + p;
                ids[t] = (int32_t)((t * 131 + 7) % V);
                pos[t] = p;
                sa[t] = pa[s * ppseq + p / page_size] * page_size + p % page_size;
                sb[t] = pb[s * ppseq + p / page_size] * page_size + p % page_size;
            }
        }
        qs[N] = T;
        struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = T, .input_ids = ids,
                          .positions = pos, .out_slot = sa, .n_seqs = N, .q_start = qs,
                          .kv_len = kl, .kv_page_start = ps, .kv_pages = pa,
                          .page_size = page_size, .n_logit_rows = N, .logit_rows = rows};
        assert_int_equal(runner_forward(ra, &b, la, &err), 0);
        b.out_slot = sb, b.kv_pages = pb;
        assert_int_equal(runner_forward(rb, &b, lb, &err), 0);
        for (int step = 0; step < STEPS; step++) {
            int p = PROMPT + step;
            for (int s = 0; s < N; s++) {
                ids[s] = (int32_t)((s * 17 + step * 29 + 3) % V);
                pos[s] = p;
                sa[s] = pa[s * ppseq + p / page_size] * page_size + p % page_size;
                sb[s] = pb[s * ppseq + p / page_size] * page_size + p % page_size;
                qs[s] = s;
                kl[s] = p + 1;
                rows[s] = s;
            }
            qs[N] = N;
            struct batch d = {.mode = BATCH_MODE_DECODE, .n_tokens = N, .input_ids = ids,
                              .positions = pos, .out_slot = sa, .n_seqs = N, .q_start = qs,
                              .kv_len = kl, .kv_page_start = ps, .kv_pages = pa,
                              .page_size = page_size, .n_logit_rows = N, .logit_rows = rows};
            for (long i = 0; i < N * V; i++) la[i] = lb[i] = NAN;
            assert_int_equal(runner_forward(ra, &d, la, &err), 0);
            d.out_slot = sb, d.kv_pages = pb;
            assert_int_equal(runner_forward(rb, &d, lb, &err), 0);
            double maxd = 0, maxv = 0;
            long differ = 0;
            for (long i = 0; i < N * V; i++) {
                if (isnan(la[i]) || isnan(lb[i])) fail_msg("%s N=%d step %d: NaN at %ld", arch, N, step, i);
                double e = fabs((double)la[i] - lb[i]);
                if (e > maxd) maxd = e;
                if (fabs(la[i]) > maxv) maxv = fabs(la[i]);
                differ += la[i] != lb[i];
            }
            printf("  %s page %d N=%d step %d (%s): max |eager - graph| %.3g over |logit| %.3g, "
                   "%ld of %ld differ\n", arch, page_size, N, step,
                   step == 0 ? "eager warm-up" : step == 1 ? "recorded" : "replayed", maxd, maxv,
                   differ, N * V);
            if (N <= 8 && differ) fail_msg("graph replay differs from eager execution");
            if (maxd > 1e-6 * maxv) fail_msg("graph replay differs by %.3g", maxd);
        }
        runner_free(ra);
        runner_free(rb);
        free(pa), free(pb), free(la), free(lb);
    }
    model_free(ma);
    model_free(mb);
}

static void test_graphs(void **state) {
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"};
    for (int a = 0; a < (int)(sizeof archs / sizeof archs[0]); a++) {
        run_arch(archs[a], 1);
        run_arch(archs[a], 4);
    }
}

int main(void) {
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    setenv("KILN_CUDA_DUAL_STREAM", "0", 1);
    knob_reload(NULL); /* knobs are read once per backend: the one-stream backend */
    have_gpu = backend_create(&gpu1, "cuda", &bo, &err) == 0;
    unsetenv("KILN_CUDA_DUAL_STREAM");
    knob_reload(NULL);
    have_gpu = have_gpu && backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) printf("test_cuda_graphs: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_graphs)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gpu), backend_destroy(&gpu1);
    return rc;
}
