/* ckpt_writer.h — small safetensors checkpoints written by the loader tests
 * (test_fp8_load.c, test_gpt_oss_load.c): tensors added with their bytes,
 * edited in place, dropped from the file (`drop`), then written with the
 * config into a temporary folder. */
#ifndef KILN_TESTS_CKPT_WRITER_H
#define KILN_TESTS_CKPT_WRITER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/mem.h"
#include "test_tmp.h"

enum { CKPT_MAX_TENSORS = 64 };

struct tensor {
    char name[192];
    char dtype[12];
    int ndim;
    long shape[4];
    unsigned char *data;
    size_t nbytes;
    int drop; /* left out of the file */
};

struct ckpt {
    struct tensor t[CKPT_MAX_TENSORS];
    int n;
    json_t *config;
};

/* A zeroed tensor of ndim dimensions, es bytes an element. */
static inline struct tensor *ckpt_add(struct ckpt *c, const char *name, const char *dtype, int ndim,
                                      const long *shape, size_t es) {
    assert_true(c->n < CKPT_MAX_TENSORS && ndim >= 1 && ndim <= 4);
    struct tensor *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)(t->shape[i] = shape[i]);
    t->nbytes = n * es;
    t->data = xcalloc(t->nbytes ? t->nbytes : 1, 1);
    return t;
}

static inline struct tensor *find(struct ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    fail_msg("no tensor %s", name);
    abort();
}

/* The folder (a new temporary one, named after `tag`) holding config.json
 * and model.safetensors; the caller frees the path (rm_rf). */
static inline char *ckpt_write(struct ckpt *c, const char *tag) {
    char *dir = test_tmp_dir(tag);
    char *p = path_join(dir, "config.json");
    assert_int_equal(json_dump_file(c->config, p, JSON_INDENT(1)), 0);
    free(p);
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < c->n; i++) {
        const struct tensor *t = &c->t[i];
        if (t->drop) continue;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype, "shape", shape,
                                                  "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    size_t hl = strlen(text);
    FILE *f = fopen((p = path_join(dir, "model.safetensors")), "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++) fputc((int)((uint64_t)hl >> (8 * i)) & 0xff, f);
    fwrite(text, 1, hl, f);
    for (int i = 0; i < c->n; i++)
        if (!c->t[i].drop) fwrite(c->t[i].data, 1, c->t[i].nbytes, f);
    fclose(f);
    free(p);
    free(text);
    json_decref(h);
    return dir;
}

static inline void free_ckpt(struct ckpt *c) {
    for (int i = 0; i < c->n; i++) free(c->t[i].data);
    json_decref(c->config);
    c->n = 0;
}

static inline void rm_rf(char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

#endif
