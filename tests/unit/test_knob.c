/* test_knob.c — the knob table's parser (base/knob.h): every type's
 * accepted spellings, and the exact message for each kind of bad value
 * (not a number, trailing junk, out of range, overflow, a word not in the
 * list, a bad boolean, non-finite floats), defaults when unset or empty,
 * the first bad knob in table order being the one reported, and the
 * start-up line of the knobs not at their defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/knob.h"

/* The test environment sets some KILN_* variables (tests/CMakeLists.txt);
 * each case starts from none of the ones it touches. */
static const char *const touched[] = {"KILN_CUDA_GEMV_MAX_ROWS", "KILN_CUDA_KV", "KILN_CUDA_PDL",
                                      "KILN_CUDA_TOL", "KILN_MODEL", "KILN_CUDA_FA", "KILN_LOG",
                                      "KILN_CUDA_GEMV_KS", "KILN_DEVICE", "KILN_FIXTURES",
                                      "KILN_TOKENIZERS", "KILN_MODELS", "KILN_SRC"};

static int clean(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof touched / sizeof touched[0]; i++) unsetenv(touched[i]);
    return knob_reload(NULL);
}

/* Sets name=value, parses again and returns knob_reload's status; the
 * message lands in err. */
static int with(const char *name, const char *value, struct kiln_error *err) {
    setenv(name, value, 1);
    err->msg[0] = 0;
    return knob_reload(err);
}

static void expect_error(const char *name, const char *value, const char *msg) {
    struct kiln_error err;
    assert_int_equal(with(name, value, &err), -1);
    assert_string_equal(err.msg, msg);
    /* knob_init answers the same until the next reload */
    struct kiln_error again;
    assert_int_equal(knob_init(&again), -1);
    assert_string_equal(again.msg, msg);
    unsetenv(name);
}

static void test_defaults(void **state) {
    (void)state;
    struct kiln_error err;
    assert_int_equal(knob_init(&err), 0);
    assert_int_equal(knob_int(KNOB_CUDA_GEMV_MAX_ROWS), 2);
    assert_int_equal(knob_bool(KNOB_CUDA_PDL), 1);
    assert_string_equal(knob_str(KNOB_CUDA_KV), "auto");
    assert_int_equal(knob_enum(KNOB_CUDA_KV), 0);
    assert_string_equal(knob_str(KNOB_MODEL), "");
    assert_true(knob_float(KNOB_CUDA_TOL) == 0.25);
    assert_false(knob_is_set(KNOB_CUDA_KV));
    /* an empty value counts as unset */
    assert_int_equal(with("KILN_CUDA_KV", "", &err), 0);
    assert_false(knob_is_set(KNOB_CUDA_KV));
    assert_string_equal(knob_str(KNOB_CUDA_KV), "auto");
}

static void test_int(void **state) {
    (void)state;
    struct kiln_error err;
    assert_int_equal(with("KILN_CUDA_GEMV_MAX_ROWS", "8", &err), 0);
    assert_int_equal(knob_int(KNOB_CUDA_GEMV_MAX_ROWS), 8);
    assert_true(knob_is_set(KNOB_CUDA_GEMV_MAX_ROWS));
    assert_int_equal(with("KILN_CUDA_GEMV_MAX_ROWS", "0", &err), 0);
    assert_int_equal(knob_int(KNOB_CUDA_GEMV_MAX_ROWS), 0);
    static const char *const bad[] = {"abc", "3x", " 3", "+3", "2.0", "9", "-1", "0x4",
                                      "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char msg[128];
        snprintf(msg, sizeof msg, "KILN_CUDA_GEMV_MAX_ROWS='%s': expected an integer from 0 to 8", bad[i]);
        expect_error("KILN_CUDA_GEMV_MAX_ROWS", bad[i], msg);
    }
    /* a bad value leaves the default in place */
    setenv("KILN_CUDA_GEMV_MAX_ROWS", "junk", 1);
    assert_int_equal(knob_reload(NULL), -1);
    assert_int_equal(knob_int(KNOB_CUDA_GEMV_MAX_ROWS), 2);
    assert_false(knob_is_set(KNOB_CUDA_GEMV_MAX_ROWS));
}

static void test_enum(void **state) {
    (void)state;
    struct kiln_error err;
    assert_int_equal(with("KILN_CUDA_KV", "f32", &err), 0);
    assert_int_equal(knob_enum(KNOB_CUDA_KV), 2);
    assert_string_equal(knob_str(KNOB_CUDA_KV), "f32");
    expect_error("KILN_CUDA_KV", "fp8", "KILN_CUDA_KV='fp8': expected one of auto, bf16 or f32");
    expect_error("KILN_CUDA_KV", "F32", "KILN_CUDA_KV='F32': expected one of auto, bf16 or f32");
    /* a variant that was deleted is refused, not ignored */
    expect_error("KILN_CUDA_FA", "fa3p", "KILN_CUDA_FA='fa3p': expected one of auto, fa2 or fa3");
    /* numbers as words */
    assert_int_equal(with("KILN_CUDA_GEMV_KS", "4", &err), 0);
    assert_string_equal(knob_str(KNOB_CUDA_GEMV_KS), "4");
    expect_error("KILN_CUDA_GEMV_KS", "3", "KILN_CUDA_GEMV_KS='3': expected one of auto, 1, 2 or 4");
    assert_int_equal(with("KILN_LOG", "debug", &err), 0);
    assert_string_equal(knob_str(KNOB_LOG), "debug");
    unsetenv("KILN_LOG");
}

static void test_bool(void **state) {
    (void)state;
    struct kiln_error err;
    static const char *const off[] = {"0", "false", "no", "off", "OFF", "False"};
    static const char *const on[] = {"1", "true", "yes", "on", "ON", "Yes"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        assert_int_equal(with("KILN_CUDA_PDL", off[i], &err), 0);
        assert_int_equal(knob_bool(KNOB_CUDA_PDL), 0);
        assert_int_equal(with("KILN_CUDA_PDL", on[i], &err), 0);
        assert_int_equal(knob_bool(KNOB_CUDA_PDL), 1);
    }
    expect_error("KILN_CUDA_PDL", "2",
                 "KILN_CUDA_PDL='2': expected a boolean (1, 0, true, false, on, off, yes or no)");
    expect_error("KILN_CUDA_PDL", "maybe",
                 "KILN_CUDA_PDL='maybe': expected a boolean (1, 0, true, false, on, off, yes or no)");
}

static void test_float_and_string(void **state) {
    (void)state;
    struct kiln_error err;
    assert_int_equal(with("KILN_CUDA_TOL", "1e-3", &err), 0);
    assert_true(knob_float(KNOB_CUDA_TOL) == 1e-3);
    static const char *const bad[] = {"abc", "nan", "inf", "-1", "1e999", "0.5x", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char msg[128];
        snprintf(msg, sizeof msg, "KILN_CUDA_TOL='%s': expected a number from 0 to 1e+09", bad[i]);
        expect_error("KILN_CUDA_TOL", bad[i], msg);
    }
    assert_int_equal(with("KILN_MODEL", "/models/x y", &err), 0);
    assert_string_equal(knob_str(KNOB_MODEL), "/models/x y");
    /* the value is a copy: the environment may change after the parse */
    setenv("KILN_MODEL", "other", 1);
    assert_string_equal(knob_str(KNOB_MODEL), "/models/x y");
}

static void test_first_error_and_set_line(void **state) {
    (void)state;
    struct kiln_error err;
    setenv("KILN_CUDA_PDL", "x", 1);
    setenv("KILN_CUDA_KV", "y", 1);
    /* table order: KILN_CUDA_KV (PUBLIC) comes before KILN_CUDA_PDL */
    assert_int_equal(knob_reload(&err), -1);
    assert_string_equal(err.msg, "KILN_CUDA_KV='y': expected one of auto, bf16 or f32");
    unsetenv("KILN_CUDA_PDL");
    setenv("KILN_CUDA_KV", "bf16", 1);
    setenv("KILN_CUDA_GEMV_MAX_ROWS", "4", 1);
    setenv("KILN_CUDA_PDL", "on", 1); /* its default: not listed */
    assert_int_equal(knob_reload(&err), 0);
    char line[256];
    assert_int_equal(knob_describe_set(line, sizeof line), 2);
    assert_string_equal(line, "KILN_CUDA_KV=bf16 KILN_CUDA_GEMV_MAX_ROWS=4");
    /* a short buffer is cut, never overrun */
    char small[8];
    assert_int_equal(knob_describe_set(small, sizeof small), 2);
    assert_string_equal(small, "KILN_CU");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clean),
        cmocka_unit_test_setup(test_int, clean),
        cmocka_unit_test_setup(test_enum, clean),
        cmocka_unit_test_setup(test_bool, clean),
        cmocka_unit_test_setup(test_float_and_string, clean),
        cmocka_unit_test_setup(test_first_error_and_set_line, clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
