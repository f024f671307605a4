/* cpu_backend.c — memory, element-wise operations and the operation table
 * of the CPU backend. Matrix products live in cpu_matmul.c, attention in
 * cpu_attention.c, mixture-of-experts in cpu_moe.c. */
#include "backend/cpu/cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_matmul.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"
#include "base/threadpool.h"
#include "tensor/backend_compose.h"

/* Large buffers (the KV pool) come straight from mmap: zero pages cost
 * nothing until touched, so a generous pool does not inflate resident
 * memory. A small header before the returned pointer records how to free. */
enum { CPU_ALLOC_HEADER = 64, CPU_MMAP_MIN = 1 << 20 };

static void *cpu_alloc(void *ctx, size_t bytes) {
    size_t sz = ((bytes + 63) & ~(size_t)63) + CPU_ALLOC_HEADER;
    unsigned char *base;
    if (sz >= CPU_MMAP_MIN) {
        base = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
    } else {
        base = aligned_alloc(64, sz);
        if (!base) return NULL;
        memset(base, 0, sz);
    }
    memcpy(base, &sz, sizeof sz);
    return base + CPU_ALLOC_HEADER;
}

static void cpu_free(void *ctx, void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - CPU_ALLOC_HEADER;
    size_t sz;
    memcpy(&sz, base, sizeof sz);
    if (sz >= CPU_MMAP_MIN) munmap(base, sz);
    else free(base);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

static const void *cpu_weight_upload(void *ctx, const void *host, size_t bytes) { return host; }
static void cpu_weight_release(void *ctx, const void *dev) {}
static void cpu_synchronize(void *ctx) {}

static int cpu_reserve(void *vctx, long max_tokens, long max_context, int max_heads,
                       struct kiln_error *err) {
    struct cpu_ctx *c = vctx;
    if (max_context > c->max_context) {
        free(c->attn_scratch);
        c->attn_scratch = aligned_alloc(64, ((size_t)c->n_threads * (size_t)max_context * 4 + 63) &
                                                ~(size_t)63);
        if (!c->attn_scratch) return kiln_errorf(err, "cpu backend: out of memory for attention scratch");
        c->max_context = max_context;
    }
    if (max_tokens > c->max_tokens) c->max_tokens = max_tokens;
    if (max_heads > c->max_heads) c->max_heads = max_heads;
    return 0;
}

static void cpu_destroy(void *vctx) {
    struct cpu_ctx *c = vctx;
    if (!c) return;
    threadpool_destroy(c->tp);
    free(c->attn_scratch);
    free(c->moe_buf);
    free(c->moe_idx);
    free(c);
}

/* ---- row-parallel helpers ---------------------------------------------- */

struct rows_job {
    void (*row)(const struct rows_job *j, long i);
    long n;
    float *y;
    long ldy;
    const float *x;
    long ldx;
    const float *w;
    const float *u;
    long ldu;
    long dim;
    float eps;
    const void *table;
    enum dtype dt;
    const int32_t *ids;
    long first, n_table; /* embed_shard: the table's first vocabulary row, its rows */
};

static void rows_worker(void *arg, int ith, int nth) {
    const struct rows_job *j = arg;
    long lo, hi;
    threadpool_split(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->row(j, i);
}

/* Small jobs are not worth waking the other threads for. */
static void run_rows(struct cpu_ctx *c, struct rows_job *j) {
    if (j->n * j->dim < 16384 || j->n < 2) {
        for (long i = 0; i < j->n; i++) j->row(j, i);
    } else {
        threadpool_run(c->tp, rows_worker, j);
    }
}

static void widen_row(float *dst, const void *src, enum dtype dt, long n) {
    switch (dt) {
    case DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DTYPE_BF16:
        for (long k = 0; k < n; k++) dst[k] = bf16_to_f32(((const uint16_t *)src)[k]);
        break;
    case DTYPE_F16:
        for (long k = 0; k < n; k++) dst[k] = f16_to_f32(((const uint16_t *)src)[k]);
        break;
    default: KILN_ASSERT_MSG(0, "unsupported embedding dtype");
    }
}

static void embed_row(const struct rows_job *j, long i) {
    size_t esz = dtype_size(j->dt);
    widen_row(j->y + i * j->ldy, (const char *)j->table + (size_t)j->ids[i] * (size_t)j->dim * esz,
              j->dt, j->dim);
}

static void cpu_embed(void *ctx, float *y, const struct backend_weight *table, const int32_t *ids,
                      long n) {
    struct rows_job j = {.row = embed_row, .n = n, .y = y, .ldy = table->cols, .dim = table->cols,
                         .table = table->data, .dt = table->dtype, .ids = ids};
    for (long i = 0; i < n; i++) KILN_ASSERT(ids[i] >= 0 && ids[i] < table->rows);
    run_rows(ctx, &j);
}

static void embed_shard_row(const struct rows_job *j, long i) {
    long id = (long)j->ids[i] - j->first;
    if (id < 0 || id >= j->n_table) {
        memset(j->y + i * j->ldy, 0, (size_t)j->dim * 4);
        return;
    }
    widen_row(j->y + i * j->ldy, (const char *)j->table + (size_t)id * (size_t)j->dim * dtype_size(j->dt),
              j->dt, j->dim);
}

static void cpu_embed_shard(void *ctx, float *y, const struct backend_weight *table,
                            const int32_t *ids, long first, long n) {
    struct rows_job j = {.row = embed_shard_row, .n = n, .y = y, .ldy = table->cols,
                         .dim = table->cols, .table = table->data, .dt = table->dtype, .ids = ids,
                         .first = first, .n_table = table->rows};
    run_rows(ctx, &j);
}

/* Sum of squares in a fixed order: 8 partial sums, then pairwise. */
static float sum_squares(const float *x, long n) {
    float acc[8] = {0};
    long k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[k + l] * x[k + l];
    for (; k < n; k++) acc[k & 7] += x[k] * x[k];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void rmsnorm_row(const struct rows_job *j, long i) {
    const float *x = j->x + i * j->ldx;
    float *y = j->y + i * j->ldy;
    float inv = 1.0f / sqrtf(sum_squares(x, j->dim) / (float)j->dim + j->eps);
    for (long k = 0; k < j->dim; k++) y[k] = j->w[k] * (x[k] * inv);
}

static void cpu_rmsnorm(void *ctx, float *y, long ldy, const float *x, long ldx, const float *w,
                        long n, long dim, float eps) {
    struct rows_job j = {.row = rmsnorm_row, .n = n, .y = y, .ldy = ldy, .x = x, .ldx = ldx,
                         .w = w, .dim = dim, .eps = eps};
    run_rows(ctx, &j);
}

static void add_rmsnorm_row(const struct rows_job *j, long i) {
    float *h = (float *)j->x + i * j->dim;
    if (j->u) {
        const float *d = j->u + i * j->dim;
        for (long k = 0; k < j->dim; k++) h[k] += d[k];
    }
    float *y = j->y + i * j->dim;
    float inv = 1.0f / sqrtf(sum_squares(h, j->dim) / (float)j->dim + j->eps);
    for (long k = 0; k < j->dim; k++) y[k] = j->w[k] * (h[k] * inv);
}

static void cpu_add_rmsnorm(void *ctx, float *h, const float *delta, float *y, const float *w,
                            long n, long dim, float eps) {
    struct rows_job j = {.row = add_rmsnorm_row, .n = n, .y = y, .x = h, .u = delta, .w = w,
                         .dim = dim, .eps = eps};
    run_rows(ctx, &j);
}

static void cpu_rope(void *ctx, float *x, long ldx, long n, int n_heads, long head_stride,
                     int rot_dim, const int32_t *pos, const float *cos_sin, int interleaved) {
    int half = rot_dim / 2;
    for (long i = 0; i < n; i++) {
        const float *cs = cos_sin + (size_t)pos[i] * (size_t)rot_dim;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + i * ldx + h * head_stride;
            for (int d = 0; d < half; d++) {
                float c = cs[2 * d], s = cs[2 * d + 1];
                float *a = interleaved ? &v[2 * d] : &v[d];
                float *b = interleaved ? &v[2 * d + 1] : &v[d + half];
                float x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x1 * c + x0 * s;
            }
        }
    }
}

static void silu_mul_row(const struct rows_job *j, long i) {
    const float *g = j->x + i * j->ldx, *u = j->u + i * j->ldu;
    float *y = j->y + i * j->ldy;
    for (long k = 0; k < j->dim; k++) y[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

void cpu_silu_mul(void *ctx, float *y, long ldy, const float *g, long ldg, const float *u, long ldu,
                  long n, long dim) {
    struct rows_job j = {.row = silu_mul_row, .n = n, .y = y, .ldy = ldy, .x = g, .ldx = ldg,
                         .u = u, .ldu = ldu, .dim = dim};
    run_rows(ctx, &j);
}

static void gelu_tanh_mul_row(const struct rows_job *j, long i) {
    const float *g = j->x + i * j->ldx, *u = j->u + i * j->ldu;
    float *y = j->y + i * j->ldy;
    const float c = 0.7978845608028654f; /* √(2/π) */
    for (long k = 0; k < j->dim; k++) {
        float x = g[k];
        y[k] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[k];
    }
}

static void cpu_gelu_tanh_mul(void *ctx, float *y, long ldy, const float *g, long ldg,
                              const float *u, long ldu, long n, long dim) {
    struct rows_job j = {.row = gelu_tanh_mul_row, .n = n, .y = y, .ldy = ldy, .x = g, .ldx = ldg,
                         .u = u, .ldu = ldu, .dim = dim};
    run_rows(ctx, &j);
}

static void cpu_scale(void *ctx, float *x, long count, float s) {
    for (long i = 0; i < count; i++) x[i] *= s;
}

static void cpu_gated_add(void *ctx, float *y, const float *x, const float *gate, long ldgate,
                          long n, long dim) {
    for (long i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-gate[i * ldgate]));
        for (long k = 0; k < dim; k++) y[i * dim + k] += s * x[i * dim + k];
    }
}

static void cpu_add(void *ctx, float *y, const float *x, long count) {
    for (long i = 0; i < count; i++) y[i] += x[i];
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, long width,
                            const int32_t *rows, long n) {
    for (long i = 0; i < n; i++)
        memcpy(dst + i * width, src + (long)rows[i] * width, (size_t)width * 4);
}

static void cpu_copy_rows(void *ctx, float *dst, long ldd, const float *src, long lds, long n,
                          long width) {
    for (long i = 0; i < n; i++) memmove(dst + i * ldd, src + i * lds, (size_t)width * 4);
}

/* The CPU's KV cache is fp32, or e4m3 with a scale per layer and K / V
 * (backend_options.kv_fp8): q = e4m3(x / scale), read as e4m3(q) * scale. */
static enum dtype cpu_kv_dtype(void *ctx) {
    return ((const struct cpu_ctx *)ctx)->kv_fp8 ? DTYPE_F8_E4M3 : DTYPE_F32;
}

static void cpu_kv_store(void *ctx, void *cache_v, long stride, const float *src, long ld,
                         long width, const int32_t *slots, long n, float scale) {
    if (((const struct cpu_ctx *)ctx)->kv_fp8) {
        uint8_t *cache = cache_v;
        for (long i = 0; i < n; i++) {
            uint8_t *dst = cache + (size_t)slots[i] * (size_t)stride;
            for (long k = 0; k < width; k++) dst[k] = f32_to_fp8_e4m3(src[i * ld + k] / scale);
        }
        return;
    }
    float *cache = cache_v;
    for (long i = 0; i < n; i++)
        memcpy(cache + (size_t)slots[i] * (size_t)stride, src + i * ld, (size_t)width * 4);
}

static void cpu_kv_gather(void *ctx, float *dst, long ldd, const void *cache_v, long stride,
                          long width, const int32_t *pages, int page_size, long p0, long n,
                          float scale) {
    int fp8 = ((const struct cpu_ctx *)ctx)->kv_fp8;
    for (long i = 0; i < n; i++) {
        long p = p0 + i, slot = (long)pages[p / page_size] * page_size + p % page_size;
        if (fp8)
            cpu_fp8_widen(dst + i * ldd, (const uint8_t *)cache_v + (size_t)slot * (size_t)stride,
                          width, scale);
        else
            memcpy(dst + i * ldd, (const float *)cache_v + (size_t)slot * (size_t)stride,
                   (size_t)width * 4);
    }
}

void cpu_fp8_widen(float *dst, const uint8_t *src, long n, float scale) {
    for (long k = 0; k < n; k++) dst[k] = fp8_e4m3_to_f32(src[k]) * scale;
}

/* fp32 output whatever the cache type (attn_params.f32_cache). */
static void cpu_mla_kv_expand(void *ctx, void *k_v, void *v_v, const float *kv, long ldkv,
                              const float *k_rope, long ldr, long n, int n_heads, int nope,
                              int rope, int vd) {
    float *k = k_v, *v = v_v;
    long qh = nope + rope, kw = (long)n_heads * qh, vw = (long)n_heads * vd;
    for (long i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            const float *src = kv + i * ldkv + (long)h * (nope + vd);
            memcpy(k + i * kw + h * qh, src, (size_t)nope * 4);
            memcpy(k + i * kw + h * qh + nope, k_rope + i * ldr, (size_t)rope * 4);
            memcpy(v + i * vw + (long)h * vd, src + nope, (size_t)vd * 4);
        }
}

void cpu_matmul_op(void *ctx, float *y, long ldy, const float *x, long ldx,
                   const struct backend_weight *w, const float *bias, long n) {
    struct cpu_ctx *c = ctx;
    (c->matmul_bf16 ? cpu_matmul_bf16 : cpu_matmul)(c->tp, y, ldy, x, ldx, w, bias, n);
}

/* The layer-level operations: no fusions here, the primitives in turn. */
static const struct backend_ops cpu_ops;

static void cpu_matmul_heads(void *ctx, float *y, long ldy, long hy, const float *x, long ldx,
                             long hx, const struct backend_weight *w, long w_stride, int n_heads,
                             long n) {
    compose_matmul_heads(&cpu_ops, ctx, y, ldy, hy, x, ldx, hx, w, w_stride, n_heads, n);
}

static void cpu_qk_rope_store(void *ctx, float *q, float *k, const float *v, long ld, long n,
                              const struct backend_rope_store *r) {
    compose_qk_rope_store(&cpu_ops, ctx, q, k, v, ld, n, r);
}

static void cpu_norm_matmul(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                            const struct backend_weight *w, const float *bias, long n) {
    compose_norm_matmul(&cpu_ops, ctx, nm, y, ldy, w, bias, n);
}

static void cpu_norm_matmul_rope(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                                 const struct backend_stack *w, const float *bias, long n,
                                 const struct backend_rope_store *r) {
    compose_norm_matmul_rope(&cpu_ops, ctx, nm, y, ldy, w, bias, n, r);
}

static void cpu_norm_swiglu_mlp(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                                const struct backend_stack *gate_up,
                                const struct backend_weight *down, float *gu, long ldgu, long n) {
    compose_norm_swiglu_mlp(&cpu_ops, ctx, nm, y, ldy, gate_up, down, gu, ldgu, n);
}

static void cpu_attention_matmul(void *ctx, float *y, long ldy, float *att, long ldatt,
                                 const float *q, long ldq, const void *k_cache, const void *v_cache,
                                 const struct attn_params *p, const struct backend_batch *b,
                                 const struct backend_weight *wo, const float *bias, long n) {
    compose_attention_matmul(&cpu_ops, ctx, y, ldy, att, ldatt, q, ldq, k_cache, v_cache, p, b, wo,
                             bias, n);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .weights_in_place = 1,
    .fp8_weights = 1, /* cpu_matmul dequantizes F8_E4M3 blocks (cpu_matmul_fp8.c) */
    .sliding_window = 1, /* cpu_attention starts each row at its window's first key */
    .attention_sinks = 1, /* cpu_attention adds the sink to each row's max and denominator */
    .moe_bias_act = 1,    /* cpu_moe.c */
    .destroy = cpu_destroy,
    .reserve = cpu_reserve,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight_upload = cpu_weight_upload,
    .weight_release = cpu_weight_release,
    .synchronize = cpu_synchronize,
    .embed = cpu_embed,
    .embed_shard = cpu_embed_shard,
    .matmul = cpu_matmul_op,
    .matmul_heads = cpu_matmul_heads,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .gated_add = cpu_gated_add,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .scale = cpu_scale,
    .add = cpu_add,
    .gather_rows = cpu_gather_rows,
    .copy_rows = cpu_copy_rows,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .kv_gather = cpu_kv_gather,
    .mla_kv_expand = cpu_mla_kv_expand,
    .moe_route = cpu_moe_route,
    .moe_ffn = cpu_moe_ffn,
    .qk_rope_store = cpu_qk_rope_store,
    .norm_matmul = cpu_norm_matmul,
    .norm_matmul_rope = cpu_norm_matmul_rope,
    .norm_swiglu_mlp = cpu_norm_swiglu_mlp,
    .attention_matmul = cpu_attention_matmul,
    .kv_dtype = cpu_kv_dtype,
};

int cpu_backend_create(struct backend *be, const struct backend_options *opt,
                       struct kiln_error *err) {
    struct cpu_ctx *c = xcalloc(1, sizeof *c);
    c->tp = threadpool_create(opt ? opt->n_threads : 0);
    c->n_threads = threadpool_size(c->tp);
    c->matmul_bf16 = !(opt && opt->cpu_f32) && knob_enum(KNOB_CPU_MATMUL) == 1;
    c->kv_fp8 = opt && opt->kv_fp8;
    be->ops = &cpu_ops;
    be->ctx = c;
    return 0;
}
