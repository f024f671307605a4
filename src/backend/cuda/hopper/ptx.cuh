/* hopper/ptx.cuh — the Hopper-only (sm_90a) instructions, one thin
 * inline-PTX wrapper each: the async-proxy fence, mbarriers, TMA tile loads
 * (cp.async.bulk.tensor), cluster (distributed shared memory) accesses,
 * and the warpgroup matrix multiply (wgmma: shared-memory matrix
 * descriptors, the fence / commit / wait protocol and the m64n128k16
 * (16-bit) and m64n128k32 (e4m3) products with fp32 accumulators). The instructions older GPUs have too
 * are in cuda_ptx.cuh. Only the files under hopper/ (built for sm_90a)
 * include it; everything is static inline in namespace hopper.
 * PTX ISA references: "Asynchronous Warpgroup Level Matrix Multiply-
 * Accumulate" (wgmma, descriptor format, accumulator layout), "Tensor copy"
 * (cp.async.bulk.tensor), "mbarrier", "membar/fence". */
#ifndef KILN_BACKEND_CUDA_HOPPER_PTX_CUH
#define KILN_BACKEND_CUDA_HOPPER_PTX_CUH

#include <stdint.h>

#include "backend/cuda/cuda_ptx.cuh"

namespace hopper {

/* Ordinary and cp.async writes to shared memory become visible to the
 * async proxy (wgmma operands, TMA). */
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- mbarrier ---------------------------------------------------------- */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Makes the initialised barriers visible to the other threads and to the
 * copy engine (the async proxy) before anyone uses them. */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    fence_proxy_async();
}

/* Arrive (count 1) and announce `bytes` of copy transactions for this phase. */
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}

/* Waits until the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA --------------------------------------------------------------- */

/* Fetches a tensor map (a __grid_constant__ parameter) ahead of its first use. */
__device__ __forceinline__ void prefetch_tensormap(const void *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}

/* The 2-D box at (c0 = inner element, c1 = row) of the tensor map into
 * shared memory at dst; completes `bar`'s transactions with the box's
 * bytes (the full box, zero-filled where it leaves the tensor). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, uint32_t bar, int c0,
                                            int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const void *map, uint32_t bar, int c0,
                                                 int c1, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
                 : "memory");
}

/* ---- cluster (distributed shared memory) ------------------------------- */

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}

/* The address of `addr` (this CTA's shared memory) in CTA `rank` of the cluster. */
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}

__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

/* ---- registers ---------------------------------------------------------- */

/* Moves this warpgroup's registers a thread to R (every warp of the
 * warpgroup executes it): a producer warpgroup gives registers back (dec)
 * for the consumer warpgroups to take (inc). */
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

/* ---- wgmma ------------------------------------------------------------- */

/* Descriptor of a tile in shared memory in the 128-byte-swizzled layout
 * (64 two-byte columns = one 128-byte row per swizzle atom, chunk c of row r
 * stored at chunk c ^ (r % 8), 1024-byte aligned atoms of 8 rows):
 *   bits  0-13  start address >> 4
 *   bits 16-29  leading-dimension byte offset >> 4: for K-major tiles whose
 *               k16 slice (32 bytes) lies inside one 128-byte row, unused
 *               (16 by convention); for an MN-major operand, the bytes
 *               between its 64-column blocks
 *   bits 32-45  stride-dimension byte offset >> 4: from one 8-row group to
 *               the next, 8 × 128 = 1024 bytes
 *   bits 49-51  base offset: 0 (atoms are 1024-byte aligned)
 *   bits 62-63  swizzle mode: 1 = 128-byte
 * The k16 slice kk of a 64-column K-major block starts kk × 32 bytes
 * further (descriptor + 2·kk): the hardware swizzles the address it forms,
 * so the start moves by the unswizzled offset. */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo = 16,
                                               uint32_t sbo = 1024) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* waits until at most N committed groups are still running */
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of accumulator registers across
 * a wgmma wait (the asm statements above do not name them). */
__device__ __forceinline__ void fence_regs(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define KILN_WGMMA_D64                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define KILN_WGMMA_D64_OPS(d)                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])

/* D[64][128] (fp32, registers) (+)= A[64][16] · B[128][16]ᵀ with A and B
 * K-major in shared memory (descriptors da, db), bf16 or (F16) f16 inputs;
 * scale_d = 0 overwrites D. Accumulator layout: thread t of the warpgroup
 * (warp w = t / 32, lane l) holds, for j = 0..15,
 *   d[4j + 0], d[4j + 1]: row 16w + l/4,     columns 8j + 2(l%4) + {0, 1}
 *   d[4j + 2], d[4j + 3]: row 16w + l/4 + 8, the same columns
 * (mma.sync's m16n8 layout, tile after tile). */
template <bool F16>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    if (F16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " KILN_WGMMA_D64
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : KILN_WGMMA_D64_OPS(d)
                     : "l"(da), "l"(db), "r"(scale_d));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KILN_WGMMA_D64
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : KILN_WGMMA_D64_OPS(d)
                     : "l"(da), "l"(db), "r"(scale_d));
}

/* D[64][128] (fp32) (+)= A[64][32] · B[128][32]ᵀ with e4m3 inputs, both
 * K-major in shared memory (FP8 has no transposed forms): a k32 slice is 32
 * bytes, as a k16 slice of 16-bit values, so the same 128-byte-swizzled
 * tiles and descriptor steps serve; the accumulator layout is wgmma_ss's. */
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " KILN_WGMMA_D64
                 ", %64, %65, p, 1, 1;\n}\n"
                 : KILN_WGMMA_D64_OPS(d)
                 : "l"(da), "l"(db), "r"(scale_d));
}

/* D[64][128] += A[64][16] · B[16][128], bf16: A from registers (four
 * 32-bit registers of bf16 pairs per thread, in the accumulator layout's
 * row/column pattern), B in shared memory stored MN-major (the transpose
 * bit imm-trans-b = 1). */
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KILN_WGMMA_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : KILN_WGMMA_D64_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

#undef KILN_WGMMA_D64
#undef KILN_WGMMA_D64_OPS

} // namespace hopper

#endif
