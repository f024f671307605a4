/* test_config_quant.c — quantization_config in config.json: FP8 block
 * quantization and MXFP4, their fields and refusals (model/config.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/config.h"
#include "config_test.h"

/* quantization_config: FP8 block quantization parses (fmt and
 * activation_scheme may be absent), the lists of modules not converted
 * match whole dotted names, and every other method, format or scheme is
 * refused naming config.json and the field. */
static json_t *fp8_tiny(const char *arch) {
    json_t *j = tiny(arch);
    json_object_set_new(j, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:[i, i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "weight_block_size", 128, 64));
    return j;
}

static json_t *qc(json_t *j) { return json_object_get(j, "quantization_config"); }

static void test_quantization(void **state) {
    (void)state;
    struct model_config c;
    load_real("deepseek-v3.json", &c);
    assert_int_equal(c.quant.method, MODEL_QUANT_FP8);
    assert_int_equal(c.quant.block_rows, 128);
    assert_int_equal(c.quant.block_cols, 128);
    assert_int_equal(c.quant.n_skip, 0);
    assert_false(model_quant_skips(&c.quant, "lm_head.weight"));
    load_tiny("llama", &c);
    assert_int_equal(c.quant.method, MODEL_QUANT_NONE);
    json_t *j = tiny("llama");
    json_object_set_new(j, "quantization_config", json_null());
    expect_ok(j, &c);
    assert_int_equal(c.quant.method, MODEL_QUANT_NONE);

    expect_ok(fp8_tiny("qwen3_moe"), &c);
    assert_int_equal(c.quant.method, MODEL_QUANT_FP8);
    assert_int_equal(c.quant.block_rows, 128);
    assert_int_equal(c.quant.block_cols, 64);
    /* fmt absent is e4m3, activation_scheme absent is dynamic */
    j = fp8_tiny("deepseek_v3");
    json_object_del(qc(j), "fmt");
    json_object_del(qc(j), "activation_scheme");
    expect_ok(j, &c);
    assert_int_equal(c.quant.method, MODEL_QUANT_FP8);

    /* modules_to_not_convert and ignored_layers together, repeats merged */
    j = fp8_tiny("qwen3_moe");
    json_object_set_new(qc(j), "modules_to_not_convert",
                        json_pack("[s, s, s, s, s]", "lm_head", "model.layers.0.mlp.gate",
                                  "model.layers.2.self_attn", "shared_expert_gate", "lm_head"));
    json_object_set_new(qc(j), "ignored_layers", json_pack("[s, s]", "model.layers.1.", "lm_head"));
    expect_ok(j, &c);
    assert_int_equal(c.quant.n_skip, 5);
    const char *skipped[] = {"lm_head.weight", "lm_head", "model.layers.0.mlp.gate.weight",
                             "model.layers.2.self_attn.q_proj.weight",
                             "model.layers.2.self_attn.o_proj.weight",
                             "model.layers.7.mlp.shared_expert_gate.weight",
                             "model.layers.1.mlp.experts.3.down_proj.weight"};
    const char *kept[] = {"model.lm_head_x.weight", "model.layers.0.mlp.gate_proj.weight",
                          "model.layers.10.mlp.gate.weight", "model.layers.0.mlp.gatex.weight",
                          "model.layers.21.self_attn.q_proj.weight", "model.layers.2.self_attn_x.weight",
                          "model.layers.7.mlp.shared_expert.gate_proj.weight",
                          "model.layers.11.mlp.down_proj.weight", "model.embed_tokens.weight", ""};
    for (size_t i = 0; i < sizeof skipped / sizeof skipped[0]; i++)
        if (!model_quant_skips(&c.quant, skipped[i])) fail_msg("%s should be skipped", skipped[i]);
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (model_quant_skips(&c.quant, kept[i])) fail_msg("%s should be converted", kept[i]);
    /* a real checkpoint's list: every layer's norms, router and gates */
    j = fp8_tiny("qwen3_moe");
    json_t *list = json_array();
    char name[96];
    for (int l = 0; l < 300; l++) {
        static const char *const mods[] = {"input_layernorm", "post_attention_layernorm", "mlp.gate"};
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, mods[k]);
            json_array_append_new(list, json_string(name));
        }
    }
    json_object_set_new(qc(j), "modules_to_not_convert", list);
    expect_ok(j, &c);
    assert_int_equal(c.quant.n_skip, 900);
    assert_true(model_quant_skips(&c.quant, "model.layers.299.mlp.gate.weight"));
    assert_false(model_quant_skips(&c.quant, "model.layers.299.mlp.experts.0.gate_proj.weight"));

    /* refusals */
    static const char *const methods[] = {"awq", "gptq", "bitsandbytes", "compressed-tensors",
                                          "fbgemm_fp8"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char want[128];
        snprintf(want, sizeof want, "config.json: quantization_config.quant_method '%s' is not "
                                    "supported (only fp8",
                 methods[i]);
        j = fp8_tiny("llama");
        json_object_set_new(qc(j), "quant_method", json_string(methods[i]));
        expect_error(j, want);
    }
    j = fp8_tiny("llama");
    json_object_del(qc(j), "quant_method");
    expect_error(j, "field 'quantization_config.quant_method' is missing");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "quant_method", json_integer(8));
    expect_error(j, "field 'quantization_config.quant_method' must be a string, found integer");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "fmt", json_string("e5m2"));
    expect_error(j, "config.json: quantization_config.fmt 'e5m2' is not supported (only e4m3");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "activation_scheme", json_string("static"));
    expect_error(j, "quantization_config.activation_scheme 'static' is not supported (it needs the "
                    "checkpoint's activation scales");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "activation_scheme", json_string("per_token"));
    expect_error(j, "field 'quantization_config.activation_scheme' is 'per_token', expected dynamic");
    j = fp8_tiny("llama");
    json_object_del(qc(j), "weight_block_size");
    expect_error(j, "field 'quantization_config.weight_block_size' is missing: per-tensor FP8 scales "
                    "are not supported");
    json_t *bad_blocks[] = {json_pack("[i]", 128), json_pack("[i, i]", 0, 128),
                            json_pack("[i, s]", 128, "128"), json_string("128"),
                            json_pack("[i, i, i]", 1, 1, 1), json_pack("[i, I]", 128, (json_int_t)1 << 40)};
    for (size_t i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
        j = fp8_tiny("llama");
        json_object_set_new(qc(j), "weight_block_size", bad_blocks[i]);
        expect_error(j, "field 'quantization_config.weight_block_size' must be two positive integers");
    }
    j = tiny("llama");
    json_object_set_new(j, "quantization_config", json_string("fp8"));
    expect_error(j, "field 'quantization_config' must be an object or null, found string");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "modules_to_not_convert", json_string("lm_head"));
    expect_error(j, "field 'quantization_config.modules_to_not_convert' must be a list of module names");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "ignored_layers", json_pack("[s, i]", "lm_head", 3));
    expect_error(j, "field 'quantization_config.ignored_layers[1]' must be a string, found integer");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "modules_to_not_convert", json_pack("[s]", "model.layers.*.mlp.gate"));
    expect_error(j, "field 'quantization_config.modules_to_not_convert[0]' is 'model.layers.*.mlp.gate': "
                    "patterns are not supported");
    j = fp8_tiny("llama");
    json_object_set_new(qc(j), "modules_to_not_convert", json_pack("[s]", "."));
    expect_error(j, "field 'quantization_config.modules_to_not_convert[0]' must be a module name");
    j = fp8_tiny("llama");
    list = json_array();
    for (int i = 0; i <= MODEL_QUANT_MAX_SKIP; i++) {
        snprintf(name, sizeof name, "m%d", i);
        json_array_append_new(list, json_string(name));
    }
    json_object_set_new(qc(j), "ignored_layers", list);
    expect_error(j, "field 'quantization_config.ignored_layers' lists more than 4096 modules");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_quantization)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
