/* model.c — loading a checkpoint into per-layer weights, reserving the
 * activations, and what every architecture shares around its layers: the
 * embedding, the residual stream, the final norm and the lm_head. The
 * model's family (struct model_family) loads and runs each layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model_internal.h"

const struct model_config *model_config(const struct model *m) { return &m->cfg; }
const struct generation_config *model_generation_config(const struct model *m) { return &m->gen; }
int model_max_context(const struct model *m) { return m->max_context; }
int model_max_batch_tokens(const struct model *m) { return m->max_batch_tokens; }
size_t model_weight_bytes(const struct model *m) { return m->weight_bytes; }
int model_max_seqs(const struct model *m) { return m->max_seqs; }
struct backend *model_backend(const struct model *m) { return m->be; }

int model_kv_layout(const struct model *m, struct kv_layer_layout *layout, int max_layers) {
    const struct model_config *c = &m->cfg;
    int l0, l1; /* a pipeline stage caches its layers only */
    model_stage_layers(c, &l0, &l1);
    KILN_ASSERT(max_layers >= l1 - l0);
    for (int l = l0; l < l1; l++) layout[l - l0] = m->fam->kv_layout(c, l);
    return l1 - l0;
}

int model_fuses_shared(const struct model *m) { return m->fuse_shared; }

static int reserve_activations(struct model *m, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    struct activations *a = &m->act;
    size_t counts[ACT_COUNT];
    model_act_counts(c, m->max_batch_tokens, counts);
    void **bufs[ACT_COUNT] = {
        [ACT_H] = (void **)&a->h, [ACT_XN] = (void **)&a->xn, [ACT_DELTA] = (void **)&a->delta,
        [ACT_Q] = (void **)&a->q, [ACT_K] = (void **)&a->k, [ACT_V] = (void **)&a->v,
        [ACT_QKV] = (void **)&a->qkv, [ACT_Q2] = (void **)&a->q2, [ACT_ATT] = (void **)&a->att,
        [ACT_O] = (void **)&a->o, [ACT_G] = (void **)&a->g, [ACT_SHARED] = (void **)&a->shared,
        [ACT_ROUTER] = (void **)&a->router, [ACT_GATE1] = (void **)&a->gate1,
        [ACT_MOE_IDS] = (void **)&a->moe_ids, [ACT_MOE_W] = (void **)&a->moe_w,
        [ACT_XS] = (void **)&a->xs, [ACT_LM] = (void **)&a->lm};
    static const char *const names[ACT_COUNT] = {
        "h", "xn", "delta", "q", "k", "v", "qkv", "q2", "att", "o", "g", "shared", "router",
        "gate1", "moe_ids", "moe_w", "xs", "lm"};
    for (int i = 0; i < ACT_COUNT; i++) {
        KILN_ASSERT(bufs[i]);
        if (!counts[i]) continue;
        *bufs[i] = m->be->ops->alloc(m->be->ctx, counts[i] * 4); /* fp32 and int32 */
        if (!*bufs[i])
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for activations (%s)",
                               names[i]);
    }
    if (c->kv_lora_rank > 0 && mla_ws_reserve(m, err)) return -1;
    if (dp_reserve(m, err)) return -1;
    return m->be->ops->reserve(m->be->ctx, m->max_batch_tokens, m->max_context, c->n_heads, err);
}

static void free_activations(struct model *m) {
    struct activations *a = &m->act;
    mla_ws_free(m);
    dp_free(m);
    void *bufs[] = {a->h, a->xn, a->delta, a->q, a->k, a->v, a->qkv, a->q2, a->att, a->o, a->g,
                    a->shared, a->router, a->gate1, a->moe_ids, a->moe_w, a->xs, a->lm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) m->be->ops->free(m->be->ctx, bufs[i]);
    memset(a, 0, sizeof *a);
}

/* One layer's KV scale: the first of names[] the checkpoint holds, a
 * scalar (F32, BF16 or F16; positive and finite), else 1 as SGLang's
 * default. The names vLLM and SGLang read: self_attn.k_scale / v_scale,
 * the quantizers' k_proj / v_proj.output_scale, and the older kv_scale
 * (one for both). */
static int kv_scale_load(const struct model *m, int l, const char *const *names, int count,
                         float *out, struct kiln_error *err) {
    *out = 1.0f;
    if (!m->st.n_files) return 0; /* dummy weights */
    for (int i = 0; i < count; i++) {
        char name[256];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, names[i]);
        const struct st_tensor *t = st_find(&m->st, name);
        if (!t) continue;
        float v = NAN;
        if (t->numel == 1 && t->dtype == DTYPE_F32) memcpy(&v, t->data, 4);
        else if (t->numel == 1 && t->dtype == DTYPE_BF16) v = bf16_to_f32(*(const uint16_t *)t->data);
        else if (t->numel == 1 && t->dtype == DTYPE_F16) v = f16_to_f32(*(const uint16_t *)t->data);
        if (!(v > 0.0f) || !isfinite(v))
            return kiln_errorf(err, "%s: tensor '%s': expected one positive F32, BF16 or F16 "
                                    "value (a KV cache scale)",
                               m->st.paths[t->file], name);
        *out = v;
        return 0;
    }
    return 0;
}

static int kv_scales_load(struct model *m, struct kiln_error *err) {
    static const char *const k_names[] = {"k_scale", "k_proj.output_scale", "kv_scale"};
    static const char *const v_names[] = {"v_scale", "v_proj.output_scale", "kv_scale"};
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (kv_scale_load(m, l, k_names, 3, &m->layers[l].k_scale, err) ||
            kv_scale_load(m, l, v_names, 3, &m->layers[l].v_scale, err))
            return -1;
    return 0;
}

static int load_weights(struct model *m, struct weight_source *ws, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, V = c->vocab_size;
    /* tensor parallel: the rank's rows of the vocabulary (views) */
    struct ws_slice vs = {.dim = 0, .start = c->shard.vocab0, .len = c->shard.vocab_rows};
    const struct ws_slice *vsl = model_tp(c) > 1 ? &vs : NULL;
    /* a pipeline stage: the embedding on the first, the head on the last */
    int l0, l1;
    model_stage_layers(c, &l0, &l1);
    int first = l0 == 0, last = l1 == c->n_layers;
    if ((first || c->tie_word_embeddings) && ws_matrix(ws, "model.embed_tokens.weight", V, d, vsl, &m->embed, err))
        return -1;
    if (m->embed.data && m->embed.dtype == DTYPE_F8_E4M3) {
        const struct st_tensor *t = st_find(&m->st, "model.embed_tokens.weight");
        return kiln_errorf(err, "%s: tensor 'model.embed_tokens.weight' is FP8: the embedding table "
                                "must be BF16, F16 or F32",
                           t ? m->st.paths[t->file] : "model.safetensors");
    }
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if (last && ws_matrix(ws, "lm_head.weight", V, d, vsl, &m->lm_head, err)) {
        return -1;
    }
    if (last && ws_norm(ws, "model.norm.weight", d, &m->final_norm, err)) return -1;
    m->layers = model_own(m, xcalloc((size_t)c->n_layers, sizeof *m->layers));
    for (int l = l0; l < l1; l++) {
        struct layer *L = &m->layers[l];
        char name[256];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        if (ws_norm(ws, name, d, &L->ln_attn, err)) return -1;
        /* sandwich norms: the MLP's input norm is pre_feedforward_layernorm
         * (the family loads the post norms) */
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", l,
                 c->sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm");
        if (ws_norm(ws, name, d, &L->ln_mlp, err)) return -1;
        if (m->fam->load_layer(ws, l, L, err)) return -1;
    }
    return 0;
}

static int quant_option(const struct model_options *opt, struct kiln_error *err) {
    const char *q = opt ? opt->quantization : NULL;
    if (!q || !*q || !strcmp(q, "fp8")) return 0;
    return kiln_errorf(err, "--quantization '%.64s' is not supported (only fp8: FP8 e4m3 weights "
                            "with 128x128 block scales, made at load)",
                       q);
}

/* What --quantization fp8 makes of the weights: every projection not
 * already FP8 becomes FP8 at load unless quantization_config lists it as
 * not converted, in the config's blocks, else 128x128. So an FP8
 * checkpoint stays as it is (its unquantized projections are those it
 * lists), a bf16 one or dummy weights become FP8. Dummy weights without
 * the option are never FP8: cfg.quant then says none; those of an MXFP4
 * config have MXFP4 experts where the backend runs them (gpt-oss's
 * checkpoints as published), else none either. */
static int quant_setup(struct model *m, struct weight_source *ws, const struct model_options *opt,
                       struct kiln_error *err) {
    struct model_quant *q = &m->cfg.quant;
    if (quant_option(opt, err)) return -1;
    if (!(opt && opt->quantization && *opt->quantization)) {
        if (!ws->st && q->method == MODEL_QUANT_MXFP4 && m->be->ops->mxfp4_experts) {
            log_info("dummy weights: MXFP4 experts, as config.json's quantization_config says");
            return 0;
        }
        if (!ws->st && q->method != MODEL_QUANT_NONE) {
            log_info("dummy weights: unquantized (--quantization fp8 makes them FP8 as config.json's "
                     "quantization_config says)");
            memset(q, 0, sizeof *q);
        }
        return 0;
    }
    if (q->method == MODEL_QUANT_MXFP4)
        return kiln_errorf(err, "--quantization fp8: the checkpoint is MXFP4 (quantization_config "
                                "mxfp4); it is not converted to FP8");
    if (m->cfg.swiglu_limit > 0)
        return kiln_errorf(err, "--quantization fp8: not supported for %s (its fused experts stay "
                                "as the checkpoint stores them)",
                           m->cfg.model_type);
    if (!m->be->ops->fp8_weights)
        return kiln_errorf(err, "--quantization fp8: the %s backend does not run FP8 weights yet; use "
                                "--device cpu",
                           m->be->ops->name);
    if (q->method == MODEL_QUANT_NONE) {
        q->method = MODEL_QUANT_FP8;
        q->block_rows = q->block_cols = 128;
    }
    m->quantize_online = 1;
    return 0;
}

static int finish_load(struct model *m, struct weight_source *ws, const struct model_options *opt,
                       struct kiln_error *err) {
    if ((m->cfg.norm_plus_one || m->cfg.embed_scale) &&
        !(m->be->ops->gelu_tanh_mul && m->be->ops->scale))
        return kiln_errorf(err, "%s: the %s backend does not run this family's operations (GeGLU "
                                "MLP, scaled embedding) yet; use --device cpu",
                           m->cfg.model_type, m->be->ops->name);
    if (m->cfg.attn_sinks && !m->be->ops->attention_sinks)
        return kiln_errorf(err, "%s: attention sinks: the %s backend does not run them yet; use "
                                "--device cpu",
                           m->cfg.model_type, m->be->ops->name);
    if (m->cfg.swiglu_limit > 0 && !m->be->ops->moe_bias_act)
        return kiln_errorf(err, "%s: experts with biases and the clamped SwiGLU: the %s backend "
                                "does not run them yet; use --device cpu",
                           m->cfg.model_type, m->be->ops->name);
    if (m->cfg.sliding_window > 0 && !m->be->ops->sliding_window)
        return kiln_errorf(err, "%s: sliding_window %d: the %s backend does not run sliding-window "
                                "attention yet; use --device cpu",
                           m->cfg.model_type, m->cfg.sliding_window, m->be->ops->name);
    const struct model_config *c = &m->cfg;
    m->max_batch_tokens = opt && opt->max_batch_tokens > 0 ? opt->max_batch_tokens : 2048;
    m->max_seqs = opt && opt->max_seqs > 0 ? opt->max_seqs : 256;
    if (m->max_seqs > m->max_batch_tokens) m->max_seqs = m->max_batch_tokens;
    m->max_context = opt && opt->max_context > 0 ? opt->max_context : c->max_position_embeddings;
    /* expert parallel: the routed experts are whole, the shared one split
     * by columns; they no longer have one shape (moe.c) */
    m->fuse_shared = !(opt && opt->no_shared_expert_fusion) && knob_bool(KNOB_SHARED_EXPERTS_FUSION) &&
                     c->shard.ep_size <= 1;
    m->route_uniform = opt && opt->dummy_routing == MODEL_ROUTING_UNIFORM;
    m->moe_count = opt && opt->moe_count;
    const struct backend_ops *ops = m->be->ops;
    m->defer_uploads = opt && opt->defer_weights && ops->weight_upload_later &&
                       ops->weights_finish && !ops->weights_in_place;
    if (quant_setup(m, ws, opt, err) || load_weights(m, ws, err) || moe_finish_load(m, err) ||
        kv_scales_load(m, err))
        return -1;

    m->rope_dim = m->fam->rope_dim(c);
    float *table = model_own(m, xaligned_alloc((size_t)m->max_context * (size_t)m->rope_dim * 4));
    rope_table_build(&c->rope, m->rope_dim, m->max_context, c->max_position_embeddings, table);
    m->rope_table = model_upload(m, table, (size_t)m->max_context * (size_t)m->rope_dim * 4);
    if (!m->rope_table) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the rope table");
    if (c->rope_local_theta > 0) { /* the sliding layers' own rope (Gemma) */
        struct rope_config local = {.type = ROPE_DEFAULT, .theta = c->rope_local_theta};
        float *lt = model_own(m, xaligned_alloc((size_t)m->max_context * (size_t)m->rope_dim * 4));
        rope_table_build(&local, m->rope_dim, m->max_context, c->max_position_embeddings, lt);
        m->rope_table_local = model_upload(m, lt, (size_t)m->max_context * (size_t)m->rope_dim * 4);
        if (!m->rope_table_local)
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the rope table");
    }
    m->attn_scale = (float)m->fam->attn_scale(c);
    return reserve_activations(m, err);
}

/* The model's config for its rank (model_options.par; file names the
 * config in messages) and the communicator of its ranks. */
static int split_setup(struct model *m, const struct model_options *opt, const char *file,
                       struct kiln_error *err) {
    if (model_shard_split(&m->cfg, opt ? &opt->par : NULL, file, err) || model_pp_setup(m, opt, file, err))
        return -1;
    if (model_tp(&m->cfg) <= 1) return 0;
    if (!m->be->ops->embed_shard)
        return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                           "the %s backend cannot split a model over ranks (no vocab-parallel embedding)",
                           m->be->ops->name);
    m->comm = opt->par.comm;
    return 0;
}

static int load_dummy(struct model **out, const struct model_config *cfg, const char *file,
                      struct backend *be, const struct model_options *opt, struct kiln_error *err) {
    struct model *m = xcalloc(1, sizeof *m);
    *out = NULL;
    m->cfg = *cfg;
    m->fam = model_family_of(cfg);
    m->be = be;
    if (split_setup(m, opt, file, err)) {
        model_free(m);
        return -1;
    }
    m->gen.bos_token_id = cfg->bos_token_id;
    m->gen.n_eos = cfg->n_eos;
    memcpy(m->gen.eos_token_ids, cfg->eos_token_ids, sizeof cfg->eos_token_ids);
    struct weight_source ws = {.st = NULL, .seed = (opt && opt->seed ? opt->seed : 0x9e3779b97f4a7c15ull),
                               .m = m};
    if (finish_load(m, &ws, opt, err)) {
        model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int model_load_dummy(struct model **out, const struct model_config *cfg, struct backend *be,
                     const struct model_options *opt, struct kiln_error *err) {
    return load_dummy(out, cfg, "config.json", be, opt, err);
}

int model_load(struct model **out, const char *dir, struct backend *be,
               const struct model_options *opt, struct kiln_error *err) {
    *out = NULL;
    /* A config.json file (not a folder) is enough for dummy weights. */
    size_t dl = strlen(dir);
    int is_json = dl > 5 && !strcmp(dir + dl - 5, ".json");
    char *cfg_path = is_json ? xstrdup(dir) : path_join(dir, "config.json");
    struct model_config cfg;
    int rc = model_config_load(&cfg, cfg_path, err);
    if (rc || quant_option(opt, err)) {
        free(cfg_path);
        return -1;
    }
    if (opt && opt->load_format && !strcmp(opt->load_format, "dummy")) {
        rc = load_dummy(out, &cfg, cfg_path, be, opt, err);
        free(cfg_path);
        return rc;
    }
    if (is_json) {
        free(cfg_path);
        return kiln_errorf(err, "%s: a config file alone needs --load-format dummy; give the "
                                "checkpoint folder to load weights", dir);
    }
    if (opt && opt->load_format && strcmp(opt->load_format, "auto") &&
        strcmp(opt->load_format, "safetensors")) {
        free(cfg_path);
        return kiln_errorf(err, "--load-format '%s' is not supported (expected auto, safetensors or dummy)",
                           opt->load_format);
    }

    struct model *m = xcalloc(1, sizeof *m);
    m->cfg = cfg;
    m->fam = model_family_of(&cfg);
    m->be = be;
    char *gen_path = path_join(dir, "generation_config.json");
    rc = generation_config_load(&m->gen, gen_path, &cfg, err);
    free(gen_path);
    if (!rc) rc = split_setup(m, opt, cfg_path, err);
    free(cfg_path);
    if (rc || st_open_dir(&m->st, dir, err)) goto fail;
    /* a multimodal checkpoint (gemma3): its language model's tensors, under
     * transformers' older and newer prefixes; the vision tower's stay unused */
    if (cfg.multimodal &&
        (st_rename_prefix(&m->st, "language_model.model.", "model.", err) ||
         st_rename_prefix(&m->st, "model.language_model.", "model.", err) ||
         st_rename_prefix(&m->st, "language_model.lm_head.", "lm_head.", err)))
        goto fail;
    struct weight_source ws = {.st = &m->st, .m = m};
    if (finish_load(m, &ws, opt, err)) goto fail;
    *out = m;
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(struct model *m) {
    if (!m) return;
    if (m->be) {
        model_weights_ready(m); /* no copy may still be writing what is released */
        moe_free(m);
        free_activations(m);
        for (int i = 0; i < m->n_uploaded; i++) m->be->ops->weight_release(m->be->ctx, m->uploaded[i]);
    }
    free(m->uploaded);
    st_close(&m->st);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m);
}

int model_graphable(const struct model *m, long n) {
    const struct backend_ops *ops = m->be->ops;
    if (!mla_graphable(m) || m->dp) return 0; /* DP attention stages its sub-batch from the host */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer *L = &m->layers[l];
        int k = L->moe.route.top_k + L->moe.route.n_fused; /* the slots moe_forward passes */
        if (L->mlp_kind == LAYER_MLP_MOE &&
            !(ops->moe_ffn_graphable && ops->moe_ffn_graphable(m->be->ctx, &L->moe.experts, k, n)))
            return 0;
    }
    return 1;
}

void model_forward_layers(struct model *m, struct kv_pool *kv, const struct model_step *s) {
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long n = s->bb->n_tokens;
    struct kv_pool stage_kv;
    int l0, l1;
    model_stage_layers(c, &l0, &l1);
    struct fwd f = {.m = m, .kv = model_pp_kv(m, kv, &stage_kv), .bb = s->bb, .n = n, .pos = s->bb->positions,
                    .slot = s->slot, .host = s->host};
    /* a later pipeline stage starts from the h and delta the stage before sent */
    if (l0 == 0 && model_tp(c) > 1) { /* vocab parallel: each token's row from the rank that holds it */
        ops->embed_shard(ctx, a->h, &m->embed, s->ids, c->shard.vocab0, n);
        model_tp_sum(m, a->h, (size_t)n * (size_t)c->hidden_size);
    } else if (l0 == 0) {
        ops->embed(ctx, a->h, &m->embed, s->ids, n);
    }
    if (l0 == 0 && c->embed_scale) ops->scale(ctx, a->h, n * c->hidden_size, (float)c->embed_scale);
    if (m->dp) dp_step_begin(m, s);
    a->delta_part = 0;
    /* a hybrid pool's sliding layers read and write their own pages */
    struct fwd fs = f;
    int hybrid = f.kv->swa_window > 0;
    if (hybrid) {
        KILN_ASSERT(s->swa_bb && s->swa_slot && !m->dp);
        fs.bb = s->swa_bb;
        fs.slot = s->swa_slot;
    }
    for (int l = l0; l < l1; l++)
        m->fam->forward_layer(hybrid && model_config_layer_window(c, l) > 0 ? &fs : &f, l, &m->layers[l]);
    if (a->delta_part) { /* the final norm or the next stage reads the sum */
        model_reduce_delta(&f);
        a->delta_part = 0;
    }
}

void model_reduce_delta(const struct fwd *f) {
    model_tp_sum(f->m, f->m->act.delta, (size_t)f->n * (size_t)f->m->cfg.hidden_size);
}

void model_defer_delta(const struct fwd *f) {
    struct model *m = f->m;
    const struct backend_ops *ops = m->be->ops;
    if (model_tp(&m->cfg) > 1 && !m->dp && ops->norm_reduce_ok &&
        ops->norm_reduce_ok(m->be->ctx, m->comm, f->n, m->cfg.hidden_size))
        m->act.delta_part = 1;
    else
        model_reduce_delta(f);
}

struct backend_norm layer_norm_delta(const struct fwd *f, const float *w) {
    struct model *m = f->m;
    struct backend_norm nm = {.h = m->act.h, .delta = m->act.delta, .x = m->act.xn, .w = w,
                              .dim = m->cfg.hidden_size, .eps = (float)m->cfg.rms_norm_eps,
                              .reduce = m->act.delta_part ? m->comm : NULL};
    m->act.delta_part = 0;
    return nm;
}

struct backend_norm layer_norm_in(const struct fwd *f, int l, const float *w) {
    if (l) return layer_norm_delta(f, w);
    const struct model *m = f->m;
    return (struct backend_norm){.h = m->act.h, .x = m->act.xn, .w = w, .dim = m->cfg.hidden_size,
                                 .eps = (float)m->cfg.rms_norm_eps};
}

void model_norm(const struct fwd *f, const struct backend_norm *nm) {
    const struct backend_ops *ops = f->m->be->ops;
    if (nm->reduce) ops->reduce_add_rmsnorm(f->m->be->ctx, nm, f->n);
    else ops->add_rmsnorm(f->m->be->ctx, nm->h, nm->delta, nm->x, nm->w, f->n, nm->dim, nm->eps);
}

void model_final_norm(struct model *m, const int32_t *rows, long n) {
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long d = m->cfg.hidden_size;
    float eps = (float)m->cfg.rms_norm_eps;
    if (!rows) { /* h is rebuilt by the next step's embedding: normalise in place */
        ops->add_rmsnorm(ctx, a->h, a->delta, a->xs, m->final_norm, n, d, eps);
        return;
    }
    ops->gather_rows(ctx, a->xs, a->h, d, rows, n);
    ops->gather_rows(ctx, a->xn, a->delta, d, rows, n);
    ops->add_rmsnorm(ctx, a->xs, a->xn, a->xs, m->final_norm, n, d, eps);
}

/* Vocab parallel: each rank's logits columns for MODEL_LM_ROWS rows at a
 * time into its part of act.lm ([tp][rows][vocab_stride]), gathered from
 * every rank, then copied into place: rank p's columns start at p·V/tp. */
static void lm_head_split(struct model *m, float *logits, long r0, long r) {
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    int tp = c->shard.tp_size;
    long d = c->hidden_size, V = c->vocab_size, Vs = c->shard.vocab_stride;
    long rows = m->max_batch_tokens < MODEL_LM_ROWS ? m->max_batch_tokens : MODEL_LM_ROWS;
    for (long i0 = 0; i0 < r; i0 += rows) {
        long cn = r - i0 < rows ? r - i0 : rows;
        size_t part = (size_t)cn * (size_t)Vs;
        ops->matmul(ctx, m->act.lm + (size_t)c->shard.tp_rank * part, Vs, m->act.xs + (r0 + i0) * d, d,
                    &m->lm_head, NULL, cn);
        model_tp_gather(m, m->act.lm + (size_t)c->shard.tp_rank * part, m->act.lm, part * 4);
        for (int p = 0; p < tp; p++) {
            long v0 = p * V / tp, vn = (p + 1) * V / tp - v0;
            ops->copy_rows(ctx, logits + i0 * V + v0, V, m->act.lm + (size_t)p * part, Vs, cn, vn);
        }
    }
}

void model_lm_head(struct model *m, float *logits, long r0, long r) {
    long d = m->cfg.hidden_size;
    if (model_tp(&m->cfg) > 1) {
        lm_head_split(m, logits, r0, r);
        return;
    }
    m->be->ops->matmul(m->be->ctx, logits, m->cfg.vocab_size, m->act.xs + r0 * d, d, &m->lm_head,
                       NULL, r);
}

void model_norm_lm_head(struct model *m, float *logits, long n) {
    const struct backend_ops *ops = m->be->ops;
    if (model_tp(&m->cfg) > 1) { /* the same norm, then the gathered head */
        model_final_norm(m, NULL, n);
        lm_head_split(m, logits, 0, n);
        return;
    }
    struct activations *a = &m->act;
    /* one product: a fusing backend's norm hands it its 16-bit operand */
    struct backend_norm nm = {.h = a->h, .delta = a->delta, .x = a->xs, .w = m->final_norm,
                              .dim = m->cfg.hidden_size, .eps = (float)m->cfg.rms_norm_eps};
    ops->norm_matmul(m->be->ctx, &nm, logits, m->cfg.vocab_size, &m->lm_head, NULL, n);
}
