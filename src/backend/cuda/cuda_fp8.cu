/* cuda_fp8.cu — products with block-quantized float8 e4m3 weights
 * (DTYPE_F8_E4M3 with one fp32 scale per block_rows × block_cols block,
 * struct backend_weight): y[n][rows] = x[n][cols] · Wᵀ (+ bias), W(r, c) =
 * e4m3(q[r][c]) · scale[r / block_rows][c / block_cols].
 *
 * Kernels (cuda_matmul.cu chooses; docs/cuda-decode.md, "FP8 weights"):
 *  - GEMV (decode, n ≤ CUDA_FP8_GEMV_ROWS), laid out as the bf16 GEMV
 *    (cuda_gemv.cu) with the same lane to column map:
 *     · a warp owns R consecutive output units (a unit is a weight row; for
 *       SwiGLU, G = 2, the pair gate row u, up row units + u, and the
 *       epilogue writes silu_mul_f32(g, u), the silu_mul kernel's bits);
 *       lane l takes the 8-byte pieces l, l + 32, l + 64, ... of each of its
 *       R·G rows: 8 e4m3 values, inside one scale block since block_cols %
 *       16 == 0. Pieces of 8 columns, not 16: a lane's fp32 activations for
 *       a piece are then 32 bytes, and a warp's 16-byte activation load
 *       spans 8 cache lines, as in the bf16 GEMV, where 16-column pieces
 *       would span 16 lines for the same 512 bytes;
 *     · the activations are loaded 4 columns at a time for every
 *       activation row j and serve all R·G weight rows, each row's 4
 *       weights widened once for every j. R·G = 2 rows a warp for n ≤ 2, 4
 *       from 3 rows on (the bf16 GEMV's choice; 4 rows at n ≤ 2 would spill
 *       at 64 registers), halved while the blocks would not cover 2·n_sm
 *       (f8_gemv_r);
 *     · U = F8_GEMV_LOADS / (R·G) steps of 32 pieces are loaded before the
 *       first is used: 8 8-byte loads in flight per lane (the last batch of
 *       a part partial), bypassing L1 as ptx_ld_stream_v4 does; the first
 *       batch is issued before pdl_wait, the activations read after it;
 *     · K split KS = 1, 2 or 4 (gemv_k_parts, a function of the weight's shape): the
 *       KS warps of a row group each take one contiguous part of K in whole
 *       32-piece steps, and their sums are added through shared memory in
 *       part order;
 *     · each e4m3 pair is widened (exactly) by one conversion to f16x2,
 *       then to fp32; a piece's 8 products are summed in fp32 in column
 *       order, then added times the piece's block scale (acc = fma(dot, s,
 *       acc)); then a butterfly across the lanes, then the KS parts.
 *    Registers are capped at 64 for n ≤ 2 (8 blocks of 4 warps per SM),
 *    128 for n ≤ 4. Batch invariance: every (unit, activation row) sum
 *    runs in that one order whatever n and R are and whether x allows
 *    16-byte loads (activations without them take R = 1 and the same KS),
 *    so a row's result does not depend on its batch, and the SwiGLU
 *    kernel's g and u are the plain kernel's sums over the same stacked
 *    weight. The weight bytes are half of bf16's; the activation bytes per
 *    weight byte twice.
 *  - tile kernel (5..CUDA_FP8_TILE_ROWS rows, and every n under
 *    --deterministic): mma.sync m16n8k16 on bf16 operands, a CTA of 4
 *    warps per 64 × 64 tile of y, K walked in tiles of 32 in order: the
 *    activations rounded to bf16 (once, by cuda_act16; per head as they are
 *    staged for matmul_heads, the same values), the weights widened (exact)
 *    and multiplied by their block scale, rounded to bf16 in shared memory;
 *    a K split by shape when the tiles fill less than two waves. Each
 *    output's sum runs through the same chain of mma steps whatever n or
 *    the tile it sits in, so a row's bits do not depend on its batch.
 *  - activations per row and 128 columns in e4m3 (cuda_fp8_quant_act) for
 *    cuBLASLt's block-scaled FP8 (prefill, cuda_matmul.cu fp8_lt);
 *  - dequantization (prefill where cuBLASLt's FP8 has no plan): rows
 *    [r0, r1) of W as bf16(e4m3 · scale) into scratch, for cuBLASLt's bf16
 *    product (cuda_matmul.cu).
 *  - scalar kernel: a thread per output, k in order, each weight the
 *    CPU's fp32 value; for shapes the vector kernels cannot load (cols or
 *    block_cols not a multiple of 16, unaligned rows).
 */
#include <stdint.h>

#include <cuda_fp8.h>

#include "backend/cuda/cuda_pdl.cuh"

enum {
    F8_GEMV_WARPS = 4,
    F8_GEMV_THREADS = F8_GEMV_WARPS * 32,
    F8_GEMV_LOADS = 8, /* 8-byte weight loads in flight per lane */
    F8_BM = 64,
    F8_BN = 64,
    F8_BK = 32,
    F8_LD = F8_BK + 8, /* padded smem row (bf16 elements): conflict-free ldmatrix */
    F8_THREADS = 128,
};

/* 4 e4m3 values (element 0 in the lowest byte) to fp32, exactly (every
 * e4m3 value is a half): one conversion per pair. */
static __device__ __forceinline__ void f8x4_widen(uint32_t wd, float *f) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(wd >> (16 * h)), __NV_E4M3);
        float2 f2 = __half22float2(__half2(r));
        f[2 * h] = f2.x;
        f[2 * h + 1] = f2.y;
    }
}

/* 16 e4m3 values (one 16-byte piece, element 0 in the lowest byte) to fp32,
 * exactly. */
static __device__ __forceinline__ void f8x16_widen(uint4 v, float *f) {
    f8x4_widen(v.x, f);
    f8x4_widen(v.y, f + 4);
    f8x4_widen(v.z, f + 8);
    f8x4_widen(v.w, f + 12);
}

static __device__ __forceinline__ float f8_widen1(uint8_t b) {
    __half_raw r = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(r));
}

/* ---- GEMV ------------------------------------------------------------- */

/* 8 bytes of weights read once: as ptx_ld_stream_v4 (bypasses L1, L2
 * fetches the 256-byte sector ahead; only for memory no kernel writes). */
static __device__ __forceinline__ uint2 f8_ld_stream_v2(const uint2 *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
}

/* 4 activations of a row from xr, with ordinary loads (the kernel before
 * wrote them: cuda_pdl.cuh, rule 2); XVEC: xr 16-byte aligned. */
template <bool XVEC>
static __device__ __forceinline__ void f8_load_x4(const float *xr, float *xv) {
    if (XVEC) {
        float4 a = *(const float4 *)xr;
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) xv[e] = xr[e];
    }
}

/* y[n][units] (stride ldy) = x[n][cols] (stride ldx) · w[G·units][cols]ᵀ
 * (+ bias), n ≤ NR; G = 2: y = silu(x·w[u]) · (x·w[units + u]), no bias.
 * cols % 16 == 0, block_cols % 16 == 0, w 16-byte aligned, G·units·cols /
 * 8 < 2^32; XVEC: x rows 16-byte aligned. sdiv: piece p's scale column
 * p / (block_cols / 8) is umulhi(p, sdiv). */
template <int NR, int R, int G, int KS, bool XVEC>
static __global__ void __launch_bounds__(F8_GEMV_THREADS, NR <= 2 ? 8 : 4)
    f8_gemv_kernel(float *y, long ldy, const float *x, long ldx, const uint8_t *__restrict__ w,
                   const float *__restrict__ scale, const float *__restrict__ bias, long units,
                   long cols, int br, int bc, unsigned sdiv, int n) {
    constexpr int RG = R * G, U = F8_GEMV_LOADS / RG, GROUPS = F8_GEMV_WARPS / KS;
    __shared__ float red[KS > 1 ? F8_GEMV_WARPS * RG * NR : 1];
    pdl_trigger();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KS;
    long u0 = ((long)blockIdx.x * GROUPS + warp / KS) * R;
    bool active = u0 < units;
    /* piece indices in 32 bits: G·units·cols / 8 < 2^32 (cuda_fp8_gemv_ok) */
    unsigned np = (unsigned)(cols / 8), nbc = (unsigned)((cols + bc - 1) / bc);
    /* part p takes pieces [ps, pe): whole 32-piece steps, the last part the rest */
    unsigned chunk = KS == 1 ? np : ((np + KS - 1) / KS + 31) / 32 * 32;
    unsigned ps = part * chunk, pe = ps + chunk < np ? ps + chunk : np;
    /* row q's first piece and first scale (32-bit offsets: fewer registers) */
    const uint2 *w2 = (const uint2 *)w;
    unsigned ro[RG], so[RG];
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r < units ? u0 + r : units - 1; /* past the end: re-read the last; not stored */
#pragma unroll
        for (int g = 0; g < G; g++) {
            long row = u + g * units;
            ro[r * G + g] = (unsigned)row * np;
            so[r * G + g] = (unsigned)(row / br) * nbc;
        }
    }
    float acc[RG][NR];
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[q][j] = 0.0f;

    /* batches of U steps per lane (the last one of the part partial), all
     * loads of a batch issued before its first use; the first batch before
     * waiting for the activations */
    unsigned p = ps + lane;
    uint2 wv[U][RG];
    auto load = [&](unsigned p0) {
#pragma unroll
        for (int k = 0; k < U; k++)
            if (active && p0 + 32 * k < pe)
#pragma unroll
                for (int q = 0; q < RG; q++) wv[k][q] = f8_ld_stream_v2(w2 + (ro[q] + p0 + 32 * k));
    };
    load(p);
    pdl_wait();
    while (active && p < pe) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            unsigned pk = p + 32 * k;
            if (pk >= pe) break;
            float d[RG][NR];
#pragma unroll
            for (int q = 0; q < RG; q++)
#pragma unroll
                for (int j = 0; j < NR; j++) d[q][j] = 0.0f;
            /* 4 columns at a time: their activations for every row j, then
             * each weight row's 4 values widened once for all j */
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float xv[NR][4];
#pragma unroll
                for (int j = 0; j < NR; j++)
                    if (j < n) f8_load_x4<XVEC>(x + j * ldx + pk * 8 + 4 * c, xv[j]);
#pragma unroll
                for (int q = 0; q < RG; q++) {
                    float wf[4];
                    f8x4_widen(c ? wv[k][q].y : wv[k][q].x, wf);
#pragma unroll
                    for (int j = 0; j < NR; j++)
                        if (j < n)
#pragma unroll
                            for (int e = 0; e < 4; e++) d[q][j] = fmaf(wf[e], xv[j][e], d[q][j]);
                }
            }
            unsigned sc = __umulhi(pk, sdiv);
#pragma unroll
            for (int q = 0; q < RG; q++) {
                float s = scale[so[q] + sc];
#pragma unroll
                for (int j = 0; j < NR; j++)
                    if (j < n) acc[q][j] = fmaf(d[q][j], s, acc[q][j]);
            }
        }
        p += 32 * U;
        load(p);
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
            y[j * ldy + u] = G == 1 ? acc[r][j] + b : silu_mul_f32(acc[r * G][j], acc[r * G + 1][j]);
        }
    }
}

extern "C" int cuda_fp8_vec_ok(const struct backend_weight *w) {
    return w->dtype == DTYPE_F8_E4M3 && w->scale && w->block_rows > 0 && w->block_cols > 0 &&
           w->cols % 16 == 0 && w->block_cols % 16 == 0 && (uintptr_t)w->data % 16 == 0;
}

extern "C" int cuda_fp8_gemv_ok(const struct cuda_ctx *c, const struct backend_weight *w, long n) {
    return !c->deterministic && n >= 1 && n <= CUDA_FP8_GEMV_ROWS && cuda_fp8_vec_ok(w) &&
           (unsigned long long)w->rows * (unsigned long long)w->cols / 8 < (1ull << 32);
}

/* The arguments every instance takes. */
struct f8_gemv_args {
    float *y;
    long ldy;
    const float *x;
    long ldx;
    const struct backend_weight *w;
    const float *bias;
    long units;
    int n;
};

template <int NR, int R, int G, int KS, bool XVEC>
static void f8_gemv_launch(const struct cuda_ctx *c, const struct f8_gemv_args *a) {
    const struct backend_weight *w = a->w;
    unsigned grid = grid_for(a->units, (F8_GEMV_WARPS / KS) * R);
    /* p / pb = umulhi(p, ceil(2^32 / pb)) exactly while p · pb < 2^32
     * (pb ≥ 2: block_cols % 16 == 0) */
    unsigned long long pb = (unsigned long long)(w->block_cols / 8);
    CUDA_ASSERT_MSG((unsigned long long)(w->cols / 8) * pb < (1ull << 32),
                    "fp8 gemv: blocks too wide");
    unsigned sdiv = (unsigned)(((1ull << 32) + pb - 1) / pb);
    pdl_launch(c, f8_gemv_kernel<NR, R, G, KS, XVEC>, dim3(grid), dim3(F8_GEMV_THREADS), 0, a->y,
               a->ldy, a->x, a->ldx, (const uint8_t *)w->data, w->scale, a->bias, a->units, w->cols,
               w->block_rows, w->block_cols, sdiv, a->n);
}

/* x rows without 16-byte loads take R = 1 (R changes no sum) and the
 * same K split: their bits are those of aligned rows. */
template <int NR, int R, int G>
static void f8_gemv_ks_launch(const struct cuda_ctx *c, int ks, bool xvec,
                              const struct f8_gemv_args *a) {
    if (!xvec) {
        if (ks == 4) f8_gemv_launch<NR, 1, G, 4, false>(c, a);
        else if (ks == 2) f8_gemv_launch<NR, 1, G, 2, false>(c, a);
        else f8_gemv_launch<NR, 1, G, 1, false>(c, a);
    } else if (ks == 4) {
        f8_gemv_launch<NR, R, G, 4, true>(c, a);
    } else if (ks == 2) {
        f8_gemv_launch<NR, R, G, 2, true>(c, a);
    } else {
        f8_gemv_launch<NR, R, G, 1, true>(c, a);
    }
}

/* Units per warp, as the bf16 GEMV: R·G = 2 weight rows share each
 * activation load for n ≤ 2, 4 from 3 rows on (at n ≤ 2, 4 rows would not
 * fit the 64 registers without spilling); halved while the blocks would
 * not cover 2·n_sm. Does not change any sum's order. */
template <int NR, int G>
static void f8_gemv_r(const struct cuda_ctx *c, int ks, bool xvec, const struct f8_gemv_args *a) {
    constexpr int RMAX = (NR <= 2 ? 2 : 4) / G;
    int r = RMAX, groups = F8_GEMV_WARPS / ks;
    while (r > 1 && (a->units + groups * r - 1) / (groups * r) < 2l * c->n_sm) r /= 2;
    if constexpr (RMAX == 4) {
        if (r == 4) return f8_gemv_ks_launch<NR, 4, G>(c, ks, xvec, a);
    }
    if constexpr (RMAX >= 2) {
        if (r == 2) return f8_gemv_ks_launch<NR, 2, G>(c, ks, xvec, a);
    }
    f8_gemv_ks_launch<NR, 1, G>(c, ks, xvec, a);
}

extern "C" void cuda_fp8_gemv(struct cuda_ctx *c, float *y, long ldy, const float *x, long ldx,
                              const struct backend_weight *w, const float *bias, long n, int swiglu) {
    CUDA_ASSERT(cuda_fp8_gemv_ok(c, w, n));
    bool xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    int ks = gemv_k_parts(c, w->rows, w->cols, true);
    if (swiglu) {
        CUDA_ASSERT_MSG(!bias && w->rows % 2 == 0, "fp8 gemv: SwiGLU needs gate|up rows, no bias");
        struct f8_gemv_args a = {y, ldy, x, ldx, w, NULL, w->rows / 2, (int)n};
        if (n == 1) f8_gemv_r<1, 2>(c, ks, xvec, &a);
        else if (n == 2) f8_gemv_r<2, 2>(c, ks, xvec, &a);
        else f8_gemv_r<4, 2>(c, ks, xvec, &a);
        return;
    }
    struct f8_gemv_args a = {y, ldy, x, ldx, w, bias, w->rows, (int)n};
    if (n == 1) f8_gemv_r<1, 1>(c, ks, xvec, &a);
    else if (n == 2) f8_gemv_r<2, 1>(c, ks, xvec, &a);
    else f8_gemv_r<4, 1>(c, ks, xvec, &a);
}

/* ---- tile kernel ------------------------------------------------------ */

static __device__ __forceinline__ uint32_t f8_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The tile kernel's activations: fp32 read 4 at a time (F8_X32), fp32 with
 * 16-byte loads (F8_X32V), or already rounded to bf16 (F8_X16: the same
 * values the kernel would round them to, half the bytes; 16-byte loads). */
enum { F8_X32 = 0, F8_X32V = 1, F8_X16 = 2 };

/* y[n][rows] = x[n][cols] · Wᵀ + bias; cuda_fp8_vec_ok(w); XM: x's form
 * (above; ldx in its elements). Head blockIdx.z of matmul_heads: y, x
 * start z·hy, z·hx elements on, w z·hw bytes on and its scales z·hs floats
 * on. kchunk > 0 (a K split, one head): z takes columns [z·kchunk, (z +
 * 1)·kchunk) and writes its partial sums at y + z·hy (kchunk a multiple of
 * F8_BK). */
template <int XM>
static __global__ void __launch_bounds__(F8_THREADS)
    f8_mma_kernel(float *__restrict__ y, long ldy, const void *__restrict__ xv, long ldx,
                  const uint8_t *__restrict__ w, const float *__restrict__ scale,
                  const float *__restrict__ bias, long rows, long cols, int br, int bc, long n,
                  long hy, long hx, long hw, long hs, long kchunk) {
    __shared__ __align__(16) __nv_bfloat16 xs[F8_BM * F8_LD];
    __shared__ __align__(16) __nv_bfloat16 ws[F8_BN * F8_LD];
    const float *x = (const float *)xv + blockIdx.z * hx;
    const __nv_bfloat16 *xh = (const __nv_bfloat16 *)xv + blockIdx.z * hx;
    y += blockIdx.z * hy;
    w += blockIdx.z * hw;
    scale += blockIdx.z * hs;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp >> 1, wn = warp & 1; /* the warp's 32 × 32 quarter */
    long i0 = (long)blockIdx.y * F8_BM, f0 = (long)blockIdx.x * F8_BN;
    long nbc = (cols + bc - 1) / bc;

    /* per k-tile: x 64×32 fp32 = 512 float4 (4 a thread) or bf16 = 256
     * uint4 (2 a thread); w 64×32 bytes = 128 pieces of 16 (1 a thread)
     * with its block scale */
    float4 xr[4];
    uint4 xq[2];
    uint4 wr;
    float wsc;
    const int wrow = tid >> 1, wcol = (tid & 1) * 16;
    auto load = [&](long k0) {
        if (XM == F8_X16) {
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int idx = tid + u * F8_THREADS, r = idx >> 2, cc = (idx & 3) * 8;
                long i = i0 + r, k = k0 + cc;
                xq[u] = i < n && k < cols ? *(const uint4 *)(xh + i * ldx + k) : make_uint4(0, 0, 0, 0);
            }
        } else {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int idx = tid + u * F8_THREADS, r = idx >> 3, cc = (idx & 7) * 4;
                long i = i0 + r, k = k0 + cc;
                if (i < n && k < cols) {
                    const float *p = x + i * ldx + k;
                    xr[u] = XM == F8_X32V ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
                } else {
                    xr[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
        }
        long f = f0 + wrow, k = k0 + wcol;
        if (f < rows && k < cols) {
            wr = *(const uint4 *)(w + f * cols + k);
            wsc = scale[(f / br) * nbc + k / bc];
        } else {
            wr = make_uint4(0, 0, 0, 0);
            wsc = 0.0f;
        }
    };
    auto store = [&]() {
        if (XM == F8_X16) {
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int idx = tid + u * F8_THREADS, r = idx >> 2, cc = (idx & 3) * 8;
                *(uint4 *)(xs + r * F8_LD + cc) = xq[u];
            }
        } else {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int idx = tid + u * F8_THREADS, r = idx >> 3, cc = (idx & 7) * 4;
                *(uint2 *)(xs + r * F8_LD + cc) =
                    make_uint2(f8_pack_bf16(xr[u].x, xr[u].y), f8_pack_bf16(xr[u].z, xr[u].w));
            }
        }
        float wf[16];
        f8x16_widen(wr, wf);
        uint32_t pk[8];
#pragma unroll
        for (int e = 0; e < 8; e++) pk[e] = f8_pack_bf16(wf[2 * e] * wsc, wf[2 * e + 1] * wsc);
        *(uint4 *)(ws + wrow * F8_LD + wcol) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        *(uint4 *)(ws + wrow * F8_LD + wcol + 8) = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    };

    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.0f;

    long kb = kchunk ? blockIdx.z * kchunk : 0, ke = kchunk && kb + kchunk < cols ? kb + kchunk : cols;
    load(kb);
    for (long k0 = kb; k0 < ke; k0 += F8_BK) {
        __syncthreads(); /* everyone is done reading the previous tile */
        store();
        __syncthreads();
        if (k0 + F8_BK < ke) load(k0 + F8_BK);
#pragma unroll
        for (int ks = 0; ks < F8_BK / 16; ks++) {
            uint32_t af[2][4], bf[2][4];
            int mi = lane >> 3;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ptx_ldmatrix_x4(af[mt], xs + (wm * 32 + mt * 16 + (lane & 7) + (mi & 1) * 8) * F8_LD +
                                            ks * 16 + (mi >> 1) * 8);
#pragma unroll
            for (int np = 0; np < 2; np++)
                ptx_ldmatrix_x4(bf[np], ws + (wn * 32 + np * 16 + (lane & 7) + (mi >> 1) * 8) * F8_LD +
                                            ks * 16 + (mi & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    ptx_mma_m16n8k16<__nv_bfloat16>(acc[mt][2 * np], af[mt], bf[np][0], bf[np][1]);
                    ptx_mma_m16n8k16<__nv_bfloat16>(acc[mt][2 * np + 1], af[mt], bf[np][2], bf[np][3]);
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            long f = f0 + wn * 32 + nt * 8 + 2 * (lane & 3);
            long ia = i0 + wm * 32 + mt * 16 + (lane >> 2), ib = ia + 8;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                long i = e < 2 ? ia : ib, ff = f + (e & 1);
                if (i < n && ff < rows) y[i * ldy + ff] = acc[mt][nt][e] + (bias ? bias[ff] : 0.0f);
            }
        }
}

/* A thread per output, k in order, each weight fp32(e4m3 · scale) as the
 * CPU widens it: any cols, block shape and alignment. */
static __global__ void f8_simple_kernel(float *__restrict__ y, long ldy, const float *__restrict__ x,
                                        long ldx, const uint8_t *__restrict__ w,
                                        const float *__restrict__ scale, const float *__restrict__ bias,
                                        long rows, long cols, int br, int bc, long n, long hy, long hx,
                                        long hw, long hs) {
    long f = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= rows) return;
    y += blockIdx.z * hy;
    x += blockIdx.z * hx;
    w += blockIdx.z * hw;
    scale += blockIdx.z * hs;
    long nbc = (cols + bc - 1) / bc;
    const uint8_t *wr = w + f * cols;
    const float *sr = scale + (f / br) * nbc;
    for (long i = blockIdx.y; i < n; i += gridDim.y) {
        const float *xr = x + i * ldx;
        float acc = 0.0f;
        for (long k = 0; k < cols; k++) acc = fmaf(xr[k], __fmul_rn(f8_widen1(wr[k]), sr[k / bc]), acc);
        y[i * ldy + f] = acc + (bias ? bias[f] : 0.0f);
    }
}

/* y[i][f] = Σ_z part[z][i][f] (z in order) + bias[f] */
static __global__ void f8_split_sum_kernel(float *__restrict__ y, long ldy, const float *__restrict__ part,
                                           const float *__restrict__ bias, int split, long n, long rows) {
    long total = n * rows;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long)gridDim.x * blockDim.x) {
        long i = e / rows, f = e % rows;
        float acc = part[e];
        for (int z = 1; z < split; z++) acc += part[(size_t)z * (size_t)total + (size_t)e];
        y[i * ldy + f] = acc + (bias ? bias[f] : 0.0f);
    }
}

/* The K split of the tile kernel: none under --deterministic (a row's sums
 * must not depend on the batch) or when the tiles already fill the GPU
 * twice; else enough parts for about 4 CTAs an SM, each at least 512
 * columns, the partial sums at most 64 MiB. A function of the shape and
 * the number of 64-row tiles (1 for every batch of up to 64 rows). */
static int f8_split(const struct cuda_ctx *c, long tiles, long n, long rows, long cols) {
    if (c->deterministic || tiles >= 2L * c->n_sm) return 1;
    long s = (4L * c->n_sm + tiles - 1) / tiles;
    long by_k = cols / 512;
    if (s > by_k) s = by_k;
    long tm = (n + F8_BM - 1) / F8_BM;
    while (s > 1 && (size_t)s * (size_t)(tm * F8_BM) * (size_t)rows * 4 > CUDA_FP8_SCRATCH_BYTES) s--;
    return s > 1 ? (int)(s < 16 ? s : 16) : 1;
}

/* The tile kernel (or the scalar one for shapes it cannot load) over
 * n_heads heads; head h's weight rows start at row h·w_rows_stride of w,
 * a multiple of block_rows (checked by the caller). */
extern "C" void cuda_fp8_tiles(struct cuda_ctx *c, float *y, long ldy, long hy, const float *x,
                               long ldx, long hx, const struct backend_weight *w, long w_row_stride,
                               const float *bias, int n_heads, long n) {
    long rows = w->rows, cols = w->cols;
    if (n <= 0 || rows <= 0) return;
    CUDA_ASSERT(w->dtype == DTYPE_F8_E4M3 && w->scale && w->block_rows > 0 && w->block_cols > 0);
    CUDA_ASSERT(n_heads >= 1 && n_heads <= 65535 && w_row_stride % w->block_rows == 0);
    long nbc = (cols + w->block_cols - 1) / w->block_cols;
    long hw = w_row_stride * cols, hs = w_row_stride / w->block_rows * nbc;
    const uint8_t *wd = (const uint8_t *)w->data;
    bool xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && (n_heads == 1 || hx % 4 == 0);
    if (cuda_fp8_vec_ok(w) && (n_heads == 1 || hw % 16 == 0)) {
        CUDA_ASSERT((n + F8_BM - 1) / F8_BM <= 65535);
        long tiles = (rows + F8_BN - 1) / F8_BN * ((n + F8_BM - 1) / F8_BM);
        int split = n_heads == 1 ? f8_split(c, tiles, n, rows, cols) : 1;
        long kchunk = 0;
        float *out = y;
        long oy = hy, ldo = ldy;
        if (split > 1) {
            kchunk = ((cols + split - 1) / split + F8_BK - 1) / F8_BK * F8_BK;
            split = (int)((cols + kchunk - 1) / kchunk);
            if (cuda_scratch_reserve(c, &c->fp8w, (size_t)split * (size_t)n * (size_t)rows * 4, n)) return;
            out = (float *)c->fp8w.p, oy = n * rows, ldo = rows;
        }
        dim3 grid((unsigned)((rows + F8_BN - 1) / F8_BN), (unsigned)((n + F8_BM - 1) / F8_BM),
                  (unsigned)(split > 1 ? split : n_heads));
        const float *kb = split > 1 ? NULL : bias;
        /* one head: the activations rounded to bf16 once (the values the
         * kernel would round them to), so that the CTAs of every column
         * tile read half the bytes */
        const void *x16 = n_heads == 1 ? cuda_act16(c, x, ldx, n, cols, DTYPE_BF16) : NULL;
        if (n_heads == 1 && !x16) return; /* no scratch: the step fails (recorded) */
        if (x16)
            f8_mma_kernel<F8_X16><<<grid, F8_THREADS, 0, c->stream>>>(out, ldo, x16, cols, wd, w->scale, kb,
                                                                     rows, cols, w->block_rows,
                                                                     w->block_cols, n, oy, 0, hw, hs,
                                                                     kchunk);
        else if (xvec)
            f8_mma_kernel<F8_X32V><<<grid, F8_THREADS, 0, c->stream>>>(out, ldo, x, ldx, wd, w->scale, kb,
                                                                      rows, cols, w->block_rows,
                                                                      w->block_cols, n, oy, hx, hw, hs,
                                                                      kchunk);
        else
            f8_mma_kernel<F8_X32><<<grid, F8_THREADS, 0, c->stream>>>(out, ldo, x, ldx, wd, w->scale, kb,
                                                                     rows, cols, w->block_rows,
                                                                     w->block_cols, n, oy, hx, hw, hs,
                                                                     kchunk);
        CUDA_CHECK_LAUNCH();
        if (split > 1) {
            f8_split_sum_kernel<<<grid_for(n * rows, 256), 256, 0, c->stream>>>(y, ldy, out, bias, split,
                                                                              n, rows);
        }
    } else {
        dim3 grid((unsigned)((rows + 127) / 128), (unsigned)(n < 65535 ? n : 65535), (unsigned)n_heads);
        f8_simple_kernel<<<grid, 128, 0, c->stream>>>(y, ldy, x, ldx, wd, w->scale, bias, rows, cols,
                                                      w->block_rows, w->block_cols, n, hy, hx, hw, hs);
    }
    CUDA_CHECK_LAUNCH();
}

/* ---- dequantization for the cuBLASLt path ------------------------------ */

/* dst[r1 - r0][cols] = bf16(e4m3(w[r][c]) · scale), rows r0.. of w */
static __global__ void f8_dequant_kernel(__nv_bfloat16 *__restrict__ dst, const uint8_t *__restrict__ w,
                                         const float *__restrict__ scale, long r0, long nrows, long cols,
                                         int br, int bc) {
    long np = cols / 16, total = nrows * np, nbc = (cols + bc - 1) / bc;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        long r = r0 + i / np, k = (i % np) * 16;
        uint4 v = *(const uint4 *)(w + r * cols + k);
        float s = scale[(r / br) * nbc + k / bc], f[16];
        f8x16_widen(v, f);
        uint32_t pk[8];
#pragma unroll
        for (int e = 0; e < 8; e++) pk[e] = f8_pack_bf16(f[2 * e] * s, f[2 * e + 1] * s);
        uint4 *d = (uint4 *)(dst + (r - r0) * cols + k);
        d[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        d[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    }
}

extern "C" void cuda_fp8_dequant(struct cuda_ctx *c, void *dst, const struct backend_weight *w,
                                 long r0, long r1) {
    CUDA_ASSERT(cuda_fp8_vec_ok(w) && r0 >= 0 && r1 <= w->rows && r0 < r1);
    long total = (r1 - r0) * (w->cols / 16);
    f8_dequant_kernel<<<grid_for(total, 256), 256, 0, c->stream>>>(
        (__nv_bfloat16 *)dst, (const uint8_t *)w->data, w->scale, r0, r1 - r0, w->cols, w->block_rows,
        w->block_cols);
    CUDA_CHECK_LAUNCH();
}

/* ---- activations in e4m3 (the e4m3 wgmma kernel, cuBLASLt's FP8) ------- */

/* A warp per (row i, 128-column group g): s = max(max |v|, 1e-12) / 448,
 * xq[i][k] = e4m3(v / s) (to nearest even, saturating), xs[g][i] = s: the
 * layout of CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F on the B operand
 * (groups outer, rows inner). cols % 128 == 0. v = x; SILU: v =
 * silu_mul_f32(gate, up) of x's row [gate: cols | up: cols], the SwiGLU
 * kernel's value. */
template <bool SILU>
static __global__ void f8_quant_act_kernel(uint8_t *__restrict__ xq, float *__restrict__ xs,
                                           const float *__restrict__ x, long ldx, long n, long cols) {
    pdl_trigger();
    pdl_wait();
    long wid = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    long groups = cols / 128;
    if (wid >= n * groups) return;
    long i = wid / groups, g = wid % groups;
    const float *xr = x + i * ldx + g * 128;
    float v[4], amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        v[e] = SILU ? silu_mul_f32(xr[lane + 32 * e], xr[cols + lane + 32 * e]) : xr[lane + 32 * e];
        amax = fmaxf(amax, fabsf(v[e]));
    }
    const float sc = q8_warp_scale(amax);
    uint8_t *qr = xq + i * cols + g * 128;
#pragma unroll
    for (int e = 0; e < 4; e++) qr[lane + 32 * e] = (uint8_t)q8_code(v[e], sc);
    if (lane == 0) xs[g * n + i] = sc;
}

template <bool SILU>
static void quant_launch(struct cuda_ctx *c, void *xq, float *xs, const float *x, long ldx, long n, long cols) {
    CUDA_ASSERT(cols % 128 == 0 && n > 0);
    long warps = n * (cols / 128);
    pdl_launch(c, f8_quant_act_kernel<SILU>, dim3(grid_for(warps, 8)), dim3(256), 0, (uint8_t *)xq, xs, x,
               ldx, n, cols);
}

extern "C" void cuda_fp8_quant_act(struct cuda_ctx *c, void *xq, float *xs, const float *x, long ldx,
                                   long n, long cols) {
    quant_launch<false>(c, xq, xs, x, ldx, n, cols);
}

/* The SwiGLU of gate|up rows (gu [n][2·inter], row stride ldgu) straight
 * into the e4m3 operand of the down product (codes, then the scales at
 * q8_scales_off(n, inter)): the bytes cuda_fp8_quant_act makes of the
 * SwiGLU kernel's output. */
extern "C" void cuda_fp8_silu_quant(struct cuda_ctx *c, void *q8, const float *gu, long ldgu, long n,
                                    long inter) {
    quant_launch<true>(c, q8, q8_scales(q8, n, inter), gu, ldgu, n, inter);
}
