/* gpt_oss_experts.c — gpt-oss's MoE MLP at load: the biased router and
 * the fused experts, bf16 or MXFP4, made into one [out][in] matrix per
 * expert and product (struct moe_experts), their biases split into gate,
 * up and down rows. A rank of a split model takes its share (struct
 * share): expert parallel, its experts whole; tensor parallel, every
 * expert's intermediate columns [j0, j0 + F) of the whole Fw (gate and up
 * rows, down columns), as moe.c splits the other families' experts, with
 * the down bias on rank 0 alone (the ranks' partial sums are added).
 *
 * bf16 (`mlp.experts.gate_up_proj` [E, hidden, 2 inter], column 2j the
 * gate's row j and 2j + 1 the up's; `down_proj` [E, inter, hidden]) is
 * transposed, every element copied exactly. MXFP4 (quantization_config
 * mxfp4: `<name>_blocks` uint8 [E, out, in / 32, 16] and `<name>_scales`
 * uint8 [E, out, in / 32], gate_up's rows interleaved 2j / 2j + 1) stays
 * MXFP4 on a backend that runs it (backend_ops.mxfp4_experts), the rows
 * of gate, up and down copied apart as they are (native_mxfp4 says when
 * a share can), and is decoded to bf16 elsewhere: e2m1 × 2^(scale - 127)
 * has at most two significant bits, exact in bf16 wherever it is finite.
 * Dummy weights of an MXFP4 config are MXFP4 too where the backend runs
 * it (ws_dummy_mxfp4). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/model_internal.h"
#include "tensor/mxfp4.h"


/* A checkpoint tensor of dtype BF16, F16 or F32 and this shape. */
static int expect_float(struct weight_source *ws, const char *name, int ndim, const int64_t *shape,
                        const struct st_tensor **t, struct kiln_error *err) {
    if (st_expect(ws->st, name, ndim, shape, t, err)) return -1;
    enum dtype dt = (*t)->dtype;
    if (dt != DTYPE_BF16 && dt != DTYPE_F16 && dt != DTYPE_F32)
        return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                           ws->st->paths[(*t)->file], name, dtype_name(dt));
    return 0;
}

/* Uploads a host buffer the model owns; the device copy, NULL when out of
 * memory. */
static const void *upload(struct model *m, void *host, size_t bytes) {
    model_own(m, host);
    const void *dev = model_upload(m, host, bytes);
    m->weight_bytes += bytes;
    return dev;
}

/* E matrices [rows][cols] of dtype dt at dev as backend weights. */
static void expert_views(const void *dev, enum dtype dt, long E, long rows, long cols,
                         struct backend_weight *w) {
    size_t per = (size_t)rows * (size_t)cols * dtype_size(dt);
    for (long e = 0; e < E; e++)
        w[e] = (struct backend_weight){.data = (const char *)dev + (size_t)e * per, .dtype = dt,
                                       .rows = rows, .cols = cols};
}

/* A rank's share of the experts: the checkpoint's E experts of Fw
 * intermediate columns, of which the rank holds experts [e0, e0 + El) and
 * columns [j0, j0 + F); down_bias: whether it adds the down bias. */
struct share {
    long E, e0, El, Fw, j0, F;
    int down_bias;
};

/* The share's MXFP4 experts stay MXFP4: the backend runs them and the
 * share's columns of down fall on whole blocks of 32. */
static int native_mxfp4(const struct model *m, const struct share *sh, long d) {
    return m->cfg.quant.method == MODEL_QUANT_MXFP4 && m->be->ops->mxfp4_experts && d % 32 == 0 &&
           sh->F % 32 == 0 && sh->j0 % 32 == 0;
}

/* E MXFP4 matrices [rows][cols]: codes at dev, exponents at ex. */
static void expert_views_mx(const void *dev, const void *ex, long E, long rows, long cols, struct backend_weight *w) {
    size_t per = mxfp4_bytes(rows, cols), per_e = (size_t)rows * (size_t)cols / 32;
    for (long e = 0; e < E; e++)
        w[e] = (struct backend_weight){.data = (const char *)dev + (size_t)e * per, .dtype = DTYPE_MXFP4,
                                       .rows = rows, .cols = cols, .block_rows = 1, .block_cols = 32,
                                       .e8m0 = (const uint8_t *)ex + (size_t)e * per_e};
}

/* The bf16 (F16, F32) fused experts: gate[e][j][i] = gate_up[e][i][2j],
 * up[e][j][i] = gate_up[e][i][2j + 1], down[e][o][j] = down_proj[e][j][o],
 * for the share's experts e and columns j. */
static int load_fused(struct weight_source *ws, const char *prefix, const struct share *sh, long d,
                      unsigned char *bufs[3], enum dtype *dt, struct kiln_error *err) {
    char name[256];
    const struct st_tensor *gu, *dn;
    long E = sh->El, F = sh->F, Fw = sh->Fw;
    snprintf(name, sizeof name, "%s.gate_up_proj", prefix);
    if (expect_float(ws, name, 3, (const int64_t[]){sh->E, d, 2 * Fw}, &gu, err)) return -1;
    snprintf(name, sizeof name, "%s.down_proj", prefix);
    if (expect_float(ws, name, 3, (const int64_t[]){sh->E, Fw, d}, &dn, err)) return -1;
    if (dn->dtype != gu->dtype)
        return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s as '%s.gate_up_proj'",
                           ws->st->paths[dn->file], name, dtype_name(dn->dtype), dtype_name(gu->dtype),
                           prefix);
    *dt = gu->dtype;
    size_t es = dtype_size(*dt), n = (size_t)E * (size_t)F * (size_t)d;
    for (int i = 0; i < 3; i++) bufs[i] = xaligned_alloc((n * es + 63) & ~(size_t)63);
    const unsigned char *src = gu->data;
    for (long e = 0; e < E; e++)
        for (long i = 0; i < d; i++)
            for (long j = 0; j < F; j++) {
                size_t s = ((size_t)((sh->e0 + e) * d + i) * (size_t)(2 * Fw) + (size_t)(2 * (sh->j0 + j))) * es;
                size_t o = ((size_t)(e * F + j) * (size_t)d + (size_t)i) * es;
                memcpy(bufs[0] + o, src + s, es);
                memcpy(bufs[1] + o, src + s + es, es);
            }
    src = dn->data;
    for (long e = 0; e < E; e++)
        for (long j = 0; j < F; j++)
            for (long o = 0; o < d; o++)
                memcpy(bufs[2] + ((size_t)(e * d + o) * (size_t)F + (size_t)j) * es,
                       src + ((size_t)((sh->e0 + e) * Fw + sh->j0 + j) * (size_t)d + (size_t)o) * es, es);
    return 0;
}

/* The checkpoint's `<base>_blocks` [E, rows, cols / 32, 16] and
 * `<base>_scales` [E, rows, cols / 32], U8; their names in bname, sname. */
static int mxfp4_tensors(struct weight_source *ws, const char *base, long E, long rows, long cols,
                         const struct st_tensor **bt, const struct st_tensor **st, char bname[256], char sname[256],
                         struct kiln_error *err) {
    snprintf(bname, 256, "%s_blocks", base);
    snprintf(sname, 256, "%s_scales", base);
    if (cols % 32)
        return kiln_errorf(err, "%s: '%s' is MXFP4 in blocks of 32 values but its rows have %ld "
                                "values",
                           ws->st->source, bname, cols);
    long nb = cols / 32;
    if (st_expect(ws->st, bname, 4, (const int64_t[]){E, rows, nb, 16}, bt, err) ||
        st_expect(ws->st, sname, 3, (const int64_t[]){E, rows, nb}, st, err))
        return -1;
    if ((*bt)->dtype != DTYPE_U8 || (*st)->dtype != DTYPE_U8) {
        int b = (*bt)->dtype != DTYPE_U8;
        return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected U8 (MXFP4 %s)",
                           ws->st->paths[(b ? *bt : *st)->file], b ? bname : sname,
                           dtype_name((b ? *bt : *st)->dtype),
                           b ? "blocks: 16 bytes of two e2m1 values" : "scales: e8m0 exponents");
    }
    return 0;
}

/* The share's part of MXFP4 matrices [rows][cols]: gate_up (rows 2 Fw):
 * the share's rows 2 j0 .. 2 (j0 + F), whole, row 2j going to the even
 * (gate) output row j - j0 and 2j + 1 to the odd (up) one; down (rows d,
 * cols Fw): every row, its columns [c0, c0 + nc) = [j0, j0 + F). */
struct mx_part {
    long r0, r1, out_rows, c0, nc;
    int step;
};
static struct mx_part mx_part_of(const struct share *sh, long rows, long cols, int gate_up) {
    struct mx_part p = {.r0 = gate_up ? 2 * sh->j0 : 0, .r1 = gate_up ? 2 * (sh->j0 + sh->F) : rows,
                        .c0 = gate_up ? 0 : sh->j0, .nc = gate_up ? cols : sh->F, .step = gate_up ? 2 : 1};
    p.out_rows = (p.r1 - p.r0) / p.step;
    return p;
}

/* MXFP4 kept MXFP4 (native_mxfp4: the share's columns on whole blocks):
 * the share's part (mx_part_of), codes into even_c / odd_c ([El][out
 * rows][nc / 2]) and exponents into even_e / odd_e ([El][out rows][nc /
 * 32]); exponents past BACKEND_MXFP4_MAX_EXPONENT refused. */
static int load_mxfp4_native(struct weight_source *ws, const char *base, const struct share *sh, long rows,
                             long cols, uint8_t *even_c, uint8_t *even_e, uint8_t *odd_c, uint8_t *odd_e,
                             struct kiln_error *err) {
    char bname[256], sname[256];
    const struct st_tensor *bt, *st;
    if (mxfp4_tensors(ws, base, sh->E, rows, cols, &bt, &st, bname, sname, err)) return -1;
    const struct mx_part p = mx_part_of(sh, rows, cols, odd_c != NULL);
    long nb = cols / 32, b0 = p.c0 / 32, nbk = p.nc / 32;
    const uint8_t *codes = bt->data, *ex = st->data;
    for (long i = 0; i < sh->El; i++)
        for (long r = p.r0; r < p.r1; r++) {
            long e = sh->e0 + i;
            size_t at = (size_t)(e * rows + r) * (size_t)nb + (size_t)b0;
            for (long k = 0; k < nbk; k++) {
                int x = ex[at + (size_t)k];
                if (x == MXFP4_E8M0_NAN)
                    return kiln_errorf(err, "%s: tensor '%s' [%ld, %ld, %ld]: scale 255 is e8m0's NaN (no scale)",
                                       ws->st->paths[st->file], sname, e, r, b0 + k);
                if (x > BACKEND_MXFP4_MAX_EXPONENT)
                    return kiln_errorf(err, "%s: tensor '%s' [%ld, %ld, %ld]: scale %d (2^%d) is past what kiln's "
                                            "MXFP4 products take (2^%d)",
                                       ws->st->paths[st->file], sname, e, r, b0 + k, x, x - 127,
                                       BACKEND_MXFP4_MAX_EXPONENT - 127);
            }
            size_t o = (size_t)i * (size_t)p.out_rows + (size_t)((r - p.r0) / p.step);
            memcpy((r % p.step ? odd_c : even_c) + o * (size_t)nbk * 16, codes + at * 16, (size_t)nbk * 16);
            memcpy((r % p.step ? odd_e : even_e) + o * (size_t)nbk, ex + at, (size_t)nbk);
        }
    return 0;
}

/* MXFP4 decoded row by row as bf16 for the share's part (mx_part_of):
 * into even / odd ([El][out rows][nc]). */
static int load_mxfp4(struct weight_source *ws, const char *base, const struct share *sh, long rows, long cols,
                      uint16_t *even, uint16_t *odd, struct kiln_error *err) {
    char bname[256], sname[256];
    const struct st_tensor *bt, *st;
    if (mxfp4_tensors(ws, base, sh->E, rows, cols, &bt, &st, bname, sname, err)) return -1;
    const struct mx_part p = mx_part_of(sh, rows, cols, odd != NULL);
    long nb = cols / 32;
    float *row = xmalloc((size_t)cols * sizeof *row);
    for (long i = 0; i < sh->El; i++)
        for (long r = p.r0; r < p.r1; r++) {
            long e = sh->e0 + i;
            size_t at = (size_t)(e * rows + r) * (size_t)nb;
            long bad = mxfp4_decode((const uint8_t *)bt->data + at * 16, (const uint8_t *)st->data + at, nb, row);
            if (bad >= 0) {
                int s = ((const uint8_t *)st->data)[at + (size_t)bad];
                free(row);
                if (s == MXFP4_E8M0_NAN)
                    return kiln_errorf(err, "%s: tensor '%s' [%ld, %ld, %ld]: scale 255 is e8m0's NaN (no scale)",
                                       ws->st->paths[st->file], sname, e, r, bad);
                return kiln_errorf(err, "%s: tensor '%s' [%ld, %ld, %ld]: scale %d (2^%d) makes a "
                                        "value that bf16 cannot hold",
                                   ws->st->paths[st->file], sname, e, r, bad, s, s - 127);
            }
            uint16_t *dst = (r % p.step ? odd : even) +
                            ((size_t)i * (size_t)p.out_rows + (size_t)((r - p.r0) / p.step)) * (size_t)p.nc;
            for (long k = 0; k < p.nc; k++) dst[k] = f32_to_bf16(row[p.c0 + k]);
        }
    free(row);
    return 0;
}

/* The share's products from the checkpoint: MXFP4 when its blocks are
 * there, else the fused bf16 tensors. */
static int load_experts(struct weight_source *ws, const char *prefix, const struct share *sh, long d,
                        struct mlp_moe *moe, struct kiln_error *err) {
    long E = sh->El, F = sh->F;
    struct model *m = ws->m;
    char name[256], base[256];
    unsigned char *bufs[3] = {0};
    enum dtype dt = DTYPE_BF16;
    snprintf(name, sizeof name, "%s.gate_up_proj_blocks", prefix);
    int mx = st_find(ws->st, name) != NULL;
    if (mx && m->cfg.quant.method != MODEL_QUANT_MXFP4)
        return kiln_errorf(err, "%s: tensor '%s' is MXFP4 but config.json has no mxfp4 "
                                "quantization_config",
                           ws->st->source, name);
    int rc;
    if (mx && native_mxfp4(m, sh, d)) {
        size_t nc = mxfp4_bytes(E * F, d), ne = (size_t)(E * F) * (size_t)d / 32;
        uint8_t *b[6];
        for (int i = 0; i < 6; i++) b[i] = xaligned_alloc(((i < 3 ? nc : ne) + 63) & ~(size_t)63);
        snprintf(base, sizeof base, "%s.gate_up_proj", prefix);
        rc = load_mxfp4_native(ws, base, sh, 2 * sh->Fw, d, b[0], b[3], b[1], b[4], err);
        snprintf(base, sizeof base, "%s.down_proj", prefix);
        if (!rc) rc = load_mxfp4_native(ws, base, sh, d, sh->Fw, b[2], b[5], NULL, NULL, err);
        if (rc) {
            for (int i = 0; i < 6; i++) free(b[i]);
            return -1;
        }
        const void *dev[6]; /* upload: the model owns the host buffers from here */
        for (int i = 0; i < 6; i++)
            if (!(dev[i] = upload(m, b[i], i < 3 ? nc : ne))) {
                for (int j = i + 1; j < 6; j++) free(b[j]); /* not the model's yet */
                return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the experts of '%s'",
                                   prefix);
            }
        expert_views_mx(dev[0], dev[3], E, F, d, moe->gate);
        expert_views_mx(dev[1], dev[4], E, F, d, moe->up);
        expert_views_mx(dev[2], dev[5], E, d, F, moe->down);
        return 0;
    }
    if (mx) {
        size_t n = (size_t)E * (size_t)F * (size_t)d * 2;
        for (int i = 0; i < 3; i++) bufs[i] = xaligned_alloc((n + 63) & ~(size_t)63);
        snprintf(base, sizeof base, "%s.gate_up_proj", prefix);
        rc = load_mxfp4(ws, base, sh, 2 * sh->Fw, d, (uint16_t *)bufs[0], (uint16_t *)bufs[1], err);
        snprintf(base, sizeof base, "%s.down_proj", prefix);
        if (!rc) rc = load_mxfp4(ws, base, sh, d, sh->Fw, (uint16_t *)bufs[2], NULL, err);
    } else {
        snprintf(name, sizeof name, "%s.gate_up_proj", prefix);
        if (!st_find(ws->st, name))
            return kiln_errorf(err, "%s: tensor '%s' is missing (nor is there its MXFP4 '%s_blocks')",
                               ws->st->source, name, name);
        rc = load_fused(ws, prefix, sh, d, bufs, &dt, err);
    }
    if (rc) {
        for (int i = 0; i < 3; i++) free(bufs[i]);
        return -1;
    }
    size_t bytes = (size_t)E * (size_t)F * (size_t)d * dtype_size(dt);
    const void *dev[3];
    for (int i = 0; i < 3; i++)
        if (!(dev[i] = upload(m, bufs[i], bytes))) {
            for (int j = i + 1; j < 3; j++) free(bufs[j]); /* not the model's yet */
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the experts of '%s'",
                               prefix);
        }
    expert_views(dev[0], dt, E, F, d, moe->gate);
    expert_views(dev[1], dt, E, F, d, moe->up);
    expert_views(dev[2], dt, E, d, F, moe->down);
    return 0;
}

/* gate_up_proj_bias [E, 2 Fw] (interleaved) and down_proj_bias [E, d] as
 * fp32 rows of the share: gate [El][F], up [El][F], down [El][d] (NULL
 * where the share adds no down bias). */
static int load_biases(struct weight_source *ws, const char *prefix, const struct share *sh, long d,
                       const float *out[3], struct kiln_error *err) {
    struct model *m = ws->m;
    char name[256];
    const struct st_tensor *gu, *dn;
    long E = sh->El, F = sh->F;
    snprintf(name, sizeof name, "%s.gate_up_proj_bias", prefix);
    if (expect_float(ws, name, 2, (const int64_t[]){sh->E, 2 * sh->Fw}, &gu, err)) return -1;
    snprintf(name, sizeof name, "%s.down_proj_bias", prefix);
    if (expect_float(ws, name, 2, (const int64_t[]){sh->E, d}, &dn, err)) return -1;
    float *g = xaligned_alloc((size_t)(E * F) * 4), *u = xaligned_alloc((size_t)(E * F) * 4);
    for (long e = 0; e < E; e++)
        for (long j = 0; j < F; j++) {
            size_t at = (size_t)((sh->e0 + e) * 2 * sh->Fw + 2 * (sh->j0 + j));
            g[e * F + j] = ws_elem_f32(gu->data, gu->dtype, at);
            u[e * F + j] = ws_elem_f32(gu->data, gu->dtype, at + 1);
        }
    out[0] = upload(m, g, (size_t)(E * F) * 4);
    out[1] = upload(m, u, (size_t)(E * F) * 4);
    out[2] = NULL;
    if (sh->down_bias) {
        float *dv = xaligned_alloc((size_t)(E * d) * 4);
        for (long i = 0; i < E * d; i++) dv[i] = ws_elem_f32(dn->data, dn->dtype, (size_t)(sh->e0 * d + i));
        if (!(out[2] = upload(m, dv, (size_t)(E * d) * 4))) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the biases of '%s'", prefix);
    }
    if (!out[0] || !out[1])
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the biases of '%s'", prefix);
    return 0;
}

/* A dummy matrix as ws_matrix makes it (the type ws_dummy_mxfp4 has). */
static int ws_dummy_matrix(struct weight_source *ws, const char *name, long rows, long cols, struct backend_weight *out,
                           struct kiln_error *err) {
    return ws_matrix(ws, name, rows, cols, NULL, out, err);
}

/* Dummy weights: one random matrix per expert and product (MXFP4 where
 * the checkpoint format is and the backend runs it), random biases. */
static int load_dummy(struct weight_source *ws, const char *prefix, const struct share *sh, long d,
                      struct mlp_moe *moe, const float *bias[3], struct kiln_error *err) {
    char name[256];
    long E = sh->El, F = sh->F;
    int (*make)(struct weight_source *, const char *, long, long, struct backend_weight *, struct kiln_error *) =
        native_mxfp4(ws->m, sh, d) ? ws_dummy_mxfp4 : ws_dummy_matrix;
    for (long e = 0; e < E; e++) {
        snprintf(name, sizeof name, "%s.%ld.gate", prefix, e);
        if (make(ws, name, F, d, &moe->gate[e], err)) return -1;
        snprintf(name, sizeof name, "%s.%ld.up", prefix, e);
        if (make(ws, name, F, d, &moe->up[e], err)) return -1;
        snprintf(name, sizeof name, "%s.%ld.down", prefix, e);
        if (make(ws, name, d, F, &moe->down[e], err)) return -1;
    }
    snprintf(name, sizeof name, "%s.gate_up_proj_bias", prefix);
    if (ws_vector(ws, name, E * F, NAN, &bias[0], err) || ws_vector(ws, name, E * F, NAN, &bias[1], err))
        return -1;
    snprintf(name, sizeof name, "%s.down_proj_bias", prefix);
    bias[2] = NULL;
    return sh->down_bias ? ws_vector(ws, name, E * d, NAN, &bias[2], err) : 0;
}

int gpt_oss_moe_load(struct weight_source *ws, int l, struct mlp_moe *moe, struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_config *c = &m->cfg;
    long d = c->hidden_size, E = c->n_experts, F = c->moe_intermediate_size;
    char name[256], prefix[128];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", l);
    snprintf(name, sizeof name, "%s.router.weight", prefix);
    if (ws_matrix(ws, name, E, d, NULL, &moe->router, err)) return -1;
    snprintf(name, sizeof name, "%s.router.bias", prefix);
    if (ws_vector(ws, name, E, NAN, &moe->router_bias, err)) return -1;
    /* the rank's share (moe.c's split; the router is whole on every rank) */
    int ep = c->shard.ep_size > 1;
    struct share sh = {.E = E, .e0 = ep ? c->shard.expert0 : 0, .El = ep ? c->shard.n_experts : E,
                       .Fw = ep ? F : F * model_tp(c), .j0 = ep ? 0 : (long)c->shard.tp_rank * F, .F = F,
                       .down_bias = ep || c->shard.tp_rank == 0};
    moe->gate = model_own(m, xcalloc((size_t)sh.El, sizeof *moe->gate));
    moe->up = model_own(m, xcalloc((size_t)sh.El, sizeof *moe->up));
    moe->down = model_own(m, xcalloc((size_t)sh.El, sizeof *moe->down));
    const float *bias[3];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.experts", l);
    if (ws->st ? load_experts(ws, prefix, &sh, d, moe, err) || load_biases(ws, prefix, &sh, d, bias, err)
               : load_dummy(ws, prefix, &sh, d, moe, bias, err))
        return -1;
    moe->experts = (struct moe_experts){
        .n_experts = (int)sh.El, .hidden = (int)d, .inter = (int)F, .gate = moe->gate, .up = moe->up,
        .down = moe->down, .first = (int)sh.e0, .gate_bias = bias[0], .up_bias = bias[1], .down_bias = bias[2],
        .act = MOE_ACT_SWIGLU_CLAMP, .alpha = 1.702f, .limit = (float)c->swiglu_limit};
    /* the softmax of the top-k logits: a softmax over every expert
     * renormalised over the chosen ones */
    moe->route = (struct moe_route_params){
        .n_experts = (int)E, .top_k = c->n_experts_per_tok, .scoring = MOE_ROUTE_SOFTMAX,
        .method = MOE_ROUTE_GREEDY, .n_group = 1, .topk_group = 1, .renormalize = 1,
        .scaling = 1.0f, .uniform = m->route_uniform, .layer = l};
    return 0;
}
