/* test_config.c — the fixture and real configs parse with the values in the
 * files; both rope spellings agree; bad configs give errors naming the
 * field (quantization_config: test_config_quant.c). */
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





static void common_tiny(const struct model_config *c) {
    assert_int_equal(c->vocab_size, 1024);
    assert_int_equal(c->hidden_size, 64);
    assert_int_equal(c->n_layers, 3);
    assert_int_equal(c->n_heads, 4);
    assert_int_equal(c->intermediate_size, 128);
    assert_int_equal(c->max_position_embeddings, 512);
    assert_near(c->rms_norm_eps, 1e-6);
    assert_int_equal(c->dtype, DTYPE_BF16);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos_token_ids[0], 2);
}

static void test_tiny_dense(void **state) {
    (void)state;
    struct model_config c;
    load_tiny("llama", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_LLAMA);
    assert_string_equal(c.model_type, "llama");
    assert_string_equal(model_arch_name(c.arch), "llama");
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.qk_norm, 0);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_near(c.rope.theta, 500000.0);
    assert_near(c.rope.factor, 8.0);
    assert_near(c.rope.low_freq_factor, 1.0);
    assert_near(c.rope.high_freq_factor, 4.0);
    assert_near(c.rope.original_max_positions, 64);
    assert_int_equal(c.rope.interleaved, 0);
    assert_int_equal(c.n_experts, 0);
    for (int l = 0; l < 3; l++) assert_false(model_config_layer_is_moe(&c, l));

    load_tiny("qwen2", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_QWEN2);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 0);
    assert_int_equal(c.qk_norm, 0);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_near(c.rope.theta, 1e6);

    load_tiny("qwen3", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_int_equal(c.head_dim, 32); /* not hidden / heads */
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_near(c.rope.theta, 1e6);
}

static void test_tiny_moe(void **state) {
    (void)state;
    struct model_config c;
    load_tiny("qwen2_moe", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_QWEN2_MOE);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 32);
    assert_int_equal(c.shared_expert_intermediate_size, 64);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_int_equal(c.n_mlp_only_layers, 0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.qk_norm, 0);
    assert_int_equal(c.scoring, MOE_SCORING_SOFTMAX);
    assert_int_equal(c.topk_method, MOE_TOPK_GREEDY);
    assert_near(c.routed_scaling_factor, 1.0);
    for (int l = 0; l < 3; l++) assert_true(model_config_layer_is_moe(&c, l));
    assert_false(model_config_layer_is_moe(&c, 3));

    load_tiny("qwen3_moe", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_QWEN3_MOE);
    assert_int_equal(c.n_experts, 8); /* spelled num_local_experts */
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.shared_expert_intermediate_size, 0);

    load_tiny("deepseek_v2", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_DEEPSEEK_V2);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_shared_experts, 2);
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 32);
    assert_int_equal(c.first_k_dense_replace, 1);
    assert_int_equal(c.moe_layer_freq, 1);
    assert_int_equal(c.topk_method, MOE_TOPK_GREEDY);
    assert_int_equal(c.scoring, MOE_SCORING_SOFTMAX);
    assert_int_equal(c.has_score_correction_bias, 0);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_near(c.routed_scaling_factor, 1.0);
    assert_int_equal(c.q_lora_rank, 0);
    assert_int_equal(c.kv_lora_rank, 32);
    assert_int_equal(c.qk_nope_head_dim, 16);
    assert_int_equal(c.qk_rope_head_dim, 8);
    assert_int_equal(c.v_head_dim, 16);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_int_equal(c.rope.interleaved, 1);
    assert_false(model_config_layer_is_moe(&c, 0));
    assert_true(model_config_layer_is_moe(&c, 1));
    assert_true(model_config_layer_is_moe(&c, 2));

    load_tiny("deepseek_v3", &c);
    common_tiny(&c);
    assert_int_equal(c.arch, ARCH_DEEPSEEK_V3);
    assert_int_equal(c.n_experts, 16);
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.n_experts_per_tok, 4);
    assert_int_equal(c.n_group, 4);
    assert_int_equal(c.topk_group, 2);
    assert_int_equal(c.topk_method, MOE_TOPK_NOAUX_TC);
    assert_int_equal(c.scoring, MOE_SCORING_SIGMOID);
    assert_int_equal(c.has_score_correction_bias, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_near(c.routed_scaling_factor, 2.5);
    assert_int_equal(c.q_lora_rank, 48);
    assert_int_equal(c.kv_lora_rank, 32);
    assert_int_equal(c.rope.type, ROPE_YARN);
    assert_near(c.rope.theta, 10000);
    assert_near(c.rope.factor, 4.0);
    assert_near(c.rope.beta_fast, 32);
    assert_near(c.rope.beta_slow, 1);
    assert_near(c.rope.mscale, 1.0);
    assert_near(c.rope.mscale_all_dim, 1.0);
    assert_near(c.rope.original_max_positions, 128);
    assert_near(c.rope.attention_factor, 0);
    assert_int_equal(c.rope.interleaved, 1);
    assert_false(model_config_layer_is_moe(&c, 0));
    assert_true(model_config_layer_is_moe(&c, 2));
}

static void test_real_configs(void **state) {
    (void)state;
    struct model_config c;
    load_real("gpt-oss-20b.json", &c);
    assert_int_equal(c.arch, ARCH_GPT_OSS);
    assert_int_equal(c.n_layers, 24);
    assert_int_equal(c.n_experts, 32);
    assert_int_equal(c.n_experts_per_tok, 4);
    assert_int_equal(c.moe_intermediate_size, 2880);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.sliding_window, 128);
    assert_int_equal(model_config_layer_window(&c, 0), 128);
    assert_int_equal(model_config_layer_window(&c, 1), 0);
    assert_int_equal(c.quant.method, MODEL_QUANT_MXFP4);
    assert_int_equal(c.rope.no_truncate, 1);
    assert_near(c.rope.factor, 32);
    load_real("gemma-3-12b.json", &c);
    assert_int_equal(c.arch, ARCH_GEMMA3);
    assert_int_equal(c.n_layers, 48);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.vocab_size, 262208);
    assert_int_equal(c.sliding_window, 1024);
    for (int l = 0; l < 12; l++) /* five local layers, then a global one */
        assert_int_equal(model_config_layer_window(&c, l), l % 6 == 5 ? 0 : 1024);
    assert_near(c.rope.factor, 8);
    load_real("mistral-small-24b.json", &c);
    assert_int_equal(c.arch, ARCH_MISTRAL);
    assert_int_equal(c.hidden_size, 5120);
    assert_int_equal(c.intermediate_size, 32768);
    assert_int_equal(c.n_layers, 40);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.sliding_window, 0);
    assert_near(c.rope.theta, 1e8);
    load_real("qwen3-0.6b.json", &c);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 1024);
    assert_int_equal(c.n_layers, 28);
    assert_int_equal(c.n_heads, 16);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.intermediate_size, 3072);
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_near(c.rope.theta, 1e6);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 151645);

    load_real("qwen3-8b.json", &c);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.n_layers, 36);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.intermediate_size, 12288);
    assert_int_equal(c.tie_word_embeddings, 0);

    load_real("llama-3.1-8b.json", &c);
    assert_int_equal(c.arch, ARCH_LLAMA);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.n_layers, 32);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.intermediate_size, 14336);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_near(c.rms_norm_eps, 1e-5);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_near(c.rope.theta, 500000);
    assert_near(c.rope.factor, 8);
    assert_near(c.rope.original_max_positions, 8192);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_token_ids[0], 128001);
    assert_int_equal(c.eos_token_ids[1], 128008);
    assert_int_equal(c.eos_token_ids[2], 128009);

    load_real("qwen3-30b-a3b.json", &c);
    assert_int_equal(c.arch, ARCH_QWEN3_MOE);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.n_layers, 48);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_true(model_config_layer_is_moe(&c, 0));
    assert_true(model_config_layer_is_moe(&c, 47));

    load_real("deepseek-v2-lite.json", &c);
    assert_int_equal(c.arch, ARCH_DEEPSEEK_V2);
    assert_int_equal(c.vocab_size, 102400);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.n_layers, 27);
    assert_int_equal(c.n_heads, 16);
    assert_int_equal(c.n_kv_heads, 16);
    assert_int_equal(c.intermediate_size, 10944);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.n_experts, 64);
    assert_int_equal(c.n_shared_experts, 2);
    assert_int_equal(c.n_experts_per_tok, 6);
    assert_int_equal(c.q_lora_rank, 0);
    assert_int_equal(c.kv_lora_rank, 512);
    assert_int_equal(c.qk_nope_head_dim, 128);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(c.v_head_dim, 128);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.rope.type, ROPE_YARN); /* spelled "type" */
    assert_near(c.rope.factor, 40);
    assert_near(c.rope.mscale, 0.707);
    assert_near(c.rope.mscale_all_dim, 0.707);
    assert_near(c.rope.original_max_positions, 4096);
    assert_int_equal(c.topk_method, MOE_TOPK_GREEDY);
    assert_int_equal(c.scoring, MOE_SCORING_SOFTMAX);
    assert_int_equal(c.bos_token_id, 100000);
    assert_int_equal(c.eos_token_ids[0], 100001);
    assert_false(model_config_layer_is_moe(&c, 0));
    assert_true(model_config_layer_is_moe(&c, 26));

    load_real("deepseek-v3.json", &c);
    assert_int_equal(c.arch, ARCH_DEEPSEEK_V3);
    assert_int_equal(c.vocab_size, 129280);
    assert_int_equal(c.hidden_size, 7168);
    assert_int_equal(c.n_layers, 61);
    assert_int_equal(c.n_heads, 128);
    assert_int_equal(c.n_experts, 256);
    assert_int_equal(c.n_experts_per_tok, 8);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(c.first_k_dense_replace, 3);
    assert_int_equal(c.q_lora_rank, 1536);
    assert_int_equal(c.topk_method, MOE_TOPK_NOAUX_TC);
    assert_int_equal(c.scoring, MOE_SCORING_SIGMOID);
    assert_near(c.routed_scaling_factor, 2.5);
    assert_int_equal(c.rope.interleaved, 1);
    assert_near(c.rope.factor, 40);
    assert_int_equal(c.bos_token_id, 0);
    assert_int_equal(c.eos_token_ids[0], 1);
    assert_false(model_config_layer_is_moe(&c, 2));
    assert_true(model_config_layer_is_moe(&c, 3));
    assert_true(model_config_layer_is_moe(&c, 60));

    load_real("../stories260K/config.json", &c);
    assert_int_equal(c.dtype, DTYPE_F32);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(c.n_heads, 8);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_near(c.rms_norm_eps, 1e-5);
    assert_int_equal(c.rope.type, ROPE_DEFAULT); /* rope_scaling: null */
    assert_int_equal(c.bos_token_id, 1);
}

/* ---- edited configs --------------------------------------------------------- */



/* The v5 spelling: rope_theta moves inside rope_parameters. */
static void to_v5(json_t *j) {
    json_t *params = json_object_get(j, "rope_scaling");
    params = json_is_object(params) ? json_deep_copy(params) : json_object();
    json_object_set(params, "rope_theta", json_object_get(j, "rope_theta"));
    json_object_del(j, "rope_theta");
    json_object_del(j, "rope_scaling");
    json_object_set_new(j, "rope_parameters", params);
    json_object_set(j, "dtype", json_object_get(j, "torch_dtype"));
    json_object_del(j, "torch_dtype");
}

static void test_rope_spellings(void **state) {
    (void)state;
    const char *files[][2] = {
        {"KILN_FIXTURES", "oracle/tiny-models/llama/config.json"},
        {"KILN_FIXTURES", "oracle/tiny-models/deepseek_v3/config.json"},
        {"KILN_FIXTURES", "oracle/tiny-models/qwen2/config.json"},
        {"KILN_MODELS", "configs/deepseek-v2-lite.json"},
        {"KILN_MODELS", "configs/llama-3.1-8b.json"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        json_t *j = read_json(files[i][0], files[i][1]);
        struct model_config a, b;
        struct kiln_error err = {0};
        if (parse_json(j, &a, &err)) fail_msg("%s", err.msg);
        to_v5(j);
        if (parse_json(j, &b, &err)) fail_msg("%s (v5): %s", files[i][1], err.msg);
        assert_memory_equal(&a.rope, &b.rope, sizeof a.rope);
        assert_int_equal(a.dtype, b.dtype);
        assert_true(json_object_get(j, "rope_parameters") != NULL);
        /* rope_scaling: null beside rope_parameters changes nothing */
        json_object_set_new(j, "rope_scaling", json_null());
        if (parse_json(j, &b, &err)) fail_msg("%s (v5 + null): %s", files[i][1], err.msg);
        assert_memory_equal(&a.rope, &b.rope, sizeof a.rope);
        /* and the per-layer-type v5 form */
        json_t *p = json_incref(json_object_get(j, "rope_parameters"));
        json_object_set_new(j, "rope_parameters", json_pack("{s:o}", "full_attention", p));
        if (parse_json(j, &b, &err)) fail_msg("%s (v5 per layer type): %s", files[i][1], err.msg);
        assert_memory_equal(&a.rope, &b.rope, sizeof a.rope);
        json_decref(j);
    }
}



static void test_errors(void **state) {
    (void)state;
    json_t *j = tiny("llama");
    json_object_set_new(j, "model_type", json_string("foo"));
    expect_error(j, "config.json: model_type 'foo' is not supported (supported: llama, qwen2, "
                    "qwen3, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, mistral, gemma3_text, gpt_oss)");
    j = tiny("llama");
    json_object_del(j, "model_type");
    expect_error(j, "field 'model_type' is missing");
    j = tiny("llama");
    json_object_set_new(j, "hidden_size", json_string("64"));
    expect_error(j, "config.json: field 'hidden_size' must be an integer, found string");
    j = tiny("qwen3");
    json_object_set_new(j, "head_dim", json_real(32.5));
    expect_error(j, "field 'head_dim' must be an integer, found number");
    j = tiny("llama");
    json_object_set_new(j, "hidden_size", json_integer(-64));
    expect_error(j, "field 'hidden_size' must be at least 1, found -64");
    j = tiny("llama");
    json_object_set_new(j, "vocab_size", json_integer(1ll << 40));
    expect_error(j, "field 'vocab_size' is too large");
    j = tiny("llama");
    json_object_del(j, "num_hidden_layers");
    expect_error(j, "config.json: field 'num_hidden_layers' is missing");
    j = tiny("llama");
    json_object_set_new(j, "num_key_value_heads", json_integer(3));
    expect_error(j, "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
    j = tiny("llama");
    json_object_set_new(j, "tie_word_embeddings", json_integer(1));
    expect_error(j, "field 'tie_word_embeddings' must be a boolean, found integer");
    j = tiny("llama");
    json_object_set_new(j, "rms_norm_eps", json_string("1e-6"));
    expect_error(j, "field 'rms_norm_eps' must be a number, found string");
    j = tiny("llama");
    json_object_set_new(j, "torch_dtype", json_string("int4"));
    expect_error(j, "field 'torch_dtype' is 'int4', expected one of: bfloat16, float16, float32");
    j = tiny("llama");
    json_object_set_new(json_object_get(j, "rope_scaling"), "rope_type", json_string("dynamic"));
    expect_error(j, "field 'rope_scaling.rope_type' is 'dynamic', expected one of");
    j = tiny("llama");
    json_object_set_new(json_object_get(j, "rope_scaling"), "factor", json_string("8"));
    expect_error(j, "field 'rope_scaling.factor' must be a number, found string");
    j = tiny("llama");
    json_object_del(json_object_get(j, "rope_scaling"), "low_freq_factor");
    expect_error(j, "field 'rope_scaling.low_freq_factor' is missing");
    j = tiny("llama");
    json_object_set_new(j, "rope_scaling", json_integer(3));
    expect_error(j, "field 'rope_scaling' must be an object or null, found integer");
    j = tiny("llama");
    json_object_set_new(j, "eos_token_id", json_pack("[i, s]", 1, "2"));
    expect_error(j, "field 'eos_token_id[1]' must be a token id");
    j = tiny("llama");
    json_object_set_new(j, "eos_token_id", json_string("</s>"));
    expect_error(j, "field 'eos_token_id' must be an integer or a list of integers, found string");
    j = tiny("llama");
    json_object_set_new(j, "hidden_act", json_string("gelu"));
    expect_error(j, "hidden_act 'gelu' is not supported");
    j = tiny("qwen3_moe");
    json_object_del(j, "num_local_experts");
    expect_error(j, "field 'num_experts' (or 'num_local_experts') is missing");
    j = tiny("qwen3_moe");
    json_object_set_new(j, "mlp_only_layers", json_pack("[i]", 7));
    expect_error(j, "field 'mlp_only_layers[0]' must be a layer index below 3");
    j = tiny("qwen2_moe");
    json_object_del(j, "shared_expert_intermediate_size");
    expect_error(j, "field 'shared_expert_intermediate_size' is missing");
    j = tiny("deepseek_v3");
    json_object_set_new(j, "topk_method", json_string("best"));
    expect_error(j, "field 'topk_method' is 'best', expected one of: greedy, group_limited_greedy, noaux_tc");
    j = tiny("deepseek_v3");
    json_object_set_new(j, "n_group", json_integer(3));
    expect_error(j, "n_routed_experts (16) must be divisible by n_group (3)");
    j = tiny("deepseek_v3");
    json_object_set_new(j, "num_experts_per_tok", json_integer(9));
    expect_error(j, "num_experts_per_tok (9) exceeds the experts in topk_group (2) groups of 4");
    j = tiny("deepseek_v2");
    json_object_del(j, "q_lora_rank");
    expect_error(j, "field 'q_lora_rank' is missing");
    j = tiny("deepseek_v2");
    json_object_del(j, "kv_lora_rank");
    expect_error(j, "field 'kv_lora_rank' is missing");

    struct model_config c;
    struct kiln_error err = {0};
    assert_int_equal(model_config_parse(&c, "{\"model_type\": ", 15, "config.json", &err), -1);
    assert_contains(err.msg, "config.json:1:");
    assert_contains(err.msg, "invalid JSON");
    assert_int_equal(model_config_parse(&c, "[]", 2, "config.json", &err), -1);
    assert_contains(err.msg, "config.json: must be a JSON object, found array");
    assert_int_equal(model_config_load(&c, "/nonexistent/config.json", &err), -1);
    assert_contains(err.msg, "/nonexistent/config.json");
}


/* Fields a family does not implement are refused naming the file and the
 * field; what transformers accepts and ignores stays accepted. */
static void test_family_refusals(void **state) {
    (void)state;
    struct model_config c, ref;
    /* MLA has no key/value heads: num_key_value_heads is not checked */
    expect_ok(tiny("deepseek_v3"), &ref);
    json_t *j = tiny("deepseek_v3");
    json_object_set_new(j, "num_key_value_heads", json_integer(3));
    expect_ok(j, &c);
    assert_int_equal(c.n_heads, 4);
    assert_int_equal(c.kv_lora_rank, ref.kv_lora_rank);
    assert_int_equal(c.head_dim, ref.head_dim);
    j = tiny("deepseek_v2");
    json_object_set_new(j, "num_key_value_heads", json_integer(3));
    expect_ok(j, &c);
    j = tiny("deepseek_v3");
    json_object_set_new(j, "attention_bias", json_true());
    expect_error(j, "config.json: attention_bias true is not supported for deepseek_v3");

    /* qwen: the window slides only with use_sliding_window and layers at or
     * past max_window_layers (the fixtures' layer_types, written by
     * transformers, would name them instead) */
    j = tiny("qwen2");
    json_object_set_new(j, "sliding_window", json_integer(64));
    expect_ok(j, &c);
    assert_int_equal(c.sliding_window, 0);
    j = tiny("qwen2");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_del(j, "layer_types");
    json_object_set_new(j, "max_window_layers", json_integer(3));
    expect_ok(j, &c);
    j = tiny("qwen2");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_del(j, "layer_types");
    json_object_set_new(j, "max_window_layers", json_integer(1));
    expect_error(j, "config.json: sliding_window 64 is in use");
    j = tiny("qwen3_moe");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_del(j, "layer_types");
    json_object_set_new(j, "max_window_layers", json_integer(0));
    expect_error(j, "config.json: sliding_window 64 is in use");
    /* a window as long as the context never slides */
    j = tiny("qwen2");
    json_object_set_new(j, "sliding_window", json_integer(512));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_del(j, "layer_types");
    json_object_set_new(j, "max_window_layers", json_integer(0));
    expect_ok(j, &c);
    /* without a switch (Mistral-style), a given window slides */
    j = tiny("llama");
    json_object_set_new(j, "sliding_window", json_integer(128));
    expect_error(j, "config.json: sliding_window 128 is in use");
    j = tiny("llama");
    json_object_set_new(j, "sliding_window", json_null());
    expect_ok(j, &c);
    /* mistral runs its window (every layer); MistralConfig's default is
     * 4096 when the field is absent, none when null */
    j = tiny("llama");
    json_object_set_new(j, "model_type", json_string("mistral"));
    json_object_set_new(j, "sliding_window", json_integer(8));
    expect_ok(j, &c);
    assert_int_equal(c.sliding_window, 8);
    for (int l = 0; l < 3; l++) assert_int_equal(model_config_layer_window(&c, l), 8);
    assert_int_equal(model_config_layer_window(&c, 3), 0);
    j = tiny("llama");
    json_object_set_new(j, "model_type", json_string("mistral"));
    json_object_set_new(j, "sliding_window", json_null());
    expect_ok(j, &c);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(model_config_layer_window(&c, 0), 0);
    j = tiny("llama");
    json_object_set_new(j, "model_type", json_string("mistral"));
    json_object_set_new(j, "max_position_embeddings", json_integer(8192));
    expect_ok(j, &c);
    assert_int_equal(c.sliding_window, 4096);
    j = tiny("llama");
    json_object_set_new(j, "model_type", json_string("mistral"));
    json_object_del(j, "max_position_embeddings");
    expect_ok(j, &c);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.sliding_window, 4096);
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/mistral/config.json");
    expect_ok(j, &c);
    assert_int_equal(c.arch, ARCH_MISTRAL);
    assert_int_equal(c.sliding_window, 8);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_near(c.rope.theta, 1e6);
    /* gemma3_text: sliding layers by layer_types or every pattern-th layer
     * global; the local rope base; 1 + w norms; the embedding scale in the
     * embedding's dtype */
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    expect_ok(j, &c);
    assert_int_equal(c.arch, ARCH_GEMMA3);
    assert_int_equal(c.sliding_window, 8);
    assert_int_equal(model_config_layer_window(&c, 0), 8);
    assert_int_equal(model_config_layer_window(&c, 1), 8);
    assert_int_equal(model_config_layer_window(&c, 2), 0);
    assert_near(c.query_pre_attn_scalar, 24);
    assert_near(c.rope_local_theta, 1e4);
    assert_near(c.rope.theta, 1e6);
    assert_near(c.embed_scale, 8);
    assert_int_equal(c.norm_plus_one, 1);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.head_dim, 32);
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_del(j, "layer_types");
    json_object_set_new(j, "num_hidden_layers", json_integer(12));
    json_object_set_new(j, "hidden_size", json_integer(3840));
    expect_ok(j, &c);
    for (int l = 0; l < 12; l++)
        assert_int_equal(model_config_layer_slides(&c, l), (l + 1) % 6 != 0);
    assert_near(c.embed_scale, 62.0); /* √3840 = 61.97 in bf16 */
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_del(j, "layer_types");
    json_object_del(j, "_sliding_window_pattern");
    json_object_set_new(j, "sliding_window_pattern", json_integer(2));
    json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 8.0));
    expect_ok(j, &c);
    assert_int_equal(model_config_layer_slides(&c, 0), 1);
    assert_int_equal(model_config_layer_slides(&c, 1), 0);
    assert_int_equal(c.rope.type, ROPE_LINEAR);
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_set_new(j, "final_logit_softcapping", json_real(30.0));
    expect_error(j, "config.json: final_logit_softcapping 30 is not supported");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_set_new(j, "attn_logit_softcapping", json_real(50.0));
    expect_error(j, "config.json: attn_logit_softcapping 50 is not supported");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_set_new(j, "use_bidirectional_attention", json_true());
    expect_error(j, "config.json: use_bidirectional_attention true is not supported");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_set_new(j, "hidden_activation", json_string("gelu"));
    expect_error(j, "config.json: hidden_activation 'gelu' is not supported for gemma3");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_set_new(j, "rope_parameters",
                        json_pack("{s:{s:s, s:f}}", "sliding_attention", "rope_type", "default",
                                  "rope_theta", 5000.0));
    expect_ok(j, &c);
    assert_near(c.rope_local_theta, 5000);
    /* gemma3: text_config is the language model; dtype and token ids may
     * sit at the top */
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gemma3/config.json");
    json_object_del(j, "torch_dtype");
    json_object_del(j, "eos_token_id");
    json_t *mm = json_pack("{s:s, s:s, s:i, s:o}", "model_type", "gemma3", "torch_dtype", "float16",
                           "eos_token_id", 7, "text_config", j);
    expect_ok(mm, &c);
    assert_int_equal(c.arch, ARCH_GEMMA3);
    assert_int_equal(c.multimodal, 1);
    assert_int_equal(c.dtype, DTYPE_F16);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.sliding_window, 8);
    assert_int_equal(c.hidden_size, 64);
    expect_error(json_pack("{s:s}", "model_type", "gemma3"), "config.json: field 'text_config' is missing");
    /* gpt_oss: alternating windows by layer_types (even layers without
     * it), every layer MoE over intermediate_size, attention sinks, q/k/v/o
     * biases by default, yarn without truncation, GptOssConfig defaults */
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    expect_ok(j, &c);
    assert_int_equal(c.arch, ARCH_GPT_OSS);
    assert_int_equal(c.sliding_window, 8);
    assert_int_equal(model_config_layer_window(&c, 0), 8);
    assert_int_equal(model_config_layer_window(&c, 1), 8);
    assert_int_equal(model_config_layer_window(&c, 2), 0);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 64);
    for (int l = 0; l < 3; l++) assert_int_equal(model_config_layer_is_moe(&c, l), 1);
    assert_int_equal(c.attn_sinks, 1);
    assert_near(c.swiglu_limit, 7.0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.rope.type, ROPE_YARN);
    assert_int_equal(c.rope.no_truncate, 1);
    assert_near(c.rope.factor, 4);
    assert_near(c.rope.original_max_positions, 128);
    assert_near(c.rope.theta, 150000);
    assert_int_equal(c.quant.method, MODEL_QUANT_NONE);
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_del(j, "layer_types");
    json_object_del(j, "attention_bias");
    json_object_del(j, "rms_norm_eps");
    json_object_del(j, "rope_theta");
    json_object_del(j, "head_dim");
    json_object_del(j, "num_local_experts");
    json_object_del(j, "num_experts_per_tok");
    json_object_set_new(j, "num_hidden_layers", json_integer(4));
    json_object_set_new(j, "hidden_act", json_string("gelu")); /* not read by transformers' gpt-oss */
    json_object_set_new(j, "quantization_config", json_pack("{s:s, s:[s, s]}", "quant_method", "mxfp4",
                                                            "modules_to_not_convert", "model.layers.*.self_attn",
                                                            "lm_head"));
    json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "yarn", "factor", 32.0));
    expect_ok(j, &c);
    for (int l = 0; l < 4; l++) assert_int_equal(model_config_layer_slides(&c, l), l % 2 == 0);
    assert_int_equal(c.attention_bias, 1);
    assert_near(c.rms_norm_eps, 1e-5);
    assert_near(c.rope.theta, 150000);
    assert_int_equal(c.rope.no_truncate, 0);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_per_tok, 4);
    assert_int_equal(c.quant.method, MODEL_QUANT_MXFP4);
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_set_new(j, "swiglu_limit", json_real(5.0));
    expect_error(j, "config.json: swiglu_limit 5 is not supported (only 7.0");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_set_new(j, "num_key_value_heads", json_integer(3));
    expect_error(j, "config.json: num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_set_new(j, "head_dim", json_integer(15));
    expect_error(j, "config.json: head_dim 15 must be even");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f, s:s}", "rope_type", "yarn", "factor", 4.0,
                                                     "truncate", "no"));
    expect_error(j, "config.json: field 'rope_scaling.truncate' must be a boolean, found string");
    j = read_json("KILN_FIXTURES", "oracle/tiny-models-more/gpt_oss/config.json");
    json_object_set_new(j, "partial_rotary_factor", json_real(0.5));
    expect_error(j, "config.json: partial_rotary_factor 0.5 is not supported");
    j = tiny("llama");
    json_object_set_new(j, "quantization_config", json_pack("{s:s}", "quant_method", "mxfp4"));
    expect_error(j, "config.json: quantization_config.quant_method 'mxfp4' is only supported for gpt_oss");
    /* layer_types names the sliding layers itself (under the switch) */
    j = tiny("qwen3");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_set_new(j, "layer_types",
                        json_pack("[s, s, s]", "full_attention", "sliding_attention", "full_attention"));
    expect_error(j, "config.json: sliding_window 64 is in use");
    j = tiny("qwen3");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_set_new(j, "layer_types",
                        json_pack("[s, s, s]", "full_attention", "full_attention", "full_attention"));
    expect_ok(j, &c);
    j = tiny("qwen3");
    json_object_set_new(j, "sliding_window", json_integer(64));
    json_object_set_new(j, "layer_types",
                        json_pack("[s, s, s]", "sliding_attention", "sliding_attention", "full_attention"));
    expect_ok(j, &c);
    j = tiny("qwen3");
    json_object_set_new(j, "layer_types", json_pack("[s]", "chunked_attention"));
    expect_error(j, "config.json: field 'layer_types[0]' is 'chunked_attention'");

    /* Gemma's spelling of the activation */
    j = tiny("llama");
    json_object_set_new(j, "hidden_activation", json_string("gelu_pytorch_tanh"));
    expect_error(j, "config.json: hidden_activation 'gelu_pytorch_tanh' is not supported (only silu)");
    j = tiny("qwen2_moe");
    json_object_set_new(j, "hidden_act", json_string("gelu"));
    expect_error(j, "config.json: hidden_act 'gelu' is not supported (only silu)");
    j = tiny("llama");
    json_object_set_new(j, "partial_rotary_factor", json_real(0.5));
    expect_error(j, "config.json: partial_rotary_factor 0.5 is not supported");
    j = tiny("deepseek_v2");
    json_object_set_new(j, "mlp_bias", json_true());
    expect_error(j, "config.json: mlp_bias true is not supported");
}

static void test_defaults(void **state) {
    (void)state;
    /* absent fields take transformers' defaults */
    json_t *j = tiny("llama");
    json_object_del(j, "num_key_value_heads");
    json_object_del(j, "head_dim");
    json_object_del(j, "rms_norm_eps");
    json_object_del(j, "tie_word_embeddings");
    json_object_del(j, "torch_dtype");
    json_object_del(j, "bos_token_id");
    json_object_del(j, "eos_token_id");
    json_object_del(j, "max_position_embeddings");
    json_object_del(j, "rope_scaling");
    json_object_del(j, "rope_theta");
    struct model_config c;
    struct kiln_error err = {0};
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_near(c.rms_norm_eps, 1e-6);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.dtype, DTYPE_BF16);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_near(c.rope.theta, 10000);
    json_decref(j);

    j = tiny("qwen3");
    json_object_del(j, "head_dim");
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.head_dim, 128); /* Qwen3Config's default, not hidden / heads */
    json_decref(j);

    j = tiny("deepseek_v3");
    json_object_del(j, "rope_interleave");
    json_object_del(j, "n_group");
    json_object_del(j, "topk_group");
    json_object_set_new(j, "num_experts_per_tok", json_integer(8));
    json_object_set_new(j, "n_shared_experts", json_null());
    json_object_del(j, "norm_topk_prob");
    json_object_del(j, "routed_scaling_factor");
    json_object_del(json_object_get(j, "rope_scaling"), "factor");
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.rope.interleaved, 1);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(c.n_shared_experts, 0);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_near(c.routed_scaling_factor, 1.0);
    assert_near(c.rope.factor, 4.0); /* 512 / 128 */
    json_decref(j);

    j = tiny("deepseek_v3");
    json_object_set_new(j, "rope_interleave", json_false());
    json_object_set_new(j, "topk_method", json_string("group_limited_greedy"));
    json_object_set_new(j, "scoring_func", json_string("softmax"));
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.rope.interleaved, 0);
    assert_int_equal(c.topk_method, MOE_TOPK_GROUP_LIMITED);
    assert_int_equal(c.has_score_correction_bias, 0);
    assert_int_equal(c.scoring, MOE_SCORING_SOFTMAX);
    json_decref(j);

    /* qwen moe layer rules: every second layer, layer 1 forced dense */
    j = tiny("qwen2_moe");
    json_object_set_new(j, "num_hidden_layers", json_integer(6));
    json_object_set_new(j, "decoder_sparse_step", json_integer(2));
    json_object_set_new(j, "mlp_only_layers", json_pack("[i]", 3));
    json_object_set_new(j, "qkv_bias", json_false());
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++) assert_int_equal(model_config_layer_is_moe(&c, l), want[l]);
    assert_int_equal(c.attention_bias, 0);
    json_decref(j);

    /* deepseek moe_layer_freq */
    j = tiny("deepseek_v2");
    json_object_set_new(j, "num_hidden_layers", json_integer(6));
    json_object_set_new(j, "moe_layer_freq", json_integer(2));
    if (parse_json(j, &c, &err)) fail_msg("%s", err.msg);
    int want2[6] = {0, 0, 1, 0, 1, 0};
    for (int l = 0; l < 6; l++) assert_int_equal(model_config_layer_is_moe(&c, l), want2[l]);
    json_decref(j);
}

static void test_generation_config(void **state) {
    (void)state;
    struct model_config c;
    struct generation_config g;
    struct kiln_error err = {0};
    load_real("../stories260K/config.json", &c);
    char *p = env_path("KILN_MODELS", "stories260K/generation_config.json");
    if (generation_config_load(&g, p, &c, &err)) fail_msg("%s", err.msg);
    free(p);
    assert_int_equal(g.bos_token_id, 1);
    assert_int_equal(g.n_eos, 2);
    assert_int_equal(g.eos_token_ids[0], 1);
    assert_int_equal(g.eos_token_ids[1], 2);
    assert_false(g.has_temperature || g.has_top_p || g.has_top_k);

    load_tiny("qwen3", &c);
    p = env_path("KILN_FIXTURES", "oracle/tiny-models/qwen3/generation_config.json");
    if (generation_config_load(&g, p, &c, &err)) fail_msg("%s", err.msg);
    free(p);
    assert_int_equal(g.n_eos, 1);
    assert_int_equal(g.eos_token_ids[0], 2);
    assert_int_equal(g.bos_token_id, -1);

    /* missing file: the model config's ids, no error */
    load_real("llama-3.1-8b.json", &c);
    assert_int_equal(generation_config_load(&g, "/nonexistent/generation_config.json", &c, &err), 0);
    assert_int_equal(g.n_eos, 3);
    assert_int_equal(g.eos_token_ids[2], 128009);
    assert_int_equal(g.bos_token_id, 128000);

    const char *qwen = "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": "
                       "[151645, 151643], \"pad_token_id\": 151643, \"temperature\": 0.6, "
                       "\"top_k\": 20, \"top_p\": 0.95, \"transformers_version\": \"4.51.0\"}";
    assert_int_equal(generation_config_parse(&g, qwen, strlen(qwen), "generation_config.json", &c, &err), 0);
    assert_int_equal(g.n_eos, 2);
    assert_int_equal(g.eos_token_ids[0], 151645);
    assert_int_equal(g.eos_token_ids[1], 151643);
    assert_int_equal(g.bos_token_id, 151643);
    assert_true(g.has_temperature && g.has_top_p && g.has_top_k);
    assert_near(g.temperature, 0.6);
    assert_near(g.top_p, 0.95);
    assert_int_equal(g.top_k, 20);
    assert_false(g.has_min_p);

    const char *bad = "{\"temperature\": \"hot\"}";
    assert_int_equal(generation_config_parse(&g, bad, strlen(bad), "generation_config.json", &c, &err), -1);
    assert_contains(err.msg, "generation_config.json: field 'temperature' must be a number, found string");
    bad = "{\"top_p\": 1.5}";
    assert_int_equal(generation_config_parse(&g, bad, strlen(bad), "generation_config.json", &c, &err), -1);
    assert_contains(err.msg, "field 'top_p' must be in (0, 1]");
    bad = "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}";
    assert_int_equal(generation_config_parse(&g, bad, strlen(bad), "generation_config.json", &c, &err), -1);
    assert_contains(err.msg, "field 'eos_token_id' lists 9 token ids, at most 8");
    bad = "{";
    assert_int_equal(generation_config_parse(&g, bad, strlen(bad), "generation_config.json", NULL, &err), -1);
    assert_contains(err.msg, "generation_config.json:1:");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_dense),     cmocka_unit_test(test_tiny_moe),
        cmocka_unit_test(test_real_configs),   cmocka_unit_test(test_rope_spellings),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_generation_config), cmocka_unit_test(test_family_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
