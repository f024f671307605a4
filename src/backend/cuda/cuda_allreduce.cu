/* cuda_allreduce.cu — the one-shot all-reduce for small messages between
 * the GPUs of one machine (the decode steps' hidden states), beside NCCL.
 *
 * Every rank owns a region the others map (CUDA IPC handles, or plain
 * pointers with peer access when the ranks are threads of one process;
 * cuda_nccl.c sets it up): two sets of data buffers used in turn, each
 * with one slot per source rank, and one flag word per (block, source
 * rank). One kernel does the whole operation: block b stores its part of
 * the input into slot `me` of every rank's buffer (stores over the link
 * are posted, nothing waits for them), then, after a system-wide fence,
 * writes the call's epoch into flag (b, me) of every rank; once its own
 * flags (b, p) hold the epoch for every p, it adds the slots of its part
 * in rank order, 0 first, from its own memory. So every rank gets the
 * same bits after one crossing of the link.
 *
 * The epoch lives on the device (the last block to finish advances it), so
 * a recorded graph replays correctly. Two buffer sets in turn are enough:
 * before rank r writes set (e+1) % 2 in call e+1, it has seen every rank's
 * flag of call e for the same block, which a rank writes only after its
 * call e-1 (the last reader of that set) completed. The slots are read
 * with ld.global.cv (no cached copy of an earlier call's data). Rows are
 * moved 16 bytes at a time (n % 4 == 0, 16-byte aligned). */
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

namespace {

constexpr int AR_THREADS = 256, AR_VEC = 4; /* floats a thread moves per step */

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void __launch_bounds__(AR_THREADS)
one_shot_kernel(float4 *__restrict__ x, long n4, struct cuda_ar_peers pr, uint32_t *epoch, uint32_t *done) {
    const int me = pr.rank, size = pr.size, b = blockIdx.x;
    const uint32_t e = *(volatile uint32_t *)epoch + 1;
    const long set = (long)(e & 1) * size * pr.cap; /* floats to this call's buffer set */
    const long step = (long)gridDim.x * AR_THREADS;
    for (long i = (long)b * AR_THREADS + threadIdx.x; i < n4; i += step) {
        float4 v = x[i];
        for (int p = 0; p < size; p++) ((float4 *)(pr.buf[p] + set + (long)me * pr.cap))[i] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        for (int p = 0; p < size; p++) st_release_sys(pr.flags[p] + (long)b * CUDA_AR_MAX_RANKS + me, e);
    }
    if (threadIdx.x < size) {
        const uint32_t *f = pr.flags[me] + (long)b * CUDA_AR_MAX_RANKS + threadIdx.x;
        while ((int32_t)(ld_acquire_sys(f) - e) < 0) {
        }
    }
    __syncthreads();
    const float *mine = pr.buf[me] + set;
    for (long i = (long)b * AR_THREADS + threadIdx.x; i < n4; i += step) {
        float4 v[CUDA_AR_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < CUDA_AR_MAX_RANKS; p++)
            if (p < size) v[p] = __ldcv((const float4 *)(mine + (long)p * pr.cap) + i);
        float4 s = v[0];
#pragma unroll
        for (int p = 1; p < CUDA_AR_MAX_RANKS; p++)
            if (p < size) s.x += v[p].x, s.y += v[p].y, s.z += v[p].z, s.w += v[p].w;
        x[i] = s;
    }
    /* the last block advances the epoch for the next call */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(done, 1u) == gridDim.x - 1) {
            *done = 0;
            *(volatile uint32_t *)epoch = e;
        }
    }
}

} // namespace

extern "C" long cuda_ar_blocks(long n) {
    long b = (n + AR_THREADS * AR_VEC - 1) / (AR_THREADS * AR_VEC);
    return b < 1 ? 1 : b > (long)CUDA_AR_MAX_BLOCKS ? (long)CUDA_AR_MAX_BLOCKS : b;
}

extern "C" void cuda_ar_one_shot(cudaStream_t s, float *x, long n, const struct cuda_ar_peers *pr, uint32_t *epoch,
                                 uint32_t *done) {
    one_shot_kernel<<<(unsigned)cuda_ar_blocks(n), AR_THREADS, 0, s>>>((float4 *)x, n / 4, *pr, epoch, done);
    CUDA_CHECK_LAUNCH();
}
