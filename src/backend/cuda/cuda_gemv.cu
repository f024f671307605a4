/* cuda_gemv.cu — y[n][units] = x[n][cols] · Wᵀ for few activation rows
 * (decode: n ≤ gemv_max_rows, at most 8), bf16/f16 weights streamed once,
 * fp32 activations, fp32 sums. Decode is bound by weight bandwidth; this
 * keeps the activations in fp32 (within ~1e-7 of the CPU).
 *
 * Layout of the work:
 *  - a warp owns R consecutive output features ("units") and walks K with
 *    its lanes: lane l takes the 16-byte weight pieces l, l + 32, l + 64, ...
 *    of each of its weight rows, so every activation it loads serves R rows
 *    (the activations are fp32 and come from L1: R rows cut that traffic
 *    R-fold); U = GEMV_LOADS / (R·G) steps are loaded before the first is
 *    used, keeping GEMV_LOADS independent 16-byte loads in flight per lane;
 *  - K split (KS = 1, 2 or 4): the KS warps of a row group each take one
 *    contiguous part of K (whole 32-piece steps), and their sums are added
 *    through shared memory in part order. Narrow products (o_proj, down_proj
 *    at batch 1: 4096 outputs) get KS·more warps, so more bytes in flight
 *    and a shorter tail. KS is a function of the weight's shape alone
 *    (gemv_k_parts, cuda_common.cuh), never of n;
 *  - G = 2 (SwiGLU): the weight is gate|up stacked [2·units][cols]; a unit
 *    is the pair (gate row u, up row units + u), both summed as above, and
 *    the epilogue writes silu(g)·u — the silu_mul kernel's value, bit for
 *    bit — so the MLP skips that kernel and its pass over memory;
 *  - programmatic dependent launch (cuda_pdl.cuh): each warp issues its
 *    first U steps of weight loads before pdl_wait, so the weight stream
 *    starts while the kernel before (a norm, another product) drains, and
 *    reads the activations only after the wait.
 *
 * Batch invariance: every (unit, activation row) sum runs in one order
 * whatever n, R and U are — pieces in ascending order per lane, then a
 * fixed butterfly across the lanes, then the KS parts in order — so a row's
 * result does not depend on the batch it came in: padding a batch to a
 * captured graph size changes no logits, and the SwiGLU kernel's g and u
 * are the plain kernel's bits for the same stacked weight (gemv_k_parts sees the
 * same shape). */
#include <stdint.h>

#include "backend/cuda/cuda_pdl.cuh"

enum {
    GEMV_WARPS = 4,
    GEMV_THREADS = GEMV_WARPS * 32,
    GEMV_LOADS = 8, /* 16-byte weight loads in flight per lane */
};


/* Weight rows are read with ptx_ld_stream_v4: they are streamed once, so
 * they bypass L1 (activations stay cached there) and L2 fetches whole
 * 256-byte sectors ahead. Weights are never written while kernels run, so
 * the non-coherent path is safe even before pdl_wait. */

/* 8 consecutive activations of row j at column 8·vi, with ordinary loads:
 * the activations were written by the kernel before (cuda_pdl.cuh, rule 2). */
template <bool XVEC>
static __device__ __forceinline__ void load_x8(const float *x, long ldx, int j, long vi,
                                               float *xv) {
    const float *xr = x + j * ldx + vi * 8;
    if (XVEC) {
        float4 a = ((const float4 *)xr)[0], b = ((const float4 *)xr)[1];
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
        xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) xv[e] = xr[e];
    }
}

/* Heads of a matmul_heads call: grid.y = heads, head h's y, x and w start
 * h·hy, h·hx, h·hw elements after head 0's. */
struct gemv_heads {
    int n;
    long hx, hy, hw;
};

/* y[n][units] (stride ldy) = x[n][cols] (stride ldx) · w[G·units][cols]ᵀ
 * (+ bias), n ≤ NR, cols % 8 == 0, w 16-byte aligned, XVEC: x rows 16-byte
 * aligned. G = 2: y = silu(x·w[u]) · (x·w[units + u]), no bias. */
template <int NR, int R, int G, int KS, typename T, bool XVEC, bool HEADS>
static __global__ void __launch_bounds__(GEMV_THREADS, NR <= 2 ? 8 : 4)
    gemv_kernel(float *y, long ldy, const float *x, long ldx, const T *__restrict__ w,
                const float *__restrict__ bias, long units, long cols, int n, struct gemv_heads hd) {
    constexpr int RG = R * G, U = GEMV_LOADS / RG, GROUPS = GEMV_WARPS / KS;
    __shared__ float red[KS > 1 ? GEMV_WARPS * RG * NR : 1];
    pdl_trigger();
    /* head blockIdx.y (matmul_heads). A template flag: the plain product
     * keeps the code it had without heads (the offsets cost Llama-3.1-8B's
     * batch-1 decode ~2% on an H100) */
    if (HEADS) {
        y += blockIdx.y * hd.hy;
        x += blockIdx.y * hd.hx;
        w += blockIdx.y * hd.hw;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KS;
    long u0 = ((long)blockIdx.x * GROUPS + warp / KS) * R;
    bool active = u0 < units;
    long nvec = cols / 8;
    /* part p takes pieces [vs, ve): whole 32-piece steps, the last part the rest */
    long chunk = KS == 1 ? nvec : ((nvec + KS - 1) / KS + 31) / 32 * 32;
    long vs = part * chunk, ve = vs + chunk < nvec ? vs + chunk : nvec;
    const uint4 *wr[RG];
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r < units ? u0 + r : units - 1; /* past the end: re-read the last; not stored */
#pragma unroll
        for (int g = 0; g < G; g++) wr[r * G + g] = (const uint4 *)(w + (u + g * units) * cols);
    }
    float acc[RG][NR];
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[q][j] = 0.0f;

    long v = vs + lane;
    bool full = active && v + 32 * (U - 1) < ve;
    uint4 wv[U][RG];
    if (full) { /* the first steps' weights, before waiting for the activations */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int q = 0; q < RG; q++) wv[u][q] = ptx_ld_stream_v4(wr[q] + v + 32 * u);
    }
    pdl_wait();
    while (full) {
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int j = 0; j < NR; j++) {
                if (j < n) {
                    float xv[8];
                    load_x8<XVEC>(x, ldx, j, v + 32 * u, xv);
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        float wf[8];
                        widen8(wv[u][q], wf, (const T *)0);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[q][j] = fmaf(wf[e], xv[e], acc[q][j]);
                    }
                }
            }
        }
        v += 32 * U;
        full = v + 32 * (U - 1) < ve;
        if (full) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int q = 0; q < RG; q++) wv[u][q] = ptx_ld_stream_v4(wr[q] + v + 32 * u);
        }
    }
    if (active) {
        for (; v < ve; v += 32) {
            uint4 w1[RG];
#pragma unroll
            for (int q = 0; q < RG; q++) w1[q] = ptx_ld_stream_v4(wr[q] + v);
#pragma unroll
            for (int j = 0; j < NR; j++) {
                if (j < n) {
                    float xv[8];
                    load_x8<XVEC>(x, ldx, j, v, xv);
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        float wf[8];
                        widen8(w1[q], wf, (const T *)0);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[q][j] = fmaf(wf[e], xv[e], acc[q][j]);
                    }
                }
            }
        }
    }
    if (!gemv_reduce<RG, NR, KS>(acc, red, warp, part)) return;
    if (lane != 0 || !active) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r;
        if (u >= units) break;
        float b = G == 1 && bias ? bias[u] : 0.0f;
#pragma unroll
        for (int j = 0; j < NR; j++) {
            if (j >= n) break;
            float s = G == 1 ? acc[r][j] + b : silu_mul_f32(acc[r * G][j], acc[r * G + 1][j]);
            y[j * ldy + u] = s;
        }
    }
}

template <int NR, int R, int G, int KS, typename T>
static void launch_gemv_k(const struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                          const void *w, const float *bias, long units, long cols, int n,
                          bool xvec, struct gemv_heads hd) {
    unsigned grid = grid_for(units, (GEMV_WARPS / KS) * R);
    if (xvec && hd.n > 1)
        pdl_launch(c, gemv_kernel<NR, R, G, KS, T, true, true>, dim3(grid, hd.n), dim3(GEMV_THREADS), 0,
                   y, ldy, x, ldx, (const T *)w, bias, units, cols, n, hd);
    else if (xvec)
        pdl_launch(c, gemv_kernel<NR, R, G, KS, T, true, false>, dim3(grid), dim3(GEMV_THREADS), 0, y,
                   ldy, x, ldx, (const T *)w, bias, units, cols, n, hd);
    else if (G == 1 && KS == 1 && hd.n > 1)
        pdl_launch(c, gemv_kernel<NR, R, 1, 1, T, false, true>, dim3(grid, hd.n), dim3(GEMV_THREADS), 0,
                   y, ldy, x, ldx, (const T *)w, bias, units, cols, n, hd);
    else if (G == 1 && KS == 1)
        pdl_launch(c, gemv_kernel<NR, R, 1, 1, T, false, false>, dim3(grid), dim3(GEMV_THREADS), 0, y,
                   ldy, x, ldx, (const T *)w, bias, units, cols, n, hd);
    else
        CUDA_ASSERT_MSG(0, "gemv: unaligned activations take KS = 1 and no SwiGLU");
}

template <int NR, int R, int G, typename T>
static void launch_gemv_ks(const struct cuda_ctx *c, int ks, float *y, long ldy, const float *x,
                           long ldx, const void *w, const float *bias, long units, long cols, int n,
                           bool xvec, struct gemv_heads hd) {
    if (ks == 4) launch_gemv_k<NR, R, G, 4, T>(c, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else if (ks == 2) launch_gemv_k<NR, R, G, 2, T>(c, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else launch_gemv_k<NR, R, G, 1, T>(c, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
}

/* Units per warp: more share each activation load (4 from 3 activation rows
 * on; SwiGLU loads two rows a unit, so half as many), fewer leave enough
 * blocks to spread over the SMs. Does not change any sum's order. */
template <int NR, int G, typename T>
static void launch_gemv_r(const struct cuda_ctx *c, int ks, float *y, long ldy, const float *x,
                          long ldx, const void *w, const float *bias, long units, long cols, int n,
                          bool xvec, struct gemv_heads hd) {
    int r = (NR <= 2 ? 2 : 4) / G;
    while (r > 1 &&
           (units + (GEMV_WARPS / ks) * r - 1) / ((GEMV_WARPS / ks) * r) * hd.n < 2l * c->n_sm)
        r /= 2;
    if (r == 4 && G == 1)
        launch_gemv_ks<NR, 4, 1, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else if (r >= 2)
        launch_gemv_ks<NR, 2, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else
        launch_gemv_ks<NR, 1, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
}

template <int G, typename T>
static void launch_gemv(const struct cuda_ctx *c, int ks, float *y, long ldy, const float *x,
                        long ldx, const void *w, const float *bias, long units, long cols, int n,
                        bool xvec, struct gemv_heads hd = {1, 0, 0, 0}) {
    if (n <= 1) launch_gemv_r<1, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else if (n <= 2) launch_gemv_r<2, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else if (n <= 4) launch_gemv_r<4, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
    else launch_gemv_r<8, G, T>(c, ks, y, ldy, x, ldx, w, bias, units, cols, n, xvec, hd);
}

extern "C" int cuda_gemv_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n) {
    return (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16) && n >= 1 && n <= c->gemv_max_rows &&
           n <= 8 && w->cols % 8 == 0 && (uintptr_t)w->data % 16 == 0;
}

extern "C" int cuda_gemv_xvec(const float *x, long ldx) {
    return (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
}

extern "C" void cuda_gemv(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                          const struct backend_weight *w, const float *bias, long n, int swiglu) {
    CUDA_ASSERT(cuda_gemv_ok(c, w, n));
    bool xvec = cuda_gemv_xvec(x, ldx);
    int ks = xvec ? gemv_k_parts(c, w->rows, w->cols, false) : 1;
    if (swiglu) {
        CUDA_ASSERT_MSG(xvec && !bias && w->rows % 2 == 0, "gemv: SwiGLU needs aligned rows, no bias");
        if (w->dtype == DTYPE_BF16)
            launch_gemv<2, __nv_bfloat16>(c, ks, y, ldy, x, ldx, w->data, NULL, w->rows / 2, w->cols,
                                          (int)n, true);
        else
            launch_gemv<2, __half>(c, ks, y, ldy, x, ldx, w->data, NULL, w->rows / 2, w->cols,
                                   (int)n, true);
        return;
    }
    if (w->dtype == DTYPE_BF16)
        launch_gemv<1, __nv_bfloat16>(c, ks, y, ldy, x, ldx, w->data, bias, w->rows, w->cols, (int)n,
                                      xvec);
    else
        launch_gemv<1, __half>(c, ks, y, ldy, x, ldx, w->data, bias, w->rows, w->cols, (int)n, xvec);
}

/* matmul_heads on the GEMV: head h is the plain GEMV of its views (the same
 * K split and sums: bits equal to one cuda_gemv call per head), all heads
 * in one launch (grid.y). */
extern "C" int cuda_gemv_heads_ok(const struct cuda_ctx *c, const struct backend_weight *w,
                                  long w_stride, int n_heads, long n) {
    size_t es = dtype_size(w->dtype);
    return cuda_gemv_ok(c, w, n) && n_heads >= 1 && n_heads <= 65535 &&
           ((size_t)w_stride * es) % 16 == 0;
}

extern "C" void cuda_gemv_heads(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x,
                                long ldx, long hx, const struct backend_weight *w, long w_stride,
                                int n_heads, long n) {
    CUDA_ASSERT(cuda_gemv_heads_ok(c, w, w_stride, n_heads, n));
    /* every head's x rows must allow the 16-byte loads for head 0's choice */
    bool xvec = cuda_gemv_xvec(x, ldx) && hx % 4 == 0;
    int ks = xvec ? gemv_k_parts(c, w->rows, w->cols, false) : 1;
    struct gemv_heads hd = {n_heads, hx, hy, w_stride};
    if (w->dtype == DTYPE_BF16)
        launch_gemv<1, __nv_bfloat16>(c, ks, y, ldy, x, ldx, w->data, NULL, w->rows, w->cols, (int)n,
                                      xvec, hd);
    else
        launch_gemv<1, __half>(c, ks, y, ldy, x, ldx, w->data, NULL, w->rows, w->cols, (int)n, xvec,
                               hd);
}
