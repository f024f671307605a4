/* bench_sample.c — the device sampler (backend_ops.sample) alone: time per
 * call for n rows of vocab logits under the common configurations, against
 * the bytes one read of the rows costs at the device's copy bandwidth
 * (measured in the same run). Rows look like a model's (a bulk N(0, 2.5)
 * and 32 peaks, "peaked") or are flat (N(0, 0.5): a nucleus of most of the
 * vocabulary, the slow path). Calls are recorded in a graph of `iters`
 * calls and replayed (what a decode graph pays; median of 5 replays), and
 * also launched eagerly (launch overhead included).
 *
 *   bench_sample [--device cuda] [--vocab 151936,128256] [--rows 1,64,256] [--iters 20]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "bench_util.h"
#include "tensor/backend.h"

static int parse_list(const char *s, long *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1) return 0;
        out[n++] = x;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *device = "cuda", *vl = "151936,128256", *rl = "1,64,256";
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--vocab")) vl = v, i++;
        else if (!strcmp(a, "--rows")) rl = v, i++;
        else if (!strcmp(a, "--iters")) iters = atoi(v), i++;
        else {
            fprintf(stderr, "usage: bench_sample [--device cuda] [--vocab N,..] [--rows N,..] [--iters N]\n");
            return 2;
        }
    }
    long vocabs[8], rows_list[8];
    int nv = parse_list(vl, vocabs, 8), nr = parse_list(rl, rows_list, 8);
    if (!nv || !nr || iters < 1) {
        fprintf(stderr, "bench_sample: bad --vocab / --rows / --iters\n");
        return 2;
    }
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {0};
    if (backend_create(&be, device, &bo, &err)) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    const struct backend_ops *o = be.ops;
    if (!o->sample || !o->graph_begin) {
        fprintf(stderr, "bench_sample: the %s backend does not sample on the device\n", device);
        backend_destroy(&be);
        return 1;
    }
    double bw = copy_bandwidth(&be);
    printf("device: %s, copy bandwidth %.1f GB/s (read + write); graph of %d calls, median of 5\n",
           device, bw / 1e9, iters);
    long max_rows = 0;
    for (int i = 0; i < nr; i++) max_rows = rows_list[i] > max_rows ? rows_list[i] : max_rows;
    struct {
        const char *name;
        float t, p, min_p;
        int k;
    } cfg[] = {
        {"greedy", 0, 1, 0, 0},          {"temperature 1", 1.0f, 1, 0, 0},
        {"top_k 50, t 0.8", 0.8f, 1, 0, 50}, {"top_p 0.9, t 0.7", 0.7f, 0.9f, 0, 0},
        {"min_p 0.05", 1.0f, 1, 0.05f, 0}, {"top_k 40 + top_p 0.95", 0.8f, 0.95f, 0, 40},
    };
    int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    uint64_t z = 0x5eed;
    for (int vi = 0; vi < nv; vi++) {
        long V = vocabs[vi];
        float *host = xmalloc((size_t)V * 4);
        float *dl = o->alloc(be.ctx, (size_t)(max_rows * V) * 4);
        int32_t *dt = o->alloc(be.ctx, (size_t)max_rows * 4);
        struct backend_sample_row *dr = o->alloc(be.ctx, (size_t)max_rows * sizeof *dr);
        struct backend_sample_adj *da = o->alloc(be.ctx, sizeof *da);
        struct backend_sample_row *pr = xcalloc((size_t)max_rows, sizeof *pr);
        if (!dl || !dt || !dr || !da) {
            fprintf(stderr, "bench_sample: out of device memory\n");
            return 1;
        }
        for (int flat = 0; flat < 2; flat++) {
            for (long r = 0; r < max_rows; r++) { /* every row its own */
                for (long i = 0; i < V; i++) {
                    z = z * 6364136223846793005ull + 1442695040888963407ull;
                    double u1 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
                    z = z * 6364136223846793005ull + 1442695040888963407ull;
                    double u2 = (double)(z >> 11) / 9007199254740992.0;
                    double g = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
                    host[i] = (float)(flat ? 0.5 * g : 2.5 * g);
                }
                if (!flat)
                    for (int j = 0; j < 32; j++) host[(j * 7919 + r * 31) % V] = 14.0f + (float)(j % 7);
                o->upload(be.ctx, dl + r * V, host, (size_t)V * 4);
            }
            for (int c = 0; c < n_cfg; c++) {
                if (flat && c == 0) continue; /* greedy does not care */
                for (long r = 0; r < max_rows; r++) {
                    pr[r].temperature = cfg[c].t, pr[r].top_k = cfg[c].k, pr[r].top_p = cfg[c].p;
                    pr[r].min_p = cfg[c].min_p, pr[r].seed = (uint64_t)r, pr[r].step = 7;
                }
                o->upload(be.ctx, dr, pr, (size_t)max_rows * sizeof *pr);
                printf("vocab %ld, %s rows, %-22s", V, flat ? "flat" : "peaked", cfg[c].name);
                for (int ri = 0; ri < nr; ri++) {
                    long n = rows_list[ri];
                    for (int w = 0; w < 3; w++) o->sample(be.ctx, dt, dl, V, n, V, dr, da);
                    o->synchronize(be.ctx);
                    double t0 = time_now();
                    for (int k = 0; k < iters; k++) o->sample(be.ctx, dt, dl, V, n, V, dr, da);
                    o->synchronize(be.ctx);
                    double eager = (time_now() - t0) / iters;
                    o->graph_begin(be.ctx);
                    for (int k = 0; k < iters; k++) o->sample(be.ctx, dt, dl, V, n, V, dr, da);
                    void *g = o->graph_end(be.ctx);
                    double ts[5];
                    for (int rep = 0; rep < 5; rep++) {
                        o->synchronize(be.ctx);
                        t0 = time_now();
                        if (!g || o->graph_launch(be.ctx, g)) {
                            fprintf(stderr, "bench_sample: graph failed\n");
                            return 1;
                        }
                        o->synchronize(be.ctx);
                        ts[rep] = (time_now() - t0) / iters;
                    }
                    o->graph_destroy(be.ctx, g);
                    qsort(ts, 5, sizeof ts[0], cmp_d);
                    double read_us = (double)n * V * 4 / (bw / 2) * 1e6; /* one read of the rows */
                    printf(" | %ld rows: %.1f us (eager %.1f; one read %.1f)", n, ts[2] * 1e6, eager * 1e6,
                           read_us);
                }
                printf("\n");
                fflush(stdout);
            }
        }
        o->free(be.ctx, dl), o->free(be.ctx, dt), o->free(be.ctx, dr), o->free(be.ctx, da);
        free(host), free(pr);
    }
    backend_destroy(&be);
    return 0;
}
