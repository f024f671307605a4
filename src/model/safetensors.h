/* safetensors.h — validated, memory-mapped safetensors checkpoints.
 *
 * A `struct st_set` is every tensor of a checkpoint: one file
 * (model.safetensors), a sharded one (model.safetensors.index.json naming
 * the shards), or any single file (reference.safetensors). Files are mapped
 * read-only; tensor data pointers are views into the mappings and stay valid
 * until st_close.
 *
 * Every header is validated before anything is used: 8-byte length inside
 * the file, JSON object of {name: {dtype, shape, data_offsets}} plus an
 * optional "__metadata__" of strings, known dtype, offsets ordered, inside
 * the data area and not overlapping, bytes = product(shape) × dtype size,
 * no duplicate names (across shards too). Errors name the file and the
 * tensor, and say what was expected.
 */
#ifndef KILN_MODEL_SAFETENSORS_H
#define KILN_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "tensor/dtype.h"

struct kiln_error;

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    enum dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* view into the file mapping */
    size_t nbytes;
    int file;         /* index into st_set.paths */
};

struct st_set {
    int n_files;
    char **paths;
    struct file_map *maps;
    int n_tensors;
    struct st_tensor *tensors;
    /* open-addressing hash of tensor names -> index, for st_find */
    int hash_cap;
    int *hash;
    char *source;     /* the path given to st_open_file/st_open_dir, for messages */
};

/* Parses and validates one file's header from memory. `file_name` is only
 * used in messages. On success *out holds *n_out tensors whose data pointers
 * point into `data`. Caller frees with st_tensors_free. Fuzzed. */
int st_parse(const unsigned char *data, size_t size, const char *file_name, int file_index,
             struct st_tensor **out, int *n_out, struct kiln_error *err);
void st_tensors_free(struct st_tensor *t, int n);

/* A single .safetensors file. */
int st_open_file(struct st_set *s, const char *path, struct kiln_error *err);
/* A checkpoint folder: model.safetensors.index.json if present, else
 * model.safetensors, else the only *.safetensors file in it. */
int st_open_dir(struct st_set *s, const char *dir, struct kiln_error *err);
void st_close(struct st_set *s); /* also accepts a half-built or zeroed set */

const struct st_tensor *st_find(const struct st_set *s, const char *name);
/* Renames every tensor whose name starts with `from` to `to` + the rest
 * (a multimodal checkpoint's language model under its own prefix) and
 * rebuilds the index; fails when two names meet. */
int st_rename_prefix(struct st_set *s, const char *from, const char *to, struct kiln_error *err);

/* Finds `name` and checks its shape (ndim entries of `shape`; -1 matches any
 * size). Errors: "<file>: tensor '<name>': expected shape [a, b], found
 * [c, d]" or "<dir>: tensor '<name>' is missing". */
int st_expect(const struct st_set *s, const char *name, int ndim, const int64_t *shape,
              const struct st_tensor **out, struct kiln_error *err);

#endif
