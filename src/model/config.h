/* config.h — a model's config.json and generation_config.json, parsed.
 *
 * One struct for every supported architecture; fields an architecture does
 * not use stay 0. Both the hub spelling (rope_theta + rope_scaling) and
 * transformers v5's rope_parameters are accepted. Missing required fields,
 * wrong types and unknown model types give an error naming the file and
 * the field.
 */
#ifndef KILN_MODEL_CONFIG_H
#define KILN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

struct kiln_error;

enum model_arch {
    ARCH_LLAMA = 0,
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_QWEN2_MOE,
    ARCH_QWEN3_MOE,
    ARCH_DEEPSEEK_V2,
    ARCH_DEEPSEEK_V3,
    ARCH_MISTRAL,
    ARCH_GEMMA3,
    ARCH_GPT_OSS,
    ARCH_COUNT
};

enum rope_type { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN };

struct rope_config {
    enum rope_type type;
    double theta;
    double factor;                  /* linear, llama3, yarn */
    double low_freq_factor;         /* llama3 */
    double high_freq_factor;        /* llama3 */
    double original_max_positions;  /* llama3, yarn */
    double beta_fast, beta_slow;    /* yarn */
    double mscale, mscale_all_dim;  /* yarn (DeepSeek); 0 = absent */
    double attention_factor;        /* yarn; 0 = derive from factor */
    int no_truncate;                /* yarn truncate false: the correction range's ends are not
                                       rounded to whole dimensions (gpt-oss) */
    int interleaved;                /* rotate pairs (2i, 2i+1) instead of (i, i + d/2):
                                       deepseek_v3 rope_interleave (default true); always for
                                       deepseek_v2 (transformers rotates complex pairs) */
};

enum moe_scoring { MOE_SCORING_SOFTMAX = 0, MOE_SCORING_SIGMOID };

/* How experts are picked from the scores (DeepSeek's topk_method):
 * GREEDY: plain top-k of the scores (qwen moe, deepseek_v2 "greedy").
 * GROUP_LIMITED: deepseek_v2 "group_limited_greedy": a group's score is its
 *   best expert; keep the topk_group best groups; top-k within them.
 * NOAUX_TC: deepseek_v3: choose with scores + e_score_correction_bias; a
 *   group's score is the sum of its two best biased scores; the weights are
 *   the unbiased scores of the chosen experts. */
enum moe_topk_method { MOE_TOPK_GREEDY = 0, MOE_TOPK_GROUP_LIMITED, MOE_TOPK_NOAUX_TC };

#define MODEL_MAX_EOS 8
/* The most layers a model with a sliding window may have. */
#define MODEL_MAX_WINDOW_LAYERS 1024

/* Weight quantization: config.json's quantization_config, or what
 * model_options.quantization made of an unquantized checkpoint at load. */
enum model_quant_method { MODEL_QUANT_NONE = 0, MODEL_QUANT_FP8, MODEL_QUANT_MXFP4 };

/* Module names quantization_config lists as not converted, at most (real
 * FP8 checkpoints list up to about a thousand: every layer's norms, router
 * and gates). */
#define MODEL_QUANT_MAX_SKIP 4096

/* MXFP4 (gpt-oss, quant_method "mxfp4"): the experts' fused tensors are
 * stored as `<name>_blocks` (uint8 [E, rows, cols / 32, 16]: 32 e2m1
 * values a block, two a byte, the low nibble first) and `<name>_scales`
 * (uint8 [E, rows, cols / 32]: the block's e8m0 exponent, value 2^(s -
 * 127)), rows x cols in nn.Linear's [out][in] order; everything else is
 * unquantized. A backend with MXFP4 experts (backend_ops.mxfp4_experts:
 * CUDA) keeps them MXFP4; elsewhere they are decoded exactly to bf16 at
 * load (model/gpt_oss_experts.c, tensor/mxfp4.h).
 *
 * FP8 block quantization as DeepSeek-V3 and Qwen3-FP8 write it:
 * quant_method "fp8", fmt "e4m3" (or absent), activation_scheme "dynamic"
 * (or absent), weight_block_size [B0, B1]. A projection stored as
 * F8_E4M3 `<name>` has its fp32 (or bf16/f16) block scales in
 * `<name>_scale_inv`, [ceil(rows / B0)][ceil(cols / B1)] (struct
 * backend_weight). Other methods, formats and static activation scales
 * are refused by the parser. */
struct model_quant {
    enum model_quant_method method;
    int block_rows, block_cols;   /* weight_block_size [B0, B1] */
    /* modules_to_not_convert and ignored_layers together: the names'
     * 64-bit FNV-1a hashes, sorted, without repeats (model_quant_skips) */
    int n_skip;
    uint64_t skip[MODEL_QUANT_MAX_SKIP];
};

/* One rank's share of a model split over ranks (model_options.par;
 * docs/distributed.md), set by model_load; zeroed for a whole model. The
 * config of a split model describes its rank, so that every shape the
 * kernels, the KV cache and the memory plan see is the rank's:
 * n_heads, n_kv_heads (1 where a KV head is replicated),
 * intermediate_size, shared_expert_intermediate_size and, when the
 * experts are split by columns, moe_intermediate_size are this rank's
 * (the whole model's divided by tp_size). vocab_size and n_experts stay
 * the whole model's (the router and the logits are whole); the rank's
 * rows and experts are below. */
struct model_shard {
    int tp_size, tp_rank; /* 0: not split */
    int ep_size;          /* 1: experts split by columns; tp_size: whole experts split */
    int kv_heads;         /* the whole model's num_key_value_heads (MHA) */
    int expert0, n_experts; /* this rank's routed experts [expert0, expert0 + n_experts) */
    long vocab0, vocab_rows; /* this rank's rows of the embedding and lm_head */
    long vocab_stride;       /* the most rows any rank holds: ceil(vocab_size / tp_size) */
    /* DP attention (model_parallel.dp_size > 1): the attention of the
     * rank's data parallel group (dp_rank), its heads split over the
     * attn_tp_size ranks of the group (attn_tp_rank); 0: off, the
     * attention splits over tp_size like the rest */
    int dp_size, dp_rank;
    int attn_tp_size, attn_tp_rank;
    /* pipeline parallel (model/pipeline.c): this rank's stage of pp_size
     * (0: not split) holds layers [layer0, layer1) of n_layers */
    int pp_size, pp_rank, layer0, layer1;
};

struct model_config {
    enum model_arch arch;
    char model_type[32];
    enum dtype dtype;            /* torch_dtype / dtype; BF16 when absent */

    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;                /* explicit head_dim, else hidden / heads (qwen3: 128, as
                                    transformers); deepseek: qk_rope_head_dim, as transformers */
    int intermediate_size;       /* dense MLP */
    int max_position_embeddings;
    double rms_norm_eps;
    int tie_word_embeddings;
    int attention_bias;          /* q/k/v projection biases (qwen2, qwen2_moe; llama/qwen3
                                    attention_bias; deepseek: q_a/kv_a projections) */
    int o_proj_bias;             /* output projection bias (llama/qwen3/deepseek attention_bias;
                                    never for qwen2/qwen2_moe) */
    int qk_norm;                 /* per-head RMSNorm on q and k (qwen3, qwen3_moe) */
    struct rope_config rope;

    /* Read so that a family can refuse what it does not implement
     * (model_family.check_config). */
    char hidden_act[32];          /* hidden_act (or Gemma's hidden_activation); "silu" when absent */
    char hidden_act_key[24];      /* the field it came from */
    double partial_rotary_factor; /* share of head_dim rotated; 1 when absent */
    int sliding_window;           /* window some layer slides over; 0: every layer attends fully */
    uint8_t layer_slides[MODEL_MAX_WINDOW_LAYERS]; /* 1 for the sliding layers by the config
                                                      (model_config_layer_slides) */
    int mlp_bias;                 /* mlp_bias true */

    /* Gemma-3 (gemma3_text; gemma3's text_config) */
    int norm_plus_one;            /* RMSNorm weights read as 1 + w (every norm, q/k norms too) */
    int sandwich_norms;           /* post-attention, pre- and post-feedforward norms */
    double embed_scale;           /* the embedding is multiplied by it; 0: not scaled */
    double query_pre_attn_scalar; /* the attention scale is its -1/2 power; 0: head_dim's */
    double rope_local_theta;      /* sliding layers' rope base (rope_local_base_freq); 0: theirs
                                     is the global rope */
    double attn_logit_softcapping, final_logit_softcapping; /* 0: none */
    int bidirectional;            /* use_bidirectional_attention true */
    /* gpt-oss */
    int attn_sinks;               /* self_attn.sinks: a softmax logit per head (attn_params.sinks) */
    double swiglu_limit;          /* > 0: the experts' biases and clamped SwiGLU
                                     (moe_experts.act MOE_ACT_SWIGLU_CLAMP) */
    int multimodal;               /* gemma3: the language model of an image-text checkpoint
                                     (text_config; its tensors under language_model.*) */

    /* Mixture of experts (0 experts = dense everywhere). */
    int n_experts;
    int n_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size; /* qwen2_moe: one gated shared expert */
    int n_shared_experts;                /* deepseek: shared experts, summed */
    int norm_topk_prob;
    enum moe_scoring scoring;            /* deepseek_v3: sigmoid; others softmax */
    enum moe_topk_method topk_method;
    int n_group, topk_group;             /* deepseek grouped top-k */
    double routed_scaling_factor;        /* 1.0 when absent */
    int has_score_correction_bias;       /* deepseek_v3 noaux_tc */
    int first_k_dense_replace;           /* deepseek: first k layers dense */
    int moe_layer_freq;                  /* deepseek */
    int decoder_sparse_step;             /* qwen moe */
    int n_mlp_only_layers;               /* qwen moe: listed layers are dense */
    int mlp_only_layers[64];

    /* Multi-head latent attention (deepseek). kv_lora_rank 0 = not MLA. */
    int q_lora_rank;                     /* 0 = q projected directly */
    int kv_lora_rank;
    int qk_nope_head_dim;
    int qk_rope_head_dim;
    int v_head_dim;

    int bos_token_id;                    /* -1 when null/absent */
    int n_eos;
    int eos_token_ids[MODEL_MAX_EOS];

    struct model_quant quant;            /* quantization_config; method NONE when absent */
    struct model_shard shard;            /* zeroed: the whole model */
};

struct generation_config {
    int bos_token_id;                    /* -1 when absent */
    int n_eos;
    int eos_token_ids[MODEL_MAX_EOS];
    int has_temperature, has_top_p, has_top_k;
    double temperature, top_p;
    int top_k;
    int has_min_p, has_repetition_penalty;
    double min_p, repetition_penalty;
};

/* Parses config.json text; `file` only names it in messages. Fuzzed. */
int model_config_parse(struct model_config *cfg, const char *text, size_t len, const char *file,
                       struct kiln_error *err);
int model_config_load(struct model_config *cfg, const char *path, struct kiln_error *err);
/* A missing file is not an error: the config's eos/bos are used instead. */
int generation_config_load(struct generation_config *gc, const char *path,
                           const struct model_config *cfg, struct kiln_error *err);
/* Parses generation_config.json text over defaults taken from `cfg` (may be
 * NULL). Fuzzed. */
int generation_config_parse(struct generation_config *gc, const char *text, size_t len,
                            const char *file, const struct model_config *cfg,
                            struct kiln_error *err);

/* 1 when quantization_config lists module `name` as not converted (a
 * tensor name's ".weight" is dropped first): an entry equal to it, to one
 * of its ancestors ("model.layers.3.mlp" covers "model.layers.3.mlp.gate")
 * or to a tail of its dotted path ("mlp.gate", "lm_head"), as transformers
 * matches them. */
int model_quant_skips(const struct model_quant *q, const char *name);

/* The sliding window layer `l` attends over (attn_params.window); 0: the
 * whole context. */
int model_config_layer_window(const struct model_config *c, int layer);
/* Whether layer `l` is a sliding layer by the config (layer_types, the
 * pattern), whether or not its window is shorter than the context. */
int model_config_layer_slides(const struct model_config *c, int layer);
/* The window every layer slides over, when all do (Mistral with
 * sliding_window); 0 when some layer attends to the whole context. */
int model_config_all_window(const struct model_config *c);
/* The window of the sliding layers of a model that has both sliding
 * layers and layers that attend to the whole context (Gemma-3, gpt-oss);
 * 0 otherwise. */
int model_config_hybrid_window(const struct model_config *c);

/* Whether layer `l` has a mixture-of-experts MLP. */
int model_config_layer_is_moe(const struct model_config *cfg, int layer);
const char *model_arch_name(enum model_arch arch);

#endif
