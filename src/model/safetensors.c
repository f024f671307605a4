#include "model/safetensors.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_util.h"
#include "base/mem.h"

/* A header this large is not a checkpoint header: it would be a million
 * tensors. The cap keeps a corrupt length from making us parse gigabytes. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

/* Byte counts beyond this cannot be a mapped tensor (and keep numel × size
 * clear of overflow in size_t and int64_t alike). */
#define ST_MAX_BYTES ((uint64_t)1 << 62)

#define ST_INDEX_NAME "model.safetensors.index.json"


/* "[a, b, c]" into buf; -1 entries (wildcards of st_expect) print as '*'. */
static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++) {
        if (shape[i] < 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s*", i ? ", " : "");
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    }
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

void st_tensors_free(struct st_tensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int parse_metadata(const json_t *meta, const char *file, struct kiln_error *err) {
    if (!json_is_object(meta))
        return kiln_errorf(err, "%s: '__metadata__' must be an object of strings, found %s", file,
                           json_kind(meta));
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v))
            return kiln_errorf(err, "%s: '__metadata__' entry '%s' must be a string, found %s",
                               file, k, json_kind(v));
    }
    return 0;
}

/* Reads one {dtype, shape, data_offsets} entry into *t (name set by caller).
 * `data_size` bounds the offsets; offsets are kept in t->data as an integer
 * until the caller turns them into pointers. */
static int parse_entry(const json_t *e, const char *file, const char *name, uint64_t data_size,
                       struct st_tensor *t, uint64_t *begin_out, struct kiln_error *err) {
    if (!json_is_object(e))
        return kiln_errorf(err, "%s: tensor '%s': entry must be an object, found %s", file, name,
                           json_kind(e));

    const json_t *jd = json_object_get(e, "dtype");
    if (!jd) return kiln_errorf(err, "%s: tensor '%s': 'dtype' is missing", file, name);
    if (!json_is_string(jd))
        return kiln_errorf(err, "%s: tensor '%s': 'dtype' must be a string, found %s", file, name,
                           json_kind(jd));
    int dt = dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return kiln_errorf(err, "%s: tensor '%s': unknown dtype '%.32s'", file, name,
                           json_string_value(jd));
    t->dtype = (enum dtype)dt;

    const json_t *js = json_object_get(e, "shape");
    if (!js) return kiln_errorf(err, "%s: tensor '%s': 'shape' is missing", file, name);
    if (!json_is_array(js))
        return kiln_errorf(err, "%s: tensor '%s': 'shape' must be an array, found %s", file, name,
                           json_kind(js));
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return kiln_errorf(err, "%s: tensor '%s': shape has %zu dimensions, at most %d supported",
                           file, name, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    int has_zero = 0;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return kiln_errorf(err, "%s: tensor '%s': shape[%zu] must be a non-negative integer",
                               file, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        if (t->shape[i] == 0) has_zero = 1;
    }
    /* Bytes = numel × size, checked against overflow step by step; a zero
     * dimension makes any product of the others harmless. */
    uint64_t numel = 1, esize = dtype_size(t->dtype);
    for (int i = 0; i < t->ndim && !has_zero; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (numel > ST_MAX_BYTES / esize / d) {
            char sb[200];
            shape_str(sb, sizeof sb, t->ndim, t->shape);
            return kiln_errorf(err, "%s: tensor '%s': shape %s is too large", file, name, sb);
        }
        numel *= d;
    }
    if (has_zero) numel = 0;
    t->numel = (int64_t)numel;
    uint64_t need = numel * esize;

    const json_t *jo = json_object_get(e, "data_offsets");
    if (!jo) return kiln_errorf(err, "%s: tensor '%s': 'data_offsets' is missing", file, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)) ||
        json_integer_value(json_array_get(jo, 0)) < 0 || json_integer_value(json_array_get(jo, 1)) < 0)
        return kiln_errorf(err,
                           "%s: tensor '%s': 'data_offsets' must be [begin, end] of non-negative "
                           "integers",
                           file, name);
    uint64_t b = (uint64_t)json_integer_value(json_array_get(jo, 0));
    uint64_t en = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (b > en)
        return kiln_errorf(err, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] end before they begin",
                           file, name, b, en);
    if (en > data_size)
        return kiln_errorf(err, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] reach beyond the data area of %" PRIu64 " bytes",
                           file, name, b, en, data_size);
    if (en - b != need) {
        char sb[200];
        shape_str(sb, sizeof sb, t->ndim, t->shape);
        return kiln_errorf(err, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] hold %" PRIu64 " bytes but shape %s of %s needs %" PRIu64,
                           file, name, b, en, en - b, sb, dtype_name(t->dtype), need);
    }
    t->nbytes = (size_t)need;
    *begin_out = b;
    return 0;
}

struct st_span {
    uint64_t begin, end;
    int idx;
};

static int span_cmp(const void *a, const void *b) {
    const struct st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

int st_parse(const unsigned char *data, size_t size, const char *file_name, int file_index,
             struct st_tensor **out, int *n_out, struct kiln_error *err) {
    *out = NULL;
    *n_out = 0;
    json_t *root = NULL;
    struct st_tensor *ts = NULL;
    struct st_span *spans = NULL;
    int n = 0;

    if (size < 8) {
        kiln_errorf(err, "%s: file is %zu bytes, too small for the 8-byte header length", file_name,
                    size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen > size - 8) {
        kiln_errorf(err, "%s: file is %zu bytes, header claims %" PRIu64 " bytes after the 8-byte length",
                    file_name, size, hlen);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        kiln_errorf(err, "%s: header length %" PRIu64 " exceeds the %u-byte limit", file_name,
                    hlen, ST_MAX_HEADER);
        goto fail;
    }
    uint64_t data_size = size - 8 - hlen;
    const unsigned char *base = data + 8 + hlen;

    json_error_t jerr;
    /* Duplicate keys would otherwise silently keep the last entry. */
    root = json_load_checkpoint((const char *)data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_duplicate_key)
            kiln_errorf(err, "%s: header line %d column %d: duplicate tensor name (%s)", file_name,
                        jerr.line, jerr.column, jerr.text);
        else
            kiln_errorf(err, "%s: header is not valid JSON (line %d column %d): %s", file_name,
                        jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        kiln_errorf(err, "%s: header must be a JSON object, found %s", file_name, json_kind(root));
        goto fail;
    }

    size_t cap = json_object_size(root);
    ts = xcalloc(cap ? cap : 1, sizeof *ts);
    spans = xcalloc(cap ? cap : 1, sizeof *spans);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (parse_metadata(val, file_name, err)) goto fail;
            continue;
        }
        struct st_tensor *t = &ts[n];
        uint64_t begin = 0;
        if (parse_entry(val, file_name, key, data_size, t, &begin, err)) goto fail;
        t->name = xstrdup(key);
        t->data = base + begin;
        t->file = file_index;
        spans[n].begin = begin;
        spans[n].end = begin + t->nbytes;
        spans[n].idx = n;
        n++;
    }

    /* Sorted by offset, each non-empty tensor must end before the next
     * begins; empty ones occupy nothing and may sit anywhere. */
    qsort(spans, (size_t)n, sizeof *spans, span_cmp);
    int prev = -1;
    for (int i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (prev >= 0 && spans[prev].end > spans[i].begin) {
            const struct st_span *a = &spans[prev], *b = &spans[i];
            kiln_errorf(err,
                        "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64
                        ", %" PRIu64 "] overlap in data_offsets",
                        file_name, ts[a->idx].name, a->begin, a->end, ts[b->idx].name, b->begin,
                        b->end);
            goto fail;
        }
        prev = i;
    }

    free(spans);
    json_decref(root);
    *out = ts;
    *n_out = n;
    return 0;

fail:
    free(spans);
    st_tensors_free(ts, n);
    json_decref(root);
    return -1;
}

/* ---- name lookup ---------------------------------------------------------- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Returns the slot holding `name`, or the empty slot where it would go. */
static int hash_slot(const struct st_set *s, const char *name) {
    unsigned mask = (unsigned)s->hash_cap - 1;
    unsigned i = (unsigned)name_hash(name) & mask;
    while (s->hash[i] >= 0 && strcmp(s->tensors[s->hash[i]].name, name)) i = (i + 1) & mask;
    return (int)i;
}

/* Builds the hash over s->tensors; fails on a duplicate name (two shards
 * holding the same tensor). */
static int set_index(struct st_set *s, struct kiln_error *err) {
    int cap = 16;
    while (cap < 2 * s->n_tensors) cap *= 2;
    s->hash_cap = cap;
    s->hash = xmalloc((size_t)cap * sizeof *s->hash);
    for (int i = 0; i < cap; i++) s->hash[i] = -1;
    for (int i = 0; i < s->n_tensors; i++) {
        int slot = hash_slot(s, s->tensors[i].name);
        if (s->hash[slot] >= 0) {
            const struct st_tensor *o = &s->tensors[s->hash[slot]];
            return kiln_errorf(err, "%s: tensor '%s' also appears in %s", s->paths[s->tensors[i].file],
                               s->tensors[i].name, s->paths[o->file]);
        }
        s->hash[slot] = i;
    }
    return 0;
}

const struct st_tensor *st_find(const struct st_set *s, const char *name) {
    if (!s->hash || s->hash_cap == 0) return NULL;
    int slot = hash_slot(s, name);
    return s->hash[slot] >= 0 ? &s->tensors[s->hash[slot]] : NULL;
}

int st_rename_prefix(struct st_set *s, const char *from, const char *to, struct kiln_error *err) {
    size_t nf = strlen(from), nt = strlen(to);
    int renamed = 0;
    for (int i = 0; i < s->n_tensors; i++) {
        char *name = s->tensors[i].name;
        if (strncmp(name, from, nf)) continue;
        size_t rest = strlen(name + nf);
        char *n = xmalloc(nt + rest + 1);
        memcpy(n, to, nt);
        memcpy(n + nt, name + nf, rest + 1);
        free(name);
        s->tensors[i].name = n;
        renamed = 1;
    }
    if (!renamed) return 0;
    free(s->hash);
    s->hash = NULL;
    s->hash_cap = 0;
    return set_index(s, err);
}

/* ---- opening -------------------------------------------------------------- */

void st_close(struct st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        if (s->maps) file_map_close(&s->maps[i]);
        if (s->paths) free(s->paths[i]);
    }
    free(s->maps);
    free(s->paths);
    st_tensors_free(s->tensors, s->n_tensors);
    free(s->hash);
    free(s->source);
    memset(s, 0, sizeof *s);
}

/* Maps `path` as file number s->n_files and appends its tensors. */
static int set_add_file(struct st_set *s, const char *path, struct kiln_error *err) {
    int fi = s->n_files;
    s->paths = xrealloc(s->paths, (size_t)(fi + 1) * sizeof *s->paths);
    s->maps = xrealloc(s->maps, (size_t)(fi + 1) * sizeof *s->maps);
    s->paths[fi] = xstrdup(path);
    s->maps[fi].data = NULL;
    s->maps[fi].size = 0;
    s->n_files = fi + 1;
    if (file_map_open(&s->maps[fi], path, err)) return -1;

    struct st_tensor *ts = NULL;
    int n = 0;
    if (st_parse(s->maps[fi].data, s->maps[fi].size, path, fi, &ts, &n, err)) return -1;
    s->tensors = xrealloc(s->tensors, (size_t)(s->n_tensors + n) * sizeof *s->tensors);
    memcpy(s->tensors + s->n_tensors, ts, (size_t)n * sizeof *ts);
    s->n_tensors += n;
    free(ts); /* names now owned by s->tensors */
    return 0;
}

int st_open_file(struct st_set *s, const char *path, struct kiln_error *err) {
    memset(s, 0, sizeof *s);
    s->source = xstrdup(path);
    if (set_add_file(s, path, err) || set_index(s, err)) goto fail;
    return 0;
fail:
    st_close(s);
    return -1;
}

/* Shard names come from a file we do not trust: they must stay inside the
 * checkpoint folder. */
static int shard_name_ok(const char *name) {
    if (!*name || name[0] == '/') return 0;
    for (const char *p = name; *p;) {
        const char *q = strchr(p, '/');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 0 || (len == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += len + (q ? 1 : 0);
    }
    return 1;
}

static int open_index(struct st_set *s, const char *dir, const char *index_path,
                      struct kiln_error *err) {
    char *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    const char **shards = NULL;
    char *shard_path = NULL;
    int n_shards = 0;

    if (file_read_all(index_path, &text, &len, err)) goto fail;
    json_error_t jerr;
    root = json_load_checkpoint(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        kiln_errorf(err, "%s: line %d column %d: %s", index_path, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        kiln_errorf(err, "%s: 'weight_map' must be an object of {tensor: shard file}", index_path);
        goto fail;
    }
    if (json_object_size(wm) == 0) {
        kiln_errorf(err, "%s: 'weight_map' is empty", index_path);
        goto fail;
    }

    /* Distinct shard names, in first-seen order; each is mapped once. */
    shards = xcalloc(json_object_size(wm), sizeof *shards);
    const char *tname;
    json_t *v;
    json_object_foreach((json_t *)wm, tname, v) {
        if (!json_is_string(v)) {
            kiln_errorf(err, "%s: weight_map['%s'] must be a file name, found %s", index_path,
                        tname, json_kind(v));
            goto fail;
        }
        const char *sh = json_string_value(v);
        if (!shard_name_ok(sh)) {
            kiln_errorf(err, "%s: weight_map['%s'] names '%s', which is not a file inside %s",
                        index_path, tname, sh, dir);
            goto fail;
        }
        int seen = 0;
        for (int i = 0; i < n_shards && !seen; i++) seen = !strcmp(shards[i], sh);
        if (!seen) shards[n_shards++] = sh;
    }
    for (int i = 0; i < n_shards; i++) {
        shard_path = path_join(dir, shards[i]);
        if (set_add_file(s, shard_path, err)) goto fail;
        free(shard_path);
        shard_path = NULL;
    }
    if (set_index(s, err)) goto fail;

    json_object_foreach((json_t *)wm, tname, v) {
        const struct st_tensor *t = st_find(s, tname);
        const char *sh = json_string_value(v);
        if (!t) {
            kiln_errorf(err, "%s: tensor '%s' is listed for %s but that shard does not hold it",
                        index_path, tname, sh);
            goto fail;
        }
        const char *p = s->paths[t->file];
        size_t pl = strlen(p), sl = strlen(sh);
        if (pl < sl || strcmp(p + pl - sl, sh) != 0 || (pl > sl && p[pl - sl - 1] != '/')) {
            kiln_errorf(err, "%s: tensor '%s' is listed for %s but found in %s", index_path, tname,
                        sh, p);
            goto fail;
        }
    }

    free(shards);
    json_decref(root);
    free(text);
    return 0;
fail:
    free(shard_path);
    free(shards);
    json_decref(root);
    free(text);
    return -1;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int st_open_dir(struct st_set *s, const char *dir, struct kiln_error *err) {
    memset(s, 0, sizeof *s);
    s->source = xstrdup(dir);
    char *path = path_join(dir, ST_INDEX_NAME);
    if (file_exists(path)) {
        if (open_index(s, dir, path, err)) goto fail;
        free(path);
        return 0;
    }
    free(path);
    path = path_join(dir, "model.safetensors");
    if (!file_exists(path)) {
        free(path);
        path = NULL;
        DIR *d = opendir(dir);
        if (!d) {
            kiln_errorf(err, "%s: cannot open checkpoint folder", dir);
            goto fail;
        }
        int count = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors")) continue;
            if (++count == 1) path = path_join(dir, de->d_name);
        }
        closedir(d);
        if (count != 1) {
            kiln_errorf(err,
                        "%s: no %s or model.safetensors, and %d other *.safetensors files "
                        "(need exactly one)",
                        dir, ST_INDEX_NAME, count);
            goto fail;
        }
    }
    if (set_add_file(s, path, err) || set_index(s, err)) goto fail;
    free(path);
    return 0;
fail:
    free(path);
    st_close(s);
    return -1;
}

int st_expect(const struct st_set *s, const char *name, int ndim, const int64_t *shape,
              const struct st_tensor **out, struct kiln_error *err) {
    if (out) *out = NULL;
    const struct st_tensor *t = st_find(s, name);
    if (!t)
        return kiln_errorf(err, "%s: tensor '%s' is missing", s->source ? s->source : "checkpoint",
                           name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (!ok) {
        char want[200], got[200];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        return kiln_errorf(err, "%s: tensor '%s': expected shape %s, found %s", s->paths[t->file],
                           name, want, got);
    }
    if (out) *out = t;
    return 0;
}
