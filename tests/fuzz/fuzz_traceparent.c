/* fuzz_traceparent.c — arbitrary bytes as a W3C traceparent header value:
 * parsed or refused, and a parsed one names a non-zero trace and parent
 * that print back to the header's own digits. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "server/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *v = malloc(size + 1);
    if (!v) return 0;
    memcpy(v, data, size);
    v[size] = 0; /* a header value ends at its first NUL */
    struct trace_ctx c;
    if (trace_ctx_parse(&c, v) == 0) {
        KILN_ASSERT(c.has_parent);
        int tz = 1, pz = 1;
        for (int i = 0; i < 16; i++) tz &= c.trace_id[i] == 0;
        for (int i = 0; i < 8; i++) pz &= c.parent_id[i] == 0;
        KILN_ASSERT(!tz && !pz);
        char want[56];
        int o = 0;
        for (int i = 0; i < 16; i++) o += snprintf(want + o, sizeof want - (size_t)o, "%02x", c.trace_id[i]);
        o += snprintf(want + o, sizeof want - (size_t)o, "-");
        for (int i = 0; i < 8; i++) o += snprintf(want + o, sizeof want - (size_t)o, "%02x", c.parent_id[i]);
        const char *p = v;
        while (*p == ' ' || *p == '\t') p++;
        KILN_ASSERT(strncmp(p + 3, want, 49) == 0);
    }
    free(v);
    return 0;
}
