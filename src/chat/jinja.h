/* jinja.h — the Jinja interpreter behind chat templates (internal).
 *
 * Owns three things that the rest of src/chat/ shares:
 *   - values (`struct jv`): Python-like data (None, bool, int, float, str,
 *     list, tuple, dict, namespace, callables, loop objects, Undefined) with
 *     Python's truthiness, str()/repr(), equality and ordering, so templates
 *     print exactly what jinja2 prints. Heap parts are reference counted;
 *     a value passed to a function is borrowed unless the name says "take".
 *   - the syntax tree (`struct jnode`) that jinja_lexer.c + jinja_parser.c
 *     build once per template and that is never modified while rendering,
 *     so one compiled template can be rendered from several threads (its
 *     constants are "immortal": their reference counts are never touched).
 *   - the render context (`struct jctx`): variables, output buffer, limits
 *     (output size, steps, call depth) that make hostile templates end with
 *     an error instead of hanging or exhausting memory.
 *
 * The dialect is jinja2 as transformers configures it for apply_chat_template:
 * sandboxed and immutable (list.append, dict.update are "unsafe"),
 * trim_blocks, lstrip_blocks, loop controls, default Undefined, a tojson
 * that is Python's json.dumps(ensure_ascii=False), raise_exception and
 * strftime_now. The public entry points are at the end of this file;
 * chat_template.h builds the chat-specific context on top of them.
 */
#ifndef KILN_CHAT_JINJA_H
#define KILN_CHAT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/utf8.h"

struct kiln_error;

/* ---------------------------------------------------------------- values */

enum jv_type {
    JV_UNDEFINED = 0,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_TUPLE, /* a JV_LIST payload printed as (a, b) */
    JV_DICT,
    JV_NAMESPACE, /* a JV_DICT payload whose attributes `set` may assign */
    JV_FUNC,
    JV_LOOP,
};

struct jstr {
    int rc; /* < 0: immortal (owned by a compiled template) */
    size_t len;
    char data[]; /* NUL terminated */
};

struct jv;
struct jlist;
struct jdict;
struct jfunc;
struct jloop;

struct jv {
    enum jv_type type;
    union {
        int b;
        int64_t i;
        double f;
        struct jstr *s; /* STR; UNDEFINED: the missing name or a hint (may be NULL) */
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
        struct jloop *loop;
    } u;
};

struct jlist {
    int rc;
    size_t n, cap;
    struct jv *items;
};

/* Insertion-ordered like a Python dict; past a few entries an open
 * addressing index (slot -> entry + 1) keeps lookups constant time, since
 * request JSON may carry objects with many keys. */
struct jdict {
    int rc;
    size_t n, cap;
    struct jv *keys;
    struct jv *vals;
    size_t *index; /* NULL while small */
    size_t index_cap;
};

struct jctx;
struct jnode;
struct jargs;

typedef int (*jfunc_fn)(struct jctx *ctx, const struct jv *self, struct jargs *args, struct jv *out);

enum jfunc_kind {
    JFUNC_BUILTIN, /* fn(ctx, self, args) */
    JFUNC_MACRO,   /* node is the macro statement */
    JFUNC_CALLER,  /* node is the call block; scope is the call site (NULL once it returned) */
};

struct jscope;

struct jfunc {
    int rc;
    enum jfunc_kind kind;
    const char *name;
    jfunc_fn fn;
    struct jv self; /* bound receiver for methods, else UNDEFINED */
    const struct jnode *node;
    struct jscope *scope;
};

struct jloop {
    int rc;
    struct jv items; /* the (filtered) list being iterated */
    size_t index0;
    struct jv last_changed; /* loop.changed() memory */
    int have_changed;
};

static inline struct jv jv_undef(void) { struct jv v = {.type = JV_UNDEFINED}; return v; }
static inline struct jv jv_none(void) { struct jv v = {.type = JV_NONE}; return v; }
static inline struct jv jv_bool(int b) { struct jv v = {.type = JV_BOOL, .u.b = !!b}; return v; }
static inline struct jv jv_int(int64_t i) { struct jv v = {.type = JV_INT, .u.i = i}; return v; }
static inline struct jv jv_float(double f) { struct jv v = {.type = JV_FLOAT, .u.f = f}; return v; }

struct jv jv_str(const char *s, size_t len);
struct jv jv_cstr(const char *s);
struct jv jv_undef_named(const char *name); /* Undefined that remembers what was missing */
struct jv jv_list_new(size_t cap);
struct jv jv_dict_new(void);
struct jv jv_retain(struct jv v);
void jv_release(struct jv v);
void jv_make_immortal(struct jv v); /* only for STR constants of a template */
void jv_free_immortal(struct jv v);

void jv_list_push(struct jv list, struct jv take);
/* Borrowed pointer to the value for key, or NULL. */
struct jv *jv_dict_find(const struct jv dict, const struct jv key);
struct jv *jv_dict_find_str(const struct jv dict, const char *key);
void jv_dict_set(struct jv dict, struct jv take_key, struct jv take_val);
/* Releases every entry (breaks reference cycles at the end of a render). */
void jv_dict_clear(struct jv dict);
/* Python-compatible: values that compare equal hash equal (1 == 1.0 == True). */

int jv_is_list(const struct jv v); /* LIST or TUPLE */
int jv_is_dict(const struct jv v); /* DICT or NAMESPACE */
int jv_is_number(const struct jv v); /* BOOL, INT, FLOAT */
int jv_truthy(const struct jv v);
int jv_equal(const struct jv a, const struct jv b);
/* Python ordering: -1/0/1, or 2 when the types cannot be ordered. */
int jv_compare(const struct jv a, const struct jv b);
const char *jv_type_name(const struct jv v);
double jv_as_double(const struct jv v); /* BOOL/INT/FLOAT */

/* The text of b as a STR value; empties b. */
struct jv jv_take_buf(struct buf *b);

/* Python str(v) and repr(v) appended to b. */
void jv_write_str(struct buf *b, const struct jv v);
void jv_write_repr(struct buf *b, const struct jv v);
/* str(v) as a new STR value (retains v itself when it already is one). */
struct jv jv_to_str(const struct jv v);
void py_float_repr(double f, char out[40]);

int py_isspace(int32_t cp);

/* JSON: jansson values in, Python json.dumps formatting out. */
struct jv jv_from_json(const json_t *j);
struct jdump_opts {
    const char *indent; /* NULL: single line */
    const char *item_sep, *key_sep;
    int sort_keys;
    int ensure_ascii;
};
int jv_dump_json(struct jctx *ctx, struct buf *b, const struct jv v, const struct jdump_opts *o, int depth);

/* ------------------------------------------------------------- templates */

enum jtok_type {
    JTOK_EOF = 0,
    JTOK_DATA,
    JTOK_VAR_BEGIN,
    JTOK_VAR_END,
    JTOK_BLOCK_BEGIN,
    JTOK_BLOCK_END,
    JTOK_NAME,
    JTOK_STRING,
    JTOK_INT,
    JTOK_FLOAT,
    JTOK_OP,
};

/* Operators, as single values for the parser. */
enum jop {
    JOP_NONE = 0,
    JOP_ADD, JOP_SUB, JOP_DIV, JOP_FLOORDIV, JOP_MUL, JOP_MOD, JOP_POW, JOP_TILDE,
    JOP_LBRACKET, JOP_RBRACKET, JOP_LPAREN, JOP_RPAREN, JOP_LBRACE, JOP_RBRACE,
    JOP_EQ, JOP_NE, JOP_GT, JOP_GE, JOP_LT, JOP_LE, JOP_ASSIGN, JOP_DOT, JOP_COLON,
    JOP_PIPE, JOP_COMMA, JOP_SEMICOLON,
    /* not lexed, used in the tree */
    JOP_AND, JOP_OR, JOP_NOT, JOP_IN, JOP_NOTIN, JOP_NEG, JOP_POS,
};

struct jtoken {
    enum jtok_type type;
    enum jop op;
    int line, col;
    char *text; /* DATA, NAME, STRING (decoded); NULL otherwise */
    size_t len;
    int64_t i;
    double f;
};

struct jtokens {
    struct jtoken *v;
    size_t n, cap;
};

int jinja_lex(const char *src, size_t len, struct jtokens *out, struct kiln_error *err);
void jtokens_free(struct jtokens *t);

enum jnode_kind {
    /* expressions */
    JN_CONST, JN_NAME, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST,
    JN_UNARY, JN_BINOP, JN_COMPARE, JN_COND, JN_LIST, JN_TUPLE, JN_DICT,
    /* statements */
    JN_DATA, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK,
    JN_FILTERBLOCK, JN_BREAK, JN_CONTINUE, JN_WITH, JN_BODY,
};

struct jnodes {
    struct jnode **v;
    size_t n, cap;
};

/* One tree node; which fields mean what depends on kind (see jinja_parser.c). */
struct jnode {
    enum jnode_kind kind;
    int line, col;
    enum jop op;
    int flag;          /* TEST: negated; FOR: has filter; SLICE: which parts */
    char *name;        /* NAME, GETATTR, FILTER, TEST, MACRO; DATA text */
    size_t name_len;
    struct jv value;   /* CONST (immortal) */
    struct jnode *a, *b, *c, *d;
    struct jnodes args;    /* positional args, list items, compare operands, tuple targets */
    struct jnodes kwargs;  /* keyword values (names in kwnames), dict values */
    char **kwnames;        /* keyword names of a call; macro parameters */
    size_t nkwnames;
    struct jnodes body, else_body;
    enum jop *ops;         /* COMPARE operators */
};

struct jinja_template {
    struct jnode *root; /* JN_BODY */
};

struct jinja_limits {
    size_t max_output;  /* bytes of any one string or of the output */
    uint64_t max_steps; /* evaluation steps; bounds time */
    int max_depth;      /* nested macro calls */
};

/* Compiles template text; syntax errors read "template:LINE:COL: ...". */
int jinja_compile(struct jinja_template **out, const char *src, size_t len, struct kiln_error *err);
void jinja_free(struct jinja_template *t);

/* Renders with the variables of a JSON object (NULL: none). limits may be
 * NULL for the defaults. *out is a NUL-terminated heap string. */
int jinja_render(const struct jinja_template *t, const json_t *vars, const struct jinja_limits *limits,
                 char **out, size_t *out_len, struct kiln_error *err);

/* ------------------------------------------------------------ evaluation */

struct jscope {
    struct jscope *parent;
    struct jv vars; /* DICT */
};

struct jctx {
    struct kiln_error *err;
    int failed_positioned; /* err already names a template position */
    struct jscope *root;
    struct buf *out;
    struct jinja_limits lim;
    uint64_t steps;
    int depth;
    int nest; /* recursion of eval/exec, bounded to protect the C stack */
    int loop_ctl; /* 0, or JN_BREAK / JN_CONTINUE while unwinding */
    struct jv namespaces; /* LIST of every namespace made, to break cycles at the end */
};

/* Call arguments after evaluation: positional then keyword. */
struct jargs {
    struct jv *pos;
    size_t npos;
    const char **kwnames;
    struct jv *kw;
    size_t nkw;
    uint64_t kw_used; /* bit per keyword taken by jargs_get (at most 64 keywords) */
};

int jctx_fail(struct jctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jctx_step(struct jctx *ctx, size_t work);
int jctx_check_len(struct jctx *ctx, size_t len);

/* Fetches argument i / name (borrowed); NULL when absent. */
const struct jv *jargs_get(struct jargs *a, size_t i, const char *name);
int jargs_check(struct jctx *ctx, struct jargs *a, size_t max_pos, const char *what);

/* Filters, tests, methods and globals (jinja_filters.c, jinja_tests.c,
 * jinja_strings.c, jinja_ops.c). */
int jinja_filter_apply(struct jctx *ctx, const char *name, const struct jv *v, struct jargs *args, struct jv *out);
int jinja_test_apply(struct jctx *ctx, const char *name, const struct jv *v, struct jargs *args, int *result);
int jinja_filter_exists(const char *name);
/* Attribute lookup like the sandbox's getattr: methods first, then items. */
int jinja_getattr(struct jctx *ctx, const struct jv *obj, const char *name, size_t name_len, struct jv *out);
int jinja_getitem(struct jctx *ctx, const struct jv *obj, const struct jv *key, struct jv *out);
struct jv jinja_global(const char *name);
int jinja_call(struct jctx *ctx, const struct jv *fn, struct jargs *args, struct jv *out);
/* Iteration: materializes v as a LIST (str -> chars, dict -> keys). */
int jinja_iterate(struct jctx *ctx, const struct jv *v, struct jv *out_list);
int jinja_binop(struct jctx *ctx, enum jop op, const struct jv *a, const struct jv *b, struct jv *out);
int jinja_contains(struct jctx *ctx, const struct jv *container, const struct jv *item, int *result);
int jinja_undefined_error(struct jctx *ctx, const struct jv *u);
int jinja_call_macro(struct jctx *ctx, const struct jfunc *fn, struct jargs *args, struct jv *out);

/* String helpers shared by filters and methods. */
struct jv jstr_strip(const struct jv s, const struct jv *chars, int left, int right);
struct jv jstr_upper_lower(const struct jv s, int upper);
struct jv jstr_capitalize(const struct jv s);
struct jv jstr_replace(struct jctx *ctx, const struct jv s, const struct jv old, const struct jv rep, int64_t count);

#endif
