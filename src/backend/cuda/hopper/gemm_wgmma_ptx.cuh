/* gemm_wgmma_ptx.cuh — the Hopper (sm_90a) instructions the small-M wgmma
 * product (gemm_wgmma.cu) is made of, each a thin inline-PTX wrapper:
 * mbarriers, TMA tile loads (cp.async.bulk.tensor) and the cluster (DSMEM)
 * accesses of the split-K reduction; the wgmma instructions come from
 * wgmma.cuh. Included by gemm_wgmma.cu only; everything is static inline.
 * PTX ISA references: "Asynchronous Warpgroup Level Matrix Multiply-
 * Accumulate" (wgmma, descriptor format, accumulator layout), "Tensor copy"
 * (cp.async.bulk.tensor), "mbarrier". */
#ifndef KILN_BACKEND_CUDA_HOPPER_GEMM_WGMMA_PTX_CUH
#define KILN_BACKEND_CUDA_HOPPER_GEMM_WGMMA_PTX_CUH

#include <stdint.h>

#include "backend/cuda/hopper/wgmma.cuh"

namespace wgk {

using namespace hopper;

/* ---- mbarrier ---------------------------------------------------------- */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Makes the initialised barriers visible to the other threads and to the
 * copy engine (the async proxy) before anyone uses them. */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

/* An L2 policy for data read once (the weights): evicted first, so the
 * activations, re-read by every N tile, stay. */
__device__ __forceinline__ uint64_t policy_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

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

/* wgmma itself, its descriptors and protocol: wgmma.cuh (shared with
 * attn_prefill.cu). */

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

} // namespace wgk

#endif
