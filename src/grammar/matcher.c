/* matcher.c — the hash-consed stack arena, the closure of a set of stacks
 * (calls expanded, completed rules popped), the step over one byte, and the
 * matcher API on top of them.
 *
 * Left recursion is refused at compile time, so the rules a closure can
 * enter without consuming a byte form no cycle: every closure is finite.
 * Nullable rules and loops through them only revisit stacks, which the
 * per-closure visit stamp drops. Ambiguity is bounded by GR_MAX_STACKS:
 * a step that would pass it is refused like a byte the grammar does not
 * allow. The mask cache does not see that bound (it works on one stack at a
 * time), so at such a step a mask may offer a token whose step is then
 * refused; callers treat a refused accept_token as the end of the
 * constraint's reach (the matcher records it in `overflowed`).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar_internal.h"

void gr_vec_push(struct gr_vec *v, uint32_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = xrealloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = x;
}

void gr_vec_free(struct gr_vec *v) {
    free(v->v);
    memset(v, 0, sizeof *v);
}

static inline uint32_t node_hash(uint32_t state, uint32_t parent) {
    uint32_t h = state * 0x9E3779B1u ^ (parent + 0x7F4A7C15u) * 0x85EBCA77u;
    return h ^ h >> 15;
}

static void rehash(struct gr_arena *a, uint32_t n_buckets) {
    free(a->buckets);
    a->n_buckets = n_buckets;
    a->buckets = xmalloc(n_buckets * sizeof *a->buckets);
    memset(a->buckets, 0xff, n_buckets * sizeof *a->buckets);
    /* ascending ids, each put in front: chains stay newest first, as rollback needs */
    for (uint32_t id = 2; id < a->n; id++) {
        struct gr_node *nd = &a->nodes[id];
        uint32_t h = node_hash(nd->state, nd->parent) & (n_buckets - 1);
        nd->next = a->buckets[h];
        a->buckets[h] = id;
    }
}

void gr_arena_init(struct gr_arena *a) {
    memset(a, 0, sizeof *a);
    a->cap = 1024;
    a->nodes = xmalloc(a->cap * sizeof *a->nodes);
    for (uint32_t k = 0; k < 2; k++) a->nodes[k] = (struct gr_node){GR_NIL, GR_NIL, GR_NIL, 0};
    a->n = 2;
    a->gen = 1;
    rehash(a, 1024);
}

void gr_arena_free(struct gr_arena *a) {
    free(a->nodes);
    free(a->buckets);
    memset(a, 0, sizeof *a);
}

uint32_t gr_arena_intern(struct gr_arena *a, uint32_t state, uint32_t parent) {
    uint32_t h = node_hash(state, parent);
    for (uint32_t id = a->buckets[h & (a->n_buckets - 1)]; id != GR_NIL; id = a->nodes[id].next)
        if (a->nodes[id].state == state && a->nodes[id].parent == parent) return id;
    if (a->n == a->cap) {
        a->cap *= 2;
        a->nodes = xrealloc(a->nodes, a->cap * sizeof *a->nodes);
    }
    uint32_t id = a->n++;
    uint32_t b = h & (a->n_buckets - 1);
    a->nodes[id] = (struct gr_node){state, parent, a->buckets[b], 0};
    a->buckets[b] = id;
    if (a->n > a->n_buckets) rehash(a, a->n_buckets * 2);
    return id;
}

void gr_arena_rollback(struct gr_arena *a, uint32_t mark) {
    while (a->n > mark) {
        uint32_t id = --a->n;
        const struct gr_node *nd = &a->nodes[id];
        uint32_t b = node_hash(nd->state, nd->parent) & (a->n_buckets - 1);
        KILN_ASSERT(a->buckets[b] == id);
        a->buckets[b] = nd->next;
    }
}

uint32_t gr_closure(const struct grammar *g, struct gr_arena *a, struct gr_vec *work, struct gr_vec *out) {
    if (a->gen == UINT32_MAX) { /* stamps would repeat: start them over */
        for (uint32_t k = 0; k < a->n; k++) a->nodes[k].stamp = 0;
        a->gen = 1;
    }
    uint32_t gen = ++a->gen, flags = 0, visited = 0;
    while (work->n) {
        uint32_t id = work->v[--work->n];
        if (a->nodes[id].stamp == gen) continue;
        a->nodes[id].stamp = gen;
        if (++visited > 8 * GR_MAX_STACKS) { /* stacks without byte edges count too */
            flags |= GR_FLAG_OVERFLOW;
            work->n = 0;
            break;
        }
        uint32_t parent = a->nodes[id].parent;
        const struct gr_state *st = &g->states[a->nodes[id].state];
        if (st->n_edges) {
            if (out->n >= GR_MAX_STACKS) {
                flags |= GR_FLAG_OVERFLOW;
                work->n = 0;
                break;
            }
            gr_vec_push(out, id);
        }
        for (uint32_t k = 0; k < st->n_calls; k++) {
            const struct gr_call *c = &g->calls[st->call_off + k];
            uint32_t ret = gr_arena_intern(a, c->ret, parent);
            gr_vec_push(work, gr_arena_intern(a, g->rules[c->rule].start, ret));
        }
        if (st->final) {
            if (parent == GR_NODE_ROOT)
                flags |= GR_FLAG_END;
            else if (parent == GR_NODE_CONTEXT)
                flags |= GR_FLAG_CONTEXT;
            else
                gr_vec_push(work, parent);
        }
    }
    return flags;
}

uint32_t gr_advance(const struct grammar *g, struct gr_arena *a, const uint32_t *from, uint32_t n_from,
                    uint8_t b, struct gr_vec *work, struct gr_vec *out) {
    work->n = 0;
    for (uint32_t i = 0; i < n_from; i++) {
        uint32_t state = a->nodes[from[i]].state, parent = a->nodes[from[i]].parent;
        const struct gr_state *st = &g->states[state];
        const struct gr_edge *e = g->edges + st->edge_off;
        for (uint32_t k = 0; k < st->n_edges && e[k].lo <= b; k++)
            if (b <= e[k].hi) gr_vec_push(work, gr_arena_intern(a, e[k].target, parent));
    }
    if (!work->n) return 0;
    return gr_closure(g, a, work, out);
}

/* ---- the matcher ---- */

/* Keeps only the nodes the current set reaches, renumbered (parents
 * always have smaller ids than their children, so one ascending pass
 * remaps them). */
static void collect(struct grammar_matcher *m) {
    struct gr_arena *a = &m->arena;
    uint32_t *map = xmalloc(a->n * sizeof *map);
    memset(map, 0xff, a->n * sizeof *map);
    map[GR_NODE_ROOT] = GR_NODE_ROOT;
    map[GR_NODE_CONTEXT] = GR_NODE_CONTEXT;
    for (uint32_t i = 0; i < m->cur.n; i++)
        for (uint32_t id = m->cur.v[i]; map[id] == GR_NIL; id = a->nodes[id].parent) map[id] = 0;
    uint32_t n = 2;
    for (uint32_t id = 2; id < a->n; id++) {
        if (map[id] == GR_NIL) continue;
        map[id] = n;
        struct gr_node nd = a->nodes[id];
        a->nodes[n++] = (struct gr_node){nd.state, map[nd.parent], GR_NIL, 0};
    }
    for (uint32_t k = 0; k < 2; k++) a->nodes[k].stamp = 0;
    a->n = n;
    a->gen = 1;
    rehash(a, a->n_buckets);
    for (uint32_t i = 0; i < m->cur.n; i++) m->cur.v[i] = map[m->cur.v[i]];
    free(map);
    m->gc_at = 4 * n > 65536 ? 4 * n : 65536;
}

struct grammar_matcher *grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v,
                                               struct kiln_error *err) {
    if (!g) {
        kiln_errorc(err, KILN_ERR_INTERNAL, "grammar: no grammar to match");
        return NULL;
    }
    struct grammar_matcher *m = xcalloc(1, sizeof *m);
    grammar_ref(g);
    m->g = g;
    m->v = v;
    m->use_cache = 1;
    gr_arena_init(&m->arena);
    grammar_matcher_reset(m);
    return m;
}

void grammar_matcher_free(struct grammar_matcher *m) {
    if (!m) return;
    gr_arena_free(&m->arena);
    gr_vec_free(&m->cur);
    gr_vec_free(&m->work);
    gr_vec_free(&m->tmp);
    gr_vec_free(&m->tmp2);
    gr_vec_free(&m->lv_nodes);
    free(m->lv_off);
    free(m->lv_mark);
    free(m->lv_flags);
    grammar_unref(m->g);
    free(m);
}

void grammar_matcher_reset(struct grammar_matcher *m) {
    gr_arena_rollback(&m->arena, 2);
    m->cur.n = 0;
    m->work.n = 0;
    gr_vec_push(&m->work, gr_arena_intern(&m->arena, m->g->rules[m->g->root].start, GR_NODE_ROOT));
    uint32_t flags = gr_closure(m->g, &m->arena, &m->work, &m->cur);
    m->can_end = (flags & GR_FLAG_END) != 0;
    m->gc_at = 65536;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n) {
    if (n == 0) return 0;
    struct gr_arena *a = &m->arena;
    uint32_t mark = a->n, flags = 0;
    struct gr_vec *src = &m->cur, *dst = &m->tmp;
    for (size_t i = 0; i < n; i++) {
        dst->n = 0;
        flags = gr_advance(m->g, a, src->v, src->n, (uint8_t)s[i], &m->work, dst);
        if (flags & GR_FLAG_OVERFLOW) m->overflowed = 1;
        if ((flags & GR_FLAG_OVERFLOW) || (!dst->n && !(flags & GR_FLAG_END)) || (!dst->n && i + 1 < n)) {
            gr_arena_rollback(a, mark);
            return -1;
        }
        src = dst;
        dst = dst == &m->tmp ? &m->tmp2 : &m->tmp;
    }
    struct gr_vec t = m->cur;
    m->cur = *src;
    *src = t;
    m->can_end = (flags & GR_FLAG_END) != 0;
    if (a->n > m->gc_at) collect(m);
    return 0;
}

int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t token) {
    const struct grammar_vocab *v = m->v;
    if (!v || token < 0 || token >= v->n_tokens || !v->bytes[token]) return -1;
    return grammar_matcher_accept_bytes(m, v->bytes[token], v->lens[token]);
}

int grammar_matcher_can_end(const struct grammar_matcher *m) { return m->can_end; }

int grammar_matcher_is_done(const struct grammar_matcher *m) { return m->can_end && m->cur.n == 0; }
