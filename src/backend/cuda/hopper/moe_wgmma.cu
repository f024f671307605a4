/* moe_wgmma.cu — the expert products of a MoE layer for prefill-sized
 * groups on Hopper (wgmma + TMA): each expert's rows, sorted by expert
 * (cuda_moe.cu's device path), times that expert's 16-bit weight, fp32
 * accumulation. Two products per layer:
 *   gate|up: h16[p][F] = silu(xs16[p] · gate_eᵀ) · (xs16[p] · up_eᵀ)
 *   down:    out[p][H] = h16[p] · down_eᵀ (fp32)
 * where xs16 holds the sorted rows' activations in 16 bits
 * (cuda_moe_wgmma_gather writes it from the fp32 tokens).
 *
 * Why: with hundreds of rows per expert (a long prompt: 8192 tokens give
 * each of DeepSeek-V2-Lite's 64 experts ~770 rows) the product is bound by
 * the tensor cores, and the mma.sync kernel of cuda_gemm_small.cu (64 × 64
 * tiles, made for the bandwidth-bound decode rows) ran the expert
 * products at ~190 TFLOP/s on an H100.
 *
 * Design:
 *  - A CTA computes a 128-row × 256-column tile: two consumer warpgroups,
 *    each wgmma m64n256 (two m64n128k16 per k16) on its 64 rows, the
 *    activations as operand A and BN = 256 weight rows as operand B, both
 *    K-major in shared memory with 128-byte swizzle, BK = 64 columns a
 *    stage. gate|up tiles are 128 gate rows and the same 128 up rows (two
 *    TMA boxes), so each thread holds g and u of the same columns and the
 *    epilogue adds the experts' gate and up biases and writes the
 *    activation (silu(g)·u or the clamped SwiGLU) rounded to 16 bits
 *    (cuda_gemm_small.cu's values: the sums, then cuda_moe_act.cuh's
 *    epilogue, then the rounding); down's epilogue adds the down bias.
 *  - One producer warp (one lane) streams both tiles with TMA into a
 *    4-deep ring (48 KB a stage), guarded by "full" (transaction bytes)
 *    and "empty" (each consumer warp arrives) mbarriers. Consumers keep
 *    one k-step of wgmmas in flight (wait_group 1) and release the stage
 *    before it.
 *  - Grid (N tiles, row tiles): the row tiles are cuda_moe.cu's device
 *    tile list (expert, first sorted row, rows ≤ 128); CTAs past its
 *    device count return at once. The weights' tensor maps — one per
 *    expert and matrix — live in device memory (an array per layer, made
 *    once and cached by the experts' pointers); the rows' map (xs16 or
 *    h16) is a kernel parameter. Rows of the next expert that a tile's
 *    box reaches are computed and not stored; past the last row TMA fills
 *    zeros, as it does for a K tail.
 *  - Programmatic dependent launch (cuda_pdl.cuh): the tile list, the rows
 *    and x are written by the kernels before, so they are read after
 *    pdl_wait with coherent loads (no __restrict__ on them: the compiler
 *    may turn those into non-coherent loads, which a kernel scheduled
 *    while its predecessor still runs must not use).
 * Requirements (cuda_moe_wgmma_ok): compute capability 9.0, bf16 or f16
 * weights, H and F multiples of 8 (16-byte TMA row strides), F even. */
#include <cuda.h> /* CUtensorMap and its enums (header only; no -lcuda) */
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_moe_act.cuh"
#include "backend/cuda/hopper/ptx.cuh"
#include "backend/cuda/hopper/tmap.cuh"

using namespace hopper;

namespace {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4;
constexpr int CONSUMERS = 256;           /* warpgroups 0 and 1 */
constexpr int THREADS = CONSUMERS + 32;  /* + the producer warp */
constexpr uint32_t W_BYTES = BN * BK * 2, X_BYTES = BM * BK * 2;
constexpr uint32_t STAGE_BYTES = W_BYTES + X_BYTES;
constexpr size_t SMEM = 1024 + (size_t)STAGES * STAGE_BYTES + 2 * STAGES * 8;

/* Orders this thread's later tensor-map reads of `map` (global memory,
 * written by a copy) after the write. */
__device__ __forceinline__ void tensormap_acquire(const void *map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"((uint64_t)map)
                 : "memory");
}

template <typename T> __device__ __forceinline__ void put2(T *p, float a, float b);
template <> __device__ __forceinline__ void put2<__nv_bfloat16>(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
template <> __device__ __forceinline__ void put2<__half>(__half *p, float a, float b) {
    *(__half2 *)p = __floats2half2_rn(a, b);
}

/* GLU: y is T h16 [rows][N] (N = F, the gate rows), wa / wb the gates' and
 * ups' maps; else y is fp32 [rows][N] (N = H) and wa the downs' maps.
 * nk: k-steps of BK columns. */
template <bool F16, bool GLU>
__global__ void __launch_bounds__(THREADS, 1)
moe_wgmma_kernel(const __grid_constant__ CUtensorMap tx, const CUtensorMap *__restrict__ wa,
                 const CUtensorMap *__restrict__ wb, void *y, long ldy, int N, int nk,
                 const int4 *tiles, const int *n_tiles, struct moe_epi ep) {
    using T = typename std::conditional<F16, __half, __nv_bfloat16>::type;
    extern __shared__ unsigned char smem_raw[];
    pdl_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t raw = ptx_smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    const uint32_t bar0 = base + STAGES * STAGE_BYTES;
    auto full = [&](int s) { return bar0 + 8u * (uint32_t)s; };
    auto empty = [&](int s) { return bar0 + 8u * (uint32_t)(STAGES + s); };
    auto w_tile = [&](int s) { return base + (uint32_t)s * STAGE_BYTES; };
    auto x_tile = [&](int s) { return base + (uint32_t)s * STAGE_BYTES + W_BYTES; };
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), CONSUMERS / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();
    /* the tile list and the rows come from the kernels before */
    pdl_wait();
    if ((int)blockIdx.y >= *n_tiles) return;
    const int4 t = tiles[blockIdx.y];
    const int n0 = blockIdx.x * (GLU ? BN / 2 : BN);

    if (warp == CONSUMERS / 32) {
        if (lane == 0) {
            const CUtensorMap *ma = wa + t.x, *mb = GLU ? wb + t.x : ma;
            tensormap_acquire(ma);
            if (GLU) tensormap_acquire(mb);
            prefetch_tensormap(&tx);
            for (int i = 0; i < nk; i++) {
                const int s = i % STAGES;
                if (i >= STAGES) mbar_wait(empty(s), (uint32_t)((i / STAGES) & 1) ^ 1u);
                mbar_arrive_tx(full(s), STAGE_BYTES);
                if (GLU) {
                    tma_load_2d(w_tile(s), ma, full(s), i * BK, n0);
                    tma_load_2d(w_tile(s) + W_BYTES / 2, mb, full(s), i * BK, n0);
                } else {
                    tma_load_2d(w_tile(s), ma, full(s), i * BK, n0);
                }
                tma_load_2d(x_tile(s), &tx, full(s), i * BK, t.y);
            }
        }
        return;
    }

    const int wg = warp >> 2; /* rows 64·wg .. 64·wg + 63 of the tile */
    float acc[2][64];
#pragma unroll
    for (int b = 0; b < 2; b++)
#pragma unroll
        for (int j = 0; j < 64; j++) acc[b][j] = 0.0f;
    for (int i = 0; i < nk; i++) {
        const int s = i % STAGES;
        mbar_wait(full(s), (uint32_t)((i / STAGES) & 1));
        const uint64_t da = desc_sw128(x_tile(s) + (uint32_t)wg * (64 * BK * 2)), db = desc_sw128(w_tile(s));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int b = 0; b < 2; b++)
                wgmma_ss<F16>(acc[b], da + 2 * kk, db + (uint64_t)(b * 128 * 128 >> 4) + 2 * kk, 1);
        wgmma_commit();
        /* the k-step before this one is done: its stage is free */
        wgmma_wait<1>();
#pragma unroll
        for (int b = 0; b < 2; b++) fence_regs(acc[b]);
        if (i > 0 && lane == 0) mbar_arrive(empty((i - 1) % STAGES));
    }
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < 2; b++) fence_regs(acc[b]);

    /* thread's rows r, r + 8 of the tile; columns 8j + c, + 1 of each n128 block */
    const int r = wg * 64 + 16 * (warp & 3) + (lane >> 2), c = 2 * (lane & 3);
    const int M = t.z;
    if (GLU) {
        T *h = (T *)y + (long)t.y * ldy;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int n = n0 + 8 * j + c;
            if (n >= N) continue;
            if (r < M)
                put2<T>(h + (long)r * ldy + n, moe_glu_f32(ep, t.x, n, N, acc[0][4 * j], acc[1][4 * j]),
                        moe_glu_f32(ep, t.x, n + 1, N, acc[0][4 * j + 1], acc[1][4 * j + 1]));
            if (r + 8 < M)
                put2<T>(h + (long)(r + 8) * ldy + n,
                        moe_glu_f32(ep, t.x, n, N, acc[0][4 * j + 2], acc[1][4 * j + 2]),
                        moe_glu_f32(ep, t.x, n + 1, N, acc[0][4 * j + 3], acc[1][4 * j + 3]));
        }
    } else {
        float *o = (float *)y + (long)t.y * ldy;
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int n = n0 + b * 128 + 8 * j + c;
                if (n >= N) continue;
                /* + 0.0f: a -0 sum stored as +0, as the other products do */
                if (r < M)
                    *(float2 *)(o + (long)r * ldy + n) =
                        make_float2(moe_down_f32(ep, t.x, n, N, acc[b][4 * j]) + 0.0f,
                                    moe_down_f32(ep, t.x, n + 1, N, acc[b][4 * j + 1]) + 0.0f);
                if (r + 8 < M)
                    *(float2 *)(o + (long)(r + 8) * ldy + n) =
                        make_float2(moe_down_f32(ep, t.x, n, N, acc[b][4 * j + 2]) + 0.0f,
                                    moe_down_f32(ep, t.x, n + 1, N, acc[b][4 * j + 3]) + 0.0f);
            }
    }
}

/* xs16[p] = x[order[p] / top_k] in T for the rows of the tile list (a CTA
 * per tile). */
template <typename T>
__global__ void __launch_bounds__(256)
moe_gather16_kernel(T *xs, const float *x, int H, const int32_t *order, int top_k, const int4 *tiles,
                    const int *n_tiles) {
    pdl_trigger();
    pdl_wait();
    if ((int)blockIdx.x >= *n_tiles) return;
    const int4 t = tiles[blockIdx.x];
    const int per = H / 4; /* float4 groups a row */
    for (int i = threadIdx.x; i < t.z * per; i += blockDim.x) {
        const int r = i / per, q = (i % per) * 4;
        const long p = (long)t.y + r;
        const float4 v = *(const float4 *)(x + (long)(order[p] / top_k) * H + q);
        put2<T>(xs + p * H + q, v.x, v.y);
        put2<T>(xs + p * H + q + 2, v.z, v.w);
    }
}

/* ---- host side --------------------------------------------------------- */

/* The tensor maps of one layer's experts: [gate E][up E][down E] in device
 * memory, found by the experts' pointers (a host copy is kept). */
struct layer_maps {
    const void **ptrs; /* [3 E] */
    int E;
    long H, F;
    int dtype;
    CUtensorMap *dev;  /* [3 E] */
};

struct mw_state {
    PFN_cuTensorMapEncodeTiled_v12000 encode;
    struct layer_maps *l;
    int n, cap;
    struct {
        const void *p;
        long rows, cols;
        int dtype;
        CUtensorMap map;
    } x[8]; /* rows' maps, a ring */
    int x_next;
};

static int encode(const struct mw_state *st, CUtensorMap *m, const void *p, long rows, long cols,
                  int dtype, int box) {
    return tmap_2d(st->encode, m, p, rows, cols, cols, dtype, box);
}

/* The layer's maps; made on first use unless `make` is 0 (NULL then). */
static const CUtensorMap *layer_find(struct mw_state *st, const struct moe_experts *e, int make) {
    const int E = e->n_experts;
    for (int i = 0; i < st->n; i++) {
        struct layer_maps *l = &st->l[i];
        if (l->E != E || l->H != e->hidden || l->F != e->inter || l->dtype != (int)e->gate[0].dtype) continue;
        int same = 1;
        for (int k = 0; k < E && same; k++)
            same = l->ptrs[k] == e->gate[k].data && l->ptrs[E + k] == e->up[k].data &&
                   l->ptrs[2 * E + k] == e->down[k].data;
        if (same) return l->dev;
    }
    if (!make) return NULL;
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        struct layer_maps *nl = (struct layer_maps *)realloc(st->l, (size_t)cap * sizeof *nl);
        CUDA_ASSERT(nl);
        st->l = nl, st->cap = cap;
    }
    struct layer_maps *l = &st->l[st->n];
    l->E = E, l->H = e->hidden, l->F = e->inter, l->dtype = (int)e->gate[0].dtype;
    l->ptrs = (const void **)malloc((size_t)3 * E * sizeof *l->ptrs);
    CUtensorMap *h = (CUtensorMap *)malloc((size_t)3 * E * sizeof *h);
    CUDA_ASSERT(l->ptrs && h);
    for (int k = 0; k < E; k++) {
        l->ptrs[k] = e->gate[k].data, l->ptrs[E + k] = e->up[k].data, l->ptrs[2 * E + k] = e->down[k].data;
        CUDA_ASSERT_MSG(encode(st, &h[k], e->gate[k].data, e->inter, e->hidden, l->dtype, BN / 2) &&
                            encode(st, &h[E + k], e->up[k].data, e->inter, e->hidden, l->dtype, BN / 2) &&
                            encode(st, &h[2 * E + k], e->down[k].data, e->hidden, e->inter, l->dtype, BN),
                        "moe wgmma: cannot encode an expert's tensor map");
    }
    CUDA_CHECK(cudaMalloc((void **)&l->dev, (size_t)3 * E * sizeof(CUtensorMap)));
    CUDA_CHECK(cudaMemcpy(l->dev, h, (size_t)3 * E * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
    free(h);
    st->n++;
    return l->dev;
}

static const CUtensorMap *rows_map(struct mw_state *st, const void *p, long rows, long cols, int dtype) {
    for (int i = 0; i < 8; i++)
        if (st->x[i].p == p && st->x[i].rows == rows && st->x[i].cols == cols && st->x[i].dtype == dtype)
            return &st->x[i].map;
    int i = st->x_next;
    st->x_next = (i + 1) % 8;
    CUDA_ASSERT_MSG(encode(st, &st->x[i].map, p, rows, cols, dtype, BM),
                    "moe wgmma: cannot encode the rows' tensor map");
    st->x[i].p = p, st->x[i].rows = rows, st->x[i].cols = cols, st->x[i].dtype = dtype;
    return &st->x[i].map;
}

template <bool F16, bool GLU>
void launch(struct cuda_ctx *c, const CUtensorMap *tx, const CUtensorMap *wa, const CUtensorMap *wb,
            void *y, long ldy, int N, int nk, const int4 *tiles, const int *n_tiles, long max_tiles,
            const struct moe_epi &ep) {
    auto k = moe_wgmma_kernel<F16, GLU>;
    const long nt = GLU ? (N + BN / 2 - 1) / (BN / 2) : (N + BN - 1) / BN;
    pdl_launch(c, k, dim3((unsigned)nt, (unsigned)max_tiles), dim3(THREADS), SMEM, *tx, wa, wb, y, ldy, N,
               nk, tiles, n_tiles, ep);
}

template <bool F16, bool GLU> void setup(void) {
    CUDA_CHECK(cudaFuncSetAttribute(moe_wgmma_kernel<F16, GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SMEM));
}

} // namespace

extern "C" int cuda_moe_wgmma_init(struct cuda_ctx *c) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = tmap_encoder(c->device);
    if (!fn) return 0;
    struct mw_state *st = (struct mw_state *)calloc(1, sizeof *st);
    CUDA_ASSERT(st);
    st->encode = fn;
    setup<false, false>();
    setup<false, true>();
    setup<true, false>();
    setup<true, true>();
    c->moe_wg_state = st;
    return 1;
}

/* The cached maps (the experts they point at are going away). */
extern "C" void cuda_moe_wgmma_forget(struct cuda_ctx *c) {
    struct mw_state *st = (struct mw_state *)c->moe_wg_state;
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        (void)cudaFree(st->l[i].dev);
        free(st->l[i].ptrs);
    }
    st->n = 0;
    memset(st->x, 0, sizeof st->x);
}

extern "C" void cuda_moe_wgmma_release(struct cuda_ctx *c) {
    struct mw_state *st = (struct mw_state *)c->moe_wg_state;
    if (!st) return;
    cuda_moe_wgmma_forget(c);
    free(st->l);
    free(st);
    c->moe_wg_state = NULL;
}

extern "C" int cuda_moe_wgmma_ok(const struct cuda_ctx *c, const struct moe_experts *e) {
    struct mw_state *st = (struct mw_state *)c->moe_wg_state;
    if (!st || !c->moe_wgmma) return 0;
    const enum dtype dt = e->gate[0].dtype;
    if ((dt != DTYPE_BF16 && dt != DTYPE_F16) || e->hidden % 8 || e->inter % 8 || e->hidden > INT32_MAX ||
        e->inter > INT32_MAX)
        return 0;
    for (int k = 0; k < e->n_experts; k++)
        if (e->gate[k].dtype != dt || e->up[k].dtype != dt || e->down[k].dtype != dt ||
            ((uintptr_t)e->gate[k].data & 15) || ((uintptr_t)e->up[k].data & 15) ||
            ((uintptr_t)e->down[k].data & 15))
            return 0;
    /* the experts' maps are made (device memory and a copy) outside a
     * graph's capture only; a captured step without them takes the
     * mma.sync products */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    return layer_find(st, e, cs == cudaStreamCaptureStatusNone) != NULL;
}

extern "C" void cuda_moe_wgmma_gather(struct cuda_ctx *c, enum dtype dt, void *xs16, const float *x, long H,
                                      const int32_t *order, int top_k, const void *tiles, const int *n_tiles,
                                      long max_tiles) {
    if (dt == DTYPE_BF16)
        pdl_launch(c, moe_gather16_kernel<__nv_bfloat16>, dim3((unsigned)max_tiles), dim3(256), 0,
                   (__nv_bfloat16 *)xs16, x, (int)H, order, top_k, (const int4 *)tiles, n_tiles);
    else
        pdl_launch(c, moe_gather16_kernel<__half>, dim3((unsigned)max_tiles), dim3(256), 0, (__half *)xs16, x,
                   (int)H, order, top_k, (const int4 *)tiles, n_tiles);
}

extern "C" void cuda_moe_wgmma_ffn(struct cuda_ctx *c, const struct moe_experts *e, void *h16, float *out,
                                   const void *xs16, long rows, const void *tiles, const int *n_tiles,
                                   long max_tiles) {
    struct mw_state *st = (struct mw_state *)c->moe_wg_state;
    CUDA_ASSERT(st && max_tiles > 0 && max_tiles <= 65535);
    const int E = e->n_experts, dt = (int)e->gate[0].dtype;
    const long H = e->hidden, F = e->inter;
    const CUtensorMap *maps = layer_find(st, e, 0);
    CUDA_ASSERT(maps); /* made by cuda_moe_wgmma_ok */
    const CUtensorMap *tx = rows_map(st, xs16, rows, H, dt), *th = rows_map(st, h16, rows, F, dt);
    const int4 *tl = (const int4 *)tiles;
    const struct moe_epi ep = moe_epi_of(e);
    const int nk_up = (int)((H + BK - 1) / BK), nk_down = (int)((F + BK - 1) / BK);
    if (dt == DTYPE_F16) {
        launch<true, true>(c, tx, maps, maps + E, h16, F, (int)F, nk_up, tl, n_tiles, max_tiles, ep);
        launch<true, false>(c, th, maps + 2 * E, NULL, out, H, (int)H, nk_down, tl, n_tiles, max_tiles, ep);
    } else {
        launch<false, true>(c, tx, maps, maps + E, h16, F, (int)F, nk_up, tl, n_tiles, max_tiles, ep);
        launch<false, false>(c, th, maps + 2 * E, NULL, out, H, (int)H, nk_down, tl, n_tiles, max_tiles, ep);
    }
}
