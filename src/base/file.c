#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"

int file_read_all(const char *path, char **out, size_t *out_len, struct kiln_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    struct buf b = {0};
    for (size_t step = 1 << 16;; step = b.len) { /* doubling reads */
        size_t n = fread(buf_grow(&b, step), 1, step, f);
        buf_truncate(&b, b.len - step + n);
        if (n < step) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        buf_free(&b);
        return kiln_errorf(err, "%s: read error", path);
    }
    if (out_len) *out_len = b.len;
    *out = buf_take(&b);
    return 0;
}

int file_map_open(struct file_map *m, const char *path, struct kiln_error *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return kiln_errorf(err, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_errorf(err, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return kiln_errorf(err, "%s: cannot map: %s", path, strerror(errno));
        }
        m->data = p;
    }
    close(fd);
    return 0;
}

void file_map_close(struct file_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/') a--;
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}
