/* vocab.c — a tokenizer's tokens as a byte trie (grammar_vocab), and the
 * full trie walk that says which tokens a set of stacks accepts.
 *
 * The trie is stored in preorder: node i's subtree is [i, trie[i].end),
 * so a walk skips a dead subtree with one jump. Tokens are sorted by their
 * bytes (`order`); the tokens ending at a node come first in its subtree,
 * and a subtree's tokens are one run of `order`.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar_internal.h"

static atomic_uint_fast64_t next_vocab_id = 1;

static int cmp_tok(const void *x, const void *y, void *arg) {
    const struct grammar_vocab *v = arg;
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    uint32_t la = v->lens[a], lb = v->lens[b];
    int c = memcmp(v->bytes[a], v->bytes[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

struct grammar_vocab *grammar_vocab_create(int n_tokens, const char *const *tokens, const size_t *lens,
                                           const uint8_t *special) {
    struct grammar_vocab *v = xcalloc(1, sizeof *v);
    v->id = atomic_fetch_add(&next_vocab_id, 1);
    v->n_tokens = n_tokens > 0 ? n_tokens : 0;
    uint32_t n = (uint32_t)v->n_tokens;
    v->bytes = xcalloc(n ? n : 1, sizeof *v->bytes);
    v->lens = xcalloc(n ? n : 1, sizeof *v->lens);
    v->rank = xmalloc((n ? n : 1) * sizeof *v->rank);
    v->order = xmalloc((n ? n : 1) * sizeof *v->order);
    size_t total = 0;
    for (uint32_t t = 0; t < n; t++) {
        v->rank[t] = GR_NIL;
        /* an empty token would move no grammar forward: never allowed */
        if (!tokens || !tokens[t] || (special && special[t]) || !lens[t] || lens[t] > 0xFFFF) continue;
        v->bytes[t] = xmalloc(lens[t]);
        memcpy(v->bytes[t], tokens[t], lens[t]);
        v->lens[t] = (uint32_t)lens[t];
        v->order[v->n_order++] = t;
        total += lens[t];
        if (v->lens[t] > v->max_len) v->max_len = v->lens[t];
    }
    qsort_r(v->order, v->n_order, sizeof *v->order, cmp_tok, v);
    v->trie = xmalloc((total + 1) * sizeof *v->trie);
    uint32_t *open = xmalloc((v->max_len + 2) * sizeof *open), top = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t k = 0; k < v->n_order; k++) {
        uint32_t t = v->order[k];
        v->rank[t] = k;
        const char *b = v->bytes[t];
        uint32_t len = v->lens[t], l = 0;
        while (l < len && l < prev_len && b[l] == prev[l]) l++;
        if (l == len && len == prev_len) { /* the same bytes as the previous token */
            v->trie[open[top]].tok_end = k + 1;
            continue;
        }
        for (uint32_t d = l + 1; d <= len; d++) {
            while (top >= d) v->trie[open[top--]].end = v->n_trie;
            uint32_t i = v->n_trie++;
            v->trie[i] = (struct gr_trie_node){0, k, k, (uint16_t)d, (uint8_t)b[d - 1]};
            open[++top] = i;
        }
        v->trie[open[top]].tok_end = k + 1;
        prev = b;
        prev_len = len;
    }
    while (top) v->trie[open[top--]].end = v->n_trie;
    free(open);
    return v;
}

void grammar_vocab_free(struct grammar_vocab *v) {
    if (!v) return;
    for (int t = 0; t < v->n_tokens; t++) free(v->bytes[t]);
    free(v->bytes);
    free(v->lens);
    free(v->rank);
    free(v->order);
    free(v->trie);
    free(v);
}

int grammar_vocab_size(const struct grammar_vocab *v) { return v->n_tokens; }

int grammar_mask_words(const struct grammar_vocab *v) { return (v->n_tokens + 31) / 32; }

/* Makes room for sets at depths 0..max_len+1. */
void gr_levels_reserve(struct grammar_matcher *m, uint32_t depth) {
    if (depth + 2 <= m->lv_cap) return;
    m->lv_cap = depth + 2;
    m->lv_off = xrealloc(m->lv_off, (m->lv_cap + 1) * sizeof *m->lv_off);
    m->lv_mark = xrealloc(m->lv_mark, m->lv_cap * sizeof *m->lv_mark);
    m->lv_flags = xrealloc(m->lv_flags, m->lv_cap * sizeof *m->lv_flags);
}

/* Computes level d+1 from level d over byte b (levels live in lv_nodes;
 * the arena is rolled back to level d's mark first). */
uint32_t gr_level_step(struct grammar_matcher *m, uint32_t d, uint8_t b) {
    struct gr_arena *a = &m->arena;
    gr_arena_rollback(a, m->lv_mark[d]);
    m->lv_nodes.n = m->lv_off[d + 1];
    m->tmp.n = 0;
    uint32_t flags = gr_advance(m->g, a, m->lv_nodes.v + m->lv_off[d], m->lv_off[d + 1] - m->lv_off[d], b,
                                &m->work, &m->tmp);
    if (flags & GR_FLAG_OVERFLOW) m->tmp.n = 0, flags = 0, m->overflowed = 1;
    for (uint32_t k = 0; k < m->tmp.n; k++) gr_vec_push(&m->lv_nodes, m->tmp.v[k]);
    m->lv_off[d + 2] = m->lv_nodes.n;
    m->lv_mark[d + 1] = a->n;
    return flags;
}

/* Level 0 := the given set. */
void gr_levels_start(struct grammar_matcher *m, const uint32_t *set, uint32_t n) {
    m->lv_nodes.n = 0;
    for (uint32_t k = 0; k < n; k++) gr_vec_push(&m->lv_nodes, set[k]);
    m->lv_off[0] = 0;
    m->lv_off[1] = n;
    m->lv_mark[0] = m->arena.n;
    m->lv_flags[0] = 0;
}

void gr_fill_mask_nocache(struct grammar_matcher *m, uint32_t *bits) {
    const struct grammar_vocab *v = m->v;
    memset(bits, 0, (size_t)grammar_mask_words(v) * sizeof *bits);
    if (!m->cur.n) return;
    gr_levels_reserve(m, v->max_len);
    gr_levels_start(m, m->cur.v, m->cur.n);
    uint32_t mark = m->arena.n;
    for (uint32_t i = 0; i < v->n_trie;) {
        const struct gr_trie_node *nd = &v->trie[i];
        uint32_t d = nd->depth;
        uint32_t flags = gr_level_step(m, d - 1, nd->byte);
        uint32_t n = m->lv_off[d + 1] - m->lv_off[d];
        if (n || (flags & GR_FLAG_END))
            for (uint32_t k = nd->tok_begin; k < nd->tok_end; k++) {
                uint32_t t = v->order[k];
                bits[t >> 5] |= 1u << (t & 31);
            }
        i = n ? i + 1 : nd->end;
    }
    gr_arena_rollback(&m->arena, mark);
}
