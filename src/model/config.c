#include "model/config.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_util.h"
#include "base/file.h"
#include "model/model_internal.h"

/* Per-architecture facts and the transformers defaults that differ between
 * them. One row per model_type, naming its family (model_internal.h);
 * everything else is shared code. */
struct arch_desc {
    const char *name;
    enum model_arch arch;
    const struct model_family *family;
    int default_max_positions;
    int qk_norm;       /* qwen3: RMSNorm on each q and k head */
    int default_head_dim; /* 0 = hidden / heads */
    int slide_switch;  /* sliding_window applies only with use_sliding_window (qwen) */
    int window_ok;     /* the family runs this type's sliding windows (attn_params.window) */
    int default_window; /* sliding_window when the field is absent (null: none) */
};

static const struct arch_desc arch_table[ARCH_COUNT] = {
    {"llama", ARCH_LLAMA, &family_llama, 2048, 0, 0, 0, 0, 0},
    {"qwen2", ARCH_QWEN2, &family_llama, 32768, 0, 0, 1, 0, 0},
    /* Qwen3Config declares head_dim = 128 rather than deriving it. */
    {"qwen3", ARCH_QWEN3, &family_llama, 32768, 1, 128, 1, 0, 0},
    {"qwen2_moe", ARCH_QWEN2_MOE, &family_qwen_moe, 32768, 0, 0, 1, 0, 0},
    {"qwen3_moe", ARCH_QWEN3_MOE, &family_qwen_moe, 32768, 1, 0, 1, 0, 0},
    {"deepseek_v2", ARCH_DEEPSEEK_V2, &family_deepseek, 2048, 0, 0, 0, 0, 0},
    {"deepseek_v3", ARCH_DEEPSEEK_V3, &family_deepseek, 4096, 0, 0, 0, 0, 0},
    /* MistralConfig: 4096 * 32 positions, a window of 4096 unless the file
     * says (null: none) */
    {"mistral", ARCH_MISTRAL, &family_llama, 131072, 0, 0, 0, 1, 4096},
    /* Gemma3TextConfig: head_dim 256, a window of 4096 */
    {"gemma3_text", ARCH_GEMMA3, &family_gemma3, 131072, 1, 256, 0, 1, 4096},
    /* GptOssConfig: head_dim 64, a window of 128 */
    {"gpt_oss", ARCH_GPT_OSS, &family_gpt_oss, 131072, 0, 64, 0, 1, 128},
};

const struct model_family *model_family_of(const struct model_config *c) {
    return arch_table[c->arch].family;
}

const char *model_arch_name(enum model_arch arch) {
    if ((int)arch < 0 || arch >= ARCH_COUNT) return "unknown";
    return arch_table[arch].name;
}

/* ---- typed field access with messages that name the field --------------- */

struct jr {
    const json_t *obj;
    const char *file;
    const char *prefix; /* "" or "rope_scaling." — how the field is named in messages */
    struct kiln_error *err;
};


static int type_error(const struct jr *r, const char *key, const char *want, const json_t *v) {
    return kiln_errorf(r->err, "%s: field '%s%s' must be %s, found %s", r->file, r->prefix, key,
                       want, json_kind(v));
}

static int missing(const struct jr *r, const char *key) {
    return kiln_errorf(r->err, "%s: field '%s%s' is missing", r->file, r->prefix, key);
}

/* Absent and null both mean "use the default" unless `required`. */
static const json_t *field(const struct jr *r, const char *key) {
    const json_t *v = json_object_get(r->obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int rd_int(const struct jr *r, const char *key, int required, int def, int min, int *out) {
    const json_t *v = field(r, key);
    if (!v) {
        if (required) return missing(r, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return type_error(r, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < min)
        return kiln_errorf(r->err, "%s: field '%s%s' must be at least %d, found %lld", r->file,
                           r->prefix, key, min, (long long)x);
    if (x > INT_MAX)
        return kiln_errorf(r->err, "%s: field '%s%s' is too large (%lld)", r->file, r->prefix, key,
                           (long long)x);
    *out = (int)x;
    return 0;
}

static int rd_double(const struct jr *r, const char *key, int required, double def, double *out) {
    const json_t *v = field(r, key);
    if (!v) {
        if (required) return missing(r, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return type_error(r, key, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x))
        return kiln_errorf(r->err, "%s: field '%s%s' must be finite", r->file, r->prefix, key);
    *out = x;
    return 0;
}

/* Strictly positive doubles (eps, theta, factors). */
static int rd_pos_double(const struct jr *r, const char *key, int required, double def,
                         double *out) {
    if (rd_double(r, key, required, def, out)) return -1;
    if (!(*out > 0) && field(r, key))
        return kiln_errorf(r->err, "%s: field '%s%s' must be positive, found %g", r->file, r->prefix,
                           key, *out);
    return 0;
}

static int rd_bool(const struct jr *r, const char *key, int def, int *out) {
    const json_t *v = field(r, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return type_error(r, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/* NULL (no error) when absent or null. */
static int rd_str(const struct jr *r, const char *key, const char **out) {
    const json_t *v = field(r, key);
    *out = NULL;
    if (!v) return 0;
    if (!json_is_string(v)) return type_error(r, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* Matches a string field against a list; `names` ends with NULL. */
static int rd_enum(const struct jr *r, const char *key, const char *const *names, int def,
                   int *out) {
    const char *s;
    if (rd_str(r, key, &s)) return -1;
    if (!s) {
        *out = def;
        return 0;
    }
    for (int i = 0; names[i]; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    }
    char list[256] = "";
    size_t n = 0;
    for (int i = 0; names[i] && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", names[i]);
    return kiln_errorf(r->err, "%s: field '%s%s' is '%.64s', expected one of: %s", r->file,
                       r->prefix, key, s, list);
}

/* eos_token_id / bos_token_id style: an int, a list of ints, or null. */
static int rd_token_ids(const struct jr *r, const char *key, int *ids, int *n, int *present) {
    const json_t *v = json_object_get(r->obj, key);
    *present = v != NULL;
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
            return kiln_errorf(r->err, "%s: field '%s' must be a token id, found %lld", r->file,
                               key, (long long)json_integer_value(v));
        ids[0] = (int)json_integer_value(v);
        *n = 1;
        return 0;
    }
    if (!json_is_array(v)) return type_error(r, key, "an integer or a list of integers", v);
    if (json_array_size(v) > MODEL_MAX_EOS)
        return kiln_errorf(r->err, "%s: field '%s' lists %zu token ids, at most %d supported",
                           r->file, key, json_array_size(v), MODEL_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT_MAX)
            return kiln_errorf(r->err, "%s: field '%s[%zu]' must be a token id", r->file, key, i);
        ids[(*n)++] = (int)json_integer_value(e);
    }
    return 0;
}

static int rd_bos(const struct jr *r, int *bos) {
    int ids[MODEL_MAX_EOS], n, present;
    const json_t *v = json_object_get(r->obj, "bos_token_id");
    if (v && json_is_array(v)) return type_error(r, "bos_token_id", "an integer", v);
    if (rd_token_ids(r, "bos_token_id", ids, &n, &present)) return -1;
    *bos = n ? ids[0] : -1;
    return 0;
}

static json_t *load_json(const char *text, size_t len, const char *file, struct kiln_error *err) {
    json_error_t jerr;
    json_t *root = json_load_checkpoint(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        kiln_errorf(err, "%s:%d:%d: invalid JSON: %s", file, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        kiln_errorf(err, "%s: must be a JSON object, found %s", file, json_kind(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* ---- rope ----------------------------------------------------------------- */

/* transformers v5 writes rope_parameters (rope_theta inside); the hub writes
 * rope_theta at the top and rope_scaling beside it (null when unscaled).
 * Either way the same keys describe the scaling. When a file has both,
 * rope_scaling wins, as in transformers' conversion. */
static int parse_rope(struct model_config *c, const struct jr *top, const struct arch_desc *a) {
    struct rope_config *rp = &c->rope;
    const json_t *params = json_object_get(top->obj, "rope_scaling");
    const char *pname = "rope_scaling.";
    if (params && !json_is_null(params) && !json_is_object(params))
        return type_error(top, "rope_scaling", "an object or null", params);
    if (!params || json_is_null(params)) {
        params = json_object_get(top->obj, "rope_parameters");
        pname = "rope_parameters.";
        if (params && !json_is_null(params) && !json_is_object(params))
            return type_error(top, "rope_parameters", "an object or null", params);
        if (params && json_is_null(params)) params = NULL;
        /* Per-layer-type form ({"full_attention": {...}}): these models have
         * full attention only. */
        const json_t *full = params ? json_object_get(params, "full_attention") : NULL;
        if (json_is_object(full)) {
            params = full;
            pname = "rope_parameters.full_attention.";
        }
    }
    struct jr r = {params, top->file, pname, top->err};

    /* theta: inside rope_parameters when given there, else at the top. */
    double top_theta;
    double theta_def = a->arch == ARCH_GEMMA3 ? 1e6 : a->arch == ARCH_GPT_OSS ? 150000.0 : 10000.0;
    if (rd_pos_double(top, "rope_theta", 0, theta_def, &top_theta))
        return -1;
    rp->theta = top_theta;
    if (params && rd_pos_double(&r, "rope_theta", 0, top_theta, &rp->theta)) return -1;

    rp->type = ROPE_DEFAULT;
    if (params) {
        static const char *const names[] = {"default", "linear", "llama3", "yarn", NULL};
        const char *key = field(&r, "rope_type") ? "rope_type" : "type";
        int t;
        if (rd_enum(&r, key, names, ROPE_DEFAULT, &t)) return -1;
        rp->type = (enum rope_type)t;
    }

    double orig_default = (double)c->max_position_embeddings;
    switch (rp->type) {
    case ROPE_DEFAULT: break;
    case ROPE_LINEAR:
        if (rd_pos_double(&r, "factor", 1, 0, &rp->factor)) return -1;
        break;
    case ROPE_LLAMA3:
        if (rd_pos_double(&r, "factor", 1, 0, &rp->factor) ||
            rd_pos_double(&r, "low_freq_factor", 1, 0, &rp->low_freq_factor) ||
            rd_pos_double(&r, "high_freq_factor", 1, 0, &rp->high_freq_factor) ||
            rd_pos_double(&r, "original_max_position_embeddings", 1, 0,
                          &rp->original_max_positions))
            return -1;
        if (rp->high_freq_factor <= rp->low_freq_factor)
            return kiln_errorf(top->err, "%s: %shigh_freq_factor (%g) must exceed low_freq_factor (%g)",
                               top->file, pname, rp->high_freq_factor, rp->low_freq_factor);
        break;
    case ROPE_YARN:
        if (rd_pos_double(&r, "original_max_position_embeddings", 0, orig_default,
                          &rp->original_max_positions))
            return -1;
        /* Without a factor, transformers uses the context extension ratio. */
        if (rd_pos_double(&r, "factor", 0, c->max_position_embeddings / rp->original_max_positions,
                          &rp->factor) ||
            rd_double(&r, "beta_fast", 0, 32.0, &rp->beta_fast) ||
            rd_double(&r, "beta_slow", 0, 1.0, &rp->beta_slow) ||
            rd_double(&r, "mscale", 0, 0.0, &rp->mscale) ||
            rd_double(&r, "mscale_all_dim", 0, 0.0, &rp->mscale_all_dim) ||
            rd_double(&r, "attention_factor", 0, 0.0, &rp->attention_factor))
            return -1;
        /* truncate (default true): round the correction range's ends to
         * whole dimensions; gpt-oss says false */
        int truncate = 1;
        if (rd_bool(&r, "truncate", 1, &truncate)) return -1;
        rp->no_truncate = !truncate;
        break;
    }

    /* DeepSeek-V2's transformers code rotates (2i, 2i+1) pairs as complex
     * numbers with no switch; V3 makes it a config field. */
    rp->interleaved = a->arch == ARCH_DEEPSEEK_V2;
    if (a->arch == ARCH_DEEPSEEK_V3 && rd_bool(top, "rope_interleave", 1, &rp->interleaved))
        return -1;
    return 0;
}

/* ---- mixture of experts ---------------------------------------------------- */

static int parse_qwen_moe(struct model_config *c, const struct jr *r) {
    /* transformers v5 renamed qwen3_moe's num_experts to num_local_experts. */
    const char *nkey = field(r, "num_experts") ? "num_experts" : "num_local_experts";
    if (!field(r, nkey))
        return kiln_errorf(r->err, "%s: field 'num_experts' (or 'num_local_experts') is missing",
                           r->file);
    if (rd_int(r, nkey, 1, 0, 1, &c->n_experts) ||
        rd_int(r, "num_experts_per_tok", 1, 0, 1, &c->n_experts_per_tok) ||
        rd_int(r, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate_size) ||
        rd_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob) ||
        rd_int(r, "decoder_sparse_step", 0, 1, 1, &c->decoder_sparse_step))
        return -1;
    if (c->arch == ARCH_QWEN2_MOE &&
        rd_int(r, "shared_expert_intermediate_size", 1, 0, 1, &c->shared_expert_intermediate_size))
        return -1;
    c->scoring = MOE_SCORING_SOFTMAX;
    c->topk_method = MOE_TOPK_GREEDY;
    c->n_group = c->topk_group = 1;
    c->routed_scaling_factor = 1.0;

    const json_t *m = field(r, "mlp_only_layers");
    if (m) {
        if (!json_is_array(m)) return type_error(r, "mlp_only_layers", "a list of layer indices", m);
        size_t n = json_array_size(m);
        if (n > sizeof c->mlp_only_layers / sizeof c->mlp_only_layers[0])
            return kiln_errorf(r->err, "%s: field 'mlp_only_layers' lists %zu layers, at most %zu supported",
                               r->file, n, sizeof c->mlp_only_layers / sizeof c->mlp_only_layers[0]);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(m, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= c->n_layers)
                return kiln_errorf(r->err, "%s: field 'mlp_only_layers[%zu]' must be a layer index below %d",
                                   r->file, i, c->n_layers);
            c->mlp_only_layers[c->n_mlp_only_layers++] = (int)json_integer_value(e);
        }
    }
    return 0;
}

static int parse_deepseek(struct model_config *c, const struct jr *r) {
    int v3 = c->arch == ARCH_DEEPSEEK_V3;
    static const char *const methods[] = {"greedy", "group_limited_greedy", "noaux_tc", NULL};
    static const char *const scorings[] = {"softmax", "sigmoid", NULL};
    int method, scoring;
    /* n_shared_experts: null means none (transformers skips the module). */
    int shared_default = json_is_null(json_object_get(r->obj, "n_shared_experts")) ? 0 : v3 ? 1 : 2;

    if (rd_int(r, "n_routed_experts", 1, 0, 1, &c->n_experts) ||
        rd_int(r, "num_experts_per_tok", 1, 0, 1, &c->n_experts_per_tok) ||
        rd_int(r, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate_size) ||
        rd_int(r, "n_shared_experts", 0, shared_default, 0, &c->n_shared_experts) ||
        rd_int(r, "first_k_dense_replace", 0, v3 ? 3 : 0, 0, &c->first_k_dense_replace) ||
        rd_int(r, "moe_layer_freq", 0, 1, 1, &c->moe_layer_freq) ||
        rd_int(r, "n_group", 0, v3 ? 8 : 1, 1, &c->n_group) ||
        rd_int(r, "topk_group", 0, v3 ? 4 : 1, 1, &c->topk_group) ||
        rd_enum(r, "topk_method", methods, v3 ? MOE_TOPK_NOAUX_TC : MOE_TOPK_GREEDY, &method) ||
        rd_enum(r, "scoring_func", scorings, v3 ? MOE_SCORING_SIGMOID : MOE_SCORING_SOFTMAX,
                &scoring) ||
        rd_pos_double(r, "routed_scaling_factor", 0, 1.0, &c->routed_scaling_factor) ||
        rd_bool(r, "norm_topk_prob", v3, &c->norm_topk_prob))
        return -1;
    c->topk_method = (enum moe_topk_method)method;
    c->scoring = (enum moe_scoring)scoring;
    c->has_score_correction_bias = c->topk_method == MOE_TOPK_NOAUX_TC;

    if (c->n_experts % c->n_group)
        return kiln_errorf(r->err, "%s: n_routed_experts (%d) must be divisible by n_group (%d)",
                           r->file, c->n_experts, c->n_group);
    if (c->topk_group > c->n_group)
        return kiln_errorf(r->err, "%s: topk_group (%d) must not exceed n_group (%d)", r->file,
                           c->topk_group, c->n_group);
    if (c->topk_method != MOE_TOPK_GREEDY &&
        c->n_experts_per_tok > c->topk_group * (c->n_experts / c->n_group))
        return kiln_errorf(r->err,
                           "%s: num_experts_per_tok (%d) exceeds the experts in topk_group (%d) "
                           "groups of %d",
                           r->file, c->n_experts_per_tok, c->topk_group, c->n_experts / c->n_group);

    /* Multi-head latent attention. q_lora_rank: null = q projected directly;
     * absent is ambiguous (transformers would assume 1536), so it must be
     * written out. */
    const json_t *q = json_object_get(r->obj, "q_lora_rank");
    if (!q)
        return kiln_errorf(r->err, "%s: field 'q_lora_rank' is missing (null for no q compression)",
                           r->file);
    if (rd_int(r, "q_lora_rank", 0, 0, 1, &c->q_lora_rank) ||
        rd_int(r, "kv_lora_rank", 1, 0, 1, &c->kv_lora_rank) ||
        rd_int(r, "qk_nope_head_dim", 1, 0, 1, &c->qk_nope_head_dim) ||
        rd_int(r, "qk_rope_head_dim", 1, 0, 2, &c->qk_rope_head_dim) ||
        rd_int(r, "v_head_dim", 1, 0, 1, &c->v_head_dim))
        return -1;
    if (c->qk_rope_head_dim % 2)
        return kiln_errorf(r->err, "%s: field 'qk_rope_head_dim' must be even, found %d", r->file,
                           c->qk_rope_head_dim);
    /* transformers sets head_dim to the rotary part whatever the file says. */
    c->head_dim = c->qk_rope_head_dim;
    return 0;
}

/* gpt-oss (GptOssConfig): every layer a mixture of experts of
 * intermediate_size, routed by a biased router whose top-k logits are
 * softmaxed (the same weights as a softmax over all experts renormalised
 * over the chosen ones), experts with biases and the clamped SwiGLU; an
 * attention sink per head. */
static int parse_gpt_oss(struct model_config *c, const struct jr *r) {
    if (rd_int(r, "num_local_experts", 0, 128, 1, &c->n_experts) ||
        rd_int(r, "num_experts_per_tok", 0, 4, 1, &c->n_experts_per_tok) ||
        rd_pos_double(r, "swiglu_limit", 0, 7.0, &c->swiglu_limit))
        return -1;
    /* transformers' GptOssExperts clamps at 7.0 whatever the field says */
    if (c->swiglu_limit != 7.0)
        return kiln_errorf(r->err, "%s: swiglu_limit %g is not supported (only 7.0, the limit "
                                   "transformers' gpt-oss experts apply)",
                           r->file, c->swiglu_limit);
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = 1;
    c->scoring = MOE_SCORING_SOFTMAX;
    c->topk_method = MOE_TOPK_GREEDY;
    c->n_group = c->topk_group = 1;
    c->routed_scaling_factor = 1.0;
    c->attn_sinks = 1;
    return 0;
}

/* ---- quantization_config ---------------------------------------------------- */

/* FNV-1a over bytes, continued from h (start: FNV_OFFSET). */
#define FNV_OFFSET 0xcbf29ce484222325ull
static uint64_t fnv1a(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* modules_to_not_convert / ignored_layers: a list of module names (null:
 * none). Names only: a regular expression would match other modules than
 * its spelling, so one is refused rather than half honoured. */
static int rd_skip_list(struct model_quant *q, const struct jr *r, const char *key) {
    const json_t *v = field(r, key);
    if (!v) return 0;
    if (!json_is_array(v)) return type_error(r, key, "a list of module names", v);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return kiln_errorf(r->err, "%s: field '%s%s[%zu]' must be a string, found %s", r->file,
                               r->prefix, key, i, json_kind(e));
        const char *s = json_string_value(e);
        size_t n = json_string_length(e);
        while (n && s[n - 1] == '.') n--; /* "model.layers.3." names the module too */
        if (!n || memchr(s, 0, n))
            return kiln_errorf(r->err, "%s: field '%s%s[%zu]' must be a module name, found '%.64s'",
                               r->file, r->prefix, key, i, s);
        for (size_t k = 0; k < n; k++)
            if (strchr("*?[](){}|^$\\+", s[k]))
                return kiln_errorf(r->err, "%s: field '%s%s[%zu]' is '%.64s': patterns are not "
                                           "supported, only module names",
                                   r->file, r->prefix, key, i, s);
        if (q->n_skip == MODEL_QUANT_MAX_SKIP)
            return kiln_errorf(r->err, "%s: field '%s%s' lists more than %d modules", r->file,
                               r->prefix, key, MODEL_QUANT_MAX_SKIP);
        q->skip[q->n_skip++] = fnv1a(FNV_OFFSET, s, n);
    }
    return 0;
}

/* quantization_config: FP8 block quantization (DeepSeek-V3, Qwen3-FP8) or
 * nothing; every other method, format or scheme is refused by name. */
static int parse_quant(struct model_config *c, const struct jr *top) {
    struct model_quant *q = &c->quant;
    const json_t *v = json_object_get(top->obj, "quantization_config");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return type_error(top, "quantization_config", "an object or null", v);
    struct jr r = {v, top->file, "quantization_config.", top->err};
    const char *method, *fmt, *act;
    if (rd_str(&r, "quant_method", &method)) return -1;
    if (!method) return missing(&r, "quant_method");
    if (!strcmp(method, "mxfp4")) {
        /* gpt-oss's published format: the experts' `_blocks` / `_scales`
         * tensors say what is quantized (modules_to_not_convert lists the
         * rest, with patterns: not read) */
        if (c->arch != ARCH_GPT_OSS)
            return kiln_errorf(r.err, "%s: quantization_config.quant_method 'mxfp4' is only "
                                      "supported for gpt_oss (its experts), not %s",
                               r.file, c->model_type);
        q->method = MODEL_QUANT_MXFP4;
        return 0;
    }
    if (strcmp(method, "fp8"))
        return kiln_errorf(r.err, "%s: quantization_config.quant_method '%.64s' is not supported "
                                  "(only fp8: block-quantized float8 e4m3 weights, the DeepSeek-V3 "
                                  "/ Qwen3-FP8 format; mxfp4 for gpt_oss)",
                           r.file, method);
    if (rd_str(&r, "fmt", &fmt) || rd_str(&r, "activation_scheme", &act)) return -1;
    if (fmt && strcmp(fmt, "e4m3"))
        return kiln_errorf(r.err, "%s: quantization_config.fmt '%.64s' is not supported (only "
                                  "e4m3: float8_e4m3fn weights)",
                           r.file, fmt);
    if (act && !strcmp(act, "static"))
        return kiln_errorf(r.err, "%s: quantization_config.activation_scheme 'static' is not "
                                  "supported (it needs the checkpoint's activation scales, which "
                                  "kiln does not read; only dynamic)",
                           r.file);
    if (act && strcmp(act, "dynamic"))
        return kiln_errorf(r.err, "%s: field 'quantization_config.activation_scheme' is '%.64s', "
                                  "expected dynamic",
                           r.file, act);
    const json_t *b = field(&r, "weight_block_size");
    if (!b)
        return kiln_errorf(r.err, "%s: field 'quantization_config.weight_block_size' is missing: "
                                  "per-tensor FP8 scales are not supported (only block scales, "
                                  "weight_block_size [B0, B1])",
                           r.file);
    int bs[2];
    for (int i = 0; i < 2; i++) {
        const json_t *e = json_is_array(b) && json_array_size(b) == 2 ? json_array_get(b, (size_t)i) : NULL;
        if (!e || !json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > INT_MAX)
            return kiln_errorf(r.err, "%s: field 'quantization_config.weight_block_size' must be "
                                      "two positive integers [B0, B1]",
                               r.file);
        bs[i] = (int)json_integer_value(e);
    }
    q->method = MODEL_QUANT_FP8;
    q->block_rows = bs[0], q->block_cols = bs[1];
    if (rd_skip_list(q, &r, "modules_to_not_convert") || rd_skip_list(q, &r, "ignored_layers"))
        return -1;
    qsort(q->skip, (size_t)q->n_skip, sizeof q->skip[0], cmp_u64);
    int n = 0;
    for (int i = 0; i < q->n_skip; i++)
        if (!n || q->skip[i] != q->skip[n - 1]) q->skip[n++] = q->skip[i];
    q->n_skip = n;
    return 0;
}

static int skip_has(const struct model_quant *q, uint64_t h) {
    return bsearch(&h, q->skip, (size_t)q->n_skip, sizeof h, cmp_u64) != NULL;
}

int model_quant_skips(const struct model_quant *q, const char *name) {
    if (!q->n_skip) return 0;
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, ".weight")) n -= 7;
    /* the module itself and its ancestors: every prefix ending before a dot */
    uint64_t h = FNV_OFFSET;
    size_t done = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && name[i] != '.') continue;
        h = fnv1a(h, name + done, i - done);
        if (skip_has(q, h)) return 1;
        h = fnv1a(h, ".", 1);
        done = i + 1;
    }
    /* tails after a dot */
    for (size_t i = 0; i < n; i++)
        if (name[i] == '.' && skip_has(q, fnv1a(FNV_OFFSET, name + i + 1, n - i - 1))) return 1;
    return 0;
}

/* ---- gemma-3 --------------------------------------------------------------- */

/* Gemma3TextConfig's fields and defaults. The sliding layers' rope base is
 * rope_local_base_freq, or (transformers v5) rope_parameters'
 * sliding_attention.rope_theta; the global layers' rope is parse_rope's. */
static int parse_gemma3(struct model_config *c, const struct jr *r) {
    c->norm_plus_one = 1;
    c->sandwich_norms = 1;
    /* Gemma3TextScaledWordEmbedding multiplies by √hidden_size cast to the
     * embedding's dtype */
    float es = sqrtf((float)c->hidden_size);
    if (c->dtype == DTYPE_BF16) es = bf16_to_f32(f32_to_bf16(es));
    else if (c->dtype == DTYPE_F16) es = f16_to_f32(f32_to_f16(es));
    c->embed_scale = es;
    if (rd_pos_double(r, "query_pre_attn_scalar", 0, 256.0, &c->query_pre_attn_scalar) ||
        rd_pos_double(r, "rope_local_base_freq", 0, 10000.0, &c->rope_local_theta) ||
        rd_double(r, "attn_logit_softcapping", 0, 0.0, &c->attn_logit_softcapping) ||
        rd_double(r, "final_logit_softcapping", 0, 0.0, &c->final_logit_softcapping) ||
        rd_bool(r, "use_bidirectional_attention", 0, &c->bidirectional))
        return -1;
    const json_t *rp = json_object_get(r->obj, "rope_parameters");
    const json_t *sl = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
    if (json_is_object(sl)) {
        struct jr sr = {sl, r->file, "rope_parameters.sliding_attention.", r->err};
        const char *t;
        if (rd_pos_double(&sr, "rope_theta", 0, c->rope_local_theta, &c->rope_local_theta) ||
            rd_str(&sr, "rope_type", &t))
            return -1;
        if (t && strcmp(t, "default"))
            return kiln_errorf(r->err, "%s: rope_parameters.sliding_attention.rope_type '%.32s' is "
                                       "not supported (only default)",
                               r->file, t);
    }
    return 0;
}

/* ---- variants -------------------------------------------------------------- */

/* The activation, partial rotary and sliding-window fields. The window is
 * in use when some layer slides over fewer positions than the context:
 * with qwen's switch only under use_sliding_window true (transformers
 * drops the window otherwise), on the layers at or past max_window_layers
 * or those layer_types names; without a switch, on every layer whenever a
 * window is given. */
static int parse_variants(struct model_config *c, const struct jr *r, const struct arch_desc *a) {
    const char *act = NULL, *key = field(r, "hidden_activation") ? "hidden_activation" : "hidden_act";
    if (rd_str(r, key, &act)) return -1;
    snprintf(c->hidden_act, sizeof c->hidden_act, "%s", act ? act : "silu");
    snprintf(c->hidden_act_key, sizeof c->hidden_act_key, "%s", key);
    if (rd_bool(r, "mlp_bias", 0, &c->mlp_bias) ||
        rd_pos_double(r, "partial_rotary_factor", 0, 1.0, &c->partial_rotary_factor))
        return -1;
    int window = 0, use = !a->slide_switch, max_window_layers = 0, sliding_layers = 0;
    int window_def = json_object_get(r->obj, "sliding_window") ? 0 : a->default_window;
    if (rd_int(r, "sliding_window", 0, window_def, 0, &window) ||
        (a->slide_switch && (rd_bool(r, "use_sliding_window", 0, &use) ||
                             rd_int(r, "max_window_layers", 0, 28, 0, &max_window_layers))))
        return -1;
    const json_t *lt = field(r, "layer_types");
    if (lt) {
        if (!json_is_array(lt)) return type_error(r, "layer_types", "a list of strings", lt);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const json_t *e = json_array_get(lt, i);
            if (!json_is_string(e))
                return kiln_errorf(r->err, "%s: field 'layer_types[%zu]' must be a string", r->file, i);
            if (!strcmp(json_string_value(e), "sliding_attention")) {
                sliding_layers++;
                if (i < MODEL_MAX_WINDOW_LAYERS) c->layer_slides[i] = 1;
            } else if (strcmp(json_string_value(e), "full_attention"))
                return kiln_errorf(r->err, "%s: field 'layer_types[%zu]' is '%.32s': only "
                                           "full_attention is supported",
                                   r->file, i, json_string_value(e));
        }
    } else if (a->arch == ARCH_GPT_OSS) {
        /* GptOssConfig without layer_types: even layers slide, odd ones are full */
        for (int i = 0; i < c->n_layers; i += 2) {
            sliding_layers++;
            if (i < MODEL_MAX_WINDOW_LAYERS) c->layer_slides[i] = 1;
        }
    } else if (a->arch == ARCH_GEMMA3) {
        /* Gemma-3 without layer_types: every pattern-th layer is global */
        int pattern;
        const char *pk = field(r, "sliding_window_pattern") ? "sliding_window_pattern"
                                                            : "_sliding_window_pattern";
        if (rd_int(r, pk, 0, 6, 1, &pattern)) return -1;
        for (int i = 0; i < c->n_layers; i++) {
            if ((i + 1) % pattern == 0) continue;
            sliding_layers++;
            if (i < MODEL_MAX_WINDOW_LAYERS) c->layer_slides[i] = 1;
        }
    } else {
        sliding_layers = c->n_layers - max_window_layers;
        for (int i = max_window_layers; i < c->n_layers && i < MODEL_MAX_WINDOW_LAYERS; i++)
            c->layer_slides[i] = 1;
    }
    if (use && window > 0 && window < c->max_position_embeddings && sliding_layers > 0) {
        if (c->n_layers > MODEL_MAX_WINDOW_LAYERS)
            return kiln_errorf(r->err, "%s: a sliding window over %d layers: at most %d supported",
                               r->file, c->n_layers, MODEL_MAX_WINDOW_LAYERS);
        c->sliding_window = window;
    }
    return 0;
}

int model_config_layer_slides(const struct model_config *c, int layer) {
    return layer >= 0 && layer < c->n_layers && layer < MODEL_MAX_WINDOW_LAYERS &&
           c->layer_slides[layer];
}

int model_config_layer_window(const struct model_config *c, int layer) {
    if (layer < 0 || layer >= c->n_layers || layer >= MODEL_MAX_WINDOW_LAYERS) return 0;
    return c->layer_slides[layer] ? c->sliding_window : 0;
}

int model_config_all_window(const struct model_config *c) {
    if (c->sliding_window <= 0 || c->n_layers < 1) return 0;
    for (int l = 0; l < c->n_layers; l++)
        if (model_config_layer_window(c, l) <= 0) return 0;
    return c->sliding_window;
}

int model_config_hybrid_window(const struct model_config *c) {
    if (c->sliding_window <= 0 || model_config_all_window(c)) return 0;
    for (int l = 0; l < c->n_layers; l++)
        if (model_config_layer_window(c, l) > 0) return c->sliding_window;
    return 0;
}

/* The sliding window is refused for the model types whose family does not
 * run it (window_ok). */
int family_check_common(const struct model_config *c, const char *file, struct kiln_error *err) {
    if (strcmp(c->hidden_act, "silu"))
        return kiln_errorf(err, "%s: %s '%.32s' is not supported (only silu)", file, c->hidden_act_key,
                           c->hidden_act);
    if (c->mlp_bias) return kiln_errorf(err, "%s: mlp_bias true is not supported", file);
    if (c->partial_rotary_factor != 1.0)
        return kiln_errorf(err, "%s: partial_rotary_factor %g is not supported (the whole head is "
                                "rotated)",
                           file, c->partial_rotary_factor);
    if (c->sliding_window > 0 && !arch_table[c->arch].window_ok)
        return kiln_errorf(err, "%s: sliding_window %d is in use (some layers would attend to fewer "
                                "positions than the context of %d): sliding-window attention is not "
                                "supported",
                           file, c->sliding_window, c->max_position_embeddings);
    return 0;
}

/* ---- the whole config ------------------------------------------------------ */

static int parse_config(struct model_config *c, const json_t *root, const char *file,
                        struct kiln_error *err);

/* gemma3 (Gemma3ForConditionalGeneration): text_config is the language
 * model, a gemma3_text config; kiln runs it alone, on text (the vision
 * tower's tensors are not read). The dtype and token ids may be given at
 * the top only. */
static int parse_gemma3_multimodal(struct model_config *c, const struct jr *r) {
    const json_t *tc = json_object_get(r->obj, "text_config");
    if (!tc || json_is_null(tc)) return missing(r, "text_config");
    if (!json_is_object(tc)) return type_error(r, "text_config", "an object", tc);
    json_t *t = json_deep_copy(tc);
    static const char *const inherit[] = {"torch_dtype", "dtype", "eos_token_id", "bos_token_id",
                                          "tie_word_embeddings"};
    for (size_t i = 0; i < sizeof inherit / sizeof inherit[0]; i++) {
        const json_t *v = json_object_get(r->obj, inherit[i]);
        if (v && !json_object_get(t, inherit[i])) json_object_set(t, inherit[i], (json_t *)v);
    }
    json_object_set_new(t, "model_type", json_string("gemma3_text"));
    int rc = parse_config(c, t, r->file, r->err);
    json_decref(t);
    if (!rc) c->multimodal = 1;
    return rc;
}

static int parse_config(struct model_config *c, const json_t *root, const char *file,
                        struct kiln_error *err) {
    struct jr r = {root, file, "", err};
    const char *mt;
    if (rd_str(&r, "model_type", &mt)) return -1;
    if (!mt) return missing(&r, "model_type");
    if (!strcmp(mt, "gemma3")) return parse_gemma3_multimodal(c, &r);
    const struct arch_desc *a = NULL;
    for (int i = 0; i < ARCH_COUNT; i++)
        if (!strcmp(arch_table[i].name, mt)) a = &arch_table[i];
    if (!a) {
        char list[256] = "";
        size_t n = 0;
        for (int i = 0; i < ARCH_COUNT && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", arch_table[i].name);
        return kiln_errorf(err, "%s: model_type '%.64s' is not supported (supported: %s)", file, mt,
                           list);
    }
    c->arch = a->arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", a->name);

    /* transformers v5 writes "dtype"; older files "torch_dtype". */
    static const char *const dtypes[] = {"bfloat16", "float16", "float32", NULL};
    static const enum dtype dtype_of[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int dt;
    if (rd_enum(&r, field(&r, "dtype") ? "dtype" : "torch_dtype", dtypes, 0, &dt)) return -1;
    c->dtype = dtype_of[dt];

    if (rd_int(&r, "vocab_size", 1, 0, 1, &c->vocab_size) ||
        rd_int(&r, "hidden_size", 1, 0, 1, &c->hidden_size) ||
        rd_int(&r, "num_hidden_layers", 1, 0, 1, &c->n_layers) ||
        rd_int(&r, "num_attention_heads", 1, 0, 1, &c->n_heads) ||
        rd_int(&r, "intermediate_size", 1, 0, 1, &c->intermediate_size) ||
        rd_int(&r, "num_key_value_heads", 0, c->n_heads, 1, &c->n_kv_heads) ||
        rd_int(&r, "max_position_embeddings", 0, a->default_max_positions, 1,
               &c->max_position_embeddings) ||
        rd_pos_double(&r, "rms_norm_eps", 0, a->arch == ARCH_GPT_OSS ? 1e-5 : 1e-6, &c->rms_norm_eps) ||
        rd_bool(&r, "tie_word_embeddings", a->arch == ARCH_GEMMA3, &c->tie_word_embeddings))
        return -1;
    int derived = a->default_head_dim ? a->default_head_dim : c->hidden_size / c->n_heads;
    if (rd_int(&r, "head_dim", 0, derived, 1, &c->head_dim)) return -1;
    if (c->head_dim == 0)
        return kiln_errorf(err, "%s: hidden_size (%d) is smaller than num_attention_heads (%d)", file,
                           c->hidden_size, c->n_heads);

    /* Projection biases: qwen2 always has q/k/v biases (never o); qwen2_moe
     * has a switch for them; llama/qwen3/deepseek's attention_bias also
     * covers the output projection. */
    int ab = 0;
    if (rd_bool(&r, "attention_bias", a->arch == ARCH_GPT_OSS, &ab)) return -1;
    switch (a->arch) {
    case ARCH_QWEN2: c->attention_bias = 1; break;
    case ARCH_QWEN2_MOE:
        if (rd_bool(&r, "qkv_bias", 1, &c->attention_bias)) return -1;
        break;
    default:
        c->attention_bias = ab;
        c->o_proj_bias = ab;
        break;
    }
    c->qk_norm = a->qk_norm;

    /* Variants a family may not implement: read here, judged by the
     * family's check_config. */
    if (parse_variants(c, &r, a)) return -1;
    if (parse_rope(c, &r, a)) return -1;

    c->routed_scaling_factor = 1.0;
    if (a->family == &family_qwen_moe && parse_qwen_moe(c, &r)) return -1;
    if (a->family == &family_deepseek && parse_deepseek(c, &r)) return -1;
    if (a->arch == ARCH_GEMMA3 && parse_gemma3(c, &r)) return -1;
    if (a->arch == ARCH_GPT_OSS && parse_gpt_oss(c, &r)) return -1;
    if (c->n_experts && c->n_experts_per_tok > c->n_experts)
        return kiln_errorf(err, "%s: num_experts_per_tok (%d) exceeds the number of experts (%d)",
                           file, c->n_experts_per_tok, c->n_experts);

    if (parse_quant(c, &r)) return -1;

    int present;
    if (rd_bos(&r, &c->bos_token_id) ||
        rd_token_ids(&r, "eos_token_id", c->eos_token_ids, &c->n_eos, &present))
        return -1;
    return a->family->check_config(c, file, err);
}

int model_config_parse(struct model_config *cfg, const char *text, size_t len, const char *file,
                       struct kiln_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_t *root = load_json(text, len, file, err);
    if (!root) return -1;
    int rc = parse_config(cfg, root, file, err);
    json_decref(root);
    if (rc) memset(cfg, 0, sizeof *cfg);
    return rc;
}

int model_config_load(struct model_config *cfg, const char *path, struct kiln_error *err) {
    char *text = NULL;
    size_t len = 0;
    memset(cfg, 0, sizeof *cfg);
    if (file_read_all(path, &text, &len, err)) return -1;
    int rc = model_config_parse(cfg, text, len, path, err);
    free(text);
    return rc;
}

/* ---- generation_config.json ------------------------------------------------ */

static void generation_config_defaults(struct generation_config *gc, const struct model_config *cfg) {
    memset(gc, 0, sizeof *gc);
    gc->bos_token_id = cfg ? cfg->bos_token_id : -1;
    if (cfg) {
        gc->n_eos = cfg->n_eos;
        memcpy(gc->eos_token_ids, cfg->eos_token_ids, sizeof gc->eos_token_ids);
    }
}

static int rd_opt_double(const struct jr *r, const char *key, int *has, double *out) {
    *has = field(r, key) != NULL;
    return rd_double(r, key, 0, 0.0, out);
}

int generation_config_parse(struct generation_config *gc, const char *text, size_t len,
                            const char *file, const struct model_config *cfg,
                            struct kiln_error *err) {
    generation_config_defaults(gc, cfg);
    json_t *root = load_json(text, len, file, err);
    if (!root) return -1;
    struct jr r = {root, file, "", err};
    int ids[MODEL_MAX_EOS], n, present, bos = -1;
    if (rd_token_ids(&r, "eos_token_id", ids, &n, &present)) goto fail;
    /* An explicit list replaces the model's; absence keeps it. */
    if (present && n) {
        gc->n_eos = n;
        memcpy(gc->eos_token_ids, ids, sizeof ids);
    }
    if (field(&r, "bos_token_id")) {
        if (rd_bos(&r, &bos)) goto fail;
        gc->bos_token_id = bos;
    }
    if (rd_opt_double(&r, "temperature", &gc->has_temperature, &gc->temperature) ||
        rd_opt_double(&r, "top_p", &gc->has_top_p, &gc->top_p) ||
        rd_opt_double(&r, "min_p", &gc->has_min_p, &gc->min_p) ||
        rd_opt_double(&r, "repetition_penalty", &gc->has_repetition_penalty,
                      &gc->repetition_penalty))
        goto fail;
    gc->has_top_k = field(&r, "top_k") != NULL;
    if (rd_int(&r, "top_k", 0, 0, 0, &gc->top_k)) goto fail;
    if (gc->has_temperature && gc->temperature < 0) {
        kiln_errorf(err, "%s: field 'temperature' must not be negative, found %g", file,
                    gc->temperature);
        goto fail;
    }
    if (gc->has_top_p && !(gc->top_p > 0 && gc->top_p <= 1)) {
        kiln_errorf(err, "%s: field 'top_p' must be in (0, 1], found %g", file, gc->top_p);
        goto fail;
    }
    if (gc->has_min_p && !(gc->min_p >= 0 && gc->min_p <= 1)) {
        kiln_errorf(err, "%s: field 'min_p' must be in [0, 1], found %g", file, gc->min_p);
        goto fail;
    }
    if (gc->has_repetition_penalty && !(gc->repetition_penalty > 0)) {
        kiln_errorf(err, "%s: field 'repetition_penalty' must be positive, found %g", file,
                    gc->repetition_penalty);
        goto fail;
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    generation_config_defaults(gc, cfg);
    return -1;
}

int generation_config_load(struct generation_config *gc, const char *path,
                           const struct model_config *cfg, struct kiln_error *err) {
    generation_config_defaults(gc, cfg);
    if (!file_exists(path)) return 0;
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err)) return -1;
    int rc = generation_config_parse(gc, text, len, path, cfg, err);
    free(text);
    return rc;
}

/* ---- per-layer structure --------------------------------------------------- */

int model_config_layer_is_moe(const struct model_config *cfg, int layer) {
    if (layer < 0 || layer >= cfg->n_layers || cfg->n_experts <= 0) return 0;
    return model_family_of(cfg)->layer_is_moe(cfg, layer);
}
