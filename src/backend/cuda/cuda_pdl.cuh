/* cuda_pdl.cuh — programmatic dependent launch (PDL, sm_90+) for the small
 * kernels of a decode step (CUDA C++, included by .cu files only).
 *
 * A kernel launched with pdl_launch may start while the kernel before it
 * on the stream is still running: its CTAs are scheduled once every CTA of
 * the previous kernel has started (and executed pdl_trigger), so its
 * launch latency and its prologue overlap the previous kernel's tail. The
 * rules that keep this correct, for every kernel launched this way:
 *
 *   1. call pdl_wait() in every thread before reading anything an earlier
 *      kernel wrote and before writing any global memory (a later write
 *      could race with an earlier kernel's reads). pdl_wait returns once
 *      the previous kernel has completed and its writes are visible; since
 *      that kernel itself waited on its predecessor before finishing, the
 *      whole stream before it is complete too. A CTA with no work still
 *      calls it (before returning), so the kernel never finishes ahead of
 *      its predecessor;
 *   2. before pdl_wait, read only memory no kernel writes (weights, the
 *      rope table, and the step's batch metadata — positions, slots,
 *      q_start, page tables, sampling rows: model.c stage_batch uploads
 *      them with a copy, which waits for every earlier kernel to complete,
 *      and no kernel writes them; the KV cache rows of positions before
 *      this step's tokens, written by earlier steps), never through a
 *      cache that could keep
 *      stale data of an input: the inputs
 *      are read with ordinary (coherent) loads after the wait, not with
 *      __ldg / ld.global.nc, whose data must stay unchanged for the whole
 *      life of the kernel;
 *   3. pdl_trigger() early (our kernels call it first): it lets the next
 *      kernel be scheduled; it says nothing about memory, so it is always
 *      safe.
 *
 * Kernels launched the ordinary way (<<<>>>, cuBLAS, copies) wait for the
 * full completion of whatever precedes them, as always; pdl_wait and
 * pdl_trigger are no-ops in a kernel launched without the attribute.
 * `cuda_ctx.pdl` (KILN_CUDA_PDL=0 clears it; pre-Hopper devices never set
 * it) chooses between the two launches. Stream capture turns the attribute
 * into programmatic edges of the graph, so replays overlap the same way. */
#ifndef KILN_BACKEND_CUDA_PDL_CUH
#define KILN_BACKEND_CUDA_PDL_CUH

#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ptx.cuh"

static __device__ __forceinline__ void pdl_wait() { ptx_griddep_wait(); }

static __device__ __forceinline__ void pdl_trigger() { ptx_griddep_launch_dependents(); }

/* kernel<<<grid, block, smem, c->stream>>>(args...), with programmatic
 * stream serialization when `pdl`; checks the launch. */
template <typename... Exp, typename... Act>
static void pdl_launch_on(const struct cuda_ctx *c, bool pdl, void (*kernel)(Exp...), dim3 grid,
                          dim3 block, size_t smem, Act &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...));
}

/* The same, with programmatic stream serialization when c->pdl. */
template <typename... Exp, typename... Act>
static void pdl_launch(const struct cuda_ctx *c, void (*kernel)(Exp...), dim3 grid, dim3 block,
                       size_t smem, Act &&...args) {
    pdl_launch_on(c, c->pdl != 0, kernel, grid, block, smem, std::forward<Act>(args)...);
}


/* silu(g) * u with every rounding spelled out, so that the kernels that
 * compute it (silu_mul, the SwiGLU GEMV epilogue, the 16-bit SwiGLU
 * producer) give the same bits whatever the compiler contracts around
 * them; the same expression as the CPU's g / (1 + exp(-g)) * u. */
static __device__ __forceinline__ float silu_mul_f32(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

#endif
