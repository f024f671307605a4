/* weights.c — getting weights onto the backend, from a checkpoint or, for
 * speed work, random ("dummy") values. Matrices keep their checkpoint
 * dtype (FP8 ones with their block scales, widened to fp32), or become FP8
 * at load under --quantization fp8; 1-D tensors (norms, biases) are
 * widened to fp32 once, they are tiny and read often. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/model_internal.h"
#include "tensor/dummy_fill.h"
#include "tensor/mxfp4.h"

void *model_own(struct model *m, void *host) {
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = xrealloc(m->owned, (size_t)m->cap_owned * sizeof *m->owned);
    }
    m->owned[m->n_owned++] = host;
    return host;
}

static void track_upload(struct model *m, const void *dev) {
    if (m->n_uploaded == m->cap_uploaded) {
        m->cap_uploaded = m->cap_uploaded ? 2 * m->cap_uploaded : 64;
        m->uploaded = xrealloc(m->uploaded, (size_t)m->cap_uploaded * sizeof *m->uploaded);
    }
    m->uploaded[m->n_uploaded++] = dev;
}

const void *model_upload(struct model *m, const void *host, size_t bytes) {
    const void *dev = m->be->ops->weight_upload(m->be->ctx, host, bytes);
    if (dev) track_upload(m, dev);
    return dev;
}

/* Uploads host bytes that stay valid for the model's life (the checkpoint's
 * mapping, buffers the model owns): queued to the backend's loader when
 * the load is deferred, else copied now. NULL when out of device memory. */
static const void *upload_stable(struct model *m, const void *const *hosts, const size_t *sizes,
                                 int count) {
    const struct backend_ops *ops = m->be->ops;
    const void *dev;
    if (m->defer_uploads) {
        dev = ops->weight_upload_later(m->be->ctx, hosts, sizes, count);
        if (dev) m->weights_pending = 1;
    } else if (count == 1) {
        dev = ops->weight_upload(m->be->ctx, hosts[0], sizes[0]);
    } else {
        dev = ops->weight_upload_cat(m->be->ctx, hosts, sizes, count);
    }
    if (dev) track_upload(m, dev);
    return dev;
}

int model_weights_pending(const struct model *m) { return m && m->weights_pending; }

void model_weights_ready(struct model *m) {
    if (!m || !m->weights_pending) return;
    m->be->ops->weights_finish(m->be->ctx);
    m->weights_pending = 0;
}

static enum dtype dummy_dtype(const struct model *m) {
    return m->cfg.dtype == DTYPE_F32 || m->cfg.dtype == DTYPE_F16 ? m->cfg.dtype : DTYPE_BF16;
}

/* A matrix's dummy part: the next tensor index, values in ±1/√cols. */
static struct dummy_part dummy_next(struct weight_source *ws, size_t n, long cols, enum dtype dt) {
    return (struct dummy_part){.seed = ws->seed, .tensor = ws->n_tensors++, .n = n,
                               .scale = 1.0f / sqrtf((float)cols), .dtype = dt};
}

/* The host fill of tensor/dummy_fill.h: the tensor's block, tiled. */
static void fill_dummy(const struct dummy_part *p, unsigned char *buf) {
    size_t es = dtype_size(p->dtype);
    unsigned char block[DUMMY_BLOCK * 4];
    for (size_t j = 0; j < DUMMY_BLOCK; j++) {
        float v = dummy_unit(p->seed, p->tensor, j) * p->scale;
        if (p->dtype == DTYPE_BF16) ((uint16_t *)block)[j] = dummy_bf16(v);
        else if (p->dtype == DTYPE_F16) ((uint16_t *)block)[j] = f32_to_f16(v);
        else ((float *)block)[j] = v;
    }
    size_t off = (size_t)dummy_offset(p->seed, p->tensor);
    for (size_t done = 0; done < p->n;) {
        size_t take = DUMMY_BLOCK - off < p->n - done ? DUMMY_BLOCK - off : p->n - done;
        memcpy(buf + done * es, block + off * es, take * es);
        done += take;
        off = 0;
    }
}

/* Dummy parts made on the device (backend_ops.weight_dummy); NULL where
 * the backend cannot, and the caller fills on the host. */
static const void *dummy_on_device(struct model *m, const struct dummy_part *parts, int count) {
    const struct backend_ops *ops = m->be->ops;
    if (!ops->weight_dummy || ops->weights_in_place) return NULL;
    const void *dev = ops->weight_dummy(m->be->ctx, parts, count);
    if (dev) track_upload(m, dev);
    return dev;
}

const void *ws_last_host(struct weight_source *ws) {
    if (ws->last_host || ws->st) return ws->last_host;
    enum dtype dt = dummy_dtype(ws->m);
    struct dummy_part p = {.seed = ws->seed, .tensor = ws->last_tensor, .n = ws->last_n,
                           .scale = 1.0f / sqrtf((float)ws->last_cols), .dtype = dt};
    unsigned char *buf = aligned_alloc(64, (p.n * dtype_size(dt) + 63) & ~(size_t)63);
    if (!buf) return NULL;
    model_own(ws->m, buf);
    fill_dummy(&p, buf);
    return ws->last_host = buf;
}

/* ---- FP8 --------------------------------------------------------------- */

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

float ws_elem_f32(const void *w, enum dtype dt, size_t i) {
    uint16_t h;
    float f;
    switch (dt) {
    case DTYPE_BF16: memcpy(&h, (const char *)w + 2 * i, 2); return bf16_to_f32(h);
    case DTYPE_F16: memcpy(&h, (const char *)w + 2 * i, 2); return f16_to_f32(h);
    default: memcpy(&f, (const char *)w + 4 * i, 4); return f;
    }
}

void fp8_quantize_blocks(const void *w, enum dtype dt, long rows, long cols, int br, int bc,
                         uint8_t *q, float *scale) {
    long nbc = ceil_div(cols, bc);
    float *x = xmalloc((size_t)br * (size_t)cols * sizeof *x); /* one row of blocks, widened */
    for (long r0 = 0; r0 < rows; r0 += br) {
        long nr = r0 + br < rows ? br : rows - r0;
        float *s = scale + (r0 / br) * nbc;
        for (long i = 0; i < nr * cols; i++) x[i] = ws_elem_f32(w, dt, (size_t)(r0 * cols + i));
        for (long j = 0, c0 = 0; j < nbc; j++, c0 += bc) {
            long c1 = c0 + bc < cols ? c0 + bc : cols;
            float amax = 0;
            for (long r = 0; r < nr; r++)
                for (long c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[r * cols + c]));
            s[j] = fmaxf(amax, 1e-12f) / 448.0f;
            for (long r = 0; r < nr; r++)
                for (long c = c0; c < c1; c++)
                    q[(r0 + r) * cols + c] = f32_to_fp8_e4m3(x[r * cols + c] / s[j]);
        }
    }
    free(x);
}

static int fp8_backend_refused(const struct model *m, const char *file, const char *name,
                               struct kiln_error *err) {
    return kiln_errorf(err, "%s: tensor '%s' is FP8 (quantization_config fp8): the %s backend does "
                            "not run FP8 weights yet; use --device cpu",
                       file, name, m->be->ops->name);
}

/* A 2-D F8_E4M3 tensor of the checkpoint: only under an fp8
 * quantization_config, on a backend that runs FP8. */
static int fp8_allowed(const struct model *m, const char *file, const char *name,
                       struct kiln_error *err) {
    if (m->cfg.quant.method != MODEL_QUANT_FP8)
        return kiln_errorf(err, "%s: tensor '%s' is F8_E4M3 but config.json has no fp8 "
                                "quantization_config (its block scales and their layout)",
                           file, name);
    if (!m->be->ops->fp8_weights) return fp8_backend_refused(m, file, name, err);
    return 0;
}

static void shape_str(const struct st_tensor *t, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < t->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

/* Uploads host fp32 scales that live as long as the model and fills out's
 * scale fields. */
static int upload_scales(struct weight_source *ws, const float *host, size_t n, const char *name,
                         struct backend_weight *out, struct kiln_error *err) {
    struct model *m = ws->m;
    const void *h = host;
    size_t bytes = n * 4;
    out->scale = upload_stable(m, &h, &bytes, 1);
    if (!out->scale)
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for the scales of '%s'", name);
    out->block_rows = m->cfg.quant.block_rows;
    out->block_cols = m->cfg.quant.block_cols;
    ws->last_scale = host;
    m->weight_bytes += bytes;
    return 0;
}

/* A slice of FP8 tensor `name` must cover whole blocks: its start on a
 * block boundary, its end too unless it is the tensor's end. */
static int fp8_slice_check(const struct model *m, const char *file, const char *name, long rows,
                           long cols, const struct ws_slice *sl, struct kiln_error *err) {
    if (!sl) return 0;
    const struct model_quant *q = &m->cfg.quant;
    long b = sl->dim ? q->block_cols : q->block_rows, whole = sl->dim ? cols : rows;
    if (sl->start % b == 0 && (sl->len % b == 0 || sl->start + sl->len == whole)) return 0;
    return kiln_errorc(err, KILN_ERR_UNSUPPORTED,
                       "%s: tensor '%s' is FP8 in %dx%d blocks: the tensor parallel split gives rank "
                       "%d its %s %ld..%ld of %ld, which do not fall on block boundaries; choose a "
                       "tensor parallel size that splits them into whole blocks of %ld",
                       file, name, q->block_rows, q->block_cols, m->cfg.shard.tp_rank,
                       sl->dim ? "columns" : "rows", sl->start, sl->start + sl->len, whole, b);
}

/* The block scales of FP8 tensor `name` [rows][cols]: `<name>_scale_inv`,
 * [ceil(rows / B0)][ceil(cols / B1)], F32 (BF16 and F16 widened), finite;
 * those of slice sl (whole blocks: fp8_slice_check) when given. */
static int scales_host(struct weight_source *ws, const char *name, const char *file, long rows,
                       long cols, const struct ws_slice *sl, const float **host_out, size_t *n_out,
                       struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_quant *q = &m->cfg.quant;
    char sname[512], have[96];
    if ((size_t)snprintf(sname, sizeof sname, "%s_scale_inv", name) >= sizeof sname)
        return kiln_errorf(err, "%s: tensor name '%.64s...' is too long", file, name);
    const struct st_tensor *s = st_find(ws->st, sname);
    if (!s)
        return kiln_errorf(err, "%s: tensor '%s' is FP8 but its block scales '%s' are missing", file,
                           name, sname);
    const char *sfile = ws->st->paths[s->file];
    long nbr = ceil_div(rows, q->block_rows), nbc = ceil_div(cols, q->block_cols);
    if (s->ndim != 2 || s->shape[0] != nbr || s->shape[1] != nbc) {
        shape_str(s, have, sizeof have);
        return kiln_errorf(err, "%s: tensor '%s' has shape %s, expected [%ld, %ld]: one scale per "
                                "%dx%d block (quantization_config weight_block_size) of '%s' [%ld, %ld]",
                           sfile, sname, have, nbr, nbc, q->block_rows, q->block_cols, name, rows,
                           cols);
    }
    if (s->dtype != DTYPE_F32 && s->dtype != DTYPE_BF16 && s->dtype != DTYPE_F16)
        return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16 (the block "
                                "scales of '%s')",
                           sfile, sname, dtype_name(s->dtype), name);
    size_t n = (size_t)nbr * (size_t)nbc;
    const float *host = s->data;
    if (s->dtype != DTYPE_F32 || ((uintptr_t)s->data & 3)) {
        float *f = model_own(m, xaligned_alloc(n * 4));
        for (size_t i = 0; i < n; i++) f[i] = ws_elem_f32(s->data, s->dtype, i);
        host = f;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(host[i]))
            return kiln_errorf(err, "%s: tensor '%s' has a non-finite scale (%g) at block [%zu, %zu]",
                               sfile, sname, (double)host[i], i / (size_t)nbc, i % (size_t)nbc);
    if (sl && sl->dim == 0) { /* whole rows of blocks: a view */
        long b0 = sl->start / q->block_rows, nb = ceil_div(sl->len, q->block_rows);
        host += b0 * nbc;
        n = (size_t)nb * (size_t)nbc;
    } else if (sl) { /* columns of blocks: a copy */
        long b0 = sl->start / q->block_cols, nb = ceil_div(sl->len, q->block_cols);
        float *f = model_own(m, xaligned_alloc((size_t)(nbr * nb) * 4));
        for (long r = 0; r < nbr; r++) memcpy(f + r * nb, host + r * nbc + b0, (size_t)nb * 4);
        host = f;
        n = (size_t)nbr * (size_t)nb;
    }
    *host_out = host;
    *n_out = n;
    return 0;
}

static int load_scales(struct weight_source *ws, const char *name, const char *file, long rows,
                       long cols, const struct ws_slice *sl, struct backend_weight *out,
                       struct kiln_error *err) {
    const float *host;
    size_t n;
    if (scales_host(ws, name, file, rows, cols, sl, &host, &n, err)) return -1;
    return upload_scales(ws, host, n, name, out, err);
}

/* Dummy part p of a [rows][cols] matrix made FP8 in cfg.quant's blocks on
 * the device (tensor/dummy_fill.h): the device codes, *scale the device
 * scales after them; NULL where the backend cannot. */
static const void *dummy_fp8_on_device(struct model *m, struct dummy_part *p, int count,
                                       const float **scale) {
    const struct model_quant *q = &m->cfg.quant;
    size_t codes = 0;
    for (int i = 0; i < count; i++) {
        p[i].src = p[i].dtype;
        p[i].dtype = DTYPE_F8_E4M3;
        p[i].block_rows = q->block_rows;
        p[i].block_cols = q->block_cols;
        codes += p[i].n;
    }
    const unsigned char *dev = dummy_on_device(m, p, count);
    for (int i = 0; i < count; i++) p[i].dtype = p[i].src;
    if (!dev) return NULL;
    *scale = (const float *)(dev + ((codes + 15) & ~(size_t)15));
    return dev;
}

/* Online quantization: w[rows][cols] (dtype dt, host) becomes FP8 in
 * cfg.quant's blocks, in buffers the model owns. */
static int quantize_upload(struct weight_source *ws, const char *name, const void *w, enum dtype dt,
                           long rows, long cols, struct backend_weight *out,
                           struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_quant *q = &m->cfg.quant;
    size_t n = (size_t)rows * (size_t)cols;
    size_t nb = (size_t)ceil_div(rows, q->block_rows) * (size_t)ceil_div(cols, q->block_cols);
    uint8_t *qd = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!qd) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for tensor '%s' (%zu bytes)", name, n);
    model_own(m, qd);
    float *sc = model_own(m, xaligned_alloc(nb * 4));
    fp8_quantize_blocks(w, dt, rows, cols, q->block_rows, q->block_cols, qd, sc);
    const void *h = qd;
    out->data = upload_stable(m, &h, &n, 1);
    if (!out->data) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    out->dtype = DTYPE_F8_E4M3;
    out->rows = rows;
    out->cols = cols;
    m->weight_bytes += n;
    ws->last_host = qd;
    return upload_scales(ws, sc, nb, name, out, err);
}

/* ---- MXFP4 (dummy) ---------------------------------------------------------- */

int ws_dummy_mxfp4(struct weight_source *ws, const char *name, long rows, long cols, struct backend_weight *out,
                   struct kiln_error *err) {
    struct model *m = ws->m;
    KILN_ASSERT(!ws->st && cols % 32 == 0);
    size_t n = (size_t)rows * (size_t)cols, nc = mxfp4_bytes(rows, cols), ne = n / 32;
    struct dummy_part p = dummy_next(ws, n, cols, dummy_dtype(m));
    ws->last_tensor = p.tensor, ws->last_n = n, ws->last_cols = cols;
    ws->last_host = NULL; /* ws_last_host: the values before encoding */
    ws->last_scale = NULL;
    p.rows = rows, p.cols = cols, p.src = p.dtype, p.dtype = DTYPE_MXFP4;
    *out = (struct backend_weight){.dtype = DTYPE_MXFP4, .rows = rows, .cols = cols, .block_rows = 1, .block_cols = 32};
    const unsigned char *dev = dummy_on_device(m, &p, 1);
    if (dev) {
        out->data = dev;
        out->e8m0 = dev + ((nc + 15) & ~(size_t)15);
    } else { /* the values on the host, then each block encoded */
        p.dtype = p.src;
        unsigned char *vals = xaligned_alloc((n * dtype_size(p.src) + 63) & ~(size_t)63);
        uint8_t *codes = model_own(m, xaligned_alloc((nc + 63) & ~(size_t)63));
        uint8_t *ex = model_own(m, xaligned_alloc((ne + 63) & ~(size_t)63));
        fill_dummy(&p, vals);
        float x[32];
        for (size_t b = 0; b < ne; b++) {
            for (int i = 0; i < 32; i++) x[i] = ws_elem_f32(vals, p.src, b * 32 + (size_t)i);
            mxfp4_encode32(x, codes + b * 16, ex + b);
        }
        free(vals);
        out->data = model_upload(m, codes, nc);
        out->e8m0 = out->data ? model_upload(m, ex, ne) : NULL;
        if (!out->e8m0)
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    }
    m->weight_bytes += nc + ne;
    return 0;
}

/* ---- matrices ------------------------------------------------------------- */

/* The host bytes of slice sl of checkpoint tensor t [rows][cols] (es
 * bytes an element): rows are a view into the mapping; columns a copy,
 * *copy set to it (the caller owns or frees it). */
static const void *slice_host(const struct st_tensor *t, long rows, long cols, const struct ws_slice *sl,
                              void **copy) {
    size_t es = dtype_size(t->dtype);
    *copy = NULL;
    if (!sl) return t->data;
    if (sl->dim == 0) return (const unsigned char *)t->data + (size_t)sl->start * (size_t)cols * es;
    size_t row = (size_t)sl->len * es;
    unsigned char *buf = xaligned_alloc(((size_t)rows * row + 63) & ~(size_t)63);
    for (long r = 0; r < rows; r++)
        memcpy(buf + (size_t)r * row, (const unsigned char *)t->data + ((size_t)r * (size_t)cols + (size_t)sl->start) * es,
               row);
    *copy = buf;
    return buf;
}

/* A host copy made for a slice, once uploaded: a backend that copied (a
 * GPU, not deferred) no longer needs it; otherwise the model keeps it. */
static void slice_done(struct model *m, void *copy, const void *dev) {
    if (!copy) return;
    if (dev == copy || m->defer_uploads) model_own(m, copy);
    else free(copy);
}

static int load_matrix(struct weight_source *ws, const char *name, long rows, long cols, int proj,
                       const struct ws_slice *sl, struct backend_weight *out,
                       struct kiln_error *err) {
    struct model *m = ws->m;
    const void *host;
    void *copy = NULL;
    size_t bytes;
    enum dtype dt;
    int quantize = proj && m->quantize_online && !model_quant_skips(&m->cfg.quant, name);
    /* the rank's part [lr][lc] */
    long lr = sl && sl->dim == 0 ? sl->len : rows, lc = sl && sl->dim == 1 ? sl->len : cols;
    KILN_ASSERT(!sl || (sl->start >= 0 && sl->len > 0 && sl->start + sl->len <= (sl->dim ? cols : rows)));
    *out = (struct backend_weight){0};
    ws->last_scale = NULL;
    if (ws->st) {
        const struct st_tensor *t;
        int64_t shape[2] = {rows, cols};
        if (st_expect(ws->st, name, 2, shape, &t, err)) return -1;
        const char *file = ws->st->paths[t->file];
        int fp8 = m->cfg.quant.method == MODEL_QUANT_FP8;
        if (t->dtype == DTYPE_F8_E4M3) {
            if (fp8_allowed(m, file, name, err) || fp8_slice_check(m, file, name, rows, cols, sl, err) ||
                load_scales(ws, name, file, rows, cols, sl, out, err))
                return -1;
        } else if (t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F32) {
            return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s", file, name,
                               dtype_name(t->dtype), fp8 ? "BF16, F16, F32 or F8_E4M3" : "BF16, F16 or F32");
        }
        host = slice_host(t, rows, cols, sl, &copy);
        if (t->dtype != DTYPE_F8_E4M3 && quantize) {
            int rc = quantize_upload(ws, name, host, t->dtype, lr, lc, out, err);
            free(copy);
            return rc;
        }
        bytes = (size_t)lr * (size_t)lc * dtype_size(t->dtype);
        dt = t->dtype;
    } else {
        dt = dummy_dtype(m);
        size_t n = (size_t)lr * (size_t)lc, es = dtype_size(dt);
        bytes = n * es;
        /* values in ±1/√cols of the whole input, whatever the slice */
        struct dummy_part p = dummy_next(ws, n, cols, dt);
        ws->last_tensor = p.tensor, ws->last_n = n, ws->last_cols = cols;
        p.rows = lr, p.cols = lc;
        if (quantize && (out->data = dummy_fp8_on_device(m, &p, 1, &out->scale))) {
            /* FP8 made on the device: codes, then scales */
            const struct model_quant *q = &m->cfg.quant;
            out->dtype = DTYPE_F8_E4M3;
            out->rows = lr;
            out->cols = lc;
            out->block_rows = q->block_rows;
            out->block_cols = q->block_cols;
            m->weight_bytes += n + (size_t)ceil_div(lr, q->block_rows) * (size_t)ceil_div(lc, q->block_cols) * 4;
            ws->last_host = NULL;
            ws->last_scale = NULL;
            return 0;
        }
        if (!quantize && (out->data = dummy_on_device(m, &p, 1))) {
            ws->last_host = NULL; /* ws_last_host makes them when asked */
            goto done;
        }
        unsigned char *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!buf) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for dummy tensor '%s' (%zu bytes)", name, bytes);
        fill_dummy(&p, buf);
        if (quantize) { /* the same values as unquantized, then FP8 */
            int rc = quantize_upload(ws, name, buf, dt, lr, lc, out, err);
            free(buf);
            return rc;
        }
        model_own(m, buf);
        host = buf;
    }
    ws->last_host = host; /* the mapping or a buffer the model owns */
    out->data = upload_stable(m, &host, &bytes, 1);
    slice_done(m, copy, out->data);
    if (copy && out->data != copy && !m->defer_uploads) ws->last_host = NULL; /* freed */
done:
    if (!out->data) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    out->dtype = dt;
    out->rows = lr;
    out->cols = lc;
    m->weight_bytes += bytes;
    return 0;
}

int ws_matrix(struct weight_source *ws, const char *name, long rows, long cols,
              const struct ws_slice *slice, struct backend_weight *out, struct kiln_error *err) {
    return load_matrix(ws, name, rows, cols, 0, slice, out, err);
}

int ws_proj(struct weight_source *ws, const char *name, long rows, long cols,
            const struct ws_slice *slice, struct backend_weight *out, struct kiln_error *err) {
    return load_matrix(ws, name, rows, cols, 1, slice, out, err);
}

/* Fills v[n] with the fp32 values of elements [start, start + n) of
 * vector `name` [len] (or dummy values). */
static int vector_host(struct weight_source *ws, const char *name, long len, long start, long n,
                       float fill, float *v, struct kiln_error *err) {
    if (ws->st) {
        const struct st_tensor *t;
        int64_t shape[1] = {len};
        if (st_expect(ws->st, name, 1, shape, &t, err)) return -1;
        for (long i = 0; i < n; i++) {
            long k = start + i;
            switch (t->dtype) {
            case DTYPE_F32: memcpy(&v[i], (const char *)t->data + k * 4, 4); break;
            case DTYPE_BF16: {
                uint16_t h;
                memcpy(&h, (const char *)t->data + k * 2, 2);
                v[i] = bf16_to_f32(h);
                break;
            }
            case DTYPE_F16: {
                uint16_t h;
                memcpy(&h, (const char *)t->data + k * 2, 2);
                v[i] = f16_to_f32(h);
                break;
            }
            default:
                return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                                   ws->st->paths[t->file], name, dtype_name(t->dtype));
            }
        }
    } else {
        uint64_t t = ws->n_tensors++;
        for (long i = 0; i < n; i++)
            v[i] = isnan(fill) ? dummy_unit(ws->seed, t, (uint64_t)(start + i)) * 0.1f : fill;
    }
    return 0;
}

int ws_vector(struct weight_source *ws, const char *name, long len, float fill, const float **out,
              struct kiln_error *err) {
    struct model *m = ws->m;
    float *v = model_own(m, xaligned_alloc((size_t)len * 4));
    if (vector_host(ws, name, len, 0, len, fill, v, err)) return -1;
    *out = model_upload(m, v, (size_t)len * 4);
    if (!*out) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    m->weight_bytes += (size_t)len * 4;
    return 0;
}

int ws_norm(struct weight_source *ws, const char *name, long len, const float **out,
            struct kiln_error *err) {
    struct model *m = ws->m;
    if (!m->cfg.norm_plus_one) return ws_vector(ws, name, len, 1.0f, out, err);
    float *v = model_own(m, xaligned_alloc((size_t)len * 4));
    if (vector_host(ws, name, len, 0, len, 0.0f, v, err)) return -1;
    for (long i = 0; i < len; i++) v[i] += 1.0f;
    *out = model_upload(m, v, (size_t)len * 4);
    if (!*out) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    m->weight_bytes += (size_t)len * 4;
    return 0;
}

int ws_vector_cat(struct weight_source *ws, const char *const *names, const long *lens,
                  const struct ws_slice *slices, int count, float fill, const float **out,
                  struct kiln_error *err) {
    struct model *m = ws->m;
    long total = 0;
    for (int i = 0; i < count; i++) total += slices ? slices[i].len : lens[i];
    float *v = model_own(m, xaligned_alloc((size_t)total * 4));
    for (long i = 0, off = 0; i < count; i++) {
        long start = slices ? slices[i].start : 0, n = slices ? slices[i].len : lens[i];
        KILN_ASSERT(!slices || (slices[i].dim == 0 && start >= 0 && start + n <= lens[i]));
        if (vector_host(ws, names[i], lens[i], start, n, fill, v + off, err)) return -1;
        off += n;
    }
    *out = model_upload(m, v, (size_t)total * 4);
    if (!*out) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", names[0]);
    m->weight_bytes += (size_t)total * 4;
    return 0;
}

/* The first byte and the rows of part i of a stack (its slice's rows, or
 * the whole tensor). */
static const void *part_host(const struct st_tensor *t, const struct ws_slice *slices, int i, long cols,
                             size_t es) {
    long r0 = slices ? slices[i].start : 0;
    return (const unsigned char *)t->data + (size_t)r0 * (size_t)cols * es;
}
static long part_rows(const long *rows, const struct ws_slice *slices, int i) {
    return slices ? slices[i].len : rows[i];
}

/* The stacked matrix of ws_matrix_cat straight from the checkpoint's parts
 * into one device allocation (backends with weight_upload_cat). NULL when
 * out of device memory. */
static const void *upload_cat_direct(struct model *m, const struct st_tensor *const *t,
                                     const long *rows, const struct ws_slice *slices, int count,
                                     long cols, size_t es, const char *name, struct kiln_error *err) {
    const void *hosts[8];
    size_t sizes[8];
    for (int i = 0; i < count; i++) {
        hosts[i] = part_host(t[i], slices, i, cols, es);
        sizes[i] = (size_t)part_rows(rows, slices, i) * (size_t)cols * es;
    }
    const void *dev = upload_stable(m, hosts, sizes, count);
    if (!dev) kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    return dev;
}

/* The stacked matrix built on the host (checkpoint parts or dummy values),
 * then uploaded. NULL when out of host or device memory. */
static const void *upload_cat_host(struct weight_source *ws, const struct st_tensor *const *t,
                                   const long *rows, const struct ws_slice *slices, int count,
                                   long cols, enum dtype dt, const char *name, struct kiln_error *err) {
    struct model *m = ws->m;
    struct dummy_part dparts[8] = {{0}};
    if (!ws->st) {
        for (int i = 0; i < count; i++)
            dparts[i] = dummy_next(ws, (size_t)part_rows(rows, slices, i) * (size_t)cols, cols, dt);
        const void *dev = dummy_on_device(m, dparts, count);
        if (dev) return dev;
    }
    size_t es = dtype_size(dt), bytes = 0;
    for (int i = 0; i < count; i++) bytes += (size_t)part_rows(rows, slices, i) * (size_t)cols * es;
    unsigned char *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!buf) {
        kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for tensor '%s' (%zu bytes)", name, bytes);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        size_t pb = (size_t)part_rows(rows, slices, i) * (size_t)cols * es;
        if (ws->st) memcpy(buf + off, part_host(t[i], slices, i, cols, es), pb);
        else fill_dummy(&dparts[i], buf + off);
        off += pb;
    }
    const void *dev = model_upload(m, buf, bytes);
    if (!dev) kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    /* A backend that copied (a GPU) no longer needs the host bytes; one
     * that uses them in place (the CPU) keeps them for the model's life. */
    if (dev == buf) model_own(m, buf);
    else free(buf);
    return dev;
}

/* Whether the stack of ws_matrix_cat is FP8 (1: checkpoint FP8 parts or
 * online quantization of every part; 0: none), t[] filled for a
 * checkpoint; -1 with err for a mix of FP8 and other parts. */
static int cat_is_fp8(struct weight_source *ws, const char *const *names, const long *rows, int count,
                      long cols, const struct st_tensor **t, struct kiln_error *err) {
    struct model *m = ws->m;
    int n8 = 0;
    for (int i = 0; i < count; i++) {
        int is8;
        if (ws->st) {
            int64_t shape[2] = {rows[i], cols};
            if (st_expect(ws->st, names[i], 2, shape, &t[i], err)) return -1;
            is8 = t[i]->dtype == DTYPE_F8_E4M3;
            if (is8 && fp8_allowed(m, ws->st->paths[t[i]->file], names[i], err)) return -1;
            if (!is8 && m->quantize_online && !model_quant_skips(&m->cfg.quant, names[i])) is8 = 1;
        } else {
            is8 = m->quantize_online && !model_quant_skips(&m->cfg.quant, names[i]);
        }
        n8 += is8;
    }
    if (n8 == 0 || n8 == count) return n8 > 0;
    return kiln_errorf(err, "tensors '%s' ... are stacked into one matrix but only some of them are "
                            "FP8 (quantization_config modules_to_not_convert): the %s backend needs "
                            "all or none",
                       names[0], m->be->ops->name);
}

/* The parts of FP8 stack out: views of its rows, each with its scale rows
 * (a part starts on a block row of the stack: cat_fp8). */
static void cat_parts(const struct backend_weight *out, const long *rows, const struct ws_slice *slices,
                      int count, long nbc, struct backend_weight *parts) {
    size_t off = 0;
    long r0 = 0;
    for (int i = 0; i < count; i++) {
        long pr = part_rows(rows, slices, i);
        parts[i] = *out;
        parts[i].data = (const unsigned char *)out->data + off;
        parts[i].rows = pr;
        parts[i].scale = r0 % out->block_rows ? NULL : out->scale + (r0 / out->block_rows) * nbc;
        off += (size_t)pr * (size_t)out->cols;
        r0 += pr;
    }
}

static long gcd_l(long a, long b) {
    while (b) {
        long r = a % b;
        a = b, b = r;
    }
    return a;
}

/* The FP8 stack: codes in one device allocation, each part's own codes
 * and block scales (as the CPU, which runs the parts one by one, has
 * them). Its block rows are g = gcd(block_rows, every part's start), so
 * that each g-row block lies in one block of one part; each takes that
 * block's scale (g = block_rows, the scale rows simply stacked, when every
 * part but the last is whole blocks: the real models' q|k|v and gate|up).
 * Checkpoint FP8 parts keep their codes and scales; other parts are
 * quantized on the host (fp8_quantize_blocks), part by part; dummy parts
 * are made FP8 on the device when it can (g = block_rows), else on the
 * host as the others. */
static int cat_fp8(struct weight_source *ws, const char *const *names, const long *rows,
                   const struct ws_slice *slices, int count, long cols,
                   const struct st_tensor *const *t, struct backend_weight *out,
                   struct backend_weight *parts, struct kiln_error *err) {
    struct model *m = ws->m;
    const struct model_quant *q = &m->cfg.quant;
    const int br = q->block_rows;
    long total = 0, nbc = ceil_div(cols, q->block_cols), g = br, pr[8], r0[8];
    for (int i = 0; i < count; i++) {
        pr[i] = part_rows(rows, slices, i);
        r0[i] = total;
        g = gcd_l(g, total);
        total += pr[i];
    }
    size_t n = (size_t)total * (size_t)cols, nb = (size_t)ceil_div(total, g) * (size_t)nbc;
    const float *ps[8]; /* each part's host scales [ceil(pr / br)][nbc] */
    const void *dev = NULL;
    int ckpt8 = ws->st && t[0]->dtype == DTYPE_F8_E4M3;
    if (ckpt8) {
        for (int i = 0; i < count; i++) {
            const char *file = ws->st->paths[t[i]->file];
            size_t hn;
            if (fp8_slice_check(m, file, names[i], rows[i], cols, slices ? &slices[i] : NULL, err) ||
                scales_host(ws, names[i], file, rows[i], cols, slices ? &slices[i] : NULL, &ps[i], &hn, err))
                return -1;
        }
        dev = m->be->ops->weight_upload_cat
                  ? upload_cat_direct(m, t, rows, slices, count, cols, 1, names[0], err)
                  : upload_cat_host(ws, t, rows, slices, count, cols, DTYPE_F8_E4M3, names[0], err);
        if (!dev) return -1;
    } else {
        struct dummy_part dp[8] = {{0}};
        enum dtype dt = ws->st ? t[0]->dtype : dummy_dtype(m);
        for (int i = 0; i < count; i++) {
            if (ws->st) {
                if (t[i]->dtype != dt || (dt != DTYPE_BF16 && dt != DTYPE_F16 && dt != DTYPE_F32))
                    return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s like '%s'",
                                       ws->st->paths[t[i]->file], names[i], dtype_name(t[i]->dtype),
                                       dtype_name(dt), names[0]);
                continue;
            }
            dp[i] = dummy_next(ws, (size_t)pr[i] * (size_t)cols, cols, dt);
            dp[i].rows = pr[i], dp[i].cols = cols;
        }
        const float *dsc = NULL;
        if (!ws->st && g == br && (dev = dummy_fp8_on_device(m, dp, count, &dsc))) {
            *out = (struct backend_weight){.data = dev, .dtype = DTYPE_F8_E4M3, .rows = total, .cols = cols,
                                           .scale = dsc, .block_rows = br, .block_cols = q->block_cols};
            m->weight_bytes += n + nb * 4;
            ws->last_host = NULL;
            ws->last_scale = NULL;
            cat_parts(out, rows, slices, count, nbc, parts);
            return 0;
        }
        /* on the host, part by part */
        size_t es = dtype_size(dt);
        uint8_t *qd = aligned_alloc(64, (n + 63) & ~(size_t)63);
        if (!qd) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for tensor '%s' (%zu bytes)", names[0], n);
        model_own(m, qd);
        for (int i = 0; i < count; i++) {
            float *sc = model_own(m, xaligned_alloc((size_t)ceil_div(pr[i], br) * (size_t)nbc * 4 + 4));
            const void *x;
            unsigned char *fill = NULL;
            if (ws->st) {
                x = part_host(t[i], slices, i, cols, es);
            } else {
                fill = xaligned_alloc(dp[i].n * es + 64);
                fill_dummy(&dp[i], fill);
                x = fill;
            }
            fp8_quantize_blocks(x, dt, pr[i], cols, br, q->block_cols, qd + (size_t)r0[i] * (size_t)cols, sc);
            free(fill);
            ps[i] = sc;
        }
        const void *h = qd;
        if (!(dev = upload_stable(m, &h, &n, 1)))
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", names[0]);
    }
    /* the stack's scales: g-row block b lies in part i's block row (b·g − r0[i]) / br */
    float *sc = model_own(m, xaligned_alloc(nb * 4 + 4));
    for (long b = 0, i = 0; b < ceil_div(total, g); b++) {
        long r = b * g;
        while (i + 1 < count && r >= r0[i + 1]) i++;
        memcpy(sc + (size_t)b * (size_t)nbc, ps[i] + (size_t)((r - r0[i]) / br) * (size_t)nbc,
               (size_t)nbc * 4);
    }
    *out = (struct backend_weight){.data = dev, .dtype = DTYPE_F8_E4M3, .rows = total, .cols = cols};
    m->weight_bytes += n;
    if (upload_scales(ws, sc, nb, names[0], out, err)) return -1;
    out->block_rows = (int)g;
    ws->last_host = NULL; /* a stack: no one matrix's host bytes */
    ws->last_scale = NULL;
    cat_parts(out, rows, slices, count, nbc, parts);
    return 0;
}

int ws_matrix_cat(struct weight_source *ws, const char *const *names, const long *rows,
                  const struct ws_slice *slices, int count, long cols, struct backend_weight *out,
                  struct backend_weight *parts, struct kiln_error *err) {
    struct model *m = ws->m;
    const struct st_tensor *t[8];
    KILN_ASSERT(count >= 1 && count <= 8);
    for (int i = 0; slices && i < count; i++)
        KILN_ASSERT(slices[i].dim == 0 && slices[i].start >= 0 && slices[i].len > 0 &&
                    slices[i].start + slices[i].len <= rows[i]);
    if (m->be->ops->weights_in_place) {
        /* Keep each part a view of the checkpoint; model_matmul_cat runs
         * the parts one after the other into the same output layout. */
        long total = 0;
        for (int i = 0; i < count; i++) {
            if (ws_proj(ws, names[i], rows[i], cols, slices ? &slices[i] : NULL, &parts[i], err)) return -1;
            total += parts[i].rows;
        }
        *out = (struct backend_weight){.data = NULL, .dtype = parts[0].dtype, .rows = total, .cols = cols};
        return 0;
    }
    /* One copy of the stack; FP8 parts with their scale rows stacked */
    int fp8 = cat_is_fp8(ws, names, rows, count, cols, t, err);
    if (fp8 < 0) return -1;
    if (fp8) return cat_fp8(ws, names, rows, slices, count, cols, t, out, parts, err);
    enum dtype dt = dummy_dtype(m);
    long total = 0;
    for (int i = 0; i < count; i++) {
        total += part_rows(rows, slices, i);
        if (!ws->st) continue;
        int64_t shape[2] = {rows[i], cols};
        if (st_expect(ws->st, names[i], 2, shape, &t[i], err)) return -1;
        if (i == 0) dt = t[0]->dtype;
        if (t[i]->dtype != dt || (dt != DTYPE_BF16 && dt != DTYPE_F16 && dt != DTYPE_F32))
            return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s like '%s'",
                               ws->st->paths[t[i]->file], names[i], dtype_name(t[i]->dtype),
                               dtype_name(dt), names[0]);
    }
    size_t es = dtype_size(dt), bytes = (size_t)total * (size_t)cols * es;
    const void *dev = ws->st && m->be->ops->weight_upload_cat
                          ? upload_cat_direct(m, t, rows, slices, count, cols, es, names[0], err)
                          : upload_cat_host(ws, t, rows, slices, count, cols, dt, names[0], err);
    if (!dev) return -1;
    size_t off = 0;
    *out = (struct backend_weight){.data = dev, .dtype = dt, .rows = total, .cols = cols};
    for (int i = 0; i < count; i++) {
        long pr = part_rows(rows, slices, i);
        parts[i] = (struct backend_weight){.data = (const unsigned char *)dev + off, .dtype = dt,
                                           .rows = pr, .cols = cols};
        off += (size_t)pr * (size_t)cols * es;
    }
    m->weight_bytes += bytes;
    return 0;
}

void model_matmul_cat(struct model *m, float *y, long ldy, const float *x, long ldx,
                      const struct backend_weight *cat, const struct backend_weight *parts,
                      int count, const float *bias, long n) {
    const struct backend_ops *ops = m->be->ops;
    if (cat->data) {
        ops->matmul(m->be->ctx, y, ldy, x, ldx, cat, bias, n);
        return;
    }
    long off = 0;
    for (int i = 0; i < count; i++) {
        ops->matmul(m->be->ctx, y + off, ldy, x, ldx, &parts[i], bias ? bias + off : NULL, n);
        off += parts[i].rows;
    }
}
