/* json_util.h — small helpers around jansson shared by every parser of
 * outside input (config files, safetensors headers, HTTP bodies), so their
 * error messages describe JSON values the same way, and the one loader of
 * JSON that comes from a checkpoint.
 *
 * Checkpoint files are written by Python, whose integers have no bound:
 * transformers saves `int(1e30)` as tokenizer_config.json's
 * "model_max_length": 1000000000000000019884624838656 (Llama-2, Llama-3,
 * gpt-oss). jansson refuses an integer beyond int64 ("too big integer");
 * json_load_checkpoint reads such an integer as a real instead, the value
 * Python's float() of it would give, and is json_loadb in every other way. */
#ifndef KILN_BASE_JSON_UTIL_H
#define KILN_BASE_JSON_UTIL_H

#include <stddef.h>

#include <jansson.h>

/* "object", "array", "string", "integer", "number", "boolean" or "null". */
const char *json_kind(const json_t *v);

/* json_loadb(text, len, flags, je), but integers outside int64 become reals.
 * On an error, je's line, column and position refer to `text` as given. */
json_t *json_load_checkpoint(const char *text, size_t len, size_t flags, json_error_t *je);
/* The same for a whole file; when the file cannot be read, je->text says
 * why, naming the file, and line, column and position are -1. */
json_t *json_load_checkpoint_file(const char *path, size_t flags, json_error_t *je);

#endif
