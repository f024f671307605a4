/* test_jinja.c — the Jinja interpreter against jinja2's own behaviour.
 *
 * jinja_cases.inc holds snippets and real-world templates whose expected
 * output jinja2 3.1 produced (configured like transformers); here we also
 * check syntax error positions, the limits that stop hostile templates, the
 * transformers-only {% generation %} tag, and rendering from threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "chat/chat_template.h"
#include "chat/jinja.h"

struct jcase {
    const char *tmpl, *vars, *expected;
};

static const struct jcase cases[] = {
#include "jinja_cases.inc"
};

/* Compiles and renders; returns the output (caller frees) or NULL with err set. */
static char *render(const char *tmpl, const char *vars_json, const struct jinja_limits *lim, struct kiln_error *err) {
    struct jinja_template *t = NULL;
    if (jinja_compile(&t, tmpl, strlen(tmpl), err)) return NULL;
    json_error_t je;
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, &je);
    assert_non_null(vars);
    if (!json_object_get(vars, "messages")) json_object_set_new(vars, "messages", json_loads(JINJA_CASES_MESSAGES, 0, &je));
    char *out = NULL;
    size_t len = 0;
    int rc = jinja_render(t, vars, lim, &out, &len, err);
    json_decref(vars);
    jinja_free(t);
    if (rc) return NULL;
    assert_int_equal(strlen(out), len);
    return out;
}

static void test_cases(void **state) {
    (void)state;
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kiln_error err = {0};
        char *out = render(cases[i].tmpl, cases[i].vars, NULL, &err);
        int ok = cases[i].expected ? out && !strcmp(out, cases[i].expected) : out == NULL;
        if (!ok) {
            failed++;
            fprintf(stderr, "case %zu: %s\n  expected: %s\n  got:      %s%s\n", i, cases[i].tmpl,
                    cases[i].expected ? cases[i].expected : "(error)", out ? out : "(error) ", out ? "" : err.msg);
        }
        free(out);
    }
    fprintf(stderr, "%zu jinja cases, %d failed\n", sizeof cases / sizeof cases[0], failed);
    assert_int_equal(failed, 0);
}

static void expect_error(const char *tmpl, const char *want) {
    struct kiln_error err = {0};
    char *out = render(tmpl, NULL, NULL, &err);
    if (out || !strstr(err.msg, want))
        fprintf(stderr, "template %s\n  want error containing: %s\n  got: %s\n", tmpl, want, out ? out : err.msg);
    assert_null(out);
    assert_non_null(strstr(err.msg, want));
}

static void test_syntax_errors(void **state) {
    (void)state;
    expect_error("{% for x in y %}\nno end", "template:2:7: expected 'endfor' or 'else' before the end of the template (to close 'for' at 1:4)");
    expect_error("a\n{% if x %}\n  {% endfor %}", "template:3:6: unexpected 'endfor', expected 'elif' or 'else' or 'endif'");
    expect_error("{{ 1 + }}", "template:1:8: unexpected end of print statement");
    expect_error("line1\n  {% foo %}", "template:2:6: unknown tag 'foo'");
    expect_error("{{ 'abc }}", "template:1:4: unexpected end of string");
    expect_error("{{ x", "template:1:1: unexpected end of template, expected '}}'");
    expect_error("{# open", "template:1:1: missing end of comment tag");
    expect_error("{{ a b }}", "template:1:6: expected end of print statement, got 'b'");
    expect_error("{% break %}", "template:1:4: 'break' outside loop");
    expect_error("{{ (1, 2 }}", "template:1:10: unexpected closing bracket");
    expect_error("{% endif %}", "template:1:4: unexpected 'endif' (no block is open)");
    expect_error("{% macro m(a=1, b) %}{% endmacro %}", "non-default argument follows default argument");
    expect_error("{{ 99999999999999999999 }}", "integer literal too large");
}

static void test_runtime_errors(void **state) {
    (void)state;
    expect_error("\n  {{ x.y }}", "template:2:7: 'x' is undefined");
    expect_error("{{ raise_exception('Only user and assistant roles are supported!') }}",
                 "Only user and assistant roles are supported!");
    expect_error("{% set l = [] %}{{ l.append(1) }}", "access to attribute 'append' of 'list' object is unsafe.");
    expect_error("{{ 'a' + 1 }}", "can only concatenate str (not \"int\") to str");
    expect_error("{{ x|nosuch }}", "No filter named 'nosuch'.");
    expect_error("{{ 1 is nosuch }}", "No test named 'nosuch'.");
    /* raise_exception's message is reported as written, without a position */
    struct kiln_error err = {0};
    assert_null(render("{{ raise_exception('exact') }}", NULL, NULL, &err));
    assert_string_equal(err.msg, "exact");
}

static void test_limits(void **state) {
    (void)state;
    struct jinja_limits lim = {.max_output = 1 << 20, .max_steps = 200000, .max_depth = 20};
    static const char *const hostile[] = {
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'x' * 100000000 }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        "{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        struct kiln_error err = {0};
        char *out = render(hostile[i], NULL, &lim, &err);
        if (out) fprintf(stderr, "hostile template %zu rendered %zu bytes\n", i, strlen(out));
        assert_null(out);
    }
    /* deeply nested expressions are refused by the parser, not the stack */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < 1000; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 1000; i++) deep[n++] = ')';
    deep[n] = 0;
    char tmpl[4200];
    snprintf(tmpl, sizeof tmpl, "{{ %s }}", deep);
    struct kiln_error err = {0};
    assert_null(render(tmpl, NULL, NULL, &err));
    assert_non_null(strstr(err.msg, "brackets nested too deeply"));
    char nots[8000] = "{{ ";
    for (int i = 0; i < 1000; i++) strcat(nots, "not ");
    strcat(nots, "1 }}");
    assert_null(render(nots, NULL, NULL, &err));
    assert_non_null(strstr(err.msg, "nested too deeply"));
    /* an empty string or list repeated 10^13 times is empty at once, as in
     * Python (the loop ran 10^13 empty iterations: a fuzz_template timeout) */
    char *out = NULL;
    static const char *const empty_rep[][2] = {
        {"{{ '' * 10000000000000 }}|{{ 10000000000000 * '' }}|", "||"},
        {"{{ ([] * 10000000000000)|length }}", "0"},
        {"{{ 30 - 11101111211111 * \"\" }}", NULL}, /* int - str: a type error */
    };
    for (size_t i = 0; i < sizeof empty_rep / sizeof empty_rep[0]; i++) {
        out = render(empty_rep[i][0], NULL, NULL, &err);
        if (empty_rep[i][1]) {
            assert_non_null(out);
            assert_string_equal(out, empty_rep[i][1]);
        } else {
            assert_null(out);
        }
        free(out);
    }
    /* namespaces holding themselves must not leak (LeakSanitizer checks) */
    out = render("{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.l = [ns, ns] %}ok", NULL, NULL, &err);
    assert_non_null(out);
    assert_string_equal(out, "ok");
    free(out);
}

static void test_generation_tag(void **state) {
    (void)state;
    struct kiln_error err = {0};
    char *out = render("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}",
                       NULL, NULL, &err);
    assert_non_null(out);
    assert_string_equal(out, "Hello!");
    free(out);
}

struct thread_arg {
    const struct chat_template *ct;
    const json_t *messages;
    const char *expected;
    int ok;
};

static void *render_thread(void *p) {
    struct thread_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        struct chat_template_args args = {.messages = a->messages, .add_generation_prompt = 1};
        char *out;
        size_t len;
        struct kiln_error err;
        if (chat_template_render(a->ct, &args, &out, &len, &err) || strcmp(out, a->expected)) a->ok = 0;
        else free(out);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    struct chat_template ct;
    struct kiln_error err;
    assert_int_equal(chat_template_init(&ct, "{% for m in messages %}{{ m.role|upper ~ ': ' ~ m['content'] }}\n{% endfor %}{{ 'x' }}{{ eos_token }}",
                                        NULL, "</s>", &err), 0);
    json_error_t je;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]", 0, &je);
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){.ct = &ct, .messages = msgs, .expected = "USER: hi\nASSISTANT: yo\nx</s>"};
        pthread_create(&th[i], NULL, render_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    json_decref(msgs);
    chat_template_free(&ct);
}

static void test_float_repr(void **state) {
    (void)state;
    static const struct {
        double f;
        const char *s;
    } cases_f[] = {{0.1, "0.1"}, {1.0, "1.0"}, {-2.5, "-2.5"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
                   {1e-4, "0.0001"}, {1e-5, "1e-05"}, {123456789012345678.0, "1.2345678901234568e+17"},
                   {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"}, {0.0, "0.0"}};
    for (size_t i = 0; i < sizeof cases_f / sizeof cases_f[0]; i++) {
        char buf[40];
        py_float_repr(cases_f[i].f, buf);
        assert_string_equal(buf, cases_f[i].s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),        cmocka_unit_test(test_syntax_errors), cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),       cmocka_unit_test(test_generation_tag), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_float_repr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
