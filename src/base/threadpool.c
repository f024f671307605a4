#include "base/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "base/error.h"
#include "base/mem.h"

struct worker {
    struct threadpool *tp;
    pthread_t thread;
    int ith;
};

struct threadpool {
    int n;
    struct worker *workers; /* n - 1 of them; the caller is thread 0 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic unsigned gen;    /* bumped once per job */
    _Atomic int pending;     /* workers still running the current job */
    _Atomic int stop;
    int n_sleeping;          /* guarded by mu */
    threadpool_fn fn;
    void *arg;
};

enum { SPIN_ITERS = 1 << 16 };

static void *worker_main(void *p) {
    struct worker *w = p;
    struct threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (g == seen && !atomic_load(&tp->stop)) {
            pthread_mutex_lock(&tp->mu);
            tp->n_sleeping++;
            while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            tp->n_sleeping--;
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = g;
        tp->fn(tp->arg, w->ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
    }
}

struct threadpool *threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    struct threadpool *tp = xcalloc(1, sizeof *tp);
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->workers = xcalloc((size_t)n_threads, sizeof *tp->workers);
    for (int i = 1; i < n_threads; i++) {
        tp->workers[i].tp = tp;
        tp->workers[i].ith = i;
        int rc = pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]);
        KILN_ASSERT_MSG(rc == 0, "pthread_create failed");
    }
    return tp;
}

void threadpool_destroy(struct threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->workers);
    free(tp);
}

int threadpool_size(const struct threadpool *tp) { return tp->n; }

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg) {
    if (tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->pending, tp->n - 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    if (tp->n_sleeping) pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) cpu_relax();
}
