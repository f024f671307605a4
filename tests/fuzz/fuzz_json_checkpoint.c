/* fuzz_json_checkpoint.c — json_load_checkpoint against jansson itself: on
 * text jansson reads, the same value; on text jansson refuses for any reason
 * but a number out of range, the same error at the same place; otherwise a
 * value or an error whose position lies inside the text. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "base/json_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t ja, jb;
    const char *text = (const char *)data;
    json_t *a = json_loadb(text, size, JSON_DECODE_ANY, &ja);
    json_t *b = json_load_checkpoint(text, size, JSON_DECODE_ANY, &jb);
    if (a) {
        KILN_ASSERT(b && json_equal(a, b));
    } else if (json_error_code(&ja) != json_error_numeric_overflow) {
        KILN_ASSERT(!b);
        KILN_ASSERT(ja.line == jb.line && ja.column == jb.column && ja.position == jb.position);
        KILN_ASSERT(!strcmp(ja.text, jb.text));
    } else if (!b) {
        KILN_ASSERT(jb.position >= 0 && (size_t)jb.position <= size);
    }
    json_decref(a);
    json_decref(b);
    return 0;
}
