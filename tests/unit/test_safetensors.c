/* test_safetensors.c — every fixture checkpoint loads; a sharded copy gives
 * the same tensors; broken files give errors naming the file and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/mem.h"
#include "test_tmp.h"
#include "model/safetensors.h"

static const char *const archs[] = {"llama",     "qwen2",       "qwen3",      "qwen2_moe",
                                    "qwen3_moe", "deepseek_v2", "deepseek_v3"};
static const int arch_counts[] = {30, 38, 35, 117, 102, 83, 139};

static char *fixture(const char *rel) {
    const char *root = getenv("KILN_FIXTURES");
    assert_non_null(root);
    char *p = xmalloc(strlen(root) + strlen(rel) + 2);
    sprintf(p, "%s/%s", root, rel);
    return p;
}

static char *models_path(const char *rel) {
    const char *root = getenv("KILN_MODELS");
    assert_non_null(root);
    char *p = xmalloc(strlen(root) + strlen(rel) + 2);
    sprintf(p, "%s/%s", root, rel);
    return p;
}

#define assert_contains(hay, needle)                                                        \
    do {                                                                                    \
        if (!strstr((hay), (needle)))                                                       \
            fail_msg("message \"%s\" does not contain \"%s\"", (hay), (needle));            \
    } while (0)

static void expect_shape(const struct st_set *s, const char *name, enum dtype dt, int ndim,
                         int64_t d0, int64_t d1) {
    const struct st_tensor *t = st_find(s, name);
    if (!t) fail_msg("tensor %s missing", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    assert_int_equal(t->shape[0], d0);
    if (ndim > 1) assert_int_equal(t->shape[1], d1);
    assert_int_equal(t->nbytes, (size_t)t->numel * dtype_size(dt));
}

static void test_fixture_checkpoints(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "oracle/tiny-models/%s", archs[i]);
        char *dir = fixture(rel);
        struct st_set s;
        struct kiln_error err = {0};
        if (st_open_dir(&s, dir, &err)) fail_msg("%s: %s", archs[i], err.msg);
        assert_int_equal(s.n_files, 1);
        assert_int_equal(s.n_tensors, arch_counts[i]);
        for (int k = 0; k < s.n_tensors; k++) {
            assert_int_equal(s.tensors[k].dtype, DTYPE_BF16);
            assert_ptr_equal(st_find(&s, s.tensors[k].name), &s.tensors[k]);
            /* views stay inside the mapping */
            const unsigned char *p = s.tensors[k].data;
            assert_true(p >= s.maps[0].data && p + s.tensors[k].nbytes <= s.maps[0].data + s.maps[0].size);
        }
        expect_shape(&s, "model.embed_tokens.weight", DTYPE_BF16, 2, 1024, 64);
        assert_null(st_find(&s, "model.nope"));
        st_close(&s);

        snprintf(rel, sizeof rel, "oracle/tiny-models/%s/reference.safetensors", archs[i]);
        char *ref = fixture(rel);
        if (st_open_file(&s, ref, &err)) fail_msg("%s: %s", ref, err.msg);
        assert_int_equal(s.n_tensors, 8);
        expect_shape(&s, "p0.ids", DTYPE_I32, 1, 20, 0);
        expect_shape(&s, "p0.logits", DTYPE_F32, 2, 20, 1024);
        st_close(&s);
        free(ref);
        free(dir);
    }

    struct st_set s;
    struct kiln_error err = {0};
    char *d = fixture("oracle/tiny-models/deepseek_v3");
    assert_int_equal(st_open_dir(&s, d, &err), 0);
    expect_shape(&s, "model.layers.1.self_attn.q_a_proj.weight", DTYPE_BF16, 2, 48, 64);
    expect_shape(&s, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", DTYPE_BF16, 2, 40, 64);
    expect_shape(&s, "model.layers.1.mlp.gate.e_score_correction_bias", DTYPE_BF16, 1, 16, 0);
    st_close(&s);
    free(d);
    d = fixture("oracle/tiny-models/qwen2_moe");
    assert_int_equal(st_open_dir(&s, d, &err), 0);
    expect_shape(&s, "model.layers.0.mlp.experts.7.down_proj.weight", DTYPE_BF16, 2, 64, 32);
    expect_shape(&s, "model.layers.0.mlp.shared_expert_gate.weight", DTYPE_BF16, 2, 1, 64);
    st_close(&s);
    free(d);
    d = fixture("oracle/tiny-models/qwen3");
    assert_int_equal(st_open_dir(&s, d, &err), 0);
    expect_shape(&s, "model.layers.0.self_attn.q_proj.weight", DTYPE_BF16, 2, 128, 64);
    expect_shape(&s, "model.layers.0.self_attn.k_norm.weight", DTYPE_BF16, 1, 32, 0);
    assert_null(st_find(&s, "lm_head.weight")); /* tied */
    st_close(&s);
    free(d);

    d = models_path("stories260K");
    assert_int_equal(st_open_dir(&s, d, &err), 0);
    assert_int_equal(s.n_tensors, 47);
    expect_shape(&s, "model.embed_tokens.weight", DTYPE_F32, 2, 512, 64);
    expect_shape(&s, "model.layers.0.mlp.down_proj.weight", DTYPE_F32, 2, 64, 172);
    st_close(&s);
    free(d);
}

/* st_rename_prefix: a multimodal checkpoint's language model under its
 * prefix is found by the text model's names; names that meet fail. */
static void test_rename_prefix(void **state) {
    (void)state;
    char *dir = fixture("oracle/tiny-models-more/gemma3");
    struct st_set s;
    struct kiln_error err = {0};
    if (st_open_dir(&s, dir, &err)) fail_msg("%s", err.msg);
    int n = s.n_tensors;
    if (st_rename_prefix(&s, "model.", "model.language_model.", &err)) fail_msg("%s", err.msg);
    assert_null(st_find(&s, "model.embed_tokens.weight"));
    expect_shape(&s, "model.language_model.embed_tokens.weight", DTYPE_BF16, 2, 1024, 64);
    if (st_rename_prefix(&s, "model.language_model.", "model.", &err)) fail_msg("%s", err.msg);
    expect_shape(&s, "model.embed_tokens.weight", DTYPE_BF16, 2, 1024, 64);
    assert_int_equal(s.n_tensors, n);
    for (int k = 0; k < s.n_tensors; k++) assert_ptr_equal(st_find(&s, s.tensors[k].name), &s.tensors[k]);
    /* nothing under the prefix: unchanged */
    assert_int_equal(st_rename_prefix(&s, "language_model.", "", &err), 0);
    /* two names meet */
    assert_int_equal(st_rename_prefix(&s, "model.layers.0.", "model.layers.1.", &err), -1);
    st_close(&s);
    free(dir);
}

static void test_expect(void **state) {
    (void)state;
    char *d = fixture("oracle/tiny-models/llama");
    struct st_set s;
    struct kiln_error err = {0};
    assert_int_equal(st_open_dir(&s, d, &err), 0);
    const struct st_tensor *t = NULL;
    int64_t ok[2] = {32, 64}, any[2] = {-1, 64}, bad[2] = {64, 64};
    assert_int_equal(st_expect(&s, "model.layers.0.self_attn.k_proj.weight", 2, ok, &t, &err), 0);
    assert_non_null(t);
    assert_int_equal(st_expect(&s, "model.layers.0.self_attn.k_proj.weight", 2, any, &t, &err), 0);
    assert_int_equal(st_expect(&s, "model.layers.0.self_attn.k_proj.weight", 2, bad, &t, &err), -1);
    assert_null(t);
    assert_contains(err.msg, "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': "
                             "expected shape [64, 64], found [32, 64]");
    assert_int_equal(st_expect(&s, "model.layers.0.self_attn.k_proj.weight", 1, bad, &t, &err), -1);
    assert_contains(err.msg, "expected shape [64], found [32, 64]");
    assert_int_equal(st_expect(&s, "model.layers.9.self_attn.k_proj.weight", 2, ok, &t, &err), -1);
    assert_contains(err.msg, "tiny-models/llama: tensor 'model.layers.9.self_attn.k_proj.weight' is missing");
    st_close(&s);
    st_close(&s); /* twice is harmless */
    free(d);
}

/* ---- files built in the test ------------------------------------------------ */

struct buf {
    unsigned char *p;
    size_t n;
};

/* 8-byte length + header text + data_len bytes of a counting pattern. */
static struct buf make_st(const char *header, size_t data_len) {
    size_t h = strlen(header);
    struct buf b = {xcalloc(8 + h + data_len + 1, 1), 8 + h + data_len};
    for (int i = 0; i < 8; i++) b.p[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b.p + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b.p[8 + h + i] = (unsigned char)i;
    return b;
}

static void expect_parse_error(const struct buf *b, const char *want1, const char *want2) {
    struct st_tensor *t = NULL;
    int n = -1;
    struct kiln_error err = {0};
    int rc = st_parse(b->p, b->n, "broken.safetensors", 0, &t, &n, &err);
    if (rc == 0) fail_msg("parse succeeded, expected an error with \"%s\"", want1);
    assert_null(t);
    assert_int_equal(n, 0);
    assert_contains(err.msg, "broken.safetensors");
    assert_contains(err.msg, want1);
    if (want2) assert_contains(err.msg, want2);
}

static void expect_header_error(const char *header, size_t data_len, const char *want1,
                                const char *want2) {
    struct buf b = make_st(header, data_len);
    expect_parse_error(&b, want1, want2);
    free(b.p);
}

static void test_parse_ok(void **state) {
    (void)state;
    struct buf b = make_st("{\"__metadata__\":{\"format\":\"pt\"},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                           "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                           "\"empty\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[8,8]},"
                           "\"scalar\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[16,17]}}   ",
                           17);
    struct st_tensor *t = NULL;
    int n = 0;
    struct kiln_error err = {0};
    if (st_parse(b.p, b.n, "ok.safetensors", 3, &t, &n, &err)) fail_msg("%s", err.msg);
    assert_int_equal(n, 4);
    size_t hl = b.n - 8 - 17;
    for (int i = 0; i < n; i++) {
        assert_int_equal(t[i].file, 3);
        if (!strcmp(t[i].name, "b")) {
            assert_int_equal(t[i].dtype, DTYPE_F32);
            assert_ptr_equal(t[i].data, b.p + 8 + hl + 8);
            assert_int_equal(t[i].nbytes, 8);
        } else if (!strcmp(t[i].name, "empty")) {
            assert_int_equal(t[i].numel, 0);
            assert_int_equal(t[i].nbytes, 0);
        } else if (!strcmp(t[i].name, "scalar")) {
            assert_int_equal(t[i].ndim, 0);
            assert_int_equal(t[i].numel, 1);
        }
    }
    st_tensors_free(t, n);
    free(b.p);

    b = make_st("{}", 0);
    assert_int_equal(st_parse(b.p, b.n, "empty.safetensors", 0, &t, &n, &err), 0);
    assert_int_equal(n, 0);
    st_tensors_free(t, n);
    free(b.p);
}

static void test_parse_errors(void **state) {
    (void)state;
    /* too short / header length beyond the file */
    struct buf b = {(unsigned char *)"\x10\0\0", 3};
    expect_parse_error(&b, "file is 3 bytes", "8-byte header length");
    b = make_st("{}", 0);
    b.p[0] = 0x88;
    b.p[1] = 0x13; /* 5000 */
    expect_parse_error(&b, "file is 10 bytes, header claims 5000", NULL);
    memset(b.p, 0xff, 8);
    expect_parse_error(&b, "file is 10 bytes, header claims 18446744073709551615", NULL);
    free(b.p);

    expect_header_error("{\"a\": {\"dtype\": \"F32\"", 0, "not valid JSON", "line 1");
    expect_header_error("[1, 2]", 0, "header must be a JSON object, found array", NULL);
    expect_header_error("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'a'", "unknown dtype 'F33'");
    expect_header_error("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'a'", "'dtype' must be a string, found integer");
    expect_header_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a'",
                        "'dtype' is missing");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'a'",
                        "'shape' is missing");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a'",
                        "'data_offsets' is missing");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'a'", "shape[0] must be a non-negative integer");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                        "\"data_offsets\":[0,4]}}",
                        4, "tensor 'a'", "9 dimensions");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                        "\"data_offsets\":[0,4]}}",
                        4, "tensor 'a'", "too large");
    /* shape/bytes mismatch */
    expect_header_error("{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,8],"
                        "\"data_offsets\":[0,100]}}",
                        100,
                        "broken.safetensors: tensor 'model.layers.0.mlp.up_proj.weight': "
                        "data_offsets [0, 100] hold 100 bytes but shape [8, 8] of BF16 needs 128",
                        NULL);
    /* offsets beyond the data / reversed / malformed */
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]}}", 12,
                        "tensor 'a'", "data_offsets [4, 20] reach beyond the data area of 12 bytes");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 12,
                        "tensor 'a'", "end before they begin");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 12,
                        "tensor 'a'", "'data_offsets' must be [begin, end]");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 12,
                        "tensor 'a'", "'data_offsets' must be [begin, end]");
    /* overlapping */
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        12, "tensors 'a' [0, 8] and 'b' [4, 12] overlap", "data_offsets");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                        12, "overlap", NULL);
    /* duplicate names */
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, "duplicate tensor name", "\"a\"");
    /* metadata */
    expect_header_error("{\"__metadata__\":{\"format\":1}}", 0, "'__metadata__' entry 'format'",
                        "must be a string");
    expect_header_error("{\"__metadata__\":[]}", 0, "'__metadata__' must be an object", NULL);
    expect_header_error("{\"a\":[1]}", 0, "tensor 'a'", "entry must be an object");
}

/* ---- on disk: files, folders, shards ---------------------------------------- */

static char *tmp_dir(void) { return test_tmp_dir("st"); }

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void rm_rf(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_open_errors(void **state) {
    (void)state;
    char *dir = tmp_dir();
    char *p = path_join(dir, "model.safetensors");
    struct st_set s;
    struct kiln_error err = {0};

    /* a fixture cut short: the header claims more than the file holds */
    char *src = fixture("oracle/tiny-models/llama/model.safetensors");
    struct file_map m;
    assert_int_equal(file_map_open(&m, src, &err), 0);
    write_file(p, m.data, 1000);
    assert_int_equal(st_open_file(&s, p, &err), -1);
    assert_contains(err.msg, "model.safetensors: file is 1000 bytes, header claims");
    /* header fits, data does not: the last tensors reach beyond the data */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | m.data[i];
    write_file(p, m.data, 8 + hl + 100);
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "model.safetensors: tensor '");
    assert_contains(err.msg, "reach beyond the data area of 100 bytes");
    write_file(p, m.data, 4);
    assert_int_equal(st_open_file(&s, p, &err), -1);
    assert_contains(err.msg, "model.safetensors: file is 4 bytes");
    file_map_close(&m);
    free(src);

    assert_int_equal(st_open_file(&s, "/nonexistent/x.safetensors", &err), -1);
    assert_contains(err.msg, "/nonexistent/x.safetensors");
    unlink(p);
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "need exactly one");
    /* folder with one other-named file: that one is used */
    struct buf b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    char *q = path_join(dir, "weights.safetensors");
    write_file(q, b.p, b.n);
    assert_int_equal(st_open_dir(&s, dir, &err), 0);
    assert_int_equal(s.n_tensors, 1);
    assert_non_null(st_find(&s, "w"));
    st_close(&s);
    free(b.p);
    free(q);
    free(p);
    rm_rf(dir);
    free(dir);
}

/* Writes tensors [lo, hi) of `s` (in offset order) as one shard file. */
static void write_shard(const struct st_set *s, int *order, int lo, int hi, const char *path,
                        const char *extra_name) {
    json_t *h = json_object();
    size_t off = 0;
    for (int i = lo; i < hi; i++) {
        const struct st_tensor *t = &s->tensors[order[i]];
        json_t *e = json_object(), *shape = json_array();
        json_object_set_new(e, "dtype", json_string(dtype_name(t->dtype)));
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[I, I]", (json_int_t)off,
                                                         (json_int_t)(off + t->nbytes)));
        json_object_set_new(h, t->name, e);
        off += t->nbytes;
    }
    /* `extra_name` gets a tensor of its own after the others (a tensor that
     * another shard holds too). */
    const struct st_tensor *x = extra_name ? st_find(s, extra_name) : NULL;
    if (x)
        json_object_set_new(h, extra_name,
                            json_pack("{s:s, s:[I], s:[I, I]}", "dtype", dtype_name(x->dtype),
                                      "shape", (json_int_t)x->numel, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + x->nbytes)));
    size_t total = off + (x ? x->nbytes : 0);
    char *text = json_dumps(h, JSON_COMPACT);
    size_t hl = strlen(text);
    unsigned char *b = xcalloc(8 + hl + total, 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, text, hl);
    off = 0;
    for (int i = lo; i < hi; i++) {
        const struct st_tensor *t = &s->tensors[order[i]];
        memcpy(b + 8 + hl + off, t->data, t->nbytes);
        off += t->nbytes;
    }
    if (x) memcpy(b + 8 + hl + off, x->data, x->nbytes);
    write_file(path, b, 8 + hl + total);
    free(b);
    free(text);
    json_decref(h);
}

static void write_index(const struct st_set *s, int *order, int split, const char *dir,
                        const char *ghost, const char *second_shard) {
    json_t *wm = json_object();
    for (int i = 0; i < s->n_tensors; i++)
        json_object_set_new(wm, s->tensors[order[i]].name,
                            json_string(i < split ? "model-00001-of-00002.safetensors"
                                                  : second_shard));
    if (ghost) json_object_set_new(wm, ghost, json_string("model-00001-of-00002.safetensors"));
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)0,
                             "weight_map", wm);
    char *p = path_join(dir, "model.safetensors.index.json");
    assert_int_equal(json_dump_file(root, p, JSON_INDENT(2)), 0);
    free(p);
    json_decref(root);
}

static void test_sharded(void **state) {
    (void)state;
    char *src = fixture("oracle/tiny-models/qwen2_moe");
    struct st_set orig, s;
    struct kiln_error err = {0};
    assert_int_equal(st_open_dir(&orig, src, &err), 0);
    int n = orig.n_tensors, split = n / 2;
    int *order = xmalloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;

    char *dir = tmp_dir();
    char *s1 = path_join(dir, "model-00001-of-00002.safetensors");
    char *s2 = path_join(dir, "model-00002-of-00002.safetensors");
    write_shard(&orig, order, 0, split, s1, NULL);
    write_shard(&orig, order, split, n, s2, NULL);
    write_index(&orig, order, split, dir, NULL, "model-00002-of-00002.safetensors");

    if (st_open_dir(&s, dir, &err)) fail_msg("%s", err.msg);
    assert_int_equal(s.n_files, 2);
    assert_int_equal(s.n_tensors, n);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *a = &orig.tensors[i], *b = st_find(&s, a->name);
        if (!b) fail_msg("%s missing from the shards", a->name);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->ndim, b->ndim);
        assert_memory_equal(a->shape, b->shape, sizeof a->shape);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
        assert_int_equal(b->file, i < split ? 0 : 1);
    }
    st_close(&s);

    /* the index names a tensor its shard does not hold */
    write_index(&orig, order, split, dir, "model.layers.9.ghost.weight",
                "model-00002-of-00002.safetensors");
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "model.safetensors.index.json: tensor 'model.layers.9.ghost.weight'");
    assert_contains(err.msg, "model-00001-of-00002.safetensors");

    /* a shard the index names is not there */
    write_index(&orig, order, split, dir, NULL, "model-00003-of-00002.safetensors");
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "model-00003-of-00002.safetensors: cannot open");

    /* a shard outside the folder */
    write_index(&orig, order, split, dir, NULL, "../model-00002-of-00002.safetensors");
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "is not a file inside");

    /* the same tensor in both shards */
    write_shard(&orig, order, split, n, s2, orig.tensors[order[0]].name);
    write_index(&orig, order, split, dir, NULL, "model-00002-of-00002.safetensors");
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, orig.tensors[order[0]].name);
    assert_contains(err.msg, "also appears in");
    assert_contains(err.msg, "model-00001-of-00002.safetensors");

    /* a broken index */
    char *ix = path_join(dir, "model.safetensors.index.json");
    write_file(ix, "{\"weight_map\": [", 16);
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "model.safetensors.index.json: line 1");
    write_file(ix, "{\"weight_map\": {\"a\": 3}}", 24);
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "weight_map['a'] must be a file name, found integer");
    write_file(ix, "{\"metadata\": {}}", 16);
    assert_int_equal(st_open_dir(&s, dir, &err), -1);
    assert_contains(err.msg, "'weight_map' must be an object");

    free(ix);
    st_close(&orig);
    free(order);
    free(s1);
    free(s2);
    rm_rf(dir);
    free(dir);
    free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_checkpoints), cmocka_unit_test(test_expect),
        cmocka_unit_test(test_rename_prefix),
        cmocka_unit_test(test_parse_ok),           cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_open_errors),        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
