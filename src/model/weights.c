/* weights.c — getting weights onto the backend, from a checkpoint or, for
 * speed work, random ("dummy") values. Matrices keep their checkpoint
 * dtype; 1-D tensors (norms, biases) are widened to fp32 once, they are
 * tiny and read often. */
#include <math.h>
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

int ws_matrix(struct weight_source *ws, const char *name, long rows, long cols,
              struct backend_weight *out, struct kiln_error *err) {
    struct model *m = ws->m;
    const void *host;
    size_t bytes;
    enum dtype dt;
    if (ws->st) {
        const struct st_tensor *t;
        int64_t shape[2] = {rows, cols};
        if (st_expect(ws->st, name, 2, shape, &t, err)) return -1;
        if (t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F32)
            return kiln_errorf(err, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                               ws->st->paths[t->file], name, dtype_name(t->dtype));
        host = t->data;
        bytes = t->nbytes;
        dt = t->dtype;
    } else {
        dt = dummy_dtype(m);
        size_t n = (size_t)rows * (size_t)cols, es = dtype_size(dt);
        bytes = n * es;
        struct dummy_part p = dummy_next(ws, n, cols, dt);
        ws->last_tensor = p.tensor, ws->last_n = n, ws->last_cols = cols;
        if ((out->data = dummy_on_device(m, &p, 1))) {
            ws->last_host = NULL; /* ws_last_host makes them when asked */
            goto done;
        }
        unsigned char *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!buf) return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of memory for dummy tensor '%s' (%zu bytes)", name, bytes);
        model_own(m, buf);
        fill_dummy(&p, buf);
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
            if (ws_matrix(ws, names[i], rows[i], cols, &parts[i], err)) return -1;
            total += rows[i];
        }
        *out = (struct backend_weight){.data = NULL, .dtype = parts[0].dtype, .rows = total, .cols = cols};
        return 0;
    }
    enum dtype dt = dummy_dtype(m);
    long total = 0;
    for (int i = 0; i < count; i++) {
        total += rows[i];
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
