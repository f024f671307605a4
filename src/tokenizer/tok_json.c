#include "tokenizer/tok_json.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tok_util.h"

const char *tj_path(char *buf, size_t size, const char *path, const char *key) {
    snprintf(buf, size, "%s%s%s", path, *path ? "." : "", key);
    return buf;
}

const char *tj_path_index(char *buf, size_t size, const char *path, const char *key, size_t i) {
    snprintf(buf, size, "%s%s%s[%zu]", path, *path && *key ? "." : "", key, i);
    return buf;
}

int tj_type(json_t *obj, const char *path, const char **type, struct kiln_error *err) {
    if (!json_is_object(obj)) return kiln_errorf(err, "tokenizer.json: %s: expected an object", path);
    json_t *t = json_object_get(obj, "type");
    if (!json_is_string(t)) return kiln_errorf(err, "tokenizer.json: %s.type: expected a string", path);
    *type = json_string_value(t);
    return 0;
}

int tj_string(json_t *obj, const char *path, const char *key, int required, const char **out, size_t *len,
              struct kiln_error *err) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v || json_is_null(v)) {
        if (required) return kiln_errorf(err, "tokenizer.json: %s%s%s: missing (expected a string)", path, *path ? "." : "", key);
        return 0;
    }
    if (!json_is_string(v)) return kiln_errorf(err, "tokenizer.json: %s%s%s: expected a string", path, *path ? "." : "", key);
    *out = json_string_value(v);
    size_t n = json_string_length(v);
    /* Tokens are compared as byte strings; an embedded NUL from "\u0000" is
     * fine, invalid UTF-8 is impossible (jansson rejects it). */
    if (len) *len = n;
    return 0;
}

int tj_bool(json_t *obj, const char *path, const char *key, int dflt, int *out, struct kiln_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return kiln_errorf(err, "tokenizer.json: %s%s%s: expected true or false", path, *path ? "." : "", key);
    *out = json_is_true(v);
    return 0;
}

int tj_uint(json_t *obj, const char *path, const char *key, int64_t dflt, int64_t max, int64_t *out,
            struct kiln_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0) return kiln_errorf(err, "tokenizer.json: %s%s%s: missing (expected an integer)", path, *path ? "." : "", key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return kiln_errorf(err, "tokenizer.json: %s%s%s: expected an integer in [0, %lld]", path, *path ? "." : "", key,
                           (long long)max);
    *out = json_integer_value(v);
    return 0;
}

int tj_array(json_t *obj, const char *path, const char *key, json_t **out, struct kiln_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_array(v)) return kiln_errorf(err, "tokenizer.json: %s%s%s: expected an array", path, *path ? "." : "", key);
    *out = v;
    return 0;
}

int tj_char(json_t *obj, const char *path, const char *key, uint32_t dflt, uint32_t *out, struct kiln_error *err) {
    const char *s;
    size_t n;
    if (tj_string(obj, path, key, dflt == 0, &s, &n, err)) return -1;
    if (!s) {
        *out = dflt;
        return 0;
    }
    if (n == 0 || utf8_seq_len((unsigned char)s[0]) != n || utf8_validate(s, n) != n)
        return kiln_errorf(err, "tokenizer.json: %s%s%s: expected exactly one character", path, *path ? "." : "", key);
    utf8_decode(s, out);
    return 0;
}
