/* grammar_internal.h — the compiled form of a grammar and the stack
 * machinery shared by the compiler (ebnf.c, build.c), the matcher
 * (matcher.c) and the token masks (mask.c). Not part of the API.
 *
 * A compiled grammar is a set of rules, each a nondeterministic automaton
 * over bytes whose states live in one array. A state has byte edges
 * (a byte range and a target state of the same rule), call edges (start
 * rule R; when R completes, go on at a return state of this rule) and a
 * final flag (the rule may complete here). Epsilon edges are gone at
 * compile time, and rules that are not recursive through the reference
 * being compiled are inlined, so calls remain only where the grammar
 * really nests.
 *
 * A parse position is a stack of states: the top is where the innermost
 * rule is, each state below is where its caller resumes. Stacks are
 * hash-consed nodes (state, parent) in an arena, so equal stacks are one
 * node id and sharing tails costs nothing; a matcher's position is a set of
 * node ids whose top states all have byte edges (the "closed" set: calls
 * expanded, completed rules popped). Node 0 is the bottom under the root
 * rule (popping to it means the grammar may end); node 1 is the bottom the
 * mask cache uses for "whatever the caller's context is".
 */
#ifndef KILN_GRAMMAR_GRAMMAR_INTERNAL_H
#define KILN_GRAMMAR_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

struct kiln_error;

#define GR_NIL 0xffffffffu
#define GR_NODE_ROOT 0u     /* below the root rule */
#define GR_NODE_CONTEXT 1u  /* below the rule under test when building the mask cache */

/* Limits that keep compile time and memory bounded; a grammar past them is
 * refused with a message saying which. */
#define GR_MAX_STATES (1u << 20)   /* automaton states after expansion */
#define GR_MAX_REPEAT 100000       /* the largest m or n of {m,n} */
#define GR_MAX_STACKS 1024         /* stacks in one position (ambiguity) */

struct gr_edge {
    uint8_t lo, hi;
    uint32_t target;
};

struct gr_call {
    uint32_t rule;
    uint32_t ret;
};

struct gr_state {
    uint32_t edge_off, n_edges; /* into grammar.edges, sorted by lo */
    uint32_t call_off, n_calls; /* into grammar.calls */
    uint32_t rule;              /* the rule this state belongs to */
    uint8_t final;
};

struct gr_rule {
    char *name;
    uint32_t start;
};

struct gr_cache;

struct grammar {
    atomic_int refs;
    struct gr_state *states;
    uint32_t n_states;
    struct gr_edge *edges;
    uint32_t n_edges;
    struct gr_call *calls;
    uint32_t n_calls;
    struct gr_rule *rules; /* the rules that kept a body of their own */
    uint32_t n_rules;
    uint32_t root; /* index into rules */
    /* per rule: the bytes that may come right after it completes, in any
     * context (256-bit sets); lets the mask cache reject tokens that
     * finish a rule and go on with a byte no caller takes */
    uint32_t (*follow)[8];
    /* per-vocabulary mask caches (mask.c), built under the lock */
    pthread_mutex_t lock;
    struct gr_cache *caches;
};

/* ---- the parsed grammar (ebnf.c), compiled by build.c ---- */

enum gr_ast_kind { GR_AST_SEQ, GR_AST_ALT, GR_AST_BYTES, GR_AST_CLASS, GR_AST_REF, GR_AST_REPEAT };

struct gr_ast {
    enum gr_ast_kind kind;
    uint32_t pos; /* byte offset in the text, for messages */
    uint32_t n_kids;
    struct gr_ast **kids; /* SEQ, ALT; REPEAT has one */
    uint8_t *bytes;       /* BYTES: the literal's UTF-8 */
    uint32_t n_bytes;
    uint32_t *ranges; /* CLASS: sorted disjoint [lo, hi] code point pairs, no surrogates */
    uint32_t n_ranges;
    char *name; /* REF */
    int rule;   /* REF: the rule's index once resolved */
    int min, max; /* REPEAT; max -1: unbounded */
    void *class_dfa; /* CLASS: its byte automaton, made by build.c on first use */
};

struct gr_ast_rule {
    char *name;
    uint32_t pos;
    struct gr_ast *body;
};

struct gr_parsed {
    const char *text;
    size_t len;
    struct gr_ast_rule *rules;
    uint32_t n_rules, cap_rules;
    struct gr_ast **all; /* every node, for freeing */
    uint32_t n_all, cap_all;
};

/* Parses EBNF text into rules, resolves references and checks them
 * (undefined names, duplicates, left recursion). 0 or -1 with err set. */
int gr_parse(const char *text, size_t len, struct gr_parsed *p, struct kiln_error *err);
void gr_parsed_free(struct gr_parsed *p);
/* "grammar:LINE:COL: " prefix for the byte offset pos. */
int gr_errorf_at(struct kiln_error *err, const char *text, size_t len, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* build.c: the automaton of a parsed grammar, root rule `root`. */
void gr_class_dfa_free(void *p);
struct grammar *gr_build(const struct gr_parsed *p, const char *root, int *empty, struct kiln_error *err);

/* ---- the stack arena (matcher.c) ---- */

struct gr_node {
    uint32_t state, parent;
    uint32_t next;  /* hash chain, newest first */
    uint32_t stamp; /* closure visit mark */
};

struct gr_arena {
    struct gr_node *nodes;
    uint32_t n, cap;
    uint32_t *buckets;
    uint32_t n_buckets; /* power of two */
    uint32_t gen;
};

struct gr_vec {
    uint32_t *v;
    uint32_t n, cap;
};

void gr_vec_push(struct gr_vec *v, uint32_t x);
void gr_vec_free(struct gr_vec *v);

void gr_arena_init(struct gr_arena *a);
void gr_arena_free(struct gr_arena *a);
uint32_t gr_arena_intern(struct gr_arena *a, uint32_t state, uint32_t parent);
/* Drops every node made after `mark` (= a->n at the time). */
void gr_arena_rollback(struct gr_arena *a, uint32_t mark);

#define GR_FLAG_END 1u     /* a path popped to GR_NODE_ROOT: the grammar may end */
#define GR_FLAG_CONTEXT 2u /* a path popped to GR_NODE_CONTEXT */
#define GR_FLAG_OVERFLOW 4u /* more than GR_MAX_STACKS stacks */

/* Appends to `out` the closed set reached from the nodes of `from` over
 * byte b (each node's top state must have byte edges). Returns the flags
 * of the closure. `work` is scratch. */
uint32_t gr_advance(const struct grammar *g, struct gr_arena *a, const uint32_t *from, uint32_t n_from,
                    uint8_t b, struct gr_vec *work, struct gr_vec *out);
/* The closed set of the stacks in `work` (consumed), appended to out. */
uint32_t gr_closure(const struct grammar *g, struct gr_arena *a, struct gr_vec *work, struct gr_vec *out);

/* ---- vocabulary trie and masks (mask.c) ---- */

struct gr_trie_node {
    uint32_t end;       /* index past this node's subtree (preorder) */
    uint32_t tok_begin; /* tokens ending here: vocab.order[tok_begin..tok_end) */
    uint32_t tok_end;
    uint16_t depth; /* 1 for a token's first byte */
    uint8_t byte;
};

struct grammar_vocab {
    uint64_t id; /* unique for the process's life: caches key on it */
    int n_tokens;
    char **bytes; /* [n_tokens], NULL when never allowed */
    uint32_t *lens;
    /* tokens that may match, sorted by bytes; rank[t] = position in order */
    uint32_t *order;
    uint32_t n_order;
    uint32_t *rank;
    struct gr_trie_node *trie;
    uint32_t n_trie;
    uint32_t max_len;
};

struct grammar_matcher {
    struct grammar *g;
    const struct grammar_vocab *v;
    struct gr_arena arena;
    struct gr_vec cur;  /* the closed set */
    uint32_t can_end;
    uint32_t gc_at; /* arena size that triggers a collection */
    struct gr_vec work, tmp, tmp2;
    /* mask scratch: one set per trie depth */
    struct gr_vec lv_nodes;
    uint32_t *lv_off, *lv_mark, *lv_flags;
    uint32_t lv_cap;
    struct gr_cache *cache; /* NULL until first fill_mask */
    int use_cache;
    /* set when a step passed GR_MAX_STACKS (the step was refused); masks
     * near such a step may offer tokens whose step is then refused */
    int overflowed;
};

/* Fills the mask by walking the whole trie from the current set, without
 * the cache (tests compare it with the cached path). */
void gr_levels_reserve(struct grammar_matcher *m, uint32_t depth);
void gr_levels_start(struct grammar_matcher *m, const uint32_t *set, uint32_t n);
uint32_t gr_level_step(struct grammar_matcher *m, uint32_t d, uint8_t b);
void gr_fill_mask_nocache(struct grammar_matcher *m, uint32_t *bits);
void gr_cache_free(struct gr_cache *c);

#endif
