/* bench_result.c — the per-request record and the progress line. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mem.h"
#include "cli/bench.h"

void bench_result_free(struct bench_result *r) {
    free(r->error);
    free(r->itl);
    buf_free(&r->text);
    memset(r, 0, sizeof *r);
}

void bench_result_add_itl(struct bench_result *r, double gap) {
    if (r->n_itl == r->cap_itl) {
        r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 64;
        r->itl = xrealloc(r->itl, (size_t)r->cap_itl * sizeof *r->itl);
    }
    r->itl[r->n_itl++] = gap;
}

void bench_result_fail(struct bench_result *r, const char *fmt, ...) {
    r->success = 0;
    if (r->error) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->error = xstrdup(msg);
}

void bench_progress_init(struct bench_progress *p, int total, int enabled) {
    p->enabled = enabled && isatty(STDERR_FILENO);
    p->total = total;
    p->last_draw = 0;
}

void bench_progress_update(struct bench_progress *p, int done, int force) {
    if (!p->enabled) return;
    double now = time_now();
    /* Redrawing ten times a second is enough for a person and costs the
     * timing loop nothing measurable. */
    if (!force && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    int width = 40, fill = p->total ? (int)((long)done * width / p->total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : ' ';
    bar[width] = 0;
    fprintf(stderr, "\r%3d%%|%s| %d/%d", p->total ? (int)(100L * done / p->total) : 100, bar, done, p->total);
    fflush(stderr);
}

void bench_progress_end(struct bench_progress *p) {
    if (!p->enabled) return;
    bench_progress_update(p, p->total, 1);
    fputc('\n', stderr);
}
