/* tokenize_pool.c — tokenization off the loop thread (see tokenize_pool.h). */
#include "server/tokenize_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "base/error.h"
#include "base/mem.h"
#include "server/http.h"
#include "server/metrics.h"

struct tok_job {
    struct tok_pool *pool;
    struct http_request *req; /* loop thread only; NULL once the client is gone */
    tok_work_fn work;
    tok_done_fn done;
    tok_release_fn release;
    void *arg;
    size_t cost;                /* bytes to tokenize, about */
    atomic_int cancelled;
    int batch_size;             /* set on the first job of a batch */
    struct tok_job *next;       /* queue or mailbox */
    struct tok_job *prev_all, *next_all; /* every job not yet released (loop thread) */
};

struct tok_pool {
    struct metrics *metrics;
    struct event *ev;
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct tok_job *q_head, *q_tail; /* guarded by qmu */
    int stop;                        /* guarded by qmu */
    pthread_mutex_t dmu;
    struct tok_job *d_head, *d_tail; /* guarded by dmu */
    struct tok_job *all;             /* loop thread */
    int n_jobs;
    void (*on_idle)(void *);
    void *idle_arg;
};

static void *worker(void *arg) {
    struct tok_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->qmu);
        while (!p->stop && !p->q_head) pthread_cond_wait(&p->qcv, &p->qmu);
        if (p->stop) {
            pthread_mutex_unlock(&p->qmu);
            return NULL;
        }
        /* the dynamic batch: what is queued now, up to the caps; a job over
         * the byte budget runs alone, so that no small job waits behind it
         * in the same batch */
        struct tok_job *first = p->q_head, *last = first;
        int n = 1;
        size_t bytes = first->cost;
        while (last->next && n < TOK_POOL_MAX_BATCH && bytes + last->next->cost <= TOK_POOL_BATCH_BYTES)
            last = last->next, n++, bytes += last->cost;
        p->q_head = last->next;
        if (!p->q_head) p->q_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&p->qmu);
        for (struct tok_job *j = first; j; j = j->next)
            if (!atomic_load(&j->cancelled)) j->work(j->arg);
        first->batch_size = n;
        pthread_mutex_lock(&p->dmu);
        int was_empty = p->d_head == NULL;
        if (p->d_tail) p->d_tail->next = first;
        else p->d_head = first;
        p->d_tail = last;
        pthread_mutex_unlock(&p->dmu);
        if (was_empty) event_active(p->ev, EV_READ, 0);
    }
}

static void job_release(struct tok_pool *p, struct tok_job *j) {
    if (j->prev_all) j->prev_all->next_all = j->next_all;
    else p->all = j->next_all;
    if (j->next_all) j->next_all->prev_all = j->prev_all;
    p->n_jobs--;
    j->release(j->arg);
    free(j);
}

static void on_mail(evutil_socket_t fd, short what, void *arg) {
    struct tok_pool *p = arg;
    (void)fd, (void)what;
    pthread_mutex_lock(&p->dmu);
    struct tok_job *j = p->d_head;
    p->d_head = p->d_tail = NULL;
    pthread_mutex_unlock(&p->dmu);
    while (j) {
        struct tok_job *next = j->next;
        if (j->batch_size && p->metrics) metrics_observe_tok_batch(p->metrics, j->batch_size);
        if (j->req) {
            struct http_request *r = j->req;
            j->req = NULL;
            http_request_on_close(r, NULL, NULL);
            j->done(j->arg, r);
        }
        job_release(p, j);
        j = next;
    }
    if (!p->n_jobs && p->on_idle) p->on_idle(p->idle_arg);
}

static void on_client_gone(void *arg) {
    struct tok_job *j = arg;
    j->req = NULL;
    atomic_store(&j->cancelled, 1);
    if (j->pool->metrics) j->pool->metrics->aborted_by_client++;
}

int tok_pool_create(struct tok_pool **out, struct event_base *base, int n_workers, struct metrics *m,
                    struct kiln_error *err) {
    *out = NULL;
    struct tok_pool *p = xcalloc(1, sizeof *p);
    p->metrics = m;
    pthread_mutex_init(&p->qmu, NULL);
    pthread_cond_init(&p->qcv, NULL);
    pthread_mutex_init(&p->dmu, NULL);
    p->ev = event_new(base, -1, 0, on_mail, p);
    if (!p->ev) {
        tok_pool_free(p);
        return kiln_errorf(err, "cannot create the tokenizer pool's event");
    }
    p->threads = xcalloc((size_t)(n_workers > 0 ? n_workers : 1), sizeof *p->threads);
    for (int i = 0; i < n_workers; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p)) {
            tok_pool_free(p);
            return kiln_errorf(err, "cannot start a tokenizer worker thread");
        }
        p->n_threads++;
    }
    *out = p;
    return 0;
}

void tok_pool_free(struct tok_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->qmu);
    p->stop = 1;
    pthread_cond_broadcast(&p->qcv);
    pthread_mutex_unlock(&p->qmu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    p->on_idle = NULL;
    /* queued, finished or undelivered: all of them are on the list */
    while (p->all) {
        struct tok_job *j = p->all;
        if (j->req) http_request_on_close(j->req, NULL, NULL);
        job_release(p, j);
    }
    if (p->ev) event_free(p->ev);
    pthread_mutex_destroy(&p->qmu);
    pthread_cond_destroy(&p->qcv);
    pthread_mutex_destroy(&p->dmu);
    free(p->threads);
    free(p);
}

void tok_pool_submit(struct tok_pool *p, struct http_request *req, size_t cost, tok_work_fn work,
                     tok_done_fn done, tok_release_fn release, void *arg) {
    struct tok_job *j = xcalloc(1, sizeof *j);
    j->cost = cost;
    j->pool = p;
    j->req = req;
    j->work = work;
    j->done = done;
    j->release = release;
    j->arg = arg;
    atomic_init(&j->cancelled, 0);
    j->next_all = p->all;
    if (p->all) p->all->prev_all = j;
    p->all = j;
    p->n_jobs++;
    http_request_on_close(req, on_client_gone, j);
    pthread_mutex_lock(&p->qmu);
    if (p->q_tail) p->q_tail->next = j;
    else p->q_head = j;
    p->q_tail = j;
    pthread_cond_signal(&p->qcv);
    pthread_mutex_unlock(&p->qmu);
}

int tok_pool_jobs(const struct tok_pool *p) { return p ? p->n_jobs : 0; }

void tok_pool_on_idle(struct tok_pool *p, void (*cb)(void *), void *arg) {
    p->on_idle = cb;
    p->idle_arg = arg;
}
