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
 * Small all-reduces between the GPUs of one machine take the one-shot
 * kernel over CUDA IPC instead (cuda_allreduce.cu; up to KILN_CUDA_ONE_SHOT
 * bytes), and the model's reductions that a residual add + RMSNorm follows
 * run fused with it (cuda_comm_ar, backend_ops.reduce_add_rmsnorm). ar_setup
 * maps the ranks' buffers at start-up, where every rank can reach every
 * other; else NCCL carries everything.
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
    /* the one-shot all-reduce: ar.max_bytes > 0 where it is set up */
    struct cuda_ar ar;
    void *region;                    /* this rank's buffers and counters */
    void *mapped[CUDA_AR_MAX_RANKS]; /* peers' regions opened by IPC handle (to close) */
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
    if (op == DIST_SUM && c->ar.max_bytes && cuda_ar_sum_ok(&c->ar, buf, (long)n)) {
        cuda_ar_sum(&c->ar, buf, (long)n);
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

/* Enqueued on the stream like the collectives; the peer's matching call
 * completes the pair. */
static int n_send(void *ctx, const void *buf, size_t bytes, int peer, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("send", ncclSend(buf, bytes, ncclUint8, peer, c->comm, c->stream));
    return 0;
}

static int n_recv(void *ctx, void *buf, size_t bytes, int peer, struct kiln_error *err) {
    struct nccl_ctx *c = ctx;
    NCCL_TRY("recv", ncclRecv(buf, bytes, ncclUint8, peer, c->comm, c->stream));
    return 0;
}

static void ar_free(struct nccl_ctx *c) {
    for (int p = 0; p < CUDA_AR_MAX_RANKS; p++)
        if (c->mapped[p]) (void)cudaIpcCloseMemHandle(c->mapped[p]);
    (void)cudaFree(c->region);
    memset(c->mapped, 0, sizeof c->mapped);
    c->region = NULL;
    memset(&c->ar, 0, sizeof c->ar);
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
    .send = n_send,
    .recv = n_recv,
    .free = n_free,
};

const struct cuda_ar *cuda_comm_ar(const struct dist_comm *dc) {
    if (!dc || dc->ops != &nccl_ops) return NULL;
    const struct nccl_ctx *c = dc->ctx;
    return c->ar.max_bytes ? &c->ar : NULL;
}

/* What each rank tells the others to set up the one-shot all-reduce. */
struct ar_info {
    char host[64];
    int32_t pid, device, ok;
    cudaIpcMemHandle_t handle;
    uint64_t region;
};

/* Each rank's info, through NCCL on device memory; 0 on success. */
static int ar_swap(struct nccl_ctx *c, const struct ar_info *mine, struct ar_info *all) {
    void *d = NULL;
    if (cudaMalloc(&d, sizeof *all * (size_t)(c->size + 1)) != cudaSuccess) return -1;
    int ok = cudaMemcpy(d, mine, sizeof *mine, cudaMemcpyHostToDevice) == cudaSuccess &&
             ncclAllGather(d, (char *)d + sizeof *mine, sizeof *mine, ncclUint8, c->comm, c->stream) == ncclSuccess &&
             cudaStreamSynchronize(c->stream) == cudaSuccess &&
             cudaMemcpy(all, (char *)d + sizeof *mine, sizeof *all * (size_t)c->size, cudaMemcpyDeviceToHost) ==
                 cudaSuccess;
    (void)cudaFree(d);
    return ok ? 0 : -1;
}

/* Whether every rank succeeded (a max of "failed" flags through NCCL). */
static int ar_agree(struct nccl_ctx *c, int ok) {
    float bad = ok ? 0.0f : 1.0f;
    if (cudaMemcpy(c->one, &bad, 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclMax, c->comm, c->stream) != ncclSuccess ||
        cudaStreamSynchronize(c->stream) != cudaSuccess || cudaMemcpy(&bad, c->one, 4, cudaMemcpyDeviceToHost))
        bad = 1.0f;
    return bad == 0.0f;
}

/* The one-shot all-reduce's buffers: each rank makes its region ([3][size]
 * slots of cap floats, filled with -0, then the counters), the ranks swap
 * their handles, and each maps the others' (a plain pointer with peer
 * access where a rank is a thread of this process, else the IPC handle).
 * Every rank must reach every other on this machine; otherwise (or with
 * KILN_CUDA_ONE_SHOT=0, or several ranks with --deterministic: the kernel
 * adds in rank order, NCCL in its own, and the two must not mix) NCCL
 * does every all-reduce. Collective: every rank calls it. */
static void ar_setup(struct nccl_ctx *c, const struct cuda_ctx *cc) {
    size_t want = (size_t)knob_int(KNOB_CUDA_ONE_SHOT);
    if (c->size > CUDA_AR_MAX_RANKS || (cc->deterministic && c->size > 2)) want = 0;
    long cap = (long)((want / 4 + 3) & ~(size_t)3); /* whole 16-byte rows */
    size_t data = (size_t)cap * 3 * (size_t)c->size * 4, bytes = data + CUDA_AR_STATE_WORDS * 4;
    struct ar_info mine = {.pid = (int32_t)getpid(), .device = cc->device, .ok = 0};
    if (gethostname(mine.host, sizeof mine.host - 1)) mine.host[0] = 0;
    if (want && cudaMalloc(&c->region, bytes) == cudaSuccess && !cuda_ar_fill(c->region, data) &&
        cudaMemset((char *)c->region + data, 0, bytes - data) == cudaSuccess &&
        cudaDeviceSynchronize() == cudaSuccess && cudaIpcGetMemHandle(&mine.handle, c->region) == cudaSuccess) {
        mine.ok = 1;
        mine.region = (uint64_t)(uintptr_t)c->region;
    }
    (void)cudaGetLastError();
    struct ar_info *all = xcalloc((size_t)c->size, sizeof *all);
    int ok = !ar_swap(c, &mine, all);
    for (int p = 0; ok && p < c->size; p++) ok = all[p].ok && !strcmp(all[p].host, mine.host);
    c->ar = (struct cuda_ar){.cc = cc, .peers = {.rank = c->rank, .size = c->size, .cap = cap}};
    for (int p = 0; ok && p < c->size; p++) {
        void *base = NULL;
        if (p == c->rank) {
            base = c->region;
        } else if (all[p].pid == mine.pid) {
            int can = 0;
            ok = cudaDeviceCanAccessPeer(&can, cc->device, all[p].device) == cudaSuccess && can;
            if (ok) {
                cudaError_t e = cudaDeviceEnablePeerAccess(all[p].device, 0);
                ok = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
                base = (void *)(uintptr_t)all[p].region;
            }
        } else {
            ok = cudaIpcOpenMemHandle(&base, all[p].handle, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
            if (ok) c->mapped[p] = base;
        }
        if (ok) c->ar.peers.buf[p] = base;
    }
    if (c->region) c->ar.peers.state = (uint32_t *)((char *)c->region + data);
    (void)cudaGetLastError();
    /* every rank must have mapped every peer before anyone uses it */
    ok = ar_agree(c, ok);
    (void)cudaGetLastError();
    if (want && ok) {
        c->ar.max_bytes = want;
        if (c->rank == 0)
            log_info("all-reduces of up to %zu bytes: one kernel over CUDA IPC (%d ranks on this machine), "
                     "fused with the norm after them; larger: NCCL", want, c->size);
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
    ar_setup(c, cc);
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

const struct cuda_ar *cuda_comm_ar(const struct dist_comm *c) {
    (void)c;
    return NULL;
}

#endif
