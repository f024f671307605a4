/* jinja_parser.c — tokens to a syntax tree, following jinja2's parser rule
 * for rule (operator precedence, where filters and tests bind, what `for`
 * and `if` accept) so that odd but valid templates parse the same way.
 * Nesting is bounded so hostile input cannot exhaust the stack. */
#include "chat/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

#define PARSE_MAX_DEPTH 200

struct parser {
    struct jtokens *toks;
    size_t i;
    struct kiln_error *err;
    int depth;
    int loops; /* enclosing for loops within the current macro, for break/continue */
};

static struct jtoken *cur(struct parser *p) { return &p->toks->v[p->i]; }
static struct jtoken *peek(struct parser *p) {
    return p->i + 1 < p->toks->n ? &p->toks->v[p->i + 1] : &p->toks->v[p->toks->n - 1];
}
static void advance(struct parser *p) {
    if (p->toks->v[p->i].type != JTOK_EOF) p->i++;
}

static const char *op_text(enum jop op) {
    static const char *names[] = {
        [JOP_ADD] = "+", [JOP_SUB] = "-", [JOP_DIV] = "/", [JOP_FLOORDIV] = "//", [JOP_MUL] = "*",
        [JOP_MOD] = "%", [JOP_POW] = "**", [JOP_TILDE] = "~", [JOP_LBRACKET] = "[", [JOP_RBRACKET] = "]",
        [JOP_LPAREN] = "(", [JOP_RPAREN] = ")", [JOP_LBRACE] = "{", [JOP_RBRACE] = "}", [JOP_EQ] = "==",
        [JOP_NE] = "!=", [JOP_GT] = ">", [JOP_GE] = ">=", [JOP_LT] = "<", [JOP_LE] = "<=", [JOP_ASSIGN] = "=",
        [JOP_DOT] = ".", [JOP_COLON] = ":", [JOP_PIPE] = "|", [JOP_COMMA] = ",", [JOP_SEMICOLON] = ";",
    };
    return op < sizeof names / sizeof names[0] && names[op] ? names[op] : "?";
}

static void describe(const struct jtoken *t, char *buf, size_t n) {
    switch (t->type) {
    case JTOK_EOF: snprintf(buf, n, "end of template"); break;
    case JTOK_DATA: snprintf(buf, n, "template data"); break;
    case JTOK_VAR_BEGIN: snprintf(buf, n, "'{{'"); break;
    case JTOK_VAR_END: snprintf(buf, n, "end of print statement"); break;
    case JTOK_BLOCK_BEGIN: snprintf(buf, n, "'{%%'"); break;
    case JTOK_BLOCK_END: snprintf(buf, n, "end of statement block"); break;
    case JTOK_NAME: snprintf(buf, n, "'%.60s'", t->text); break;
    case JTOK_STRING: snprintf(buf, n, "string"); break;
    case JTOK_INT: snprintf(buf, n, "integer"); break;
    case JTOK_FLOAT: snprintf(buf, n, "float"); break;
    case JTOK_OP: snprintf(buf, n, "'%s'", op_text(t->op)); break;
    }
}

static int fail_at(struct parser *p, const struct jtoken *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(struct parser *p, const struct jtoken *t, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_errorf(p->err, "template:%d:%d: %s", t->line, t->col, msg);
}

static int fail_expected(struct parser *p, const char *what) {
    char got[96];
    describe(cur(p), got, sizeof got);
    return fail_at(p, cur(p), "expected %s, got %s", what, got);
}

static int is_name(const struct jtoken *t, const char *name) {
    return t->type == JTOK_NAME && !strcmp(t->text, name);
}
static int is_op(const struct jtoken *t, enum jop op) { return t->type == JTOK_OP && t->op == op; }

static int expect_op(struct parser *p, enum jop op) {
    if (!is_op(cur(p), op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op_text(op));
        return fail_expected(p, what);
    }
    advance(p);
    return 0;
}

static int expect_name(struct parser *p, const char *name) {
    if (!is_name(cur(p), name)) {
        char what[64];
        snprintf(what, sizeof what, "'%s'", name);
        return fail_expected(p, what);
    }
    advance(p);
    return 0;
}

static struct jnode *node_new(enum jnode_kind kind, const struct jtoken *t) {
    struct jnode *n = xcalloc(1, sizeof *n);
    n->kind = kind;
    n->line = t->line;
    n->col = t->col;
    return n;
}

static void nodes_push(struct jnodes *v, struct jnode *n) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 4;
        v->v = xrealloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = n;
}

static void names_push(struct jnode *n, const char *name) {
    n->kwnames = xrealloc(n->kwnames, (n->nkwnames + 1) * sizeof *n->kwnames);
    n->kwnames[n->nkwnames++] = xstrdup(name);
}

static void jnode_free(struct jnode *n);

static void nodes_free(struct jnodes *v) {
    for (size_t i = 0; i < v->n; i++) jnode_free(v->v[i]);
    free(v->v);
}

static void jnode_free(struct jnode *n) {
    if (!n) return;
    free(n->name);
    jv_free_immortal(n->value);
    jnode_free(n->a);
    jnode_free(n->b);
    jnode_free(n->c);
    jnode_free(n->d);
    nodes_free(&n->args);
    nodes_free(&n->kwargs);
    nodes_free(&n->body);
    nodes_free(&n->else_body);
    for (size_t i = 0; i < n->nkwnames; i++) free(n->kwnames[i]);
    free(n->kwnames);
    free(n->ops);
    free(n);
}

static struct jnode *const_node(const struct jtoken *t, struct jv v) {
    struct jnode *n = node_new(JN_CONST, t);
    jv_make_immortal(v);
    n->value = v;
    return n;
}

/* ----------------------------------------------------------- expressions */

static struct jnode *parse_expression(struct parser *p, int with_condexpr);
static struct jnode *parse_unary(struct parser *p, int with_filter);
static struct jnode *parse_postfix(struct parser *p, struct jnode *node);
static struct jnode *parse_tuple(struct parser *p, int simplified, int with_condexpr, const char *extra_end,
                                 int explicit_parens);

static int enter(struct parser *p) {
    if (++p->depth > PARSE_MAX_DEPTH) {
        fail_at(p, cur(p), "template nested too deeply");
        return -1;
    }
    return 0;
}

static struct jnode *parse_list_or_dict(struct parser *p, int dict) {
    struct jnode *n = node_new(dict ? JN_DICT : JN_LIST, cur(p));
    advance(p);
    enum jop close = dict ? JOP_RBRACE : JOP_RBRACKET;
    while (!is_op(cur(p), close)) {
        if (n->args.n && expect_op(p, JOP_COMMA)) goto fail;
        if (is_op(cur(p), close)) break;
        struct jnode *k = parse_expression(p, 1);
        if (!k) goto fail;
        nodes_push(&n->args, k);
        if (dict) {
            if (expect_op(p, JOP_COLON)) goto fail;
            struct jnode *v = parse_expression(p, 1);
            if (!v) goto fail;
            nodes_push(&n->kwargs, v);
        }
    }
    advance(p);
    return n;
fail:
    jnode_free(n);
    return NULL;
}

static struct jnode *parse_primary(struct parser *p) {
    struct jtoken *t = cur(p);
    if (enter(p)) return NULL;
    struct jnode *n = NULL;
    if (t->type == JTOK_NAME) {
        if (!strcmp(t->text, "true") || !strcmp(t->text, "True"))
            n = const_node(t, jv_bool(1));
        else if (!strcmp(t->text, "false") || !strcmp(t->text, "False"))
            n = const_node(t, jv_bool(0));
        else if (!strcmp(t->text, "none") || !strcmp(t->text, "None"))
            n = const_node(t, jv_none());
        else {
            n = node_new(JN_NAME, t);
            n->name = xstrdup(t->text);
        }
        advance(p);
    } else if (t->type == JTOK_STRING) {
        struct buf b = {0};
        while (cur(p)->type == JTOK_STRING) {
            buf_append(&b, cur(p)->text, cur(p)->len);
            advance(p);
        }
        n = const_node(t, jv_take_buf(&b));
    } else if (t->type == JTOK_INT) {
        n = const_node(t, jv_int(t->i));
        advance(p);
    } else if (t->type == JTOK_FLOAT) {
        n = const_node(t, jv_float(t->f));
        advance(p);
    } else if (is_op(t, JOP_LPAREN)) {
        advance(p);
        n = parse_tuple(p, 0, 1, NULL, 1);
        if (n && expect_op(p, JOP_RPAREN)) {
            jnode_free(n);
            n = NULL;
        }
    } else if (is_op(t, JOP_LBRACKET)) {
        n = parse_list_or_dict(p, 0);
    } else if (is_op(t, JOP_LBRACE)) {
        n = parse_list_or_dict(p, 1);
    } else {
        char got[96];
        describe(t, got, sizeof got);
        fail_at(p, t, "unexpected %s", got);
    }
    p->depth--;
    return n;
}

/* (args, kw=values) into n->args / n->kwargs+kwnames; current token is '('. */
static int parse_call_args(struct parser *p, struct jnode *n) {
    struct jtoken *open = cur(p);
    advance(p);
    int need_comma = 0;
    while (!is_op(cur(p), JOP_RPAREN)) {
        if (need_comma) {
            if (expect_op(p, JOP_COMMA)) return -1;
            if (is_op(cur(p), JOP_RPAREN)) break;
        }
        if (is_op(cur(p), JOP_MUL) || is_op(cur(p), JOP_POW))
            return fail_at(p, cur(p), "*args and **kwargs in calls are not supported");
        if (cur(p)->type == JTOK_NAME && is_op(peek(p), JOP_ASSIGN)) {
            if (n->nkwnames >= 64) return fail_at(p, cur(p), "too many keyword arguments");
            names_push(n, cur(p)->text);
            advance(p);
            advance(p);
            struct jnode *v = parse_expression(p, 1);
            if (!v) return -1;
            nodes_push(&n->kwargs, v);
        } else {
            if (n->kwargs.n) return fail_at(p, open, "invalid syntax for function call expression");
            struct jnode *v = parse_expression(p, 1);
            if (!v) return -1;
            nodes_push(&n->args, v);
        }
        need_comma = 1;
    }
    advance(p);
    return 0;
}

static struct jnode *parse_subscribed(struct parser *p) {
    struct jtoken *t = cur(p);
    struct jnode *first = NULL;
    if (!is_op(t, JOP_COLON)) {
        first = parse_expression(p, 1);
        if (!first || !is_op(cur(p), JOP_COLON)) return first;
    }
    advance(p); /* ':' */
    struct jnode *s = node_new(JN_SLICE, t);
    s->a = first;
    if (!is_op(cur(p), JOP_COLON) && !is_op(cur(p), JOP_RBRACKET) && !is_op(cur(p), JOP_COMMA)) {
        if (!(s->b = parse_expression(p, 1))) goto fail;
    }
    if (is_op(cur(p), JOP_COLON)) {
        advance(p);
        if (!is_op(cur(p), JOP_RBRACKET) && !is_op(cur(p), JOP_COMMA)) {
            if (!(s->c = parse_expression(p, 1))) goto fail;
        }
    }
    return s;
fail:
    jnode_free(s);
    return NULL;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *node) {
    for (;;) {
        struct jtoken *t = cur(p);
        if (is_op(t, JOP_DOT)) {
            advance(p);
            struct jtoken *a = cur(p);
            if (a->type == JTOK_NAME) {
                struct jnode *g = node_new(JN_GETATTR, t);
                g->a = node;
                g->name = xstrdup(a->text);
                g->name_len = a->len;
                node = g;
            } else if (a->type == JTOK_INT) {
                struct jnode *g = node_new(JN_GETITEM, t);
                g->a = node;
                g->b = const_node(a, jv_int(a->i));
                node = g;
            } else {
                fail_expected(p, "name or number");
                jnode_free(node);
                return NULL;
            }
            advance(p);
        } else if (is_op(t, JOP_LBRACKET)) {
            advance(p);
            struct jnode *g = node_new(JN_GETITEM, t);
            g->a = node;
            node = g;
            struct jnodes items = {0};
            while (!is_op(cur(p), JOP_RBRACKET)) {
                if (items.n && expect_op(p, JOP_COMMA)) goto fail_items;
                struct jnode *s = parse_subscribed(p);
                if (!s) goto fail_items;
                nodes_push(&items, s);
                if (cur(p)->type == JTOK_EOF) break;
            }
            if (expect_op(p, JOP_RBRACKET)) goto fail_items;
            if (items.n == 1) {
                g->b = items.v[0];
                free(items.v);
            } else {
                g->b = node_new(JN_TUPLE, t);
                g->b->args = items;
            }
            continue;
        fail_items:
            nodes_free(&items);
            jnode_free(node);
            return NULL;
        } else if (is_op(t, JOP_LPAREN)) {
            struct jnode *c = node_new(JN_CALL, t);
            c->a = node;
            node = c;
            if (parse_call_args(p, c)) {
                jnode_free(node);
                return NULL;
            }
        } else {
            return node;
        }
    }
}

/* name(.name)* after '|' or 'is'. */
static int parse_dotted_name(struct parser *p, struct jnode *n) {
    if (cur(p)->type != JTOK_NAME) return fail_expected(p, "name");
    struct buf b = {0};
    buf_puts(&b, cur(p)->text);
    advance(p);
    while (is_op(cur(p), JOP_DOT)) {
        advance(p);
        if (cur(p)->type != JTOK_NAME) {
            buf_free(&b);
            return fail_expected(p, "name");
        }
        buf_push(&b, '.');
        buf_puts(&b, cur(p)->text);
        advance(p);
    }
    n->name = b.data;
    n->name_len = b.len;
    return 0;
}

/* Filters chained on node (node may be NULL for filter blocks). */
static struct jnode *parse_filters(struct parser *p, struct jnode *node, int start_inline) {
    while (is_op(cur(p), JOP_PIPE) || start_inline) {
        if (!start_inline) advance(p);
        start_inline = 0;
        struct jnode *f = node_new(JN_FILTER, cur(p));
        f->a = node;
        node = f;
        if (parse_dotted_name(p, f)) goto fail;
        if (is_op(cur(p), JOP_LPAREN) && parse_call_args(p, f)) goto fail;
    }
    return node;
fail:
    jnode_free(node);
    return NULL;
}

static struct jnode *parse_test(struct parser *p, struct jnode *node) {
    struct jtoken *is_tok = cur(p);
    advance(p);
    struct jnode *t = node_new(JN_TEST, is_tok);
    t->a = node;
    if (is_name(cur(p), "not")) {
        advance(p);
        t->flag = 1;
    }
    if (parse_dotted_name(p, t)) goto fail;
    struct jtoken *c = cur(p);
    if (is_op(c, JOP_LPAREN)) {
        if (parse_call_args(p, t)) goto fail;
    } else if ((c->type == JTOK_NAME || c->type == JTOK_STRING || c->type == JTOK_INT || c->type == JTOK_FLOAT ||
                is_op(c, JOP_LPAREN) || is_op(c, JOP_LBRACKET) || is_op(c, JOP_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            fail_at(p, c, "You cannot chain multiple tests with is");
            goto fail;
        }
        struct jnode *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg))) goto fail;
        nodes_push(&t->args, arg);
    }
    return t;
fail:
    jnode_free(t);
    return NULL;
}

static struct jnode *parse_filter_expr(struct parser *p, struct jnode *node) {
    for (;;) {
        if (is_op(cur(p), JOP_PIPE)) {
            node = parse_filters(p, node, 0);
        } else if (is_name(cur(p), "is")) {
            node = parse_test(p, node);
        } else if (is_op(cur(p), JOP_LPAREN)) {
            struct jnode *c = node_new(JN_CALL, cur(p));
            c->a = node;
            node = c;
            if (parse_call_args(p, c)) {
                jnode_free(node);
                return NULL;
            }
        } else {
            return node;
        }
        if (!node) return NULL;
    }
}

static struct jnode *parse_unary(struct parser *p, int with_filter) {
    struct jtoken *t = cur(p);
    if (enter(p)) return NULL;
    struct jnode *node;
    if (is_op(t, JOP_SUB) || is_op(t, JOP_ADD)) {
        advance(p);
        struct jnode *inner = parse_unary(p, 0);
        if (!inner) {
            p->depth--;
            return NULL;
        }
        node = node_new(JN_UNARY, t);
        node->op = t->op == JOP_SUB ? JOP_NEG : JOP_POS;
        node->a = inner;
    } else {
        node = parse_primary(p);
    }
    if (node) node = parse_postfix(p, node);
    if (node && with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

static struct jnode *binop(const struct jtoken *t, enum jop op, struct jnode *a, struct jnode *b) {
    struct jnode *n = node_new(JN_BINOP, t);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* Left-associative binary levels, lowest precedence first. */
enum level { LV_OR, LV_AND, LV_NOT, LV_COMPARE, LV_MATH1, LV_CONCAT, LV_MATH2, LV_POW };

static struct jnode *parse_level(struct parser *p, enum level lv);

static enum jop level_op(struct parser *p, enum level lv) {
    struct jtoken *t = cur(p);
    switch (lv) {
    case LV_OR: return is_name(t, "or") ? JOP_OR : JOP_NONE;
    case LV_AND: return is_name(t, "and") ? JOP_AND : JOP_NONE;
    case LV_MATH1: return is_op(t, JOP_ADD) || is_op(t, JOP_SUB) ? t->op : JOP_NONE;
    case LV_CONCAT: return is_op(t, JOP_TILDE) ? JOP_TILDE : JOP_NONE;
    case LV_MATH2:
        return is_op(t, JOP_MUL) || is_op(t, JOP_DIV) || is_op(t, JOP_FLOORDIV) || is_op(t, JOP_MOD) ? t->op : JOP_NONE;
    case LV_POW: return is_op(t, JOP_POW) ? JOP_POW : JOP_NONE;
    default: return JOP_NONE;
    }
}

static struct jnode *parse_compare(struct parser *p) {
    struct jnode *first = parse_level(p, LV_MATH1);
    if (!first) return NULL;
    struct jnode *n = NULL;
    for (;;) {
        struct jtoken *t = cur(p);
        enum jop op = JOP_NONE;
        if (t->type == JTOK_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == JOP_LT || t->op == JOP_LE ||
                                   t->op == JOP_GT || t->op == JOP_GE)) {
            op = t->op;
            advance(p);
        } else if (is_name(t, "in")) {
            op = JOP_IN;
            advance(p);
        } else if (is_name(t, "not") && is_name(peek(p), "in")) {
            op = JOP_NOTIN;
            advance(p);
            advance(p);
        } else {
            break;
        }
        if (!n) {
            n = node_new(JN_COMPARE, t);
            n->a = first;
        }
        struct jnode *rhs = parse_level(p, LV_MATH1);
        if (!rhs) {
            jnode_free(n);
            return NULL;
        }
        n->ops = xrealloc(n->ops, (n->args.n + 1) * sizeof *n->ops);
        n->ops[n->args.n] = op;
        nodes_push(&n->args, rhs);
    }
    return n ? n : first;
}

static struct jnode *parse_level(struct parser *p, enum level lv) {
    if (lv == LV_NOT) {
        if (is_name(cur(p), "not")) {
            struct jtoken *t = cur(p);
            advance(p);
            if (enter(p)) return NULL;
            struct jnode *inner = parse_level(p, LV_NOT);
            p->depth--;
            if (!inner) return NULL;
            struct jnode *n = node_new(JN_UNARY, t);
            n->op = JOP_NOT;
            n->a = inner;
            return n;
        }
        return parse_compare(p);
    }
    if (lv == LV_COMPARE) return parse_compare(p);
    struct jnode *left = lv == LV_POW ? parse_unary(p, 1) : parse_level(p, (enum level)(lv + 1));
    if (!left) return NULL;
    enum jop op;
    while ((op = level_op(p, lv)) != JOP_NONE) {
        struct jtoken *t = cur(p);
        advance(p);
        struct jnode *right = lv == LV_POW ? parse_unary(p, 1) : parse_level(p, (enum level)(lv + 1));
        if (!right) {
            jnode_free(left);
            return NULL;
        }
        left = binop(t, op, left, right);
    }
    return left;
}

static struct jnode *parse_condexpr(struct parser *p) {
    struct jnode *e1 = parse_level(p, LV_OR);
    while (e1 && is_name(cur(p), "if")) {
        struct jtoken *t = cur(p);
        advance(p);
        struct jnode *test = parse_level(p, LV_OR), *e3 = NULL;
        if (!test) goto fail;
        if (is_name(cur(p), "else")) {
            advance(p);
            if (enter(p)) {
                jnode_free(test);
                goto fail;
            }
            e3 = parse_condexpr(p);
            p->depth--;
            if (!e3) {
                jnode_free(test);
                goto fail;
            }
        }
        struct jnode *c = node_new(JN_COND, t);
        c->a = test;
        c->b = e1;
        c->c = e3;
        e1 = c;
    }
    return e1;
fail:
    jnode_free(e1);
    return NULL;
}

static struct jnode *parse_expression(struct parser *p, int with_condexpr) {
    if (enter(p)) return NULL;
    struct jnode *n = with_condexpr ? parse_condexpr(p) : parse_level(p, LV_OR);
    p->depth--;
    return n;
}

static int is_tuple_end(struct parser *p, const char *extra_end) {
    struct jtoken *t = cur(p);
    if (t->type == JTOK_VAR_END || t->type == JTOK_BLOCK_END || t->type == JTOK_EOF || is_op(t, JOP_RPAREN)) return 1;
    return extra_end && is_name(t, extra_end);
}

static struct jnode *parse_tuple(struct parser *p, int simplified, int with_condexpr, const char *extra_end,
                                 int explicit_parens) {
    struct jtoken *start = cur(p);
    struct jnode *tuple = node_new(JN_TUPLE, start);
    int is_tuple = 0;
    for (;;) {
        if (tuple->args.n && expect_op(p, JOP_COMMA)) goto fail;
        if (is_tuple_end(p, extra_end)) break;
        struct jnode *item = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!item) goto fail;
        nodes_push(&tuple->args, item);
        if (is_op(cur(p), JOP_COMMA))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (tuple->args.n) {
            struct jnode *only = tuple->args.v[0];
            tuple->args.n = 0;
            jnode_free(tuple);
            return only;
        }
        if (!explicit_parens) {
            fail_expected(p, "an expression");
            goto fail;
        }
    }
    return tuple;
fail:
    jnode_free(tuple);
    return NULL;
}

/* ------------------------------------------------------------ statements */

static int parse_body(struct parser *p, struct jnodes *body, const char *const *end_tags, const struct jtoken *opener,
                      const char *opener_name);

static int check_target(struct parser *p, struct jnode *t) {
    if (t->kind == JN_NAME) {
        if (!strcmp(t->name, "true") || !strcmp(t->name, "false") || !strcmp(t->name, "none") ||
            !strcmp(t->name, "loop") || !strcmp(t->name, "True") || !strcmp(t->name, "None") || !strcmp(t->name, "False")) {
            if (strcmp(t->name, "loop")) return fail_at(p, cur(p), "can't assign to %s", t->name);
        }
        return 0;
    }
    if (t->kind == JN_TUPLE) {
        for (size_t i = 0; i < t->args.n; i++)
            if (check_target(p, t->args.v[i])) return -1;
        return 0;
    }
    return fail_at(p, cur(p), "can't assign to this expression");
}

static struct jnode *parse_assign_target(struct parser *p, const char *extra_end, int with_namespace) {
    struct jtoken *t = cur(p);
    if (with_namespace && t->type == JTOK_NAME && is_op(peek(p), JOP_DOT)) {
        struct jnode *ns = node_new(JN_NAME, t);
        ns->name = xstrdup(t->text);
        advance(p);
        advance(p);
        if (cur(p)->type != JTOK_NAME) {
            jnode_free(ns);
            fail_expected(p, "name");
            return NULL;
        }
        struct jnode *g = node_new(JN_GETATTR, t);
        g->a = ns;
        g->name = xstrdup(cur(p)->text);
        advance(p);
        return g;
    }
    struct jnode *target = parse_tuple(p, 1, 0, extra_end, 0);
    if (target && check_target(p, target)) {
        jnode_free(target);
        return NULL;
    }
    return target;
}

static int expect_block_end(struct parser *p) {
    if (cur(p)->type != JTOK_BLOCK_END) return fail_expected(p, "end of statement block");
    advance(p);
    return 0;
}

/* (a, b=default, ...) into kwnames (parameters) and kwargs (defaults of the last ones). */
static int parse_signature(struct parser *p, struct jnode *n) {
    if (expect_op(p, JOP_LPAREN)) return -1;
    while (!is_op(cur(p), JOP_RPAREN)) {
        if (n->nkwnames && expect_op(p, JOP_COMMA)) return -1;
        if (cur(p)->type != JTOK_NAME) return fail_expected(p, "name");
        if (n->nkwnames >= 64) return fail_at(p, cur(p), "too many parameters");
        names_push(n, cur(p)->text);
        advance(p);
        if (is_op(cur(p), JOP_ASSIGN)) {
            advance(p);
            struct jnode *d = parse_expression(p, 1);
            if (!d) return -1;
            nodes_push(&n->kwargs, d);
        } else if (n->kwargs.n) {
            return fail_at(p, cur(p), "non-default argument follows default argument");
        }
    }
    advance(p);
    return 0;
}

static int uses_name(const struct jnode *n, const char *name) {
    if (!n) return 0;
    if (n->kind == JN_NAME && !strcmp(n->name, name)) return 1;
    if (uses_name(n->a, name) || uses_name(n->b, name) || uses_name(n->c, name) || uses_name(n->d, name)) return 1;
    const struct jnodes *lists[] = {&n->args, &n->kwargs, &n->body, &n->else_body};
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < lists[k]->n; i++)
            if (uses_name(lists[k]->v[i], name)) return 1;
    return 0;
}

static struct jnode *parse_statement(struct parser *p) {
    struct jtoken *t = cur(p);
    if (t->type != JTOK_NAME) {
        fail_at(p, t, "tag name expected");
        return NULL;
    }
    const char *tag = t->text;
    struct jnode *n = NULL;
    if (enter(p)) return NULL;
    advance(p);
    if (!strcmp(tag, "if")) {
        n = node_new(JN_IF, t);
        struct jnode *cur_if = n;
        for (;;) {
            if (!(cur_if->a = parse_tuple(p, 0, 0, NULL, 0))) goto fail;
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            if (parse_body(p, &cur_if->body, ends, t, "if")) goto fail;
            struct jtoken *end = cur(p);
            advance(p);
            if (!strcmp(end->text, "elif")) {
                struct jnode *e = node_new(JN_IF, end);
                nodes_push(&cur_if->else_body, e);
                cur_if = e;
                continue;
            }
            if (!strcmp(end->text, "else")) {
                static const char *const ends2[] = {"endif", NULL};
                if (parse_body(p, &cur_if->else_body, ends2, t, "if")) goto fail;
                advance(p);
            }
            break;
        }
    } else if (!strcmp(tag, "for")) {
        n = node_new(JN_FOR, t);
        if (!(n->a = parse_assign_target(p, "in", 0))) goto fail;
        if (expect_name(p, "in")) goto fail;
        if (!(n->b = parse_tuple(p, 0, 0, "recursive", 0))) goto fail;
        if (is_name(cur(p), "if")) {
            advance(p);
            if (!(n->c = parse_expression(p, 1))) goto fail;
        }
        if (is_name(cur(p), "recursive")) {
            fail_at(p, cur(p), "recursive loops are not supported");
            goto fail;
        }
        static const char *const ends[] = {"endfor", "else", NULL};
        p->loops++;
        int rc = parse_body(p, &n->body, ends, t, "for");
        p->loops--;
        if (rc) goto fail;
        struct jtoken *end = cur(p);
        advance(p);
        if (!strcmp(end->text, "else")) {
            static const char *const ends2[] = {"endfor", NULL};
            if (parse_body(p, &n->else_body, ends2, t, "for")) goto fail;
            advance(p);
        }
    } else if (!strcmp(tag, "set")) {
        struct jnode *target = parse_assign_target(p, NULL, 1);
        if (!target) goto fail;
        if (is_op(cur(p), JOP_ASSIGN)) {
            advance(p);
            n = node_new(JN_SET, t);
            n->a = target;
            if (!(n->b = parse_tuple(p, 0, 1, NULL, 0))) goto fail;
        } else {
            n = node_new(JN_SETBLOCK, t);
            n->a = target;
            if (is_op(cur(p), JOP_PIPE) && !(n->c = parse_filters(p, NULL, 0))) goto fail;
            static const char *const ends[] = {"endset", NULL};
            if (parse_body(p, &n->body, ends, t, "set")) goto fail;
            advance(p);
        }
    } else if (!strcmp(tag, "macro") || !strcmp(tag, "call")) {
        int is_macro = tag[0] == 'm';
        n = node_new(is_macro ? JN_MACRO : JN_CALLBLOCK, t);
        if (is_macro) {
            if (cur(p)->type != JTOK_NAME) {
                fail_expected(p, "name");
                goto fail;
            }
            n->name = xstrdup(cur(p)->text);
            advance(p);
            if (parse_signature(p, n)) goto fail;
        } else {
            if (is_op(cur(p), JOP_LPAREN) && parse_signature(p, n)) goto fail;
            if (!(n->a = parse_expression(p, 1))) goto fail;
            if (n->a->kind != JN_CALL) {
                fail_at(p, t, "expected call");
                goto fail;
            }
        }
        static const char *const mends[] = {"endmacro", NULL}, *const cends[] = {"endcall", NULL};
        int loops = p->loops;
        p->loops = 0;
        int rc = parse_body(p, &n->body, is_macro ? mends : cends, t, tag);
        p->loops = loops;
        if (rc) goto fail;
        advance(p);
        if (is_macro) {
            struct jnode body = {.body = n->body};
            n->flag = (uses_name(&body, "varargs") ? 1 : 0) | (uses_name(&body, "kwargs") ? 2 : 0);
        }
    } else if (!strcmp(tag, "filter")) {
        n = node_new(JN_FILTERBLOCK, t);
        if (!(n->c = parse_filters(p, NULL, 1))) goto fail;
        static const char *const ends[] = {"endfilter", NULL};
        if (parse_body(p, &n->body, ends, t, "filter")) goto fail;
        advance(p);
    } else if (!strcmp(tag, "with")) {
        n = node_new(JN_WITH, t);
        while (cur(p)->type != JTOK_BLOCK_END) {
            if (n->args.n && expect_op(p, JOP_COMMA)) goto fail;
            struct jnode *target = parse_assign_target(p, NULL, 0);
            if (!target) goto fail;
            nodes_push(&n->args, target);
            if (expect_op(p, JOP_ASSIGN)) goto fail;
            struct jnode *v = parse_expression(p, 1);
            if (!v) goto fail;
            nodes_push(&n->kwargs, v);
        }
        static const char *const ends[] = {"endwith", NULL};
        if (parse_body(p, &n->body, ends, t, "with")) goto fail;
        advance(p);
    } else if (!strcmp(tag, "generation")) {
        /* transformers' AssistantTracker: marks assistant text for masks; renders its body. */
        n = node_new(JN_BODY, t);
        static const char *const ends[] = {"endgeneration", NULL};
        if (parse_body(p, &n->body, ends, t, "generation")) goto fail;
        advance(p);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!p->loops) {
            fail_at(p, t, "'%s' outside loop", tag);
            goto fail;
        }
        n = node_new(tag[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
    } else {
        fail_at(p, t, "unknown tag '%s'", tag);
        goto fail;
    }
    p->depth--;
    return n;
fail:
    p->depth--;
    jnode_free(n);
    return NULL;
}

/* Data, {{ }} and statements until a block tag named in end_tags (NULL:
 * the end of the template), which is left as the current token. */
static int parse_body(struct parser *p, struct jnodes *body, const char *const *end_tags, const struct jtoken *opener,
                      const char *opener_name) {
    if (end_tags && expect_block_end(p)) return -1;
    for (;;) {
        struct jtoken *t = cur(p);
        if (t->type == JTOK_EOF) {
            if (!end_tags) return 0;
            char want[128] = "";
            for (size_t i = 0; end_tags[i]; i++) {
                size_t l = strlen(want);
                snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", end_tags[i]);
            }
            return kiln_errorf(p->err, "template:%d:%d: expected %s before the end of the template (to close '%s' at %d:%d)",
                               t->line, t->col, want, opener_name, opener->line, opener->col);
        }
        if (t->type == JTOK_DATA) {
            struct jnode *d = node_new(JN_DATA, t);
            d->name = xstrndup(t->text, t->len);
            d->name_len = t->len;
            nodes_push(body, d);
            advance(p);
        } else if (t->type == JTOK_VAR_BEGIN) {
            advance(p);
            struct jnode *o = node_new(JN_OUTPUT, t);
            nodes_push(body, o);
            if (!(o->a = parse_tuple(p, 0, 1, NULL, 0))) return -1;
            if (cur(p)->type != JTOK_VAR_END) return fail_expected(p, "end of print statement");
            advance(p);
        } else if (t->type == JTOK_BLOCK_BEGIN) {
            advance(p);
            struct jtoken *name = cur(p);
            if (end_tags && name->type == JTOK_NAME)
                for (size_t i = 0; end_tags[i]; i++)
                    if (!strcmp(name->text, end_tags[i])) return 0;
            if (name->type == JTOK_NAME && !strncmp(name->text, "end", 3) && !end_tags)
                return fail_at(p, name, "unexpected '%s' (no block is open)", name->text);
            if (name->type == JTOK_NAME && end_tags &&
                (!strncmp(name->text, "end", 3) || !strcmp(name->text, "elif") || !strcmp(name->text, "else"))) {
                char want[128] = "";
                for (size_t i = 0; end_tags[i]; i++) {
                    size_t l = strlen(want);
                    snprintf(want + l, sizeof want - l, "%s'%s'", i ? " or " : "", end_tags[i]);
                }
                return kiln_errorf(p->err, "template:%d:%d: unexpected '%s', expected %s (to close '%s' at %d:%d)",
                                   name->line, name->col, name->text, want, opener_name, opener->line, opener->col);
            }
            struct jnode *s = parse_statement(p);
            if (!s) return -1;
            nodes_push(body, s);
            if (expect_block_end(p)) return -1;
        } else {
            return fail_expected(p, "template data or a tag");
        }
    }
}

int jinja_compile(struct jinja_template **out, const char *src, size_t len, struct kiln_error *err) {
    *out = NULL;
    struct jtokens toks;
    if (jinja_lex(src, len, &toks, err)) return -1;
    struct parser p = {.toks = &toks, .err = err};
    struct jinja_template *t = xcalloc(1, sizeof *t);
    t->root = node_new(JN_BODY, &toks.v[0]);
    if (parse_body(&p, &t->root->body, NULL, NULL, NULL)) goto fail;
    jtokens_free(&toks);
    *out = t;
    return 0;
fail:
    jtokens_free(&toks);
    jinja_free(t);
    return -1;
}

void jinja_free(struct jinja_template *t) {
    if (!t) return;
    jnode_free(t->root);
    free(t);
}
