/* model_size.c — what a model takes on the device, as pure functions of
 * its config: the weights, the activation buffers reserved for the
 * largest batch (model.c allocates exactly these), and the shape of its
 * largest step for the backend's scratch. The memory plan
 * (src/runner/mem_plan.h) adds them up before the KV pool is sized, and
 * can do so without a device (its tests run on the CPU). */
#include "base/error.h"
#include "model/model_internal.h"

static long lmax(long a, long b) { return a > b ? a : b; }

static int any_layer(const struct model_config *c, int moe) {
    for (int l = 0; l < c->n_layers; l++)
        if (!!model_config_layer_is_moe(c, l) == moe) return 1;
    return 0;
}

/* The widest SwiGLU MLP that runs through act.g: dense layers, and a
 * shared expert that stays a separate MLP. */
static long mlp_inter(const struct model_config *c) {
    long inter = any_layer(c, 0) ? c->intermediate_size : 0;
    if (any_layer(c, 1)) {
        inter = lmax(inter, moe_shared_inter(c));
    }
    return inter;
}

void model_act_counts(const struct model_config *c, long T, size_t counts[ACT_COUNT]) {
    struct act_widths w = {0};
    model_family_of(c)->act_widths(c, &w);
    long d = c->hidden_size, inter = mlp_inter(c);
    int moe = any_layer(c, 1);
    int shared = moe && (c->shared_expert_intermediate_size > 0 || c->n_shared_experts > 0);
    /* routing slots a token, shared experts fused into the list included */
    long E = lmax(c->n_experts, 1), K = lmax(c->n_experts_per_tok, 1) + lmax(c->n_shared_experts, 0);
    long n[ACT_COUNT] = {0};
    n[ACT_H] = n[ACT_XN] = n[ACT_DELTA] = n[ACT_XS] = d;
    /* MHA keeps q|k|v of a row stacked; MLA has its own buffers */
    if (w.stacked_qkv) {
        n[ACT_QKV] = w.q + 2 * w.k;
    } else {
        n[ACT_Q] = w.q, n[ACT_K] = w.k, n[ACT_V] = w.v;
    }
    n[ACT_Q2] = w.q2;
    n[ACT_O] = w.o;
    n[ACT_ATT] = w.att;
    n[ACT_G] = 2 * inter; /* gate | up of a row */
    if (shared) n[ACT_SHARED] = d, n[ACT_GATE1] = 1;
    if (moe) n[ACT_ROUTER] = E, n[ACT_MOE_IDS] = n[ACT_MOE_W] = K;
    for (int i = 0; i < ACT_COUNT; i++) counts[i] = (size_t)T * (size_t)n[i];
    /* tensor parallel: the lm_head's gather of MODEL_LM_ROWS rows at most */
    if (model_tp(c) > 1)
        counts[ACT_LM] = (size_t)(T < MODEL_LM_ROWS ? T : MODEL_LM_ROWS) * (size_t)model_tp(c) *
                         (size_t)c->shard.vocab_stride;
}

size_t model_activation_bytes(const struct model_config *c, long max_tokens, long max_context) {
    size_t counts[ACT_COUNT], total = 0;
    model_act_counts(c, max_tokens, counts);
    for (int i = 0; i < ACT_COUNT; i++) total += counts[i] * 4; /* fp32 and int32 */
    total += dp_act_floats(c, max_tokens) * 4; /* DP attention's gather */
    /* MLA's MHA-form workspace (deepseek_mha.c), for the 16-bit cache */
    if (c->kv_lora_rank > 0) total += mla_ws_bytes(c, max_context, 2);
    /* the rope table, [max_context][rope_dim] fp32 */
    return total + (size_t)max_context * (size_t)model_family_of(c)->rope_dim(c) * 4;
}

/* dummy weights' dtype (weights.c) */
static size_t weight_es(const struct model_config *c) {
    return c->dtype == DTYPE_F32 ? 4 : 2;
}

/* A split config (config.h struct model_shard) counts its rank's share:
 * its heads and intermediate columns are the config's own, its rows of
 * the vocabulary and its experts the shard's; o_proj's bias is rank 0's;
 * a pipeline stage's layers, the embedding on the first stage (and the
 * last where tied), lm_head and the final norm on the last. */
size_t model_config_weight_bytes(const struct model_config *c) {
    int tp = model_tp(c), ep = c->shard.ep_size > 1;
    size_t es = weight_es(c), d = (size_t)c->hidden_size,
           V = tp > 1 ? (size_t)c->shard.vocab_rows : (size_t)c->vocab_size;
    int l0, l1;
    model_stage_layers(c, &l0, &l1);
    int first = l0 == 0, last = l1 == c->n_layers;
    size_t tables = c->tie_word_embeddings ? (size_t)(first || last) : (size_t)first + (size_t)last;
    size_t total = V * d * es * tables + (last ? d * 4 : 0);
    int mla = model_family_of(c) == &family_deepseek;
    for (int l = l0; l < l1; l++) {
        total += 2 * d * 4;
        if (mla) {
            size_t H = (size_t)c->n_heads, nope = (size_t)c->qk_nope_head_dim,
                   rope = (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim,
                   kvr = (size_t)c->kv_lora_rank, qr = (size_t)c->q_lora_rank, qh = nope + rope;
            total += qr > 0 ? (qr * d + H * qh * qr) * es + qr * 4 : H * qh * d * es;
            total += ((kvr + rope) * d + H * (nope + vd) * kvr + d * H * vd) * es + kvr * 4;
        } else {
            size_t hd = (size_t)c->head_dim, qw = (size_t)c->n_heads * hd,
                   kw = (size_t)c->n_kv_heads * hd;
            total += ((qw + 2 * kw) * d + d * qw) * es;
            if (c->attention_bias) total += (qw + 2 * kw) * 4;
            if (c->o_proj_bias && c->shard.tp_rank == 0) total += d * 4;
            if (c->qk_norm) total += 2 * hd * 4;
            if (c->attn_sinks) total += (size_t)c->n_heads * 4;
        }
        if (!model_config_layer_is_moe(c, l)) {
            total += 3 * (size_t)c->intermediate_size * d * es;
            continue;
        }
        size_t E = (size_t)c->n_experts, F = (size_t)c->moe_intermediate_size;
        size_t El = ep ? (size_t)c->shard.n_experts : E;
        total += E * d * es + 3 * El * F * d * es;
        if (c->has_score_correction_bias) total += E * 4;
        if (c->swiglu_limit > 0) total += E * 4 + El * (2 * F + d) * 4; /* gpt-oss: router, expert biases */
        size_t shared = (size_t)moe_shared_inter(c);
        if (mla && c->n_shared_experts > 0) total += 3 * shared * d * es;
        else if (!mla && c->shared_expert_intermediate_size > 0) total += 3 * shared * d * es + d * es;
    }
    return total;
}

size_t model_config_derived_bytes(const struct model_config *c) {
    if (model_family_of(c) != &family_deepseek) return 0;
    /* MLA: W_UK^T of every head, a transposed copy of kv_b_proj's k rows */
    int l0, l1;
    model_stage_layers(c, &l0, &l1);
    return (size_t)(l1 - l0) * (size_t)c->n_heads * (size_t)c->kv_lora_rank *
           (size_t)c->qk_nope_head_dim * weight_es(c);
}

void model_step_shape(const struct model_config *c, long max_tokens, long max_context,
                      int fuse_shared, struct backend_step_shape *s) {
    struct act_widths w = {0};
    model_family_of(c)->act_widths(c, &w);
    long d = c->hidden_size;
    *s = (struct backend_step_shape){.max_tokens = max_tokens, .max_context = max_context,
                                     .vocab = c->vocab_size, .max_heads = c->n_heads,
                                     .fp8_weights = c->quant.method == MODEL_QUANT_FP8};
    /* product inputs: the norm's output and a SwiGLU's hidden row side by
     * side (norm_swiglu_mlp), attention outputs (o_proj), MLA's q_lora */
    s->widest = lmax(lmax(d + mlp_inter(c), w.o ? w.o : w.att), lmax(w.v, d));
    for (int l = 0; l < c->n_layers; l++) s->moe_layers += model_config_layer_is_moe(c, l) != 0;
    if (!s->moe_layers) return;
    int ep = c->shard.ep_size > 1; /* the rank's experts; no fusion (model.c) */
    int fused = fuse_shared && !ep && model_family_of(c) == &family_deepseek && c->n_shared_experts == 1;
    s->moe_experts = (ep ? c->shard.n_experts : c->n_experts) + fused;
    s->moe_hidden = c->hidden_size;
    s->moe_inter = c->moe_intermediate_size;
    s->moe_slots = c->n_experts_per_tok + fused;
}
