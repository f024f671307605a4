/* fuzz_config.c — arbitrary bytes as config.json, then as
 * generation_config.json over the result: parse or fail with a message, and
 * a parsed config must satisfy what the model code relies on (its
 * quantization_config's module list is matched against a few names). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct model_config cfg;
    struct generation_config gc;
    struct kiln_error err;
    err.msg[0] = 0;
    const char *text = (const char *)data;
    int ok = model_config_parse(&cfg, text, size, "config.json", &err) == 0;
    if (ok) {
        KILN_ASSERT(cfg.arch >= 0 && cfg.arch < ARCH_COUNT);
        KILN_ASSERT(cfg.hidden_size > 0 && cfg.n_layers > 0 && cfg.vocab_size > 0);
        KILN_ASSERT(cfg.n_heads > 0 && cfg.n_kv_heads > 0);
        /* grouped-query attention needs whole groups; MLA (a latent cache,
         * one shared KV head) ignores num_key_value_heads, as transformers does */
        KILN_ASSERT(cfg.kv_lora_rank > 0 || cfg.n_heads % cfg.n_kv_heads == 0);
        KILN_ASSERT(cfg.head_dim > 0);
        KILN_ASSERT(cfg.n_eos >= 0 && cfg.n_eos <= MODEL_MAX_EOS);
        KILN_ASSERT(cfg.n_experts_per_tok <= cfg.n_experts || cfg.n_experts == 0);
        int n = cfg.n_layers < 4096 ? cfg.n_layers : 4096;
        for (int l = -1; l <= n; l++) (void)model_config_layer_is_moe(&cfg, l);
        (void)model_arch_name(cfg.arch);
        KILN_ASSERT(cfg.quant.n_skip >= 0 && cfg.quant.n_skip <= MODEL_QUANT_MAX_SKIP);
        /* FP8 has its blocks; MXFP4's are fixed by the format (32 values) */
        KILN_ASSERT(cfg.quant.method != MODEL_QUANT_FP8 ||
                    (cfg.quant.block_rows > 0 && cfg.quant.block_cols > 0));
        static const char *const names[] = {"lm_head.weight", "model.layers.0.mlp.gate.weight", "", ".",
                                            "a..b.weight", "model.layers.1.self_attn.q_proj"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            (void)model_quant_skips(&cfg.quant, names[i]);
    } else {
        KILN_ASSERT(err.msg[0] != 0);
    }
    err.msg[0] = 0;
    if (generation_config_parse(&gc, text, size, "generation_config.json", ok ? &cfg : NULL, &err))
        KILN_ASSERT(err.msg[0] != 0);
    else
        KILN_ASSERT(gc.n_eos >= 0 && gc.n_eos <= MODEL_MAX_EOS);
    return 0;
}
