/* fuzz_safetensors.c — arbitrary bytes as a .safetensors file: st_parse must
 * either fail with a message or return tensors that lie inside the buffer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct st_tensor *t = NULL;
    int n = 0;
    struct kiln_error err;
    err.msg[0] = 0;
    if (st_parse(data, size, "fuzz.safetensors", 0, &t, &n, &err) != 0) {
        KILN_ASSERT(t == NULL && n == 0 && err.msg[0] != 0);
        return 0;
    }
    const unsigned char *end = data + size;
    for (int i = 0; i < n; i++) {
        KILN_ASSERT(t[i].name != NULL);
        KILN_ASSERT(t[i].ndim >= 0 && t[i].ndim <= ST_MAX_DIMS);
        KILN_ASSERT(t[i].nbytes == (size_t)t[i].numel * dtype_size(t[i].dtype));
        const unsigned char *p = t[i].data;
        KILN_ASSERT(p >= data + 8 && p <= end && t[i].nbytes <= (size_t)(end - p));
        /* touch the bytes so ASan checks the view */
        if (t[i].nbytes) {
            volatile unsigned char first = p[0], last = p[t[i].nbytes - 1];
            (void)first;
            (void)last;
        }
    }
    st_tensors_free(t, n);
    return 0;
}
