/* test_gpt_oss_load.c — gpt-oss's experts at load (model/gpt_oss_experts.c).
 *   - An MXFP4 checkpoint (quant_method mxfp4: `*_blocks` U8 [E, out,
 *     in / 32, 16], `*_scales` U8 [E, out, in / 32]) loads every expert's
 *     gate, up and down as bf16 whose every element is the e2m1 value of
 *     its nibble (low nibble first) times 2^(scale - 127), decoded here
 *     from the bits (sign, 2 exponent bits, 1 mantissa bit), with gate and
 *     up the even and odd rows of gate_up; the same experts stored as
 *     fused bf16 (`gate_up_proj` [E, in, 2 out] interleaved by columns,
 *     `down_proj` [E, in, out]) load to the same bits; the biases split
 *     into gate, up and down rows alike; the weight bytes are what the
 *     memory plan counts.
 *   - Dummy weights of the config's shapes.
 *   - A backend that runs MXFP4 experts (backend_ops.mxfp4_experts set on
 *     the CPU backend's table, loads only): the blocks kept as they are,
 *     the refusal of exponents past the products' range, MXFP4 dummy
 *     experts (test_mxfp4_native).
 *   - Refusals name the tensor: blocks or scales missing, mis-shaped, of
 *     another dtype, a NaN scale (255); blocks without an mxfp4
 *     quantization_config; fused tensors missing; a backend without
 *     attention sinks or expert biases and the clamped SwiGLU. */
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
#include "tensor/mxfp4.h"
#include "ckpt_writer.h"

#define assert_contains(hay, needle)                                                        \
    do {                                                                                    \
        if (!strstr((hay), (needle)))                                                       \
            fail_msg("message \"%s\" does not contain \"%s\"", (hay), (needle));            \
    } while (0)

/* one layer, 3 experts of 32 rows over a hidden size of 64 */
enum { V = 32, D = 64, F = 32, E = 3, H = 2, HD = 32 };


static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float next_unit(void) { return (float)next_u32() / 4294967296.0f * 2.0f - 1.0f; }

static struct tensor *add(struct ckpt *c, const char *name, const char *dtype, int ndim, const long *shape) {
    return ckpt_add(c, name, dtype, ndim, shape, !strcmp(dtype, "U8") ? 1 : !strcmp(dtype, "F32") ? 4 : 2);
}


static void drop(struct ckpt *c, const char *name) {
    struct tensor *t = find(c, name);
    free(t->data);
    *t = c->t[--c->n];
}

/* random bf16 (scaled), or all `fill` */
static void add_bf16(struct ckpt *c, const char *name, int ndim, const long *shape, float scale) {
    struct tensor *t = add(c, name, "BF16", ndim, shape);
    uint16_t *p = (uint16_t *)t->data;
    for (size_t i = 0; i < t->nbytes / 2; i++) p[i] = f32_to_bf16(scale > 0 ? scale * next_unit() : 1.0f + 0.2f * next_unit());
}

/* e2m1 from its bits: sign, exponent (bias 1), one mantissa bit */
static float e2m1(unsigned n) {
    unsigned ex = (n >> 1) & 3, man = n & 1;
    float v = ex ? ldexpf(1.0f + 0.5f * (float)man, (int)ex - 1) : 0.5f * (float)man;
    return n & 8 ? -v : v;
}

/* The value MXFP4 tensor `base` holds at [e][r][k] (the test's decode). */
static float mx_at(struct ckpt *c, const char *base, long rows, long cols, long e, long r, long k) {
    char name[160];
    snprintf(name, sizeof name, "%s_blocks", base);
    const uint8_t *b = find(c, name)->data;
    snprintf(name, sizeof name, "%s_scales", base);
    const uint8_t *s = find(c, name)->data;
    size_t blk = (size_t)(e * rows + r) * (size_t)(cols / 32) + (size_t)(k / 32);
    uint8_t byte = b[blk * 16 + (size_t)(k % 32) / 2];
    return ldexpf(e2m1(k % 2 ? byte >> 4 : byte & 15), (int)s[blk] - 127);
}

static void add_mxfp4(struct ckpt *c, const char *base, long rows, long cols) {
    char name[160];
    snprintf(name, sizeof name, "%s_blocks", base);
    struct tensor *b = add(c, name, "U8", 4, (const long[]){E, rows, cols / 32, 16});
    for (size_t i = 0; i < b->nbytes; i++) b->data[i] = (uint8_t)next_u32();
    snprintf(name, sizeof name, "%s_scales", base);
    struct tensor *s = add(c, name, "U8", 3, (const long[]){E, rows, cols / 32});
    for (size_t i = 0; i < s->nbytes; i++) s->data[i] = (uint8_t)(118 + next_u32() % 12); /* 2^-9 .. 2^2 */
}

#define GU "model.layers.0.mlp.experts.gate_up_proj"
#define DN "model.layers.0.mlp.experts.down_proj"

/* The MXFP4 checkpoint (mx) or the same experts as fused bf16 (from an
 * MXFP4 one made with the same seed). */
static void make(struct ckpt *c, int mx) {
    memset(c, 0, sizeof *c);
    rng = 0x9e3779b97f4a7c15ull;
    c->config = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:[s], s:f, s:b, "
                          "s:s, s:i, s:{s:s, s:f, s:i, s:b}}",
                          "model_type", "gpt_oss", "vocab_size", V, "hidden_size", D, "num_hidden_layers", 1,
                          "num_attention_heads", H, "num_key_value_heads", 1, "head_dim", HD,
                          "intermediate_size", F, "num_local_experts", E, "num_experts_per_tok", 2,
                          "max_position_embeddings", 64, "sliding_window", 4, "layer_types",
                          "sliding_attention", "rms_norm_eps", 1e-5, "tie_word_embeddings", 0,
                          "torch_dtype", "bfloat16", "eos_token_id", 2, "rope_scaling", "rope_type", "yarn",
                          "factor", 4.0, "original_max_position_embeddings", 16, "truncate", 0);
    add_bf16(c, "model.embed_tokens.weight", 2, (const long[]){V, D}, 1.0f);
    add_bf16(c, "lm_head.weight", 2, (const long[]){V, D}, 0.2f);
    add_bf16(c, "model.norm.weight", 1, (const long[]){D}, 0);
    add_bf16(c, "model.layers.0.input_layernorm.weight", 1, (const long[]){D}, 0);
    add_bf16(c, "model.layers.0.post_attention_layernorm.weight", 1, (const long[]){D}, 0);
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    const long rows[4] = {H * HD, HD, HD, D}, cols[4] = {D, D, D, H * HD};
    char name[160];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "model.layers.0.self_attn.%s.weight", proj[i]);
        add_bf16(c, name, 2, (const long[]){rows[i], cols[i]}, 0.15f);
        snprintf(name, sizeof name, "model.layers.0.self_attn.%s.bias", proj[i]);
        add_bf16(c, name, 1, (const long[]){rows[i]}, 0.2f);
    }
    add_bf16(c, "model.layers.0.self_attn.sinks", 1, (const long[]){H}, 1.0f);
    add_bf16(c, "model.layers.0.mlp.router.weight", 2, (const long[]){E, D}, 0.3f);
    add_bf16(c, "model.layers.0.mlp.router.bias", 1, (const long[]){E}, 0.2f);
    add_bf16(c, GU "_bias", 2, (const long[]){E, 2 * F}, 0.2f);
    add_bf16(c, DN "_bias", 2, (const long[]){E, D}, 0.2f);
    add_mxfp4(c, GU, 2 * F, D);
    add_mxfp4(c, DN, D, F);
    if (mx) {
        json_object_set_new(c->config, "quantization_config", json_pack("{s:s}", "quant_method", "mxfp4"));
        return;
    }
    struct tensor *gu = add(c, GU, "BF16", 3, (const long[]){E, D, 2 * F});
    for (long e = 0; e < E; e++)
        for (long i = 0; i < D; i++)
            for (long r = 0; r < 2 * F; r++)
                ((uint16_t *)gu->data)[(e * D + i) * 2 * F + r] = f32_to_bf16(mx_at(c, GU, 2 * F, D, e, r, i));
    struct tensor *dn = add(c, DN, "BF16", 3, (const long[]){E, F, D});
    for (long e = 0; e < E; e++)
        for (long j = 0; j < F; j++)
            for (long o = 0; o < D; o++)
                ((uint16_t *)dn->data)[(e * F + j) * D + o] = f32_to_bf16(mx_at(c, DN, D, F, e, o, j));
    drop(c, GU "_blocks");
    drop(c, GU "_scales");
    drop(c, DN "_blocks");
    drop(c, DN "_scales");
}

static char *write_ckpt(struct ckpt *c) { return ckpt_write(c, "gptoss"); }



static struct backend be;
static struct backend_ops ops, cpu_ops;

static int setup(void **state) {
    (void)state;
    struct backend_options bo = {.n_threads = 1};
    struct kiln_error err = {0};
    if (backend_create(&be, "cpu", &bo, &err)) return -1;
    cpu_ops = ops = *be.ops;
    be.ops = &ops;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    backend_destroy(&be);
    return 0;
}

static int load(struct model **m, const char *dir, struct kiln_error *err) {
    size_t n = strlen(dir);
    struct model_options mo = {.max_batch_tokens = 8, .max_seqs = 1, .max_context = 16,
                               .load_format = n > 5 && !strcmp(dir + n - 5, ".json") ? "dummy" : "auto"};
    err->msg[0] = 0;
    return model_load(m, dir, &be, &mo, err);
}

static struct model *load_ok(const char *dir) {
    struct model *m;
    struct kiln_error err;
    if (load(&m, dir, &err)) fail_msg("%s: %s", dir, err.msg);
    return m;
}

static void expect_refused(struct ckpt *c, const char *want) {
    char *dir = write_ckpt(c);
    struct model *m = (struct model *)1;
    struct kiln_error err;
    if (load(&m, dir, &err) == 0) fail_msg("loaded; expected \"%s\"", want);
    assert_null(m);
    assert_contains(err.msg, want);
    free_ckpt(c);
    rm_rf(dir);
    ops = cpu_ops;
}

static float w_at(const struct backend_weight *w, long r, long k) {
    assert_int_equal(w->dtype, DTYPE_BF16);
    return bf16_to_f32(((const uint16_t *)w->data)[r * w->cols + k]);
}

static void test_mxfp4_matches_bf16(void **state) {
    (void)state;
    struct ckpt mx, bf;
    make(&mx, 1);
    make(&bf, 0);
    char *dmx = write_ckpt(&mx), *dbf = write_ckpt(&bf);
    struct model *a = load_ok(dmx), *b = load_ok(dbf);
    const struct mlp_moe *ma = &a->layers[0].moe, *mb = &b->layers[0].moe;
    assert_int_equal(ma->experts.act, MOE_ACT_SWIGLU_CLAMP);
    assert_true(ma->experts.limit == 7.0f && ma->experts.alpha == 1.702f);
    long nonzero = 0;
    for (long e = 0; e < E; e++) {
        for (long j = 0; j < F; j++)
            for (long i = 0; i < D; i++) {
                float g = mx_at(&mx, GU, 2 * F, D, e, 2 * j, i), u = mx_at(&mx, GU, 2 * F, D, e, 2 * j + 1, i);
                assert_true(w_at(&ma->gate[e], j, i) == g && w_at(&ma->up[e], j, i) == u);
                assert_true(w_at(&mb->gate[e], j, i) == g && w_at(&mb->up[e], j, i) == u);
                nonzero += g != 0;
            }
        for (long o = 0; o < D; o++)
            for (long j = 0; j < F; j++) {
                float v = mx_at(&mx, DN, D, F, e, o, j);
                assert_true(w_at(&ma->down[e], o, j) == v && w_at(&mb->down[e], o, j) == v);
            }
        const uint16_t *gb = (const uint16_t *)find(&mx, GU "_bias")->data;
        const uint16_t *db = (const uint16_t *)find(&mx, DN "_bias")->data;
        for (long j = 0; j < F; j++) {
            assert_true(ma->experts.gate_bias[e * F + j] == bf16_to_f32(gb[e * 2 * F + 2 * j]));
            assert_true(ma->experts.up_bias[e * F + j] == bf16_to_f32(gb[e * 2 * F + 2 * j + 1]));
            assert_true(mb->experts.gate_bias[e * F + j] == ma->experts.gate_bias[e * F + j]);
        }
        for (long o = 0; o < D; o++) assert_true(ma->experts.down_bias[e * D + o] == bf16_to_f32(db[e * D + o]));
    }
    assert_true(nonzero > E * F * D / 2);
    assert_non_null(a->layers[0].mha.sinks);
    /* the memory plan counts what the load made (the MXFP4 experts as bf16) */
    assert_int_equal(model_weight_bytes(a), model_config_weight_bytes(model_config(a)));
    assert_int_equal(model_weight_bytes(b), model_config_weight_bytes(model_config(b)));
    assert_non_null(ma->router_bias);
    model_free(a);
    model_free(b);
    free_ckpt(&mx);
    free_ckpt(&bf);
    rm_rf(dmx);
    rm_rf(dbf);
}

/* --load-format dummy: random experts and biases of the config's shapes,
 * counted as the plan counts them (on a backend without MXFP4 experts its
 * MXFP4 quantization_config says nothing about dummy weights) */
static void test_dummy(void **state) {
    (void)state;
    struct ckpt c;
    make(&c, 1);
    char *dir = write_ckpt(&c);
    char *cfg = path_join(dir, "config.json");
    struct model *m = load_ok(cfg);
    const struct mlp_moe *moe = &m->layers[0].moe;
    for (long e = 0; e < E; e++) {
        assert_int_equal(moe->gate[e].rows, F);
        assert_int_equal(moe->gate[e].cols, D);
        assert_int_equal(moe->down[e].rows, D);
        assert_int_equal(moe->down[e].cols, F);
    }
    assert_non_null(moe->experts.down_bias);
    assert_int_equal(model_weight_bytes(m), model_config_weight_bytes(model_config(m)));
    model_free(m);
    free(cfg);
    free_ckpt(&c);
    rm_rf(dir);
}

/* A backend that runs MXFP4 experts (backend_ops.mxfp4_experts; the CPU
 * backend's table with the flag set, loads only): the checkpoint's blocks
 * stay MXFP4, gate and up the even and odd rows of gate_up, every byte and
 * exponent the checkpoint's; the weight bytes count codes and exponents;
 * an exponent past 240 is refused naming the tensor and block; dummy
 * experts are the MXFP4 encoding (tensor/mxfp4.h) of the values the same
 * config's bf16 dummy experts have. */
static void test_mxfp4_native(void **state) {
    (void)state;
    struct ckpt mx;
    make(&mx, 1);
    char *dmx = write_ckpt(&mx);
    struct model *b = load_ok(dmx); /* decoded to bf16 */
    ops.mxfp4_experts = 1;
    struct model *a = load_ok(dmx);
    const struct mlp_moe *ma = &a->layers[0].moe;
    const uint8_t *gb = find(&mx, GU "_blocks")->data, *gs = find(&mx, GU "_scales")->data;
    const uint8_t *db = find(&mx, DN "_blocks")->data, *ds = find(&mx, DN "_scales")->data;
    const long nd = D / 32, nf = F / 32;
    for (long e = 0; e < E; e++) {
        const struct backend_weight *w[3] = {&ma->gate[e], &ma->up[e], &ma->down[e]};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(w[k]->dtype, DTYPE_MXFP4);
            assert_non_null(w[k]->e8m0);
        }
        for (long j = 0; j < F; j++)
            for (int k = 0; k < 2; k++) { /* gate row j is gate_up row 2j, up row j is 2j + 1 */
                size_t at = (size_t)(e * 2 * F + 2 * j + k) * (size_t)nd;
                assert_memory_equal((const uint8_t *)w[k]->data + (size_t)j * nd * 16, gb + at * 16, (size_t)nd * 16);
                assert_memory_equal(w[k]->e8m0 + (size_t)j * nd, gs + at, (size_t)nd);
            }
        assert_memory_equal(w[2]->data, db + (size_t)(e * D) * nf * 16, (size_t)(D * nf * 16));
        assert_memory_equal(w[2]->e8m0, ds + (size_t)(e * D) * nf, (size_t)(D * nf));
    }
    size_t bf16_experts = (size_t)3 * E * F * D * 2, mx_experts = (size_t)3 * E * (F * D / 2 + F * D / 32);
    assert_int_equal(model_weight_bytes(a), model_weight_bytes(b) - bf16_experts + mx_experts);
    model_free(a);
    model_free(b);
    /* dummy weights: the encoding of the bf16 dummy experts' values */
    char *cfg = path_join(dmx, "config.json");
    a = load_ok(cfg);
    ops = cpu_ops;
    b = load_ok(cfg);
    for (long e = 0; e < E; e++) {
        const struct backend_weight *wa[3] = {&a->layers[0].moe.gate[e], &a->layers[0].moe.up[e], &a->layers[0].moe.down[e]};
        const struct backend_weight *wb[3] = {&b->layers[0].moe.gate[e], &b->layers[0].moe.up[e], &b->layers[0].moe.down[e]};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(wa[k]->dtype, DTYPE_MXFP4);
            long blocks = wb[k]->rows * wb[k]->cols / 32;
            for (long q = 0; q < blocks; q++) {
                float x[32];
                uint8_t codes[16], ex;
                for (int i = 0; i < 32; i++) x[i] = w_at(wb[k], 0, q * 32 + i);
                mxfp4_encode32(x, codes, &ex);
                assert_memory_equal((const uint8_t *)wa[k]->data + q * 16, codes, 16);
                assert_int_equal(wa[k]->e8m0[q], ex);
            }
        }
    }
    model_free(a);
    model_free(b);
    free(cfg);
    free_ckpt(&mx);
    rm_rf(dmx);
    /* an exponent past what the products take */
    make(&mx, 1);
    find(&mx, GU "_scales")->data[(size_t)(1 * 2 * F + 5) * nd + 1] = 241;
    ops.mxfp4_experts = 1;
    expect_refused(&mx, GU "_scales' [1, 5, 1]: scale 241 (2^114) is past what kiln's MXFP4 products take (2^113)");
    make(&mx, 1);
    find(&mx, DN "_scales")->data[3] = 255;
    ops.mxfp4_experts = 1;
    expect_refused(&mx, DN "_scales' [0, 3, 0]: scale 255 is e8m0's NaN (no scale)");
}

static void test_refusals(void **state) {
    (void)state;
    struct ckpt c;
    make(&c, 1);
    drop(&c, DN "_scales");
    expect_refused(&c, "tensor '" DN "_scales' is missing");
    make(&c, 1);
    find(&c, GU "_blocks")->shape[2] = 1;
    find(&c, GU "_blocks")->shape[3] = 32;
    expect_refused(&c, "tensor '" GU "_blocks'");
    make(&c, 1);
    snprintf(find(&c, GU "_scales")->dtype, 8, "I8");
    expect_refused(&c, "tensor '" GU "_scales' has dtype I8, expected U8");
    make(&c, 1);
    find(&c, DN "_scales")->data[7] = 255;
    expect_refused(&c, DN "_scales' [0, 7, 0]: scale 255 is e8m0's NaN (no scale)");
    make(&c, 1);
    json_object_del(c.config, "quantization_config");
    expect_refused(&c, "tensor '" GU "_blocks' is MXFP4 but config.json has no mxfp4 quantization_config");
    make(&c, 0);
    drop(&c, GU);
    expect_refused(&c, "tensor '" GU "' is missing");
    make(&c, 0);
    find(&c, DN)->shape[1] = D, find(&c, DN)->shape[2] = F;
    expect_refused(&c, "tensor '" DN "'");
    make(&c, 0);
    drop(&c, "model.layers.0.self_attn.sinks");
    expect_refused(&c, "model.layers.0.self_attn.sinks");
    make(&c, 0);
    ops.attention_sinks = 0;
    expect_refused(&c, "gpt_oss: attention sinks: the cpu backend does not run them yet");
    make(&c, 0);
    ops.moe_bias_act = 0;
    expect_refused(&c, "gpt_oss: experts with biases and the clamped SwiGLU: the cpu backend");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mxfp4_matches_bf16),
        cmocka_unit_test(test_dummy),
        cmocka_unit_test(test_mxfp4_native),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
