/* test_mla_mha.c — the GPU pieces of MLA's MHA form (model/deepseek_mha.c)
 * against the CPU backend:
 *   - attention at dk 192 / dv 128 on the bf16 cache (the wgmma kernel of
 *     hopper/attn_prefill.cu on compute capability 9.0, the split kernel
 *     for one-token sequences and elsewhere; KILN_CUDA_FA=fa2 takes the
 *     split kernel for every row), ragged batches over shuffled pages
 *     (page sizes 1 and 16, and one page of the whole context as the
 *     workspace uses it), cached prefixes, decode rows, GQA groups 1 and 2;
 *     within ‖gpu − cpu‖ / ‖cpu‖ ≤ 1e-2 (test_attn_prefill.c says why:
 *     the GPU rounds q and the probabilities to bf16), and bitwise batch
 *     invariance: a sequence alone, and its prompt in two chunks, give the
 *     same bits as inside the batch;
 *   - kv_gather and mla_kv_expand (cuda_mla.cu): the same bits as the CPU's
 *     after the cache's bf16 rounding (round to nearest even, both sides).
 * Outputs are poisoned with NaN first. The seed is printed (KILN_TEST_SEED
 * to repeat). */
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
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "cuda_test_attn.h"
#include "cuda_test_rng.h"

enum { DK = 192, DV = 128, MAX_TOKENS = 2048, MAX_CONTEXT = 4096, MAX_HEADS = 32 };

static struct backend cpu, gpu, gpu_fa2;
static int have_gpu;

/* page_size 0: one page holding the whole context (the workspace's view) */
static void check_case(int H, int KVH, int page_size, const int *len, const int *nw, int n_seqs) {
    int total = 0, n_tokens = 0, maxlen = 0;
    for (int s = 0; s < n_seqs; s++) maxlen = len[s] > maxlen ? len[s] : maxlen;
    int one_page = page_size == 0;
    if (one_page) page_size = maxlen;
    int *np = xmalloc((size_t)n_seqs * sizeof(int)), *first = xmalloc((size_t)n_seqs * sizeof(int));
    for (int s = 0; s < n_seqs; s++) {
        np[s] = (len[s] + page_size - 1) / page_size;
        total += np[s], n_tokens += nw[s], first[s] = len[s] - nw[s];
    }
    int pool = total + (one_page ? 0 : 9);
    int32_t *perm = xmalloc((size_t)pool * 4);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int32_t **sp = xmalloc((size_t)n_seqs * sizeof *sp);
    for (int s = 0, pg = 0; s < n_seqs; pg += np[s], s++) sp[s] = perm + pg;

    /* K rows [KVH][192], V rows [KVH][128], as mla_kv_expand writes them */
    long ks = (long)KVH * DK, vs = (long)KVH * DV, slots = (long)pool * page_size;
    size_t nk = (size_t)(slots * ks), nv = (size_t)(slots * vs);
    float *kh = xmalloc(nk * 4), *vh = xmalloc(nv * 4);
    uint16_t *kb = xmalloc(nk * 2), *vb = xmalloc(nv * 2);
    for (size_t i = 0; i < nk; i++) kb[i] = f32_to_bf16(frand(1.0f)), kh[i] = bf16_to_f32(kb[i]);
    for (size_t i = 0; i < nv; i++) vb[i] = f32_to_bf16(frand(1.0f)), vh[i] = bf16_to_f32(vb[i]);
    void *kd = dev_from(&gpu, kb, nk * 2), *vd = dev_from(&gpu, vb, nv * 2);
    long ldq = (long)H * DK, ldo = (long)H * DV;
    size_t nq = (size_t)n_tokens * (size_t)ldq;
    float *qh = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) qh[i] = frand(1.0f);
    float *qd = dev_from(&gpu, qh, nq * 4);
    struct attn_params p = {.n_heads = H, .n_kv_heads = KVH, .dk = DK, .dv = DV, .k_stride = ks,
                            .v_stride = vs, .scale = 1.0f / sqrtf((float)DK)};

    struct batch b;
    batch_make(&gpu, &b, page_size, n_seqs, first, nw, sp, np);
    printf("  H=%d KVH=%d page=%d seqs=%d tokens=%d\n", H, KVH, page_size, n_seqs, n_tokens);
    float *ref = xmalloc((size_t)n_tokens * (size_t)ldo * 4);
    for (size_t i = 0; i < (size_t)n_tokens * (size_t)ldo; i++) ref[i] = NAN;
    cpu.ops->attention(cpu.ctx, ref, ldo, qh, ldq, kh, vh, &p, &b.hb);

    struct backend *bes[] = {&gpu, &gpu_fa2};
    const char *names[] = {"default", "fa2"};
    float *outs[2];
    for (int v = 0; v < 2; v++) {
        outs[v] = run_gpu(&gpu, bes[v], &b, qd, ldq, ldo, kd, vd, &p);
        double e = rel_err(outs[v], ref, n_tokens, ldo, ldo);
        printf("    %-8s rel err %.3g (tol 1e-2)\n", names[v], e);
        if (!(e <= 1e-2)) fail_msg("%s: relative error %.3g above 1e-2", names[v], e);
    }
    if (nw[0] >= 4) {
        struct batch b1;
        batch_make(&gpu, &b1, page_size, 1, first, nw, sp, np);
        float *o1 = run_gpu(&gpu, &gpu, &b1, qd, ldq, ldo, kd, vd, &p);
        expect_same_bits("seq 0 alone vs in the batch", o1, ldo, outs[0], ldo, nw[0], ldo);
        free(o1);
        batch_free(&gpu, &b1);
        int c1 = nw[0] / 3, c2 = nw[0] - c1, f2 = first[0] + c1;
        int np1 = (first[0] + c1 + page_size - 1) / page_size;
        struct batch bc1, bc2;
        batch_make(&gpu, &bc1, page_size, 1, first, &c1, sp, &np1);
        batch_make(&gpu, &bc2, page_size, 1, &f2, &c2, sp, np);
        float *oc1 = run_gpu(&gpu, &gpu, &bc1, qd, ldq, ldo, kd, vd, &p);
        float *oc2 = run_gpu(&gpu, &gpu, &bc2, qd + (size_t)c1 * (size_t)ldq, ldq, ldo, kd, vd, &p);
        expect_same_bits("chunk 1 vs in the batch", oc1, ldo, outs[0], ldo, c1, ldo);
        expect_same_bits("chunk 2 vs in the batch", oc2, ldo, outs[0] + (size_t)c1 * (size_t)ldo,
                         ldo, c2, ldo);
        free(oc1), free(oc2);
        batch_free(&gpu, &bc1), batch_free(&gpu, &bc2);
    }
    for (int v = 0; v < 2; v++) free(outs[v]);
    free(ref);
    batch_free(&gpu, &b);
    gpu.ops->free(gpu.ctx, kd), gpu.ops->free(gpu.ctx, vd), gpu.ops->free(gpu.ctx, qd);
    free(kh), free(vh), free(kb), free(vb), free(qh), free(perm), free(sp), free(np), free(first);
}

static void test_attention_192(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    /* a long chunk after a cached prefix, a prompt from 0, a 2-token chunk
     * across a KV tile boundary, short prompts, decode rows */
    int len[] = {700, 300, 129, 77, 5, 40, 200}, nw[] = {500, 300, 2, 77, 1, 1, 130};
    check_case(16, 16, 16, len, nw, 7); /* DeepSeek-V2-Lite's MHA form: a KV head per head */
    check_case(8, 8, 1, len, nw, 7);
    check_case(8, 4, 16, len, nw, 7); /* group 2 */
    int l1[] = {1000}, n1[] = {1000};
    check_case(16, 16, 0, l1, n1, 1); /* the workspace: one page, slot = position */
    int l2[] = {900}, n2[] = {300};
    check_case(16, 16, 0, l2, n2, 1); /* an extend after a prefix */
}

static void test_gather_expand(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    enum { H = 16, NOPE = 128, ROPE = 64, VD = 128, KVR = 512, LW = KVR + ROPE, PS = 16, NP = 40 };
    int bf16 = backend_kv_dtype(&gpu) == DTYPE_BF16;
    size_t es = bf16 ? 2 : 4;
    /* a paged latent cache of NP pages, and a sequence on a shuffled half of them */
    long slots = (long)NP * PS, n = 300, p0 = 37, cnt = n - p0;
    float *cache = xmalloc((size_t)(slots * LW) * 4);
    void *cdev_h = xmalloc((size_t)(slots * LW) * es);
    for (long i = 0; i < slots * LW; i++) {
        float x = frand(2.0f);
        if (bf16) {
            uint16_t b = f32_to_bf16(x);
            ((uint16_t *)cdev_h)[i] = b;
            cache[i] = bf16_to_f32(b);
        } else {
            ((float *)cdev_h)[i] = x, cache[i] = x;
        }
    }
    int32_t pages[NP];
    for (int i = 0; i < NP; i++) pages[i] = NP - 1 - (i * 7) % NP;
    void *cdev = dev_from(&gpu, cdev_h, (size_t)(slots * LW) * es), *pdev = dev_from(&gpu, pages, sizeof pages);
    float *g_cpu = xmalloc((size_t)(cnt * LW) * 4), *g_gpu = xmalloc((size_t)(cnt * LW) * 4);
    for (long i = 0; i < cnt * LW; i++) g_cpu[i] = NAN, g_gpu[i] = NAN;
    float *gdev = dev_from(&gpu, g_gpu, (size_t)(cnt * LW) * 4);
    cpu.ops->kv_gather(cpu.ctx, g_cpu, LW, cache, LW, LW, pages, PS, p0, cnt, 1.0f);
    gpu.ops->kv_gather(gpu.ctx, gdev, LW, cdev, LW, LW, pdev, PS, p0, cnt, 1.0f);
    gpu.ops->download(gpu.ctx, g_gpu, gdev, (size_t)(cnt * LW) * 4);
    expect_same_bits("kv_gather", g_gpu, LW, g_cpu, LW, cnt, LW);

    /* expand: kv [cnt][H·(nope+vd)] (ld + 8), k_rope = the gathered rows' tail */
    long ldkv = H * (NOPE + VD) + 8, kw = H * (NOPE + ROPE), vw = H * VD;
    float *kv = xmalloc((size_t)(cnt * ldkv) * 4);
    for (long i = 0; i < cnt * ldkv; i++) kv[i] = frand(3.0f);
    float *kvd = dev_from(&gpu, kv, (size_t)(cnt * ldkv) * 4);
    float *k_cpu = xmalloc((size_t)(cnt * kw) * 4), *v_cpu = xmalloc((size_t)(cnt * vw) * 4);
    cpu.ops->mla_kv_expand(cpu.ctx, k_cpu, v_cpu, kv, ldkv, g_cpu + KVR, LW, cnt, H, NOPE, ROPE, VD);
    void *kdev = gpu.ops->alloc(gpu.ctx, (size_t)(cnt * kw) * es);
    void *vdev = gpu.ops->alloc(gpu.ctx, (size_t)(cnt * vw) * es);
    gpu.ops->mla_kv_expand(gpu.ctx, kdev, vdev, kvd, ldkv, gdev + KVR, LW, cnt, H, NOPE, ROPE, VD);
    unsigned char *kg = xmalloc((size_t)(cnt * kw) * es), *vg = xmalloc((size_t)(cnt * vw) * es);
    gpu.ops->download(gpu.ctx, kg, kdev, (size_t)(cnt * kw) * es);
    gpu.ops->download(gpu.ctx, vg, vdev, (size_t)(cnt * vw) * es);
    long bad = 0;
    for (long i = 0; i < cnt * kw; i++) {
        float want = bf16 ? bf16_to_f32(f32_to_bf16(k_cpu[i])) : k_cpu[i];
        float got = bf16 ? bf16_to_f32(((uint16_t *)kg)[i]) : ((float *)kg)[i];
        bad += memcmp(&want, &got, 4) != 0;
    }
    for (long i = 0; i < cnt * vw; i++) {
        float want = bf16 ? bf16_to_f32(f32_to_bf16(v_cpu[i])) : v_cpu[i];
        float got = bf16 ? bf16_to_f32(((uint16_t *)vg)[i]) : ((float *)vg)[i];
        bad += memcmp(&want, &got, 4) != 0;
    }
    if (bad) fail_msg("mla_kv_expand: %ld elements differ from the CPU's", bad);
    printf("    mla_kv_expand: %ld positions × %d heads, same bits (%s)\n", cnt, H, bf16 ? "bf16" : "f32");
    gpu.ops->free(gpu.ctx, cdev), gpu.ops->free(gpu.ctx, pdev), gpu.ops->free(gpu.ctx, gdev);
    gpu.ops->free(gpu.ctx, kvd), gpu.ops->free(gpu.ctx, kdev), gpu.ops->free(gpu.ctx, vdev);
    free(cache), free(cdev_h), free(g_cpu), free(g_gpu), free(kv), free(k_cpu), free(v_cpu);
    free(kg), free(vg);
}

int main(void) {
    rng_seed("test_mla_mha");
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    if (backend_create(&cpu, "cpu", &bo, &err)) return 1;
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    if (!have_gpu) {
        printf("test_mla_mha: %s; the tests below fail\n", err.msg);
    } else {
        setenv("KILN_CUDA_FA", "fa2", 1);
        knob_reload(NULL); /* knobs are read once; this test compares settings */
        if (backend_create(&gpu_fa2, "cuda", &bo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        unsetenv("KILN_CUDA_FA");
        knob_reload(NULL);
        struct backend *all[] = {&gpu, &gpu_fa2, &cpu};
        for (int i = 0; i < 3; i++)
            if (all[i]->ops->reserve(all[i]->ctx, MAX_TOKENS, MAX_CONTEXT, MAX_HEADS, &err))
                return fprintf(stderr, "reserve: %s\n", err.msg), 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention_192),
                                       cmocka_unit_test(test_gather_expand)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (have_gpu) backend_destroy(&gpu), backend_destroy(&gpu_fa2);
    backend_destroy(&cpu);
    return rc;
}
