#include "tokenizer/added_tokens.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tok_json.h"
#include "tokenizer/tok_util.h"

void added_splits_free(struct added_splits *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static void splits_push(struct added_splits *s, size_t a, size_t b, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (struct added_split){a, b, id};
}

static int32_t trie_node(struct added_trie *t) {
    if (t->n_nodes == t->cap_nodes) {
        t->cap_nodes = t->cap_nodes ? t->cap_nodes * 2 : 64;
        t->term = xrealloc(t->term, t->cap_nodes * sizeof *t->term);
    }
    t->term[t->n_nodes] = -1;
    return (int32_t)t->n_nodes++;
}

static void trie_init(struct added_trie *t) {
    memset(t, 0, sizeof *t);
    tok_pairmap_init(&t->edges, 64);
    trie_node(t); /* root */
    t->empty = 1;
}

static void trie_free(struct added_trie *t) {
    tok_pairmap_free(&t->edges);
    free(t->term);
    memset(t, 0, sizeof *t);
}

static void trie_add(struct added_trie *t, const char *s, size_t n, int32_t index) {
    int32_t node = 0;
    t->first[(unsigned char)s[0]] = 1;
    t->empty = 0;
    for (size_t i = 0; i < n; i++) {
        const struct tok_pairmap_slot *e = tok_pairmap_get(&t->edges, node, (unsigned char)s[i]);
        if (e) {
            node = e->rank;
        } else {
            int32_t child = trie_node(t);
            tok_pairmap_put(&t->edges, node, (unsigned char)s[i], child, 0);
            node = child;
        }
    }
    t->term[node] = index;
}

void added_vocab_free(struct added_vocab *av) {
    for (size_t i = 0; i < av->n; i++) {
        free(av->tokens[i].content);
        free(av->tokens[i].norm);
    }
    free(av->tokens);
    tok_strmap_free(&av->by_content);
    tok_strmap_free(&av->specials);
    free(av->index_of_id);
    trie_free(&av->raw);
    trie_free(&av->normalized);
    memset(av, 0, sizeof *av);
}

static int parse_flags(json_t *e, const char *path, struct added_token *t, struct kiln_error *err) {
    return tj_bool(e, path, "special", 0, &t->special, err) || tj_bool(e, path, "lstrip", 0, &t->lstrip, err) ||
                   tj_bool(e, path, "rstrip", 0, &t->rstrip, err) ||
                   tj_bool(e, path, "single_word", 0, &t->single_word, err) ||
                   tj_bool(e, path, "normalized", !t->special, &t->normalized, err)
               ? -1
               : 0;
}

int added_vocab_parse(struct added_vocab *av, json_t *arr, const struct bpe *model, const struct normalizer *norm,
                      struct tok_ctx *ctx, struct kiln_error *err) {
    char path[TJ_PATH_MAX];
    memset(av, 0, sizeof *av);
    tok_strmap_init(&av->by_content, 16);
    tok_strmap_init(&av->specials, 16);
    trie_init(&av->raw);
    trie_init(&av->normalized);
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return kiln_errorf(err, "tokenizer.json: added_tokens: expected an array");
    size_t count = json_array_size(arr);
    av->tokens = xcalloc(count + 1, sizeof *av->tokens);
    /* Tokens missing from the model get ids counting from the model's
     * vocabulary size, as `tokenizers` numbers them. */
    int32_t next_id = (int32_t)model->vocab.count;
    int32_t max_added = -1;
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(arr, i);
        struct added_token t = {0};
        const char *content;
        size_t len;
        tj_path_index(path, sizeof path, "added_tokens", "", i);
        if (!json_is_object(e)) return kiln_errorf(err, "tokenizer.json: %s: expected an object", path);
        if (tj_string(e, path, "content", 1, &content, &len, err)) return -1;
        /* serde's default for `normalized` is !special. */
        if (tj_bool(e, path, "special", 0, &t.special, err) || parse_flags(e, path, &t, err)) return -1;
        if (len == 0) continue; /* ignored by `tokenizers` */
        int32_t id = tok_strmap_get(&av->by_content, content, len);
        if (id < 0) id = tok_strmap_get(&model->vocab, content, len);
        if (id < 0) id = next_id++;
        if (id >= BPE_MAX_ID) return kiln_errorf(err, "tokenizer.json: %s: too many tokens", path);
        t.id = id;
        t.content = xmalloc(len + 1);
        memcpy(t.content, content, len + 1);
        t.len = len;
        if (t.normalized && norm) {
            struct tok_piece p = {t.content, t.len, 0};
            if (normalizer_apply(norm, ctx, &p, err)) {
                free(t.content);
                return kiln_error_prefix(err, "tokenizer.json: %s: normalizing the token", path);
            }
            if (p.len != t.len || memcmp(p.s, t.content, t.len)) {
                t.norm = xmalloc(p.len + 1);
                memcpy(t.norm, p.s, p.len);
                t.norm[p.len] = 0;
                t.norm_len = p.len;
            }
        }
        tok_strmap_put(&av->by_content, t.content, t.len, id);
        if (t.special) tok_strmap_put(&av->specials, t.content, t.len, 1);
        /* One entry per id: a later token with the same id replaces it. */
        size_t slot = av->n;
        for (size_t j = 0; j < av->n; j++)
            if (av->tokens[j].id == id) slot = j;
        if (slot < av->n) {
            free(av->tokens[slot].content);
            free(av->tokens[slot].norm);
        } else {
            av->n++;
        }
        av->tokens[slot] = t;
        if (id > max_added) max_added = id;
    }
    av->id_limit = max_added + 1;
    av->index_of_id = xmalloc(((size_t)av->id_limit + 1) * sizeof *av->index_of_id);
    for (int32_t i = 0; i <= av->id_limit; i++) av->index_of_id[i] = -1;
    for (size_t i = 0; i < av->n; i++) {
        const struct added_token *t = &av->tokens[i];
        av->index_of_id[t->id] = (int32_t)i;
        if (t->normalized) {
            if (t->norm_len || !t->norm) {
                const char *s = t->norm ? t->norm : t->content;
                size_t n = t->norm ? t->norm_len : t->len;
                if (n) trie_add(&av->normalized, s, n, (int32_t)i);
            }
        } else {
            trie_add(&av->raw, t->content, t->len, (int32_t)i);
        }
    }
    return 0;
}

const struct added_token *added_vocab_token(const struct added_vocab *av, int32_t id) {
    if (id < 0 || id >= av->id_limit || av->index_of_id[id] < 0) return NULL;
    return &av->tokens[av->index_of_id[id]];
}

static int is_word_before(const char *s, size_t end) {
    if (end == 0) return 0;
    size_t i = utf8_prev(s, 0, end);
    uint32_t cp;
    utf8_decode(s + i, &cp);
    return uc_is_word(cp);
}

static int is_word_at(const char *s, size_t n, size_t at) {
    if (at >= n) return 0;
    uint32_t cp;
    utf8_decode(s + at, &cp);
    return uc_is_word(cp);
}

void added_vocab_split(const struct added_vocab *av, int normalized, const char *s, size_t n, struct added_splits *out) {
    const struct added_trie *t = normalized ? &av->normalized : &av->raw;
    out->n = 0;
    if (t->empty) {
        splits_push(out, 0, n, -1);
        return;
    }
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        if (!t->first[(unsigned char)s[pos]]) {
            pos++;
            continue;
        }
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = pos; j < n; j++) {
            const struct tok_pairmap_slot *e = tok_pairmap_get(&t->edges, node, (unsigned char)s[j]);
            if (!e) break;
            node = e->rank;
            if (t->term[node] >= 0) {
                best = t->term[node];
                best_end = j + 1;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        const struct added_token *tok = &av->tokens[best];
        size_t start = pos, stop = best_end;
        pos = best_end; /* the matcher resumes after the raw match */
        if (tok->single_word && (is_word_before(s, start) || is_word_at(s, n, stop))) continue;
        if (tok->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t i = utf8_prev(s, 0, ns);
                uint32_t cp;
                utf8_decode(s + i, &cp);
                if (!uc_is_whitespace(cp)) break;
                ns = i;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (tok->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t k = utf8_decode(s + stop, &cp);
                if (!uc_is_whitespace(cp)) break;
                stop += k;
            }
        if (start_offset < start) splits_push(out, start_offset, start, -1);
        splits_push(out, start, stop, tok->id);
        start_offset = stop;
    }
    if (start_offset < n) splits_push(out, start_offset, n, -1);
}
