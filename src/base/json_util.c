#include "base/json_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"

const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "value";
}

/* An integer literal (optional '-', digits only) that int64 cannot hold. */
static int int_overflows(const char *s, size_t n) {
    size_t digits = n - (s[0] == '-');
    if (digits < 19) return 0;
    if (digits > 20) return 1;
    char buf[24];
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    (void)strtoll(buf, NULL, 10);
    return errno == ERANGE;
}

/* Copies text into out with ".0" after every integer literal outside int64,
 * outside strings; *at receives the offsets in the copy where each ".0" went. */
static void mark_big_ints(const char *text, size_t len, struct buf *out, size_t **at, size_t *n_at) {
    size_t cap_at = 8;
    buf_reserve(out, len + 64);
    *at = xmalloc(cap_at * sizeof **at);
    *n_at = 0;
    int in_str = 0;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (in_str || c == '"' || !(c == '-' || (c >= '0' && c <= '9'))) {
            if (in_str && c == '\\' && i + 1 < len) { /* the escaped char cannot end the string */
                buf_push(out, text[i++]);
            } else if (c == '"') {
                in_str = !in_str;
            }
            buf_push(out, text[i++]);
            continue;
        }
        size_t j = i + 1;
        int is_int = 1;
        while (j < len && ((text[j] >= '0' && text[j] <= '9') || strchr("+-.eE", text[j]))) {
            if (strchr(".eE", text[j])) is_int = 0;
            j++;
        }
        buf_append(out, text + i, j - i);
        if (is_int && j - i > 1 && int_overflows(text + i, j - i)) {
            if (*n_at == cap_at) *at = xrealloc(*at, (cap_at *= 2) * sizeof **at);
            (*at)[(*n_at)++] = out->len;
            buf_append(out, ".0", 2);
        }
        i = j;
    }
}

json_t *json_load_checkpoint(const char *text, size_t len, size_t flags, json_error_t *je) {
    json_t *root = json_loadb(text, len, flags, je);
    if (root || json_error_code(je) != json_error_numeric_overflow) return root;
    struct buf marked = {0};
    size_t *at, n_at;
    mark_big_ints(text, len, &marked, &at, &n_at);
    const char *copy = marked.data;
    root = json_loadb(copy, marked.len, flags, je);
    if (!root && je->position >= 0) { /* point into the text as given */
        size_t pos = (size_t)je->position, before = 0, same_line = 0;
        const char *nl = memrchr(copy, '\n', pos);
        size_t line_start = nl ? (size_t)(nl - copy) + 1 : 0;
        for (size_t k = 0; k < n_at && at[k] < pos; k++) {
            before++;
            same_line += at[k] >= line_start;
        }
        je->position -= (int)(2 * before);
        je->column -= (int)(2 * same_line);
    }
    buf_free(&marked);
    free(at);
    return root;
}

json_t *json_load_checkpoint_file(const char *path, size_t flags, json_error_t *je) {
    char *text;
    size_t len;
    struct kiln_error err;
    if (file_read_all(path, &text, &len, &err)) {
        memset(je, 0, sizeof *je);
        je->line = je->column = je->position = -1;
        size_t n = strlen(path) < sizeof je->source - 1 ? strlen(path) : sizeof je->source - 1;
        memcpy(je->source, path, n); /* jansson's source field is short: cut, as it does */
        n = strlen(err.msg) < sizeof je->text - 1 ? strlen(err.msg) : sizeof je->text - 1;
        memcpy(je->text, err.msg, n);
        return NULL;
    }
    json_t *root = json_load_checkpoint(text, len, flags, je);
    free(text);
    return root;
}
