/* test_tmp.h — a new empty folder for a test's files, kiln_TAG_XXXXXX
 * under $TMPDIR (else /tmp), the path's length checked. The caller frees
 * the path and removes the folder. Needs cmocka. */
#ifndef KILN_TESTS_TEST_TMP_H
#define KILN_TESTS_TEST_TMP_H

#include <stdio.h>
#include <stdlib.h>

#include "base/mem.h"

static inline char *test_tmp_dir(const char *tag) {
    const char *root = getenv("TMPDIR");
    char tmpl[4096];
    int n = snprintf(tmpl, sizeof tmpl, "%s/kiln_%s_XXXXXX", root && *root ? root : "/tmp", tag);
    assert_true(n > 0 && (size_t)n < sizeof tmpl);
    char *dir = mkdtemp(tmpl);
    if (!dir) fail_msg("mkdtemp %s failed", tmpl);
    return xstrdup(dir);
}

#endif
