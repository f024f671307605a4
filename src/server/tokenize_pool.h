/* tokenize_pool.h — tokenization and chat-template rendering off the event
 * loop thread (a dynamic batch tokenizer like SGLang's AsyncDynamicBatchTokenizer).
 *
 * A route that needs token ids hands the work to the pool as a job: `work`
 * runs on a worker thread (tokenizer encode and chat render are thread-safe
 * on a loaded tokenizer / compiled template), then `done` runs on the loop
 * thread with the request, the way engine events come back through gen.c: a
 * mutex-protected mailbox and event_active. `release` always runs, on the
 * loop thread, once the job is over.
 *
 * Dynamic batching: a worker takes the jobs queued at that moment (up to
 * TOK_POOL_MAX_BATCH jobs and TOK_POOL_BATCH_BYTES of input; a larger job
 * runs alone) and runs them back to back, then posts them together with one
 * wake-up of the loop; the batch sizes go to /metrics as
 * kiln:tokenizer_batch_size.
 *
 * Client disconnect: the pool registers the request's close callback. When
 * the client goes away, the job is marked cancelled: a job not yet started
 * is skipped by the worker, a running one finishes; either way `done` is not
 * called and `release` frees the state on the loop thread. The handler must
 * not touch the request between submit and `done`.
 *
 * The job's state (`arg`) belongs to the worker while `work` runs; the loop
 * thread touches it again only in `done` / `release` (the mailbox lock
 * orders the two).
 */
#ifndef KILN_SERVER_TOKENIZE_POOL_H
#define KILN_SERVER_TOKENIZE_POOL_H

#include <stddef.h>

struct event_base;
struct http_request;
struct kiln_error;
struct metrics;
struct tok_pool;

enum { TOK_POOL_MAX_BATCH = 64 };
/* A batch holds at most this many bytes of input, except that its first job
 * may be larger (it then runs alone). */
enum { TOK_POOL_BATCH_BYTES = 256 << 10 };

typedef void (*tok_work_fn)(void *arg);                            /* worker thread */
typedef void (*tok_done_fn)(void *arg, struct http_request *req);  /* loop thread, client still there */
typedef void (*tok_release_fn)(void *arg);                         /* loop thread, always, last */

/* n_workers >= 1. `m` (may be NULL) receives the batch size histogram. */
int tok_pool_create(struct tok_pool **out, struct event_base *base, int n_workers, struct metrics *m,
                    struct kiln_error *err);
/* Stops the workers (a running job finishes first) and releases every job
 * still held, without calling `done`. Call after the HTTP connections are
 * gone. */
void tok_pool_free(struct tok_pool *p);
/* `cost`: the bytes to tokenize, about (the request body's size). */
void tok_pool_submit(struct tok_pool *p, struct http_request *req, size_t cost, tok_work_fn work,
                     tok_done_fn done, tok_release_fn release, void *arg);
/* Jobs submitted and not yet released (loop thread). */
int tok_pool_jobs(const struct tok_pool *p);
/* Called on the loop thread each time the last job in flight is released. */
void tok_pool_on_idle(struct tok_pool *p, void (*cb)(void *), void *arg);

#endif
