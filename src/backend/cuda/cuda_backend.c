/* cuda_backend.c — the CUDA backend's context, memory operations and
 * operation table. Kernels live in the cuda_*.cu files (see cuda_backend.h).
 *
 * All work goes onto one stream owned by the context. Uploads are
 * asynchronous (pageable host memory is staged by the driver before the
 * call returns, so the caller may reuse its buffer at once); downloads wait
 * for the stream, since the caller reads the result right after. */
#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/mem.h"

enum { CUBLAS_WORKSPACE_BYTES = 32 << 20 }; /* what cuBLAS recommends for Hopper */

void cuda_fail(const char *expr, const char *what, const char *file, int line) {
    char msg[512];
    snprintf(msg, sizeof msg, "CUDA error: %s", what);
    kiln_assert_fail(expr, file, line, msg);
}

void cuda_assert_fail(const char *expr, const char *file, int line, const char *msg) {
    kiln_assert_fail(expr, file, line, msg);
}

void cuda_oom_record(struct cuda_ctx *c, size_t bytes, const char *what) {
    (void)cudaGetLastError(); /* out of memory is not sticky: the context stays usable */
    if (c->oom.bytes) return;
    size_t fr = 0, total = 0;
    if (cudaMemGetInfo(&fr, &total) != cudaSuccess) (void)cudaGetLastError(), fr = total = 0;
    c->oom.bytes = bytes ? bytes : 1;
    c->oom.free_bytes = fr;
    c->oom.total_bytes = total;
    snprintf(c->oom.what, sizeof c->oom.what, "%s", what);
}

int cuda_scratch_reserve(struct cuda_ctx *c, struct cuda_scratch *s, size_t bytes, long rows) {
    if (bytes <= s->bytes) return 0;
    /* The model runs a batch size eagerly before recording it, so scratch
     * has its size by then; growing while recording would capture memory
     * that the graph itself allocates. */
    CUDA_ASSERT_MSG(!c->capturing, "cuda backend: scratch grew while recording a graph");
    /* the step already failed: its result is discarded, nothing more to get */
    if (c->oom.bytes) return -1;
    c->scratch_gen++;
    if (s->p) CUDA_CHECK(cudaFreeAsync(s->p, c->stream));
    s->p = NULL;
    s->bytes = 0;
    bytes = (bytes + 255) & ~(size_t)255;
    /* Batches larger than the memory plan foresaw (a long prefill of a
     * large model, another process on the device) can run out here: the
     * step fails, not the process. */
    cudaError_t e = cudaMallocAsync(&s->p, bytes, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        s->p = NULL;
        char what[112];
        if (s == &c->act16)
            snprintf(what, sizeof what, "the 16-bit activations of a %ld-row product", rows);
        else if (s == &c->moe_dev)
            snprintf(what, sizeof what, "the expert rows of a %ld-token MoE layer", rows);
        else if (s == &c->fp8w)
            snprintf(what, sizeof what, "FP8 weight rows dequantized for a %ld-row product", rows);
        else if (s == &c->sample_part)
            snprintf(what, sizeof what, "the sampler's partials of %ld rows", rows);
        else
            snprintf(what, sizeof what, "scratch of a %ld-row operation", rows);
        cuda_oom_record(c, bytes, what);
        return -1;
    }
    if (e != cudaSuccess)
        cuda_fail("cudaMallocAsync(&s->p, bytes, c->stream)", cudaGetErrorString(e), __FILE__,
                  __LINE__);
    s->bytes = bytes;
    return 0;
}

/* Reports and clears the pending allocation failure. */
static int oom_take(struct cuda_ctx *c, struct kiln_error *err) {
    if (!c->oom.bytes) return 0;
    char size[48];
    if (c->oom.bytes >= (size_t)1 << 20)
        snprintf(size, sizeof size, "%.2f MiB", (double)c->oom.bytes / (1 << 20));
    else
        snprintf(size, sizeof size, "%zu bytes", c->oom.bytes);
    double gib = 1024.0 * 1024 * 1024;
    kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY,
                "device out of memory: %s for %s (%.2f GiB in use of %.2f GiB)", size, c->oom.what,
                (double)(c->oom.total_bytes - c->oom.free_bytes) / gib,
                (double)c->oom.total_bytes / gib);
    memset(&c->oom, 0, sizeof c->oom);
    return -1;
}

/* backend_ops.step_status. After a failure the grow-on-demand scratch goes
 * back to the device (the next step reserves what it needs, so a smaller
 * batch fits where this one did not) and recorded graphs go stale. */
static int cuda_step_status(void *ctx, struct kiln_error *err) {
    struct cuda_ctx *c = ctx;
    if (!c->oom.bytes) return 0;
    CUDA_ASSERT(!c->capturing);
    CUDA_ASSERT(!c->on_side);
    struct cuda_scratch *s[] = {&c->act16, &c->act16_side, &c->moe_dev, &c->fp8w, &c->fp8w_side};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        if (s[i]->p) CUDA_CHECK(cudaFreeAsync(s[i]->p, c->stream));
        s[i]->p = NULL;
        s[i]->bytes = 0;
    }
    c->scratch_gen++;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess)
        (void)cudaMemPoolTrimTo(pool, 0);
    (void)cudaGetLastError();
    return oom_take(c, err);
}

static void *cuda_alloc(void *ctx, size_t bytes) {
    struct cuda_ctx *c = ctx;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is reported by NULL, not sticky */
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    return p;
}

static void cuda_free_op(void *ctx, void *p) {
    struct cuda_ctx *c = ctx;
    if (!p) return;
    /* Work still queued may use p: cudaFree waits for the device anyway,
     * but be explicit about the stream it belongs to. */
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaFree(p));
}

static void cuda_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = ctx;
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_download(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = ctx;
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_weight_release(void *ctx, const void *dev) { cuda_weight_free(ctx, dev); }

static void cuda_synchronize(void *ctx) {
    struct cuda_ctx *c = ctx;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static int cuda_reserve(void *ctx, long max_tokens, long max_context, int max_heads,
                        struct kiln_error *err) {
    struct cuda_ctx *c = ctx;
    if (max_tokens > c->max_tokens) c->max_tokens = max_tokens;
    if (max_context > c->max_context) c->max_context = max_context;
    if (max_heads > c->max_heads) c->max_heads = max_heads;
    size_t attn = cuda_attention_scratch_bytes(c);
    if (attn > c->attn.bytes) {
        if (c->attn.p) CUDA_CHECK(cudaFreeAsync(c->attn.p, c->stream));
        c->scratch_gen++;
        c->attn.p = NULL;
        c->attn.bytes = 0;
        if (cudaMallocAsync(&c->attn.p, attn, c->stream) != cudaSuccess) {
            (void)cudaGetLastError();
            c->attn.p = NULL;
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY,
                               "cuda backend: out of device memory for %zu bytes of attention "
                               "scratch", attn);
        }
        c->attn.bytes = attn;
        /* the decode kernel's arrival counters start at zero */
        CUDA_CHECK(cudaMemsetAsync(c->attn.p, 0, CUDA_ATTN_COUNTER_BYTES, c->stream));
    }
    if (cuda_sample_reserve(c)) return oom_take(c, err);
    return 0;
}

static void *cuda_host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *ctx, void *p) {
    struct cuda_ctx *c = ctx;
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* a copy from p may be in flight */
    CUDA_CHECK(cudaFreeHost(p));
}

/* A recorded graph: its executable form and the scratch generation it saw. */
struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned gen;
};

static void cuda_graph_begin(void *ctx) {
    struct cuda_ctx *c = ctx;
    CUDA_ASSERT(!c->capturing);
    /* Thread-local: other threads' CUDA calls neither break the capture nor
     * get recorded. */
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
}

static void *cuda_graph_end(void *ctx) {
    struct cuda_ctx *c = ctx;
    CUDA_ASSERT(c->capturing);
    c->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess || !g) {
        (void)cudaGetLastError();
        return NULL;
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    CUDA_CHECK(cudaGraphDestroy(g));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    /* Upload now so the first replay does not pay for it (the device
     * memory it takes may not be there: a graph that failed to record). */
    e = cudaGraphUpload(x, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        CUDA_CHECK(cudaGraphExecDestroy(x));
        return NULL;
    }
    CUDA_CHECK(e);
    struct cuda_graph *cg = xmalloc(sizeof *cg);
    cg->exec = x;
    cg->gen = c->scratch_gen;
    return cg;
}

static int cuda_graph_launch(void *ctx, void *graph) {
    struct cuda_ctx *c = ctx;
    struct cuda_graph *cg = graph;
    if (cg->gen != c->scratch_gen) return -1;
    CUDA_CHECK(cudaGraphLaunch(cg->exec, c->stream));
    return 0;
}

static void cuda_graph_destroy(void *ctx, void *graph) {
    struct cuda_ctx *c = ctx;
    struct cuda_graph *cg = graph;
    if (!cg) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* a replay may be running */
    CUDA_CHECK(cudaGraphExecDestroy(cg->exec));
    free(cg);
}

static void cuda_destroy(void *ctx) {
    struct cuda_ctx *c = ctx;
    if (!c) return;
    if (c->stream) {
        (void)cudaStreamSynchronize(c->stream);
        struct cuda_scratch *s[] = {&c->act16, &c->act16_side, &c->attn, &c->moe_dev, &c->sample_part,
                                    &c->fp8w, &c->fp8w_side};
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
            if (s[i]->p) (void)cudaFreeAsync(s[i]->p, c->stream);
        (void)cudaStreamSynchronize(c->stream);
    }
    cuda_uploader_destroy(c);
    cuda_moe_release(c);
    cuda_matmul_release(c);
#ifdef KILN_CUDA_HOPPER
    cuda_wgmma_release(c);
    cuda_moe_wgmma_release(c);
#endif
    if (c->cublas) cublasDestroy(c->cublas);
    if (c->cublas_ws) cudaFree(c->cublas_ws);
    if (c->side_stream) cudaStreamDestroy(c->side_stream);
    if (c->side_fork) cudaEventDestroy(c->side_fork);
    if (c->side_done) cudaEventDestroy(c->side_done);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->moe_host_ids);
    free(c->moe_host_list);
    free(c);
}

/* backend_ops.side_begin / side_end / side_join: a fork and a join through
 * two events, which a graph being recorded takes in as two branches. The
 * cuBLAS handle follows the current stream; act16 and fp8w swap with the
 * side's own so that the two streams' scratch never shares memory. */
static void side_switch(struct cuda_ctx *c, int on) {
    struct cuda_scratch t = c->act16;
    c->act16 = c->act16_side, c->act16_side = t;
    t = c->fp8w;
    c->fp8w = c->fp8w_side, c->fp8w_side = t;
    c->on_side = on;
    c->stream = on ? c->side_stream : c->main_stream;
    CUBLAS_CHECK(cublasSetStream(c->cublas, c->stream));
}

static int cuda_side_begin(void *ctx, long n) {
    struct cuda_ctx *c = ctx;
    if (!c->side_stream || n > c->dual_max || c->on_side) return 0;
    CUDA_CHECK(cudaEventRecord(c->side_fork, c->main_stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->side_stream, c->side_fork, 0));
    side_switch(c, 1);
    return 1;
}

static void cuda_side_end(void *ctx) {
    struct cuda_ctx *c = ctx;
    CUDA_ASSERT(c->on_side);
    CUDA_CHECK(cudaEventRecord(c->side_done, c->side_stream));
    side_switch(c, 0);
}

static void cuda_side_join(void *ctx) {
    struct cuda_ctx *c = ctx;
    CUDA_ASSERT(!c->on_side);
    CUDA_CHECK(cudaStreamWaitEvent(c->main_stream, c->side_done, 0));
}

static enum dtype cuda_kv_dtype(void *ctx) {
    const struct cuda_ctx *c = ctx;
    return c->kv_fp8 ? DTYPE_F8_E4M3 : c->kv_bf16 ? DTYPE_BF16 : DTYPE_F32;
}

static void cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    struct cuda_ctx *c = ctx;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .sliding_window = 1,
    .attention_sinks = 1,
    .moe_bias_act = 1, /* cuda_moe.cu: every path, the epilogues of cuda_moe_act.cuh */
    .mxfp4_experts = 1, /* cuda_moe_quant.cu */
    .fp8_weights = 1,
    .destroy = cuda_destroy,
    .reserve = cuda_reserve,
    .alloc = cuda_alloc,
    .free = cuda_free_op,
    .upload = cuda_upload,
    .download = cuda_download,
    .weight_upload = cuda_weight_upload,
    .weight_release = cuda_weight_release,
    .synchronize = cuda_synchronize,
    .embed = cuda_op_embed,
    .embed_shard = cuda_op_embed_shard,
    .matmul = cuda_op_matmul,
    .matmul_heads = cuda_op_matmul_heads,
    .rmsnorm = cuda_op_rmsnorm,
    .add_rmsnorm = cuda_op_add_rmsnorm,
    .rope = cuda_op_rope,
    .silu_mul = cuda_op_silu_mul,
    .gated_add = cuda_op_gated_add,
    .gelu_tanh_mul = cuda_op_gelu_tanh_mul,
    .scale = cuda_op_scale,
    .add = cuda_op_add,
    .gather_rows = cuda_op_gather_rows,
    .copy_rows = cuda_op_copy_rows,
    .kv_store = cuda_op_kv_store,
    .attention = cuda_op_attention,
    .kv_gather = cuda_op_kv_gather,
    .mla_kv_expand = cuda_op_mla_kv_expand,
    .moe_route = cuda_op_moe_route,
    .moe_ffn = cuda_op_moe_ffn,
    .moe_ffn_graphable = cuda_op_moe_ffn_graphable,
    .moe_experts_refuse = cuda_op_moe_experts_refuse,
    .side_begin = cuda_side_begin,
    .side_end = cuda_side_end,
    .side_join = cuda_side_join,
    .comm_id = cuda_comm_id,
    .comm_init = cuda_comm_init,
    .norm_reduce_ok = cuda_op_norm_reduce_ok,
    .reduce_add_rmsnorm = cuda_op_reduce_add_rmsnorm,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .qk_rope_store = cuda_op_qk_rope_store,
    .kv_dtype = cuda_kv_dtype,
    .mem_info = cuda_mem_info,
    .weight_upload_cat = cuda_weight_upload_cat,
    .weight_upload_later = cuda_weight_upload_later,
    .weights_finish = cuda_weights_finish,
    .sample = cuda_op_sample,
    .norm_matmul = cuda_op_norm_matmul,
    .norm_matmul_rope = cuda_op_norm_matmul_rope,
    .norm_swiglu_mlp = cuda_op_norm_swiglu_mlp,
    .attention_matmul = cuda_op_attention_matmul,
    .step_status = cuda_step_status,
    .workspace_bytes = cuda_op_workspace_bytes,
    .weight_dummy = cuda_op_weight_dummy,
};

int cuda_backend_create(struct backend *be, const struct backend_options *opt,
                        struct kiln_error *err) {
    int count = 0, dev = opt ? opt->device : 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        if (e == cudaErrorInsufficientDriver)
            return kiln_errorf(err, "no CUDA device found (the NVIDIA driver is missing or older "
                                    "than this CUDA runtime)");
        return kiln_errorf(err, "no CUDA device found%s%s", e != cudaSuccess ? ": " : "",
                           e != cudaSuccess ? cudaGetErrorString(e) : "");
    }
    if (dev < 0 || dev >= count)
        return kiln_errorf(err, "CUDA device %d does not exist (found %d)", dev, count);
    if ((e = cudaSetDevice(dev)) != cudaSuccess) {
        (void)cudaGetLastError();
        return kiln_errorf(err, "cannot use CUDA device %d: %s", dev, cudaGetErrorString(e));
    }
    struct cuda_ctx *c = xcalloc(1, sizeof *c);
    c->device = dev;
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc(&c->cublas_ws, CUBLAS_WORKSPACE_BYTES)) != cudaSuccess) {
        (void)cudaGetLastError();
        kiln_errorf(err, "cannot set up CUDA device %d: %s", dev, cudaGetErrorString(e));
        goto fail;
    }
    c->n_sm = prop.multiProcessorCount;
    if (prop.major < 8) {
        kiln_errorf(err, "CUDA device %d (%s) has compute capability %d.%d; kiln needs 8.0 or newer",
                    dev, prop.name, prop.major, prop.minor);
        goto fail;
    }
    cublasStatus_t s = cublasCreate(&c->cublas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        c->cublas = NULL;
        kiln_errorf(err, "cannot start cuBLAS: %s", cublasGetStatusString(s));
        goto fail;
    }
    CUBLAS_CHECK(cublasSetStream(c->cublas, c->stream));
    CUBLAS_CHECK(cublasSetWorkspace(c->cublas, c->cublas_ws, CUBLAS_WORKSPACE_BYTES));
    c->cublas_ws_bytes = CUBLAS_WORKSPACE_BYTES;
    /* Plain fp32 products stay fp32 (no TF32): the F32-weight path is the
     * accurate one. */
    CUBLAS_CHECK(cublasSetMathMode(c->cublas, CUBLAS_DEFAULT_MATH));
    /* The knobs (base/knob.h, docs/knobs.md) are read here, once per
     * backend, into the context; kernels never read the environment. */
    /* The GEMV wins only up to 2 rows (the knob's default): on an H100 a
     * decode step of 4 or 8 rows took 8.99 / 13.63 ms through it against
     * 7.32 / 7.55 ms through cuBLAS (Llama-3.1-8B; Qwen3-0.6B 1.95 / 3.04
     * against 1.70 / 1.84; bench_warmup, docs/cuda.md). */
    c->gemv_max_rows = (int)knob_int(KNOB_CUDA_GEMV_MAX_ROWS);
    c->split_act = knob_enum(KNOB_CUDA_MATMUL) == 1; /* bf16x2 */
    static const int attn_impls[] = {CUDA_ATTN_AUTO, CUDA_ATTN_SCALAR, CUDA_ATTN_SPLIT};
    c->attn_impl = attn_impls[knob_enum(KNOB_CUDA_ATTN)];
    c->deterministic = opt ? opt->deterministic : 0;
    /* KV element type: bf16 halves the cache's bytes (decode reads all of
     * it every step); fp32 for the fp32-grade bf16x2 mode or on request. */
    int kv = knob_enum(KNOB_CUDA_KV); /* auto, bf16, f32 */
    c->kv_bf16 = kv == 0 ? !c->split_act : kv == 1;
    /* --kv-cache-dtype fp8_e4m3: e4m3 elements, whatever KILN_CUDA_KV says */
    c->kv_fp8 = opt && opt->kv_fp8;
    if (c->kv_fp8) c->kv_bf16 = 0;
    /* The product path's knobs (docs/cuda-decode.md): programmatic
     * dependent launch (Hopper on), the fused norm / SwiGLU handoffs, the
     * GEMV's K split, cuBLASLt. */
    c->pdl = prop.major >= 9 && knob_bool(KNOB_CUDA_PDL);
    c->fuse = knob_bool(KNOB_CUDA_FUSE);
    static const int gemv_ks[] = {0, 1, 2, 4}, ad_warps[] = {0, 2, 4};
    c->gemv_ks = gemv_ks[knob_enum(KNOB_CUDA_GEMV_KS)];
    c->ad_warps = ad_warps[knob_enum(KNOB_CUDA_AD_W)];
    c->use_lt = knob_bool(KNOB_CUDA_LT);
    c->fp8_lt = knob_bool(KNOB_CUDA_FP8_LT);
    c->upload_delay_ms = knob_int(KNOB_CUDA_UPLOAD_DELAY_MS);
    /* prefill attention kernel (KILN_CUDA_FA, docs/cuda.md): the wgmma one
     * on Hopper (sm_90a code runs on compute capability 9.0 only) */
#ifdef KILN_CUDA_HOPPER
    int hopper = prop.major == 9 && prop.minor == 0;
#else
    int hopper = 0;
#endif
    int fa = knob_enum(KNOB_CUDA_FA); /* auto, fa2, fa3 */
    if (fa == 2 && !hopper) {
        kiln_errorf(err, "KILN_CUDA_FA=fa3: needs an sm_90a build on a compute capability 9.0 GPU");
        goto fail;
    }
    c->fa_hopper = fa == 0 ? hopper : fa == 2;
    cuda_matmul_init(c);
#ifdef KILN_CUDA_HOPPER
    /* small-M wgmma + TMA product (hopper/gemm_wgmma.cu, docs/cuda-decode.md) for
     * 1..64 rows on compute capability 9.0, weights of at least 40 MiB
     * (KILN_CUDA_WGMMA_MIN_MB) and the projection after the decode
     * attention from 16 MiB: on by default there (Llama-3.1-8B at 64
     * sequences: 6.6 ms a step against 7.2 with it off); KILN_CUDA_WGMMA=0
     * turns it off */
    c->wgmma_min_bytes = knob_int(KNOB_CUDA_WGMMA_MIN_MB) << 20;
    c->wgmma = knob_bool(KNOB_CUDA_WGMMA) && cuda_wgmma_init(c);
    c->wgmma_glu = knob_bool(KNOB_CUDA_WGMMA_GLU);
    c->wgmma_rope = knob_bool(KNOB_CUDA_WGMMA_ROPE);
    c->wgmma_fp8 = knob_bool(KNOB_CUDA_WGMMA_FP8);
    /* the MoE expert products of long prompts on wgmma (hopper/moe_wgmma.cu) */
    c->moe_wgmma = knob_bool(KNOB_CUDA_MOE_WGMMA) && cuda_moe_wgmma_init(c);
#endif
    /* KILN_CUDA_MOE=device (the default): MoE steps of any size (up to
     * KILN_CUDA_MOE_MAX tokens) sort their rows on the device and MoE
     * models decode from graphs (docs/cuda.md, "Mixture of experts").
     * Measured faster than the host sort at every size tried on an H100
     * (Qwen3-30B-A3B and DeepSeek-V2-Lite, decode at 1 and 64 sequences,
     * prefill of 512 and 8192 tokens: docs/perf-models.md). */
    c->moe_device_max = knob_enum(KNOB_CUDA_MOE) == 1 ? (int)knob_int(KNOB_CUDA_MOE_MAX) : 0;
    /* Shared experts beside the routed ones (SGLang's dual stream, the
     * same threshold): at small steps the routed chain (router, top-k,
     * sort, grouped products, combine) is latency-bound and the shared
     * MLP's products fill the gaps; docs/perf-models.md measures it. */
    c->main_stream = c->stream;
    c->dual_max = knob_int(KNOB_CUDA_DUAL_STREAM);
    if (c->dual_max > 0 &&
        ((e = cudaStreamCreateWithFlags(&c->side_stream, cudaStreamNonBlocking)) != cudaSuccess ||
         (e = cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming)) != cudaSuccess ||
         (e = cudaEventCreateWithFlags(&c->side_done, cudaEventDisableTiming)) != cudaSuccess)) {
        (void)cudaGetLastError();
        kiln_errorf(err, "cannot set up the second CUDA stream on device %d: %s", dev, cudaGetErrorString(e));
        goto fail;
    }
    be->ops = &cuda_ops;
    be->ctx = c;
    if (knob_bool(KNOB_CUDA_PROFILE)) cuda_profile_install(be);
    return 0;
fail:
    cuda_destroy(c);
    return -1;
}
