/* mask.c — token masks and the per-vocabulary cache behind them (the idea
 * of xgrammar's adaptive token mask cache).
 *
 * A stack in a matcher's set has a top state with byte edges. Which tokens
 * that stack accepts splits in three by the top state alone: tokens whose
 * bytes all fit inside the top rule (accepted whatever lies below), tokens
 * that die inside it (rejected whatever lies below), and tokens that
 * complete the top rule with bytes left over (the rest depends on the
 * stack below: "context-dependent"). The cache holds, per state, the
 * accepted tokens (a list or a bitmap, whichever is smaller) and the
 * context-dependent ones in trie order. A mask is then the union of the
 * accepted sets of the stacks, plus the context-dependent tokens checked
 * against their real stacks; consecutive ones share their common prefix's
 * work, as in a trie walk.
 *
 * States that no token can tell apart share one entry: two states whose
 * automata agree on every path of up to max_len bytes (the longest token)
 * — same rule, same final marks, edges and calls into agreeing states —
 * accept, reject and defer the same tokens. They are found by refining a
 * partition for that many steps (plus the byte-less steps calls and
 * returns can take), not to the fixpoint: the positions of a bounded
 * repetition (a string of maxLength 64) differ only in how far the bound
 * is, which no token longer than that distance can see, so all but the
 * last max_len of them share an entry.
 *
 * A cache belongs to one grammar and one vocabulary (keyed by the
 * vocabulary's id). grammar_prepare makes it and fills the entries of up
 * to EAGER_STATES states, on up to PREPARE_THREADS threads (each entry is
 * one walk of the whole trie: a 20-property JSON Schema has ~4,400 states
 * at ~1.5 ms each against a 150k-token vocabulary); the rest are filled on
 * first use. Entries are published with release stores (first one wins),
 * so readers take no lock.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar_internal.h"

#define EAGER_STATES 4096
#define PREPARE_THREADS 16
/* states a helper thread of grammar_prepare is worth starting for */
#define PREPARE_PER_THREAD 32

struct gr_entry {
    uint32_t *accept; /* token ids, or a bitmap of mask_words words */
    uint32_t n_accept;
    int accept_bitmap;
    uint32_t *dep; /* positions in vocab.order (trie order) */
    uint32_t n_dep;
};

struct gr_cache {
    struct gr_cache *next; /* first: grammar_unref walks the list through it */
    uint64_t vocab_id;
    const struct grammar_vocab *v;
    uint32_t n_states;
    uint32_t *rep; /* [n_states]: the state whose entry a state uses */
    _Atomic(struct gr_entry *) *entries;
    pthread_mutex_t lock; /* fills entries, one at a time */
    struct grammar_matcher *scratch;
};

static void entry_free(struct gr_entry *e) {
    if (!e) return;
    free(e->accept);
    free(e->dep);
    free(e);
}

/* A matcher used only for its arena and level scratch: it holds no
 * reference on the grammar (the grammar owns it through the cache). */
static struct grammar_matcher *scratch_new(struct grammar *g, const struct grammar_vocab *v) {
    struct grammar_matcher *m = xcalloc(1, sizeof *m);
    m->g = g;
    m->v = v;
    gr_arena_init(&m->arena);
    gr_levels_reserve(m, v->max_len);
    return m;
}

static void scratch_free(struct grammar_matcher *m) {
    if (!m) return;
    m->g = NULL;
    gr_arena_free(&m->arena);
    gr_vec_free(&m->cur);
    gr_vec_free(&m->work);
    gr_vec_free(&m->tmp);
    gr_vec_free(&m->tmp2);
    gr_vec_free(&m->lv_nodes);
    free(m->lv_off);
    free(m->lv_mark);
    free(m->lv_flags);
    free(m);
}

void gr_cache_free(struct gr_cache *c) {
    for (uint32_t s = 0; s < c->n_states; s++) entry_free(atomic_load(&c->entries[s]));
    free(c->entries);
    free(c->rep);
    scratch_free(c->scratch);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The entry of state s: one walk of the whole trie from the stack
 * (s, GR_NODE_CONTEXT), with w's arena and levels as scratch (c->scratch
 * under c->lock, or a thread's own). */
static struct gr_entry *entry_build(struct grammar *g, struct gr_cache *c, struct grammar_matcher *w, uint32_t s) {
    const struct grammar_vocab *v = c->v;
    struct gr_vec acc_tok = {0}, dep = {0};
    uint32_t root = gr_arena_intern(&w->arena, s, GR_NODE_CONTEXT);
    const uint32_t *fol = g->follow[g->states[s].rule];
#define FOLLOWS(b) ((fol[(b) >> 5] >> ((b) & 31)) & 1)
    /* lv_flags[d]: GR_FLAG_CONTEXT when level d's closure completed the
     * rule (popped to the context); ACC when some earlier completion was
     * followed by a byte that some caller may take */
    const uint32_t ACC = 1u << 16;
    gr_levels_start(w, &root, 1);
    for (uint32_t i = 0; i < v->n_trie;) {
        const struct gr_trie_node *nd = &v->trie[i];
        uint32_t d = nd->depth, pf = w->lv_flags[d - 1];
        uint32_t acc = (pf & ACC) || ((pf & GR_FLAG_CONTEXT) && FOLLOWS(nd->byte)) ? ACC : 0;
        uint32_t flags = gr_level_step(w, d - 1, nd->byte) & GR_FLAG_CONTEXT;
        w->lv_flags[d] = acc | flags;
        if (w->lv_off[d + 1] > w->lv_off[d]) {
            for (uint32_t k = nd->tok_begin; k < nd->tok_end; k++) gr_vec_push(&acc_tok, v->order[k]);
            i++;
            continue;
        }
        /* no stack inside the rule: a token ending here is accepted when it
         * just completed the rule (every caller's return state is live) */
        for (uint32_t k = nd->tok_begin; k < nd->tok_end; k++) {
            if (flags)
                gr_vec_push(&acc_tok, v->order[k]);
            else if (acc)
                gr_vec_push(&dep, k);
        }
        if (acc) {
            uint32_t end = nd->end < v->n_trie ? v->trie[nd->end].tok_begin : v->n_order;
            for (uint32_t k = nd->tok_end; k < end; k++) gr_vec_push(&dep, k);
        } else if (flags) {
            for (uint32_t j = i + 1; j < nd->end; j = v->trie[j].end) {
                if (!FOLLOWS(v->trie[j].byte)) continue;
                uint32_t je = v->trie[j].end, end = je < v->n_trie ? v->trie[je].tok_begin : v->n_order;
                for (uint32_t k = v->trie[j].tok_begin; k < end; k++) gr_vec_push(&dep, k);
            }
        }
        i = nd->end;
    }
#undef FOLLOWS
    gr_arena_rollback(&w->arena, 2);
    struct gr_entry *e = xcalloc(1, sizeof *e);
    uint32_t words = (uint32_t)grammar_mask_words(v);
    if (acc_tok.n > words) {
        e->accept_bitmap = 1;
        e->accept = xcalloc(words, sizeof *e->accept);
        for (uint32_t k = 0; k < acc_tok.n; k++) e->accept[acc_tok.v[k] >> 5] |= 1u << (acc_tok.v[k] & 31);
        e->n_accept = acc_tok.n;
        gr_vec_free(&acc_tok);
    } else {
        e->accept = acc_tok.v; /* NULL when empty */
        e->n_accept = acc_tok.n;
    }
    e->dep = dep.v;
    e->n_dep = dep.n;
    return e;
}

static struct gr_entry *entry_get(struct grammar *g, struct gr_cache *c, uint32_t s) {
    s = c->rep[s];
    struct gr_entry *e = atomic_load_explicit(&c->entries[s], memory_order_acquire);
    if (e) return e;
    pthread_mutex_lock(&c->lock);
    e = atomic_load_explicit(&c->entries[s], memory_order_relaxed);
    if (!e) {
        if (!c->scratch) c->scratch = scratch_new(g, c->v);
        struct gr_entry *mine = entry_build(g, c, c->scratch, s);
        /* a thread of grammar_prepare may have published one meanwhile */
        if (atomic_compare_exchange_strong_explicit(&c->entries[s], &e, mine, memory_order_acq_rel,
                                                    memory_order_acquire))
            e = mine;
        else
            entry_free(mine);
    }
    pthread_mutex_unlock(&c->lock);
    return e;
}

/* One round's signatures, interned: equal signatures get one id. */
struct sig_table {
    struct gr_vec words;      /* the signatures, back to back */
    uint32_t *slot_off;       /* [cap]: offset + 1 of a signature in words, 0: empty */
    uint32_t *slot_len, *slot_id;
    uint32_t cap, n;
};

static uint64_t sig_hash(const uint32_t *w, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* The id of the signature words[start..], dropping it when seen before. */
static uint32_t sig_intern(struct sig_table *t, uint32_t start) {
    const uint32_t *w = t->words.v + start;
    uint32_t len = t->words.n - start;
    for (uint64_t i = sig_hash(w, len) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (!t->slot_off[i]) {
            t->slot_off[i] = start + 1, t->slot_len[i] = len, t->slot_id[i] = t->n;
            return t->n++;
        }
        if (t->slot_len[i] == len && !memcmp(t->words.v + t->slot_off[i] - 1, w, (size_t)len * 4)) {
            t->words.n = start;
            return t->slot_id[i];
        }
    }
}

/* rep[s] for every state (the head of this file): the partition by (rule,
 * final), refined by each state's edges and calls into the last round's
 * classes, for max_len byte steps and the byte-less call and return steps
 * (at most two per rule on a path that reads no byte), or until stable. */
static uint32_t *entry_reps(const struct grammar *g, uint32_t max_len) {
    uint32_t n = g->n_states, *cls = xmalloc((size_t)(n ? n : 1) * 4), *nxt = xmalloc((size_t)(n ? n : 1) * 4);
    struct sig_table t = {0};
    t.cap = 16;
    while (t.cap < 2 * n) t.cap <<= 1;
    t.slot_off = xmalloc((size_t)t.cap * 4), t.slot_len = xmalloc((size_t)t.cap * 4);
    t.slot_id = xmalloc((size_t)t.cap * 4);
    uint64_t rounds = (uint64_t)max_len + 2ull * g->n_rules + 2;
    uint32_t classes = 0;
    for (uint64_t r = 0; r <= rounds; r++) {
        memset(t.slot_off, 0, (size_t)t.cap * 4);
        t.n = 0, t.words.n = 0;
        for (uint32_t s = 0; s < n; s++) {
            const struct gr_state *st = &g->states[s];
            uint32_t start = t.words.n;
            if (r == 0) {
                gr_vec_push(&t.words, st->rule);
                gr_vec_push(&t.words, st->final);
            } else {
                gr_vec_push(&t.words, cls[s]);
                for (uint32_t k = 0; k < st->n_edges; k++) {
                    const struct gr_edge *e = &g->edges[st->edge_off + k];
                    gr_vec_push(&t.words, (uint32_t)e->lo << 8 | e->hi);
                    gr_vec_push(&t.words, cls[e->target]);
                }
                gr_vec_push(&t.words, GR_NIL);
                for (uint32_t k = 0; k < st->n_calls; k++) {
                    const struct gr_call *cl = &g->calls[st->call_off + k];
                    gr_vec_push(&t.words, cl->rule);
                    gr_vec_push(&t.words, cls[cl->ret]);
                }
            }
            nxt[s] = sig_intern(&t, start);
        }
        uint32_t *tmp = cls;
        cls = nxt, nxt = tmp;
        if (r > 0 && t.n == classes) break; /* stable: no later round splits more */
        classes = t.n;
    }
    /* the first state of each class represents it */
    uint32_t *first = nxt; /* [classes] */
    for (uint32_t k = 0; k < classes; k++) first[k] = GR_NIL;
    for (uint32_t s = 0; s < n; s++) {
        if (first[cls[s]] == GR_NIL) first[cls[s]] = s;
        cls[s] = first[cls[s]];
    }
    free(nxt);
    free(t.slot_off), free(t.slot_len), free(t.slot_id);
    gr_vec_free(&t.words);
    return cls;
}

static struct gr_cache *cache_get(struct grammar *g, const struct grammar_vocab *v) {
    pthread_mutex_lock(&g->lock);
    struct gr_cache *c = g->caches;
    while (c && c->vocab_id != v->id) c = c->next;
    if (!c) {
        c = xcalloc(1, sizeof *c);
        c->vocab_id = v->id;
        c->v = v;
        c->n_states = g->n_states;
        c->entries = xcalloc(g->n_states, sizeof *c->entries);
        c->rep = entry_reps(g, v->max_len);
        pthread_mutex_init(&c->lock, NULL);
        c->next = g->caches;
        g->caches = c;
    }
    pthread_mutex_unlock(&g->lock);
    return c;
}

/* The eager fill: threads take the listed states one at a time. */
struct prepare_job {
    struct grammar *g;
    struct gr_cache *c;
    const uint32_t *states;
    uint32_t n;
    _Atomic uint32_t next;
};

static void *prepare_worker(void *arg) {
    struct prepare_job *j = arg;
    struct grammar_matcher *w = NULL;
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n) break;
        uint32_t s = j->states[i];
        if (atomic_load_explicit(&j->c->entries[s], memory_order_acquire)) continue;
        if (!w) w = scratch_new(j->g, j->c->v);
        struct gr_entry *e = entry_build(j->g, j->c, w, s), *none = NULL;
        if (!atomic_compare_exchange_strong_explicit(&j->c->entries[s], &none, e, memory_order_acq_rel,
                                                     memory_order_acquire))
            entry_free(e); /* a matcher filled it first */
    }
    scratch_free(w);
    return NULL;
}

int grammar_prepare(struct grammar *g, const struct grammar_vocab *v, struct kiln_error *err) {
    if (!g || !v) return kiln_errorc(err, KILN_ERR_INTERNAL, "grammar_prepare: no grammar or vocabulary");
    struct gr_cache *c = cache_get(g, v);
    struct prepare_job j = {.g = g, .c = c};
    uint32_t *list = xmalloc((size_t)(g->n_states ? g->n_states : 1) * sizeof *list);
    for (uint32_t s = 0; s < g->n_states && j.n < EAGER_STATES; s++)
        if (g->states[s].n_edges && c->rep[s] == s) list[j.n++] = s;
    j.states = list;
    atomic_init(&j.next, 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long nt = (long)(j.n / PREPARE_PER_THREAD);
    if (nt > cpus) nt = cpus;
    if (nt > PREPARE_THREADS) nt = PREPARE_THREADS;
    pthread_t tid[PREPARE_THREADS];
    int started = 0;
    for (long t = 1; t < nt; t++) /* this thread is the first worker */
        if (pthread_create(&tid[started], NULL, prepare_worker, &j) == 0) started++;
    prepare_worker(&j);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    free(list);
    return 0;
}

static inline void set_bit(uint32_t *bits, uint32_t t) { bits[t >> 5] |= 1u << (t & 31); }
static inline int get_bit(const uint32_t *bits, uint32_t t) { return (bits[t >> 5] >> (t & 31)) & 1; }

/* Checks the context-dependent tokens of one stack against the stack
 * itself, sharing the work of common prefixes between consecutive tokens. */
static void walk_dep(struct grammar_matcher *m, uint32_t id, const struct gr_entry *e, uint32_t *bits) {
    const struct grammar_vocab *v = m->v;
    gr_levels_start(m, &id, 1);
    const char *prev = NULL;
    uint32_t prev_len = 0, have = 0;
    for (uint32_t q = 0; q < e->n_dep; q++) {
        uint32_t t = v->order[e->dep[q]];
        if (get_bit(bits, t)) continue;
        const char *b = v->bytes[t];
        uint32_t len = v->lens[t], l = 0;
        while (l < len && l < prev_len && l < have && b[l] == prev[l]) l++;
        uint32_t j = l;
        int alive = 1;
        while (j < len) {
            if (j > 0 && m->lv_off[j + 1] == m->lv_off[j]) {
                alive = 0;
                break;
            }
            m->lv_flags[j + 1] = gr_level_step(m, j, (uint8_t)b[j]);
            j++;
        }
        have = j;
        prev = b;
        prev_len = len;
        if (alive && (m->lv_off[len + 1] > m->lv_off[len] || (m->lv_flags[len] & GR_FLAG_END))) set_bit(bits, t);
    }
}

void grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits) {
    if (!m->use_cache) {
        gr_fill_mask_nocache(m, bits);
        return;
    }
    const struct grammar_vocab *v = m->v;
    uint32_t words = (uint32_t)grammar_mask_words(v);
    memset(bits, 0, words * sizeof *bits);
    if (!m->cur.n) return;
    if (!m->cache) m->cache = cache_get(m->g, v);
    gr_levels_reserve(m, v->max_len);
    uint32_t mark = m->arena.n;
    for (uint32_t i = 0; i < m->cur.n; i++) {
        const struct gr_entry *e = entry_get(m->g, m->cache, m->arena.nodes[m->cur.v[i]].state);
        if (e->accept_bitmap) {
            for (uint32_t k = 0; k < words; k++) bits[k] |= e->accept[k];
        } else {
            for (uint32_t k = 0; k < e->n_accept; k++) set_bit(bits, e->accept[k]);
        }
    }
    for (uint32_t i = 0; i < m->cur.n; i++) {
        const struct gr_entry *e = entry_get(m->g, m->cache, m->arena.nodes[m->cur.v[i]].state);
        if (e->n_dep) walk_dep(m, m->cur.v[i], e, bits);
    }
    gr_arena_rollback(&m->arena, mark);
}
