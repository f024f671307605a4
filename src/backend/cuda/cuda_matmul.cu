/* cuda_matmul.cu — y[n][rows] = x[n][cols] · Wᵀ (+ bias) with W [rows][cols]
 * in its checkpoint dtype, and the fused norm + product operations.
 *
 * Paths:
 *  - few rows (decode: n ≤ gemv_max_rows): the GEMV kernel (cuda_gemv.cu),
 *    fp32 activations, weight-bandwidth bound.
 *  - otherwise cuBLAS on a 16-bit copy of the activations in the weights'
 *    type (bf16 or f16) with fp32 accumulation (CUBLAS_COMPUTE_32F).
 *    The copy comes from the kernel that produced the activations when the
 *    model calls a fused operation (norm_matmul: the norm kernel writes it;
 *    norm_swiglu_mlp: the norm for gate|up, the SwiGLU kernel for down),
 *    else from a conversion pass (to16). The product goes through
 *    cuBLASLt (cached plan per shape; the bias in its epilogue), or
 *    cublasGemmEx + a bias kernel with KILN_CUDA_LT=0. F32 weights take a plain
 *    fp32 GEMM (no TF32).
 *  - KILN_CUDA_MATMUL=bf16x2 (struct cuda_ctx.split_act): the activations
 *    are split into hi = bf16(x) and lo = bf16(x − hi), and y = W·hi + W·lo
 *    by two products accumulating into y. W is exact in bf16, so only lo's
 *    rounding remains (2^-18 relative): fp32-grade results at twice the
 *    tensor-core work. For checking against fp32 references; the fused
 *    operations run their plain sequence in this mode.
 *  - --deterministic: every product through cuda_matmul_det; the fused
 *    operations run their plain sequence (the same bits as the model's
 *    unfused calls).
 *  - FP8 (e4m3, block-scaled) weights: cuda_fp8.cu's GEMV, tile kernel
 *    (also under --deterministic), cuBLASLt's block-scaled FP8 or bf16
 *    chunks of dequantized rows into the 16-bit path (fp8_matmul); the fused operations run their plain
 *    sequence on them (the 16-bit handoffs need 16-bit weights), except
 *    the SwiGLU MLP of decode rows on the FP8 GEMV.
 * Row-major y = x·Wᵀ is column-major Yᵀ = W'ᵀ·Xᵀ where W' is W read as a
 * column-major [cols][rows] matrix: op(A) = T on W (lda = cols), op(B) = N
 * on x (ldb = its row stride), C = y (ldc = ldy).
 *
 * Every kernel here is launched with programmatic dependent launch
 * (cuda_pdl.cuh): it waits for its inputs with pdl_wait. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "backend/cuda/cuda_pdl.cuh"

enum { LT_PLANS = 256 };

/* A cuBLASLt product shape with its descriptors and chosen algorithm. The
 * key holds every argument the heuristic sees, the pointers' alignments
 * included (an algorithm chosen for 256-byte aligned operands may need
 * them). */
struct lt_plan {
    long rows, cols, n, ldb, ldy;
    int dtype, has_bias, beta1;
    unsigned align;
    int ok; /* 0: no cuBLASLt algorithm; cublasGemmEx instead */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

struct lt_state {
    cublasLtHandle_t h;
    int n_plans;
    struct lt_plan plans[LT_PLANS];
};

static unsigned align_class(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned k = 0;
    while (k < 8 && !(a & ((uintptr_t)1 << k))) k++;
    return k; /* log2 of the alignment, capped at 256 bytes */
}

extern "C" void cuda_matmul_init(struct cuda_ctx *c) {
    if (!c->use_lt) return;
    struct lt_state *s = (struct lt_state *)calloc(1, sizeof *s);
    CUDA_ASSERT(s);
    CUBLAS_CHECK(cublasLtCreate(&s->h));
    c->lt = s;
}

extern "C" void cuda_matmul_release(struct cuda_ctx *c) {
    struct lt_state *s = (struct lt_state *)c->lt;
    if (!s) return;
    for (int i = 0; i < s->n_plans; i++) {
        struct lt_plan *p = &s->plans[i];
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    }
    cublasLtDestroy(s->h);
    free(s);
    c->lt = NULL;
}

static cublasStatus_t lt_run(struct cuda_ctx *c, struct lt_state *s, const struct lt_plan *p,
                             const cublasLtMatmulAlgo_t *algo, float *y, const void *x16,
                             const void *w, float beta) {
    const float alpha = 1.0f;
    return cublasLtMatmul(s->h, p->desc, &alpha, w, p->a, x16, p->b, &beta, y, p->d, y, p->d, algo,
                          c->cublas_ws, c->cublas_ws_bytes, c->stream);
}

/* The plan for this product: found, or made. NULL when the cache is full. */
static struct lt_plan *lt_plan_get(struct cuda_ctx *c, float *y, long ldy, const void *x16,
                                   long ldb, const struct backend_weight *w, const float *bias,
                                   long n, float beta) {
    struct lt_state *s = (struct lt_state *)c->lt;
    unsigned align = align_class(w->data) | align_class(x16) << 4 | align_class(y) << 8 |
                     (bias ? align_class(bias) : 0) << 12;
    int beta1 = beta != 0.0f;
    for (int i = 0; i < s->n_plans; i++) {
        struct lt_plan *p = &s->plans[i];
        if (p->rows == w->rows && p->cols == w->cols && p->n == n && p->ldb == ldb &&
            p->ldy == ldy && p->dtype == (int)w->dtype && p->has_bias == (bias != NULL) &&
            p->beta1 == beta1 && p->align == align)
            return p;
    }
    if (s->n_plans == LT_PLANS) return NULL;
    struct lt_plan *p = &s->plans[s->n_plans++];
    memset(p, 0, sizeof *p);
    p->rows = w->rows, p->cols = w->cols, p->n = n, p->ldb = ldb, p->ldy = ldy;
    p->dtype = (int)w->dtype, p->has_bias = bias != NULL, p->beta1 = beta1, p->align = align;
    cudaDataType_t t = w->dtype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_32F;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                    sizeof bt));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof bias));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, (uint64_t)w->cols, (uint64_t)w->rows, w->cols));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, (uint64_t)w->cols, (uint64_t)n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)w->rows, (uint64_t)n, ldy));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->cublas_ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws));
    /* the heuristic's first algorithm: timing candidates on the operands
     * (which stay in L2) picked slower ones for some shapes
     * (docs/cuda-decode.md) */
    cublasLtMatmulHeuristicResult_t res[1];
    int cnt = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s->h, p->desc, p->a, p->b, p->d, p->d, pref,
                                                       1, res, &cnt);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || cnt < 1) {
        p->ok = 0;
        return p;
    }
    p->ok = 1;
    p->algo = res[0].algo;
    return p;
}

/* y[n][rows] (stride ldy) += bias[rows] */
static __global__ void bias_add_kernel(float *y, long ldy, const float *__restrict__ bias, long n,
                                       long rows) {
    pdl_trigger();
    pdl_wait();
    long total = n * rows;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / rows, k = i % rows;
        y[r * ldy + k] += bias[k];
    }
}

static void bias_add(struct cuda_ctx *c, float *y, long ldy, const float *bias, long n, long rows) {
    pdl_launch(c, bias_add_kernel, dim3(grid_for(n * rows, 256)), dim3(256), 0, y, ldy, bias, n,
               rows);
}

/* y[n][rows] (stride ldy) = beta·y + bias + x16 · wᵀ, x16 [n][cols] (row
 * stride ldb) in w's 16-bit type; bias only with beta = 0 or on the last of
 * several accumulating products. */
static void product16(struct cuda_ctx *c, float *y, long ldy, const void *x16, long ldb,
                      const struct backend_weight *w, const float *bias, long n, float beta) {
    long rows = w->rows, cols = w->cols;
#ifdef KILN_CUDA_HOPPER
    if (beta == 0.0f && cuda_wgmma_ok(c, w, x16, ldb, n))
        return cuda_wgmma(c, y, ldy, x16, ldb, w, bias, n);
#endif
    if (c->lt) {
        struct lt_plan *p = lt_plan_get(c, y, ldy, x16, ldb, w, bias, n, beta);
        if (p && p->ok) {
            struct lt_state *s = (struct lt_state *)c->lt;
            if (bias)
                CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                            &bias, sizeof bias));
            CUBLAS_CHECK(lt_run(c, s, p, &p->algo, y, x16, w->data, beta));
            return;
        }
    }
    const float alpha = 1.0f;
    cudaDataType_t t = w->dtype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    CUBLAS_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols,
                              &alpha, w->data, t, (int)cols, x16, t, (int)ldb, &beta, y, CUDA_R_32F,
                              (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) bias_add(c, y, ldy, bias, n, rows);
}

/* xb[n][cols] = x[n][cols] (stride ldx), rounded to nearest in T */
template <typename T>
static __global__ void to16_kernel(T *__restrict__ xb, const float *x, long ldx, long n, long cols) {
    pdl_trigger();
    pdl_wait();
    long total = n * cols;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / cols, k = i % cols;
        float v = x[r * ldx + k];
        xb[i] = T(v);
    }
}

/* xb[0][n][cols] = T(x), xb[1][n][cols] = T(x − T(x)) */
template <typename T>
static __global__ void split16_kernel(T *__restrict__ xb, const float *x, long ldx, long n,
                                      long cols) {
    pdl_trigger();
    pdl_wait();
    long total = n * cols;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = i / cols, k = i % cols;
        float v = x[r * ldx + k];
        T hi = T(v);
        xb[i] = hi;
        xb[total + i] = T(v - (float)hi);
    }
}

/* The activations' 16-bit copy (parts = 2: hi and lo halves) in act16. */
static void *to16(struct cuda_ctx *c, const float *x, long ldx, long n, long cols, enum dtype dt,
                  int parts) {
    size_t elems = (size_t)n * (size_t)cols;
    if (cuda_scratch_reserve(c, &c->act16, elems * 2 * (size_t)parts, n)) return NULL;
    dim3 grid(grid_for(n * cols, 256)), block(256);
    if (dt == DTYPE_BF16) {
        __nv_bfloat16 *xb = (__nv_bfloat16 *)c->act16.p;
        if (parts == 2) pdl_launch(c, split16_kernel<__nv_bfloat16>, grid, block, 0, xb, x, ldx, n, cols);
        else pdl_launch(c, to16_kernel<__nv_bfloat16>, grid, block, 0, xb, x, ldx, n, cols);
    } else {
        __half *xb = (__half *)c->act16.p;
        if (parts == 2) pdl_launch(c, split16_kernel<__half>, grid, block, 0, xb, x, ldx, n, cols);
        else pdl_launch(c, to16_kernel<__half>, grid, block, 0, xb, x, ldx, n, cols);
    }
    return c->act16.p;
}

extern "C" void *cuda_act16(struct cuda_ctx *c, const float *x, long ldx, long n, long cols, enum dtype dt) {
    return to16(c, x, ldx, n, cols, dt, 1);
}


/* The cuBLASLt plan of an FP8 product with block-scaled operands: A = W
 * (e4m3, one fp32 scale per 128 × 128 block: BLK128x128_32F, the
 * checkpoint's layout), B = the activations (e4m3, one fp32 scale per row
 * and 128 columns: VEC128_32F, cuda_fp8_quant_act's layout), D = y fp32.
 * ok = 0 where this cuBLASLt or GPU has no algorithm for it (block scaling
 * needs CUDA 12.9+ and compute capability 9.0). Plans share the cache of
 * the 16-bit ones, keyed with dtype F8_E4M3. */
static struct lt_plan *lt_fp8_plan_get(struct cuda_ctx *c, float *y, long ldy,
                                       const struct backend_weight *w, long n) {
    struct lt_state *s = (struct lt_state *)c->lt;
    unsigned align = align_class(w->data) | align_class(y) << 8;
    for (int i = 0; i < s->n_plans; i++) {
        struct lt_plan *p = &s->plans[i];
        if (p->dtype == (int)DTYPE_F8_E4M3 && p->rows == w->rows && p->cols == w->cols && p->n == n &&
            p->ldy == ldy && p->align == align)
            return p;
    }
    if (s->n_plans == LT_PLANS) return NULL;
    struct lt_plan *p = &s->plans[s->n_plans++];
    memset(p, 0, sizeof *p);
    p->rows = w->rows, p->cols = w->cols, p->n = n, p->ldb = w->cols, p->ldy = ldy;
    p->dtype = (int)DTYPE_F8_E4M3, p->align = align;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, (uint64_t)w->cols, (uint64_t)w->rows, w->cols));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)w->cols, (uint64_t)n, w->cols));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)w->rows, (uint64_t)n, ldy));
    /* a runtime cuBLAS without block scaling refuses the modes: no plan */
    if (cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm) !=
            CUBLAS_STATUS_SUCCESS)
        return p;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->cublas_ws_bytes;
    uint32_t al_a = 1u << align_class(w->data), al_b = 256, al_d = 1u << align_class(y);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &al_d, sizeof al_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t res[1];
    int cnt = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s->h, p->desc, p->a, p->b, p->d, p->d, pref, 1,
                                                       res, &cnt);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && cnt >= 1) {
        p->ok = 1;
        p->algo = res[0].algo;
    }
    return p;
}

/* The FP8 product on cuBLASLt's block-scaled FP8: the activations
 * quantized per row and 128 columns into act16, then one cublasLtMatmul,
 * the bias after it. 0 where it does not apply (no plan: the caller takes
 * the bf16 path). */
static int fp8_lt(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                  const struct backend_weight *w, const float *bias, long n) {
    /* K in whole groups of 128, and whole groups of 4 scale columns: the
     * block scales' row stride is then 16 bytes aligned, as cuBLASLt reads
     * them (torch pads it to 4 for the same reason) */
    if (!c->lt || !c->fp8_lt || c->deterministic || w->block_rows != 128 || w->block_cols != 128 ||
        w->cols % 512 || (uintptr_t)w->data % 16 || (uintptr_t)y % 16 || ldy % 4)
        return 0;
    struct lt_plan *p = lt_fp8_plan_get(c, y, ldy, w, n);
    if (!p || !p->ok) return 0;
    size_t qbytes = ((size_t)n * (size_t)w->cols + 255) & ~(size_t)255;
    if (cuda_scratch_reserve(c, &c->act16, qbytes + (size_t)n * (size_t)(w->cols / 128) * 4, n)) return 1;
    void *xq = c->act16.p;
    float *xs = (float *)((char *)c->act16.p + qbytes);
    cuda_fp8_quant_act(c, xq, xs, x, ldx, n, w->cols);
    struct lt_state *s = (struct lt_state *)c->lt;
    const void *sa = w->scale, *sb = xs;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(s->h, p->desc, &alpha, w->data, p->a, xq, p->b, &beta, y, p->d, y, p->d,
                                &p->algo, c->cublas_ws, c->cublas_ws_bytes, c->stream));
    if (bias) bias_add(c, y, ldy, bias, n, w->rows);
    c->fp8_lt_calls++;
    return 1;
}

/* Whether an FP8 product of n rows takes the e4m3 wgmma kernels: every
 * row count past the GEMV's, for a weight they take. */
static int wgmma8(const struct cuda_ctx *c, const struct backend_weight *w, long n) {
#ifdef KILN_CUDA_HOPPER
    return !cuda_fp8_gemv_ok(c, w, n) && cuda_wgmma_fp8_ok(c, w, n);
#else
    (void)c, (void)w, (void)n;
    return 0;
#endif
}

/* An FP8 weight's product: the GEMV for decode rows, the tile kernel for
 * small batches and --deterministic, else cuBLASLt's block-scaled FP8
 * (fp8_lt) or, where it has no plan, chunks of weight rows dequantized to
 * bf16 and multiplied on the 16-bit path (the activations rounded to bf16
 * once). */
static void fp8_matmul(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                       const struct backend_weight *w, const float *bias, long n) {
    CUDA_ASSERT_MSG(w->scale && w->block_rows > 0 && w->block_cols > 0,
                    "matmul: an FP8 weight without its block scales");
    if (cuda_fp8_gemv_ok(c, w, n)) return cuda_fp8_gemv(c, y, ldy, x, ldx, w, bias, n, 0);
    if (c->split_act && cuda_fp8_gemv_ok(c, w, 1)) {
        /* the fp32-grade mode (KILN_CUDA_MATMUL=bf16x2, for verification):
         * fp32 activations at every size, the GEMV over groups of rows */
        for (long i = 0; i < n; i += CUDA_FP8_GEMV_ROWS) {
            long m = n - i < (long)CUDA_FP8_GEMV_ROWS ? n - i : (long)CUDA_FP8_GEMV_ROWS;
            cuda_fp8_gemv(c, y + i * ldy, ldy, x + i * ldx, ldx, w, bias, m, 0);
        }
        return;
    }
#ifdef KILN_CUDA_HOPPER
    if (wgmma8(c, w, n)) {
        /* Hopper: the activations per row and 128 columns in e4m3, then
         * the e4m3 wgmma product with the block scales in its K loop */
        if (cuda_scratch_reserve(c, &c->act16, q8_bytes(n, w->cols), n)) return;
        float *xs = q8_scales(c->act16.p, n, w->cols);
        cuda_fp8_quant_act(c, c->act16.p, xs, x, ldx, n, w->cols);
        return cuda_wgmma_fp8(c, y, ldy, c->act16.p, xs, w, bias, n);
    }
#endif
    if (c->deterministic || n <= CUDA_FP8_TILE_ROWS || !cuda_fp8_vec_ok(w))
        return cuda_fp8_tiles(c, y, ldy, 0, x, ldx, 0, w, 0, bias, 1, n);
    if (fp8_lt(c, y, ldy, x, ldx, w, bias, n)) return;
    long rows = w->rows, cols = w->cols;
    long chunk = (long)(CUDA_FP8_SCRATCH_BYTES / (size_t)(2 * cols)) / 128 * 128;
    if (chunk < 128) chunk = 128;
    if (chunk > rows) chunk = rows;
    const void *xb = to16(c, x, ldx, n, cols, DTYPE_BF16, 1);
    if (!xb) return;
    if (cuda_scratch_reserve(c, &c->fp8w, (size_t)chunk * (size_t)cols * 2, n)) return;
    for (long r0 = 0; r0 < rows; r0 += chunk) {
        long r1 = r0 + chunk < rows ? r0 + chunk : rows;
        cuda_fp8_dequant(c, c->fp8w.p, w, r0, r1);
        struct backend_weight part = {c->fp8w.p, DTYPE_BF16, r1 - r0, cols, NULL, 0, 0, NULL};
        product16(c, y + r0, ldy, xb, cols, &part, bias ? bias + r0 : NULL, n, 0.0f);
    }
}

extern "C" void cuda_op_matmul(void *ctx, float *y, long ldy, const float *x, long ldx,
                               const struct backend_weight *w, const float *bias, long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    long rows = w->rows, cols = w->cols;
    if (n <= 0 || rows <= 0) return;
    CUDA_ASSERT(rows <= INT32_MAX && cols <= INT32_MAX && n <= INT32_MAX && ldx >= cols &&
                ldy >= rows);
    if (w->dtype == DTYPE_F8_E4M3) return fp8_matmul(c, y, ldy, x, ldx, w, bias, n);
    if (c->deterministic) return cuda_matmul_det(c, y, ldy, x, ldx, w, bias, n);
    int w16 = w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16;
    CUDA_ASSERT_MSG(w16 || w->dtype == DTYPE_F32, "matmul: weights must be BF16, F16 or F32");

    if (cuda_gemv_ok(c, w, n)) {
        cuda_gemv(c, y, ldy, x, ldx, w, bias, n, 0);
        return;
    }
    if (w16) {
        int parts = c->split_act ? 2 : 1;
        const char *xb = (const char *)to16(c, x, ldx, n, cols, w->dtype, parts);
        if (!xb) return;
        size_t bytes = (size_t)n * (size_t)cols * 2;
        for (int part = 0; part < parts; part++)
            product16(c, y, ldy, xb + bytes * (size_t)part, cols, w,
                      part == parts - 1 ? bias : NULL, n, part ? 1.0f : 0.0f);
        return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols,
                              &alpha, w->data, CUDA_R_32F, (int)cols, x, CUDA_R_32F, (int)ldx, &beta,
                              y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) bias_add(c, y, ldy, bias, n, rows);
}

/* matmul_heads: each head's product on the path cuda_op_matmul would take
 * for it, every head in one launch. Deterministic mode: the batch-invariant
 * kernel over a grid of heads; decode rows: the GEMV over a grid of heads
 * (both: one per-head call's bits); larger batches: one 16-bit copy of every
 * head's columns and a strided-batched cuBLAS product (the per-head path's
 * operands and fp32 sums, in cuBLAS's order). */
extern "C" void cuda_op_matmul_heads(void *ctx, float *y, long ldy, long hy, const float *x,
                                     long ldx, long hx, const struct backend_weight *w,
                                     long w_stride, int n_heads, long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    long rows = w->rows, cols = w->cols;
    if (n <= 0 || rows <= 0 || n_heads <= 0) return;
    if (n_heads == 1) return cuda_op_matmul(ctx, y, ldy, x, ldx, w, NULL, n);
    CUDA_ASSERT(rows <= INT32_MAX && cols <= INT32_MAX && n <= INT32_MAX && ldx >= cols &&
                ldy >= rows && hx >= 0 && hy >= 0 && w_stride >= 0);
    if (w->dtype == DTYPE_F8_E4M3) {
        /* each head's weight must start on a row of blocks (its scales
         * are then rows of the scale matrix); the tile kernel over a grid
         * of heads */
        CUDA_ASSERT_MSG(w->block_rows > 0 && w_stride % cols == 0 &&
                            (w_stride / cols) % w->block_rows == 0,
                        "matmul_heads: FP8 heads that do not start on a block row");
        return cuda_fp8_tiles(c, y, ldy, hy, x, ldx, hx, w, w_stride / cols, NULL, n_heads, n);
    }
    if (c->deterministic) return cuda_matmul_det_heads(c, y, ldy, hy, x, ldx, hx, w, w_stride, n_heads, n);
    int w16 = w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16;
    if (w16 && cuda_gemv_heads_ok(c, w, w_stride, n_heads, n))
        return cuda_gemv_heads(c, y, ldy, hy, x, ldx, hx, w, w_stride, n_heads, n);
    long width = (long)(n_heads - 1) * hx + cols; /* columns of x the heads read */
    if (w16 && width <= INT32_MAX && width <= ldx) {
        int parts = c->split_act ? 2 : 1;
        const char *xb = (const char *)to16(c, x, ldx, n, width, w->dtype, parts);
        if (!xb) return;
        size_t bytes = (size_t)n * (size_t)width * 2;
        cudaDataType_t t = w->dtype == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const float alpha = 1.0f, zero = 0.0f, one = 1.0f;
        for (int part = 0; part < parts; part++)
            CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols, &alpha, w->data, t,
                (int)cols, (long long)w_stride, xb + bytes * (size_t)part, t, (int)width,
                (long long)hx, part ? &one : &zero, y, CUDA_R_32F, (int)ldy, (long long)hy, n_heads,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    if (w->dtype == DTYPE_F32 && !c->split_act) {
        /* fp32 weights (MLA's kv_b_proj of an FP8 checkpoint, dequantized
         * at load): one strided-batched fp32 product over the heads */
        const float alpha = 1.0f, zero = 0.0f;
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols, &alpha, w->data, CUDA_R_32F,
            (int)cols, (long long)w_stride, x, CUDA_R_32F, (int)ldx, (long long)hx, &zero, y, CUDA_R_32F,
            (int)ldy, (long long)hy, n_heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    size_t es = dtype_size(w->dtype);
    for (int h = 0; h < n_heads; h++) {
        struct backend_weight wh = *w;
        wh.data = (const char *)w->data + (size_t)h * (size_t)w_stride * es;
        cuda_op_matmul(ctx, y + h * hy, ldy, x + h * hx, ldx, &wh, NULL, n);
    }
}

/* ---- fused operations -------------------------------------------------- */

/* The product of n rows through the 16-bit handoff: not the GEMV, not the
 * fp32-grade or deterministic modes, and a norm the 16-bit kernel computes
 * with add_rmsnorm's bits (cuda_add_rmsnorm16_ok). */
static int handoff16(const struct cuda_ctx *c, const struct backend_norm *nm,
                     const struct backend_weight *w, long n) {
    return c->fuse && !c->deterministic && !c->split_act &&
           (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16) && !cuda_gemv_ok(c, w, n) &&
           cuda_add_rmsnorm16_ok(nm) && n <= INT32_MAX && w->rows <= INT32_MAX &&
           w->cols <= INT32_MAX;
}

/* The e4m3 handoff: an FP8 product on the e4m3 wgmma kernel whose input the
 * norm (cuda_add_rmsnorm8) writes in e4m3 itself, no quantization pass. */
static int handoff8(const struct cuda_ctx *c, const struct backend_norm *nm,
                    const struct backend_weight *w, long n) {
    return c->fuse && wgmma8(c, w, n) && w->cols == nm->dim && cuda_add_rmsnorm8_ok(nm);
}

/* The norm into nm->x; a tensor parallel part (nm->reduce) summed over the
 * ranks in the same kernel (cuda_allreduce.cu). */
static void plain_norm(struct cuda_ctx *c, const struct backend_norm *nm, long n) {
    if (nm->reduce) cuda_ar_norm(cuda_comm_ar(nm->reduce), nm, n, NULL, DTYPE_F32);
    else cuda_op_add_rmsnorm(c, nm->h, nm->delta, nm->x, nm->w, n, nm->dim, nm->eps);
}

extern "C" int cuda_op_norm_reduce_ok(void *ctx, const struct dist_comm *comm, long n, long dim) {
    const struct cuda_ar *ar = cuda_comm_ar(comm);
    return ar && ar->cc == (const struct cuda_ctx *)ctx && cuda_ar_norm_ok(ar, n, dim);
}

extern "C" void cuda_op_reduce_add_rmsnorm(void *ctx, const struct backend_norm *nm, long n) {
    if (n > 0) plain_norm((struct cuda_ctx *)ctx, nm, n);
}

extern "C" void cuda_op_norm_matmul(void *ctx, const struct backend_norm *nm, float *y, long ldy,
                                    const struct backend_weight *w, const float *bias, long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    CUDA_ASSERT(w->cols == nm->dim && ldy >= w->rows);
#ifdef KILN_CUDA_HOPPER
    if (handoff8(c, nm, w, n)) {
        if (cuda_scratch_reserve(c, &c->act16, q8_bytes(n, nm->dim), n)) return;
        cuda_add_rmsnorm8(c, nm, n, c->act16.p);
        cuda_wgmma_fp8(c, y, ldy, c->act16.p, q8_scales(c->act16.p, n, nm->dim), w, bias, n);
        return;
    }
#endif
    if (!handoff16(c, nm, w, n)) {
        plain_norm(c, nm, n);
        cuda_op_matmul(ctx, y, ldy, nm->x, nm->dim, w, bias, n);
        return;
    }
    if (cuda_scratch_reserve(c, &c->act16, (size_t)n * (size_t)nm->dim * 2, n)) return;
    cuda_add_rmsnorm16(c, nm, n, c->act16.p, w->dtype);
    product16(c, y, ldy, c->act16.p, nm->dim, w, bias, n, 0.0f);
}

/* The norm, the q|k|v product and, on the wgmma kernel, rope + the K/V
 * stores in its epilogue (cuda_wgmma_rope_run): no qk_rope_store kernel
 * between the product and the attention. Elsewhere the two ops. The
 * rotation is qk_rope_store's arithmetic with the roundings spelled out
 * (no contraction), so q and k may differ from its by an ulp. */
extern "C" void cuda_op_norm_matmul_rope(void *ctx, const struct backend_norm *nm, float *y,
                                         long ldy, const struct backend_stack *stack,
                                         const float *bias, long n,
                                         const struct backend_rope_store *r) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    const struct backend_weight *w = &stack->cat; /* weights are always stacked here */
#ifdef KILN_CUDA_HOPPER
    if (handoff8(c, nm, w, n) && cuda_wgmma_fp8_rope_ok(c, w, n, r) && ldy % 4 == 0 &&
        ((uintptr_t)y & 15) == 0) {
        if (cuda_scratch_reserve(c, &c->act16, q8_bytes(n, nm->dim), n)) return;
        cuda_add_rmsnorm8(c, nm, n, c->act16.p);
        cuda_wgmma_fp8_rope(c, y, ldy, c->act16.p, q8_scales(c->act16.p, n, nm->dim), w, bias, n, r);
        c->rope_fused++;
        return;
    }
    if (handoff16(c, nm, w, n) && ldy % 4 == 0 && ((uintptr_t)y & 15) == 0 && w->cols == nm->dim) {
        if (cuda_scratch_reserve(c, &c->act16, (size_t)n * (size_t)nm->dim * 2, n)) return;
        if (cuda_wgmma_rope_ok(c, w, c->act16.p, nm->dim, n, r)) {
            cuda_add_rmsnorm16(c, nm, n, c->act16.p, w->dtype);
            cuda_wgmma_rope_run(c, y, ldy, c->act16.p, nm->dim, w, bias, n, r);
            c->rope_fused++;
            return;
        }
    }
#endif
    cuda_op_norm_matmul(ctx, nm, y, ldy, w, bias, n);
    long qw = (long)r->n_heads * r->head_dim, kw = (long)r->n_kv_heads * r->head_dim;
    cuda_op_qk_rope_store(ctx, y, y + qw, y + qw + kw, ldy, n, r);
}

extern "C" void cuda_op_norm_swiglu_mlp(void *ctx, const struct backend_norm *nm, float *y,
                                        long ldy, const struct backend_stack *stack,
                                        const struct backend_weight *down, float *gu, long ldgu,
                                        long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    const struct backend_weight *gate_up = &stack->cat; /* weights are always stacked here */
    long inter = down->cols, d = nm->dim;
    CUDA_ASSERT(gate_up->rows == 2 * inter && gate_up->cols == d && ldgu >= 2 * inter &&
                ldy >= down->rows);
    /* FP8 decode: the same on the FP8 GEMV */
    if (c->fuse && gate_up->dtype == DTYPE_F8_E4M3 && down->dtype == DTYPE_F8_E4M3 &&
        cuda_fp8_gemv_ok(c, gate_up, n) && cuda_fp8_gemv_ok(c, down, n)) {
        plain_norm(c, nm, n);
        cuda_fp8_gemv(c, gu, ldgu, nm->x, d, gate_up, NULL, n, 1);
        cuda_fp8_gemv(c, y, ldy, gu, ldgu, down, NULL, n, 0);
        return;
    }
#ifdef KILN_CUDA_HOPPER
    /* FP8 batches on the e4m3 wgmma kernel: the norm writes gate|up's e4m3
     * operand, the SwiGLU down's (cuda_fp8_silu_quant) */
    if (handoff8(c, nm, gate_up, n) && wgmma8(c, down, n)) {
        size_t b1 = q8_bytes(n, d);
        if (cuda_scratch_reserve(c, &c->act16, b1 + q8_bytes(n, inter), n)) return;
        char *q1 = (char *)c->act16.p, *q2 = q1 + b1;
        cuda_add_rmsnorm8(c, nm, n, q1);
        cuda_wgmma_fp8(c, gu, ldgu, q1, q8_scales(q1, n, d), gate_up, NULL, n);
        cuda_fp8_silu_quant(c, q2, gu, ldgu, n, inter);
        cuda_wgmma_fp8(c, y, ldy, q2, q8_scales(q2, n, inter), down, NULL, n);
        return;
    }
#endif
    /* decode: norm, gate|up GEMV with silu(g)·u in its epilogue, down GEMV */
    if (c->fuse && !c->deterministic && cuda_gemv_ok(c, gate_up, n) && cuda_gemv_ok(c, down, n) &&
        cuda_gemv_xvec(nm->x, d) && cuda_gemv_xvec(gu, ldgu)) {
        plain_norm(c, nm, n);
        cuda_gemv(c, gu, ldgu, nm->x, d, gate_up, NULL, n, 1);
        cuda_gemv(c, y, ldy, gu, ldgu, down, NULL, n, 0);
        return;
    }
    /* batches: the norm and the SwiGLU kernels write the 16-bit operands */
    if (handoff16(c, nm, gate_up, n) && down->dtype == gate_up->dtype && !cuda_gemv_ok(c, down, n) &&
        down->rows <= INT32_MAX && inter <= INT32_MAX) {
        /* act16: the norm's output, then (SwiGLU in the product's
         * epilogue, which writes while other CTAs still read the norm's
         * output) g at n·d elements past it */
        if (cuda_scratch_reserve(c, &c->act16, (size_t)n * (size_t)(d + inter) * 2, n)) return;
        void *x16 = c->act16.p, *g16 = (char *)c->act16.p + (size_t)n * (size_t)d * 2;
        cuda_add_rmsnorm16(c, nm, n, x16, gate_up->dtype);
#ifdef KILN_CUDA_HOPPER
        if (cuda_wgmma_glu_ok(c, gate_up, x16, d, g16, inter, n)) {
            cuda_wgmma_glu_run(c, g16, inter, x16, d, gate_up, n, 0, 0);
            product16(c, y, ldy, g16, inter, down, NULL, n, 0.0f);
            return;
        }
#endif
        product16(c, gu, ldgu, x16, d, gate_up, NULL, n, 0.0f);
        cuda_silu16(c, x16, down->dtype, gu, ldgu, n, inter);
        product16(c, y, ldy, x16, inter, down, NULL, n, 0.0f);
        return;
    }
    plain_norm(c, nm, n);
    cuda_op_matmul(ctx, gu, ldgu, nm->x, d, gate_up, NULL, n);
    cuda_op_silu_mul(ctx, gu, ldgu, gu, ldgu, gu + inter, ldgu, n, inter);
    cuda_op_matmul(ctx, y, ldy, gu, ldgu, down, NULL, n);
}

/* ---- attention + output projection ----------------------------------- */

/* A batch of decode rows that cuda_op_attention sends to cuda_attn_decode
 * (cuda_attn_decode_all, with the 16-bit operand as its output) and a
 * projection on the 16-bit path: then the attention kernel can write the
 * projection's operand itself, rounded as the conversion pass rounds (the
 * same bits). */
static int attn16_ok(const struct cuda_ctx *c, const float *q, long ldq, const void *kc,
                     const void *vc, const struct attn_params *p, const struct backend_batch *b,
                     const struct backend_weight *wo, long n) {
    if (!(c->fuse && !c->deterministic && n == b->n_tokens &&
          (wo->dtype == DTYPE_BF16 || wo->dtype == DTYPE_F16) &&
          wo->cols == (long)p->n_heads * p->dv && !cuda_gemv_ok(c, wo, n) && n <= INT32_MAX &&
          wo->rows <= INT32_MAX && wo->cols <= INT32_MAX))
        return 0;
    /* act16 is a cudaMalloc block (256-byte aligned) once reserved below */
    return cuda_attn_decode_all(c, c->act16.p, wo->cols, q, ldq, kc, vc, p, b);
}

extern "C" void cuda_op_attention_matmul(void *ctx, float *y, long ldy, float *att, long ldatt,
                                         const float *q, long ldq, const void *k_cache,
                                         const void *v_cache, const struct attn_params *p,
                                         const struct backend_batch *b,
                                         const struct backend_weight *wo, const float *bias,
                                         long n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    if (!attn16_ok(c, q, ldq, k_cache, v_cache, p, b, wo, n)) {
        cuda_op_attention(ctx, att, ldatt, q, ldq, k_cache, v_cache, p, b);
        cuda_op_matmul(ctx, y, ldy, att, ldatt, wo, bias, n);
        return;
    }
    if (cuda_scratch_reserve(c, &c->act16, (size_t)n * (size_t)wo->cols * 2, n)) return;
    cuda_attn_decode16(c, c->act16.p, wo->dtype, wo->cols, q, ldq, k_cache, v_cache, p, b);
#ifdef KILN_CUDA_HOPPER
    if (cuda_wgmma_attn_out(c, y, ldy, c->act16.p, wo->cols, wo, bias, n)) return;
#endif
    product16(c, y, ldy, c->act16.p, wo->cols, wo, bias, n, 0.0f);
}
