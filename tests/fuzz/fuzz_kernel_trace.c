/* fuzz_kernel_trace.c — arbitrary bytes as a GPU trace for `kiln
 * profile-report` (nsys CSV, CUPTI records or Chrome JSON, by content):
 * parsed or refused with a message; a parsed trace's report credits each
 * moment of GPU activity once (the shares add up to the busy time, which
 * is at most the span). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "profile/kernel_report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct kr_rules rules;
static int have_rules;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct kiln_error err;
    if (!have_rules) {
        KILN_ASSERT(kr_rules_default(&rules, &err) == 0);
        have_rules = 1;
    }
    struct kr_trace t;
    memset(&t, 0, sizeof t);
    err.msg[0] = 0;
    if (kr_trace_parse(&t, (const char *)data, size, "trace", &err)) {
        KILN_ASSERT(err.msg[0] != 0);
        kr_trace_free(&t);
        return 0;
    }
    struct kr_report rep;
    kr_analyze(&t, &rules, &rep);
    double sum = 0;
    for (long i = 0; i < rep.n_kernels; i++) {
        KILN_ASSERT(rep.kernels[i].gpu_ns >= 0 && rep.kernels[i].count > 0);
        sum += rep.kernels[i].gpu_ns;
    }
    if (isfinite(rep.busy_ns) && isfinite(rep.span_ns) && rep.busy_ns < 1e15) {
        KILN_ASSERT(fabs(sum - rep.busy_ns) <= 1e-6 * (rep.busy_ns + 1));
        KILN_ASSERT(rep.busy_ns <= rep.span_ns * (1 + 1e-9) + 1e-6);
    }
    kr_report_free(&rep);
    kr_trace_free(&t);
    return 0;
}
