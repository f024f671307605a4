/* threadpool.h — a fork-join pool for data-parallel kernels.
 *
 * threadpool_run(tp, fn, arg) calls fn(arg, ith, nth) for ith = 0..nth-1 at
 * once, the calling thread taking ith = 0, and returns when all are done.
 * Workers spin briefly between jobs (kernels come back-to-back within a
 * forward pass) and then sleep on a condition variable, so an idle engine
 * uses no CPU. One pool per backend context; never shared global state.
 */
#ifndef KILN_BASE_THREADPOOL_H
#define KILN_BASE_THREADPOOL_H

struct threadpool;

typedef void (*threadpool_fn)(void *arg, int ith, int nth);

/* n_threads <= 0 means one per online CPU. */
struct threadpool *threadpool_create(int n_threads);
void threadpool_destroy(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg);

/* Splits [0, n) into nth near-equal contiguous ranges; range ith is [*lo, *hi). */
static inline void threadpool_split(long n, int ith, int nth, long *lo, long *hi) {
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif
