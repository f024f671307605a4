/* cuda_nccl.c — the CUDA backend's communicator (dist/comm.h) over NCCL:
 * the collectives of several ranks on device buffers, enqueued on the
 * backend's stream like any kernel (so they are ordered with the step's
 * kernels, never wait for the host, and record into graphs).
 *
 * Start-up: rank 0 makes an ncclUniqueId (cuda_comm_id), the job's host
 * communicator hands it to every rank (runner_load), and each rank joins
 * the NCCL communicator of the group with it (cuda_comm_init). NCCL
 * finds the fastest transport between the GPUs (NVLink, PCIe, shared
 * memory, sockets or InfiniBand across machines).
 *
 * Results: every rank gets the same bits (NCCL reduces each element once
 * and sends the result around), in an order that is fixed for a given
 * group, message size and NCCL configuration but is not the rank order
 * of the TCP communicator.
 *
 * Errors: a failed call is reported with NCCL's message; asynchronous
 * failures (a peer that died) surface in the next call or at the stream's
 * next synchronization. A build without NCCL refuses to create one.
 * Without KILN_HAVE_NCCL (NCCL's header and library not found at
 * configure time) both entry points fail with a message saying so. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#include "base/mem.h"
#include "dist/comm.h"

#ifdef KILN_HAVE_NCCL
#include <nccl.h>

struct nccl_ctx {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size;
    float *one; /* device scratch of the barrier */
    /* the one-shot all-reduce (cuda_allreduce.cu), where every rank is on
     * this machine and reachable: ar_bytes > 0 */
    size_t ar_bytes;           /* messages up to this size take it */
    struct cuda_ar_peers peers;
    void *region;              /* this rank's region (data buffers, flags) */
    void *mapped[CUDA_AR_MAX_RANKS]; /* peers' regions opened by IPC handle (to close) */
    uint32_t *counters;        /* epoch, done */
};

static int nccl_fail(const char *op, ncclResult_t r, struct kiln_error *err) {
    return kiln_errorc(err, KILN_ERR_IO, "NCCL %s: %s", op, ncclGetErrorString(r));
}

#define NCCL_TRY(op, call)                                      \
    do {                                                        \
        ncclResult_t r_ = (call);                               \
        if (r_ != ncclSuccess) return nccl_fail(op, r_, err);   \
    } while (0)

static ncclRedOp_t red_op(enum dist_reduce op) { return op == DIST_MAX ? ncclMax : ncclSum; }

static int n_all_reduce(void *ctx, float *buf, size_t n, enum dist_reduce op, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    if (op == DIST_SUM && n * 4 <= c->ar_bytes && n <= (size_t)c->peers.cap && n % 4 == 0 && ((uintptr_t)buf & 15) == 0) {
        cuda_ar_one_shot(c->stream, buf, (long)n, &c->peers, c->counters, c->counters + 1);
        return 0;
    }
    NCCL_TRY("all_reduce", ncclAllReduce(buf, buf, n, ncclFloat32, red_op(op), c->comm, c->stream));
    return 0;
}

static int n_all_gather(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("all_gather", ncclAllGather(send, recv, bytes, ncclUint8, c->comm, c->stream));
    return 0;
}

static int n_reduce_scatter(void *ctx, const float *send, float *recv, size_t n, enum dist_reduce op,
                            struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("reduce_scatter", ncclReduceScatter(send, recv, n, ncclFloat32, red_op(op), c->comm, c->stream));
    return 0;
}

/* point-to-point pairs of every peer in one group call */
static int n_all_to_allv(void *ctx, const void *send, const size_t *send_bytes, const size_t *send_off, void *recv,
                         const size_t *recv_bytes, const size_t *recv_off, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("all_to_all", ncclGroupStart());
    for (int p = 0; p < c->size; p++) {
        if (send_bytes[p]) {
            ncclResult_t r = ncclSend((const char *)send + send_off[p], send_bytes[p], ncclUint8, p, c->comm, c->stream);
            if (r != ncclSuccess) {
                (void)ncclGroupEnd();
                return nccl_fail("all_to_all send", r, err);
            }
        }
        if (recv_bytes[p]) {
            ncclResult_t r = ncclRecv((char *)recv + recv_off[p], recv_bytes[p], ncclUint8, p, c->comm, c->stream);
            if (r != ncclSuccess) {
                (void)ncclGroupEnd();
                return nccl_fail("all_to_all recv", r, err);
            }
        }
    }
    NCCL_TRY("all_to_all", ncclGroupEnd());
    return 0;
}

static int n_all_to_all(void *ctx, const void *send, void *recv, size_t bytes, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    size_t *v = xmalloc((size_t)c->size * 2 * sizeof *v);
    for (int p = 0; p < c->size; p++) v[p] = bytes, v[c->size + p] = (size_t)p * bytes;
    int rc = n_all_to_allv(ctx, send, v, v + c->size, recv, v, v + c->size, err);
    free(v);
    return rc;
}

static int n_broadcast(void *ctx, void *buf, size_t bytes, int root, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("broadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->comm, c->stream));
    return 0;
}

static int n_barrier(void *ctx, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("barrier", ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclSum, c->comm, c->stream));
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return kiln_errorc(err, KILN_ERR_IO, "NCCL barrier: %s", cudaGetErrorString(e));
    return 0;
}

static void ar_free(struct nccl_ctx *c) {
    for (int p = 0; p < CUDA_AR_MAX_RANKS; p++)
        if (c->mapped[p]) (void)cudaIpcCloseMemHandle(c->mapped[p]);
    (void)cudaFree(c->region);
    (void)cudaFree(c->counters);
    memset(c->mapped, 0, sizeof c->mapped);
    c->region = NULL, c->counters = NULL, c->ar_bytes = 0;
}

static void n_free(void *ctx) {
    struct nccl_ctx *c = ctx;
    if (!c) return;
    (void)cudaStreamSynchronize(c->stream);
    ar_free(c);
    ncclResult_t async = ncclSuccess;
    (void)ncclCommGetAsyncError(c->comm, &async);
    if (async != ncclSuccess) (void)ncclCommAbort(c->comm);
    else (void)ncclCommDestroy(c->comm);
    (void)cudaFree(c->one);
    free(c);
}

static const struct dist_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = n_all_reduce,
    .all_gather = n_all_gather,
    .reduce_scatter = n_reduce_scatter,
    .all_to_all = n_all_to_all,
    .all_to_allv = n_all_to_allv,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .free = n_free,
};

/* What each rank tells the others to set up the one-shot all-reduce. */
struct ar_info {
    char host[64];
    int32_t pid, device, ok;
    cudaIpcMemHandle_t handle;
    uint64_t region;
};

/* The one-shot all-reduce's regions: each rank makes its own, the ranks
 * swap their handles (an NCCL all-gather), and each maps the others' (a
 * plain pointer with peer access where a rank is a thread of this process,
 * else the IPC handle). Every rank must reach every other on this machine;
 * otherwise (or with KILN_CUDA_ONE_SHOT=0) NCCL does every all-reduce.
 * Collective: every rank calls it. Returns 0 in both cases. */
static void ar_setup(struct nccl_ctx *c, int device) {
    size_t want = (size_t)knob_int(KNOB_CUDA_ONE_SHOT);
    long cap = (long)((want + 3) / 4);
    struct ar_info mine = {.pid = (int32_t)getpid(), .device = device, .ok = 0};
    if (gethostname(mine.host, sizeof mine.host - 1)) mine.host[0] = 0;
    size_t flags_bytes = (size_t)CUDA_AR_MAX_BLOCKS * CUDA_AR_MAX_RANKS * 4;
    cap = (cap + 3) & ~3L; /* whole 16-byte rows */
    size_t bytes = (size_t)cap * 2 * (size_t)c->size * 4 + flags_bytes;
    if (want && c->size <= CUDA_AR_MAX_RANKS && cudaMalloc(&c->region, bytes) == cudaSuccess &&
        cudaMalloc((void **)&c->counters, 8) == cudaSuccess && cudaMemset(c->region, 0, bytes) == cudaSuccess &&
        cudaMemset(c->counters, 0, 8) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
        cudaIpcGetMemHandle(&mine.handle, c->region) == cudaSuccess) {
        mine.ok = 1;
        mine.region = (uint64_t)(uintptr_t)c->region;
    }
    (void)cudaGetLastError();
    /* every rank's info, through NCCL on device memory */
    struct ar_info *all = xcalloc((size_t)c->size, sizeof *all);
    void *d = NULL;
    int ok = cudaMalloc(&d, sizeof *all * (size_t)(c->size + 1)) == cudaSuccess;
    if (ok) {
        ok = cudaMemcpy(d, &mine, sizeof mine, cudaMemcpyHostToDevice) == cudaSuccess &&
             ncclAllGather(d, (char *)d + sizeof mine, sizeof mine, ncclUint8, c->comm, c->stream) == ncclSuccess &&
             cudaStreamSynchronize(c->stream) == cudaSuccess &&
             cudaMemcpy(all, (char *)d + sizeof mine, sizeof *all * (size_t)c->size, cudaMemcpyDeviceToHost) ==
                 cudaSuccess;
        (void)cudaFree(d);
    }
    for (int p = 0; ok && p < c->size; p++) ok = all[p].ok && !strcmp(all[p].host, mine.host);
    /* map the peers */
    c->peers = (struct cuda_ar_peers){.rank = c->rank, .size = c->size, .cap = cap};
    for (int p = 0; ok && p < c->size; p++) {
        void *base = NULL;
        if (p == c->rank) {
            base = c->region;
        } else if (all[p].pid == mine.pid) {
            int can = 0;
            ok = cudaDeviceCanAccessPeer(&can, device, all[p].device) == cudaSuccess && can;
            if (ok) {
                cudaError_t e = cudaDeviceEnablePeerAccess(all[p].device, 0);
                ok = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
                base = (void *)(uintptr_t)all[p].region;
            }
        } else {
            ok = cudaIpcOpenMemHandle(&base, all[p].handle, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
            if (ok) c->mapped[p] = base;
        }
        if (ok) {
            c->peers.buf[p] = (float *)base;
            c->peers.flags[p] = (uint32_t *)((char *)base + (size_t)cap * 2 * (size_t)c->size * 4);
        }
    }
    (void)cudaGetLastError();
    /* every rank must have mapped every peer: agree through NCCL (a max of
     * "failed" flags) before anyone uses it */
    float bad = ok ? 0.0f : 1.0f;
    if (cudaMemcpy(c->one, &bad, 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclMax, c->comm, c->stream) != ncclSuccess ||
        cudaStreamSynchronize(c->stream) != cudaSuccess || cudaMemcpy(&bad, c->one, 4, cudaMemcpyDeviceToHost))
        bad = 1.0f;
    (void)cudaGetLastError();
    if (want && bad == 0.0f) {
        c->ar_bytes = want;
        if (c->rank == 0)
            log_info("all-reduces of up to %zu bytes: one kernel over CUDA IPC (%d ranks on this machine); larger: NCCL",
                     want, c->size);
    } else {
        ar_free(c);
        if (want && c->rank == 0)
            log_info("all-reduces: NCCL only (not every rank could map every other's memory on one machine)");
    }
    free(all);
}

int cuda_comm_id(void *ctx, void *blob, size_t *len, struct kiln_error *err) {
    (void)ctx;
    if (*len < sizeof(ncclUniqueId)) return kiln_errorf(err, "NCCL unique id: %zu bytes of room, needs %zu", *len,
                                                        sizeof(ncclUniqueId));
    ncclUniqueId id;
    NCCL_TRY("get unique id", ncclGetUniqueId(&id));
    memcpy(blob, &id, sizeof id);
    *len = sizeof id;
    return 0;
}

int cuda_comm_init(void *ctx, struct dist_comm *out, int rank, int size, const void *id_bytes, size_t id_len,
                   struct kiln_error *err) {
    struct cuda_ctx *cc = ctx;
    if (id_len != sizeof(ncclUniqueId))
        return kiln_errorf(err, "NCCL: rank 0 sent %zu bytes, not an ncclUniqueId (%zu): rank 0 must run on the "
                                "CUDA backend too", id_len, sizeof(ncclUniqueId));
    cudaError_t e = cudaSetDevice(cc->device);
    if (e != cudaSuccess) return kiln_errorf(err, "NCCL: CUDA device %d: %s", cc->device, cudaGetErrorString(e));
    struct nccl_ctx *c = xcalloc(1, sizeof *c);
    c->stream = cc->stream, c->rank = rank, c->size = size;
    if ((e = cudaMalloc((void **)&c->one, sizeof(float))) != cudaSuccess) {
        free(c);
        return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "NCCL: %s", cudaGetErrorString(e));
    }
    ncclUniqueId id;
    memcpy(&id, id_bytes, sizeof id);
    ncclResult_t r = ncclCommInitRank(&c->comm, size, id, rank);
    if (r != ncclSuccess) {
        (void)cudaFree(c->one);
        free(c);
        return kiln_errorc(err, KILN_ERR_IO, "NCCL: rank %d of %d could not join the group: %s", rank, size,
                           ncclGetErrorString(r));
    }
    ar_setup(c, cc->device);
    *out = (struct dist_comm){.ops = &nccl_ops, .ctx = c, .rank = rank, .size = size};
    return 0;
}

#else

int cuda_comm_id(void *ctx, void *blob, size_t *len, struct kiln_error *err) {
    (void)ctx, (void)blob, (void)len;
    return kiln_errorf(err, "this kiln was built without NCCL (nccl.h and libnccl were not found when it was "
                            "configured), so several CUDA ranks cannot communicate");
}

int cuda_comm_init(void *ctx, struct dist_comm *out, int rank, int size, const void *id, size_t id_len,
                   struct kiln_error *err) {
    (void)out, (void)rank, (void)size, (void)id, (void)id_len;
    return cuda_comm_id(ctx, NULL, NULL, err);
}

#endif
