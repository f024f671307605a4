/* test_model_cuda.c — whole decode steps of real-shaped dense models on the
 * GPU against the CPU backend.
 *
 * The oracle models that `kiln verify --device cuda` checks have heads of
 * 8–32, so the paths that only open at real shapes never run there: the
 * q|k|v product with rope and the K/V stores in its epilogue (head size
 * 128, no q/k norm, bf16 cache, 1..64 rows), the wgmma products with
 * their K-split plans, the tensor-core decode attention, and the decode
 * graphs recorded and replayed at those sizes. Here small models with
 * head size 128 and dummy weights (the same values on both backends) run
 * the same steps on the CPU (fp32) and on the GPU:
 *
 *   step 0: 64 prompts of 1..97 tokens, one prefill batch;
 *   steps 1..4: 64 decode rows (eager, recorded, replayed, replayed);
 *   steps 5..7: 37 decode rows (bucket 40: three padded rows), then 1.
 *
 * The token fed at each decode step is fixed in advance (not sampled), so
 * both backends see the same inputs whatever their logits. Checked:
 *   - every logit of every sequence at every step within 3% of the step's
 *     largest |logit| (the CPU's), the bf16 budget of docs/cuda-testing.md
 *     ("Accuracy and tolerances"): bf16 activations and cache keep 8
 *     significant bits, 2^-9 relative per element, and the oracle models
 *     land at ~2% of their logit range through three layers; a wrong row,
 *     head, position or page gives errors of the logits' own size;
 *   - llama (llama3 rope scaling) and qwen2 (q|k|v bias) take the fused
 *     epilogue (the rope_fused counter moves), qwen3 (q/k norm) and
 *     KILN_CUDA_WGMMA_ROPE=0 do not;
 *   - fused and unfused runs agree within 0.5% of the range (they differ
 *     by one bf16 rounding of the keys).
 *
 * MoE (the device path, the default KILN_CUDA_MOE=device, whose decode steps record
 * as graphs): qwen3_moe with every token taking all 8 experts against the
 * CPU as above (no expert choice for a rounding to flip); and with top 4
 * of 32, graphs against KILN_GRAPHS=0 bit for bit, and against the host
 * path on at least 90% of the rows (a flipped choice moves a row by O(1)).
 *
 * FP8 (--quantization fp8): llama and qwen3 against the CPU, with and
 * without cuBLASLt's block-scaled FP8, graphs bit for bit (check_fp8).
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
#include "base/knob.h"
#include "base/mem.h"
#include "cache/kv_pool.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"
#include "../step_batch.h"

enum { N_SEQS = 64, PAGE = 16, MAX_PROMPT = 97, MAX_CTX = 256, VOCAB = 512, STEPS = 8 };

/* rows decoding at each step (step 0 is the prefill of all) */
static const int step_rows[STEPS] = {N_SEQS, 64, 64, 64, 64, 37, 37, 1};

#define COMMON                                                                                        \
    "\"hidden_size\": 1024, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128," \
    " \"intermediate_size\": 2816, \"num_hidden_layers\": 2, \"vocab_size\": 512,"                     \
    " \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"       \
    " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": 2"

struct shape {
    const char *name, *config;
    int fused; /* the q|k|v epilogue path must run */
    int moe;   /* MoE layers: their device path must run */
    int mla;   /* MLA decode rows: the MLA decode kernel must run */
};

/* DeepSeek's attention shapes (16 or 32 heads; latent rows of kv_lora 512 +
 * rope 64, so decode rows take the MLA decode kernel) with dense MLPs
 * (first_k_dense_replace = every layer): no expert choice to flip. */
#define MLA_COMMON                                                                                    \
    "\"hidden_size\": 1024, \"num_key_value_heads\": 16, \"kv_lora_rank\": 512,"                       \
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"                        \
    " \"intermediate_size\": 2816, \"num_hidden_layers\": 2, \"first_k_dense_replace\": 2,"             \
    " \"moe_layer_freq\": 1, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"                      \
    " \"moe_intermediate_size\": 256, \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1,"      \
    " \"vocab_size\": 512, \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-6,"                   \
    " \"rope_theta\": 10000, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","            \
    " \"bos_token_id\": 1, \"eos_token_id\": 2"

static const struct shape shapes[] = {
    {"llama", "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], " COMMON
              ", \"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
              " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
              " \"original_max_position_embeddings\": 128}}",
     1, 0, 0},
    {"qwen2", "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], " COMMON
              ", \"rope_theta\": 1000000}",
     1, 0, 0},
    {"qwen3", "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], " COMMON
              ", \"rope_theta\": 1000000}",
     0, 0, 0},
    /* every token takes all 8 experts: no choice for a rounding to flip
     * (a flipped expert moves logits by O(1)), so the CPU comparison holds */
    {"qwen3_moe (top 8 of 8)",
     "{\"model_type\": \"qwen3_moe\", \"architectures\": [\"Qwen3MoeForCausalLM\"], " COMMON
     ", \"rope_theta\": 1000000, \"num_experts\": 8, \"num_experts_per_tok\": 8,"
     " \"moe_intermediate_size\": 256, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1}",
     0, 1, 0},
    /* top 4 of 32: checked against itself without graphs, bit for bit */
    {"qwen3_moe (top 4 of 32)",
     "{\"model_type\": \"qwen3_moe\", \"architectures\": [\"Qwen3MoeForCausalLM\"], " COMMON
     ", \"rope_theta\": 1000000, \"num_experts\": 32, \"num_experts_per_tok\": 4,"
     " \"moe_intermediate_size\": 192, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1}",
     0, 1, 0},
    {"deepseek_v2 (MLA, 16 heads)",
     "{\"model_type\": \"deepseek_v2\", \"architectures\": [\"DeepseekV2ForCausalLM\"], " MLA_COMMON
     ", \"num_attention_heads\": 16, \"q_lora_rank\": null}",
     0, 0, 1},
    {"deepseek_v3 (MLA, 32 heads, q_lora)",
     "{\"model_type\": \"deepseek_v3\", \"architectures\": [\"DeepseekV3ForCausalLM\"], " MLA_COMMON
     ", \"num_attention_heads\": 32, \"q_lora_rank\": 384, \"topk_method\": \"noaux_tc\"}",
     0, 0, 1},
};

static int have_gpu = -1;
static const char *g_quant; /* model_options.quantization of the runs ("fp8": check_fp8) */

struct seq {
    int prompt_len;
    int32_t pages[MAX_CTX / PAGE];
    int32_t ids[MAX_PROMPT + STEPS];
};

/* What the CUDA backend counted during a run. */
struct counts {
    long fp8_lt; /* FP8 products on cuBLASLt's block-scaled FP8 */
    long wg8;    /* FP8 products on the e4m3 wgmma kernel */
    long fused; /* products through the rope epilogue */
    long moe;   /* moe_ffn calls on the device path */
    long mla;   /* MLA decode kernel launches */
};

/* Runs the eight steps on `device` (with env_name=env_value set while the
 * backend and model are made, where given) and stores every sequence's
 * logits of every step at out[(step * N_SEQS + seq) * VOCAB] (rows that
 * did not run stay 0). */
static struct counts run(const char *device, const struct shape *sh, const struct seq *init, float *out,
                         const char *env_name, const char *env_value) {
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    char *saved = env_name && getenv(env_name) ? xstrdup(getenv(env_name)) : NULL;
    if (env_name) setenv(env_name, env_value, 1);
    knob_reload(NULL); /* knobs are read once; this test compares settings */
    if (backend_create(&be, device, &bo, &err)) fail_msg("%s: %s", device, err.msg);
    struct model_config cfg;
    if (model_config_parse(&cfg, sh->config, strlen(sh->config), sh->name, &err)) fail_msg("%s", err.msg);
    struct model_options mo = {.load_format = "dummy", .max_batch_tokens = 8192, .max_seqs = N_SEQS,
                               .max_context = MAX_CTX, .seed = 11, .quantization = g_quant};
    struct model *m;
    if (model_load_dummy(&m, &cfg, &be, &mo, &err)) fail_msg("%s: %s", sh->name, err.msg);
    /* the runner reads its knobs (KILN_GRAPHS) when it is made */
    struct runner_options ro = {.page_size = PAGE, .kv_tokens = N_SEQS * MAX_CTX};
    struct runner *run;
    if (runner_create(&run, m, &ro, &err)) fail_msg("%s", err.msg);
    if (saved) setenv(env_name, saved, 1), free(saved);
    else if (env_name) unsetenv(env_name);
    knob_reload(NULL);
    struct kv_pool *kv = runner_kv(run);
    kv_pool_scramble(kv, 5);
    struct cuda_ctx *c = strcmp(device, "cuda") ? NULL : (struct cuda_ctx *)be.ctx;
    struct counts n0 = {c ? c->fp8_lt_calls : 0, c ? c->wgmma_fp8_calls : 0, c ? c->rope_fused : 0,
                        c ? c->moe_device_calls : 0, c ? c->mla_decode_calls : 0};

    struct seq seqs[N_SEQS];
    memcpy(seqs, init, sizeof seqs);
    struct sb_seq kvs[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) kvs[i] = (struct sb_seq){0, 0, seqs[i].pages, seqs[i].ids};
    struct step_batch sb;
    sb_init(&sb, PAGE, 8192, N_SEQS, N_SEQS * (MAX_CTX / PAGE));
    float *logits = xmalloc((size_t)N_SEQS * VOCAB * 4);
    for (int step = 0; step < STEPS; step++) {
        sb_begin(&sb);
        for (int i = 0; i < step_rows[step]; i++) sb_add(&sb, kv, &kvs[i], step == 0 ? seqs[i].prompt_len : 1);
        struct batch b = sb_batch(&sb);
        if (runner_forward(run, &b, logits, &err)) fail_msg("%s %s step %d: %s", device, sh->name, step, err.msg);
        memcpy(out + (size_t)step * N_SEQS * VOCAB, logits, (size_t)b.n_seqs * VOCAB * 4);
    }
    struct counts n = {c ? c->fp8_lt_calls - n0.fp8_lt : 0, c ? c->wgmma_fp8_calls - n0.wg8 : 0,
                       c ? c->rope_fused - n0.fused : 0, c ? c->moe_device_calls - n0.moe : 0,
                       c ? c->mla_decode_calls - n0.mla : 0};
    for (int i = 0; i < N_SEQS; i++) kv_pool_release(kv, kvs[i].pages, kvs[i].n_pages);
    sb_free(&sb);
    free(logits);
    runner_free(run);
    model_free(m);
    backend_destroy(&be);
    return n;
}

/* Worst |a - ref| over the step's rows, relative to the step's max |ref|;
 * the worst over all steps. */
static double worst_rel(const float *a, const float *ref, int *at_step) {
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        size_t off = (size_t)step * N_SEQS * VOCAB, n = (size_t)step_rows[step] * VOCAB;
        double mx = 0, range = 0;
        for (size_t i = 0; i < n; i++) {
            assert_true(isfinite(a[off + i]));
            double d = fabs((double)a[off + i] - ref[off + i]);
            if (d > mx) mx = d;
            if (fabs(ref[off + i]) > range) range = fabs(ref[off + i]);
        }
        assert_true(range > 0);
        if (mx / range > worst) worst = mx / range, *at_step = step;
    }
    return worst;
}

static void make_init(struct seq *init) {
    memset(init, 0, N_SEQS * sizeof *init);
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N_SEQS; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        init[i].prompt_len = i % 11 == 0 ? 1 : 2 + (int)(st % (MAX_PROMPT - 1));
        for (int k = 0; k < MAX_PROMPT + STEPS; k++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            init[i].ids[k] = (int32_t)(3 + st % (VOCAB - 3));
        }
    }
}

/* The GPU against the CPU, with the rope epilogue on and off. */
static void check_shape(const struct shape *sh) {
    struct seq init[N_SEQS];
    make_init(init);
    size_t n = (size_t)STEPS * N_SEQS * VOCAB;
    float *cpu = xcalloc(n, 4), *fused = xcalloc(n, 4), *plain = xcalloc(n, 4);
    run("cpu", sh, init, cpu, NULL, NULL);
    /* The test model's q|k|v weight (1536 x 1024 bf16, 3 MiB) is below the
     * size from which products take the wgmma kernel (KILN_CUDA_WGMMA_MIN_MB,
     * 40 MiB: smaller weights are faster on cuBLAS), and only that kernel
     * has the rope epilogue: both GPU runs lower the threshold so the
     * epilogue's path is the one compared. */
    setenv("KILN_CUDA_WGMMA_MIN_MB", "0", 1);
    struct counts c_on = run("cuda", sh, init, fused, NULL, NULL);
    struct counts c_off = run("cuda", sh, init, plain, "KILN_CUDA_WGMMA_ROPE", "0");
    unsetenv("KILN_CUDA_WGMMA_MIN_MB");
    int s1 = 0, s2 = 0, s3 = 0;
    double e_fused = worst_rel(fused, cpu, &s1), e_plain = worst_rel(plain, cpu, &s2);
    double e_pair = worst_rel(fused, plain, &s3);
    printf("  %s: GPU vs CPU worst %.4f of the logit range (step %d), with KILN_CUDA_WGMMA_ROPE=0 %.4f "
           "(step %d); fused vs not %.5f (step %d); products through the rope epilogue: %ld (knob off: "
           "%ld); MoE calls on the device path: %ld\n",
           sh->name, e_fused, s1, e_plain, s2, e_pair, s3, c_on.fused, c_off.fused, c_on.moe);
    assert_true(e_fused < 0.03);
    assert_true(e_plain < 0.03);
    assert_true(e_pair < 0.005);
    /* one q|k|v product a layer for each decode step of 3..64 rows the host
     * runs (eager or recorded: steps 1, 2, 5, 6; replays do not count; the
     * one-row step 7 takes the GEMV, which has no epilogue) */
    if (sh->fused) assert_true(c_on.fused >= 2 * 4);
    else assert_int_equal(c_on.fused, 0);
    assert_int_equal(c_off.fused, 0);
    /* the decode steps the host runs, one call a layer (the prefill of
     * every prompt, ~3,000 tokens, takes the host path) */
    if (sh->moe) assert_true(c_on.moe >= 2 * 5);
    /* MLA: one launch a layer for each decode step the host runs (eager or
     * recorded: steps 1, 2, 5, 6, 7) */
    if (sh->mla) assert_true(c_on.mla >= 2 * 5);
    else assert_int_equal(c_on.mla, 0);
    free(cpu), free(fused), free(plain);
}

/* Decode graphs against KILN_GRAPHS=0, bit for bit: the MLA decode kernel
 * (split chunk states, arrival counters) replays exactly as it runs. */
static void check_graphs_exact(const struct shape *sh) {
    struct seq init[N_SEQS];
    make_init(init);
    size_t n = (size_t)STEPS * N_SEQS * VOCAB;
    float *graphs = xcalloc(n, 4), *eager = xcalloc(n, 4);
    struct counts cg = run("cuda", sh, init, graphs, NULL, NULL);
    struct counts ce = run("cuda", sh, init, eager, "KILN_GRAPHS", "0");
    size_t n_diff = 0;
    for (size_t i = 0; i < n; i++) n_diff += memcmp(&graphs[i], &eager[i], 4) != 0;
    printf("  %s: graphs vs KILN_GRAPHS=0: %zu of %zu logits differ; MLA decode launches %ld / %ld\n",
           sh->name, n_diff, n, cg.mla, ce.mla);
    assert_int_equal(n_diff, 0);
    assert_true(ce.mla >= 2 * 7); /* eager: every decode step, each layer */
    free(graphs), free(eager);
}

/* A MoE model whose experts are chosen (top 4 of 32) decoded from graphs
 * and with KILN_GRAPHS=0: the same kernels on the same inputs, so the
 * logits must match to the bit; and against the host path (KILN_CUDA_MOE=host,
 * cuBLAS / GEMV per expert, no graphs) within the bf16 budget on the rows
 * whose experts did not flip, which is nearly all of them. */
static void check_moe_graphs(const struct shape *sh) {
    struct seq init[N_SEQS];
    make_init(init);
    size_t n = (size_t)STEPS * N_SEQS * VOCAB;
    float *graphs = xcalloc(n, 4), *eager = xcalloc(n, 4), *host = xcalloc(n, 4);
    struct counts cg = run("cuda", sh, init, graphs, NULL, NULL);
    struct counts ce = run("cuda", sh, init, eager, "KILN_GRAPHS", "0");
    struct counts ch = run("cuda", sh, init, host, "KILN_CUDA_MOE", "host");
    size_t n_diff = 0;
    for (size_t i = 0; i < n; i++) n_diff += memcmp(&graphs[i], &eager[i], 4) != 0;
    /* rows (one sequence at one step) within 3% of their own range */
    int rows = 0, close = 0;
    for (int step = 0; step < STEPS; step++)
        for (int r = 0; r < step_rows[step]; r++) {
            const float *a = host + ((size_t)step * N_SEQS + r) * VOCAB, *b = graphs + ((size_t)step * N_SEQS + r) * VOCAB;
            double mx = 0, range = 0;
            for (int v = 0; v < VOCAB; v++) {
                mx = fmax(mx, fabs((double)a[v] - b[v]));
                range = fmax(range, fabs((double)a[v]));
            }
            rows++;
            close += mx <= 0.03 * range;
        }
    printf("  %s: graphs vs KILN_GRAPHS=0: %zu of %zu logits differ; device vs host path: %d of %d rows "
           "within 3%% of their range; MoE calls on the device path: %ld / %ld / %ld\n",
           sh->name, n_diff, n, close, rows, cg.moe, ce.moe, ch.moe);
    assert_int_equal(n_diff, 0);
    assert_true(close >= rows * 9 / 10);
    /* with graphs, replays do not call: steps 1, 2, 5, 6, 7 a layer each;
     * eager, all seven decode steps */
    assert_true(cg.moe >= 2 * 5);
    assert_true(ce.moe >= 2 * 7);
    assert_int_equal(ch.moe, 0);
    free(graphs), free(eager), free(host);
}

/* FP8 weights (--quantization fp8 on the dummy weights: the GPU makes them
 * on the device, the CPU quantizes the same values on the host, the same
 * bytes; every projection FP8 in 128 x 128 blocks, the stacks whole
 * blocks). The GPU against the CPU (which computes the FP8 weights exactly
 * in fp32): with KILN_CUDA_WGMMA_FP8=0 and KILN_CUDA_FP8_LT=0 every
 * product of more than 4 rows rounds its activations and dequantized
 * weights to bf16, two 2^-9 roundings where the bf16 models have one: the
 * bf16 budget of 3% times sqrt(2), 5%; by default those products run on
 * the e4m3 wgmma kernel on Hopper (else the prefill's, more than 64 rows,
 * on cuBLASLt's block-scaled FP8), with e4m3 activations (2^-4 a value,
 * ~2.5e-2 RMS a product, four products a layer in two chains, two layers,
 * and the keys and values they wrote carried into every decode step): 15%. A
 * wrong block scale, row or position moves logits by their own size.
 * Decode graphs against KILN_GRAPHS=0 bit for bit on the steps of 64 and 1
 * rows (the FP8 kernels run one plan for one row count).
 * Where the e4m3 kernel runs, the shapes that fuse rope into the q|k|v
 * product do so on it too. */
static void check_fp8(const struct shape *sh) {
    struct seq init[N_SEQS];
    make_init(init);
    size_t n = (size_t)STEPS * N_SEQS * VOCAB;
    float *cpu = xcalloc(n, 4), *g = xcalloc(n, 4), *eager = xcalloc(n, 4), *nolt = xcalloc(n, 4);
    g_quant = "fp8";
    run("cpu", sh, init, cpu, NULL, NULL);
    struct counts cg = run("cuda", sh, init, g, NULL, NULL);
    run("cuda", sh, init, eager, "KILN_GRAPHS", "0");
    setenv("KILN_CUDA_WGMMA_FP8", "0", 1);
    struct counts cn = run("cuda", sh, init, nolt, "KILN_CUDA_FP8_LT", "0");
    unsetenv("KILN_CUDA_WGMMA_FP8");
    knob_reload(NULL);
    g_quant = NULL;
    int s1 = 0, s2 = 0;
    double e = worst_rel(g, cpu, &s1), e_nolt = worst_rel(nolt, cpu, &s2);
    /* the steps whose batch is not padded to a graph bucket (64 and 1
     * rows): the padded 37-row steps run lm_head (bf16, cuBLAS) at 40
     * rows, whose plan may differ from the 37-row one */
    size_t n_diff = 0, n_cmp = 0;
    for (int step = 0; step < STEPS; step++) {
        if (step_rows[step] != 64 && step_rows[step] != 1) continue;
        size_t off = (size_t)step * N_SEQS * VOCAB, cnt = (size_t)step_rows[step] * VOCAB;
        for (size_t i = 0; i < cnt; i++) n_diff += memcmp(&g[off + i], &eager[off + i], 4) != 0;
        n_cmp += cnt;
    }
    printf("  %s FP8: GPU vs CPU worst %.4f of the logit range (step %d; %ld products on cuBLASLt's "
           "FP8, %ld on the e4m3 wgmma kernel), with KILN_CUDA_WGMMA_FP8=0 KILN_CUDA_FP8_LT=0 %.4f "
           "(step %d); graphs vs KILN_GRAPHS=0: %zu of %zu logits differ\n",
           sh->name, e, s1, cg.fp8_lt, cg.wg8, e_nolt, s2, n_diff, n_cmp);
    assert_true(e < 0.15);
    assert_true(e_nolt < 0.05);
    assert_int_equal(cn.fp8_lt, 0);
    assert_int_equal(cn.wg8, 0);
    /* the e4m3 q|k|v product with rope and the K/V stores in its epilogue */
    if (sh->fused && cg.wg8 > 0) assert_true(cg.fused > 0);
    assert_int_equal(n_diff, 0);
    free(cpu), free(g), free(eager), free(nolt);
}

#define NEED_GPU() \
    if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)")

static void test_llama(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[0]); }
static void test_qwen2(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[1]); }
static void test_llama_fp8(void **state) { (void)state; NEED_GPU(); check_fp8(&shapes[0]); }
static void test_qwen3_fp8(void **state) { (void)state; NEED_GPU(); check_fp8(&shapes[2]); }
static void test_qwen3(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[2]); }
static void test_qwen3_moe_all(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[3]); }
static void test_qwen3_moe_graphs(void **state) { (void)state; NEED_GPU(); check_moe_graphs(&shapes[4]); }
static void test_deepseek_v2(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[5]); }
static void test_deepseek_v3(void **state) { (void)state; NEED_GPU(); check_shape(&shapes[6]); }
static void test_deepseek_graphs(void **state) { (void)state; NEED_GPU(); check_graphs_exact(&shapes[5]); }

int main(void) {
    struct kiln_error err = {0};
    setenv("KILN_CUDA_MOE", "device", 1); /* the default, whatever the environment says */
    knob_reload(NULL);
    struct backend be;
    struct backend_options bo = {0};
    have_gpu = backend_create(&be, "cuda", &bo, &err) == 0;
    if (have_gpu) backend_destroy(&be);
    else printf("test_model_cuda: %s; the tests below fail\n", err.msg);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_llama), cmocka_unit_test(test_qwen2),
                                       cmocka_unit_test(test_qwen3), cmocka_unit_test(test_qwen3_moe_all),
                                       cmocka_unit_test(test_qwen3_moe_graphs),
                                       cmocka_unit_test(test_deepseek_v2), cmocka_unit_test(test_deepseek_v3),
                                       cmocka_unit_test(test_deepseek_graphs),
                                       cmocka_unit_test(test_llama_fp8), cmocka_unit_test(test_qwen3_fp8)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
