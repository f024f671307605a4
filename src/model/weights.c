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

static float elem_f32(const void *w, enum dtype dt, size_t i) {
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
        for (long i = 0; i < nr * cols; i++) x[i] = elem_f32(w, dt, (size_t)(r0 * cols + i));
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

/* The block scales of FP8 tensor `name` [rows][cols]: `<name>_scale_inv`,
 * [ceil(rows / B0)][ceil(cols / B1)], F32 (BF16 and F16 widened), finite. */
static int load_scales(struct weight_source *ws, const char *name, const char *file, long rows,
                       long cols, struct backend_weight *out, struct kiln_error *err) {
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
        for (size_t i = 0; i < n; i++) f[i] = elem_f32(s->data, s->dtype, i);
        host = f;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(host[i]))
            return kiln_errorf(err, "%s: tensor '%s' has a non-finite scale (%g) at block [%zu, %zu]",
                               sfile, sname, (double)host[i], i / (size_t)nbc, i % (size_t)nbc);
    return upload_scales(ws, host, n, name, out, err);
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

/* ---- matrices ------------------------------------------------------------- */

static int load_matrix(struct weight_source *ws, const char *name, long rows, long cols, int proj,
                       struct backend_weight *out, struct kiln_error *err) {
    struct model *m = ws->m;
    const void *host;
    size_t bytes;
    enum dtype dt;
    int quantize = proj && m->quantize_online && !model_quant_skips(&m->cfg.quant, name);
    *out = (struct backend_weight){0};
    ws->last_scale = NULL;
    if (ws->st) {
        const struct st_tensor *t;
        int64_t shape[2] = {rows, cols};
        if (st_expect(ws->st, name, 2, shape, &t, err)) return -1;
        const char *file = ws->st->paths[t->file];
        int fp8 = m->cfg.quant.method == MODEL_QUANT_FP8;
        if (t->dtype == DTYPE_F8_E4M3) {
            if (fp8_allowed(m, file, name, err) || load_scales(ws, name, file, rows, cols, out, err))
                return -1;
        } else if (t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F32) {
            return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s", file, name,
                               dtype_name(t->dtype), fp8 ? "BF16, F16, F32 or F8_E4M3" : "BF16, F16 or F32");
        } else if (quantize) {
            return quantize_upload(ws, name, t->data, t->dtype, rows, cols, out, err);
        }
        host = t->data;
        bytes = t->nbytes;
        dt = t->dtype;
    } else {
        dt = dummy_dtype(m);
        size_t n = (size_t)rows * (size_t)cols, es = dtype_size(dt);
        bytes = n * es;
        struct dummy_part p = dummy_next(ws, n, cols, dt);
        ws->last_tensor = p.tensor, ws->last_n = n, ws->last_cols = cols;
        if (!quantize && (out->data = dummy_on_device(m, &p, 1))) {
            ws->last_host = NULL; /* ws_last_host makes them when asked */
            goto done;
        }
        unsigned char *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!buf) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for dummy tensor '%s' (%zu bytes)", name, bytes);
        fill_dummy(&p, buf);
        if (quantize) { /* the same values as unquantized, then FP8 */
            int rc = quantize_upload(ws, name, buf, dt, rows, cols, out, err);
            free(buf);
            return rc;
        }
        model_own(m, buf);
        host = buf;
    }
    ws->last_host = host; /* the mapping or a buffer the model owns */
    out->data = upload_stable(m, &host, &bytes, 1);
done:
    if (!out->data) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    m->weight_bytes += bytes;
    return 0;
}

int ws_matrix(struct weight_source *ws, const char *name, long rows, long cols,
              struct backend_weight *out, struct kiln_error *err) {
    return load_matrix(ws, name, rows, cols, 0, out, err);
}

int ws_proj(struct weight_source *ws, const char *name, long rows, long cols,
            struct backend_weight *out, struct kiln_error *err) {
    return load_matrix(ws, name, rows, cols, 1, out, err);
}

/* Fills v[len] with the fp32 values of vector `name` (or dummy values). */
static int vector_host(struct weight_source *ws, const char *name, long len, float fill, float *v,
                       struct kiln_error *err) {
    if (ws->st) {
        const struct st_tensor *t;
        int64_t shape[1] = {len};
        if (st_expect(ws->st, name, 1, shape, &t, err)) return -1;
        for (long i = 0; i < len; i++) {
            switch (t->dtype) {
            case DTYPE_F32: memcpy(&v[i], (const char *)t->data + i * 4, 4); break;
            case DTYPE_BF16: {
                uint16_t h;
                memcpy(&h, (const char *)t->data + i * 2, 2);
                v[i] = bf16_to_f32(h);
                break;
            }
            case DTYPE_F16: {
                uint16_t h;
                memcpy(&h, (const char *)t->data + i * 2, 2);
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
        for (long i = 0; i < len; i++) v[i] = isnan(fill) ? dummy_unit(ws->seed, t, (uint64_t)i) * 0.1f : fill;
    }
    return 0;
}

int ws_vector(struct weight_source *ws, const char *name, long len, float fill, const float **out,
              struct kiln_error *err) {
    struct model *m = ws->m;
    float *v = model_own(m, xaligned_alloc((size_t)len * 4));
    if (vector_host(ws, name, len, fill, v, err)) return -1;
    *out = model_upload(m, v, (size_t)len * 4);
    if (!*out) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    m->weight_bytes += (size_t)len * 4;
    return 0;
}

int ws_vector_cat(struct weight_source *ws, const char *const *names, const long *lens, int count,
                  float fill, const float **out, struct kiln_error *err) {
    struct model *m = ws->m;
    long total = 0;
    for (int i = 0; i < count; i++) total += lens[i];
    float *v = model_own(m, xaligned_alloc((size_t)total * 4));
    for (int i = 0, off = 0; i < count; off += (int)lens[i], i++)
        if (vector_host(ws, names[i], lens[i], fill, v + off, err)) return -1;
    *out = model_upload(m, v, (size_t)total * 4);
    if (!*out) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", names[0]);
    m->weight_bytes += (size_t)total * 4;
    return 0;
}

/* The stacked matrix of ws_matrix_cat straight from the checkpoint's parts
 * into one device allocation (backends with weight_upload_cat). NULL when
 * out of device memory. */
static const void *upload_cat_direct(struct model *m, const struct st_tensor *const *t,
                                     const long *rows, int count, long cols, size_t es,
                                     const char *name, struct kiln_error *err) {
    const void *hosts[8];
    size_t sizes[8];
    for (int i = 0; i < count; i++) {
        hosts[i] = t[i]->data;
        sizes[i] = (size_t)rows[i] * (size_t)cols * es;
    }
    const void *dev = upload_stable(m, hosts, sizes, count);
    if (!dev) kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for tensor '%s'", name);
    return dev;
}

/* The stacked matrix built on the host (checkpoint parts or dummy values),
 * then uploaded. NULL when out of host or device memory. */
static const void *upload_cat_host(struct weight_source *ws, const struct st_tensor *const *t,
                                   const long *rows, int count, long cols, enum dtype dt,
                                   const char *name, struct kiln_error *err) {
    struct model *m = ws->m;
    struct dummy_part dparts[8];
    if (!ws->st) {
        for (int i = 0; i < count; i++) dparts[i] = dummy_next(ws, (size_t)rows[i] * (size_t)cols, cols, dt);
        const void *dev = dummy_on_device(m, dparts, count);
        if (dev) return dev;
    }
    size_t es = dtype_size(dt), bytes = 0;
    for (int i = 0; i < count; i++) bytes += (size_t)rows[i] * (size_t)cols * es;
    unsigned char *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!buf) {
        kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for tensor '%s' (%zu bytes)", name, bytes);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        size_t pb = (size_t)rows[i] * (size_t)cols * es;
        if (ws->st) memcpy(buf + off, t[i]->data, pb);
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

int ws_matrix_cat(struct weight_source *ws, const char *const *names, const long *rows, int count,
                  long cols, struct backend_weight *out, struct backend_weight *parts,
                  struct kiln_error *err) {
    struct model *m = ws->m;
    const struct st_tensor *t[8];
    KILN_ASSERT(count >= 1 && count <= 8);
    if (m->be->ops->weights_in_place) {
        /* Keep each part a view of the checkpoint; model_matmul_cat runs
         * the parts one after the other into the same output layout. */
        long total = 0;
        for (int i = 0; i < count; i++) {
            if (ws_proj(ws, names[i], rows[i], cols, &parts[i], err)) return -1;
            total += rows[i];
        }
        *out = (struct backend_weight){.data = NULL, .dtype = parts[0].dtype, .rows = total, .cols = cols};
        return 0;
    }
    /* One copy of the stack: FP8 parts would need their scale rows
     * stacked too (and whole blocks per part); not yet. */
    if (m->quantize_online)
        return kiln_errorf(err, "--quantization fp8: stacked FP8 matrices ('%s' ...) are not "
                                "supported on the %s backend yet; use --device cpu",
                           names[0], m->be->ops->name);
    enum dtype dt = dummy_dtype(m);
    long total = 0;
    for (int i = 0; i < count; i++) {
        total += rows[i];
        if (!ws->st) continue;
        int64_t shape[2] = {rows[i], cols};
        if (st_expect(ws->st, names[i], 2, shape, &t[i], err)) return -1;
        if (t[i]->dtype == DTYPE_F8_E4M3) {
            const char *file = ws->st->paths[t[i]->file];
            if (fp8_allowed(m, file, names[i], err)) return -1;
            return kiln_errorf(err, "%s: tensor '%s' is FP8: stacked FP8 matrices are not supported "
                                    "on the %s backend yet; use --device cpu",
                               file, names[i], m->be->ops->name);
        }
        if (i == 0) dt = t[0]->dtype;
        if (t[i]->dtype != dt || (dt != DTYPE_BF16 && dt != DTYPE_F16 && dt != DTYPE_F32))
            return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected %s like '%s'",
                               ws->st->paths[t[i]->file], names[i], dtype_name(t[i]->dtype),
                               dtype_name(dt), names[0]);
    }
    size_t es = dtype_size(dt), bytes = (size_t)total * (size_t)cols * es;
    const void *dev = ws->st && m->be->ops->weight_upload_cat
                          ? upload_cat_direct(m, t, rows, count, cols, es, names[0], err)
                          : upload_cat_host(ws, t, rows, count, cols, dt, names[0], err);
    if (!dev) return -1;
    size_t off = 0;
    *out = (struct backend_weight){.data = dev, .dtype = dt, .rows = total, .cols = cols};
    for (int i = 0; i < count; i++) {
        parts[i] = (struct backend_weight){.data = (const unsigned char *)dev + off, .dtype = dt,
                                           .rows = rows[i], .cols = cols};
        off += (size_t)rows[i] * (size_t)cols * es;
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
