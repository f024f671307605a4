/* tok_json.h — reading tokenizer.json fields with errors that name them.
 *
 * Every helper takes the JSON path of the object it reads (for example
 * "pre_tokenizer.pretokenizers[1]") and reports a missing or mistyped field
 * as "tokenizer.json: <path>.<key>: expected ..." so a malformed file gives
 * a message a person can act on. A JSON null counts as absent, as serde's
 * Option does.
 */
#ifndef KILN_TOKENIZER_TOK_JSON_H
#define KILN_TOKENIZER_TOK_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct tok_regex;

/* The object's "type" string; error when it is not an object or has none. */
int tj_type(json_t *obj, const char *path, const char **type, struct kiln_error *err);
/* String field; `required` 0 leaves *out NULL when absent. */
int tj_string(json_t *obj, const char *path, const char *key, int required, const char **out, size_t *len,
              struct kiln_error *err);
int tj_bool(json_t *obj, const char *path, const char *key, int dflt, int *out, struct kiln_error *err);
int tj_uint(json_t *obj, const char *path, const char *key, int64_t dflt, int64_t max, int64_t *out,
            struct kiln_error *err);
/* Array field (required). */
int tj_array(json_t *obj, const char *path, const char *key, json_t **out, struct kiln_error *err);
/* A field holding exactly one Unicode character (Metaspace replacement,
 * Strip content). */
int tj_char(json_t *obj, const char *path, const char *key, uint32_t dflt, uint32_t *out, struct kiln_error *err);

/* Formats "path.key" or "path[i]" into a caller buffer. */
const char *tj_path(char *buf, size_t size, const char *path, const char *key);
const char *tj_path_index(char *buf, size_t size, const char *path, const char *key, size_t i);

#define TJ_PATH_MAX 256

#endif
