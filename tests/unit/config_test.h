/* config_test.h — helpers of the model-config unit tests (test_config.c,
 * test_config_quant.c): fixture paths from the environment, configs read,
 * edited and parsed, and the expectations on their errors. */
#ifndef KILN_TESTS_CONFIG_TEST_H
#define KILN_TESTS_CONFIG_TEST_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "model/config.h"

#define assert_contains(hay, needle)                                                        \
    do {                                                                                    \
        if (!strstr((hay), (needle)))                                                       \
            fail_msg("message \"%s\" does not contain \"%s\"", (hay), (needle));            \
    } while (0)

#define assert_near(a, b) assert_true(fabs((double)(a) - (double)(b)) <= 1e-12 * (1 + fabs((double)(b))))


static inline char *env_path(const char *var, const char *rel) {
    const char *root = getenv(var);
    assert_non_null(root);
    char *p = xmalloc(strlen(root) + strlen(rel) + 2);
    sprintf(p, "%s/%s", root, rel);
    return p;
}

static inline void load_real(const char *name, struct model_config *c) {
    char rel[160];
    snprintf(rel, sizeof rel, "configs/%s", name);
    char *p = env_path("KILN_MODELS", rel);
    struct kiln_error err = {0};
    if (model_config_load(c, p, &err)) fail_msg("%s", err.msg);
    free(p);
}

static inline json_t *read_json(const char *var, const char *rel) {
    char *p = env_path(var, rel);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) fail_msg("%s: %s", p, je.text);
    free(p);
    return j;
}

static inline int parse_json(const json_t *j, struct model_config *c, struct kiln_error *err) {
    char *text = json_dumps(j, 0);
    int rc = model_config_parse(c, text, strlen(text), "config.json", err);
    free(text);
    return rc;
}

static inline void expect_error(json_t *j, const char *want) {
    struct model_config c;
    struct kiln_error err = {0};
    if (parse_json(j, &c, &err) == 0) fail_msg("parsed, expected an error with \"%s\"", want);
    assert_contains(err.msg, "config.json");
    assert_contains(err.msg, want);
    json_decref(j);
}

static inline json_t *tiny(const char *arch) {
    char rel[160];
    snprintf(rel, sizeof rel, "oracle/tiny-models/%s/config.json", arch);
    return read_json("KILN_FIXTURES", rel);
}

static inline void expect_ok(json_t *j, struct model_config *c) {
    struct kiln_error err = {0};
    if (parse_json(j, c, &err)) fail_msg("expected to parse: %s", err.msg);
    json_decref(j);
}

static inline void load_tiny(const char *arch, struct model_config *c) {
    char rel[160];
    snprintf(rel, sizeof rel, "oracle/tiny-models/%s/config.json", arch);
    char *p = env_path("KILN_FIXTURES", rel);
    struct kiln_error err = {0};
    if (model_config_load(c, p, &err)) fail_msg("%s", err.msg);
    free(p);
}

#endif
