/* cuda_moe_quant.cu — the experts' products of a MoE layer with quantized
 * experts, over the same device tile list as the 16-bit experts
 * (cuda_moe.cu), reading each touched expert's codes once:
 *  - FP8: DTYPE_F8_E4M3 with fp32 block scales (struct backend_weight),
 *    half of bf16's bytes;
 *  - MXFP4: DTYPE_MXFP4, e2m1 codes two a byte with an e8m0 exponent per
 *    row and 32 columns (gpt-oss's published experts), a quarter of bf16's
 *    bytes plus 1/32 for the exponents.
 * Both formats take the same two kernels; where they differ is the piece
 * a lane loads (8 bytes: 8 FP8 codes, 16 MXFP4 codes), its scale (the
 * block's fp32 scale; 2^(e - 127) from the row's exponent byte) and how
 * codes widen (below).
 *
 *  - Decode (a few rows per expert): a grouped GEMV over the tile list
 *    (tiles of 1 row for one token, else of up to 8), laid out as the
 *    dense FP8 GEMV (cuda_fp8.cu, f8_gemv_kernel), grouped as the bf16
 *    experts' GEMV (cuda_moe_gemv.cu): a CTA of 4 warps per (group of
 *    units, tile), every CTA waiting for the kernel before (pdl_wait)
 *    first: the tile list that names the expert is written by it, so
 *    unlike the dense GEMV no weight load can be issued ahead of the wait.
 *     · a warp owns R units of the tile's expert: gate|up (G = 2) one unit,
 *       gate row u and up row u; down (G = 1) two units: 2 weight rows
 *       either way, for both tile sizes (the bf16 GEMV's choice). Lane l
 *       takes the 8-byte pieces l, l + 32, l + 64, ... of each row: 8
 *       FP8 codes, inside one scale block since block_cols % 16 == 0, or
 *       16 MXFP4 codes, half of one exponent's 32 columns. Pieces of 8
 *       FP8 codes, not 16: a lane's fp32 activations for a piece are 32
 *       bytes, and a warp's 16-byte activation load spans 8 cache lines
 *       where 16-code pieces would span 16;
 *     · a piece's activations are loaded once for each row of the tile and
 *       serve both weight rows, whose codes are widened once for all the
 *       tile's rows;
 *     · U = 8 / (R·G) = 4 steps of 32 pieces are loaded before the first is
 *       used: 8 8-byte loads in flight per lane (the last batch of a part
 *       partial) with their scales, bypassing L1 as ptx_ld_stream_v4
 *       does; the first batch as soon as the tile is read;
 *     · K split KS = 1, 2 or 4 (gemv_k_parts, the dense GEMVs' rule, by
 *       one expert matrix's shape in 8-byte pieces): the KS warps of a unit
 *       group each take one contiguous part of K in whole 32-piece steps,
 *       and their sums are added through shared memory in part order;
 *     · each e4m3 pair is widened exactly (one conversion to f16x2, then
 *       to fp32); an e2m1 code is placed in the high byte of an f16 (its
 *       two exponent bits and its mantissa bit as the f16's lowest
 *       exponent bits and top mantissa bit: exactly the code's value times
 *       2^-14, subnormal 0.5 included), then widened to fp32, the 2^14
 *       going into the scale; each 8 columns' products with one
 *       activation row are summed in fp32 in column order, then added
 *       times the piece's scale (acc = fma(dot, s, acc)); then a
 *       butterfly across the lanes
 *       (every lane holds the sums: lane r·NR + j runs the epilogue of
 *       unit r, tile row j), then the K parts.
 *    gate|up read the fp32 token rows (sorted row p reads token order[p] /
 *    top_k: no gather), down the bf16 SwiGLU rows (fp32 in the fp32-grade
 *    mode). Registers are capped at 64 for one-row tiles (8 CTAs an SM),
 *    96 for 8-row tiles (5). Every (unit, tile row) sum runs in that one
 *    order whatever the tile's row count and which rows share the tile,
 *    so a row's result does not depend on its batch (where the GEMV serves
 *    every batch, --deterministic relies on it).
 *  - Prefill (many rows per expert): the mma.sync grouped product of
 *    cuda_gemm_small.cu with bf16 activations. Each k-step's 64×64 weight
 *    codes come into shared memory by cp.async (4 KB a stage for FP8, 2 KB
 *    for MXFP4, a 4-deep ring), are widened to bf16 (exact: every e4m3
 *    value is a bf16 value, and so is every e2m1 value times its power of
 *    two) into one swizzled tile that ldmatrix reads. MXFP4's exponents
 *    go into the widened values; FP8's block scale is applied outside the
 *    tensor core, DeepGEMM's way: each K block's products accumulate on
 *    their own in fp32 and are added to the total times the scale of the
 *    lane's weight row and that K block.
 * Requirements (cuda_moe_quant_ok): hidden and inter multiples of 16 (FP8)
 * or 32 (MXFP4), FP8 column blocks a multiple of 16 (the scale is applied
 * per 16-column mma step), row blocks >= 1 (partial edge blocks allowed),
 * 16-byte aligned weights, MXFP4 exponents up to BACKEND_MXFP4_MAX_EXPONENT (240, 2^113: the GEMV's
 * scale carries the 2^14 of the widening; the loader refuses more); the
 * mma product also multiples of 64 (cuda_moe_quant_mma_ok), else the
 * GEMV serves every batch. The epilogues add the experts' biases and
 * apply their activation as the 16-bit products do (cuda_moe_act.cuh).
 * Activations are bf16 wherever a tensor core
 * reads them and for the down GEMV, so the products carry the bf16
 * rounding of the activations (2^-9 relative) and otherwise the CPU's
 * weight values (cpu_matmul_fp8.c: code × scale, one rounding, then the
 * sum; MXFP4: the bf16 values the CPU decodes at load, exact), up to
 * where the scale's rounding falls (FP8: per product there, per
 * 8-product or per K-block sum here); the fp32-grade mode
 * (KILN_CUDA_MATMUL=bf16x2) runs the GEMV with fp32 SwiGLU rows (h32):
 * fp32 activations throughout. */
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/cuda_moe_act.cuh"

namespace {

/* Two e4m3 codes (low byte first) widened to fp32, exactly. */
__device__ __forceinline__ float2 fp8x2_f32(uint32_t q2) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(q2 & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(hr));
}

/* 16 codes as 16 bf16 (exact), two uint4 in element order. */
__device__ __forceinline__ void fp8_to_bf16x16(const uint4 &p, uint4 &lo, uint4 &hi) {
    const uint32_t w[4] = {p.x, p.y, p.z, p.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 a = __float22bfloat162_rn(fp8x2_f32(w[i]));
        __nv_bfloat162 b = __float22bfloat162_rn(fp8x2_f32(w[i] >> 16));
        o[2 * i] = *(const uint32_t *)&a;
        o[2 * i + 1] = *(const uint32_t *)&b;
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* ---- decode: the grouped GEMV ------------------------------------------- */

constexpr int FG_WARPS = 4;
constexpr int FG_THREADS = 32 * FG_WARPS;
constexpr int FG_LOADS = 8; /* 8-byte weight loads in flight per lane */

/* 8 bytes of weights read once: as ptx_ld_stream_v4 (bypasses L1, L2
 * fetches the 256-byte sector ahead; only for memory no kernel writes). */
__device__ __forceinline__ uint2 ld_stream_v2(const uint2 *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
}

/* 4 codes (low byte first) widened to fp32, exactly. */
__device__ __forceinline__ void fp8_widen4(uint32_t q4, float *f) {
    float2 a = fp8x2_f32(q4), b = fp8x2_f32(q4 >> 16);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

/* 8 e2m1 codes (4 bytes, the low nibble first) as fp32, each exactly its
 * value times 2^-14: the code in the high byte of an f16 (the sign to bit
 * 15, the two exponent bits and the mantissa bit to bits 11, 10 and 9),
 * then the f16 pairs widened. */
__device__ __forceinline__ void mx_widen8(uint32_t w, float *f) {
    const uint32_t e = w & 0x0f0f0f0fu, o = (w >> 4) & 0x0f0f0f0fu; /* even, odd columns */
    const uint32_t fe = ((e & 0x07070707u) << 1) | ((e & 0x08080808u) << 4);
    const uint32_t fo = ((o & 0x07070707u) << 1) | ((o & 0x08080808u) << 4);
#pragma unroll
    for (int i = 0; i < 4; i++) { /* columns 2i, 2i + 1: bytes i of fe and fo as the f16s' high bytes */
        const uint32_t h2 = __byte_perm(fe, fo, (uint32_t)(((4 + i) << 12) | (i << 4))) & 0xff00ff00u;
        __half2_raw hr;
        hr.x = (unsigned short)(h2 & 0xffffu);
        hr.y = (unsigned short)(h2 >> 16);
        const float2 v = __half22float2(__half2(hr));
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

/* An MXFP4 exponent byte as the scale of mx_widen8's values: 2^(e - 127)
 * times the 2^14 the widening left out (e <= BACKEND_MXFP4_MAX_EXPONENT,
 * which the loader holds to). */
__device__ __forceinline__ float mx_scale(uint32_t e) { return __int_as_float((int)((e + 14u) << 23)); }

/* The 8 activations of piece p (columns 8p .. 8p + 7) of a row: fp32 rows
 * (two 16-byte loads) or bf16 rows (one). Ordinary loads: the rows were
 * written by the kernels before (cuda_pdl.cuh, rule 2). */
__device__ __forceinline__ void load_act8(const float *row, unsigned p, float *xv) {
    const float4 *q = (const float4 *)(row + (size_t)p * 8);
    float4 a = q[0], b = q[1];
    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
    xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}
__device__ __forceinline__ void load_act8(const __nv_bfloat16 *row, unsigned p, float *xv) {
    widen8(((const uint4 *)row)[p], xv, (const __nv_bfloat16 *)0);
}

__device__ __forceinline__ void store_h(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_h(float *p, float v) { *p = v; }

/* What every instance of the GEMV takes. G = 2: w_a, s_a the gates' codes
 * and scales, w_b, s_b the ups'; G = 1: w_a, s_a only. FP8: piece p of a
 * row (8 columns) has the scale column p / pb: umulhi(p, sdiv) when sdiv
 * != 0 (exact: fg_div), else the division. MXFP4: piece p (16 columns)
 * has exponent p / 2 of its row. */
struct fgemv {
    void *y;
    long ldy;
    const void *x;
    long ldx;
    const int32_t *order; /* NULL: sorted row p reads x row p; else x row order[p] / top_k */
    int top_k;
    const void *const *w_a, *const *w_b;
    const void *const *s_a, *const *s_b; /* FP8: fp32 block scales; MXFP4: exponent bytes */
    const int4 *tiles;
    const int *n_tiles;
    long units, cols;
    int br;
    unsigned nbc, pb, sdiv;
    struct moe_epi ep;
};

/* The grouped GEMV (see the top of the file). MX: MXFP4 weights, else FP8;
 * XT: the activations' type (fp32 token rows, or the SwiGLU rows h: bf16,
 * fp32 in the fp32-grade mode); G = 2: gate|up with the activation
 * epilogue into y (HT), G = 1: down, y fp32; NR: the most rows a tile has;
 * R: units per warp; KS: the K split. */
template <bool MX, typename XT, typename HT, int G, int NR, int R, int KS>
__global__ void __launch_bounds__(FG_THREADS, NR == 1 ? 8 : 5) moe_gemv_q_kernel(const struct fgemv a) {
    constexpr int RG = R * G, U = FG_LOADS / RG, GROUPS = FG_WARPS / KS;
    constexpr int PC = MX ? 16 : 8; /* columns a piece */
    static_assert(U >= 1 && R * NR <= 32 && (NR & (NR - 1)) == 0, "moe fp8 gemv: shape");
    __shared__ float red[KS > 1 ? FG_WARPS * RG * NR : 1];
    pdl_trigger();
    pdl_wait(); /* the tile list (the expert), the token rows, h: written by the kernels before */
    if ((int)blockIdx.y >= *a.n_tiles) return;
    const int4 t = a.tiles[blockIdx.y];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KS;
    const long u0 = ((long)blockIdx.x * GROUPS + warp / KS) * R;
    const bool active = u0 < a.units; /* warp-uniform; inactive warps still meet the barrier */
    const int m = t.z;
    /* part `part` takes pieces [ps, pe) of each row: whole 32-piece steps,
     * the last part the rest */
    const unsigned np = (unsigned)(a.cols / PC);
    const unsigned chunk = KS == 1 ? np : ((np + KS - 1) / KS + 31) / 32 * 32;
    const unsigned ps = part * chunk, pe = ps + chunk < np ? ps + chunk : np;
    const uint2 *wr[RG];
    const void *sr[RG]; /* the row's scales: FP8 its row of blocks (fp32), MXFP4 its exponents */
#pragma unroll
    for (int r = 0; r < R; r++) {
        long u = u0 + r < a.units ? u0 + r : a.units - 1; /* past the end: re-read the last; not stored */
#pragma unroll
        for (int g = 0; g < G; g++) {
            const uint8_t *w = (const uint8_t *)(g ? a.w_b : a.w_a)[t.x];
            const void *s0 = (g ? a.s_b : a.s_a)[t.x];
            if constexpr (MX) {
                wr[r * G + g] = (const uint2 *)(w + u * (a.cols / 2));
                sr[r * G + g] = (const uint8_t *)s0 + u * (a.cols / 32);
            } else {
                wr[r * G + g] = (const uint2 *)(w + u * a.cols);
                sr[r * G + g] = (const float *)s0 + (size_t)((unsigned)u / (unsigned)a.br) * a.nbc;
            }
        }
    }
    float acc[RG][NR];
#pragma unroll
    for (int q = 0; q < RG; q++)
#pragma unroll
        for (int j = 0; j < NR; j++) acc[q][j] = 0.0f;

    /* batches of U steps per lane (the last one of the part partial), the
     * loads of a batch (codes and their scales) all issued before its
     * first use, the first as soon as the expert is known */
    unsigned p = ps + lane;
    uint2 wv[U][RG];
    float sv[U][RG];
    auto load = [&](unsigned p0) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            unsigned pk = p0 + 32 * k;
            if (active && pk < pe) {
                unsigned sc = MX ? pk >> 1 : a.sdiv ? __umulhi(pk, a.sdiv) : pk / a.pb;
#pragma unroll
                for (int q = 0; q < RG; q++) {
                    wv[k][q] = ld_stream_v2(wr[q] + pk);
                    if constexpr (MX) sv[k][q] = mx_scale(__ldg((const uint8_t *)sr[q] + sc));
                    else sv[k][q] = __ldg((const float *)sr[q] + sc);
                }
            }
        }
    };
    load(p);
    /* the activation rows (32-bit indices: fewer registers) */
    unsigned xrow[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) {
        int r = t.y + (j < m ? j : m - 1);
        xrow[j] = (unsigned)(a.order ? a.order[r] / a.top_k : r);
    }
    while (active && p < pe) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            unsigned pk = p + 32 * k;
            if (pk >= pe) break;
            /* the piece's codes of every weight row, widened once for all
             * activation rows (MXFP4: 8 columns at a time); per (row,
             * activation row) each 8 columns' products summed in column
             * order, then added times the scale */
#pragma unroll
            for (int h = 0; h < PC / 8; h++) {
                float wf[RG][8];
#pragma unroll
                for (int q = 0; q < RG; q++) {
                    if constexpr (MX) mx_widen8(h ? wv[k][q].y : wv[k][q].x, wf[q]);
                    else fp8_widen4(wv[k][q].x, wf[q]), fp8_widen4(wv[k][q].y, wf[q] + 4);
                }
#pragma unroll
                for (int j = 0; j < NR; j++) {
                    if (j >= m) break;
                    float xv[8];
                    load_act8((const XT *)a.x + xrow[j] * (size_t)a.ldx, (PC / 8) * pk + h, xv);
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        float dd = 0.0f;
#pragma unroll
                        for (int e = 0; e < 8; e++) dd = fmaf(wf[q][e], xv[e], dd);
                        acc[q][j] = fmaf(dd, sv[k][q], acc[q][j]);
                    }
                }
            }
        }
        p += 32 * U;
        load(p);
    }
    /* the lanes' sums by a butterfly (every lane holds the same bits), the
     * K split's parts in order */
    if (!gemv_reduce<RG, NR, KS>(acc, red, warp, part, m)) return;
    if (!active) return;
    /* lane r·NR + j writes unit u0 + r of tile row j */
    const int r = lane / NR, j = lane % NR;
    float g = 0.0f, v = 0.0f;
#pragma unroll
    for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int jj = 0; jj < NR; jj++)
            if (lane == rr * NR + jj) g = acc[rr * G][jj], v = acc[rr * G + G - 1][jj];
    const long u = u0 + r, row = t.y + j;
    if (r >= R || j >= m || u >= a.units) return;
    if (G == 2)
        store_h((HT *)a.y + row * a.ldy + u, moe_glu_f32(a.ep, t.x, u, a.units, g, v));
    else
        ((float *)a.y)[row * a.ldy + u] = moe_down_f32(a.ep, t.x, u, a.units, g);
}

/* The scale column of piece p < np is p / pb; a block wider than the row
 * is taken as pb = np (every piece in column 0). umulhi(p, ceil(2^32 /
 * pb)) is that quotient exactly while np · pb < 2^32, else 0: divide. */
static void fg_div(struct fgemv &a, int bc) {
    unsigned long long np = (unsigned long long)(a.cols / 8), pb = (unsigned long long)(bc / 8);
    if (pb > np) pb = np;
    if (pb < 2) pb = 2; /* bc >= 16; np < 2: only piece 0 */
    a.pb = (unsigned)pb;
    a.sdiv = np * pb < (1ull << 32) ? (unsigned)(((1ull << 32) + pb - 1) / pb) : 0u;
    a.nbc = (unsigned)((a.cols + bc - 1) / bc);
}

template <bool MX, typename XT, typename HT, int G, int NR, int R>
void fg_launch(struct cuda_ctx *c, const struct fgemv &a, long max_tiles) {
    /* the dense GEMVs' split, by one expert matrix's shape (gate, up and
     * down each units × cols) in 8-byte pieces (an FP8 column is a byte,
     * an MXFP4 column half of one) */
    const int ks = gemv_k_parts(c, a.units, MX ? a.cols / 2 : a.cols, true);
    const dim3 grid((unsigned)((a.units + (FG_WARPS / ks) * R - 1) / ((FG_WARPS / ks) * R)), (unsigned)max_tiles);
    if (ks == 4) pdl_launch(c, moe_gemv_q_kernel<MX, XT, HT, G, NR, R, 4>, grid, dim3(FG_THREADS), 0, a);
    else if (ks == 2) pdl_launch(c, moe_gemv_q_kernel<MX, XT, HT, G, NR, R, 2>, grid, dim3(FG_THREADS), 0, a);
    else pdl_launch(c, moe_gemv_q_kernel<MX, XT, HT, G, NR, R, 1>, grid, dim3(FG_THREADS), 0, a);
}

/* gate|up (fp32 token rows in, the activation into h: HT), then down (h
 * in, fp32 out): 2 weight rows a warp for both (gate|up one unit, down
 * two), for every tile size, as the bf16 experts' GEMV. */
template <bool MX, typename HT, int NR>
void gemv_pair(struct cuda_ctx *c, void *h, const float *x, long H, long F, const int32_t *order, int top_k,
               void *const *tab, long E, const int4 *tiles, const int *n_tiles, long max_tiles, float *out,
               int br, int bc, const struct moe_epi &ep) {
    const void *const *w = (const void *const *)tab;
    const void *const *s = (const void *const *)(tab + 3 * E);
    struct fgemv gu = {h, F, x, H, order, top_k, w, w + E, s, s + E, tiles, n_tiles, F, H, br, 0, 0, 0, ep};
    if (!MX) fg_div(gu, bc);
    fg_launch<MX, float, HT, 2, NR, 1>(c, gu, max_tiles);
    struct fgemv dn = {out, H, h, F, NULL, 1, w + 2 * E, NULL, s + 2 * E, NULL, tiles, n_tiles, H, F, br, 0, 0, 0, ep};
    if (!MX) fg_div(dn, bc);
    fg_launch<MX, HT, HT, 1, NR, 2>(c, dn, max_tiles);
}

/* ---- prefill: the grouped mma.sync product ------------------------------ */

constexpr int WARPS = 4;
constexpr int BN = 16 * WARPS; /* weight rows per CTA */
constexpr int BK = 64;         /* columns per k-step */
constexpr int STAGES = 4;
constexpr int THREADS = 32 * WARPS;
/* a stage's codes, [BN][BK] plain: a byte a column (FP8) or half of one (MXFP4) */
template <bool MX> __host__ __device__ constexpr uint32_t raw_bytes() { return MX ? BN * BK / 2 : BN * BK; }
constexpr uint32_t W16_BYTES = BN * BK * 2;

/* byte offset of 16-byte chunk c of row r in a [rows][BK] bf16 tile */
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return (uint32_t)(r * (BK * 2) + ((c ^ (r & 7)) << 4));
}

struct grouped8 {
    const void *const *w_a; /* [experts] codes (glu: the gates) */
    const void *const *w_b; /* [experts] glu: the ups; else NULL */
    const void *const *s_a; /* their scales (FP8: fp32 blocks; MXFP4: exponent bytes) */
    const void *const *s_b;
    const int4 *tiles;
    const int *n_tiles;
    const int32_t *order; /* NULL: x holds the sorted rows; else sorted row p reads x row order[p] / top_k */
    int top_k;
    int br, bc; /* block rows, block columns (a multiple of BK) */
    struct moe_epi ep; /* biases and activation (glu: gate, up; else down) */
};

enum { MODE_GROUPED, MODE_GLU };

template <int MT> __host__ __device__ constexpr uint32_t a_bytes() { return ((MT + 1) & ~1) * 8 * BK * 2; }
template <bool MX, int MT> constexpr size_t smem_bytes() {
    return (size_t)STAGES * (raw_bytes<MX>() + a_bytes<MT>()) + W16_BYTES;
}

/* As gemm_small_kernel (cuda_gemm_small.cu) with bf16 activations and
 * FP8 or (MX) MXFP4 weights (see the top of the file). MODE_GLU: y is
 * bf16 [rows][N]. */
template <bool MX, int MT, int MODE>
__global__ void __launch_bounds__(THREADS)
gemm_q_kernel(float *y, long ldy, const __nv_bfloat16 *__restrict__ x, long ldx, int N, int K,
              struct grouped8 g) {
    constexpr int MTE = (MT + 1) & ~1;
    constexpr int A_ROWS = MTE * 8;
    constexpr uint32_t A_BYTES = a_bytes<MT>();
    constexpr uint32_t RAW_BYTES = raw_bytes<MX>();
    constexpr uint32_t RB = RAW_BYTES / BN; /* a weight row's bytes in a stage */
    constexpr uint32_t STAGE_BYTES = RAW_BYTES + A_BYTES;
    extern __shared__ __align__(128) unsigned char smem[];
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n0 = blockIdx.x * BN;
    int a_row0 = 0;
    pdl_wait(); /* the tile list is written by the kernel before */
    if ((int)blockIdx.y >= *g.n_tiles) return;
    const int4 t = g.tiles[blockIdx.y];
    const uint8_t *w = (const uint8_t *)g.w_a[t.x];
    const uint8_t *w_b = NULL;
    if (MODE == MODE_GLU) w_b = (const uint8_t *)g.w_b[t.x], n0 = blockIdx.x * (BN / 2);
    if (g.order) a_row0 = t.y;
    else x += (long)t.y * ldx;
    y = (float *)((char *)y + (long)t.y * ldy * (MODE == MODE_GLU ? 2 : 4));
    const int M = t.z;
    const int k1 = K / BK;
    const uint32_t sbase = ptx_smem_u32(smem), w16 = sbase + STAGES * STAGE_BYTES;

    /* stage row r's weight row: the glu's rows 0-31 are gate rows n0..,
     * 32-63 up rows n0.. (rows past N: the last) */
    auto w_row = [&](int r) -> int {
        return MODE == MODE_GLU ? min(n0 + (r & (BN / 2 - 1)), N - 1) : min(n0 + r, N - 1);
    };
    /* the codes of a stage: BN rows of RB bytes, RB / 16 chunks a row */
    auto load_w = [&](int stage, int ks) {
        uint32_t dst = sbase + stage * STAGE_BYTES;
        constexpr int CPR = RB / 16;
#pragma unroll
        for (int i = 0; i < BN * CPR / THREADS; i++) {
            int idx = tid + i * THREADS, r = idx / CPR, c = idx % CPR;
            const uint8_t *src = (MODE == MODE_GLU && r >= BN / 2 ? w_b : w) + (long)w_row(r) * (K / (MX ? 2 : 1));
            ptx_cp_async16(dst + r * RB + c * 16, src + (long)ks * RB + c * 16);
        }
    };
    constexpr int AI = (A_ROWS * 8 + THREADS - 1) / THREADS;
    const __nv_bfloat16 *arow[AI];
#pragma unroll
    for (int i = 0; i < AI; i++) {
        int gr = min((tid + i * THREADS) >> 3, M - 1);
        if (g.order) arow[i] = x + (long)(g.order[a_row0 + gr] / g.top_k) * ldx;
        else arow[i] = x + (long)gr * ldx;
    }
    auto load_a = [&](int stage, int ks) {
        uint32_t dst = sbase + stage * STAGE_BYTES + RAW_BYTES;
#pragma unroll
        for (int i = 0; i < AI; i++) {
            int idx = tid + i * THREADS;
            if (idx < A_ROWS * 8) {
                int r = idx >> 3, c = idx & 7;
                ptx_cp_async16(dst + swz(r, c), arow[i] + (long)ks * BK + c * 8);
            }
        }
    };
    /* the stage's codes (of k-step ks) widened into the bf16 tile; MXFP4
     * times their exponents' powers of two (exact in bf16) */
    auto widen = [&](int stage, int ks) {
        const unsigned char *raw = smem + stage * STAGE_BYTES;
        unsigned char *dst = smem + STAGES * STAGE_BYTES;
        if constexpr (MX) {
            /* a thread a 16-byte chunk: 32 columns, one exponent */
            static_assert(BN * 2 == THREADS, "moe mxfp4 mma: a chunk a thread");
            const int r = tid >> 1, c = tid & 1;
            const uint8_t *ex = (const uint8_t *)(MODE == MODE_GLU && r >= BN / 2 ? g.s_b : g.s_a)[t.x];
            const float sc = mx_scale(__ldg(ex + (long)w_row(r) * (K / 32) + ks * (BK / 32) + c));
            const uint4 q = *(const uint4 *)(raw + r * RB + c * 16);
            const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float f[8];
                mx_widen8(qw[i], f);
                uint32_t o[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * k] * sc, f[2 * k + 1] * sc);
                    o[k] = *(const uint32_t *)&b;
                }
                *(uint4 *)(dst + swz(r, 4 * c + i)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BN * 4 / THREADS; i++) {
                int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
                uint4 q = *(const uint4 *)(raw + r * BK + c * 16), lo, hi;
                fp8_to_bf16x16(q, lo, hi);
                *(uint4 *)(dst + swz(r, 2 * c)) = lo;
                *(uint4 *)(dst + swz(r, 2 * c + 1)) = hi;
            }
        }
    };

    /* FP8: the scales of this lane's two weight rows (rows past N: the last) */
    const float *sA = NULL, *sB = NULL;
    int k16_per_block = 1;
    const int k16_total = k1 * (BK / 16);
    if constexpr (!MX) {
        int rowA;
        const float *sp;
        if (MODE == MODE_GLU) {
            rowA = n0 + (warp & 1) * 16 + (lane >> 2);
            sp = (const float *)(warp < 2 ? g.s_a[t.x] : g.s_b[t.x]);
        } else {
            rowA = n0 + warp * 16 + (lane >> 2);
            sp = (const float *)g.s_a[t.x];
        }
        const int rowB = rowA + 8, nbc = (K + g.bc - 1) / g.bc;
        sA = sp + (long)(min(rowA, N - 1) / g.br) * nbc;
        sB = sp + (long)(min(rowB, N - 1) / g.br) * nbc;
        k16_per_block = g.bc / 16;
    }

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < k1) load_w(s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < k1) load_a(s, s);
        ptx_cp_async_commit();
    }

    float acc[MT][4], part[MT][4];
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[j][q] = part[j][q] = 0.0f;

    const int wr = warp * 16 + (lane & 15), wc = lane >> 4;
    const int aq = lane >> 3, ar = lane & 7;

    for (int kk = 0; kk < k1; kk++) {
        ptx_cp_async_wait<STAGES - 2>();
        __syncthreads(); /* stage kk landed (every thread's copies); the tile's last readers are done */
        widen(kk % STAGES, kk);
        __syncthreads(); /* the bf16 tile is whole */
        {
            /* into the slot of step kk - 1, whose codes were widened and
             * whose activations were read before the syncs above */
            int nxt = kk + STAGES - 1, st = nxt % STAGES;
            if (nxt < k1) load_w(st, nxt), load_a(st, nxt);
            ptx_cp_async_commit();
        }
        const uint32_t sa = sbase + (kk % STAGES) * STAGE_BYTES + RAW_BYTES;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t a[4];
            ptx_ldmatrix_x4(a[0], a[1], a[2], a[3], w16 + swz(wr, 2 * ks + wc));
#pragma unroll
            for (int j = 0; j < MTE; j += 2) {
                uint32_t b0, b1, b2, b3;
                ptx_ldmatrix_x4(b0, b1, b2, b3, sa + swz((j + (aq >> 1)) * 8 + ar, 2 * ks + (aq & 1)));
                /* MXFP4: the values carry their scales; FP8: per K block */
                ptx_mma_m16n8k16<__nv_bfloat16>(MX ? acc[j] : part[j], a, b0, b1);
                if (j + 1 < MT) ptx_mma_m16n8k16<__nv_bfloat16>(MX ? acc[j + 1] : part[j + 1], a, b2, b3);
            }
            /* FP8, the end of a K block (or of K): its products times its scales */
            const int kq = kk * (BK / 16) + ks;
            if (!MX && ((kq + 1) % k16_per_block == 0 || kq + 1 == k16_total)) {
                const int kb = kq / k16_per_block;
                const float a_s = __ldg(sA + kb), b_s = __ldg(sB + kb);
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    acc[j][0] = fmaf(a_s, part[j][0], acc[j][0]);
                    acc[j][1] = fmaf(a_s, part[j][1], acc[j][1]);
                    acc[j][2] = fmaf(b_s, part[j][2], acc[j][2]);
                    acc[j][3] = fmaf(b_s, part[j][3], acc[j][3]);
                    part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.0f;
                }
            }
        }
    }
    ptx_cp_async_wait<0>();

    moe_mma_epilogue<MT, MODE == MODE_GLU, __nv_bfloat16>(acc, (float *)smem, y, ldy, n0, N, M, t.x, g.ep);
}

/* The variant's shared-memory limit, once per variant and device (bits
 * 16.. of cuda_ctx.gemm_small_ready; cuda_gemm_small.cu takes the low ones). */
template <bool MX, int MT, int MODE> void setup(struct cuda_ctx *c) {
    const unsigned bit = 1u << (16 + (MX ? 4 : 0) + (MT == 2 ? 0 : 2) + MODE);
    if (c->gemm_small_ready & bit) return;
    CUDA_CHECK(cudaFuncSetAttribute(gemm_q_kernel<MX, MT, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem_bytes<MX, MT>()));
    c->gemm_small_ready |= bit;
}

template <bool MX, int MT>
void launch_grouped(struct cuda_ctx *c, void *y, long ldy, const void *x16, long ldx, const struct grouped8 &g,
                    long max_tiles, long N, long K) {
    if (g.w_b) {
        setup<MX, MT, MODE_GLU>(c);
        pdl_launch(c, gemm_q_kernel<MX, MT, MODE_GLU>, dim3((unsigned)((N + BN / 2 - 1) / (BN / 2)), (unsigned)max_tiles),
                   dim3(THREADS), smem_bytes<MX, MT>(), (float *)y, ldy, (const __nv_bfloat16 *)x16, ldx, (int)N,
                   (int)K, g);
    } else {
        setup<MX, MT, MODE_GROUPED>(c);
        pdl_launch(c, gemm_q_kernel<MX, MT, MODE_GROUPED>, dim3((unsigned)((N + BN - 1) / BN), (unsigned)max_tiles),
                   dim3(THREADS), smem_bytes<MX, MT>(), (float *)y, ldy, (const __nv_bfloat16 *)x16, ldx, (int)N,
                   (int)K, g);
    }
}

} // namespace

extern "C" int cuda_moe_quant_ok(enum dtype dt, long hidden, long inter, int block_rows, int block_cols) {
    if (hidden > INT32_MAX || inter > INT32_MAX) return 0;
    if (dt == DTYPE_MXFP4) return hidden % 32 == 0 && inter % 32 == 0;
    return dt == DTYPE_F8_E4M3 && hidden % 16 == 0 && inter % 16 == 0 && block_rows >= 1 && block_cols >= 16 &&
           block_cols % 16 == 0;
}

extern "C" int cuda_moe_quant_mma_ok(long hidden, long inter) { return hidden % BK == 0 && inter % BK == 0; }

namespace {
template <bool MX>
void gemv_q(struct cuda_ctx *c, int tile_rows, void *h, float *out, const float *x, long H, long F,
            const int32_t *order, int top_k, void *const *tab, long E, const int4 *tl, const int *n_tiles,
            long max_tiles, int br, int bc, int h32, const struct moe_epi &ep) {
    if (h32 && tile_rows == 1) gemv_pair<MX, float, 1>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, out, br, bc, ep);
    else if (h32) gemv_pair<MX, float, 8>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, out, br, bc, ep);
    else if (tile_rows == 1)
        gemv_pair<MX, __nv_bfloat16, 1>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, out, br, bc, ep);
    else gemv_pair<MX, __nv_bfloat16, 8>(c, h, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, out, br, bc, ep);
}

template <bool MX>
void grouped_q(struct cuda_ctx *c, int tile_rows, void *h, float *out, const void *x16, long H, long F,
               const struct grouped8 &gu, const struct grouped8 &dn, long max_tiles) {
    if (tile_rows <= 16) {
        launch_grouped<MX, 2>(c, h, F, x16, H, gu, max_tiles, F, H);
        launch_grouped<MX, 2>(c, out, H, h, F, dn, max_tiles, H, F);
    } else {
        launch_grouped<MX, 8>(c, h, F, x16, H, gu, max_tiles, F, H);
        launch_grouped<MX, 8>(c, out, H, h, F, dn, max_tiles, H, F);
    }
}
} // namespace

extern "C" void cuda_moe_quant_gemv(struct cuda_ctx *c, int tile_rows, void *h, float *out, const float *x, long H,
                                    long F, const int32_t *order, int top_k, void *const *tab, long E,
                                    const void *tiles, const int *n_tiles, long max_tiles, int br, int bc, int h32,
                                    const struct moe_experts *e) {
    const int4 *tl = (const int4 *)tiles;
    const struct moe_epi ep = moe_epi_of(e);
    if (max_tiles <= 0) return;
    CUDA_ASSERT(tile_rows == 1 || tile_rows == 8);
    CUDA_ASSERT_MSG((uintptr_t)x % 16 == 0, "moe_ffn: quantized experts need 16-byte aligned token rows");
    if (e->gate[0].dtype == DTYPE_MXFP4)
        gemv_q<true>(c, tile_rows, h, out, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, br, bc, h32, ep);
    else gemv_q<false>(c, tile_rows, h, out, x, H, F, order, top_k, tab, E, tl, n_tiles, max_tiles, br, bc, h32, ep);
}

extern "C" void cuda_moe_quant_grouped(struct cuda_ctx *c, int tile_rows, void *h, float *out, const void *x16,
                                       long H, long F, const int32_t *order, int top_k, void *const *tab, long E,
                                       const void *tiles, const int *n_tiles, long max_tiles, int br, int bc,
                                       const struct moe_experts *e) {
    if (max_tiles <= 0) return;
    const void *const *w = (const void *const *)tab;
    const void *const *s = (const void *const *)(tab + 3 * E);
    const int4 *tl = (const int4 *)tiles;
    struct grouped8 gu = {w, w + E, s, s + E, tl, n_tiles, order, top_k, br, bc, moe_epi_of(e)};
    struct grouped8 dn = {w + 2 * E, NULL, s + 2 * E, NULL, tl, n_tiles, NULL, 1, br, bc, moe_epi_of(e)};
    if (e->gate[0].dtype == DTYPE_MXFP4) grouped_q<true>(c, tile_rows, h, out, x16, H, F, gu, dn, max_tiles);
    else grouped_q<false>(c, tile_rows, h, out, x16, H, F, gu, dn, max_tiles);
}
