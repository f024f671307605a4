/* model_internal.h — what the architecture family files share: weight
 * structs, the weight source (checkpoint or dummy), activation buffers and
 * the per-layer forward hooks. Not for use outside src/model/. */
#ifndef KILN_MODEL_MODEL_INTERNAL_H
#define KILN_MODEL_MODEL_INTERNAL_H

#include "model/model.h"
#include "model/safetensors.h"
#include "tensor/backend.h"

/* Where weights come from. */
struct weight_source {
    struct st_set *st; /* NULL: dummy weights */
    uint64_t seed;     /* dummy weights: tensor/dummy_fill.h */
    uint64_t n_tensors; /* dummy tensors made so far: the next one's index */
    struct model *m;   /* owner of converted / generated host buffers */
    const void *last_host; /* host bytes of the last matrix ws_matrix loaded (NULL: made on
                              the device; ws_last_host makes them, except FP8 codes: read
                              those back from the device) */
    const float *last_scale; /* ... its host fp32 block scales when FP8, else NULL (valid for
                                the model's life) */
    uint64_t last_tensor;  /* ... its dummy tensor index, elements and columns */
    size_t last_n;
    long last_cols;
};

/* The part of a checkpoint tensor a rank loads (tensor parallel): elements
 * [start, start + len) of dimension dim: 0, a matrix's rows (its output
 * features: column-parallel, a view into the mapping) or a vector's
 * elements; 1, a matrix's columns (its input features: row-parallel, a
 * host copy). Loaders take the checkpoint's whole shape and a slice, NULL
 * for the whole tensor. */
struct ws_slice {
    int dim;
    long start, len;
};
/* shard.c: rank tp_rank's slice when every rank holds `local` of
 * dimension dim (ranks in order); NULL on one rank. */
const struct ws_slice *ws_split(struct ws_slice *s, const struct model_config *c, int dim, long local);
/* The tensor parallel size (1: not split). */
static inline int model_tp(const struct model_config *c) {
    return c->shard.tp_size > 1 ? c->shard.tp_size : 1;
}
/* The ranks one layer's attention heads split over: the tensor parallel
 * size, or with DP attention the ranks of a data parallel group. */
static inline int model_attn_tp(const struct model_config *c) {
    if (c->shard.dp_size > 1) return c->shard.attn_tp_size;
    return model_tp(c);
}
/* ws_split for the attention's weights: over model_attn_tp's ranks. */
const struct ws_slice *ws_split_attn(struct ws_slice *s, const struct model_config *c, int dim, long local);

/* The host bytes of the last matrix ws_matrix loaded (the checkpoint's, or
 * dummy values made again on the host when the device made them), valid
 * for the model's life. NULL when out of memory. */
const void *ws_last_host(struct weight_source *ws);

/* Ordinary multi-head attention (llama, qwen2, qwen3, qwen moe). */
struct attn_mha {
    struct backend_weight wq, wk, wv, wo; /* [heads*hd][d], [kvh*hd][d] x2, [d][heads*hd] */
    struct backend_weight wqkv;            /* wq|wk|wv stacked (wq, wk, wv are views of it) */
    const float *bqkv;                     /* bq|bk|bv stacked, or NULL */
    const float *bo;                       /* bias or NULL */
    const float *q_norm, *k_norm;          /* [hd] or NULL */
    const float *sinks;                    /* [heads] attention sinks (gpt-oss) or NULL */
};

/* Multi-head latent attention (deepseek), run in the absorbed form. */
struct attn_mla {
    struct backend_weight wq;        /* [h*(nope+rope)][d] when q_lora_rank == 0 */
    struct backend_weight wq_a, wq_b; /* [q_lora][d], [h*(nope+rope)][q_lora] */
    const float *q_a_norm;           /* [q_lora] */
    struct backend_weight wkv_a;     /* [kv_lora+rope][d] */
    const float *kv_a_norm;          /* [kv_lora] */
    struct backend_weight wkv_b;     /* [h*(nope+v)][kv_lora] */
    struct backend_weight *w_uk_t;   /* [h] each [kv_lora][nope]: kv_b's k rows, transposed */
    struct backend_weight *w_uv;     /* [h] each [v][kv_lora]: views into wkv_b */
    struct backend_weight wo;        /* [d][h*v] */
};

struct mlp_dense {
    struct backend_weight gate, up, down; /* [f][d], [f][d], [d][f] */
    struct backend_weight gate_up;        /* gate|up stacked [2f][d] (gate, up are views) */
};

struct mlp_moe {
    struct backend_weight router;     /* [E][d] */
    const float *router_bias;         /* [E] (gpt-oss) or NULL */
    const float *correction_bias;     /* [E] or NULL */
    struct backend_weight *gate, *up, *down; /* [E] */
    struct moe_experts experts;
    struct moe_route_params route;
    int has_shared;
    int shared_fused;                 /* the shared expert is expert E of `experts` (moe.c) */
    struct mlp_dense shared;          /* qwen2_moe shared expert / deepseek shared experts */
    struct backend_weight shared_gate; /* qwen2_moe [1][d]; data NULL when absent */
    long shared_inter;                /* the shared MLP's intermediate size */
    struct moe_route_count *count[2]; /* decode, other steps (model_options.moe_count) or NULL */
};

/* What differs between the families' MoE blocks (moe_load). */
struct moe_kind {
    int renormalize_single;      /* renormalise the chosen weights with top_k 1 too */
    float scaling;               /* routed_scaling_factor applied to the weights */
    int scale_when_renormalized; /* scale after renormalising too (else only without it) */
    /* 1: the shared experts are one unscaled MLP of n_shared_experts x
     * moe_intermediate_size (DeepSeek); 0: one shared expert of
     * shared_expert_intermediate_size behind a sigmoid gate (Qwen2-MoE) */
    int shared_summed;
};

enum layer_attn { LAYER_ATTN_MHA = 0, LAYER_ATTN_MLA };
enum layer_mlp { LAYER_MLP_DENSE = 0, LAYER_MLP_MOE };

struct layer {
    const float *ln_attn, *ln_mlp; /* [d] */
    const float *ln_post_attn, *ln_post_mlp; /* [d] sandwich norms (Gemma), or NULL */
    enum layer_attn attn_kind;
    enum layer_mlp mlp_kind;
    struct attn_mha mha;
    struct attn_mla mla;
    struct mlp_dense dense;
    struct mlp_moe moe;
    /* An FP8 KV cache's scales (kv_store; MLA's latent rows use k_scale):
     * the checkpoint's self_attn.k_scale / v_scale, else 1 (model.c). */
    float k_scale, v_scale;
};

/* Activation buffers, reserved for max_batch_tokens rows. */
struct activations {
    float *h, *xn, *delta;    /* [T][d] */
    float *q, *k, *v;         /* [T][q_width], [T][k_width], [T][v_width] */
    float *qkv;               /* MHA: [T][q_width + 2 k_width] (q|k|v of a row) */
    float *q2;                /* MLA absorbed queries [T][h*(kv_lora+rope)] */
    float *att;               /* [T][att_width] */
    float *o;                 /* [T][h*v] (MLA per-head outputs) */
    float *g;                 /* [T][2 max_inter] (gate|up of a row) */
    float *shared;            /* [T][d] */
    float *router;            /* [T][E] */
    float *gate1;             /* [T][1] */
    int32_t *moe_ids;         /* [T][top_k] */
    float *moe_w;             /* [T][top_k] */
    float *xs;                /* [T][d] rows that need logits */
    float *lm;                /* tensor parallel: [tp][lm_rows][vocab_stride] the ranks' logits */
    struct mla_ws *mla;       /* deepseek_mha.c's workspace (MLA models), or NULL */
    int delta_part;           /* tensor parallel: delta is still this rank's part, summed
                                 by the next norm (model_defer_delta) */
};

/* The buffers of struct activations, for model_act_counts (model_size.c):
 * each one's element count (fp32 or int32) for T rows, 0 where the model
 * does not use it. model.c allocates exactly these; the memory plan adds
 * them up (model_activation_bytes). */
enum {
    ACT_H, ACT_XN, ACT_DELTA, ACT_Q, ACT_K, ACT_V, ACT_QKV, ACT_Q2, ACT_ATT, ACT_O, ACT_G,
    ACT_SHARED, ACT_ROUTER, ACT_GATE1, ACT_MOE_IDS, ACT_MOE_W, ACT_XS, ACT_LM, ACT_COUNT
};
/* Rows of logits model_lm_head gathers from the ranks at once (tensor
 * parallel): the gather buffer is tp x this x vocab_stride floats, about
 * as large as the runner's own logits chunk. */
enum { MODEL_LM_ROWS = 64 };
void model_act_counts(const struct model_config *c, long T, size_t counts[ACT_COUNT]);

struct model {
    struct model_config cfg;
    const struct model_family *fam;
    struct generation_config gen;
    struct backend *be;
    struct st_set st;
    int max_batch_tokens, max_seqs, max_context;
    size_t weight_bytes;
    int defer_uploads;   /* model_options.defer_weights and the backend can */
    int quantize_online; /* model_options.quantization fp8: ws_proj and ws_matrix_cat make
                            FP8 of projections not FP8 already (cfg.quant says the blocks
                            and the modules left alone) */
    int weights_pending; /* copies queued by weight_upload_later not yet waited for */

    struct backend_weight embed, lm_head;
    const float *final_norm;
    struct layer *layers;
    const float *rope_table;    /* device [max_context][rot/2][2] */
    const float *rope_table_local; /* the sliding layers' (cfg.rope_local_theta), or NULL */
    int rope_dim;
    float attn_scale;

    struct activations act;
    int fuse_shared;  /* shared-expert fusion allowed (model_options) */
    int route_uniform; /* model_options.dummy_routing is MODEL_ROUTING_UNIFORM */
    int moe_count;     /* model_options.moe_count */
    void *moe_counts;  /* device: the count records of every MoE layer (moe.c) */
    size_t moe_count_stride; /* bytes per record */
    struct model_route_trace route_trace; /* model_set_route_trace; fn NULL: off */
    void **owned; /* host buffers to free: converted vectors, dummy weights */
    int n_owned, cap_owned;
    const void **uploaded; /* device buffers from weight_upload / alloc to release */
    int n_uploaded, cap_uploaded;
    struct dist_comm *comm; /* model_options.par.comm; NULL on one rank */
    struct dp_attn *dp;     /* DP attention's step state (dp_attention.c), or NULL */
    /* pipeline parallel (pipeline.c): model_options.par.pp_comm, and the
     * [n_layers] K / V cache arrays the layers index, whose stage's
     * entries point into the stage's pool (NULL elsewhere) */
    struct dist_comm *pp_comm;
    void **pp_k, **pp_v;
};

/* The state one layer's forward needs. */
struct fwd {
    struct model *m;
    struct kv_pool *kv;
    const struct backend_batch *bb;
    long n;                      /* token rows */
    const int32_t *pos;          /* device positions */
    const int32_t *slot;         /* device out slots */
    const struct batch *host;    /* model_step.host */
};

/* Widths (floats per token row) of the attention activations a family uses. */
struct act_widths {
    long q, k, v, att, q2, o; /* q2, o: 0 when unused */
    int stacked_qkv;          /* act.qkv: q | k | v of a row (q + 2 k wide) */
};

/* An architecture family: what its layers hold and how they run. Each
 * family file (llama.c, qwen_moe.c, deepseek.c) defines one; config.c's
 * table names the family of each model_type. */
struct model_family {
    const char *name;
    /* Refuses what the family does not implement in a parsed config, with
     * a message naming the file and the field. */
    int (*check_config)(const struct model_config *c, const char *file, struct kiln_error *err);
    /* The KV cache row layer l keeps per token. */
    struct kv_layer_layout (*kv_layout)(const struct model_config *c, int layer);
    void (*act_widths)(const struct model_config *c, struct act_widths *w);
    int (*rope_dim)(const struct model_config *c);
    double (*attn_scale)(const struct model_config *c);
    /* Whether layer l's MLP is a mixture of experts. */
    int (*layer_is_moe)(const struct model_config *c, int layer);
    /* Layer l's attention and MLP weights (its two norms are loaded by
     * model.c), then its forward: the residual stream h += delta of the
     * previous sublayer (none before layer 0), and delta = this layer's
     * attention, then MLP, output. */
    int (*load_layer)(struct weight_source *ws, int l, struct layer *L, struct kiln_error *err);
    void (*forward_layer)(const struct fwd *f, int l, const struct layer *L);
};

extern const struct model_family family_llama, family_qwen_moe, family_deepseek, family_gemma3,
    family_gpt_oss;
const struct model_family *model_family_of(const struct model_config *c);
/* config.c: the refusals every family shares (activation, partial rotary,
 * sliding windows). */
int family_check_common(const struct model_config *c, const char *file, struct kiln_error *err);

/* pipeline.c. The stage's layers [*l0, *l1) (every layer when not split). */
static inline void model_stage_layers(const struct model_config *c, int *l0, int *l1) {
    int split = c->shard.pp_size > 1;
    *l0 = split ? c->shard.layer0 : 0;
    *l1 = split ? c->shard.layer1 : c->n_layers;
}
/* Checks the pipeline layout of opt->par for m's config (file named in
 * messages), gives the config its stage's layers (config.h struct
 * model_shard) and m its pipeline state. Nothing when not split. */
int model_pp_setup(struct model *m, const struct model_options *opt, const char *file, struct kiln_error *err);
/* The pool the layers of a stage index by their model-wide number: kv,
 * or (pipeline parallel) *tmp made of it over m->pp_k / pp_v. */
struct kv_pool *model_pp_kv(struct model *m, struct kv_pool *kv, struct kv_pool *tmp);

/* The residual add + norm in front of layer l's attention (w = its norm):
 * h += act.delta (none at layer 0), x = act.xn. layer_norm_delta: the
 * same with act.delta (a layer's second norm). A delta model_defer_delta
 * left as this rank's part goes with it (backend_norm.reduce): the norm
 * must then run (a product that takes it, or model_norm). */
struct backend_norm layer_norm_in(const struct fwd *f, int l, const float *w);
struct backend_norm layer_norm_delta(const struct fwd *f, const float *w);
/* The norm alone into nm->x (add_rmsnorm, or the backend's sum of the
 * ranks' parts + add + norm where nm->reduce). */
void model_norm(const struct fwd *f, const struct backend_norm *nm);

/* weights.c. A matrix keeps its checkpoint dtype: BF16, F16, F32, or
 * F8_E4M3 with its `<name>_scale_inv` block scales where config.json's
 * quantization_config says fp8 (out->scale, block_rows, block_cols; the
 * backend must have fp8_weights). ws_matrix loads matrices that online
 * quantization leaves alone (embeddings, lm_head, routers, gates);
 * ws_proj loads an attention or MLP projection, which under
 * model_options.quantization fp8 becomes FP8 with 128x128 blocks unless
 * quantization_config lists it as not converted. */
int ws_matrix(struct weight_source *ws, const char *name, long rows, long cols,
              const struct ws_slice *slice, struct backend_weight *out, struct kiln_error *err);
int ws_proj(struct weight_source *ws, const char *name, long rows, long cols,
            const struct ws_slice *slice, struct backend_weight *out, struct kiln_error *err);
/* The FP8 layout of w[rows][cols] (dtype BF16, F16 or F32) in blocks of
 * br x bc, as scripts/oracle/make_fp8_oracle.py makes it: per block,
 * scale = max(max |w|, 1e-12) / 448 and q = f32_to_fp8_e4m3(w / scale)
 * (so the block's largest element becomes ±448 exactly). q[rows][cols],
 * scale[ceil(rows / br)][ceil(cols / bc)]. */
void fp8_quantize_blocks(const void *w, enum dtype dt, long rows, long cols, int br, int bc,
                         uint8_t *q, float *scale);
/* fp32 vector on the device; `fill` is the dummy value (NAN = random). */
int ws_vector(struct weight_source *ws, const char *name, long len, float fill, const float **out,
              struct kiln_error *err);
/* An RMSNorm's weight: ws_vector's, read as 1 + w where the config says
 * (norm_plus_one, Gemma); the dummy weight is 1 either way. */
int ws_norm(struct weight_source *ws, const char *name, long len, const float **out,
            struct kiln_error *err);
/* y = x · catᵀ, where cat stacks parts[0..count) by rows; with weights kept
 * in place (cat->data NULL) the parts run one by one into the same columns. */
void model_matmul_cat(struct model *m, float *y, long ldy, const float *x, long ldx,
                      const struct backend_weight *cat, const struct backend_weight *parts,
                      int count, const float *bias, long n);
/* Matrices of `count` tensors stacked by rows into one device matrix `out`
 * (all of one dtype), with `parts[i]` the views of each; the products of a
 * layer that read the same input become one (q|k|v, gate|up). They are
 * projections (ws_proj). FP8 parts: on in-place backends (the CPU) only,
 * for now. slices: NULL, or [count] row slices (dim 0) of the parts. */
int ws_matrix_cat(struct weight_source *ws, const char *const *names, const long *rows,
                  const struct ws_slice *slices, int count, long cols, struct backend_weight *out,
                  struct backend_weight *parts, struct kiln_error *err);
/* Vectors concatenated into one device vector (the biases of a stacked
 * matrix); slices as ws_matrix_cat's. */
int ws_vector_cat(struct weight_source *ws, const char *const *names, const long *lens,
                  const struct ws_slice *slices, int count, float fill, const float **out,
                  struct kiln_error *err);
void *model_own(struct model *m, void *host);
const void *model_upload(struct model *m, const void *host, size_t bytes);

/* shard.c. Splits config c (its file named in messages) for rank p of a
 * tensor / expert parallel group: refuses sizes that do not divide, then
 * makes c the rank's config (config.h struct model_shard). A zeroed or
 * NULL p leaves c whole. */
int model_shard_split(struct model_config *c, const struct model_parallel *p, const char *file,
                      struct kiln_error *err);
/* The rank's first KV head in the whole model's numbering (0 on one rank). */
long model_shard_kv_head0(const struct model_config *c);
/* The rank's rows of a shared-expert MLP (Qwen2-MoE's shared expert,
 * DeepSeek's n_shared_experts x moe_intermediate_size). */
long moe_shared_inter(const struct model_config *c);
/* buf[count] summed over the tensor parallel ranks, in place (nothing on
 * one rank). A failed collective ends the process: it prints
 * "kiln: rank R: <error>" and exits with status 1. */
void model_tp_sum(struct model *m, float *buf, size_t count);
/* recv[tp][bytes] = every rank's send[bytes] in rank order (send may be
 * recv + tp_rank · bytes); failures as model_tp_sum's. */
void model_tp_gather(struct model *m, const void *send, void *recv, size_t bytes);
/* The all-reduce of a layer's sublayer output act.delta (n rows), where
 * the ranks' partial sums meet (attention after o_proj, the MLP after
 * down_proj). */
void model_reduce_delta(const struct fwd *f);
/* The same where the next thing to read act.delta is a norm taken with
 * layer_norm_in / layer_norm_delta: where the backend sums the ranks'
 * parts inside that norm (norm_reduce_ok; one kernel instead of an
 * all-reduce and a norm), act.delta stays this rank's part until then
 * (act.delta_part); else model_reduce_delta now. model_forward_layers
 * sums a part still pending after the last layer. */
void model_defer_delta(const struct fwd *f);

/* rope.c: cos/sin table [max_pos][dim/2][2] and the yarn attention factor. */
void rope_table_build(const struct rope_config *rc, int dim, int max_pos,
                      int max_position_embeddings, float *out);
double rope_softmax_mscale(const struct rope_config *rc);

/* llama.c: multi-head attention, shared with qwen_moe.c */
int mha_check(const struct model_config *c, const char *file, struct kiln_error *err);
struct kv_layer_layout mha_kv_layout(const struct model_config *c, int layer);
void mha_act_widths(const struct model_config *c, struct act_widths *w);
int mha_rope_dim(const struct model_config *c);
double mha_attn_scale(const struct model_config *c);
int mha_load(struct weight_source *ws, int l, struct attn_mha *a, struct kiln_error *err);
int dense_load(struct weight_source *ws, const char *prefix, long inter, struct mlp_dense *d,
               struct kiln_error *err);
void dense_forward(const struct fwd *f, const struct mlp_dense *d, long inter, const float *x,
                   float *out);
/* The layer's add_rmsnorm in front of its attention / MLP, with the
 * products in layer-level backend operations (the backend fuses inside). */
void mha_forward_norm(const struct fwd *f, int l, const struct attn_mha *a,
                      const struct backend_norm *nm, float *out);
void dense_forward_norm(const struct fwd *f, const struct mlp_dense *d, long inter,
                        const struct backend_norm *nm, float *out);

/* deepseek_mha.c: MLA in the MHA form for sequences with many new tokens.
 * mla_attend computes o[n][H·vd] from the queries q[n][H·(nope+rope)] of
 * layer l (the latent rows of the step already stored in the cache), each
 * sequence in the form its shape chooses; `absorbed` runs the absorbed
 * form over the rows of f (deepseek.c), called with sub-batches. */
typedef void (*mla_absorbed_fn)(const struct fwd *f, int l, const struct attn_mla *a,
                                const float *q, float *o);
void mla_attend(const struct fwd *f, int l, const struct attn_mla *a, const float *q, float *o,
                mla_absorbed_fn absorbed);
/* 1 when a sequence of n new tokens with context ctx (its last position
 * + 1) takes the MHA form: forced 0 auto (by FLOP cost), 1 absorbed, 2 mha
 * (KILN_MLA_FORM); ctx above ws_tokens never does. */
int mla_use_mha(const struct model_config *c, long n, long ctx, long ws_tokens, int forced);
/* The workspace, reserved with the activations (MLA models only). */
int mla_ws_reserve(struct model *m, struct kiln_error *err);
size_t mla_ws_bytes(const struct model_config *c, long max_context, size_t es);
void mla_ws_free(struct model *m);
/* 0 when steps must not be recorded in graphs (the MHA form forced on
 * decode rows: its sizes come from the host). */
int mla_graphable(const struct model *m);

/* dp_attention.c: DP attention (model_parallel.dp_size > 1, MLA only). */
enum { DP_MAX_GROUPS = 64 };
/* Refuses what DP attention cannot run (model_shard_split, dp_size > 1):
 * a dp_size not dividing tp_size, a model without MLA, a wrong dp_rank. */
int dp_attention_check(const struct model_config *c, const struct model_parallel *p, const char *file,
                       struct kiln_error *err);
/* Floats of device memory dp_reserve takes for batches of T rows (0 off). */
size_t dp_act_floats(const struct model_config *c, long T);
int dp_reserve(struct model *m, struct kiln_error *err);
void dp_free(struct model *m);
/* Before a step's layers: stages the sub-batch of the rank's group from
 * the host batch s->host (its seq_group; no graph padding). */
void dp_step_begin(struct model *m, const struct model_step *s);
/* Layer l's attention over the rank's group's rows of act.xn (normed
 * input of every row) by attn (the family's attention + o_proj: out[n][d]
 * from x[n][d] for the rows of f), then every row's output gathered from
 * its group into act.delta. */
typedef void (*dp_attn_fn)(const struct fwd *f, int l, const struct attn_mla *a, const float *x,
                           float *out);
void dp_attention(const struct fwd *f, int l, const struct attn_mla *a, dp_attn_fn attn);

/* gpt_oss_experts.c: gpt-oss's MoE MLP of layer l (router with its bias,
 * fused bf16 or MXFP4 experts with biases, the clamped SwiGLU). */
int gpt_oss_moe_load(struct weight_source *ws, int l, struct mlp_moe *moe, struct kiln_error *err);
/* weights.c: dummy MXFP4 weights (a backend with backend_ops.mxfp4_experts):
 * the values ws_matrix would make for this [rows][cols] matrix, encoded
 * as MXFP4 (tensor/mxfp4.h), on the device where the backend can, else
 * filled on the host and uploaded. */
int ws_dummy_mxfp4(struct weight_source *ws, const char *name, long rows, long cols, struct backend_weight *out,
                   struct kiln_error *err);
/* weights.c: element i of a BF16, F16 or F32 array, as fp32. */
float ws_elem_f32(const void *w, enum dtype dt, size_t i);

/* moe.c: the MoE MLP of qwen_moe.c and deepseek.c */
int moe_load(struct weight_source *ws, int l, const struct moe_kind *kind, struct mlp_moe *moe,
             struct kiln_error *err);
void moe_forward(const struct fwd *f, const struct mlp_moe *moe, const float *x, float *out);
/* After every layer loaded: the count records, the dummy-routing warning. */
int moe_finish_load(struct model *m, struct kiln_error *err);
void moe_free(struct model *m);
/* Layer l's MLP (MoE or dense) after its norm nm, into out. */
void mlp_forward_norm(const struct fwd *f, const struct layer *L, const struct backend_norm *nm,
                      float *out);
/* A pre-norm layer of multi-head attention and the layer's MLP (dense or
 * mixture of experts: mlp_forward_norm), each output added to the
 * residual through the next norm (qwen-moe, gpt-oss). */
void mha_mlp_forward_layer(const struct fwd *f, int l, const struct layer *L);
/* Layer l's MLP weights: MoE where the family says so, else dense. */
int mlp_load(struct weight_source *ws, int l, const struct moe_kind *kind, struct layer *L,
             struct kiln_error *err);

#endif
