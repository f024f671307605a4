/* jinja_tests.c — jinja2's built-in tests (`x is defined`, `n is
 * divisibleby 3`, ...), with Python's notion of types: bool is a number but
 * not an integer, Undefined is iterable and callable. */
#include "chat/jinja.h"

#include <math.h>
#include <string.h>

#include "base/error.h"

static struct jv soft_str(const struct jv *v) { return jv_to_str(*v); }

static int one_arg(struct jctx *ctx, struct jargs *a, const char *name, const struct jv **arg) {
    *arg = jargs_get(a, 0, NULL);
    if (!*arg) return jctx_fail(ctx, "test '%s' needs an argument", name);
    return jargs_check(ctx, a, 1, name);
}

static int int_arg_check(struct jctx *ctx, const struct jv *v) {
    if (v->type == JV_UNDEFINED) return jinja_undefined_error(ctx, v);
    if (!jv_is_number(*v)) return jctx_fail(ctx, "unsupported operand type for %%: '%s'", jv_type_name(*v));
    return 0;
}

static int jinja_test_exists(const char *name);

int jinja_test_apply(struct jctx *ctx, const char *name, const struct jv *v, struct jargs *a, int *r) {
    const struct jv *arg = NULL;
    enum jv_type t = v->type;
    *r = 0;
    /* tests with no argument */
    static const char *const unary[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer",
                                        "float", "number", "string", "mapping", "iterable", "sequence", "callable",
                                        "lower", "upper", "odd", "even", "escaped", NULL};
    for (size_t i = 0; unary[i]; i++) {
        if (strcmp(unary[i], name)) continue;
        if (jargs_check(ctx, a, 0, name)) return -1;
        switch (i) {
        case 0: *r = t != JV_UNDEFINED; return 0;
        case 1: *r = t == JV_UNDEFINED; return 0;
        case 2: *r = t == JV_NONE; return 0;
        case 3: *r = t == JV_BOOL; return 0;
        case 4: *r = t == JV_BOOL && !v->u.b; return 0;
        case 5: *r = t == JV_BOOL && v->u.b; return 0;
        case 6: *r = t == JV_INT; return 0;
        case 7: *r = t == JV_FLOAT; return 0;
        case 8: *r = jv_is_number(*v); return 0;
        case 9: *r = t == JV_STR; return 0;
        case 10: *r = t == JV_DICT; return 0;
        case 11: *r = t == JV_STR || jv_is_list(*v) || t == JV_DICT || t == JV_UNDEFINED || t == JV_LOOP; return 0;
        case 12: *r = t == JV_STR || jv_is_list(*v) || t == JV_DICT || t == JV_UNDEFINED; return 0;
        case 13: *r = t == JV_FUNC || t == JV_UNDEFINED; return 0;
        case 14:
        case 15: {
            struct jv s = soft_str(v), m;
            struct jargs none = {0};
            extern jfunc_fn jinja_str_method(const char *name);
            int rc = jinja_str_method(i == 14 ? "islower" : "isupper")(ctx, &s, &none, &m);
            jv_release(s);
            if (rc) return -1;
            *r = m.u.b;
            return 0;
        }
        case 16:
        case 17:
            if (int_arg_check(ctx, v)) return -1;
            if (t == JV_FLOAT) {
                double m = fmod(v->u.f, 2.0);
                *r = (i == 16) ? (m == 1.0 || m == -1.0) : (m == 0);
            } else {
                int64_t x = t == JV_BOOL ? v->u.b : v->u.i;
                *r = (i == 16) ? (x % 2 != 0) : (x % 2 == 0);
            }
            return 0;
        default: *r = 0; return 0;
        }
    }
    if (!strcmp(name, "divisibleby")) {
        if (one_arg(ctx, a, name, &arg) || int_arg_check(ctx, v) || int_arg_check(ctx, arg)) return -1;
        double d = jv_as_double(*arg);
        if (d == 0) return jctx_fail(ctx, "integer division or modulo by zero");
        if (t != JV_FLOAT && arg->type != JV_FLOAT) {
            int64_t x = t == JV_BOOL ? v->u.b : v->u.i, y = arg->type == JV_BOOL ? arg->u.b : arg->u.i;
            *r = y == -1 || x % y == 0;
        } else {
            *r = fmod(jv_as_double(*v), d) == 0;
        }
        return 0;
    }
    static const struct {
        const char *name;
        enum jop op;
    } cmps[] = {{"eq", JOP_EQ}, {"equalto", JOP_EQ}, {"==", JOP_EQ}, {"ne", JOP_NE}, {"!=", JOP_NE},
                {"lt", JOP_LT}, {"lessthan", JOP_LT}, {"<", JOP_LT}, {"le", JOP_LE}, {"<=", JOP_LE},
                {"gt", JOP_GT}, {"greaterthan", JOP_GT}, {">", JOP_GT}, {"ge", JOP_GE}, {">=", JOP_GE}};
    for (size_t i = 0; i < sizeof cmps / sizeof cmps[0]; i++) {
        if (strcmp(cmps[i].name, name)) continue;
        if (one_arg(ctx, a, name, &arg)) return -1;
        enum jop op = cmps[i].op;
        if (op == JOP_EQ || op == JOP_NE) {
            *r = jv_equal(*v, *arg) == (op == JOP_EQ);
            return 0;
        }
        if (t == JV_UNDEFINED || arg->type == JV_UNDEFINED) return jinja_undefined_error(ctx, t == JV_UNDEFINED ? v : arg);
        int c = jv_compare(*v, *arg);
        if (c == 2) return jctx_fail(ctx, "comparison not supported between '%s' and '%s'", jv_type_name(*v), jv_type_name(*arg));
        *r = c == 3 ? 0 : op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
        return 0;
    }
    if (!strcmp(name, "in")) {
        if (one_arg(ctx, a, name, &arg)) return -1;
        return jinja_contains(ctx, arg, v, r);
    }
    if (!strcmp(name, "sameas")) {
        if (one_arg(ctx, a, name, &arg)) return -1;
        if (t != arg->type) *r = 0;
        else if (t == JV_NONE) *r = 1;
        else if (t == JV_UNDEFINED) *r = 0; /* two Undefined objects are never the same object */
        else if (t == JV_BOOL) *r = v->u.b == arg->u.b;
        else if (t == JV_INT) *r = v->u.i == arg->u.i && v->u.i >= -5 && v->u.i <= 256; /* CPython's small ints */
        else if (t == JV_STR) *r = v->u.s == arg->u.s;
        else *r = v->u.l == arg->u.l;
        return 0;
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        /* `'upper' is filter`: whether the value names a filter (test) */
        if (jargs_check(ctx, a, 0, name)) return -1;
        if (t != JV_STR) return 0;
        if (name[0] == 't') {
            *r = jinja_test_exists(v->u.s->data);
        } else {
            *r = jinja_filter_exists(v->u.s->data);
        }
        return 0;
    }
    return jctx_fail(ctx, "No test named '%s'.", name);
}

static int jinja_test_exists(const char *name) {
    static const char *const names[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                        "number", "string", "mapping", "iterable", "sequence", "callable", "lower",
                                        "upper", "odd", "even", "escaped", "divisibleby", "eq", "equalto", "==", "ne",
                                        "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=",
                                        "in", "sameas", "filter", "test", NULL};
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}
