/* model.c — loading a checkpoint into per-layer weights, reserving the
 * activations, and the forward pass skeleton shared by every architecture
 * (embedding, the residual stream, final norm and logits). The family
 * files provide each layer's attention and MLP. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model_internal.h"

const struct model_config *model_config(const struct model *m) { return &m->cfg; }
const struct generation_config *model_generation_config(const struct model *m) { return &m->gen; }
int model_max_context(const struct model *m) { return m->max_context; }
int model_max_batch_tokens(const struct model *m) { return m->max_batch_tokens; }
size_t model_weight_bytes(const struct model *m) { return m->weight_bytes; }

static int is_mla(const struct model_config *c) { return c->kv_lora_rank > 0; }

int model_kv_layout(const struct model *m, struct kv_layer_layout *layout, int max_layers) {
    const struct model_config *c = &m->cfg;
    KILN_ASSERT(max_layers >= c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        if (is_mla(c)) {
            layout[l] = (struct kv_layer_layout){.k_width = c->kv_lora_rank + c->qk_rope_head_dim,
                                                 .v_width = c->kv_lora_rank, .v_in_k = 1};
        } else {
            long w = (long)c->n_kv_heads * c->head_dim;
            layout[l] = (struct kv_layer_layout){.k_width = w, .v_width = w, .v_in_k = 0};
        }
    }
    return c->n_layers;
}

static long lmax(long a, long b) { return a > b ? a : b; }

static int reserve_activations(struct model *m, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    struct activations *a = &m->act;
    long T = m->max_batch_tokens, d = c->hidden_size, H = c->n_heads;
    long q_w, k_w, v_w, att_w, q2_w = 0, o_w = 0;
    if (is_mla(c)) {
        long qh = c->qk_nope_head_dim + c->qk_rope_head_dim, lw = c->kv_lora_rank + c->qk_rope_head_dim;
        q_w = H * qh;
        k_w = lw;
        v_w = lmax(c->q_lora_rank, 1); /* q_lora scratch */
        q2_w = H * lw;
        att_w = H * c->kv_lora_rank;
        o_w = H * c->v_head_dim;
    } else {
        q_w = H * c->head_dim;
        k_w = v_w = (long)c->n_kv_heads * c->head_dim;
        att_w = q_w;
    }
    long inter = lmax(c->intermediate_size,
                      lmax(c->shared_expert_intermediate_size,
                           (long)c->moe_intermediate_size * lmax(c->n_shared_experts, 1)));
    /* K: routing slots a token, shared experts fused into the list included */
    long E = lmax(c->n_experts, 1), K = lmax(c->n_experts_per_tok, 1) + lmax(c->n_shared_experts, 0);
    const struct backend_ops *ops = m->be->ops;
    /* Logits are downloaded 64 rows at a time; a backend that samples on
     * the device keeps a whole decode batch's rows (one lm_head product). */
    long chunk = ops->sample && m->max_seqs > 64 ? m->max_seqs : 64;
    a->logit_chunk = (int)(T < chunk ? T : chunk);
    a->pages_cap = (long)m->max_seqs * (m->max_context / m->page_size + 2);
#define ALLOC(field, count, type)                                                          \
    do {                                                                                   \
        a->field = m->be->ops->alloc(m->be->ctx, (size_t)(count) * sizeof(type));         \
        if (!a->field) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for activations (%s)", #field); \
    } while (0)
    ALLOC(h, T * d, float);
    ALLOC(xn, T * d, float);
    ALLOC(delta, T * d, float);
    ALLOC(q, T * q_w, float);
    ALLOC(k, T * k_w, float);
    ALLOC(v, T * v_w, float);
    if (q2_w) ALLOC(q2, T * q2_w, float);
    if (o_w) ALLOC(o, T * o_w, float);
    ALLOC(att, T * att_w, float);
    if (!is_mla(c)) ALLOC(qkv, T * (q_w + 2 * k_w), float);
    ALLOC(g, T * 2 * inter, float);
    ALLOC(u, T * inter, float);
    ALLOC(shared, T * d, float);
    ALLOC(router, T * E, float);
    ALLOC(gate1, T, float);
    ALLOC(moe_ids, T * K, int32_t);
    ALLOC(moe_w, T * K, float);
    ALLOC(logits, (long)a->logit_chunk * c->vocab_size, float);
    ALLOC(xs, T * d, float);
    /* batch metadata: [ids|pos|slot|rows: T each][q_start|page_start: S+1 each]
     * [sampling row parameters: S, 8-byte aligned][pages] */
    long S = m->max_seqs;
    long srow_ints = (long)(sizeof(struct backend_sample_row) / 4);
    a->stage_srows_off = (4 * T + 2 * (S + 1) + 1) & ~1L;
    a->stage_pages_off = a->stage_srows_off + (ops->sample ? S * srow_ints : 0);
    long stage_ints = a->stage_pages_off + a->pages_cap;
    ALLOC(stage, stage_ints, int32_t);
    if (ops->sample) {
        a->adj_cap = (int)(S * 512 > 8192 ? S * 512 : 8192);
        ALLOC(sadj, a->adj_cap, struct backend_sample_adj);
        ALLOC(stok, S, int32_t);
    }
#undef ALLOC
    a->ids = a->stage;
    a->pos = a->ids + T;
    a->slot = a->pos + T;
    a->rows = a->slot + T;
    a->q_start = a->rows + T;
    a->page_start = a->q_start + S + 1;
    a->pages = a->stage + a->stage_pages_off;
    a->srows = (struct backend_sample_row *)(a->stage + a->stage_srows_off);
    if (ops->host_alloc && (a->stage_host = ops->host_alloc(m->be->ctx, (size_t)stage_ints * 4)))
        a->stage_pinned = 1;
    else
        a->stage_host = xmalloc((size_t)stage_ints * 4);
    a->perm = xmalloc((size_t)T * sizeof *a->perm);
    if (ops->sample) {
        size_t ab = (size_t)a->adj_cap * sizeof *a->sadj_host;
        if (ops->host_alloc && (a->sadj_host = ops->host_alloc(m->be->ctx, ab))) a->sadj_pinned = 1;
        else a->sadj_host = xmalloc(ab);
        if (ops->host_alloc && (a->stok_host = ops->host_alloc(m->be->ctx, (size_t)S * 4))) a->stok_pinned = 1;
        else a->stok_host = xmalloc((size_t)S * 4);
    }
    return ops->reserve(m->be->ctx, T, m->max_context, c->n_heads, err);
}

/* The decode batch sizes graphs are recorded for: 1, 2, 4, 8, 12, then
 * every multiple of 8 up to 256. */
static int bucket_size(int i) { return i < 4 ? 1 << i : i == 4 ? 12 : 8 * (i - 3); }

static void drop_graphs(struct model *m) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < MODEL_GRAPH_BUCKETS; i++) {
            if (m->graphs[k][i]) m->be->ops->graph_destroy(m->be->ctx, m->graphs[k][i]);
            m->graphs[k][i] = NULL;
            m->graph_warm[k][i] = 0;
        }
}

static void free_activations(struct model *m) {
    struct activations *a = &m->act;
    drop_graphs(m);
    void *bufs[] = {a->h, a->xn, a->delta, a->q, a->k, a->v, a->qkv, a->q2, a->att, a->o, a->g,
                    a->u, a->shared, a->router, a->gate1, a->moe_ids, a->moe_w, a->logits, a->xs,
                    a->stage, a->sadj, a->stok};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) m->be->ops->free(m->be->ctx, bufs[i]);
    void *host[] = {a->stage_host, a->sadj_host, a->stok_host};
    int pinned[] = {a->stage_pinned, a->sadj_pinned, a->stok_pinned};
    for (int i = 0; i < 3; i++) {
        if (pinned[i]) m->be->ops->host_free(m->be->ctx, host[i]);
        else free(host[i]);
    }
    free(a->perm);
    memset(a, 0, sizeof *a);
}

static int load_weights(struct model *m, struct weight_source *ws, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, V = c->vocab_size;
    if (ws_matrix(ws, "model.embed_tokens.weight", V, d, &m->embed, err)) return -1;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if (ws_matrix(ws, "lm_head.weight", V, d, &m->lm_head, err)) {
        return -1;
    }
    if (ws_vector(ws, "model.norm.weight", d, 1.0f, &m->final_norm, err)) return -1;
    m->layers = model_own(m, xcalloc((size_t)c->n_layers, sizeof *m->layers));
    for (int l = 0; l < c->n_layers; l++) {
        struct layer *L = &m->layers[l];
        char name[256];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        if (ws_vector(ws, name, d, 1.0f, &L->ln_attn, err)) return -1;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        if (ws_vector(ws, name, d, 1.0f, &L->ln_mlp, err)) return -1;
        L->attn_kind = is_mla(c) ? LAYER_ATTN_MLA : LAYER_ATTN_MHA;
        if (L->attn_kind == LAYER_ATTN_MLA ? mla_load(ws, l, &L->mla, err)
                                           : mha_load(ws, l, &L->mha, err))
            return -1;
        L->mlp_kind = model_config_layer_is_moe(c, l) ? LAYER_MLP_MOE : LAYER_MLP_DENSE;
        if (L->mlp_kind == LAYER_MLP_MOE) {
            if (moe_load(ws, l, &L->moe, err)) return -1;
        } else {
            snprintf(name, sizeof name, "model.layers.%d.mlp", l);
            if (dense_load(ws, name, c->intermediate_size, &L->dense, err)) return -1;
        }
    }
    return 0;
}

static int finish_load(struct model *m, struct weight_source *ws, const struct model_options *opt,
                       struct kiln_error *err) {
    struct model_config *c = &m->cfg;
    m->max_batch_tokens = opt && opt->max_batch_tokens > 0 ? opt->max_batch_tokens : 2048;
    m->max_seqs = opt && opt->max_seqs > 0 ? opt->max_seqs : 256;
    if (m->max_seqs > m->max_batch_tokens) m->max_seqs = m->max_batch_tokens;
    m->max_context = opt && opt->max_context > 0 ? opt->max_context : c->max_position_embeddings;
    const char *fs = getenv("KILN_SHARED_EXPERTS_FUSION");
    m->fuse_shared = !(opt && opt->no_shared_expert_fusion) && !(fs && !strcmp(fs, "0"));
    m->page_size = opt && opt->page_size > 0 ? opt->page_size : 1;
    /* HF's DeepSeek models rotate interleaved pairs (V3 via rope_interleave,
     * V2 through its complex-number rotary). */
    if (c->arch == ARCH_DEEPSEEK_V2) c->rope.interleaved = 1;
    const struct backend_ops *ops = m->be->ops;
    m->defer_uploads = opt && opt->defer_weights && ops->weight_upload_later &&
                       ops->weights_finish && !ops->weights_in_place;
    if (load_weights(m, ws, err)) return -1;
    /* Graphs need a step the backend can record: no host round trips and
     * a backend that records. */
    const char *ge = getenv("KILN_GRAPHS");
    m->graphs_on = m->be->ops->graph_begin && !(opt && opt->no_graphs) && !(ge && !strcmp(ge, "0"));
    const char *gs = getenv("KILN_GPU_SAMPLE"), *gg = getenv("KILN_GRAPH_SAMPLE");
    m->sample_on = m->be->ops->sample && !(gs && !strcmp(gs, "0"));
    m->graph_sample_on = !(gg && !strcmp(gg, "0"));
    /* MoE layers: only where the backend routes every decode bucket's rows
     * on the device */
    long biggest = 0;
    for (int i = 0; i < MODEL_GRAPH_BUCKETS; i++)
        if (bucket_size(i) <= m->max_seqs && bucket_size(i) <= m->max_batch_tokens) biggest = bucket_size(i);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer *L = &m->layers[l];
        int k = L->moe.route.top_k + L->moe.route.n_fused; /* the slots moe_forward passes */
        if (L->mlp_kind == LAYER_MLP_MOE &&
            !(ops->moe_ffn_graphable && ops->moe_ffn_graphable(m->be->ctx, &L->moe.experts, k, biggest)))
            m->graphs_on = 0;
    }

    m->rope_dim = is_mla(c) ? c->qk_rope_head_dim : c->head_dim;
    float *table = model_own(m, xaligned_alloc((size_t)m->max_context * (size_t)m->rope_dim * 4));
    rope_table_build(&c->rope, m->rope_dim, m->max_context, c->max_position_embeddings, table);
    m->rope_table = model_upload(m, table, (size_t)m->max_context * (size_t)m->rope_dim * 4);
    if (!m->rope_table) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the rope table");
    if (is_mla(c)) {
        double qh = c->qk_nope_head_dim + c->qk_rope_head_dim;
        m->attn_scale = (float)(1.0 / sqrt(qh) * rope_softmax_mscale(&c->rope));
    } else {
        m->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    }
    return reserve_activations(m, err);
}

int model_load_dummy(struct model **out, const struct model_config *cfg, struct backend *be,
                     const struct model_options *opt, struct kiln_error *err) {
    struct model *m = xcalloc(1, sizeof *m);
    *out = NULL;
    m->cfg = *cfg;
    m->be = be;
    m->gen.bos_token_id = cfg->bos_token_id;
    m->gen.n_eos = cfg->n_eos;
    memcpy(m->gen.eos_token_ids, cfg->eos_token_ids, sizeof cfg->eos_token_ids);
    struct weight_source ws = {.st = NULL, .rng = (opt && opt->seed ? opt->seed : 0x9e3779b97f4a7c15ull),
                               .m = m};
    if (finish_load(m, &ws, opt, err)) {
        model_free(m);
        return -1;
    }
    *out = m;
    return 0;
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
    free(cfg_path);
    if (rc) return -1;
    if (opt && opt->load_format && !strcmp(opt->load_format, "dummy"))
        return model_load_dummy(out, &cfg, be, opt, err);
    if (is_json)
        return kiln_errorf(err, "%s: a config file alone needs --load-format dummy; give the "
                                "checkpoint folder to load weights", dir);
    if (opt && opt->load_format && strcmp(opt->load_format, "auto") &&
        strcmp(opt->load_format, "safetensors"))
        return kiln_errorf(err, "--load-format '%s' is not supported (expected auto, safetensors or dummy)",
                           opt->load_format);

    struct model *m = xcalloc(1, sizeof *m);
    m->cfg = cfg;
    m->be = be;
    char *gen_path = path_join(dir, "generation_config.json");
    rc = generation_config_load(&m->gen, gen_path, &cfg, err);
    free(gen_path);
    if (rc || st_open_dir(&m->st, dir, err)) goto fail;
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
        free_activations(m);
        for (int i = 0; i < m->n_uploaded; i++) m->be->ops->weight_release(m->be->ctx, m->uploaded[i]);
    }
    free(m->uploaded);
    st_close(&m->st);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m);
}

static int check_batch(const struct model *m, const struct kv_pool *kv, const struct batch *b,
                       struct kiln_error *err) {
    if (b->n_tokens < 0 || b->n_tokens > m->max_batch_tokens)
        return kiln_errorf(err, "batch of %d tokens exceeds the reserved %d", b->n_tokens,
                           m->max_batch_tokens);
    if (b->n_seqs < 0 || b->n_seqs > m->max_seqs)
        return kiln_errorf(err, "batch of %d sequences exceeds the reserved %d", b->n_seqs, m->max_seqs);
    if (b->page_size != kv->page_size)
        return kiln_errorf(err, "batch page size %d differs from the KV pool's %d", b->page_size,
                           kv->page_size);
    if (b->kv_page_start[b->n_seqs] > m->act.pages_cap)
        return kiln_errorf(err, "batch names %d KV pages, more than the reserved %ld",
                           b->kv_page_start[b->n_seqs], m->act.pages_cap);
    long slots = (long)kv->n_pages * kv->page_size;
    for (int i = 0; i < b->n_tokens; i++) {
        KILN_ASSERT(b->input_ids[i] >= 0 && b->input_ids[i] < m->cfg.vocab_size);
        KILN_ASSERT(b->positions[i] >= 0 && b->positions[i] < m->max_context);
        KILN_ASSERT(b->out_slot[i] >= 0 && b->out_slot[i] < slots);
    }
    KILN_ASSERT(b->q_start[0] == 0 && b->q_start[b->n_seqs] == b->n_tokens);
    return 0;
}

/* Returns the index of the smallest graph bucket that holds n, or -1. */
static int bucket_for(const struct model *m, long n) {
    long cap = m->max_seqs < m->max_batch_tokens ? m->max_seqs : m->max_batch_tokens;
    for (int i = 0; i < MODEL_GRAPH_BUCKETS; i++) {
        long s = bucket_size(i);
        if (s > cap) return -1;
        if (s >= n) return i;
    }
    return -1;
}

/* Graphs capture the KV pool's buffers: drop them when this step's pool
 * has others. Padding rows write to the pool's scratch page (taken once,
 * when padding is first needed). Returns -1 when no page is free. */
static int bind_graph_pool(struct model *m, struct kv_pool *kv, int need_pad) {
    uint64_t sig = 1469598103934665603ull;
    for (int l = 0; l < kv->n_layers; l++) {
        sig = (sig ^ (uint64_t)(uintptr_t)kv->k[l]) * 1099511628211ull;
        sig = (sig ^ (uint64_t)(uintptr_t)kv->v[l]) * 1099511628211ull;
    }
    sig = (sig ^ (uint64_t)kv->n_pages) * 1099511628211ull;
    if (sig != m->graph_kv_sig) {
        drop_graphs(m);
        m->graph_kv_sig = sig;
    }
    if (need_pad && kv->scratch_page < 0 && kv_pool_alloc(kv, 1, &kv->scratch_page)) {
        kv->scratch_page = -1;
        return -1;
    }
    return 0;
}

/* Everything up to the residual stream after the last layer. */
static void run_layers(struct model *m, struct kv_pool *kv, const struct backend_batch *bb, long n) {
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long d = c->hidden_size;
    float eps = (float)c->rms_norm_eps;
    struct fwd f = {.m = m, .kv = kv, .bb = bb, .n = n, .pos = a->pos, .slot = a->slot};
    ops->embed(ctx, a->h, &m->embed, a->ids, n);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer *L = &m->layers[l];
        /* h += delta (the last sublayer's output); xn = rmsnorm(h): by the
         * model for MLA and MoE, with the following product(s) otherwise */
        struct backend_norm nm = {.h = a->h, .delta = l ? a->delta : NULL, .x = a->xn,
                                  .w = L->ln_attn, .dim = d, .eps = eps};
        if (L->attn_kind == LAYER_ATTN_MLA) {
            ops->add_rmsnorm(ctx, a->h, nm.delta, a->xn, L->ln_attn, n, d, eps);
            mla_forward(&f, l, &L->mla, a->xn, a->delta);
        } else {
            mha_forward_norm(&f, l, &L->mha, &nm, a->delta);
        }
        nm.delta = a->delta;
        nm.w = L->ln_mlp;
        if (L->mlp_kind == LAYER_MLP_MOE) {
            ops->add_rmsnorm(ctx, a->h, a->delta, a->xn, L->ln_mlp, n, d, eps);
            moe_forward(&f, &L->moe, a->xn, a->delta);
        } else {
            dense_forward_norm(&f, &L->dense, c->intermediate_size, &nm, a->delta);
        }
    }
}

/* Packs the batch (padded with `pad` one-token sequences at position 0 that
 * write to the scratch page) into the staging buffer and uploads it in one
 * copy. The logit rows go in the order a->perm gives; with device
 * sampling, the parameters of the n_sample sampled rows (want_logits rows
 * first in perm, so these are perm[n_want..]) follow, then greedy ones up
 * to n_fill rows (graph padding), and the adjustments in a second copy. */
static void stage_batch(struct model *m, const struct kv_pool *kv, const struct batch *b, int pad,
                        const struct model_sampling *smp, int n_want, int n_fill) {
    struct activations *a = &m->act;
    const struct backend_ops *ops = m->be->ops;
    long T = m->max_batch_tokens, S = m->max_seqs;
    int32_t *h = a->stage_host;
    if (a->stage_busy) ops->synchronize(m->be->ctx); /* the last step's copy may still read it */
    int n = b->n_tokens, ns = b->n_seqs, np = b->kv_page_start[ns];
    int32_t *ids = h, *pos = h + T, *slot = h + 2 * T, *rows = h + 3 * T, *qs = h + 4 * T,
            *ps = qs + S + 1, *pages = h + a->stage_pages_off;
    memcpy(ids, b->input_ids, (size_t)n * 4);
    memcpy(pos, b->positions, (size_t)n * 4);
    memcpy(slot, b->out_slot, (size_t)n * 4);
    for (int j = 0; j < b->n_logit_rows; j++) rows[j] = b->logit_rows[a->perm[j]];
    memcpy(qs, b->q_start, (size_t)(ns + 1) * 4);
    memcpy(ps, b->kv_page_start, (size_t)(ns + 1) * 4);
    memcpy(pages, b->kv_pages, (size_t)np * 4);
    for (int i = 0; i < pad; i++) {
        ids[n + i] = 0;
        pos[n + i] = 0;
        slot[n + i] = kv->scratch_page * b->page_size;
        qs[ns + i + 1] = n + i + 1;
        ps[ns + i + 1] = np + i + 1;
        pages[np + i] = kv->scratch_page;
    }
    if (smp) {
        struct backend_sample_row *sr = (struct backend_sample_row *)(h + a->stage_srows_off);
        int n_sample = b->n_logit_rows - n_want;
        for (int j = 0; j < n_sample; j++) sr[j] = smp->rows[a->perm[n_want + j]];
        if (n_fill > n_sample) memset(sr + n_sample, 0, (size_t)(n_fill - n_sample) * sizeof *sr);
        if (smp->n_adj > 0) {
            memcpy(a->sadj_host, smp->adj, (size_t)smp->n_adj * sizeof *smp->adj);
            ops->upload(m->be->ctx, a->sadj, a->sadj_host, (size_t)smp->n_adj * sizeof *smp->adj);
        }
    }
    /* one copy: everything before the page list, and the pages in use */
    ops->upload(m->be->ctx, a->stage, h, (size_t)(a->stage_pages_off + np + pad) * 4);
    a->stage_busy = a->stage_pinned;
}

/* Final norm, lm_head and sampling of all np rows of the residual stream
 * (a decode batch, padding included): what graphs [1] record after the
 * layers. */
static void sample_tail(struct model *m, long np) {
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long d = m->cfg.hidden_size, V = m->cfg.vocab_size;
    float eps = (float)m->cfg.rms_norm_eps;
    if (ops->norm_matmul && np <= a->logit_chunk) {
        /* one product: the norm hands it its 16-bit operand */
        struct backend_norm nm = {.h = a->h, .delta = a->delta, .x = a->xs, .w = m->final_norm,
                                  .dim = d, .eps = eps};
        ops->norm_matmul(ctx, &nm, a->logits, V, &m->lm_head, NULL, np);
        ops->sample(ctx, a->stok, a->logits, V, np, V, a->srows, a->sadj);
        return;
    }
    /* h is rebuilt by the next step's embedding: normalise in place */
    ops->add_rmsnorm(ctx, a->h, a->delta, a->xs, m->final_norm, np, d, eps);
    for (long r0 = 0; r0 < np; r0 += a->logit_chunk) {
        long r = np - r0 < a->logit_chunk ? np - r0 : a->logit_chunk;
        ops->matmul(ctx, a->logits, V, a->xs + r0 * d, d, &m->lm_head, NULL, r);
        ops->sample(ctx, a->stok + r0, a->logits, V, r, V, a->srows + r0, a->sadj);
    }
}

static void run_step(struct model *m, struct kv_pool *kv, const struct backend_batch *bb, long np,
                     int kind) {
    run_layers(m, kv, bb, np);
    if (kind) sample_tail(m, np);
}

int model_can_sample(const struct model *m) { return m->sample_on; }
int model_sample_adj_capacity(const struct model *m) { return m->act.adj_cap; }

static int forward_impl(struct model *m, struct kv_pool *kv, const struct batch *b,
                        const struct model_sampling *smp, int32_t *tokens, float *logits,
                        struct kiln_error *err) {
    if (b->mode == BATCH_MODE_IDLE || b->n_tokens == 0) return 0;
    if (check_batch(m, kv, b, err)) return -1;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long n = b->n_tokens, d = c->hidden_size, V = c->vocab_size;
    float eps = (float)c->rms_norm_eps;
    int n_lr = b->n_logit_rows, n_want = n_lr;
    if (n_lr < 0 || n_lr > m->max_batch_tokens)
        return kiln_errorf(err, "batch asks for %d logit rows, more than the reserved %d", n_lr,
                           m->max_batch_tokens);
    if (smp) {
        if (!m->sample_on) return kiln_errorf(err, "model_forward_sample: the backend does not sample");
        n_want = 0;
        for (int j = 0; j < n_lr; j++) n_want += smp->want_logits && smp->want_logits[j];
        if (n_lr - n_want > m->max_seqs)
            return kiln_errorf(err, "%d rows to sample on the device, more than the reserved %d",
                               n_lr - n_want, m->max_seqs);
        if (smp->n_adj < 0 || smp->n_adj > a->adj_cap)
            return kiln_errorf(err, "%d sampling adjustments, more than the reserved %d", smp->n_adj,
                               a->adj_cap);
        for (int j = 0; j < n_lr; j++) {
            const struct backend_sample_row *r = &smp->rows[j];
            if (smp->want_logits && smp->want_logits[j]) continue;
            KILN_ASSERT(r->n_adj >= 0 && r->adj_start >= 0 && r->adj_start + r->n_adj <= smp->n_adj);
        }
    }
    int n_sample = n_lr - n_want;
    /* rows that want logits first (their logits download as one block) */
    for (int j = 0, w = 0, sj = n_want; j < n_lr; j++) {
        if (!smp || (smp->want_logits && smp->want_logits[j])) a->perm[w++] = j;
        else a->perm[sj++] = j;
    }

    /* Decode steps (one token per sequence) replay a graph recorded for the
     * next bucket size, padded with one-token sequences. */
    int gi = -1, pad = 0;
    if (m->graphs_on && b->n_tokens == b->n_seqs && (gi = bucket_for(m, n)) >= 0) {
        pad = bucket_size(gi) - (int)n;
        if (bind_graph_pool(m, kv, pad > 0) ||
            b->kv_page_start[b->n_seqs] + pad > a->pages_cap) {
            gi = -1;
            pad = 0;
        }
    }
    /* A decode step whose every row samples on the device runs the whole
     * step, sampling included, from graphs [1]. */
    int kind = smp && gi >= 0 && n_want == 0 && n_lr == n && m->graph_sample_on;
    for (int j = 0; kind && j < n_lr; j++) kind = b->logit_rows[j] == j;
    stage_batch(m, kv, b, pad, smp, n_want, kind ? (int)n + pad : n_sample);
    long np = n + pad;
    struct backend_batch bb = {.n_tokens = (int)np, .n_seqs = b->n_seqs + pad,
                               .page_size = b->page_size, .positions = a->pos,
                               .q_start = a->q_start, .kv_page_start = a->page_start,
                               .kv_pages = a->pages};
    if (gi < 0) {
        run_layers(m, kv, &bb, np);
    } else if (m->graphs[kind][gi]) {
        if (ops->graph_launch(ctx, m->graphs[kind][gi])) { /* stale: scratch moved */
            drop_graphs(m);
            run_step(m, kv, &bb, np, kind);
            m->graph_warm[kind][gi] = 1;
        }
    } else if (!m->graph_warm[kind][gi]) {
        /* the first step of a size runs eagerly: scratch and library state
         * settle before anything is recorded */
        run_step(m, kv, &bb, np, kind);
        m->graph_warm[kind][gi] = 1;
    } else {
        ops->graph_begin(ctx);
        run_step(m, kv, &bb, np, kind);
        m->graphs[kind][gi] = ops->graph_end(ctx);
        if (!m->graphs[kind][gi] || ops->graph_launch(ctx, m->graphs[kind][gi])) {
            log_warn("model: recording a decode graph failed; running without graphs");
            drop_graphs(m);
            m->graphs_on = 0;
            run_step(m, kv, &bb, np, kind);
        }
    }
    if (kind) {
        ops->download(ctx, a->stok_host, a->stok, (size_t)n * 4);
        memcpy(tokens, a->stok_host, (size_t)n * 4);
        a->stage_busy = 0;
        return 0;
    }

    if (n_lr == 0) return 0;
    /* only the rows that need logits go through the final norm and lm_head */
    ops->gather_rows(ctx, a->xs, a->h, d, a->rows, n_lr);
    ops->gather_rows(ctx, a->xn, a->delta, d, a->rows, n_lr);
    ops->add_rmsnorm(ctx, a->xs, a->xn, a->xs, m->final_norm, n_lr, d, eps);
    for (long r0 = 0; r0 < n_lr; r0 += a->logit_chunk) {
        long r = n_lr - r0 < a->logit_chunk ? n_lr - r0 : a->logit_chunk;
        ops->matmul(ctx, a->logits, V, a->xs + r0 * d, d, &m->lm_head, NULL, r);
        if (r0 < n_want) {
            long w = n_want - r0 < r ? n_want - r0 : r;
            ops->download(ctx, logits + r0 * V, a->logits, (size_t)(w * V) * 4);
        }
        long lo = r0 > n_want ? r0 : n_want;
        if (lo < r0 + r)
            ops->sample(ctx, a->stok + (lo - n_want), a->logits + (lo - r0) * V, V, r0 + r - lo, V,
                        a->srows + (lo - n_want), a->sadj);
    }
    if (n_sample) {
        ops->download(ctx, a->stok_host, a->stok, (size_t)n_sample * 4);
        for (int j = 0; j < n_sample; j++) tokens[a->perm[n_want + j]] = a->stok_host[j];
    }
    a->stage_busy = 0; /* a download waited for the stream */
    return 0;
}

int model_forward(struct model *m, struct kv_pool *kv, const struct batch *b, float *logits,
                  struct kiln_error *err) {
    return forward_impl(m, kv, b, NULL, NULL, logits, err);
}

int model_forward_sample(struct model *m, struct kv_pool *kv, const struct batch *b,
                         const struct model_sampling *s, int32_t *tokens, float *logits,
                         struct kiln_error *err) {
    return forward_impl(m, kv, b, s, tokens, logits, err);
}

/* One-token sequences at position 0 on `page` (decode buckets) or one
 * sequence of n tokens on pages[] (prefill), all rows asking for logits so
 * the lm_head's shapes are warmed too. */
/* Sampling parameters for warm-up row j: greedy and the configurations
 * the CPU sampler's warm-up uses, in turn. */
static void warm_params(struct backend_sample_row *r, int j) {
    memset(r, 0, sizeof *r);
    static const float temp[6] = {0, 0.7f, 1.0f, 0.8f, 1.2f, 0.6f}, top_p[6] = {1, 0.9f, 1, 0.95f, 1, 0.8f};
    static const int top_k[6] = {0, 0, 50, 40, 0, 20};
    r->temperature = temp[j % 6];
    r->top_p = top_p[j % 6];
    r->top_k = top_k[j % 6];
    r->min_p = j % 6 == 4 ? 0.05f : 0.0f;
    r->seed = (uint64_t)j;
    r->step = 1;
}

static int warm_step(struct model *m, struct kv_pool *kv, int n, int n_seqs, const int32_t *pages,
                     int n_pages, float *logits, int sample, struct kiln_error *err) {
    int ps = kv->page_size;
    int32_t *buf = xmalloc((size_t)(5 * n + 3 * (n_seqs + 1) + n_pages + n_seqs) * 4);
    int32_t *ids = buf, *pos = ids + n, *slot = pos + n, *rows = slot + n, *qs = rows + n,
            *kvl = qs + n_seqs + 1, *pst = kvl + n_seqs + 1, *pg = pst + n_seqs + 1;
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
        pos[i] = n_seqs == 1 ? i : 0;
        slot[i] = n_seqs == 1 ? pages[i / ps] * ps + i % ps : pages[0] * ps;
        rows[i] = i;
    }
    for (int s = 0; s <= n_seqs; s++) {
        qs[s] = n_seqs == 1 ? (s ? n : 0) : s;
        pst[s] = n_seqs == 1 ? (s ? n_pages : 0) : s;
        if (s < n_seqs) kvl[s] = n_seqs == 1 ? n : 1;
    }
    for (int i = 0; i < n_pages; i++) pg[i] = pages[i];
    for (int s = n_pages; s < n_seqs; s++) pg[s] = pages[0];
    int rows_wanted = n < m->act.logit_chunk ? n : m->act.logit_chunk;
    struct batch b = {.mode = n_seqs == n ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = n,
                      .input_ids = ids, .positions = pos, .out_slot = slot, .n_seqs = n_seqs,
                      .q_start = qs, .kv_len = kvl, .kv_page_start = pst, .kv_pages = pg,
                      .page_size = ps, .n_logit_rows = rows_wanted, .logit_rows = rows};
    int rc;
    if (sample) { /* every row sampled on the device: graphs [1] */
        struct backend_sample_row *sr = xmalloc((size_t)rows_wanted * sizeof *sr);
        int32_t *tok = xmalloc((size_t)rows_wanted * 4);
        for (int j = 0; j < rows_wanted; j++) warm_params(&sr[j], j);
        struct model_sampling smp = {.rows = sr};
        rc = model_forward_sample(m, kv, &b, &smp, tok, logits, err);
        free(sr);
        free(tok);
    } else {
        rc = model_forward(m, kv, &b, logits, err);
    }
    free(buf);
    return rc;
}

int model_warmup(struct model *m, struct kv_pool *kv, struct kiln_error *err) {
    if (!m->be->ops->graph_begin) return 0;
    double t0 = time_now();
    int ps = kv->page_size, rc = 0, n_dec = 0, n_pre = 0;
    float *logits = xmalloc((size_t)m->act.logit_chunk * (size_t)m->cfg.vocab_size * 4);
    int longest = m->max_batch_tokens < m->max_context ? m->max_batch_tokens : m->max_context;
    int n_pages = (longest + ps - 1) / ps;
    if (n_pages > kv_pool_available(kv) - 1) n_pages = kv_pool_available(kv) - 1;
    if (n_pages < 1) {
        free(logits);
        return kiln_errorf(err, "warm-up: the KV pool has no free pages");
    }
    int32_t *pages = xmalloc((size_t)n_pages * 4);
    KILN_ASSERT(kv_pool_alloc(kv, n_pages, pages) == 0);
    /* Prefill sizes first: they grow the backend's scratch to its largest,
     * and scratch moving would make graphs recorded before it stale. */
    /* prefill: every power of two up to the longest batch, and that batch */
    for (int t = 1; rc == 0; t = t * 2 < longest ? t * 2 : longest) {
        if (t > n_pages * ps) t = n_pages * ps;
        rc = warm_step(m, kv, t, 1, pages, (t + ps - 1) / ps, logits, 0, err);
        n_pre++;
        if (t >= longest || t >= n_pages * ps) break;
    }
    m->be->ops->synchronize(m->be->ctx);
    double t1 = time_now();
    /* decode buckets: the first run is eager, the second records the graph;
     * with device sampling, both kinds (with and without the sampling tail) */
    int kinds = m->sample_on && m->graph_sample_on ? 2 : 1;
    for (int i = 0; i < MODEL_GRAPH_BUCKETS && rc == 0; i++) {
        int s = bucket_size(i);
        if (bucket_for(m, s) != i) break;
        for (int kind = 0; kind < kinds; kind++)
            for (int k = 0; k < 2 && rc == 0; k++)
                rc = warm_step(m, kv, s, s, pages, 1, logits, kind, err);
        n_dec++;
    }
    m->be->ops->synchronize(m->be->ctx);
    double t2 = time_now();
    kv_pool_release(kv, pages, n_pages);
    free(pages);
    free(logits);
    if (rc == 0)
        log_info("warm-up: %d prefill sizes (1..%d tokens) in %.2f s, %d decode buckets (1..%d "
                 "sequences, graphs recorded%s) in %.2f s",
                 n_pre, longest, t1 - t0, n_dec, bucket_size(n_dec - 1),
                 kinds == 2 ? ", with and without device sampling" : "", t2 - t1);
    return rc;
}

double model_sample_warmup(struct model *m) {
    if (!m->sample_on) return 0;
    double t0 = time_now();
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct activations *a = &m->act;
    long V = m->cfg.vocab_size, rows = a->logit_chunk < m->max_seqs ? a->logit_chunk : m->max_seqs;
    /* rows like a model's: a broad bulk and a few peaks */
    float *h = xmalloc((size_t)V * 4);
    uint64_t z = 0x5eed;
    for (long i = 0; i < V; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(z >> 40) / 16777216.0 * 8.0 - 4.0) + (i % 4099 == 0 ? 15.0f : 0.0f);
    }
    struct backend_sample_row *sr = (struct backend_sample_row *)(a->stage_host + a->stage_srows_off);
    if (a->stage_busy) ops->synchronize(ctx);
    for (long j = 0; j < rows; j++) warm_params(&sr[j], (int)j);
    ops->upload(ctx, a->srows, sr, (size_t)rows * sizeof *sr);
    /* no adjustments: the rows stay as uploaded */
    for (long j = 0; j < rows; j++) ops->upload(ctx, a->logits + j * V, h, (size_t)V * 4);
    /* batch sizes 1, 2, 4, ... up to the largest decode batch */
    for (long n = 1;; n = n * 2 < rows ? n * 2 : rows) {
        ops->sample(ctx, a->stok, a->logits, V, n, V, a->srows, a->sadj);
        if (n == rows) break;
    }
    ops->synchronize(ctx);
    a->stage_busy = 0;
    free(h);
    return time_now() - t0;
}
