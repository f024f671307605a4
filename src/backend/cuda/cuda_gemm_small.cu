/* cuda_gemm_small.cu — the expert products of a MoE layer on the device
 * (cuda_moe.cu): y[m][n] = x16[m][:] · w_e[n][:] for each expert e's rows,
 * 16-bit weights W_e[N][K] and activations (bf16 or f16, the weights'
 * type), fp32 accumulation.
 *
 * Why: a decode step gives each expert a few rows, where the product is
 * bound by reading W_e once; one launch covers every expert, with the
 * rows' grouping built on the device, so nothing goes through the host
 * (graph-capturable).
 *
 * Design (bandwidth first):
 *  - The weight is the mma's row operand: out^T[n][m] = W[n][:] · X[m][:],
 *    so mma.sync.m16n8k16 takes 16 weight rows (A, row-major) against 8
 *    activation rows (B, "col" = X row-major). M is padded only to 8
 *    (MT = ceil(M/8) n8 tiles of activations), never to 16.
 *  - A CTA is 4 warps and owns BN = 64 weight rows; warp w owns rows
 *    16w..16w+15 and all M activation rows (MT·4 fp32 accumulators per
 *    lane). Per k-step of BK = 64 columns the CTA copies its 64×64 weight
 *    tile (8 KB) and the M×64 activation tile into shared memory with
 *    16-byte cp.async.cg (L2 only: the weight is streamed once), in a
 *    STAGES = 4 deep ring: 3 tiles in flight per CTA, several CTAs per SM.
 *    Fragments come from shared memory through ldmatrix; rows are 128
 *    bytes, the 16-byte chunk c of row r lives at chunk c ^ (r & 7), so
 *    ldmatrix's 8 row addresses hit 8 different bank groups.
 *  - Rows past M (activations) or past N (weights) are loaded clamped to
 *    the last valid row (valid memory, no branch in the copy) and their
 *    results are never stored.
 *  - The rows come sorted by expert with a device tile list (expert, first
 *    row, rows) built on the device; CTA (x, t) runs N tile x of tile t
 *    with that expert's weight, and CTAs past the list's device count
 *    return at once, so the grid is sized by a bound. No K split.
 *  - With `glu`, the CTA's 64 weight rows are 32 rows of the expert's gate
 *    and the same 32 of its up (warps 0-1 and 2-3), and the epilogue adds
 *    the experts' gate and up biases and writes the activation (silu(g)·u
 *    or the clamped SwiGLU, cuda_moe_act.cuh) in 16 bits: the down
 *    product's operand. Without, the epilogue adds the down bias.
 *  - Programmatic dependent launch (cuda_pdl.cuh): the weight tiles of the
 *    first STAGES-1 steps are issued before pdl_wait (weights are never
 *    written by kernels), the activations after it.
 * Requirements (cuda_gemm_small_grouped_ok): K % 64 == 0, 16-byte aligned
 * weights, activations and row stride. */
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/cuda_moe_act.cuh"

namespace {

constexpr int WARPS = 4;
constexpr int BN = 16 * WARPS; /* weight rows per CTA */
constexpr int BK = 64;         /* columns per k-step: 128-byte smem rows */
constexpr int STAGES = 4;
constexpr int THREADS = 32 * WARPS;

/* byte offset of 16-byte chunk c of row r in a [rows][BK] tile */
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return (uint32_t)(r * (BK * 2) + ((c ^ (r & 7)) << 4));
}

/* The grouped mode's arguments (see the top of the file). */
struct grouped {
    const void *const *w_a; /* [experts] weights (glu: the gates) */
    const void *const *w_b; /* [experts] glu: the ups; else NULL */
    const int4 *tiles;      /* (expert, first sorted row, rows, -) */
    const int *n_tiles;     /* tiles in the list (device) */
    const int32_t *order;   /* NULL: x holds the sorted rows; else sorted row p reads
                               x row order[p] / top_k */
    int top_k;
    struct moe_epi ep;      /* biases and activation (glu: gate, up; else down) */
};

enum { MODE_GROUPED, MODE_GLU };


/* MT: n8 tiles of activation rows (M <= 8·MT); MTE: MT rounded up to even
 * (ldmatrix.x4 reads two tiles at a time; the odd one's partner is loaded
 * too, clamped, and its products are skipped). MODE: grouped (y fp32), or
 * with the SwiGLU epilogue (y is then T [rows][N] with N the experts'
 * inner size). */
template <typename T, int MT, int MODE>
__global__ void __launch_bounds__(THREADS)
gemm_small_kernel(float *y, long ldy, const T *__restrict__ x, long ldx, int N, int K,
                  struct grouped g) {
    constexpr int MTE = (MT + 1) & ~1;
    constexpr int A_ROWS = MTE * 8;
    constexpr uint32_t W_BYTES = BN * BK * 2, A_BYTES = A_ROWS * BK * 2;
    constexpr uint32_t STAGE_BYTES = W_BYTES + A_BYTES;
    extern __shared__ __align__(128) unsigned char smem[];
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n0 = blockIdx.x * BN;
    const T *w_b = NULL;
    int a_row0 = 0;
    /* the tile list is written by the kernel before: wait before reading it */
    pdl_wait();
    if ((int)blockIdx.y >= *g.n_tiles) return;
    const int4 t = g.tiles[blockIdx.y];
    const T *w = (const T *)g.w_a[t.x];
    if (MODE == MODE_GLU) w_b = (const T *)g.w_b[t.x], n0 = blockIdx.x * (BN / 2);
    if (g.order) a_row0 = t.y;
    else x += (long)t.y * ldx;
    y = (float *)((char *)y + (long)t.y * ldy * (MODE == MODE_GLU ? sizeof(T) : sizeof(float)));
    const int M = t.z;
    const int k0 = 0, k1 = K / BK;
    const uint32_t sbase = ptx_smem_u32(smem);

    auto load_w = [&](int stage, int ks) {
        uint32_t dst = sbase + stage * STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < BN * 8 / THREADS; i++) {
            int idx = tid + i * THREADS, r = idx >> 3, c = idx & 7;
            const T *src;
            if (MODE == MODE_GLU) { /* rows 0-31: gate rows n0.., 32-63: up rows n0.. */
                int gr = min(n0 + (r & (BN / 2 - 1)), N - 1);
                src = (r < BN / 2 ? w : w_b) + (long)gr * K;
            } else {
                src = w + (long)min(n0 + r, N - 1) * K;
            }
            ptx_cp_async16(dst + swz(r, c), src + (long)ks * BK + c * 8);
        }
    };
    /* this thread's activation rows (the same at every k-step); grouped
     * with `order`: sorted row p is token order[p] / top_k of x */
    constexpr int AI = (A_ROWS * 8 + THREADS - 1) / THREADS;
    const T *arow[AI];
#pragma unroll
    for (int i = 0; i < AI; i++) {
        int gr = min((tid + i * THREADS) >> 3, M - 1);
        if (g.order) arow[i] = x + (long)(g.order[a_row0 + gr] / g.top_k) * ldx;
        else arow[i] = x + (long)gr * ldx;
    }
    auto load_a = [&](int stage, int ks) {
        uint32_t dst = sbase + stage * STAGE_BYTES + W_BYTES;
#pragma unroll
        for (int i = 0; i < AI; i++) {
            int idx = tid + i * THREADS;
            if (idx < A_ROWS * 8) {
                int r = idx >> 3, c = idx & 7;
                ptx_cp_async16(dst + swz(r, c), arow[i] + (long)ks * BK + c * 8);
            }
        }
    };

    /* prologue: weights before the wait, activations after it; group s
     * holds stage s's activations (and, for s = 0, every prologue weight
     * tile), so waiting for group s covers stage s completely. */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (k0 + s < k1) load_w(s, k0 + s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (k0 + s < k1) load_a(s, k0 + s);
        ptx_cp_async_commit();
    }

    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    /* ldmatrix row addresses: W (16 rows × k16 as four 8×8 matrices: rows
     * 0-7/8-15 × k 0-7/8-15), activations (two n8 tiles × k 0-7/8-15) */
    const int wr = warp * 16 + (lane & 15), wc = lane >> 4;
    const int aq = lane >> 3, ar = lane & 7;

    for (int kk = k0; kk < k1; kk++) {
        ptx_cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            int nxt = kk + STAGES - 1, st = (nxt - k0) % STAGES;
            if (nxt < k1) load_w(st, nxt), load_a(st, nxt);
            ptx_cp_async_commit();
        }
        const uint32_t sw = sbase + ((kk - k0) % STAGES) * STAGE_BYTES, sa = sw + W_BYTES;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t a[4];
            ptx_ldmatrix_x4(a[0], a[1], a[2], a[3], sw + swz(wr, 2 * ks + wc));
#pragma unroll
            for (int j = 0; j < MTE; j += 2) {
                uint32_t b0, b1, b2, b3;
                ptx_ldmatrix_x4(b0, b1, b2, b3, sa + swz((j + (aq >> 1)) * 8 + ar, 2 * ks + (aq & 1)));
                ptx_mma_m16n8k16<T>(acc[j], a, b0, b1);
                if (j + 1 < MT) ptx_mma_m16n8k16<T>(acc[j + 1], a, b2, b3);
            }
        }
    }
    ptx_cp_async_wait<0>();

    moe_mma_epilogue<MT, MODE == MODE_GLU, T>(acc, (float *)smem, y, ldy, n0, N, M, t.x, g.ep);
}

template <typename T, int MT> constexpr size_t smem_bytes() {
    return (size_t)STAGES * (BN * BK * 2 + ((MT + 1) & ~1) * 8 * BK * 2);
}

/* Sets the kernel variant's shared-memory limit, once per variant and
 * device (the attribute is per device: a bit of cuda_ctx.gemm_small_ready). */
template <typename T, int MT, int MODE> void setup(struct cuda_ctx *c) {
    const unsigned bit = 1u << ((std::is_same<T, __half>::value ? 4 : 0) + (MT == 2 ? 0 : 2) + MODE);
    if (c->gemm_small_ready & bit) return;
    CUDA_CHECK(cudaFuncSetAttribute(gemm_small_kernel<T, MT, MODE>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes<T, MT>()));
    c->gemm_small_ready |= bit;
}

template <typename T, int MT>
void launch_grouped(struct cuda_ctx *c, void *y, long ldy, const void *x16, long ldx,
                    const struct grouped &g, long max_tiles, long N, long K) {
    if (g.w_b) {
        setup<T, MT, MODE_GLU>(c);
        pdl_launch(c, gemm_small_kernel<T, MT, MODE_GLU>, dim3((unsigned)((N + BN / 2 - 1) / (BN / 2)), (unsigned)max_tiles),
                   dim3(THREADS), smem_bytes<T, MT>(), (float *)y, ldy, (const T *)x16, ldx, (int)N,
                   (int)K, g);
    } else {
        setup<T, MT, MODE_GROUPED>(c);
        pdl_launch(c, gemm_small_kernel<T, MT, MODE_GROUPED>, dim3((unsigned)((N + BN - 1) / BN), (unsigned)max_tiles),
                   dim3(THREADS), smem_bytes<T, MT>(), (float *)y, ldy, (const T *)x16, ldx, (int)N,
                   (int)K, g);
    }
}

template <typename T>
void dispatch_grouped(struct cuda_ctx *c, int tile_rows, void *y, long ldy, const void *x16, long ldx,
                      const struct grouped &g, long max_tiles, long N, long K) {
    if (tile_rows <= 16) launch_grouped<T, 2>(c, y, ldy, x16, ldx, g, max_tiles, N, K);
    else launch_grouped<T, 8>(c, y, ldy, x16, ldx, g, max_tiles, N, K);
}

} // namespace

extern "C" int cuda_gemm_small_grouped_ok(long N, long K, int glu) {
    return K % BK == 0 && N >= 1 && K <= INT32_MAX && N <= INT32_MAX && (!glu || N % 2 == 0);
}

extern "C" void cuda_gemm_small_grouped(struct cuda_ctx *c, enum dtype dt, int tile_rows, void *y, long ldy,
                                        const void *x16, long ldx, const int32_t *order, int top_k,
                                        const void *const *w_a, const void *const *w_b, const void *tiles,
                                        const int *n_tiles, long max_tiles, long N, long K,
                                        const struct moe_experts *e) {
    struct grouped g = {w_a, w_b, (const int4 *)tiles, n_tiles, order, top_k, moe_epi_of(e)};
    if (max_tiles <= 0) return;
    if (dt == DTYPE_BF16) dispatch_grouped<__nv_bfloat16>(c, tile_rows, y, ldy, x16, ldx, g, max_tiles, N, K);
    else dispatch_grouped<__half>(c, tile_rows, y, ldy, x16, ldx, g, max_tiles, N, K);
}
