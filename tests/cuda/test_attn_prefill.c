/* test_attn_prefill.c — prefill attention at head size 128 on the bf16
 * cache: the wgmma kernel (hopper/attn_prefill.cu) and the
 * FlashAttention-2-style kernel (cuda_attention.cu), each against the CPU
 * backend, plus bitwise checks of what the kernels promise:
 *   - the default backend on a Hopper build runs the wgmma kernel
 *     (KILN_CUDA_FA=fa3: the same bits);
 *   - batch invariance: a sequence's rows are the same bits when it runs
 *     alone, and when its prompt comes in two chunks (the second one after
 *     a cached prefix), as inside a ragged batch.
 * Batches: ragged sequences over a shuffled page pool (page sizes 1 and 16),
 * cached prefixes (new tokens start mid-tile), query tiles crossing the
 * diagonal at arbitrary offsets, sequences shorter than one tile, a 2-token
 * chunk straddling a KV tile boundary, and decode rows (one new token; the
 * decode kernel's, computed alongside). GQA groups 1, 4 and 8.
 *
 * Tolerance ‖gpu − cpu‖ / ‖cpu‖ ≤ 1e-2: the CPU gets the same bf16-rounded
 * cache; the GPU rounds q and the probabilities p to bf16 (unit roundoff
 * 2^-9 ≈ 2e-3) and sums in fp32, so each output (a convex combination of V
 * rows) carries a relative error of about 2e-3 (test_cuda_ops measures
 * 2e-3 – 4e-3 for the FlashAttention-2 kernel); layout or masking bugs give
 * errors near 1. Outputs are poisoned with NaN first. The seed is printed
 * (KILN_TEST_SEED to repeat). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_attn.h"
#include "cuda_test_rng.h"

enum { D = 128, MAX_TOKENS = 2048, MAX_CONTEXT = 4096, MAX_HEADS = 32 };

static struct backend cpu, gpu;     /* gpu: the default kernels */
static struct backend gpu_fa2;      /* KILN_CUDA_FA=fa2 */
static struct backend gpu_fa3;      /* KILN_CUDA_FA=fa3 (Hopper builds on cc 9.0 only) */
static int have_gpu, have_fa3;

static void check_case(int H, int KVH, int page_size, const int *len, const int *nw, int n_seqs) {
    /* page pool, shuffled; each sequence's pages */
    int total = 0, n_tokens = 0;
    int *np = xmalloc((size_t)n_seqs * sizeof(int)), *first = xmalloc((size_t)n_seqs * sizeof(int));
    for (int s = 0; s < n_seqs; s++) {
        np[s] = (len[s] + page_size - 1) / page_size;
        total += np[s], n_tokens += nw[s], first[s] = len[s] - nw[s];
    }
    int pool = total + 9;
    int32_t *perm = xmalloc((size_t)pool * 4);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int32_t **sp = xmalloc((size_t)n_seqs * sizeof *sp);
    for (int s = 0, pg = 0; s < n_seqs; pg += np[s], s++) sp[s] = perm + pg;

    /* bf16 cache (the CPU gets the rounded values), q, outputs */
    long stride = (long)KVH * D, slots = (long)pool * page_size;
    size_t nkv = (size_t)(slots * stride);
    float *kh = xmalloc(nkv * 4), *vh = xmalloc(nkv * 4);
    uint16_t *kb = xmalloc(nkv * 2), *vb = xmalloc(nkv * 2);
    for (size_t i = 0; i < nkv; i++) {
        kb[i] = f32_to_bf16(frand(1.0f)), kh[i] = bf16_to_f32(kb[i]);
        vb[i] = f32_to_bf16(frand(1.0f)), vh[i] = bf16_to_f32(vb[i]);
    }
    void *kd = dev_from(&gpu, kb, nkv * 2), *vd = dev_from(&gpu, vb, nkv * 2);
    long ldq = (long)H * D + 4, ldo = (long)H * D + 2;
    size_t nq = (size_t)n_tokens * (size_t)ldq;
    float *qh = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) qh[i] = frand(1.0f);
    float *qd = dev_from(&gpu, qh, nq * 4);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = D, .dv = D, .k_stride = stride,
                            .v_stride = stride, .scale = 1.0f / sqrtf((float)D)};

    struct batch b;
    batch_make(&gpu, &b, page_size, n_seqs, first, nw, sp, np);
    printf("  H=%d KVH=%d page=%d seqs=%d tokens=%d\n", H, KVH, page_size, n_seqs, n_tokens);
    float *ref = xmalloc((size_t)n_tokens * (size_t)ldo * 4);
    for (size_t i = 0; i < (size_t)n_tokens * (size_t)ldo; i++) ref[i] = NAN;
    cpu.ops->attention(cpu.ctx, ref, ldo, qh, ldq, kh, vh, &p, &b.hb);

    struct backend *bes[] = {&gpu, &gpu_fa2, &gpu_fa3};
    const char *names[] = {"default", "fa2", "fa3"};
    float *outs[3] = {NULL, NULL, NULL};
    for (int v = 0; v < 3; v++) {
        if (v >= 2 && !have_fa3) continue;
        outs[v] = run_gpu(&gpu, bes[v], &b, qd, ldq, ldo, kd, vd, &p);
        double e = rel_err(outs[v], ref, n_tokens, (long)H * D, ldo);
        printf("    %-8s rel err %.3g (tol 1e-2)\n", names[v], e);
        if (!(e <= 1e-2)) fail_msg("%s: relative error %.3g above 1e-2", names[v], e);
    }
    long W = (long)H * D;
    if (have_fa3) {
        expect_same_bits("default vs fa3", outs[0], ldo, outs[2], ldo, n_tokens, W);
    }

    /* batch invariance of the default kernel: sequence 0 alone, then its
     * new tokens in two chunks (the second after a cached prefix) */
    if (nw[0] >= 4) {
        struct batch b1;
        batch_make(&gpu, &b1, page_size, 1, first, nw, sp, np);
        float *o1 = run_gpu(&gpu, &gpu, &b1, qd, ldq, ldo, kd, vd, &p);
        expect_same_bits("seq 0 alone vs in the batch", o1, ldo, outs[0], ldo, nw[0], W);
        free(o1);
        batch_free(&gpu, &b1);
        int c1 = nw[0] / 3, c2 = nw[0] - c1, f2 = first[0] + c1;
        int np1 = (first[0] + c1 + page_size - 1) / page_size;
        struct batch bc1, bc2;
        batch_make(&gpu, &bc1, page_size, 1, first, &c1, sp, &np1);
        batch_make(&gpu, &bc2, page_size, 1, &f2, &c2, sp, np);
        float *oc1 = run_gpu(&gpu, &gpu, &bc1, qd, ldq, ldo, kd, vd, &p);
        float *oc2 = run_gpu(&gpu, &gpu, &bc2, qd + (size_t)c1 * (size_t)ldq, ldq, ldo, kd, vd, &p);
        expect_same_bits("chunk 1 vs in the batch", oc1, ldo, outs[0], ldo, c1, W);
        expect_same_bits("chunk 2 vs in the batch", oc2, ldo, outs[0] + (size_t)c1 * (size_t)ldo, ldo,
                         c2, W);
        free(oc1), free(oc2);
        batch_free(&gpu, &bc1), batch_free(&gpu, &bc2);
    }

    for (int v = 0; v < 3; v++) free(outs[v]);
    free(ref);
    batch_free(&gpu, &b);
    gpu.ops->free(gpu.ctx, kd), gpu.ops->free(gpu.ctx, vd), gpu.ops->free(gpu.ctx, qd);
    free(kh), free(vh), free(kb), free(vb), free(qh), free(perm), free(sp), free(np), free(first);
}

static void test_prefill(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    /* a long chunk after a cached prefix (query tiles cross the diagonal
     * mid-tile), a prompt from 0, a 2-token chunk across a KV tile boundary
     * (127, 128), prompts shorter than a tile, decode rows */
    int len[] = {700, 300, 129, 77, 5, 40, 200}, nw[] = {500, 300, 2, 77, 1, 1, 130};
    check_case(32, 8, 16, len, nw, 7); /* Llama-3.1-8B's heads: group 4 */
    check_case(16, 4, 1, len, nw, 7);
    check_case(8, 8, 16, len, nw, 7); /* group 1 */
    check_case(16, 2, 1, len, nw, 7); /* group 8 */
    /* one sequence of several query tiles from position 0 (the prefill of
     * a prompt), and one shorter than a KV tile */
    int l1[] = {1000}, n1[] = {1000};
    check_case(32, 8, 16, l1, n1, 1);
    int l2[] = {37}, n2[] = {37};
    check_case(8, 2, 1, l2, n2, 1);
}

int main(void) {
    rng_seed("test_attn_prefill");
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_attn_prefill: %s; the tests below fail\n", err.msg);
    } else {
        setenv("KILN_CUDA_FA", "fa2", 1);
        knob_reload(NULL); /* knobs are read once; this test compares settings */
        if (backend_create(&gpu_fa2, "cuda", &bo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        setenv("KILN_CUDA_FA", "fa3", 1);
        knob_reload(NULL);
        have_fa3 = backend_create(&gpu_fa3, "cuda", &bo, &err) == 0;
#ifdef KILN_CUDA_HOPPER
        if (!have_fa3) printf("test_attn_prefill: no wgmma kernel here (%s): fa3 checks not run\n", err.msg);
#endif
        unsetenv("KILN_CUDA_FA");
        knob_reload(NULL);
        struct backend *all[] = {&gpu, &gpu_fa2, &gpu_fa3};
        for (int i = 0; i < 3; i++) {
            if (i >= 2 && !have_fa3) continue;
            if (all[i]->ops->reserve(all[i]->ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
                return fprintf(stderr, "reserve: %s\n", err.msg), 1;
        }
        if (cpu.ops->reserve(cpu.ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
            return fprintf(stderr, "reserve: %s\n", err.msg), 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_prefill)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) {
        backend_destroy(&gpu), backend_destroy(&gpu_fa2);
        if (have_fa3) backend_destroy(&gpu_fa3);
    }
    backend_destroy(&cpu);
    return rc;
}
