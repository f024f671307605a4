/* test_cuda_oom.c — a step that cannot get its device memory fails, with
 * the numbers, and the runner goes on.
 *
 * Two runners of the same small dense model (dummy weights, no warm-up),
 * each on its own backend. A runs the steps below and keeps their logits;
 * running everything first also loads every kernel B will launch (loading
 * a kernel takes device memory too). Then B: a 32-token prefill of
 * sequence 1; the device filled with ballast (cudaMalloc in halving
 * chunks down to 1 MiB, then the stream-ordered pool's own slack the same
 * way) so that well under a MiB is free; an 8192-token prefill of
 * sequence 2, whose 16-bit activations (16 MiB and more) must grow:
 * runner_forward returns -1 with KILN_ERR_OUT_OF_MEMORY and a message
 * naming the bytes and the device's memory, and the process does not
 * abort. With the ballast still there, smaller steps run normally (a
 * 24-token chunk of sequence 1, one decode step); the ballast freed, the
 * same 8192-token prefill succeeds; then decode steps of both sequences
 * (eager, recorded as a graph, replayed). Every step that succeeds on B
 * must give A's logits bit for bit (same kernels, same inputs).
 *
 * Without the fault handling the big step aborts the process (assertion
 * failed: cudaMallocAsync ... out of memory), or returns 0.
 *
 * Label gpu; fails without a GPU (run it with ctest -L gpu on the GPU machine). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

enum { PAGE = 16, BIG = 8192, MAX_CTX = BIG + 64, VOCAB = 512, SMALL = 32, CHUNK = 24 };

static const char config[] =
    "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"],"
    " \"hidden_size\": 1024, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128,"
    " \"intermediate_size\": 2816, \"num_hidden_layers\": 2, \"vocab_size\": 512,"
    " \"max_position_embeddings\": 16384, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": 2, \"rope_theta\": 500000}";

static int have_gpu = -1;

/* A backend, a model on it and a runner (no warm-up) with two sequences. */
struct rig {
    struct backend be;
    struct model *m;
    struct runner *run;
    struct step_batch sb;
    struct sb_seq seq[2];
    int32_t pages[2][MAX_CTX / PAGE + 1];
    float *logits; /* [2][VOCAB] */
};

static int32_t ids[2][MAX_CTX];

static void rig_open(struct rig *g) {
    struct kiln_error err = {0};
    struct backend_options bo = {0};
    memset(g, 0, sizeof *g);
    if (backend_create(&g->be, "cuda", &bo, &err)) fail_msg("cuda: %s", err.msg);
    struct model_config cfg;
    if (model_config_parse(&cfg, config, strlen(config), "llama", &err)) fail_msg("%s", err.msg);
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = BIG, .max_seqs = 2,
                               .max_context = MAX_CTX, .seed = 7};
    if (model_load_dummy(&g->m, &cfg, &g->be, &mo, &err)) fail_msg("%s", err.msg);
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = 2 * (MAX_CTX + PAGE)};
    if (runner_create(&g->run, g->m, &ro, &err)) fail_msg("%s", err.msg);
    sb_init(&g->sb, PAGE, BIG, 2, 2 * (MAX_CTX / PAGE + 1));
    for (int i = 0; i < 2; i++) g->seq[i] = (struct sb_seq){0, 0, g->pages[i], ids[i]};
    g->logits = xmalloc((size_t)2 * VOCAB * 4);
}

static void rig_close(struct rig *g) {
    for (int i = 0; i < 2; i++) kv_pool_release(runner_kv(g->run), g->seq[i].pages, g->seq[i].n_pages);
    sb_free(&g->sb);
    free(g->logits);
    runner_free(g->run);
    model_free(g->m);
    backend_destroy(&g->be);
}

/* One step: new[i] tokens of sequence i (0: not in the step). Returns
 * runner_forward's result; on failure the sequences' lengths are put back
 * (the scheduler does the same: n_computed moves only after a step). */
static int step(struct rig *g, int new0, int new1, struct kiln_error *err) {
    int n[2] = {new0, new1}, len[2] = {g->seq[0].len, g->seq[1].len};
    sb_begin(&g->sb);
    for (int i = 0; i < 2; i++)
        if (n[i]) sb_add(&g->sb, runner_kv(g->run), &g->seq[i], n[i]);
    struct batch b = sb_batch(&g->sb);
    int rc = runner_forward(g->run, &b, g->logits, err);
    if (rc)
        for (int i = 0; i < 2; i++) g->seq[i].len = len[i];
    return rc;
}

/* The steps both runners take (B's failing one aside), in order. */
struct plan_step {
    int new0, new1;
};
static const struct plan_step plan[] = {
    {SMALL, 0}, /* 0: B runs it before the ballast */
    {0, BIG},   /* 1: fails on B under the ballast, succeeds after */
    {CHUNK, 0}, /* 2, 3: under the ballast on B */
    {1, 0},
    {1, 1},     /* 4..: decode of both, eager, recorded, replayed */
    {1, 1},
    {1, 1},
};
enum { N_PLAN = sizeof plan / sizeof plan[0] };

static void *ballast[8192];
static unsigned char from_pool[8192];
static int n_ballast;
static cudaStream_t ballast_stream;

/* Takes device memory until (almost) none is left: plain allocations, then
 * the slack of the stream-ordered pool the backend's scratch comes from. */
static void fill_device(void) {
    n_ballast = 0;
    for (int pool = 0; pool < 2; pool++) {
        size_t chunk = pool ? (size_t)256 << 20 : (size_t)1 << 30, least = pool ? 64 << 10 : 1 << 20;
        while (chunk >= least && n_ballast < (int)(sizeof ballast / sizeof ballast[0])) {
            void *p = NULL;
            cudaError_t e = pool ? cudaMallocAsync(&p, chunk, ballast_stream) : cudaMalloc(&p, chunk);
            if (e == cudaSuccess) {
                from_pool[n_ballast] = (unsigned char)pool;
                ballast[n_ballast++] = p;
                continue;
            }
            assert_int_equal(e, cudaErrorMemoryAllocation);
            (void)cudaGetLastError();
            chunk /= 2;
        }
        assert_int_equal(cudaStreamSynchronize(ballast_stream), cudaSuccess);
    }
}

static void free_device(void) {
    for (int i = 0; i < n_ballast; i++)
        assert_int_equal(from_pool[i] ? cudaFreeAsync(ballast[i], ballast_stream) : cudaFree(ballast[i]),
                         cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(ballast_stream), cudaSuccess);
    n_ballast = 0;
}

static void check_same(const float *got, const float *want, int rows, int at) {
    if (memcmp(got, want, (size_t)rows * VOCAB * 4) == 0) return;
    int diff = 0;
    for (int i = 0; i < rows * VOCAB; i++) diff += memcmp(&got[i], &want[i], 4) != 0;
    fail_msg("step %d: %d of %d logits differ from the fresh runner's", at, diff, rows * VOCAB);
}

static void test_step_out_of_memory(void **state) {
    (void)state;
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)");
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < MAX_CTX; k++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            ids[i][k] = (int32_t)(3 + st % (VOCAB - 3));
        }
    struct kiln_error err = {0};

    /* A: every step, fresh scratch at each size */
    struct rig a;
    rig_open(&a);
    float *want = xcalloc((size_t)N_PLAN * 2 * VOCAB, 4);
    for (int s = 0; s < N_PLAN; s++) {
        if (step(&a, plan[s].new0, plan[s].new1, &err)) fail_msg("A step %d: %s", s, err.msg);
        int rows = !!plan[s].new0 + !!plan[s].new1;
        memcpy(want + (size_t)s * 2 * VOCAB, a.logits, (size_t)rows * VOCAB * 4);
        double range = 0;
        for (int i = 0; i < rows * VOCAB; i++) {
            assert_true(isfinite(a.logits[i]));
            range = fmax(range, fabs(a.logits[i]));
        }
        assert_true(range > 0);
    }

    struct rig b;
    rig_open(&b);
    assert_int_equal(cudaStreamCreateWithFlags(&ballast_stream, cudaStreamNonBlocking), cudaSuccess);
    if (step(&b, plan[0].new0, plan[0].new1, &err)) fail_msg("B step 0: %s", err.msg);
    check_same(b.logits, want, 1, 0);

    fill_device();
    size_t fr = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&fr, &total), cudaSuccess);
    printf("  ballast: %d allocations; %.2f MiB of %.2f GiB free\n", n_ballast, fr / 1048576.0,
           total / 1073741824.0);
    /* the big step's first 16-bit activations alone take 16 MiB */
    assert_true(fr < ((size_t)8 << 20));

    memset(&err, 0, sizeof err);
    assert_int_equal(step(&b, plan[1].new0, plan[1].new1, &err), -1);
    printf("  %d-token prefill under the ballast: %s (%s)\n", BIG, err.msg, kiln_error_code_name(err.code));
    assert_int_equal(err.code, KILN_ERR_OUT_OF_MEMORY);
    double mib = 0, used = 0, all = 0;
    const char *at = strstr(err.msg, "device out of memory: ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "device out of memory: %lf MiB for", &mib), 1);
    assert_true(mib >= 8.0); /* one of the step's activation copies: 16 MiB or more */
    assert_non_null(strstr(err.msg, "-row product"));
    at = strrchr(err.msg, '(');
    assert_non_null(at);
    assert_int_equal(sscanf(at, "(%lf GiB in use of %lf GiB)", &used, &all), 2);
    assert_true(all > 1.0 && used <= all && used > all - 0.5); /* nearly all of it in use */

    /* smaller steps still run under the ballast, and give A's bits */
    for (int s = 2; s <= 3; s++) {
        if (step(&b, plan[s].new0, plan[s].new1, &err)) fail_msg("B step %d under the ballast: %s", s, err.msg);
        check_same(b.logits, want + (size_t)s * 2 * VOCAB, 1, s);
    }

    free_device();
    if (step(&b, plan[1].new0, plan[1].new1, &err)) fail_msg("B step 1 after the ballast: %s", err.msg);
    check_same(b.logits, want + (size_t)1 * 2 * VOCAB, 1, 1);
    for (int s = 4; s < N_PLAN; s++) {
        if (step(&b, plan[s].new0, plan[s].new1, &err)) fail_msg("B step %d: %s", s, err.msg);
        check_same(b.logits, want + (size_t)s * 2 * VOCAB, 2, s);
    }
    assert_int_equal(cudaStreamDestroy(ballast_stream), cudaSuccess);
    free(want);
    rig_close(&b);
    rig_close(&a);
}

int main(void) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    have_gpu = backend_create(&be, "cuda", &bo, &err) == 0;
    if (have_gpu) backend_destroy(&be);
    else printf("test_cuda_oom: %s; the test below fails\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_step_out_of_memory)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
