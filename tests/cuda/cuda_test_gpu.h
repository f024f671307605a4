/* cuda_test_gpu.h — what the sampling tests share: the backends (gpu, and
 * gpu_det with --deterministic, both on device 0), NEED_GPU for each test,
 * and the host's greedy choice. */
#ifndef KILN_TESTS_CUDA_TEST_GPU_H
#define KILN_TESTS_CUDA_TEST_GPU_H

#include <stdio.h>

#include "base/error.h"
#include "tensor/backend.h"
#include "backend/registry.h"

static struct backend gpu, gpu_det;
static int have_gpu;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu) fail_msg("no CUDA GPU: gpu-labelled tests run on the GPU machine (ctest -L gpu)"); \
    } while (0)

/* Opens both backends; without a GPU says so (the tests then fail). */
static inline void gpu_open(const char *test) {
    struct kiln_error err = {0};
    struct backend_options bo = {.n_threads = 0, .device = 0};
    have_gpu = backend_create(&gpu, "cuda", &bo, &err) == 0;
    struct backend_options bd = {.device = 0, .deterministic = 1};
    if (have_gpu) have_gpu = backend_create(&gpu_det, "cuda", &bd, &err) == 0;
    if (!have_gpu) printf("%s: %s; the tests below fail\n", test, err.msg);
}

static inline void gpu_close(void) {
    if (have_gpu) backend_destroy(&gpu), backend_destroy(&gpu_det);
}

/* The first largest logit (NaN skipped; 0 when every one is NaN): the
 * host's greedy token. */
static inline int argmax_first(const float *l, long V) {
    long best = -1;
    for (long i = 0; i < V; i++)
        if (l[i] == l[i] && (best < 0 || l[i] > l[best])) best = i;
    return best < 0 ? 0 : (int)best;
}

#endif
