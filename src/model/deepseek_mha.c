/* deepseek_mha.c — multi-head latent attention in the MHA form, for the
 * sequences of a step that bring many new tokens (prefill, chunked
 * prefill, an extend after a radix-cache hit); deepseek.c runs the
 * absorbed form for the others (decode rows).
 *
 * The two forms. The cache keeps one latent row per token, [c_kv (kvr,
 * RMS-normed) | k_rope (rope, roped)]. The absorbed form maps each head's
 * q_nope into latent space (W_UK) and attends over the latent rows (dk =
 * kvr + rope, dv = kvr, one KV head), then maps the result back (W_UV):
 * cheap per context position, costly per query row. The MHA form
 * decompresses the sequence's whole context once, kv = c_kv · W_kv_bᵀ
 * ([ctx][H·(nope + vd)]), builds per-head keys K_h = [k_nope_h | k_rope]
 * (k_rope shared by every head) and values V_h = v_h in a workspace, and
 * runs ordinary attention over it (dk = nope + rope, dv = vd, H KV heads)
 * with the queries [q_nope_h | q_rope_h] as the q projection left them.
 * Both compute the reference's expanded attention; the softmax scale is
 * the same (deepseek_attn_scale).
 *
 * Which form a sequence takes (mla_use_mha) depends only on its own shape
 * (n new tokens, context L = its last position + 1) and on constants of
 * the model, never on the rest of the batch, so a row's result does not
 * depend on the batch it is in (docs/design.md). The rule compares the
 * FLOPs of what differs between the forms, per layer, with P = n·L −
 * n(n − 1)/2 causal query–key pairs:
 *     absorbed = 2·n·H·kvr·(nope + vd)   (W_UK in, W_UV out)
 *              + 2·P·H·(2·kvr + rope)     (scores over kvr + rope, values over kvr)
 *     mha      = 2·L·kvr·H·(nope + vd)   (kv_b_proj over the whole context)
 *              + 2·P·H·(nope + rope + vd)
 * and takes MHA when n ≥ 2, L fits the workspace and mha < absorbed. A
 * fresh prompt (n = L) always takes MHA; an extend of n tokens after a
 * long prefix takes it above about 170 new tokens with DeepSeek-V2/V3's
 * shapes; decode rows (n = 1) stay absorbed, so decode steps record graphs
 * as before. KILN_MLA_FORM=absorbed|mha forces one form on every sequence
 * (tests run both; mha turns decode graphs off, its sizes come from the
 * host).
 *
 * Mixed batches. The plan of a step (made at layer 0 from the host copy
 * of the batch, the same for every layer) cuts the sequences into runs of
 * one form, in batch order (the scheduler puts decode rows first, so a
 * mixed step is usually one absorbed run and the prefill sequences). An
 * absorbed run is handed to deepseek.c's absorbed path as a sub-batch: its
 * rows, its positions and KV page starts (device pointers into the staged
 * batch; page starts index the whole page list) and its q_start rebased to
 * 0. An MHA sequence is attended alone over the workspace, seen as a cache
 * of one page of `tokens` slots (page list {0}), slot = position. The
 * rebased q_starts go to the device in one small upload per step; a step
 * whose sequences are all absorbed (every decode step) uses the staged
 * batch as it is and uploads nothing.
 *
 * Workspace (mla_ws_reserve): K [tokens][H][nope + rope] and V
 * [tokens][H][vd] in the KV element type, for `tokens` = the model's
 * context, capped so K and V take at most MLA_WS_BYTES (longer contexts
 * stay absorbed); the decompression runs in chunks of `chunk` positions
 * (latent rows gathered from the pages to fp32, the kv_b_proj product,
 * then mla_kv_expand into K and V), so its fp32 buffers take about
 * MLA_CHUNK_BYTES. DeepSeek-V2-Lite (H 16, bf16 cache): 10 KiB per context
 * token (80 MiB at 8k, 320 MiB at 32k) plus 64 MiB of chunk buffers. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model_internal.h"

enum {
    MLA_WS_BYTES = 1 << 30,    /* K and V of the workspace */
    MLA_CHUNK_BYTES = 64 << 20, /* the decompression's fp32 buffers */
    MLA_CHUNK_ALIGN = 256,
};

/* A run of sequences [s0, s1) (token rows [r0, r1)) in one form. */
struct mla_part {
    int mha;
    int s0, s1;
    long r0, r1;
    long ctx;      /* MHA: the context, positions 0 .. ctx - 1 */
    long meta_off; /* the sub-batch's q_start: meta + meta_off */
};

struct mla_ws {
    long tokens;          /* context positions the workspace holds */
    long chunk;           /* positions decompressed per product */
    void *k, *v;          /* [tokens][H·(nope + rope)], [tokens][H·vd] (KV element type) */
    float *lat;           /* [chunk][kvr + rope] latent rows, fp32 */
    float *kv;            /* [chunk][H·(nope + vd)] decompressed */
    int32_t *meta;        /* device [meta_cap]: {0, 1} (the workspace's page list and page
                             starts), then the step's sub-batch q_starts */
    int32_t *meta_host;   /* [meta_cap] */
    long meta_cap;
    struct mla_part *parts; /* [max_seqs + 1] */
    int n_parts;
    int whole_absorbed;   /* the step's plan: every sequence absorbed */
};

int mla_use_mha(const struct model_config *c, long n, long ctx, long ws_tokens, int forced) {
    if (forced == 1 || ctx > ws_tokens || n < 1) return 0;
    if (forced == 2) return 1;
    if (n < 2) return 0;
    double H = c->n_heads, kvr = c->kv_lora_rank, nope = c->qk_nope_head_dim,
           rope = c->qk_rope_head_dim, vd = c->v_head_dim, L = (double)ctx, nn = (double)n;
    double pairs = nn * L - nn * (nn - 1) / 2;
    double absorbed = 2 * nn * H * kvr * (nope + vd) + 2 * pairs * H * (2 * kvr + rope);
    double mha = 2 * L * kvr * H * (nope + vd) + 2 * pairs * H * (nope + rope + vd);
    return mha < absorbed;
}

/* The workspace's bytes for a context of max_context tokens and a KV
 * element of es bytes (the memory plan counts it with es = 2). */
size_t mla_ws_bytes(const struct model_config *c, long max_context, size_t es) {
    long H = c->n_heads, per_token = H * (c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim) * (long)es;
    long tokens = MLA_WS_BYTES / per_token;
    if (tokens > max_context) tokens = max_context;
    return (size_t)(tokens * per_token) + MLA_CHUNK_BYTES;
}

/* Bytes of an expanded K/V element: the KV type's, fp32 on an FP8 cache
 * (backend.h mla_kv_expand: the expansion is no cache, nothing is gained
 * rounding it to e4m3 again). */
static size_t mla_expand_size(const struct backend *be) {
    enum dtype dt = backend_kv_dtype(be);
    return dt == DTYPE_F8_E4M3 ? 4 : dtype_size(dt);
}

int mla_ws_reserve(struct model *m, struct kiln_error *err) {
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    if (!ops->kv_gather || !ops->mla_kv_expand) return 0; /* absorbed only */
    long H = c->n_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim,
         vd = c->v_head_dim, kvr = c->kv_lora_rank;
    size_t es = mla_expand_size(m->be);
    long per_token = H * (nope + rope + vd) * (long)es;
    long tokens = MLA_WS_BYTES / per_token;
    if (tokens > m->max_context) tokens = m->max_context;
    long chunk_row = (kvr + rope + H * (nope + vd)) * 4;
    long chunk = MLA_CHUNK_BYTES / chunk_row / MLA_CHUNK_ALIGN * MLA_CHUNK_ALIGN;
    if (chunk < MLA_CHUNK_ALIGN) chunk = MLA_CHUNK_ALIGN;
    if (knob_int(KNOB_MLA_CHUNK) > 0) chunk = knob_int(KNOB_MLA_CHUNK);
    if (chunk > tokens) chunk = tokens;
    struct mla_ws *w = xcalloc(1, sizeof *w);
    m->act.mla = w;
    w->tokens = tokens;
    w->chunk = chunk;
    w->meta_cap = 2 + 2 * ((long)m->max_seqs + 2);
    w->meta_host = xcalloc((size_t)w->meta_cap, sizeof *w->meta_host);
    w->parts = xcalloc((size_t)m->max_seqs + 2, sizeof *w->parts);
    void *ctx = m->be->ctx;
    if (!(w->k = ops->alloc(ctx, (size_t)(tokens * H * (nope + rope)) * es)) ||
        !(w->v = ops->alloc(ctx, (size_t)(tokens * H * vd) * es)) ||
        !(w->lat = ops->alloc(ctx, (size_t)(chunk * (kvr + rope)) * 4)) ||
        !(w->kv = ops->alloc(ctx, (size_t)(chunk * H * (nope + vd)) * 4)) ||
        !(w->meta = ops->alloc(ctx, (size_t)w->meta_cap * 4)))
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY,
                           "out of device memory for the MLA MHA-form workspace (%ld context "
                           "tokens, %.1f MiB)",
                           tokens, (double)(tokens * per_token + chunk * chunk_row) / 1048576.0);
    w->meta_host[0] = 0;
    w->meta_host[1] = 1;
    ops->upload(ctx, w->meta, w->meta_host, 2 * 4);
    ops->synchronize(ctx); /* meta_host is rewritten by the first step */
    log_info("MLA MHA form: workspace for %ld context tokens, %.1f MiB (K/V %.1f MiB, %ld-position "
             "chunks %.1f MiB)",
             tokens, (double)(tokens * per_token + chunk * chunk_row) / 1048576.0,
             (double)(tokens * per_token) / 1048576.0, chunk, (double)(chunk * chunk_row) / 1048576.0);
    return 0;
}

void mla_ws_free(struct model *m) {
    struct mla_ws *w = m->act.mla;
    if (!w) return;
    void *bufs[] = {w->k, w->v, w->lat, w->kv, w->meta};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) m->be->ops->free(m->be->ctx, bufs[i]);
    free(w->meta_host);
    free(w->parts);
    free(w);
    m->act.mla = NULL;
}

int mla_graphable(const struct model *m) {
    const struct mla_ws *w = m->act.mla;
    return !w || knob_enum(KNOB_MLA_FORM) != 2;
}

static void add_part(struct mla_ws *w, int mha, int s, long r0, long r1, long ctx) {
    struct mla_part *p = w->n_parts ? &w->parts[w->n_parts - 1] : NULL;
    if (p && !mha && !p->mha) { /* absorbed sequences join the run before them */
        p->s1 = s + 1;
        p->r1 = r1;
        return;
    }
    w->parts[w->n_parts++] = (struct mla_part){.mha = mha, .s0 = s, .s1 = s + 1, .r0 = r0,
                                               .r1 = r1, .ctx = ctx};
}

/* The step's plan and the sub-batches' q_starts on the device. Sequences
 * past the host batch are the runner's one-token padding (decode graphs):
 * absorbed. */
static void plan_step(struct model *m, const struct fwd *f) {
    struct mla_ws *w = m->act.mla;
    const struct batch *b = f->host;
    int S = f->bb->n_seqs;
    int forced = knob_enum(KNOB_MLA_FORM); /* per step: tests switch forms between steps */
    w->n_parts = 0;
    w->whole_absorbed = 1;
    if (!b) return;
    for (int s = 0; s < S; s++) {
        if (b && s < b->n_seqs) {
            long r0 = b->q_start[s], r1 = b->q_start[s + 1];
            long ctx = r1 > r0 ? (long)b->positions[r1 - 1] + 1 : 0;
            add_part(w, r1 > r0 && mla_use_mha(&m->cfg, r1 - r0, ctx, w->tokens, forced), s, r0,
                     r1, ctx);
        } else {
            long r0 = b->n_tokens + (s - b->n_seqs);
            add_part(w, 0, s, r0, r0 + 1, 0);
        }
    }
    w->whole_absorbed = w->n_parts <= 1 && !(w->n_parts == 1 && w->parts[0].mha);
    if (w->whole_absorbed) return;
    long off = 2;
    int32_t *h = w->meta_host;
    for (int i = 0; i < w->n_parts; i++) {
        struct mla_part *p = &w->parts[i];
        p->meta_off = off;
        if (p->mha) {
            h[off++] = 0;
            h[off++] = (int32_t)(p->r1 - p->r0);
            continue;
        }
        for (int s = p->s0; s <= p->s1; s++)
            h[off++] = (int32_t)((s <= b->n_seqs ? b->q_start[s] : b->n_tokens + (s - b->n_seqs)) - p->r0);
    }
    KILN_ASSERT(off <= w->meta_cap);
    m->be->ops->upload(m->be->ctx, w->meta + 2, h + 2, (size_t)(off - 2) * 4);
}

/* Sequence p of layer l in the MHA form: its context decompressed into
 * the workspace, then attention of its rows over it into o. */
static void mha_sequence(const struct fwd *f, int l, const struct attn_mla *a,
                         const struct mla_part *p, const float *q, float *o) {
    struct model *m = f->m;
    const struct model_config *c = &m->cfg;
    const struct backend_ops *ops = m->be->ops;
    void *ctx = m->be->ctx;
    struct mla_ws *w = m->act.mla;
    long H = c->n_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim,
         vd = c->v_head_dim, kvr = c->kv_lora_rank, qh = nope + rope, lw = kvr + rope;
    size_t es = mla_expand_size(m->be);
    float ks = m->layers[l].k_scale;
    const struct batch *b = f->host;
    const int32_t *pages = f->bb->kv_pages + b->kv_page_start[p->s0];
    for (long c0 = 0; c0 < p->ctx; c0 += w->chunk) {
        long cn = p->ctx - c0 < w->chunk ? p->ctx - c0 : w->chunk;
        ops->kv_gather(ctx, w->lat, lw, f->kv->k[l], lw, lw, pages, b->page_size, c0, cn, ks);
        ops->matmul(ctx, w->kv, H * (nope + vd), w->lat, lw, &a->wkv_b, NULL, cn);
        ops->mla_kv_expand(ctx, (char *)w->k + (size_t)(c0 * H * qh) * es,
                           (char *)w->v + (size_t)(c0 * H * vd) * es, w->kv, H * (nope + vd),
                           w->lat + kvr, lw, cn, (int)H, (int)nope, (int)rope, (int)vd);
    }
    struct backend_batch sb = {.n_tokens = (int)(p->r1 - p->r0), .n_seqs = 1,
                               .page_size = (int)w->tokens, .positions = f->bb->positions + p->r0,
                               .q_start = w->meta + p->meta_off, .kv_page_start = w->meta,
                               .kv_pages = w->meta};
    struct attn_params ap = {.n_heads = (int)H, .n_kv_heads = (int)H, .dk = (int)qh, .dv = (int)vd,
                             .k_stride = H * qh, .v_stride = H * vd, .scale = m->attn_scale,
                             .k_scale = 1.0f, .v_scale = 1.0f,
                             .f32_cache = backend_kv_dtype(m->be) == DTYPE_F8_E4M3};
    ops->attention(ctx, o + p->r0 * H * vd, H * vd, q + p->r0 * H * qh, H * qh, w->k, w->v, &ap,
                   &sb);
}

void mla_attend(const struct fwd *f, int l, const struct attn_mla *a, const float *q, float *o,
                mla_absorbed_fn absorbed) {
    struct model *m = f->m;
    struct mla_ws *w = m->act.mla;
    if (!w) {
        absorbed(f, l, a, q, o);
        return;
    }
    int l0, l1; /* once a step: at the first layer of the rank's pipeline stage */
    model_stage_layers(&m->cfg, &l0, &l1);
    if (l == l0) plan_step(m, f);
    if (w->whole_absorbed) {
        absorbed(f, l, a, q, o);
        return;
    }
    const struct model_config *c = &m->cfg;
    long H = c->n_heads, qh = c->qk_nope_head_dim + c->qk_rope_head_dim, vd = c->v_head_dim;
    for (int i = 0; i < w->n_parts; i++) {
        const struct mla_part *p = &w->parts[i];
        if (p->mha) {
            mha_sequence(f, l, a, p, q, o);
            continue;
        }
        struct backend_batch sb = {.n_tokens = (int)(p->r1 - p->r0), .n_seqs = p->s1 - p->s0,
                                   .page_size = f->bb->page_size,
                                   .positions = f->bb->positions + p->r0,
                                   .q_start = w->meta + p->meta_off,
                                   .kv_page_start = f->bb->kv_page_start + p->s0,
                                   .kv_pages = f->bb->kv_pages};
        struct fwd sf = *f;
        sf.bb = &sb;
        sf.n = p->r1 - p->r0;
        sf.pos = f->pos + p->r0;
        sf.slot = f->slot + p->r0;
        sf.host = NULL; /* the host batch describes the whole step, not this run */
        absorbed(&sf, l, a, q + p->r0 * H * qh, o + p->r0 * H * vd);
    }
}
