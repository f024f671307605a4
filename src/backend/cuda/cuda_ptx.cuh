/* cuda_ptx.cuh — the inline-PTX instructions the CUDA kernels use, one thin
 * wrapper each, so every kernel spells an instruction (and its operand
 * constraints and clobbers) the same way. Ampere-level instructions
 * (sm_80+: cp.async, ldmatrix, mma.sync m16n8k16, L2 cache policies, cache-
 * hinted loads) and the grid-dependency control of programmatic dependent
 * launch (sm_90, a no-op below); the Hopper-only ones (wgmma, mbarrier,
 * TMA, clusters) are in hopper/ptx.cuh. Everything is static inline.
 *
 * Shared-memory operands are 32-bit shared-window addresses (ptx_smem_u32);
 * the pointer overloads convert for callers that hold generic pointers.
 * The asynchronous copies and their group fences clobber "memory" so the
 * compiler keeps ordinary shared-memory accesses on their side of them.
 * PTX ISA references: "cp.async", "ldmatrix", "mma" (m16n8k16 fragment
 * layouts), "createpolicy", "ld", "griddepcontrol". */
#ifndef KILN_BACKEND_CUDA_PTX_CUH
#define KILN_BACKEND_CUDA_PTX_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

static __device__ __forceinline__ uint32_t ptx_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- asynchronous global → shared copies (16 bytes) ------------------- */

static __device__ __forceinline__ void ptx_cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/* Copies 16 bytes when valid, else fills dst with zeros (src-size 0). */
static __device__ __forceinline__ void ptx_cp_async16_zfill(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void ptx_cp_async16_zfill(void *dst, const void *src, bool valid) {
    ptx_cp_async16_zfill(ptx_smem_u32(dst), src, valid);
}
/* The same with an L2 eviction policy (ptx_policy_*). */
static __device__ __forceinline__ void ptx_cp_async16_zfill_hint(void *dst, const void *src, bool valid,
                                                                 uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                     ptx_smem_u32(dst)),
                 "l"(src), "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
}
static __device__ __forceinline__ void ptx_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most N committed groups are still in flight. */
template <int N>
static __device__ __forceinline__ void ptx_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- L2 cache policies ------------------------------------------------ */

static __device__ __forceinline__ uint64_t ptx_policy_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
static __device__ __forceinline__ uint64_t ptx_policy_evict_normal(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* ---- loads and stores ------------------------------------------------- */

/* 16 bytes of data read once: bypasses L1 and lets L2 fetch the whole
 * 256-byte sector ahead. Non-coherent: only for memory no running kernel
 * writes. */
static __device__ __forceinline__ uint4 ptx_ld_stream_v4(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
static __device__ __forceinline__ void ptx_st_shared_v4(uint32_t addr, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

/* ---- ldmatrix: four 8x8 16-bit tiles from shared memory --------------- */

static __device__ __forceinline__ void ptx_ldmatrix_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                                       uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
static __device__ __forceinline__ void ptx_ldmatrix_x4(uint32_t *r, const void *p) {
    ptx_ldmatrix_x4(r[0], r[1], r[2], r[3], ptx_smem_u32(p));
}
/* The same, each tile transposed. */
static __device__ __forceinline__ void ptx_ldmatrix_x4_trans(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ptx_smem_u32(p)));
}

/* ---- mma.sync m16n8k16: d[4] += a[4] · b[2], fp32 accumulators --------- */

template <typename T>
static __device__ __forceinline__ void ptx_mma_m16n8k16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void ptx_mma_m16n8k16<__nv_bfloat16>(float *d, const uint32_t *a, uint32_t b0,
                                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void ptx_mma_m16n8k16<__half>(float *d, const uint32_t *a, uint32_t b0,
                                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- arithmetic ------------------------------------------------------- */

/* 2^x, the MUFU approximation (flush-to-zero): softmax in base 2. */
static __device__ __forceinline__ float ptx_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- programmatic dependent launch (sm_90; nothing below) ------------- */

/* Waits until the grids this one depends on have finished and their
 * writes are visible. */
static __device__ __forceinline__ void ptx_griddep_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Lets the dependent grid start launching. */
static __device__ __forceinline__ void ptx_griddep_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
