/* build.c — parsed rules to the compiled automaton (grammar_internal.h).
 *
 * Each rule that needs a body of its own (the root, and rules that are
 * still called after inlining) is built Thompson-style into a builder
 * graph with epsilon edges; a reference to a rule that is not already
 * being expanded on the current path is inlined (so only real recursion
 * leaves a call, and the mask cache sees whole structures within one
 * rule), unless its expansion passes INLINE_MAX states. Code point classes
 * become minimal byte automata over their UTF-8 encodings. Then epsilon
 * edges are removed, states that cannot reach a final state are trimmed,
 * and what the root reaches is numbered compactly.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar_internal.h"

#define INLINE_MAX 4096

enum { BE_EPS, BE_BYTE, BE_CALL };

struct bedge {
    uint32_t next, target, rule;
    uint8_t kind, lo, hi;
};

struct builder {
    const struct gr_parsed *p;
    uint32_t *head;
    uint32_t n_states, cap_states;
    struct bedge *edges;
    uint32_t n_edges, cap_edges;
    uint8_t *on_path, *no_inline;
    uint32_t *rule_start, *rule_end; /* per parsed rule, GR_NIL until built */
    uint32_t *queue, n_queue;        /* parsed rules to build */
    int failed;
    struct kiln_error *err;
};

static uint32_t new_state(struct builder *b) {
    if (b->n_states >= GR_MAX_STATES) {
        if (!b->failed)
            kiln_errorc(b->err, KILN_ERR_TOO_LARGE, "grammar: more than %u automaton states after expansion",
                        GR_MAX_STATES);
        b->failed = 1;
        return GR_NIL;
    }
    if (b->n_states == b->cap_states) {
        b->cap_states = b->cap_states ? b->cap_states * 2 : 256;
        b->head = xrealloc(b->head, b->cap_states * sizeof *b->head);
    }
    b->head[b->n_states] = GR_NIL;
    return b->n_states++;
}

static void add_edge(struct builder *b, uint32_t from, int kind, uint8_t lo, uint8_t hi, uint32_t rule,
                     uint32_t target) {
    if (b->n_edges == b->cap_edges) {
        b->cap_edges = b->cap_edges ? b->cap_edges * 2 : 256;
        b->edges = xrealloc(b->edges, b->cap_edges * sizeof *b->edges);
    }
    struct bedge *e = &b->edges[b->n_edges];
    e->kind = (uint8_t)kind;
    e->lo = lo;
    e->hi = hi;
    e->rule = rule;
    e->target = target;
    e->next = b->head[from];
    b->head[from] = b->n_edges++;
}

/* ---- code point classes as byte automata ---- */

struct ctrie {
    uint32_t *first, *nxt;
    uint32_t n_nodes, cap_nodes;
    uint32_t *e; /* edges: [lo, hi, child] triples */
    uint32_t n_e, cap_e;
};

#define CT_END 0u

static uint32_t ct_node(struct ctrie *t) {
    if (t->n_nodes == t->cap_nodes) {
        t->cap_nodes = t->cap_nodes ? t->cap_nodes * 2 : 32;
        t->first = xrealloc(t->first, t->cap_nodes * sizeof *t->first);
    }
    t->first[t->n_nodes] = GR_NIL;
    return t->n_nodes++;
}

static uint32_t ct_edge(struct ctrie *t, uint32_t node, uint8_t lo, uint8_t hi, uint32_t child) {
    for (uint32_t k = t->first[node]; k != GR_NIL; k = t->nxt[k])
        if (t->e[3 * k] == lo && t->e[3 * k + 1] == hi && (child == CT_END) == (t->e[3 * k + 2] == CT_END))
            return t->e[3 * k + 2];
    if (child == GR_NIL) child = ct_node(t);
    if (t->n_e == t->cap_e) {
        t->cap_e = t->cap_e ? t->cap_e * 2 : 32;
        t->e = xrealloc(t->e, 3 * t->cap_e * sizeof *t->e);
        t->nxt = xrealloc(t->nxt, t->cap_e * sizeof *t->nxt);
    }
    t->e[3 * t->n_e] = lo;
    t->e[3 * t->n_e + 1] = hi;
    t->e[3 * t->n_e + 2] = child;
    t->nxt[t->n_e] = t->first[node];
    t->first[node] = t->n_e++;
    return child;
}

static int utf8_encode(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Splits [lo, hi] until each piece is a product of byte ranges (one range
 * per byte of the encoding), and adds each piece's path to the trie. */
static void utf8_split(struct ctrie *t, uint32_t lo, uint32_t hi) {
    static const uint32_t bounds[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++) {
        if (lo <= bounds[k] && hi > bounds[k]) {
            utf8_split(t, lo, bounds[k]);
            utf8_split(t, bounds[k] + 1, hi);
            return;
        }
    }
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(t, lo, lo | m);
                utf8_split(t, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(t, lo, (hi & ~m) - 1);
                utf8_split(t, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, z);
    uint32_t node = 1; /* the root */
    for (int k = 0; k < n; k++) node = ct_edge(t, node, a[k], z[k], k == n - 1 ? CT_END : GR_NIL);
}

/* Canonical (minimized) ids bottom-up: two nodes with the same edges to the
 * same canonical children are one state. */
static uint32_t ct_canon(struct ctrie *t, uint32_t node, uint32_t *canon, uint32_t **sig, uint32_t *sig_len,
                         uint32_t *n_canon) {
    if (canon[node] != GR_NIL) return canon[node];
    uint32_t n = 0;
    for (uint32_t k = t->first[node]; k != GR_NIL; k = t->nxt[k]) n++;
    uint32_t *s = xmalloc((3 * n + 1) * sizeof *s), i = 0;
    for (uint32_t k = t->first[node]; k != GR_NIL; k = t->nxt[k]) {
        s[i++] = t->e[3 * k];
        s[i++] = t->e[3 * k + 1];
        s[i++] = ct_canon(t, t->e[3 * k + 2], canon, sig, sig_len, n_canon);
    }
    /* edges were pushed newest first; sort triples by lo for a stable signature */
    for (uint32_t x = 1; x < n; x++)
        for (uint32_t y = x; y > 0 && s[3 * y] < s[3 * (y - 1)]; y--)
            for (int w = 0; w < 3; w++) {
                uint32_t tmp = s[3 * y + w];
                s[3 * y + w] = s[3 * (y - 1) + w];
                s[3 * (y - 1) + w] = tmp;
            }
    for (uint32_t c = 0; c < *n_canon; c++) {
        if (sig_len[c] == 3 * n && memcmp(sig[c], s, 3 * n * sizeof *s) == 0) {
            free(s);
            return canon[node] = c;
        }
    }
    sig[*n_canon] = s;
    sig_len[*n_canon] = 3 * n;
    return canon[node] = (*n_canon)++;
}

/* The minimal byte automaton of a class, as (lo, hi, target) triples per
 * state: state 0 is the start, state n_states - 1 the end. */
struct class_dfa {
    uint32_t n_states;
    uint32_t *off; /* [n_states + 1] into trip, in triples */
    uint32_t *trip;
};

static void class_dfa_make(const struct gr_ast *a, struct class_dfa *out) {
    struct ctrie t = {0};
    ct_node(&t); /* CT_END */
    ct_node(&t); /* the root */
    for (uint32_t k = 0; k < a->n_ranges; k++) utf8_split(&t, a->ranges[2 * k], a->ranges[2 * k + 1]);
    uint32_t *canon = xmalloc(t.n_nodes * sizeof *canon);
    for (uint32_t k = 0; k < t.n_nodes; k++) canon[k] = GR_NIL;
    uint32_t **sig = xcalloc(t.n_nodes, sizeof *sig), *sig_len = xcalloc(t.n_nodes, sizeof *sig_len), n_canon = 0;
    uint32_t end = ct_canon(&t, CT_END, canon, sig, sig_len, &n_canon);
    uint32_t root = ct_canon(&t, 1, canon, sig, sig_len, &n_canon);
    /* renumber: root first, end last */
    uint32_t *num = xmalloc(n_canon * sizeof *num), next = 1;
    for (uint32_t c = 0; c < n_canon; c++) num[c] = c == root ? 0 : c == end ? n_canon - 1 : next++;
    out->n_states = n_canon;
    out->off = xcalloc(n_canon + 1, sizeof *out->off);
    uint32_t total = 0;
    for (uint32_t c = 0; c < n_canon; c++) total += sig_len[c];
    out->trip = xmalloc((total + 1) * sizeof *out->trip);
    uint32_t *at = xcalloc(n_canon, sizeof *at);
    for (uint32_t c = 0; c < n_canon; c++) out->off[num[c] + 1] = sig_len[c] / 3;
    for (uint32_t k = 0; k < n_canon; k++) out->off[k + 1] += out->off[k];
    for (uint32_t c = 0; c < n_canon; c++)
        for (uint32_t k = 0; k < sig_len[c]; k += 3) {
            uint32_t *o = out->trip + 3 * (out->off[num[c]] + at[num[c]]++);
            o[0] = sig[c][k];
            o[1] = sig[c][k + 1];
            o[2] = num[sig[c][k + 2]];
        }
    for (uint32_t c = 0; c < n_canon; c++) free(sig[c]);
    free(at);
    free(num);
    free(sig);
    free(sig_len);
    free(canon);
    free(t.first);
    free(t.nxt);
    free(t.e);
}

static uint32_t build_class(struct builder *b, const struct gr_ast *a, uint32_t from) {
    if (a->n_ranges == 0) return new_state(b); /* matches nothing: an end no edge reaches */
    struct gr_ast *memo = (struct gr_ast *)a; /* the automaton is made once per class node */
    if (!memo->class_dfa) {
        memo->class_dfa = xcalloc(1, sizeof(struct class_dfa));
        class_dfa_make(a, memo->class_dfa);
    }
    const struct class_dfa *dfa = memo->class_dfa;
    uint32_t n = dfa->n_states, base = b->n_states;
    for (uint32_t k = 1; k < n; k++)
        if (new_state(b) == GR_NIL) return GR_NIL;
    /* state k of the automaton is `from` for k == 0, else base + k - 1 */
    for (uint32_t k = 0; k < n; k++)
        for (uint32_t e = dfa->off[k]; e < dfa->off[k + 1]; e++) {
            const uint32_t *t3 = dfa->trip + 3 * e;
            add_edge(b, k ? base + k - 1 : from, BE_BYTE, (uint8_t)t3[0], (uint8_t)t3[1], 0, base + t3[2] - 1);
        }
    return base + n - 2;
}

void gr_class_dfa_free(void *p) {
    struct class_dfa *d = p;
    if (!d) return;
    free(d->off);
    free(d->trip);
    free(d);
}

/* ---- Thompson construction; a fragment never adds an edge into `from` ---- */

static uint32_t build(struct builder *b, const struct gr_ast *a, uint32_t from);

static uint32_t build_ref(struct builder *b, const struct gr_ast *a, uint32_t from) {
    uint32_t q = (uint32_t)a->rule;
    if (!b->on_path[q] && !b->no_inline[q]) {
        uint32_t st_mark = b->n_states, ed_mark = b->n_edges, head = b->head[from];
        b->on_path[q] = 1;
        uint32_t end = build(b, b->p->rules[q].body, from);
        b->on_path[q] = 0;
        if (b->failed) return GR_NIL;
        if (b->n_states - st_mark <= INLINE_MAX) return end;
        b->n_states = st_mark;
        b->n_edges = ed_mark;
        b->head[from] = head;
        b->no_inline[q] = 1;
    }
    if (b->rule_start[q] == GR_NIL) {
        b->rule_start[q] = 0; /* queued */
        b->queue[b->n_queue++] = q;
    }
    uint32_t end = new_state(b);
    if (end == GR_NIL) return GR_NIL;
    add_edge(b, from, BE_CALL, 0, 0, q, end);
    return end;
}

static uint32_t build(struct builder *b, const struct gr_ast *a, uint32_t from) {
    if (from == GR_NIL) return GR_NIL;
    switch (a->kind) {
    case GR_AST_BYTES: {
        uint32_t cur = from;
        for (uint32_t k = 0; k < a->n_bytes; k++) {
            uint32_t nx = new_state(b);
            if (nx == GR_NIL) return GR_NIL;
            add_edge(b, cur, BE_BYTE, a->bytes[k], a->bytes[k], 0, nx);
            cur = nx;
        }
        return cur;
    }
    case GR_AST_CLASS: return build_class(b, a, from);
    case GR_AST_SEQ: {
        uint32_t cur = from;
        for (uint32_t k = 0; k < a->n_kids && cur != GR_NIL; k++) cur = build(b, a->kids[k], cur);
        return cur;
    }
    case GR_AST_ALT: {
        uint32_t end = new_state(b);
        for (uint32_t k = 0; k < a->n_kids && end != GR_NIL; k++) {
            uint32_t e = build(b, a->kids[k], from);
            if (e == GR_NIL) return GR_NIL;
            add_edge(b, e, BE_EPS, 0, 0, 0, end);
        }
        return end;
    }
    case GR_AST_REF: return build_ref(b, a, from);
    case GR_AST_REPEAT: {
        uint32_t cur = from;
        if (a->min == 1 && a->max < 0) { /* x+: one copy, its end loops back to a fresh start */
            uint32_t loop = new_state(b);
            if (loop == GR_NIL) return GR_NIL;
            add_edge(b, from, BE_EPS, 0, 0, 0, loop);
            uint32_t e = build(b, a->kids[0], loop), end = new_state(b);
            if (e == GR_NIL || end == GR_NIL) return GR_NIL;
            add_edge(b, e, BE_EPS, 0, 0, 0, end);
            add_edge(b, end, BE_EPS, 0, 0, 0, loop);
            return end;
        }
        for (int k = 0; k < a->min && cur != GR_NIL; k++) cur = build(b, a->kids[0], cur);
        if (cur == GR_NIL) return GR_NIL;
        if (a->max < 0) { /* a loop through a fresh state, so `cur` gets no edge back */
            uint32_t loop = new_state(b), end = new_state(b);
            if (end == GR_NIL) return GR_NIL;
            add_edge(b, cur, BE_EPS, 0, 0, 0, loop);
            uint32_t e = build(b, a->kids[0], loop);
            if (e == GR_NIL) return GR_NIL;
            add_edge(b, e, BE_EPS, 0, 0, 0, loop);
            add_edge(b, loop, BE_EPS, 0, 0, 0, end);
            return end;
        }
        if (a->max == a->min) return cur;
        /* nested optionals (x (x (x)?)?)?: one way to match each count */
        uint32_t end = new_state(b);
        if (end == GR_NIL) return GR_NIL;
        add_edge(b, cur, BE_EPS, 0, 0, 0, end);
        for (int k = a->min; k < a->max; k++) {
            cur = build(b, a->kids[0], cur);
            if (cur == GR_NIL) return GR_NIL;
            add_edge(b, cur, BE_EPS, 0, 0, 0, end);
        }
        return end;
    }
    }
    return GR_NIL;
}

/* ---- epsilon removal, trimming, numbering ---- */

struct raw {
    struct gr_state *states;
    uint32_t n_states, cap_states;
    struct gr_edge *edges;
    uint32_t n_edges, cap_edges;
    struct gr_call *calls;
    uint32_t n_calls, cap_calls;
    uint64_t work; /* builder edges visited by the epsilon closures */
};

/* The epsilon closures' total work (and so the edges they can make): a
 * repetition of a repetition of an optional part ("a{164}{1,34}{1,3}" with
 * a nullable a) lets every state skip to every later copy, quadratic in
 * the copies; past this the grammar is refused rather than built. */
#define GR_MAX_EPS_WORK (1ull << 22)

static int cmp_edge(const void *x, const void *y) {
    const struct gr_edge *a = x, *b = y;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    if (a->hi != b->hi) return a->hi < b->hi ? -1 : 1;
    return a->target < b->target ? -1 : a->target > b->target;
}

/* The eps-free state for builder state q of parsed rule r (rule qi of the
 * output): edges of every
 * state q reaches by epsilon edges. map[] gives builder states their raw
 * ids (queued in `pending` when new). */
static void eps_state(struct builder *b, struct raw *rw, uint32_t q, uint32_t r, uint32_t qi, uint32_t *map,
                      uint32_t *stamp,
                      uint32_t gen, struct gr_vec *stack, struct gr_vec *pending) {
    uint32_t id = map[q];
    struct gr_state *st = &rw->states[id];
    st->edge_off = rw->n_edges;
    st->call_off = rw->n_calls;
    st->final = 0;
    stack->n = 0;
    gr_vec_push(stack, q);
    stamp[q] = gen;
    while (stack->n) {
        uint32_t s = stack->v[--stack->n];
        if (s == b->rule_end[r]) st = &rw->states[id], st->final = 1;
        for (uint32_t k = b->head[s]; k != GR_NIL; k = b->edges[k].next) {
            const struct bedge *e = &b->edges[k];
            if (++rw->work > GR_MAX_EPS_WORK) break;
            if (e->kind == BE_EPS) {
                if (stamp[e->target] != gen) {
                    stamp[e->target] = gen;
                    gr_vec_push(stack, e->target);
                }
                continue;
            }
            if (map[e->target] == GR_NIL) {
                if (rw->n_states == rw->cap_states) {
                    rw->cap_states = rw->cap_states * 2 + 64;
                    rw->states = xrealloc(rw->states, rw->cap_states * sizeof *rw->states);
                }
                map[e->target] = rw->n_states;
                rw->states[rw->n_states].rule = qi;
                rw->n_states++;
                gr_vec_push(pending, e->target);
            }
            if (e->kind == BE_BYTE) {
                if (rw->n_edges == rw->cap_edges) {
                    rw->cap_edges = rw->cap_edges * 2 + 64;
                    rw->edges = xrealloc(rw->edges, rw->cap_edges * sizeof *rw->edges);
                }
                rw->edges[rw->n_edges++] = (struct gr_edge){e->lo, e->hi, map[e->target]};
            } else {
                if (rw->n_calls == rw->cap_calls) {
                    rw->cap_calls = rw->cap_calls * 2 + 64;
                    rw->calls = xrealloc(rw->calls, rw->cap_calls * sizeof *rw->calls);
                }
                rw->calls[rw->n_calls++] = (struct gr_call){e->rule, map[e->target]};
            }
        }
    }
    st = &rw->states[id];
    st->n_edges = rw->n_edges - st->edge_off;
    st->n_calls = rw->n_calls - st->call_off;
    /* sort, drop duplicates, merge touching ranges with one target */
    struct gr_edge *ed = st->n_edges ? rw->edges + st->edge_off : NULL;
    if (st->n_edges > 1) qsort(ed, st->n_edges, sizeof *ed, cmp_edge);
    uint32_t m = 0;
    for (uint32_t k = 0; k < st->n_edges; k++) {
        if (m && ed[m - 1].target == ed[k].target && ed[k].lo <= ed[m - 1].hi + 1u) {
            if (ed[k].hi > ed[m - 1].hi) ed[m - 1].hi = ed[k].hi;
            continue;
        }
        ed[m++] = ed[k];
    }
    st->n_edges = m;
    rw->n_edges = st->edge_off + m;
    struct gr_call *ca = st->n_calls ? rw->calls + st->call_off : NULL;
    m = 0;
    for (uint32_t k = 0; k < st->n_calls; k++) {
        int dup = 0;
        for (uint32_t j = 0; j < m && !dup; j++) dup = ca[j].rule == ca[k].rule && ca[j].ret == ca[k].ret;
        if (!dup) ca[m++] = ca[k];
    }
    st->n_calls = m;
    rw->n_calls = st->call_off + m;
}

static void compute_follow(struct grammar *g);

struct grammar *gr_build(const struct gr_parsed *p, const char *root, int *empty, struct kiln_error *err) {
    int root_rule = -1;
    for (uint32_t k = 0; k < p->n_rules; k++)
        if (strcmp(p->rules[k].name, root) == 0) root_rule = (int)k;
    if (root_rule < 0) {
        kiln_errorf(err, "grammar: the root rule '%s' is not defined", root);
        return NULL;
    }
    uint32_t nr = p->n_rules;
    struct builder b = {.p = p, .err = err};
    b.on_path = xcalloc(nr, 1);
    b.no_inline = xcalloc(nr, 1);
    b.rule_start = xmalloc(nr * sizeof *b.rule_start);
    b.rule_end = xmalloc(nr * sizeof *b.rule_end);
    b.queue = xmalloc(nr * sizeof *b.queue);
    for (uint32_t k = 0; k < nr; k++) b.rule_start[k] = b.rule_end[k] = GR_NIL;
    b.rule_start[root_rule] = 0;
    b.queue[b.n_queue++] = (uint32_t)root_rule;
    for (uint32_t qi = 0; qi < b.n_queue && !b.failed; qi++) {
        uint32_t r = b.queue[qi];
        uint32_t s = new_state(&b);
        if (s == GR_NIL) break;
        b.rule_start[r] = s;
        b.on_path[r] = 1;
        b.rule_end[r] = build(&b, p->rules[r].body, s);
        b.on_path[r] = 0;
    }
    struct grammar *g = NULL;
    struct raw rw = {0};
    uint32_t *map = NULL, *stamp = NULL, *rule_id = NULL;
    struct gr_vec stack = {0}, pending = {0};
    if (b.failed) goto done;

    /* raw states: every rule start, then whatever byte and call edges reach */
    map = xmalloc(b.n_states * sizeof *map);
    stamp = xcalloc(b.n_states, sizeof *stamp);
    for (uint32_t k = 0; k < b.n_states; k++) map[k] = GR_NIL;
    rule_id = xmalloc(nr * sizeof *rule_id);
    for (uint32_t k = 0; k < nr; k++) rule_id[k] = GR_NIL;
    uint32_t gen = 0;
    for (uint32_t qi = 0; qi < b.n_queue; qi++) {
        uint32_t r = b.queue[qi];
        rule_id[r] = qi;
        if (rw.n_states == rw.cap_states) {
            rw.cap_states = rw.cap_states * 2 + 64;
            rw.states = xrealloc(rw.states, rw.cap_states * sizeof *rw.states);
        }
        map[b.rule_start[r]] = rw.n_states;
        rw.states[rw.n_states].rule = qi;
        rw.n_states++;
        pending.n = 0;
        gr_vec_push(&pending, b.rule_start[r]);
        for (uint32_t pi = 0; pi < pending.n && rw.work <= GR_MAX_EPS_WORK; pi++)
            eps_state(&b, &rw, pending.v[pi], r, qi, map, stamp, ++gen, &stack, &pending);
    }
    if (rw.work > GR_MAX_EPS_WORK) {
        kiln_errorc(err, KILN_ERR_TOO_LARGE,
                    "grammar: too large once its empty steps are removed (more than %llu edge visits: "
                    "nested repetitions of a part that can be empty?)",
                    (unsigned long long)GR_MAX_EPS_WORK);
        goto done;
    }
    for (uint32_t k = 0; k < rw.n_calls; k++) rw.calls[k].rule = rule_id[rw.calls[k].rule];
    uint32_t *start = xmalloc(b.n_queue * sizeof *start);
    for (uint32_t qi = 0; qi < b.n_queue; qi++) start[qi] = map[b.rule_start[b.queue[qi]]];

    /* live: the state can reach a final state of its rule */
    uint8_t *live = xcalloc(rw.n_states, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = rw.n_states; s-- > 0;) {
            if (live[s]) continue;
            const struct gr_state *st = &rw.states[s];
            int l = st->final;
            for (uint32_t k = 0; k < st->n_edges && !l; k++) l = live[rw.edges[st->edge_off + k].target];
            for (uint32_t k = 0; k < st->n_calls && !l; k++) {
                const struct gr_call *c = &rw.calls[st->call_off + k];
                l = live[start[c->rule]] && live[c->ret];
            }
            if (l) live[s] = 1, changed = 1;
        }
    }
    uint32_t root_start = start[0];
    if (!live[root_start]) {
        kiln_errorf(err, "grammar: the root rule '%s' matches no text at all", root);
        if (empty) *empty = 1;
        free(live);
        free(start);
        goto done;
    }
    /* what the root reaches over live edges, numbered in order of discovery */
    uint32_t *num = xmalloc(rw.n_states * sizeof *num);
    for (uint32_t k = 0; k < rw.n_states; k++) num[k] = GR_NIL;
    uint32_t *rnum = xmalloc(b.n_queue * sizeof *rnum);
    for (uint32_t k = 0; k < b.n_queue; k++) rnum[k] = GR_NIL;
    struct gr_vec order = {0};
    num[root_start] = 0;
    gr_vec_push(&order, root_start);
    uint32_t n_rules = 0;
    rnum[0] = n_rules++;
    uint32_t n_edges = 0, n_calls = 0;
    for (uint32_t oi = 0; oi < order.n; oi++) {
        const struct gr_state *st = &rw.states[order.v[oi]];
        for (uint32_t k = 0; k < st->n_edges; k++) {
            uint32_t t = rw.edges[st->edge_off + k].target;
            if (!live[t]) continue;
            n_edges++;
            if (num[t] == GR_NIL) num[t] = order.n, gr_vec_push(&order, t);
        }
        for (uint32_t k = 0; k < st->n_calls; k++) {
            const struct gr_call *c = &rw.calls[st->call_off + k];
            if (!live[start[c->rule]] || !live[c->ret]) continue;
            n_calls++;
            if (rnum[c->rule] == GR_NIL) rnum[c->rule] = n_rules++;
            uint32_t t = start[c->rule];
            if (num[t] == GR_NIL) num[t] = order.n, gr_vec_push(&order, t);
            t = c->ret;
            if (num[t] == GR_NIL) num[t] = order.n, gr_vec_push(&order, t);
        }
    }
    g = xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->lock, NULL);
    g->n_states = order.n;
    g->states = xcalloc(order.n, sizeof *g->states);
    g->edges = xmalloc((n_edges + 1) * sizeof *g->edges);
    g->calls = xmalloc((n_calls + 1) * sizeof *g->calls);
    g->n_rules = n_rules;
    g->rules = xcalloc(n_rules, sizeof *g->rules);
    for (uint32_t qi = 0; qi < b.n_queue; qi++) {
        if (rnum[qi] == GR_NIL) continue;
        g->rules[rnum[qi]].name = xstrdup(p->rules[b.queue[qi]].name);
        g->rules[rnum[qi]].start = num[start[qi]];
    }
    g->root = 0;
    for (uint32_t oi = 0; oi < order.n; oi++) {
        const struct gr_state *st = &rw.states[order.v[oi]];
        struct gr_state *o = &g->states[oi];
        o->final = st->final;
        o->rule = rnum[st->rule];
        o->edge_off = g->n_edges;
        for (uint32_t k = 0; k < st->n_edges; k++) {
            struct gr_edge e = rw.edges[st->edge_off + k];
            if (!live[e.target]) continue;
            e.target = num[e.target];
            g->edges[g->n_edges++] = e;
        }
        o->n_edges = g->n_edges - o->edge_off;
        o->call_off = g->n_calls;
        for (uint32_t k = 0; k < st->n_calls; k++) {
            struct gr_call c = rw.calls[st->call_off + k];
            if (!live[start[c.rule]] || !live[c.ret]) continue;
            g->calls[g->n_calls++] = (struct gr_call){rnum[c.rule], num[c.ret]};
        }
        o->n_calls = g->n_calls - o->call_off;
    }
    compute_follow(g);
    free(num);
    free(rnum);
    gr_vec_free(&order);
    free(live);
    free(start);
done:
    free(rw.states);
    free(rw.edges);
    free(rw.calls);
    free(map);
    free(stamp);
    free(rule_id);
    gr_vec_free(&stack);
    gr_vec_free(&pending);
    free(b.head);
    free(b.edges);
    free(b.on_path);
    free(b.no_inline);
    free(b.rule_start);
    free(b.rule_end);
    free(b.queue);
    return g;
}

static int set_or(uint32_t *dst, const uint32_t *src) {
    int changed = 0;
    for (int w = 0; w < 8; w++) {
        uint32_t x = dst[w] | src[w];
        changed |= x != dst[w];
        dst[w] = x;
    }
    return changed;
}

/* FOLLOW sets of the rules, as in LL(1) parsing: what a state can read
 * first (its edges, its callees' first bytes, and past nullable callees),
 * then for each call what the return state reads first, and past a
 * return state that can complete, what follows the caller's rule. */
static void compute_follow(struct grammar *g) {
    uint32_t n = g->n_states;
    uint8_t *nullable = xcalloc(n, 1);
    uint32_t(*first)[8] = xcalloc(n, sizeof *first);
    g->follow = xcalloc(g->n_rules, sizeof *g->follow);
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = n; s-- > 0;) {
            const struct gr_state *st = &g->states[s];
            if (nullable[s]) continue;
            int nl = st->final;
            for (uint32_t k = 0; k < st->n_calls && !nl; k++) {
                const struct gr_call *c = &g->calls[st->call_off + k];
                nl = nullable[g->rules[c->rule].start] && nullable[c->ret];
            }
            if (nl) nullable[s] = 1, changed = 1;
        }
    }
    for (uint32_t s = 0; s < n; s++) {
        const struct gr_state *st = &g->states[s];
        for (uint32_t k = 0; k < st->n_edges; k++) {
            const struct gr_edge *e = &g->edges[st->edge_off + k];
            for (uint32_t b = e->lo; b <= e->hi; b++) first[s][b >> 5] |= 1u << (b & 31);
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = n; s-- > 0;) {
            const struct gr_state *st = &g->states[s];
            for (uint32_t k = 0; k < st->n_calls; k++) {
                const struct gr_call *c = &g->calls[st->call_off + k];
                uint32_t cs = g->rules[c->rule].start;
                changed |= set_or(first[s], first[cs]);
                if (nullable[cs]) changed |= set_or(first[s], first[c->ret]);
            }
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = 0; s < n; s++) {
            const struct gr_state *st = &g->states[s];
            for (uint32_t k = 0; k < st->n_calls; k++) {
                const struct gr_call *c = &g->calls[st->call_off + k];
                changed |= set_or(g->follow[c->rule], first[c->ret]);
                if (nullable[c->ret]) changed |= set_or(g->follow[c->rule], g->follow[st->rule]);
            }
        }
    }
    free(nullable);
    free(first);
}

struct grammar *grammar_compile_ebnf_empty(const char *text, size_t len, const char *root, int *empty,
                                           struct kiln_error *err) {
    struct gr_parsed p;
    if (empty) *empty = 0;
    if (!text) text = "";
    if (gr_parse(text, len, &p, err)) {
        gr_parsed_free(&p);
        return NULL;
    }
    struct grammar *g = gr_build(&p, root ? root : "root", empty, err);
    gr_parsed_free(&p);
    return g;
}

struct grammar *grammar_compile_ebnf(const char *text, size_t len, const char *root, struct kiln_error *err) {
    return grammar_compile_ebnf_empty(text, len, root, NULL, err);
}

void grammar_ref(struct grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
}

void grammar_unref(struct grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    while (g->caches) {
        struct gr_cache *c = g->caches;
        g->caches = *(struct gr_cache **)c; /* next is the cache's first field */
        gr_cache_free(c);
    }
    pthread_mutex_destroy(&g->lock);
    for (uint32_t k = 0; k < g->n_rules; k++) free(g->rules[k].name);
    free(g->rules);
    free(g->follow);
    free(g->states);
    free(g->edges);
    free(g->calls);
    free(g);
}
