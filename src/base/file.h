/* file.h — reading and mapping files, with errors that name the file.
 *
 * file_read_all: the whole file into a NUL-terminated heap buffer.
 * file_map: a read-only private mapping (weights stay views into it).
 */
#ifndef KILN_BASE_FILE_H
#define KILN_BASE_FILE_H

#include <stddef.h>

struct kiln_error;

struct file_map {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
};

int file_read_all(const char *path, char **out, size_t *out_len, struct kiln_error *err);
int file_map_open(struct file_map *m, const char *path, struct kiln_error *err);
void file_map_close(struct file_map *m);
int file_exists(const char *path);
/* Joins dir and name with one '/'; caller frees. */
char *path_join(const char *dir, const char *name);

#endif
