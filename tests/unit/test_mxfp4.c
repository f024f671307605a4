/* test_mxfp4.c — MXFP4 encoding and decoding (tensor/mxfp4.h).
 *   - Encoding: the tiny gpt_oss oracle's bf16 experts (gate_up_proj [E,
 *     in, 2 out], down_proj [E, in, out], each [out][in] row cut into
 *     blocks of 32) encode to exactly the codes and exponents of the
 *     oracle's gpt_oss_mxfp4 checkpoint, which the oracle script made the
 *     OCP way and transformers read back to the same weights.
 *   - Decoding: every code under every finite exponent decodes to the
 *     e2m1 value computed here from its bits (sign, two exponent bits of
 *     bias 1, one mantissa bit) times 2^(e - 127); exponent 255 (NaN in
 *     e8m0) and a value fp32 cannot hold are refused with the block.
 *   - Round trip: an encoded block of e2m1 values times its power of two
 *     decodes to them exactly (ties and saturation come from the oracle
 *     above). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "model/safetensors.h"
#include "oracle_ref.h"
#include "tensor/dtype.h"
#include "tensor/mxfp4.h"

static float e2m1(unsigned n) {
    unsigned ex = (n >> 1) & 3, man = n & 1;
    float v = ex ? ldexpf(1.0f + 0.5f * (float)man, (int)ex - 1) : 0.5f * (float)man;
    return n & 8 ? -v : v;
}

static float elem(const struct st_tensor *t, size_t i) {
    uint16_t h;
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    return bf16_to_f32(h);
}

/* The bf16 `name` [E][in][out] (out = its last dim) against `name`_blocks /
 * _scales [E][out][in / 32][16]: row r of expert e is column r of the bf16. */
static void check_tensor(const struct st_set *bf, const struct st_set *mx, const char *name) {
    char bn[256], sn[256];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const struct st_tensor *w = st_find(bf, name), *b = st_find(mx, bn), *s = st_find(mx, sn);
    assert_non_null(w), assert_non_null(b), assert_non_null(s);
    assert_int_equal(w->dtype, DTYPE_BF16);
    long E = (long)w->shape[0], in = (long)w->shape[1], out = (long)w->shape[2], nb = in / 32;
    assert_int_equal(b->shape[1], out);
    assert_int_equal(b->shape[2], nb);
    const uint8_t *bd = b->data, *sd = s->data;
    long blocks = 0, differ = 0;
    for (long e = 0; e < E; e++)
        for (long r = 0; r < out; r++)
            for (long k = 0; k < nb; k++) {
                float x[32];
                uint8_t codes[16], ex;
                for (int i = 0; i < 32; i++) x[i] = elem(w, (size_t)((e * in + k * 32 + i) * out + r));
                mxfp4_encode32(x, codes, &ex);
                size_t at = (size_t)((e * out + r) * nb + k);
                blocks++;
                differ += ex != sd[at] || memcmp(codes, bd + at * 16, 16) != 0;
            }
    printf("  %s: %ld blocks, %ld differ from the checkpoint\n", name, blocks, differ);
    assert_true(blocks > 0);
    assert_int_equal(differ, 0);
}

static void test_encode_matches_oracle(void **state) {
    (void)state;
    char *src = fixture("oracle/tiny-models-more/gpt_oss/model.safetensors");
    char *dst = fixture("oracle/tiny-models-more/gpt_oss_mxfp4/model.safetensors");
    struct st_set bf = {0}, mx = {0};
    struct kiln_error err = {0};
    if (st_open_file(&bf, src, &err) || st_open_file(&mx, dst, &err)) fail_msg("%s", err.msg);
    char name[128];
    for (int l = 0; l < 3; l++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        check_tensor(&bf, &mx, name);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
        check_tensor(&bf, &mx, name);
    }
    st_close(&bf), st_close(&mx);
    free(src), free(dst);
}

static void test_decode(void **state) {
    (void)state;
    uint8_t codes[16];
    float out[32];
    for (int e = 0; e < 255; e++)
        for (int lo = 0; lo < 16; lo++) {
            for (int k = 0; k < 16; k++) codes[k] = (uint8_t)(lo | (((lo + k) & 15) << 4));
            uint8_t ex = (uint8_t)e;
            float top = ldexpf(6.0f, e - 127);
            long bad = mxfp4_decode(codes, &ex, 1, out);
            if (!isfinite(top)) { /* 6 × 2^(e - 127) past fp32: the block is refused if it holds a 6 */
                assert_int_equal(bad, 0);
                continue;
            }
            assert_int_equal(bad, -1);
            for (int k = 0; k < 16; k++) {
                assert_true(out[2 * k] == ldexpf(e2m1((unsigned)lo), e - 127));
                assert_true(out[2 * k + 1] == ldexpf(e2m1((unsigned)((lo + k) & 15)), e - 127));
            }
        }
    uint8_t nan = 255;
    memset(codes, 0, sizeof codes);
    assert_int_equal(mxfp4_decode(codes, &nan, 1, out), 0);
    uint8_t two[2] = {127, 255}, cc[32] = {0};
    assert_int_equal(mxfp4_decode(cc, two, 2, out), 1);
}

static void test_round_trip(void **state) {
    (void)state;
    for (int e = 1; e < 250; e += 7) {
        float x[32], y[32];
        for (int i = 0; i < 32; i++) x[i] = ldexpf(e2m1((unsigned)(i % 16)), e - 127);
        x[7] = ldexpf(6.0f, e - 127); /* the block's largest: e2m1's 6 sets the exponent */
        uint8_t codes[16], ex;
        mxfp4_encode32(x, codes, &ex);
        assert_int_equal(ex, e);
        assert_int_equal(mxfp4_decode(codes, &ex, 1, y), -1);
        for (int i = 0; i < 32; i++) assert_true(x[i] == y[i] && signbit(x[i]) == signbit(y[i]));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_encode_matches_oracle), cmocka_unit_test(test_decode),
                                       cmocka_unit_test(test_round_trip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
