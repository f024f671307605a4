/* jinja_eval.c — walks the tree: expressions to values, statements to
 * output. Scoping follows jinja2: each loop iteration, macro call and
 * `with` block gets a fresh scope (so `set` inside a loop does not leak,
 * hence namespace()), `if` does not. */
#include "chat/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

static int eval(struct jctx *ctx, struct jscope *sc, const struct jnode *n, struct jv *out);
static int exec_body(struct jctx *ctx, struct jscope *sc, const struct jnodes *body);

/* ------------------------------------------------------------ plumbing */

int jctx_fail(struct jctx *ctx, const char *fmt, ...) {
    if (!ctx || !ctx->err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err->msg, sizeof ctx->err->msg, fmt, ap);
    va_end(ap);
    ctx->failed_positioned = 0;
    return -1;
}

/* Adds the node's position to an error raised below it (once). */
static int fail_here(struct jctx *ctx, const struct jnode *n) {
    if (!ctx->failed_positioned && n) {
        kiln_error_prefix(ctx->err, "template:%d:%d", n->line, n->col);
        ctx->failed_positioned = 1;
    }
    return -1;
}

int jctx_step(struct jctx *ctx, size_t work) {
    ctx->steps += 1 + work / 64;
    if (ctx->steps > ctx->lim.max_steps) return jctx_fail(ctx, "template rendering exceeded its step limit");
    return 0;
}

int jctx_check_len(struct jctx *ctx, size_t len) {
    if (len > ctx->lim.max_output) return jctx_fail(ctx, "template output exceeds %zu bytes", ctx->lim.max_output);
    return 0;
}

int jinja_undefined_error(struct jctx *ctx, const struct jv *u) {
    if (u->type == JV_UNDEFINED && u->u.s) return jctx_fail(ctx, "%s", u->u.s->data);
    return jctx_fail(ctx, "value is undefined");
}

const struct jv *jargs_get(struct jargs *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    if (name)
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwnames[k], name)) {
                a->kw_used |= (uint64_t)1 << k;
                return &a->kw[k];
            }
    return NULL;
}

int jargs_check(struct jctx *ctx, struct jargs *a, size_t max_pos, const char *what) {
    if (a->npos > max_pos)
        return jctx_fail(ctx, "%s() takes at most %zu positional argument(s) (%zu given)", what, max_pos, a->npos);
    for (size_t k = 0; k < a->nkw; k++)
        if (!(a->kw_used & ((uint64_t)1 << k)))
            return jctx_fail(ctx, "%s() got an unexpected keyword argument '%s'", what, a->kwnames[k]);
    return 0;
}

static void jargs_free(struct jargs *a) {
    for (size_t i = 0; i < a->npos; i++) jv_release(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_release(a->kw[i]);
    free(a->pos);
    free(a->kw);
}

static int eval_args(struct jctx *ctx, struct jscope *sc, const struct jnode *n, struct jargs *a) {
    memset(a, 0, sizeof *a);
    if (n->args.n) a->pos = xcalloc(n->args.n, sizeof *a->pos);
    if (n->kwargs.n) a->kw = xcalloc(n->kwargs.n, sizeof *a->kw);
    a->kwnames = (const char **)n->kwnames;
    for (size_t i = 0; i < n->args.n; i++, a->npos++)
        if (eval(ctx, sc, n->args.v[i], &a->pos[i])) return -1;
    for (size_t i = 0; i < n->kwargs.n; i++, a->nkw++)
        if (eval(ctx, sc, n->kwargs.v[i], &a->kw[i])) return -1;
    return 0;
}

static struct jv *scope_lookup(struct jscope *sc, const char *name) {
    for (; sc; sc = sc->parent) {
        struct jv *v = jv_dict_find_str(sc->vars, name);
        if (v) return v;
    }
    return NULL;
}

static void scope_set(struct jscope *sc, const char *name, struct jv take) {
    jv_dict_set(sc->vars, jv_cstr(name), take);
}

static int write_out(struct jctx *ctx, const char *s, size_t n) {
    if (jctx_check_len(ctx, ctx->out->len + n)) return -1;
    buf_append(ctx->out, s, n);
    return jctx_step(ctx, n);
}

/* ----------------------------------------------------------- expressions */

static int slice_index(struct jctx *ctx, const struct jv *v, int64_t *out, int *given) {
    *given = 0;
    if (v->type == JV_NONE) return 0;
    if (v->type == JV_INT || v->type == JV_BOOL) {
        *out = v->type == JV_INT ? v->u.i : v->u.b;
        *given = 1;
        return 0;
    }
    if (v->type == JV_UNDEFINED) return jinja_undefined_error(ctx, v);
    return jctx_fail(ctx, "slice indices must be integers or None");
}

/* Python slice semantics over `len` items; fills the chosen indices. */
static int slice_pick(struct jctx *ctx, int64_t len, const struct jv *parts, int64_t **idx, size_t *count) {
    int64_t start = 0, stop = 0, step = 1;
    int gs, ge, gt;
    if (slice_index(ctx, &parts[0], &start, &gs) || slice_index(ctx, &parts[1], &stop, &ge) ||
        slice_index(ctx, &parts[2], &step, &gt))
        return -1;
    if (!gt) step = 1;
    if (step == 0) return jctx_fail(ctx, "slice step cannot be zero");
    if (step > 0) {
        if (!gs) start = 0;
        else if (start < 0) start = start + len < 0 ? 0 : start + len;
        else if (start > len) start = len;
        if (!ge) stop = len;
        else if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
        else if (stop > len) stop = len;
    } else {
        if (!gs) start = len - 1;
        else if (start < 0) start = start + len < 0 ? -1 : start + len;
        else if (start >= len) start = len - 1;
        if (!ge) stop = -1;
        else if (stop < 0) stop = stop + len < 0 ? -1 : stop + len;
        else if (stop >= len) stop = len - 1;
    }
    *count = 0;
    *idx = xmalloc((size_t)(len > 0 ? len : 1) * sizeof **idx);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        (*idx)[(*count)++] = i;
        if (step > 0 && i > INT64_MAX - step) break;
        if (step < 0 && i < INT64_MIN - step) break;
    }
    return 0;
}

static int eval_slice(struct jctx *ctx, struct jscope *sc, const struct jv *obj, const struct jnode *sl, struct jv *out) {
    struct jv parts[3] = {jv_none(), jv_none(), jv_none()};
    const struct jnode *pn[3] = {sl->a, sl->b, sl->c};
    int rc = -1;
    int64_t *idx = NULL;
    size_t count = 0;
    for (int i = 0; i < 3; i++)
        if (pn[i] && eval(ctx, sc, pn[i], &parts[i])) goto done;
    if (obj->type == JV_STR) {
        const char *s = obj->u.s->data;
        size_t n = obj->u.s->len, cps = utf8_count(s, n);
        size_t *offs = xmalloc((cps + 1) * sizeof *offs);
        for (size_t i = 0, o = 0; i <= cps; i++) {
            offs[i] = o;
            uint32_t cp;
            if (o < n) o += utf8_decode_lossy(s + o, n - o, &cp);
        }
        if (slice_pick(ctx, (int64_t)cps, parts, &idx, &count)) {
            free(offs);
            goto done;
        }
        struct buf b = {0};
        for (size_t i = 0; i < count; i++) buf_append(&b, s + offs[idx[i]], offs[idx[i] + 1] - offs[idx[i]]);
        free(offs);
        *out = jv_take_buf(&b);
    } else if (jv_is_list(*obj)) {
        if (slice_pick(ctx, (int64_t)obj->u.l->n, parts, &idx, &count)) goto done;
        struct jv l = jv_list_new(count);
        for (size_t i = 0; i < count; i++) jv_list_push(l, jv_retain(obj->u.l->items[idx[i]]));
        l.type = obj->type;
        *out = l;
    } else if (obj->type == JV_UNDEFINED) {
        jinja_undefined_error(ctx, obj);
        goto done;
    } else {
        *out = jv_undef_named("object cannot be sliced");
    }
    rc = 0;
done:
    free(idx);
    for (int i = 0; i < 3; i++) jv_release(parts[i]);
    return rc;
}

static int eval_compare(struct jctx *ctx, struct jscope *sc, const struct jnode *n, struct jv *out) {
    struct jv left;
    if (eval(ctx, sc, n->a, &left)) return -1;
    int result = 1;
    for (size_t i = 0; i < n->args.n && result; i++) {
        struct jv right;
        if (eval(ctx, sc, n->args.v[i], &right)) {
            jv_release(left);
            return -1;
        }
        enum jop op = n->ops[i];
        int r = 0;
        if (op == JOP_EQ || op == JOP_NE) {
            r = jv_equal(left, right) == (op == JOP_EQ);
        } else if (op == JOP_IN || op == JOP_NOTIN) {
            if (jinja_contains(ctx, &right, &left, &r)) goto fail;
            if (op == JOP_NOTIN) r = !r;
        } else {
            if (left.type == JV_UNDEFINED || right.type == JV_UNDEFINED) {
                jinja_undefined_error(ctx, left.type == JV_UNDEFINED ? &left : &right);
                goto fail;
            }
            int c = jv_compare(left, right);
            static const char *sym[] = {[JOP_LT] = "<", [JOP_LE] = "<=", [JOP_GT] = ">", [JOP_GE] = ">="};
            if (c == 2) {
                jctx_fail(ctx, "'%s' not supported between instances of '%s' and '%s'", sym[op], jv_type_name(left),
                          jv_type_name(right));
                goto fail;
            }
            if (c == 3) r = 0;
            else if (op == JOP_LT) r = c < 0;
            else if (op == JOP_LE) r = c <= 0;
            else if (op == JOP_GT) r = c > 0;
            else r = c >= 0;
        }
        jv_release(left);
        left = right;
        result = r;
        continue;
    fail:
        jv_release(left);
        jv_release(right);
        return -1;
    }
    jv_release(left);
    *out = jv_bool(result);
    return 0;
}

static int eval_inner(struct jctx *ctx, struct jscope *sc, const struct jnode *n, struct jv *out) {
    switch (n->kind) {
    case JN_CONST: *out = jv_retain(n->value); return 0;
    case JN_NAME: {
        struct jv *v = scope_lookup(sc, n->name);
        if (v) {
            *out = jv_retain(*v);
            return 0;
        }
        struct jv g = jinja_global(n->name);
        if (g.type != JV_UNDEFINED) {
            *out = g;
            return 0;
        }
        char msg[160];
        snprintf(msg, sizeof msg, "'%.100s' is undefined", n->name);
        *out = jv_undef_named(msg);
        return 0;
    }
    case JN_GETATTR: {
        struct jv obj;
        if (eval(ctx, sc, n->a, &obj)) return -1;
        int rc = jinja_getattr(ctx, &obj, n->name, strlen(n->name), out);
        jv_release(obj);
        return rc;
    }
    case JN_GETITEM: {
        struct jv obj, key;
        if (eval(ctx, sc, n->a, &obj)) return -1;
        if (n->b->kind == JN_SLICE) {
            int rc = eval_slice(ctx, sc, &obj, n->b, out);
            jv_release(obj);
            return rc;
        }
        if (eval(ctx, sc, n->b, &key)) {
            jv_release(obj);
            return -1;
        }
        int rc = jinja_getitem(ctx, &obj, &key, out);
        jv_release(obj);
        jv_release(key);
        return rc;
    }
    case JN_SLICE: return jctx_fail(ctx, "slice outside of a subscript");
    case JN_CALL: {
        struct jv fn;
        struct jargs args;
        if (eval(ctx, sc, n->a, &fn)) return -1;
        int rc = eval_args(ctx, sc, n, &args);
        if (!rc) rc = jinja_call(ctx, &fn, &args, out);
        jargs_free(&args);
        jv_release(fn);
        return rc;
    }
    case JN_FILTER: {
        struct jv v;
        struct jargs args;
        if (!n->a) return jctx_fail(ctx, "filter without input");
        if (eval(ctx, sc, n->a, &v)) return -1;
        int rc = eval_args(ctx, sc, n, &args);
        if (!rc) rc = jinja_filter_apply(ctx, n->name, &v, &args, out);
        jargs_free(&args);
        jv_release(v);
        return rc;
    }
    case JN_TEST: {
        struct jv v;
        struct jargs args;
        int r = 0;
        if (eval(ctx, sc, n->a, &v)) return -1;
        int rc = eval_args(ctx, sc, n, &args);
        if (!rc) rc = jinja_test_apply(ctx, n->name, &v, &args, &r);
        jargs_free(&args);
        jv_release(v);
        if (!rc) *out = jv_bool(n->flag ? !r : r);
        return rc;
    }
    case JN_UNARY: {
        struct jv v;
        if (eval(ctx, sc, n->a, &v)) return -1;
        int rc = 0;
        if (n->op == JOP_NOT) {
            *out = jv_bool(!jv_truthy(v));
        } else if (v.type == JV_UNDEFINED) {
            rc = jinja_undefined_error(ctx, &v);
        } else if (v.type == JV_INT || v.type == JV_BOOL) {
            int64_t i = v.type == JV_INT ? v.u.i : v.u.b;
            if (n->op == JOP_NEG && i == INT64_MIN) rc = jctx_fail(ctx, "integer overflow");
            else *out = jv_int(n->op == JOP_NEG ? -i : i);
        } else if (v.type == JV_FLOAT) {
            *out = jv_float(n->op == JOP_NEG ? -v.u.f : v.u.f);
        } else {
            rc = jctx_fail(ctx, "bad operand type for unary %s: '%s'", n->op == JOP_NEG ? "-" : "+", jv_type_name(v));
        }
        jv_release(v);
        return rc;
    }
    case JN_BINOP: {
        struct jv a, b;
        if (eval(ctx, sc, n->a, &a)) return -1;
        if (n->op == JOP_AND || n->op == JOP_OR) {
            if (jv_truthy(a) == (n->op == JOP_OR)) {
                *out = a;
                return 0;
            }
            jv_release(a);
            return eval(ctx, sc, n->b, out);
        }
        if (eval(ctx, sc, n->b, &b)) {
            jv_release(a);
            return -1;
        }
        int rc = jinja_binop(ctx, n->op, &a, &b, out);
        jv_release(a);
        jv_release(b);
        return rc;
    }
    case JN_COMPARE: return eval_compare(ctx, sc, n, out);
    case JN_COND: {
        struct jv t;
        if (eval(ctx, sc, n->a, &t)) return -1;
        int truth = jv_truthy(t);
        jv_release(t);
        if (truth) return eval(ctx, sc, n->b, out);
        if (n->c) return eval(ctx, sc, n->c, out);
        *out = jv_undef_named("the inline if-expression evaluated to false and no else section was defined.");
        return 0;
    }
    case JN_LIST:
    case JN_TUPLE: {
        struct jv l = jv_list_new(n->args.n);
        for (size_t i = 0; i < n->args.n; i++) {
            struct jv item;
            if (eval(ctx, sc, n->args.v[i], &item)) {
                jv_release(l);
                return -1;
            }
            jv_list_push(l, item);
        }
        if (n->kind == JN_TUPLE) l.type = JV_TUPLE;
        *out = l;
        return 0;
    }
    case JN_DICT: {
        struct jv d = jv_dict_new();
        for (size_t i = 0; i < n->args.n; i++) {
            struct jv k, v;
            if (eval(ctx, sc, n->args.v[i], &k)) {
                jv_release(d);
                return -1;
            }
            if (k.type == JV_LIST || jv_is_dict(k) || k.type == JV_UNDEFINED) {
                jctx_fail(ctx, "unhashable type: '%s'", jv_type_name(k));
                jv_release(k);
                jv_release(d);
                return -1;
            }
            if (eval(ctx, sc, n->kwargs.v[i], &v)) {
                jv_release(k);
                jv_release(d);
                return -1;
            }
            jv_dict_set(d, k, v);
        }
        *out = d;
        return 0;
    }
    default: return jctx_fail(ctx, "statement used as an expression");
    }
}

/* Bounds eval/exec recursion together: expression depth times macro depth
 * times statement nesting could otherwise exhaust the C stack. */
#define MAX_NEST 2500

static int eval(struct jctx *ctx, struct jscope *sc, const struct jnode *n, struct jv *out) {
    *out = jv_undef();
    if (jctx_step(ctx, 0)) return fail_here(ctx, n);
    if (++ctx->nest > MAX_NEST) {
        ctx->nest--;
        jctx_fail(ctx, "template nested too deeply");
        return fail_here(ctx, n);
    }
    int rc = eval_inner(ctx, sc, n, out);
    ctx->nest--;
    if (rc) {
        *out = jv_undef();
        return fail_here(ctx, n);
    }
    return 0;
}

/* ------------------------------------------------------------ statements */

/* Binds a for/set/with target (a name or nested tuple of names). */
static int assign(struct jctx *ctx, struct jscope *sc, const struct jnode *target, const struct jv *v) {
    if (target->kind == JN_NAME) {
        scope_set(sc, target->name, jv_retain(*v));
        return 0;
    }
    if (target->kind == JN_GETATTR) {
        struct jv *ns = scope_lookup(sc, target->a->name);
        if (!ns || ns->type != JV_NAMESPACE) return jctx_fail(ctx, "cannot assign attribute on non-namespace object");
        jv_dict_set(*ns, jv_cstr(target->name), jv_retain(*v));
        return 0;
    }
    KILN_ASSERT(target->kind == JN_TUPLE);
    struct jv items;
    if (jinja_iterate(ctx, v, &items)) return -1;
    size_t want = target->args.n, got = items.u.l->n;
    if (want != got) {
        jv_release(items);
        return got > want ? jctx_fail(ctx, "too many values to unpack (expected %zu)", want)
                          : jctx_fail(ctx, "not enough values to unpack (expected %zu, got %zu)", want, got);
    }
    for (size_t i = 0; i < want; i++)
        if (assign(ctx, sc, target->args.v[i], &items.u.l->items[i])) {
            jv_release(items);
            return -1;
        }
    jv_release(items);
    return 0;
}

static void scope_init(struct jscope *s, struct jscope *parent) {
    s->parent = parent;
    s->vars = jv_dict_new();
}

static void scope_free(struct jscope *s) { jv_release(s->vars); }

/* Renders body into a new string (block set, filter blocks, macros). */
static int capture(struct jctx *ctx, struct jscope *sc, const struct jnodes *body, struct jv *out) {
    struct buf buf = {0}, *saved = ctx->out;
    ctx->out = &buf;
    int rc = exec_body(ctx, sc, body);
    ctx->out = saved;
    if (rc) {
        buf_free(&buf);
        return -1;
    }
    *out = jv_take_buf(&buf);
    return 0;
}

/* Applies a filter chain whose innermost input is `v` (owned). */
static int apply_filter_chain(struct jctx *ctx, struct jscope *sc, const struct jnode *f, struct jv v, struct jv *out) {
    if (!f) {
        *out = v;
        return 0;
    }
    struct jv in;
    if (apply_filter_chain(ctx, sc, f->a, v, &in)) return -1;
    struct jargs args;
    int rc = eval_args(ctx, sc, f, &args);
    if (!rc) rc = jinja_filter_apply(ctx, f->name, &in, &args, out);
    jargs_free(&args);
    jv_release(in);
    return rc ? fail_here(ctx, f) : 0;
}

static int exec_for(struct jctx *ctx, struct jscope *sc, const struct jnode *n) {
    struct jv seq, items, filtered = jv_undef();
    if (eval(ctx, sc, n->b, &seq)) return -1;
    int rc = jinja_iterate(ctx, &seq, &items);
    jv_release(seq);
    if (rc) return fail_here(ctx, n->b);
    if (n->c) {
        filtered = jv_list_new(items.u.l->n);
        for (size_t i = 0; i < items.u.l->n; i++) {
            struct jscope it;
            scope_init(&it, sc);
            struct jv t;
            rc = assign(ctx, &it, n->a, &items.u.l->items[i]);
            if (rc) fail_here(ctx, n);
            if (!rc) rc = eval(ctx, &it, n->c, &t);
            scope_free(&it);
            if (rc) {
                jv_release(filtered);
                jv_release(items);
                return -1;
            }
            if (jv_truthy(t)) jv_list_push(filtered, jv_retain(items.u.l->items[i]));
            jv_release(t);
        }
        jv_release(items);
        items = filtered;
    }
    size_t count = items.u.l->n;
    if (count == 0) {
        jv_release(items);
        struct jscope es;
        scope_init(&es, sc);
        rc = exec_body(ctx, &es, &n->else_body);
        scope_free(&es);
        return rc;
    }
    struct jloop *lp = xcalloc(1, sizeof *lp);
    lp->rc = 1;
    lp->items = items;
    struct jv loop = {.type = JV_LOOP, .u.loop = lp};
    rc = 0;
    for (size_t i = 0; i < count; i++) {
        lp->index0 = i;
        struct jscope it;
        scope_init(&it, sc);
        scope_set(&it, "loop", jv_retain(loop));
        rc = assign(ctx, &it, n->a, &items.u.l->items[i]);
        if (rc) fail_here(ctx, n);
        if (!rc) rc = jctx_step(ctx, 0);
        if (!rc) rc = exec_body(ctx, &it, &n->body);
        scope_free(&it);
        if (rc) break;
        if (ctx->loop_ctl == JN_BREAK) {
            ctx->loop_ctl = 0;
            break;
        }
        ctx->loop_ctl = 0;
    }
    jv_release(loop);
    return rc;
}

/* Calls a macro or a call block's caller with evaluated arguments. */
static int call_body(struct jctx *ctx, const struct jnode *def, struct jscope *parent, const char *name,
                     struct jargs *args, const struct jv *caller, struct jv *out) {
    if (ctx->depth >= ctx->lim.max_depth) return jctx_fail(ctx, "macro calls nested too deeply (limit %d)", ctx->lim.max_depth);
    size_t nparams = def->nkwnames, ndefaults = def->kwargs.n;
    int takes_varargs = def->kind == JN_CALLBLOCK || (def->flag & 1);
    int takes_kwargs = def->kind == JN_CALLBLOCK || (def->flag & 2);
    if (args->npos > nparams && !takes_varargs)
        return jctx_fail(ctx, "macro '%s' takes not more than %zu argument(s)", name, nparams);
    struct jscope ms;
    scope_init(&ms, parent);
    struct jv extra_kw = jv_dict_new(), varargs = jv_list_new(0);
    int rc = -1;
    for (size_t k = 0; k < args->nkw; k++) {
        size_t p;
        for (p = 0; p < nparams; p++)
            if (!strcmp(def->kwnames[p], args->kwnames[k])) break;
        if (p < nparams) {
            if (p < args->npos) {
                jctx_fail(ctx, "macro '%s' got multiple values for argument '%s'", name, args->kwnames[k]);
                goto done;
            }
            continue;
        }
        if (!strcmp(args->kwnames[k], "caller") && caller == NULL) continue;
        if (!takes_kwargs) {
            jctx_fail(ctx, "macro '%s' takes no keyword argument '%s'", name, args->kwnames[k]);
            goto done;
        }
        jv_dict_set(extra_kw, jv_cstr(args->kwnames[k]), jv_retain(args->kw[k]));
    }
    for (size_t p = 0; p < nparams; p++) {
        const struct jv *v = jargs_get(args, p, def->kwnames[p]);
        if (v) {
            scope_set(&ms, def->kwnames[p], jv_retain(*v));
        } else if (p >= nparams - ndefaults) {
            struct jv d;
            if (eval(ctx, &ms, def->kwargs.v[p - (nparams - ndefaults)], &d)) goto done;
            scope_set(&ms, def->kwnames[p], d);
        } else {
            char msg[200];
            snprintf(msg, sizeof msg, "parameter '%.80s' was not provided", def->kwnames[p]);
            scope_set(&ms, def->kwnames[p], jv_undef_named(msg));
        }
    }
    for (size_t i = nparams; i < args->npos; i++) jv_list_push(varargs, jv_retain(args->pos[i]));
    varargs.type = JV_TUPLE;
    scope_set(&ms, "varargs", jv_retain(varargs));
    scope_set(&ms, "kwargs", jv_retain(extra_kw));
    if (caller) scope_set(&ms, "caller", jv_retain(*caller));
    const struct jv *explicit_caller = caller ? NULL : jargs_get(args, (size_t)-1, "caller");
    if (explicit_caller) scope_set(&ms, "caller", jv_retain(*explicit_caller));
    ctx->depth++;
    int saved_ctl = ctx->loop_ctl;
    rc = capture(ctx, &ms, &def->body, out);
    ctx->loop_ctl = saved_ctl;
    ctx->depth--;
done:
    jv_release(extra_kw);
    jv_release(varargs);
    scope_free(&ms);
    return rc;
}

int jinja_call_macro(struct jctx *ctx, const struct jfunc *fn, struct jargs *args, struct jv *out) {
    if (fn->kind == JFUNC_MACRO) return call_body(ctx, fn->node, ctx->root, fn->name, args, NULL, out);
    if (!fn->scope) return jctx_fail(ctx, "caller() used after its call block ended");
    return call_body(ctx, fn->node, fn->scope, "caller", args, NULL, out);
}

static int exec_stmt(struct jctx *ctx, struct jscope *sc, const struct jnode *n) {
    switch (n->kind) {
    case JN_DATA: return write_out(ctx, n->name, n->name_len) ? fail_here(ctx, n) : 0;
    case JN_OUTPUT: {
        struct jv v;
        if (eval(ctx, sc, n->a, &v)) return -1;
        int rc;
        if (v.type == JV_STR) {
            rc = write_out(ctx, v.u.s->data, v.u.s->len);
        } else {
            struct buf b = {0};
            jv_write_str(&b, v);
            rc = write_out(ctx, b.data ? b.data : "", b.len);
            buf_free(&b);
        }
        jv_release(v);
        return rc ? fail_here(ctx, n) : 0;
    }
    case JN_IF: {
        struct jv t;
        if (eval(ctx, sc, n->a, &t)) return -1;
        int truth = jv_truthy(t);
        jv_release(t);
        return exec_body(ctx, sc, truth ? &n->body : &n->else_body);
    }
    case JN_FOR: return exec_for(ctx, sc, n);
    case JN_SET: {
        struct jv v;
        if (eval(ctx, sc, n->b, &v)) return -1;
        int rc = assign(ctx, sc, n->a, &v);
        jv_release(v);
        return rc ? fail_here(ctx, n) : 0;
    }
    case JN_SETBLOCK: {
        struct jv v, f;
        struct jscope bs;
        scope_init(&bs, sc);
        int rc = capture(ctx, &bs, &n->body, &v);
        scope_free(&bs);
        if (rc) return -1;
        if (apply_filter_chain(ctx, sc, n->c, v, &f)) return -1;
        rc = assign(ctx, sc, n->a, &f);
        jv_release(f);
        return rc ? fail_here(ctx, n) : 0;
    }
    case JN_FILTERBLOCK: {
        struct jv v, f;
        if (capture(ctx, sc, &n->body, &v)) return -1;
        if (apply_filter_chain(ctx, sc, n->c, v, &f)) return -1;
        struct jv s = jv_to_str(f);
        jv_release(f);
        int rc = write_out(ctx, s.u.s->data, s.u.s->len);
        jv_release(s);
        return rc ? fail_here(ctx, n) : 0;
    }
    case JN_MACRO: {
        struct jfunc *fn = xcalloc(1, sizeof *fn);
        fn->rc = 1;
        fn->kind = JFUNC_MACRO;
        fn->name = n->name;
        fn->node = n;
        struct jv v = {.type = JV_FUNC, .u.fn = fn};
        scope_set(sc, n->name, v);
        return 0;
    }
    case JN_CALLBLOCK: {
        struct jfunc *fn = xcalloc(1, sizeof *fn);
        fn->rc = 1;
        fn->kind = JFUNC_CALLER;
        fn->name = "caller";
        fn->node = n;
        fn->scope = sc;
        struct jv caller = {.type = JV_FUNC, .u.fn = fn};
        const struct jnode *call = n->a;
        struct jv callee, result;
        struct jargs args;
        int rc = eval(ctx, sc, call->a, &callee);
        if (!rc) {
            rc = eval_args(ctx, sc, call, &args);
            if (!rc) {
                if (callee.type == JV_FUNC && callee.u.fn->kind == JFUNC_MACRO)
                    rc = call_body(ctx, callee.u.fn->node, ctx->root, callee.u.fn->name, &args, &caller, &result);
                else
                    rc = jctx_fail(ctx, "call block needs a macro");
            }
            jargs_free(&args);
            jv_release(callee);
        }
        fn->scope = NULL; /* a caller stored somewhere must not outlive this scope */
        jv_release(caller);
        if (rc) return fail_here(ctx, n);
        rc = write_out(ctx, result.u.s->data, result.u.s->len);
        jv_release(result);
        return rc ? fail_here(ctx, n) : 0;
    }
    case JN_WITH: {
        struct jscope ws;
        scope_init(&ws, sc);
        int rc = 0;
        for (size_t i = 0; i < n->args.n && !rc; i++) {
            struct jv v;
            rc = eval(ctx, sc, n->kwargs.v[i], &v);
            if (!rc) {
                rc = assign(ctx, &ws, n->args.v[i], &v);
                jv_release(v);
                if (rc) fail_here(ctx, n);
            }
        }
        if (!rc) rc = exec_body(ctx, &ws, &n->body);
        scope_free(&ws);
        return rc;
    }
    case JN_BREAK:
    case JN_CONTINUE: ctx->loop_ctl = n->kind; return 0;
    case JN_BODY: return exec_body(ctx, sc, &n->body);
    default: return jctx_fail(ctx, "expression used as a statement");
    }
}

static int exec_body(struct jctx *ctx, struct jscope *sc, const struct jnodes *body) {
    if (++ctx->nest > MAX_NEST) {
        ctx->nest--;
        return jctx_fail(ctx, "template nested too deeply");
    }
    int rc = 0;
    for (size_t i = 0; i < body->n; i++) {
        if ((rc = exec_stmt(ctx, sc, body->v[i]))) break;
        if (ctx->loop_ctl) break;
    }
    ctx->nest--;
    return rc;
}

int jinja_render(const struct jinja_template *t, const json_t *vars, const struct jinja_limits *limits, char **out,
                 size_t *out_len, struct kiln_error *err) {
    struct jinja_limits defaults = {.max_output = 64u << 20, .max_steps = 10000000, .max_depth = 100};
    struct buf buf = {0};
    struct jscope root;
    scope_init(&root, NULL);
    struct jctx ctx = {.err = err, .root = &root, .out = &buf, .lim = limits ? *limits : defaults};
    ctx.namespaces = jv_list_new(0);
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && json_is_object(vars)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) scope_set(&root, k, jv_from_json(v));
    }
    int rc = exec_body(&ctx, &root, &t->root->body);
    /* namespaces are the only mutable containers, so the only way to build
     * reference cycles: empty them all before letting go. */
    for (size_t i = 0; i < ctx.namespaces.u.l->n; i++) jv_dict_clear(ctx.namespaces.u.l->items[i]);
    jv_release(ctx.namespaces);
    scope_free(&root);
    if (rc) {
        buf_free(&buf);
        return -1;
    }
    if (out_len) *out_len = buf.len;
    *out = buf_take(&buf);
    return 0;
}
