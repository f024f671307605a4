/* test_fp8_load.c — FP8 block-quantized weights at load (model/weights.c).
 *   - A checkpoint in the DeepSeek-V3 / Qwen3-FP8 format (F8_E4M3 weights
 *     with `<name>_scale_inv` block scales in F32, BF16 or F16) loads as FP8
 *     in place: every element, dequantized through struct backend_weight's
 *     layout, is the fp8 value written times the scale written for its
 *     block, with 16x32 blocks (not square, so a transposed layout shows)
 *     that are partial at the edges in both dimensions; the bf16 tensors
 *     beside them load as before; the weight bytes count the scales;
 *     --quantization fp8 changes nothing on it.
 *   - Refusals name the file and the tensor: a scale missing, mis-shaped,
 *     of a bad dtype or not finite; F8 without an fp8 quantization_config;
 *     F8_E5M2; a backend without FP8 weights; stacked FP8 matrices on a
 *     backend that copies; --quantization other than fp8.
 *   - --quantization fp8 on bf16 weights (a checkpoint, dummy weights, a
 *     MoE model): the projections become FP8 with scale = max|w| / 448 per
 *     block and every element within e4m3's rounding of its value (the
 *     bound is derived at check_quantized); embeddings, lm_head, routers,
 *     gates and the modules quantization_config lists as not converted
 *     stay as they were.
 * The CPU backend's table is copied with fp8_weights (and weights_in_place)
 * set as each case needs: loading needs no FP8 products. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "ckpt_writer.h"

#define assert_contains(hay, needle)                                                        \
    do {                                                                                    \
        if (!strstr((hay), (needle)))                                                       \
            fail_msg("message \"%s\" does not contain \"%s\"", (hay), (needle));            \
    } while (0)

/* A llama of one layer: q [48][48], k and v [24][48], o [48][48], gate and
 * up [40][48], down [48][40]; 16x32 blocks leave partial rows (k, v: 24 =
 * 16 + 8) and partial columns (48 = 32 + 16, 40 = 32 + 8). */
enum { V = 32, D = 48, F = 40, B0 = 16, B1 = 32, N_PROJ = 7 };
static const char *const proj_names[N_PROJ] = {
    "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight"};
static const long proj_rows[N_PROJ] = {D, 24, 24, D, F, F, D};
static const long proj_cols[N_PROJ] = {D, D, D, D, D, D, F};

static const struct backend_weight *proj_of(const struct model *m, int i) {
    const struct layer *L = &m->layers[0];
    const struct backend_weight *w[N_PROJ] = {&L->mha.wq,    &L->mha.wk,    &L->mha.wv,   &L->mha.wo,
                                              &L->dense.gate, &L->dense.up, &L->dense.down};
    return w[i];
}

/* ---- checkpoints on disk -------------------------------------------------- */


static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float next_unit(void) { return (float)next_u32() / 4294967296.0f * 2.0f - 1.0f; }

static struct tensor *add(struct ckpt *c, const char *name, const char *dtype, int ndim, long d0,
                          long d1, size_t es) {
    return ckpt_add(c, name, dtype, ndim, (const long[]){d0, d1}, es);
}


static void add_bf16(struct ckpt *c, const char *name, int ndim, long d0, long d1, float fill) {
    struct tensor *t = add(c, name, "BF16", ndim, d0, d1, 2);
    uint16_t *p = (uint16_t *)t->data;
    for (size_t i = 0; i < t->nbytes / 2; i++) p[i] = f32_to_bf16(isnan(fill) ? next_unit() : fill);
}

static json_t *llama_config(int fp8) {
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:b, s:s, s:i}",
                          "model_type", "llama", "vocab_size", V, "hidden_size", D,
                          "num_hidden_layers", 1, "num_attention_heads", 2, "num_key_value_heads", 1,
                          "head_dim", 24, "intermediate_size", F, "max_position_embeddings", 64,
                          "rms_norm_eps", 1e-6, "tie_word_embeddings", 0, "torch_dtype", "bfloat16",
                          "eos_token_id", 2);
    if (fp8)
        json_object_set_new(j, "quantization_config",
                            json_pack("{s:s, s:s, s:s, s:[i, i]}", "quant_method", "fp8", "fmt", "e4m3",
                                      "activation_scheme", "dynamic", "weight_block_size", B0, B1));
    return j;
}

/* Embeddings, lm_head and norms in bf16 (the parts an FP8 checkpoint keeps). */
static void add_common(struct ckpt *c) {
    add_bf16(c, "model.embed_tokens.weight", 2, V, D, NAN);
    add_bf16(c, "lm_head.weight", 2, V, D, NAN);
    add_bf16(c, "model.norm.weight", 1, D, 0, 1.0f);
    add_bf16(c, "model.layers.0.input_layernorm.weight", 1, D, 0, 1.0f);
    add_bf16(c, "model.layers.0.post_attention_layernorm.weight", 1, D, 0, 1.0f);
}

static long nblk(long n, long b) { return (n + b - 1) / b; }

/* An FP8 checkpoint: random e4m3 bytes (no NaN), scale [i][j] = 0.5 +
 * 0.25 i + 0.0625 j (exact in every scale dtype); o_proj's scales in
 * BF16, down_proj's in F16, the others F32. */
static void make_fp8(struct ckpt *c) {
    memset(c, 0, sizeof *c);
    c->config = llama_config(1);
    add_common(c);
    for (int p = 0; p < N_PROJ; p++) {
        struct tensor *t = add(c, proj_names[p], "F8_E4M3", 2, proj_rows[p], proj_cols[p], 1);
        for (size_t i = 0; i < t->nbytes; i++) {
            uint8_t b = (uint8_t)next_u32();
            t->data[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
        }
        long nr = nblk(proj_rows[p], B0), nc = nblk(proj_cols[p], B1);
        char name[160];
        snprintf(name, sizeof name, "%s_scale_inv", proj_names[p]);
        const char *dt = p == 3 ? "BF16" : p == 6 ? "F16" : "F32";
        struct tensor *s = add(c, name, dt, 2, nr, nc, p == 3 || p == 6 ? 2 : 4);
        for (long i = 0; i < nr; i++)
            for (long j = 0; j < nc; j++) {
                float v = 0.5f + 0.25f * (float)i + 0.0625f * (float)j;
                long k = i * nc + j;
                if (p == 3) ((uint16_t *)s->data)[k] = f32_to_bf16(v);
                else if (p == 6) ((uint16_t *)s->data)[k] = f32_to_f16(v);
                else ((float *)s->data)[k] = v;
            }
    }
}

/* A bf16 checkpoint whose blocks differ in magnitude (2^0 .. 2^-4), with
 * q_proj's block (1, 1) all zeros and gate_proj's first block spanning
 * e4m3's subnormals (one value 1, the rest near 1e-5). */
static void make_bf16(struct ckpt *c, int fp8_config) {
    memset(c, 0, sizeof *c);
    c->config = llama_config(fp8_config);
    add_common(c);
    for (int p = 0; p < N_PROJ; p++) {
        long R = proj_rows[p], C = proj_cols[p];
        struct tensor *t = add(c, proj_names[p], "BF16", 2, R, C, 2);
        uint16_t *w = (uint16_t *)t->data;
        for (long r = 0; r < R; r++)
            for (long k = 0; k < C; k++) {
                float v = ldexpf(next_unit(), -(int)((r / B0 + k / B1 + p) % 5));
                if (p == 0 && r / B0 == 1 && k / B1 == 1) v = 0;
                if (p == 4 && r < B0 && k < B1) v = r == 3 && k == 5 ? 1.0f : next_unit() * 2e-5f;
                w[r * C + k] = f32_to_bf16(v);
            }
    }
}

static char *write_ckpt(struct ckpt *c) { return ckpt_write(c, "fp8"); }



/* ---- loading ---------------------------------------------------------- */

static struct backend be;
static struct backend_ops ops;

static int setup(void **state) {
    (void)state;
    struct backend_options bo = {.n_threads = 1};
    struct kiln_error err = {0};
    if (backend_create(&be, "cpu", &bo, &err)) return -1;
    ops = *be.ops;
    be.ops = &ops;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    backend_destroy(&be);
    return 0;
}

/* Loads dir (a folder, or a config.json for dummy weights) on the CPU with
 * the given FP8 capability and weight placement. */
static int load(struct model **m, const char *dir, const char *quant, int fp8, int in_place,
                struct kiln_error *err) {
    ops.fp8_weights = fp8;
    ops.weights_in_place = in_place;
    size_t n = strlen(dir);
    struct model_options mo = {.max_batch_tokens = 4, .max_seqs = 1, .max_context = 16,
                               .quantization = quant,
                               .load_format = n > 5 && !strcmp(dir + n - 5, ".json") ? "dummy" : "auto"};
    err->msg[0] = 0;
    return model_load(m, dir, &be, &mo, err);
}

static struct model *load_ok(const char *dir, const char *quant) {
    struct model *m;
    struct kiln_error err;
    if (load(&m, dir, quant, 1, 1, &err)) fail_msg("%s: %s", dir, err.msg);
    return m;
}

static void expect_refused(struct ckpt *c, const char *quant, int fp8, int in_place, const char *want) {
    char *dir = write_ckpt(c);
    struct model *m = (struct model *)1;
    struct kiln_error err;
    if (load(&m, dir, quant, fp8, in_place, &err) == 0) fail_msg("loaded; expected \"%s\"", want);
    assert_null(m);
    assert_contains(err.msg, want);
    free_ckpt(c);
    rm_rf(dir);
}

static float scale_at(const struct tensor *s, long k) {
    if (!strcmp(s->dtype, "BF16")) return bf16_to_f32(((const uint16_t *)s->data)[k]);
    if (!strcmp(s->dtype, "F16")) return f16_to_f32(((const uint16_t *)s->data)[k]);
    return ((const float *)s->data)[k];
}

static float elem(const struct backend_weight *w, long r, long k) {
    long nc = nblk(w->cols, w->block_cols);
    const uint8_t *q = w->data;
    return fp8_e4m3_to_f32(q[r * w->cols + k]) * w->scale[(r / w->block_rows) * nc + k / w->block_cols];
}

/* ---- the cases ------------------------------------------------------------- */

static void test_fp8_checkpoint(void **state) {
    (void)state;
    struct ckpt c;
    make_fp8(&c);
    char *dir = write_ckpt(&c);
    for (int with_option = 0; with_option < 2; with_option++) {
        struct model *m = load_ok(dir, with_option ? "fp8" : NULL);
        size_t bytes = 2 * (size_t)V * D * 2 + 3 * (size_t)D * 4;
        for (int p = 0; p < N_PROJ; p++) {
            const struct backend_weight *w = proj_of(m, p);
            long R = proj_rows[p], C = proj_cols[p], nc = nblk(C, B1);
            assert_int_equal(w->dtype, DTYPE_F8_E4M3);
            assert_int_equal(w->rows, R);
            assert_int_equal(w->cols, C);
            assert_int_equal(w->block_rows, B0);
            assert_int_equal(w->block_cols, B1);
            assert_non_null(w->scale);
            const struct tensor *t = find(&c, proj_names[p]);
            char sn[160];
            snprintf(sn, sizeof sn, "%s_scale_inv", proj_names[p]);
            const struct tensor *s = find(&c, sn);
            assert_memory_equal(w->data, t->data, t->nbytes); /* the bytes written, not requantized */
            for (long r = 0; r < R; r++)
                for (long k = 0; k < C; k++) {
                    float want = fp8_e4m3_to_f32(t->data[r * C + k]) * scale_at(s, (r / B0) * nc + k / B1);
                    float got = elem(w, r, k);
                    if (memcmp(&got, &want, 4))
                        fail_msg("%s [%ld][%ld]: %g, written %g", proj_names[p], r, k, got, want);
                }
            bytes += (size_t)(R * C) + (size_t)(nblk(R, B0) * nc) * 4;
        }
        assert_int_equal(m->embed.dtype, DTYPE_BF16);
        assert_null(m->embed.scale);
        assert_int_equal(m->lm_head.dtype, DTYPE_BF16);
        assert_int_equal(m->cfg.quant.method, MODEL_QUANT_FP8);
        assert_int_equal(model_weight_bytes(m), bytes);
        model_free(m);
    }
    free_ckpt(&c);
    rm_rf(dir);
}

static void test_refusals(void **state) {
    (void)state;
    struct ckpt c;
    make_fp8(&c);
    find(&c, "model.layers.0.self_attn.o_proj.weight_scale_inv")->drop = 1;
    expect_refused(&c, NULL, 1, 1,
                   "model.safetensors: tensor 'model.layers.0.self_attn.o_proj.weight' is FP8 but its "
                   "block scales 'model.layers.0.self_attn.o_proj.weight_scale_inv' are missing");

    /* q_proj's scales are [3][2]: transposed, cut short, flat */
    static const long shapes[3][3] = {{2, 2, 3}, {2, 3, 1}, {1, 6, 0}};
    static const char *const seen[3] = {"[2, 3]", "[3, 1]", "[6]"};
    for (int i = 0; i < 3; i++) {
        make_fp8(&c);
        struct tensor *s = find(&c, "model.layers.0.self_attn.q_proj.weight_scale_inv");
        s->ndim = (int)shapes[i][0], s->shape[0] = shapes[i][1], s->shape[1] = shapes[i][2];
        s->nbytes = (size_t)(shapes[i][1] * (s->ndim > 1 ? shapes[i][2] : 1)) * 4;
        char want[256];
        snprintf(want, sizeof want,
                 "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' has "
                 "shape %s, expected [3, 2]: one scale per 16x32 block (quantization_config "
                 "weight_block_size) of 'model.layers.0.self_attn.q_proj.weight' [48, 48]",
                 seen[i]);
        expect_refused(&c, NULL, 1, 1, want);
    }
    make_fp8(&c);
    snprintf(find(&c, "model.layers.0.mlp.gate_proj.weight_scale_inv")->dtype, 12, "I32");
    expect_refused(&c, NULL, 1, 1,
                   "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight_scale_inv' has "
                   "dtype I32, expected F32, BF16 or F16 (the block scales of "
                   "'model.layers.0.mlp.gate_proj.weight')");
    make_fp8(&c);
    ((float *)find(&c, "model.layers.0.self_attn.k_proj.weight_scale_inv")->data)[2] = INFINITY;
    expect_refused(&c, NULL, 1, 1,
                   "tensor 'model.layers.0.self_attn.k_proj.weight_scale_inv' has a non-finite scale "
                   "(inf) at block [1, 0]");
    make_fp8(&c);
    json_object_del(c.config, "quantization_config");
    expect_refused(&c, NULL, 1, 1,
                   "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but "
                   "config.json has no fp8 quantization_config");
    make_fp8(&c);
    snprintf(find(&c, "model.layers.0.self_attn.v_proj.weight")->dtype, 12, "F8_E5M2");
    expect_refused(&c, NULL, 1, 1,
                   "model.safetensors: tensor 'model.layers.0.self_attn.v_proj.weight' has dtype "
                   "F8_E5M2, expected BF16, F16, F32 or F8_E4M3");
    make_fp8(&c);
    expect_refused(&c, NULL, 0, 1,
                   "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' is FP8 "
                   "(quantization_config fp8): the cpu backend does not run FP8 weights yet; use "
                   "--device cpu");
    make_fp8(&c); /* an FP8 embedding table (scales and all) */
    struct tensor *e = find(&c, "model.embed_tokens.weight");
    snprintf(e->dtype, sizeof e->dtype, "F8_E4M3");
    e->nbytes /= 2;
    memset(e->data, 0x38, e->nbytes);
    add(&c, "model.embed_tokens.weight_scale_inv", "F32", 2, nblk(V, B0), nblk(D, B1), 4);
    expect_refused(&c, NULL, 1, 1,
                   "model.safetensors: tensor 'model.embed_tokens.weight' is FP8: the embedding table "
                   "must be BF16, F16 or F32");
    make_bf16(&c, 0);
    expect_refused(&c, "awq", 1, 1, "--quantization 'awq' is not supported (only fp8");
    make_bf16(&c, 0);
    expect_refused(&c, "fp8", 0, 1,
                   "--quantization fp8: the cpu backend does not run FP8 weights yet; use --device cpu");
}

/* A backend that stacks q|k|v and gate|up (weights not in place): each
 * stack is one FP8 matrix holding the parts' own codes and scales, the
 * weights the CPU (parts in place) computes with, element for element:
 * an FP8 checkpoint (16-row blocks; k_proj's 24 rows start v_proj inside
 * a block, so the stack's blocks are 8 rows), --quantization fp8 on a bf16
 * one (128-row blocks: 8-row ones again) and dummy weights. */
static void expect_stacks_match(const struct model *stacked, const struct model *parts) {
    const struct layer *S = &stacked->layers[0];
    const struct backend_weight *cat[2] = {&S->mha.wqkv, &S->dense.gate_up};
    const int first[2] = {0, 4}, n_parts[2] = {3, 2};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(cat[k]->dtype, DTYPE_F8_E4M3);
        long r0 = 0;
        for (int p = first[k]; p < first[k] + n_parts[k]; p++) {
            const struct backend_weight *w = proj_of(parts, p);
            assert_int_equal(w->dtype, DTYPE_F8_E4M3);
            for (long r = 0; r < w->rows; r++)
                for (long c = 0; c < w->cols; c++)
                    if (memcmp(&(float){elem(cat[k], r0 + r, c)}, &(float){elem(w, r, c)}, 4))
                        fail_msg("%s [%ld][%ld]: %g in the stack, %g alone", proj_names[p], r, c,
                                 elem(cat[k], r0 + r, c), elem(w, r, c));
            r0 += w->rows;
        }
        assert_int_equal(cat[k]->rows, r0);
    }
}

static char *write_config(json_t *config);

static void test_fp8_stacked(void **state) {
    (void)state;
    struct ckpt c;
    struct kiln_error err;
    struct model *a, *b;
    for (int kind = 0; kind < 3; kind++) {
        char *dir, *cfg = NULL;
        const char *quant = kind == 0 ? NULL : "fp8";
        if (kind < 2) {
            if (kind == 0) make_fp8(&c);
            else make_bf16(&c, 0);
            dir = write_ckpt(&c);
        } else {
            dir = cfg = write_config(llama_config(0));
        }
        if (load(&a, dir, quant, 1, 0, &err)) fail_msg("stacked: %s", err.msg);
        if (load(&b, dir, quant, 1, 1, &err)) fail_msg("in place: %s", err.msg);
        expect_stacks_match(a, b);
        assert_int_equal(a->layers[0].mha.wqkv.block_rows, 8);
        model_free(a);
        model_free(b);
        if (kind < 2) {
            free_ckpt(&c);
            rm_rf(dir);
        } else {
            unlink(cfg);
            *strrchr(cfg, '/') = 0;
            rm_rf(cfg);
        }
    }
}

/* w (FP8, br x bc blocks) against the values it was made from. Per block,
 * scale must be max(max|x|, 1e-12) / 448 in fp32, as quantized. Per
 * element, x' = fl(w / scale) has |x'| <= 448 (the block's largest
 * element lands on 448, saturation takes a rounding above it). e4m3 keeps
 * 3 mantissa bits: on [2^e, 2^(e+1)), e >= -6, its values are 2^(e-3)
 * apart, so rounding to nearest moves x' by at most 2^(e-4) <= |x'| / 16;
 * below 2^-6 (subnormals, 2^-9 apart) by at most 2^-10. Dequantized, that
 * is |w| / 16 + scale / 1024, plus the two fp32 roundings (the division
 * and fp8 * scale, each 2^-24 of at most 448 scale). Returns the largest
 * |deq - x| / |x| over elements of normal x', to show the bound is met
 * with e4m3's rounding, not with something finer. */
static double check_quantized(const struct backend_weight *w, const void *x, enum dtype dt, int br,
                              int bc, const char *name) {
    assert_int_equal(w->dtype, DTYPE_F8_E4M3);
    assert_int_equal(w->block_rows, br);
    assert_int_equal(w->block_cols, bc);
    long R = w->rows, C = w->cols, nc = nblk(C, bc);
    double worst = 0;
    for (long i = 0; i < nblk(R, br); i++)
        for (long j = 0; j < nc; j++) {
            float amax = 0;
            for (long r = i * br; r < R && r < (i + 1) * br; r++)
                for (long k = j * bc; k < C && k < (j + 1) * bc; k++) {
                    uint16_t h = ((const uint16_t *)x)[r * C + k];
                    float v = dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
                    if (fabsf(v) > amax) amax = fabsf(v);
                }
            float s = fmaxf(amax, 1e-12f) / 448.0f;
            if (w->scale[i * nc + j] != s)
                fail_msg("%s block [%ld, %ld]: scale %g, expected %g", name, i, j, w->scale[i * nc + j], s);
            for (long r = i * br; r < R && r < (i + 1) * br; r++)
                for (long k = j * bc; k < C && k < (j + 1) * bc; k++) {
                    uint16_t h = ((const uint16_t *)x)[r * C + k];
                    double v = dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h), d = elem(w, r, k);
                    double bound = fabs(v) / 16 + s / 1024.0 + 2 * 448.0 * s * 0x1p-24;
                    if (fabs(d - v) > bound)
                        fail_msg("%s [%ld][%ld]: %.9g from %.9g, beyond %.3g", name, r, k, d, v, bound);
                    if (fabs(v) / s >= 0x1p-6 && fabs((d - v) / v) > worst) worst = fabs((d - v) / v);
                }
        }
    return worst;
}

static void test_online_checkpoint(void **state) {
    (void)state;
    struct ckpt c;
    /* no quantization_config: 128x128 blocks, one partial block a matrix */
    make_bf16(&c, 0);
    char *dir = write_ckpt(&c);
    struct model *m = load_ok(dir, "fp8");
    size_t bytes = 2 * (size_t)V * D * 2 + 3 * (size_t)D * 4;
    double worst = 0;
    for (int p = 0; p < N_PROJ; p++) {
        double e = check_quantized(proj_of(m, p), find(&c, proj_names[p])->data, DTYPE_BF16, 128, 128,
                                   proj_names[p]);
        worst = e > worst ? e : worst;
        bytes += (size_t)(proj_rows[p] * proj_cols[p]) + 4;
    }
    assert_true(worst > 1.0 / 64 && worst <= 1.0 / 16 + 1e-6);
    assert_int_equal(m->cfg.quant.method, MODEL_QUANT_FP8);
    assert_int_equal(m->embed.dtype, DTYPE_BF16);
    assert_int_equal(m->lm_head.dtype, DTYPE_BF16);
    assert_memory_equal(m->lm_head.data, find(&c, "lm_head.weight")->data, (size_t)V * D * 2);
    assert_int_equal(model_weight_bytes(m), bytes);
    model_free(m);
    /* without the option: as before */
    m = load_ok(dir, NULL);
    for (int p = 0; p < N_PROJ; p++) assert_int_equal(proj_of(m, p)->dtype, DTYPE_BF16);
    assert_int_equal(m->cfg.quant.method, MODEL_QUANT_NONE);
    model_free(m);
    free_ckpt(&c);
    rm_rf(dir);

    /* an fp8 quantization_config over bf16 tensors: its 16x32 blocks, and
     * the modules it lists stay bf16 (o_proj by name, down_proj by tail) */
    make_bf16(&c, 1);
    json_object_set_new(json_object_get(c.config, "quantization_config"), "modules_to_not_convert",
                        json_pack("[s, s]", "model.layers.0.self_attn.o_proj", "mlp.down_proj"));
    dir = write_ckpt(&c);
    m = load_ok(dir, "fp8");
    for (int p = 0; p < N_PROJ; p++) {
        const struct backend_weight *w = proj_of(m, p);
        const struct tensor *t = find(&c, proj_names[p]);
        if (p == 3 || p == 6) {
            assert_int_equal(w->dtype, DTYPE_BF16);
            assert_null(w->scale);
            assert_memory_equal(w->data, t->data, t->nbytes);
        } else {
            check_quantized(w, t->data, DTYPE_BF16, B0, B1, proj_names[p]);
        }
    }
    /* q_proj's zero block: the smallest scale, zeros; gate's subnormals */
    const struct backend_weight *q = proj_of(m, 0);
    assert_true(q->scale[1 * 2 + 1] == 1e-12f / 448.0f);
    for (long r = B0; r < 2 * B0; r++)
        for (long k = B1; k < D; k++) assert_int_equal(((const uint8_t *)q->data)[r * D + k], 0);
    assert_true(proj_of(m, 4)->scale[0] == 1.0f / 448.0f);
    model_free(m);
    /* the same files without the option: bf16 as written */
    m = load_ok(dir, NULL);
    for (int p = 0; p < N_PROJ; p++) assert_int_equal(proj_of(m, p)->dtype, DTYPE_BF16);
    model_free(m);
    free_ckpt(&c);
    rm_rf(dir);
}

static char *write_config(json_t *config) {
    char *dir = test_tmp_dir("fp8");
    char *p = path_join(dir, "config.json");
    assert_int_equal(json_dump_file(config, p, JSON_INDENT(1)), 0);
    json_decref(config);
    free(dir);
    return p;
}

static void test_online_dummy(void **state) {
    (void)state;
    /* the same random values with and without the option, then FP8 */
    char *cfg = write_config(llama_config(0));
    struct model *plain = load_ok(cfg, NULL), *m = load_ok(cfg, "fp8");
    for (int p = 0; p < N_PROJ; p++) {
        assert_int_equal(proj_of(plain, p)->dtype, DTYPE_BF16);
        check_quantized(proj_of(m, p), proj_of(plain, p)->data, DTYPE_BF16, 128, 128, proj_names[p]);
    }
    assert_int_equal(m->embed.dtype, DTYPE_BF16);
    assert_memory_equal(m->embed.data, plain->embed.data, (size_t)V * D * 2);
    assert_memory_equal(m->lm_head.data, plain->lm_head.data, (size_t)V * D * 2);
    model_free(m);
    model_free(plain);

    /* an fp8 config: dummy weights are FP8 only with the option, then in
     * its blocks and without its modules_to_not_convert */
    json_t *j = llama_config(1);
    json_object_set_new(json_object_get(j, "quantization_config"), "ignored_layers",
                        json_pack("[s]", "model.layers.0.mlp.gate_proj"));
    char *cfg8 = write_config(j);
    plain = load_ok(cfg8, NULL);
    assert_int_equal(plain->cfg.quant.method, MODEL_QUANT_NONE);
    m = load_ok(cfg8, "fp8");
    for (int p = 0; p < N_PROJ; p++) {
        assert_int_equal(proj_of(plain, p)->dtype, DTYPE_BF16);
        if (p == 4) {
            assert_int_equal(proj_of(m, p)->dtype, DTYPE_BF16);
            assert_memory_equal(proj_of(m, p)->data, proj_of(plain, p)->data, (size_t)F * D * 2);
        } else {
            check_quantized(proj_of(m, p), proj_of(plain, p)->data, DTYPE_BF16, B0, B1, proj_names[p]);
        }
    }
    model_free(m);
    model_free(plain);
    unlink(cfg);
    unlink(cfg8);
    *strrchr(cfg, '/') = 0;
    *strrchr(cfg8, '/') = 0;
    rm_rf(cfg);
    rm_rf(cfg8);
}

/* MoE: every expert's and the shared expert's projections become FP8, the
 * router and the shared expert's gate stay bf16. */
static void test_online_moe(void **state) {
    (void)state;
    const char *fx = getenv("KILN_FIXTURES");
    char *cfg = path_join(fx ? fx : "tests/fixtures", "oracle/tiny-models/qwen2_moe/config.json");
    struct model *plain = load_ok(cfg, NULL), *m = load_ok(cfg, "fp8");
    int moe_layers = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer *L = &m->layers[l], *P = &plain->layers[l];
        if (L->mlp_kind != LAYER_MLP_MOE) continue;
        moe_layers++;
        for (int e = 0; e < m->cfg.n_experts; e++) {
            check_quantized(&L->moe.gate[e], P->moe.gate[e].data, DTYPE_BF16, 128, 128, "gate");
            check_quantized(&L->moe.up[e], P->moe.up[e].data, DTYPE_BF16, 128, 128, "up");
            check_quantized(&L->moe.down[e], P->moe.down[e].data, DTYPE_BF16, 128, 128, "down");
        }
        assert_true(L->moe.has_shared);
        check_quantized(&L->moe.shared.gate, P->moe.shared.gate.data, DTYPE_BF16, 128, 128, "shared gate");
        check_quantized(&L->moe.shared.down, P->moe.shared.down.data, DTYPE_BF16, 128, 128, "shared down");
        assert_int_equal(L->moe.router.dtype, DTYPE_BF16);
        assert_int_equal(L->moe.shared_gate.dtype, DTYPE_BF16);
        check_quantized(&L->mha.wq, P->mha.wq.data, DTYPE_BF16, 128, 128, "q_proj");
    }
    assert_true(moe_layers > 0);
    model_free(m);
    model_free(plain);
    free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_checkpoint), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_online_checkpoint), cmocka_unit_test(test_online_dummy),
        cmocka_unit_test(test_fp8_stacked),
        cmocka_unit_test(test_online_moe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
