/* test_cuda_nccl.c — the CUDA backend's communicator (NCCL, cuda_nccl.c)
 * on two or more GPUs of one machine, one rank per GPU as threads of this
 * process: the TCP rendezvous hands rank 0's NCCL unique id to the others
 * (backend_ops.comm_id / comm_init), then every collective of dist/comm.h
 * runs on device buffers and is checked against values computed on the
 * host: all_reduce (sum and max, sizes from one float to 4 Mi, in place),
 * all_gather (in place too), reduce_scatter, all_to_all, all_to_allv with
 * uneven and empty blocks, broadcast from a non-zero root, barrier, and an
 * all_reduce recorded in a graph and replayed on new data. Every rank must
 * see the same bits.
 *
 * Then it measures all_reduce of the hidden states of decode and prefill
 * steps (fp32 rows of 4096: 1, 64 and 256 rows, 8192 rows) — latency and
 * bus bandwidth (2 (n-1)/n of the bytes per rank per second, NCCL's
 * convention) — printed, not asserted.
 *
 * Label gpu_multi (ctest -L gpu_multi on a machine with several GPUs; it
 * fails, saying so, with fewer than two). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "dist/net.h"
#include "dist/rendezvous.h"
#include "tensor/backend.h"

enum { MAX_RANKS = 8 };

struct rank {
    int r, size;
    char addr[64];
    int lfd;
    struct backend be;
    struct dist_group g;
    struct dist_comm c;
    int failed;
    char msg[512];
    double *times; /* [n_sizes] mean seconds of an all_reduce (rank 0) */
};

static void rank_fail(struct rank *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rank_fail(struct rank *k, const char *fmt, ...) {
    if (k->failed++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->msg, sizeof k->msg, fmt, ap);
    va_end(ap);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define OPS (k->be.ops)
#define CTX (k->be.ctx)
/* a device buffer of n floats filled from host values */
static float *dev_floats(struct rank *k, const float *h, size_t n) {
    float *d = OPS->alloc(CTX, n * 4 + 16);
    if (d && h) OPS->upload(CTX, d, h, n * 4);
    return d;
}

static void get(struct rank *k, void *h, const void *d, size_t bytes) {
    OPS->synchronize(CTX);
    OPS->download(CTX, h, d, bytes);
}

/* the value rank r contributes at element i */
static float val(int r, size_t i) { return (float)((int)(i % 1000) - 500) * 0.25f + (float)(r + 1) * 0.5f; }

static void check_all_reduce(struct rank *k, size_t n, enum dist_reduce op) {
    struct kiln_error err = {0};
    float *h = xmalloc(n * 4), *out = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = val(k->r, i);
    float *d = dev_floats(k, h, n);
    if (dist_comm_all_reduce(&k->c, d, n, op, &err)) rank_fail(k, "all_reduce: %s", err.msg);
    get(k, out, d, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++) {
        /* exact: the values are multiples of 0.25 well inside float's range */
        float want = op == DIST_SUM ? 0.0f : -INFINITY;
        for (int r = 0; r < k->size; r++) want = op == DIST_SUM ? want + val(r, i) : fmaxf(want, val(r, i));
        if (out[i] != want) rank_fail(k, "all_reduce %s n=%zu: [%zu] = %g, want %g", op == DIST_SUM ? "sum" : "max", n,
                                      i, out[i], want);
    }
    OPS->free(CTX, d);
    free(h), free(out);
}

static void check_gather_scatter(struct rank *k) {
    struct kiln_error err = {0};
    int S = k->size;
    size_t n = 1000;
    /* all_gather, in place: rank r's block r */
    float *h = xmalloc(n * S * 4), *out = xmalloc(n * S * 4);
    for (size_t i = 0; i < n * S; i++) h[i] = -1.0f;
    for (size_t i = 0; i < n; i++) h[k->r * n + i] = val(k->r, i);
    float *d = dev_floats(k, h, n * S);
    if (dist_comm_all_gather(&k->c, d + k->r * n, d, n * 4, &err)) rank_fail(k, "all_gather: %s", err.msg);
    get(k, out, d, n * S * 4);
    for (int r = 0; r < S; r++)
        for (size_t i = 0; i < n; i++)
            if (out[r * n + i] != val(r, i)) {
                rank_fail(k, "all_gather: block %d [%zu] = %g", r, i, out[r * n + i]);
                r = S;
                break;
            }
    /* reduce_scatter: block p of every rank summed into rank p */
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < n; i++) h[p * n + i] = val(k->r, i + 7 * p);
    OPS->upload(CTX, d, h, n * S * 4);
    float *rs = dev_floats(k, NULL, n);
    if (dist_comm_reduce_scatter(&k->c, d, rs, n, DIST_SUM, &err)) rank_fail(k, "reduce_scatter: %s", err.msg);
    get(k, out, rs, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++) {
        float want = 0.0f;
        for (int r = 0; r < S; r++) want += val(r, i + 7 * k->r);
        if (out[i] != want) rank_fail(k, "reduce_scatter: [%zu] = %g, want %g", i, out[i], want);
    }
    OPS->free(CTX, rs);
    OPS->free(CTX, d);
    free(h), free(out);
}

static void check_all_to_all(struct rank *k) {
    struct kiln_error err = {0};
    int S = k->size;
    size_t n = 333;
    float *h = xmalloc(n * S * 4), *out = xmalloc(n * S * 4);
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < n; i++) h[p * n + i] = (float)(k->r * 100 + p) + (float)i * 1e-3f;
    float *d = dev_floats(k, h, n * S), *rd = dev_floats(k, NULL, n * S);
    if (dist_comm_all_to_all(&k->c, d, rd, n * 4, &err)) rank_fail(k, "all_to_all: %s", err.msg);
    get(k, out, rd, n * S * 4);
    for (int p = 0; p < S && !k->failed; p++)
        for (size_t i = 0; i < n; i++)
            if (out[p * n + i] != (float)(p * 100 + k->r) + (float)i * 1e-3f) {
                rank_fail(k, "all_to_all: from %d [%zu] = %g", p, i, out[p * n + i]);
                break;
            }
    /* all_to_allv: rank r sends (r + p) % 3 * 17 floats to rank p (some empty) */
    size_t sb[MAX_RANKS], so[MAX_RANKS], rb[MAX_RANKS], ro[MAX_RANKS], s_off = 0, r_off = 0;
    for (int p = 0; p < S; p++) {
        sb[p] = (size_t)((k->r + p) % 3) * 17 * 4, so[p] = s_off, s_off += sb[p];
        rb[p] = (size_t)((p + k->r) % 3) * 17 * 4, ro[p] = r_off, r_off += rb[p];
    }
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < sb[p] / 4; i++) h[so[p] / 4 + i] = (float)(k->r * 1000 + p * 10) + (float)i;
    OPS->upload(CTX, d, h, s_off ? s_off : 4);
    if (dist_comm_all_to_allv(&k->c, d, sb, so, rd, rb, ro, &err)) rank_fail(k, "all_to_allv: %s", err.msg);
    get(k, out, rd, r_off ? r_off : 4);
    for (int p = 0; p < S && !k->failed; p++)
        for (size_t i = 0; i < rb[p] / 4; i++)
            if (out[ro[p] / 4 + i] != (float)(p * 1000 + k->r * 10) + (float)i) {
                rank_fail(k, "all_to_allv: from %d [%zu] = %g", p, i, out[ro[p] / 4 + i]);
                break;
            }
    OPS->free(CTX, d), OPS->free(CTX, rd);
    free(h), free(out);
}

static void check_broadcast_graph(struct rank *k) {
    struct kiln_error err = {0};
    size_t n = 4096;
    int root = k->size - 1;
    float *h = xmalloc(n * 4), *out = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = k->r == root ? val(root, i) : 0.0f;
    float *d = dev_floats(k, h, n);
    if (dist_comm_broadcast(&k->c, d, n * 4, root, &err)) rank_fail(k, "broadcast: %s", err.msg);
    get(k, out, d, n * 4);
    for (size_t i = 0; i < n && !k->failed; i++)
        if (out[i] != val(root, i)) rank_fail(k, "broadcast: [%zu] = %g", i, out[i]);
    if (dist_comm_barrier(&k->c, &err)) rank_fail(k, "barrier: %s", err.msg);
    /* an all_reduce recorded once, replayed on new data */
    OPS->graph_begin(CTX);
    if (dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err)) rank_fail(k, "all_reduce (recording): %s", err.msg);
    void *g = OPS->graph_end(CTX);
    if (!g) {
        rank_fail(k, "an all_reduce could not be recorded in a graph");
    } else {
        for (int rep = 1; rep <= 3 && !k->failed; rep++) {
            for (size_t i = 0; i < n; i++) h[i] = val(k->r, i + rep);
            OPS->upload(CTX, d, h, n * 4);
            if (OPS->graph_launch(CTX, g)) rank_fail(k, "graph replay failed");
            get(k, out, d, n * 4);
            for (size_t i = 0; i < n; i++) {
                float want = 0.0f;
                for (int r = 0; r < k->size; r++) want += val(r, i + rep);
                if (out[i] != want) {
                    rank_fail(k, "replay %d: [%zu] = %g, want %g", rep, i, out[i], want);
                    break;
                }
            }
        }
        OPS->graph_destroy(CTX, g);
    }
    OPS->free(CTX, d);
    free(h), free(out);
}

static const size_t bench_rows[] = {1, 64, 256, 8192};
enum { BENCH_SIZES = 4, HIDDEN = 4096 };

static void bench(struct rank *k) {
    struct kiln_error err = {0};
    float *d = dev_floats(k, NULL, (size_t)8192 * HIDDEN);
    for (int s = 0; s < BENCH_SIZES; s++) {
        size_t n = bench_rows[s] * HIDDEN;
        int reps = bench_rows[s] >= 8192 ? 20 : 200;
        for (int i = 0; i < 5; i++) dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err); /* warm */
        dist_comm_barrier(&k->c, &err);
        double t0 = now();
        for (int i = 0; i < reps; i++) dist_comm_all_reduce(&k->c, d, n, DIST_SUM, &err);
        OPS->synchronize(CTX);
        double t = (now() - t0) / reps;
        dist_comm_barrier(&k->c, &err);
        k->times[s] = t;
    }
    OPS->free(CTX, d);
}

static void *rank_main(void *a) {
    struct rank *k = a;
    struct kiln_error err = {0};
    struct backend_options bo = {.device = k->r};
    if (backend_create(&k->be, "cuda", &bo, &err)) {
        rank_fail(k, "rank %d: %s", k->r, err.msg);
        if (k->r == 0 && k->lfd >= 0) close(k->lfd);
        return NULL;
    }
    unsigned char blob[DIST_BLOB_MAX];
    size_t blen = sizeof blob;
    if (k->r == 0 && k->be.ops->comm_id(k->be.ctx, blob, &blen, &err)) {
        rank_fail(k, "comm_id: %s", err.msg);
        blen = 0;
    }
    struct dist_rdv_config cfg = {.init_addr = k->addr, .rank = k->r, .world_size = k->size, .timeout_s = 60,
                                  .listen_fd = k->r == 0 ? k->lfd : -1, .blob = blob, .blob_len = k->r == 0 ? blen : 0};
    if (dist_rendezvous(&cfg, &k->g, &err)) {
        rank_fail(k, "rendezvous: %s", err.msg);
    } else if (k->be.ops->comm_init(k->be.ctx, &k->c, k->r, k->size, k->g.blob, k->g.blob_len, &err)) {
        rank_fail(k, "comm_init: %s", err.msg);
    } else {
        const size_t sizes[] = {1, 5, 4096, 100003, (size_t)4 << 20};
        for (int i = 0; i < 5 && !k->failed; i++) check_all_reduce(k, sizes[i], DIST_SUM);
        check_all_reduce(k, 100003, DIST_MAX);
        if (!k->failed) check_gather_scatter(k);
        if (!k->failed) check_all_to_all(k);
        if (!k->failed) check_broadcast_graph(k);
        if (!k->failed) bench(k);
        dist_comm_free(&k->c);
    }
    dist_group_free(&k->g);
    backend_destroy(&k->be);
    return NULL;
}

static void test_nccl(void **state) {
    (void)state;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    if (n_dev < 2) fail_msg("test_cuda_nccl needs two or more GPUs (found %d): run it with ctest -L gpu_multi "
                            "on a machine with several", n_dev);
    int size = n_dev < MAX_RANKS ? n_dev : MAX_RANKS;
    struct kiln_error err = {0};
    int port;
    int lfd = dist_listen("127.0.0.1:0", &port, &err);
    if (lfd < 0) fail_msg("listen: %s", err.msg);
    struct rank rk[MAX_RANKS];
    double times[MAX_RANKS][BENCH_SIZES];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        memset(&rk[r], 0, sizeof rk[r]);
        rk[r].r = r, rk[r].size = size, rk[r].lfd = r == 0 ? lfd : -1, rk[r].times = times[r];
        snprintf(rk[r].addr, sizeof rk[r].addr, "127.0.0.1:%d", port);
        pthread_create(&th[r], NULL, rank_main, &rk[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (rk[r].failed) fail_msg("rank %d of %d: %s", r, size, rk[r].msg);
    printf("NCCL all_reduce on %d GPUs, fp32 rows of %d (the slowest rank's mean):\n", size, HIDDEN);
    printf("%8s %12s %12s %14s\n", "rows", "bytes", "us", "bus GB/s");
    for (int s = 0; s < BENCH_SIZES; s++) {
        double t = 0;
        for (int r = 0; r < size; r++) t = times[r][s] > t ? times[r][s] : t;
        double bytes = (double)bench_rows[s] * HIDDEN * 4;
        printf("%8zu %12.0f %12.1f %14.1f\n", bench_rows[s], bytes, t * 1e6,
               bytes * 2.0 * (size - 1) / size / t / 1e9);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
