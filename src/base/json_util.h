/* json_util.h — small helpers around jansson shared by every parser of
 * outside input (config files, safetensors headers, HTTP bodies), so their
 * error messages describe JSON values the same way. */
#ifndef KILN_BASE_JSON_UTIL_H
#define KILN_BASE_JSON_UTIL_H

#include <jansson.h>

/* "object", "array", "string", "integer", "number", "boolean" or "null". */
const char *json_kind(const json_t *v);

#endif
