/* mem.h — allocation that never returns NULL for small, internal sizes.
 *
 * Out of memory on a bookkeeping allocation is treated as a broken invariant
 * (abort with file:line); large allocations whose size comes from outside
 * (KV pool, weights) use plain malloc/mmap and report a clear error instead.
 */
#ifndef KILN_BASE_MEM_H
#define KILN_BASE_MEM_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* 64-byte aligned, zeroed; free with free(). */
void *xaligned_alloc(size_t n);

/* Monotonic time in seconds. */
double time_now(void);

#endif
