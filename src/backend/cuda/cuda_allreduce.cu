/* cuda_allreduce.cu — the one-shot all-reduce over CUDA IPC for the small
 * messages of tensor parallel decode steps, alone or fused with the
 * residual add and RMSNorm that follow it, beside NCCL.
 *
 * Every rank owns three buffers the others map (cuda_nccl.c sets them up:
 * CUDA IPC handles, or plain pointers with peer access when the ranks are
 * threads of one process), each with one slot of cap floats per source
 * rank: [3][size][cap], every float initially negative zero (0x80000000),
 * which no message ever holds (the senders turn -0 into +0). A call:
 *
 *   1. each block stores its part of this rank's input into slot `me` of
 *      every peer's buffer (posted stores over NVLink; nothing waits);
 *   2. it reads slot p of its own buffer for every peer p, again and again
 *      until no element is -0 any more: the data is its own arrival flag,
 *      so one crossing of the link is the whole latency;
 *   3. it adds the slots in rank order, 0 first (its own part from
 *      registers), so every rank gets the same bits;
 *   4. fused: h += sum, x = h / rms(h) · w (and/or its 16-bit copy for the
 *      product that follows), with add_rmsnorm's arithmetic exactly: the
 *      kernel cuda_norm.cu would choose for these operands (its float4
 *      one, or the scalar one for narrow rows), the same threads, the
 *      same order, so a step gives the same bits whichever path its size
 *      takes;
 *   5. it writes -0 back over the peer slots of the buffer of the call
 *      before, ready for the call after next.
 *
 * Call k uses buffer k % 3. While a rank is in call k, a faster peer can
 * already be in call k + 1 (it had this rank's part of call k), writing
 * buffer (k + 1) % 3, but not in call k + 2 (that needs this rank's part
 * of call k + 1, sent by a later kernel), so clearing buffer (k - 1) % 3
 * now is safe, and the clear is complete before the next kernel starts.
 * The call counter and each buffer's used length live on the device (the
 * last block to finish advances them), so captured graphs replay
 * correctly. Every rank must make the same calls in the same order (the
 * ranks run in lockstep). A peer that never writes (it died) makes the
 * wait trap after about ten seconds: the CUDA error ends the process, and
 * the launcher the job, instead of a hang. */
#include <stdint.h>

#include "backend/cuda/cuda_norm_row.cuh"
#include "backend/cuda/cuda_pdl.cuh"

namespace {

constexpr uint32_t NEG0 = 0x80000000u;
constexpr int SUM_THREADS = 256;
constexpr long long WAIT_CYCLES = 20000000000ll; /* ~10 s at 2 GHz */

/* state words: [0] the call counter, [1] blocks done, [2..4] floats a slot
 * of each buffer held in its last call (what the clear rewrites) */
enum { ST_CALL = 0, ST_DONE = 1, ST_USED = 2 };

__device__ __forceinline__ float4 not_neg0(float4 v) {
    /* -0 + 0 = +0; every other value is unchanged */
    return make_float4(v.x + 0.0f, v.y + 0.0f, v.z + 0.0f, v.w + 0.0f);
}

__device__ __forceinline__ bool arrived(float4 v) {
    return __float_as_uint(v.x) != NEG0 && __float_as_uint(v.y) != NEG0 && __float_as_uint(v.z) != NEG0 &&
           __float_as_uint(v.w) != NEG0;
}

__device__ __forceinline__ float4 ld_volatile4(const float4 *p) {
    float4 v;
    asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

/* Slot element i of a peer's part, once it has arrived. */
__device__ __forceinline__ float4 wait4(const float4 *p) {
    float4 v = ld_volatile4(p);
    if (arrived(v)) return v;
    long long t0 = clock64();
    do {
        v = ld_volatile4(p);
        if (clock64() - t0 > WAIT_CYCLES) __trap();
    } while (!arrived(v));
    return v;
}

__device__ __forceinline__ float wait1(const float *p) {
    float v = *(const volatile float *)p;
    if (__float_as_uint(v) != NEG0) return v;
    long long t0 = clock64();
    do {
        v = *(const volatile float *)p;
        if (clock64() - t0 > WAIT_CYCLES) __trap();
    } while (__float_as_uint(v) == NEG0);
    return v;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* The call's buffer (floats from a rank's base) and the call number. */
struct call {
    uint32_t k;
    long cur, prev; /* offsets of buffer k % 3 and (k + 2) % 3 */
    long prev_used;
};

__device__ __forceinline__ call call_of(const cuda_ar_peers &pr) {
    call c;
    c.k = *(volatile uint32_t *)(pr.state + ST_CALL);
    long set = (long)pr.size * pr.cap;
    c.cur = (long)(c.k % 3) * set;
    c.prev = (long)((c.k + 2) % 3) * set;
    c.prev_used = *(volatile uint32_t *)(pr.state + ST_USED + (c.k + 2) % 3);
    return c;
}

/* Step 5 and the counters: the blocks share the clear of the peer slots
 * of the previous call's buffer; the last block to finish records this
 * call's length and advances the counter. */
static __device__ void finish(const cuda_ar_peers &pr, const call &c, long n) {
    float4 neg;
    neg.x = neg.y = neg.z = neg.w = __uint_as_float(NEG0);
    long n4 = c.prev_used / 4, total = (long)pr.size * n4;
    long stride = (long)gridDim.x * blockDim.x;
    float4 *base = (float4 *)(pr.buf[pr.rank] + c.prev);
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long p = i / n4;
        if (p != pr.rank) base[p * (pr.cap / 4) + i % n4] = neg;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(pr.state + ST_DONE, 1u) == gridDim.x - 1) {
            pr.state[ST_USED + c.k % 3] = (uint32_t)n;
            pr.state[ST_DONE] = 0;
            __threadfence();
            *(volatile uint32_t *)(pr.state + ST_CALL) = c.k + 1;
        }
    }
}

/* x[n] (n % 4 == 0) in place: the sum over the ranks. */
__global__ void __launch_bounds__(SUM_THREADS) sum_kernel(float4 *x, long n4, cuda_ar_peers pr) {
    pdl_trigger();
    pdl_wait();
    const call c = call_of(pr);
    const int me = pr.rank, size = pr.size;
    const long slot4 = pr.cap / 4, stride = (long)gridDim.x * SUM_THREADS;
    for (long i = (long)blockIdx.x * SUM_THREADS + threadIdx.x; i < n4; i += stride) {
        float4 v = not_neg0(x[i]);
        for (int p = 0; p < size; p++)
            if (p != me) ((float4 *)(pr.buf[p] + c.cur))[me * slot4 + i] = v;
    }
    const float4 *mine = (const float4 *)(pr.buf[me] + c.cur);
    for (long i = (long)blockIdx.x * SUM_THREADS + threadIdx.x; i < n4; i += stride) {
        float4 own = not_neg0(x[i]);
        float4 s = me == 0 ? own : wait4(mine + i);
        for (int p = 1; p < size; p++) s = add4(s, p == me ? own : wait4(mine + p * slot4 + i));
        x[i] = s;
    }
    finish(pr, c, n4 * 4);
}

/* The fused form, one block a row of dim floats (dim % 4 == 0), V float4
 * a thread, exactly cuda_norm.cu's add_rmsnorm_vec_kernel after the sum:
 * h[n][dim] += the ranks' delta; y = h / rms(h) * w (y NULL: not
 * written); O 16-bit: y16 = y rounded. */
template <typename O, int V>
__global__ void __launch_bounds__(1024)
    norm_kernel(float *h, const float *delta, float *y, const float *__restrict__ w, long n, long dim, float eps,
                O *y16, cuda_ar_peers pr) {
    __shared__ float red[32];
    pdl_trigger();
    const int t = threadIdx.x, nt = blockDim.x, me = pr.rank, size = pr.size;
    const long d4 = dim / 4, slot4 = pr.cap / 4;
    float4 wv[V];
    norm_weights_vec(wv, w, d4);
    pdl_wait();
    const call c = call_of(pr);
    const float4 *mine = (const float4 *)(pr.buf[me] + c.cur);
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const float4 *dr = (const float4 *)(delta + i * dim);
        float4 own[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            long k = t + (long)j * nt;
            if (k < d4) {
                own[j] = not_neg0(dr[k]);
                for (int p = 0; p < size; p++)
                    if (p != me) ((float4 *)(pr.buf[p] + c.cur))[me * slot4 + i * d4 + k] = own[j];
            }
        }
        float4 *hr = (float4 *)(h + i * dim);
        float4 v[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            long k = t + (long)j * nt;
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (k < d4) {
                float4 s = me == 0 ? own[j] : wait4(mine + i * d4 + k);
                for (int p = 1; p < size; p++) s = add4(s, p == me ? own[j] : wait4(mine + p * slot4 + i * d4 + k));
                v[j] = add4(hr[k], s);
            }
        }
        norm_row_vec(v, wv, hr, y, y16, i, dim, eps, red);
    }
    finish(pr, c, n * dim);
}

/* The same for rows cuda_norm.cu's scalar add_rmsnorm_kernel takes (its
 * NORM_BLOCK threads, SV elements a thread: dim <= SV * NORM_BLOCK). */
constexpr int NORM_BLOCK = 256; /* cuda_norm.cu's */
template <typename O, int SV>
__global__ void __launch_bounds__(NORM_BLOCK)
    norm_scalar_kernel(float *h, const float *delta, float *y, const float *__restrict__ w, long n, long dim,
                       float eps, O *y16, cuda_ar_peers pr) {
    __shared__ float red[32];
    pdl_trigger();
    pdl_wait();
    const int t = threadIdx.x, nt = blockDim.x, me = pr.rank, size = pr.size;
    const call c = call_of(pr);
    const float *mine = pr.buf[me] + c.cur;
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        float own[SV];
#pragma unroll
        for (int j = 0; j < SV; j++) {
            long k = t + (long)j * nt;
            if (k < dim) {
                own[j] = delta[i * dim + k] + 0.0f; /* never -0 */
                for (int p = 0; p < size; p++)
                    if (p != me) (pr.buf[p] + c.cur)[me * pr.cap + i * dim + k] = own[j];
            }
        }
        float *hr = h + i * dim;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < SV; j++) {
            long k = t + (long)j * nt;
            if (k < dim) {
                float s = me == 0 ? own[j] : wait1(mine + i * dim + k);
                for (int p = 1; p < size; p++) s += p == me ? own[j] : wait1(mine + p * pr.cap + i * dim + k);
                float v = hr[k] + s;
                hr[k] = v;
                ss += v * v;
            }
        }
        norm_row_scalar(ss, hr, w, y, y16, i, dim, eps, red);
    }
    finish(pr, c, n * dim);
}

__global__ void fill_kernel(uint32_t *p, long n, uint32_t v) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) p[i] = v;
}

template <typename O>
void launch_norm(const struct cuda_ctx *c, const cuda_ar_peers &pr, const struct backend_norm *nm, long n, O *y16) {
    float *y = y16 ? NULL : nm->x;
    if (!cuda_norm_vec_ok(nm->h, nm->delta, nm->x, nm->w, nm->dim)) { /* cuda_norm.cu's scalar kernel */
        int sv = (int)((nm->dim + NORM_BLOCK - 1) / NORM_BLOCK);
        dim3 grid(grid_for(n, 1)), block(NORM_BLOCK);
        if (sv == 1) pdl_launch(c, norm_scalar_kernel<O, 1>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
        else if (sv == 2) pdl_launch(c, norm_scalar_kernel<O, 2>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
        else pdl_launch(c, norm_scalar_kernel<O, 4>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
        return;
    }
    /* cuda_norm.cu's launch_norm_vec: the same threads for the same bits */
    long d4 = nm->dim / 4;
    int v = (int)((d4 + 1023) / 1024);
    int threads = (int)(((d4 + v - 1) / v + 31) / 32 * 32);
    dim3 grid(grid_for(n, 1)), block(threads);
    if (v == 1) pdl_launch(c, norm_kernel<O, 1>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
    else if (v == 2) pdl_launch(c, norm_kernel<O, 2>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
    else if (v == 3) pdl_launch(c, norm_kernel<O, 3>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
    else pdl_launch(c, norm_kernel<O, 4>, grid, block, 0, nm->h, nm->delta, y, nm->w, n, nm->dim, nm->eps, y16, pr);
}

} // namespace

extern "C" int cuda_ar_fill(void *p, size_t bytes) {
    long n = (long)(bytes / 4);
    fill_kernel<<<grid_for(n, 256) > 1024 ? 1024 : grid_for(n, 256), 256>>>((uint32_t *)p, n, NEG0);
    return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

extern "C" int cuda_ar_sum_ok(const struct cuda_ar *ar, const float *x, long n) {
    return ar && (size_t)n * 4 <= ar->max_bytes && n <= ar->peers.cap && n % 4 == 0 && ((uintptr_t)x & 15) == 0;
}

extern "C" void cuda_ar_sum(const struct cuda_ar *ar, float *x, long n) {
    if (n <= 0) return;
    long n4 = n / 4;
    long blocks = (n4 + SUM_THREADS - 1) / SUM_THREADS;
    if (blocks > ar->cc->n_sm) blocks = ar->cc->n_sm;
    pdl_launch(ar->cc, sum_kernel, dim3((unsigned)blocks), dim3(SUM_THREADS), 0, (float4 *)x, n4, ar->peers);
}

/* n <= n_sm: every block of the kernel is resident at once (one block of
 * up to 1024 threads fits an SM), so no block waits for a peer's part
 * that the peer's blocks, waiting in turn, keep from being scheduled. */
extern "C" int cuda_ar_norm_ok(const struct cuda_ar *ar, long n, long dim) {
    return ar && (size_t)(n * dim) * 4 <= ar->max_bytes && n * dim <= ar->peers.cap && n <= ar->cc->n_sm &&
           dim % 4 == 0 && dim <= 4 * 4 * 1024;
}

extern "C" void cuda_ar_norm(const struct cuda_ar *ar, const struct backend_norm *nm, long n, void *x16,
                             enum dtype dt) {
    if (n <= 0) return;
    /* rows cuda_norm.cu's float4 kernel would not take: its scalar one's
     * layout, which holds up to 4 x NORM_BLOCK floats a row */
    CUDA_ASSERT(cuda_ar_norm_ok(ar, n, nm->dim) &&
                (cuda_norm_vec_ok(nm->h, nm->delta, nm->x, nm->w, nm->dim) || nm->dim <= 4 * NORM_BLOCK));
    if (!x16) launch_norm(ar->cc, ar->peers, nm, n, (float *)NULL);
    else if (dt == DTYPE_BF16) launch_norm(ar->cc, ar->peers, nm, n, (__nv_bfloat16 *)x16);
    else launch_norm(ar->cc, ar->peers, nm, n, (__half *)x16);
}
