#include "base/log.h"

#include "base/knob.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The one process-wide setting in kiln: a log level is a property of the
 * process (its stderr), not of an engine. -1 = not read from the knob KILN_LOG yet. */
static _Atomic int g_level = -1;

static int current_level(void) {
    int l = atomic_load(&g_level);
    if (l >= 0) return l;
    l = knob_enum(KNOB_LOG); /* its words are in enum log_level's order */
    atomic_store(&g_level, l);
    return l;
}

int log_enabled(enum log_level level) { return (int)level <= current_level(); }

void log_msg(enum log_level level, const char *fmt, ...) {
    if (!log_enabled(level)) return;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[%02d:%02d:%02d.%03ld %s] ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line keeps threads' lines whole */
}
