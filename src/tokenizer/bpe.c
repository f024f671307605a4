#include "tokenizer/bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"

#define METASPACE "\xE2\x96\x81" /* U+2581 */

void tok_ids_push(struct kiln_token_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->ids = xrealloc(v->ids, v->cap * sizeof *v->ids);
    }
    v->ids[v->n++] = id;
}

/* ---- cache ------------------------------------------------------------ */

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_WORD 256

struct bpe_cache_slot {
    uint64_t hash; /* 0: empty */
    uint32_t key_off, key_len;
    uint32_t ids_off, n_ids;
};

struct bpe_cache {
    struct bpe_cache_slot *slots;
    size_t count;
    struct buf keys;
    int32_t *ids;
    size_t ids_len, ids_cap;
};

struct bpe_cache *bpe_cache_create(void) {
    struct bpe_cache *c = xcalloc(1, sizeof *c);
    c->slots = xcalloc(CACHE_SLOTS, sizeof *c->slots);
    return c;
}

void bpe_cache_destroy(struct bpe_cache *c) {
    if (!c) return;
    free(c->slots);
    buf_free(&c->keys);
    free(c->ids);
    free(c);
}

static void cache_clear(struct bpe_cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->count = 0;
    buf_clear(&c->keys);
    c->ids_len = 0;
}

static const struct bpe_cache_slot *cache_find(const struct bpe_cache *c, uint64_t h, const char *w, size_t n,
                                               size_t *slot) {
    size_t i = (size_t)h & (CACHE_SLOTS - 1);
    for (;;) {
        const struct bpe_cache_slot *s = &c->slots[i];
        if (!s->hash) {
            *slot = i;
            return NULL;
        }
        if (s->hash == h && s->key_len == n && !memcmp(c->keys.data + s->key_off, w, n)) return s;
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
}

static void cache_put(struct bpe_cache *c, uint64_t h, const char *w, size_t n, const int32_t *ids, size_t n_ids) {
    size_t slot;
    if (c->count >= CACHE_MAX_ENTRIES) cache_clear(c);
    if (cache_find(c, h, w, n, &slot)) return;
    struct bpe_cache_slot *s = &c->slots[slot];
    s->hash = h;
    s->key_off = (uint32_t)c->keys.len;
    s->key_len = (uint32_t)n;
    buf_append(&c->keys, w, n);
    if (c->ids_len + n_ids > c->ids_cap) {
        c->ids_cap = c->ids_cap ? c->ids_cap * 2 : 4096;
        while (c->ids_cap < c->ids_len + n_ids) c->ids_cap *= 2;
        c->ids = xrealloc(c->ids, c->ids_cap * sizeof *c->ids);
    }
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    s->ids_off = (uint32_t)c->ids_len;
    s->n_ids = (uint32_t)n_ids;
    c->ids_len += n_ids;
    c->count++;
}

/* ---- loading ---------------------------------------------------------- */

static int parse_vocab(struct bpe *m, json_t *vocab, const char *path, struct kiln_error *err) {
    const char *key;
    size_t key_len;
    json_t *val;
    int32_t max_id = -1;
    tok_strmap_init(&m->vocab, json_object_size(vocab));
    json_object_keylen_foreach(vocab, key, key_len, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= BPE_MAX_ID)
            return kiln_errorf(err, "tokenizer.json: %s.vocab[\"%.80s\"]: expected an id in [0, %d)", path, key,
                               BPE_MAX_ID);
        int32_t id = (int32_t)json_integer_value(val);
        tok_strmap_put(&m->vocab, key, key_len, id);
        if (id > max_id) max_id = id;
    }
    m->id_limit = max_id + 1;
    m->id_slot = xmalloc(((size_t)m->id_limit + 1) * sizeof *m->id_slot);
    for (int32_t i = 0; i <= m->id_limit; i++) m->id_slot[i] = UINT32_MAX;
    for (size_t i = 0; i <= m->vocab.mask; i++) {
        const struct tok_strmap_slot *s = &m->vocab.slots[i];
        if (!s->hash) continue;
        /* Two tokens with one id: keep the first in the file (lowest pool
         * offset), for a deterministic decode. */
        uint32_t *d = &m->id_slot[s->value];
        if (*d == UINT32_MAX || s->off < m->vocab.slots[*d].off) *d = (uint32_t)i;
    }
    return 0;
}

static int lookup_merge_part(const struct bpe *m, const char *s, size_t n, const char *where, int32_t *id,
                             struct kiln_error *err) {
    *id = tok_strmap_get(&m->vocab, s, n);
    if (*id < 0) return kiln_errorf(err, "tokenizer.json: %s: token '%.*s' is not in the vocabulary", where, (int)(n > 80 ? 80 : n), s);
    return 0;
}

static int parse_merges(struct bpe *m, json_t *merges, const char *path, int *crossing, struct kiln_error *err) {
    char where[TJ_PATH_MAX];
    struct buf joined = {0};
    int rc = -1;
    tok_pairmap_init(&m->merges, json_array_size(merges));
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t alen, blen;
        tj_path_index(where, sizeof where, path, "merges", i);
        if (json_is_string(e)) {
            /* Legacy form "a b": exactly one space. */
            const char *s = json_string_value(e), *sp = memchr(s, ' ', json_string_length(e));
            size_t n = json_string_length(e);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
                kiln_errorf(err, "tokenizer.json: %s: expected \"left right\" with exactly one space", where);
                goto fail;
            }
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = n - alen - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            alen = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            blen = json_string_length(json_array_get(e, 1));
        } else {
            kiln_errorf(err, "tokenizer.json: %s: expected a string or a pair of strings", where);
            goto fail;
        }
        int32_t ida, idb, idm;
        if (lookup_merge_part(m, a, alen, where, &ida, err) || lookup_merge_part(m, b, blen, where, &idb, err)) goto fail;
        if (blen < m->prefix_len) {
            kiln_errorf(err, "tokenizer.json: %s: '%.*s' is shorter than continuing_subword_prefix", where, (int)blen, b);
            goto fail;
        }
        buf_clear(&joined);
        buf_append(&joined, a, alen);
        buf_append(&joined, b + m->prefix_len, blen - m->prefix_len);
        if (lookup_merge_part(m, joined.data, joined.len, where, &idm, err)) goto fail;
        /* A repeated pair keeps its last rank, as a Rust HashMap collect does. */
        tok_pairmap_put(&m->merges, ida, idb, (int32_t)i, idm);
        if (blen >= 3 && !memcmp(b, METASPACE, 3) && !(alen >= 3 && !memcmp(a + alen - 3, METASPACE, 3)))
            *crossing = 1;
    }
    rc = 0;
fail:
    buf_free(&joined);
    return rc;
}

static char *dup_opt(json_t *obj, const char *path, const char *key, size_t *len, int *rc, struct kiln_error *err) {
    const char *s;
    size_t n;
    if (tj_string(obj, path, key, 0, &s, &n, err)) {
        *rc = -1;
        return NULL;
    }
    if (!s) return NULL;
    char *d = xmalloc(n + 1);
    memcpy(d, s, n + 1);
    if (len) *len = n;
    return d;
}

int bpe_parse(struct bpe *m, json_t *json, const char *path, struct kiln_error *err) {
    const char *type;
    json_t *vocab, *merges, *dropout;
    int rc = 0;
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    for (int i = 0; i < 256; i++) m->byte_ids[i] = -1;
    if (!json_is_object(json)) return kiln_errorf(err, "tokenizer.json: %s: expected an object", path);
    if (tj_string(json, path, "type", 0, &type, NULL, err)) return -1;
    if (!type) {
        /* Older files leave the model type implicit; BPE has merges. */
        if (!json_object_get(json, "merges")) return kiln_errorf(err, "tokenizer.json: %s.type: missing", path);
        type = "BPE";
    }
    if (strcmp(type, "BPE")) return kiln_errorf(err, "tokenizer.json: model type '%s' is not supported (at %s)", type, path);
    dropout = json_object_get(json, "dropout");
    if (dropout && !json_is_null(dropout) && (!json_is_number(dropout) || json_number_value(dropout) != 0.0))
        return kiln_errorf(err, "tokenizer.json: %s.dropout: BPE dropout is not supported (it is random)", path);
    m->unk_token = dup_opt(json, path, "unk_token", NULL, &rc, err);
    m->prefix = dup_opt(json, path, "continuing_subword_prefix", &m->prefix_len, &rc, err);
    m->suffix = dup_opt(json, path, "end_of_word_suffix", &m->suffix_len, &rc, err);
    if (rc) return -1;
    if (tj_bool(json, path, "fuse_unk", 0, &m->fuse_unk, err) ||
        tj_bool(json, path, "byte_fallback", 0, &m->byte_fallback, err) ||
        tj_bool(json, path, "ignore_merges", 0, &m->ignore_merges, err))
        return -1;
    vocab = json_object_get(json, "vocab");
    merges = json_object_get(json, "merges");
    if (!json_is_object(vocab)) return kiln_errorf(err, "tokenizer.json: %s.vocab: expected an object", path);
    if (!json_is_array(merges)) return kiln_errorf(err, "tokenizer.json: %s.merges: expected an array", path);
    int crossing = 0;
    if (parse_vocab(m, vocab, path, err) || parse_merges(m, merges, path, &crossing, err)) return -1;
    m->split_metaspace = !crossing && !m->ignore_merges && !m->prefix && !m->suffix &&
                         tok_strmap_get(&m->vocab, METASPACE, 3) >= 0;
    if (m->unk_token) m->unk_id = tok_strmap_get(&m->vocab, m->unk_token, strlen(m->unk_token));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tok_strmap_get(&m->vocab, name, 6);
    }
    return 0;
}

void bpe_free(struct bpe *m) {
    tok_strmap_free(&m->vocab);
    tok_pairmap_free(&m->merges);
    free(m->id_slot);
    free(m->unk_token);
    free(m->prefix);
    free(m->suffix);
    memset(m, 0, sizeof *m);
}

const char *bpe_id_to_token(const struct bpe *m, int32_t id, size_t *len) {
    if (id < 0 || id >= m->id_limit || m->id_slot[id] == UINT32_MAX) return NULL;
    const struct tok_strmap_slot *s = &m->vocab.slots[m->id_slot[id]];
    if (len) *len = s->len;
    return tok_strmap_key(&m->vocab, s->off);
}

/* ---- encoding --------------------------------------------------------- */

static struct bpe_symbol *symbols(struct tok_ctx *ctx, size_t n) {
    if (n > ctx->syms_cap) {
        ctx->syms_cap = n * 2;
        ctx->syms = xrealloc(ctx->syms, ctx->syms_cap * sizeof *ctx->syms);
    }
    return ctx->syms;
}

static void add_symbol(struct bpe_symbol *sy, size_t *n, int32_t id, size_t len) {
    sy[*n].id = id;
    sy[*n].len = (uint32_t)len;
    (*n)++;
}

static inline int merge_less(const struct bpe_merge *a, const struct bpe_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct tok_ctx *ctx, size_t *n, struct bpe_merge m) {
    if (*n == ctx->heap_cap) {
        ctx->heap_cap = ctx->heap_cap ? ctx->heap_cap * 2 : 256;
        ctx->heap = xrealloc(ctx->heap, ctx->heap_cap * sizeof *ctx->heap);
    }
    struct bpe_merge *h = ctx->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct bpe_merge heap_pop(struct tok_ctx *ctx, size_t *n) {
    struct bpe_merge *h = ctx->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void merge_all(const struct bpe *m, struct tok_ctx *ctx, struct bpe_symbol *sy, size_t n) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_pairmap_slot *s = tok_pairmap_get(&m->merges, sy[i].id, sy[i + 1].id);
        if (s) heap_push(ctx, &hn, (struct bpe_merge){s->rank, (int32_t)i, s->merged});
    }
    while (hn) {
        struct bpe_merge top = heap_pop(ctx, &hn);
        struct bpe_symbol *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        struct bpe_symbol *right = &sy[cur->next];
        const struct tok_pairmap_slot *s = tok_pairmap_get(&m->merges, cur->id, right->id);
        if (!s || s->merged != top.merged) continue; /* stale entry */
        cur->id = top.merged;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) sy[cur->next].prev = top.pos;
        if (cur->prev >= 0) {
            s = tok_pairmap_get(&m->merges, sy[cur->prev].id, cur->id);
            if (s) heap_push(ctx, &hn, (struct bpe_merge){s->rank, cur->prev, s->merged});
        }
        if (cur->next >= 0) {
            s = tok_pairmap_get(&m->merges, cur->id, sy[cur->next].id);
            if (s) heap_push(ctx, &hn, (struct bpe_merge){s->rank, top.pos, s->merged});
        }
    }
}

static int word_one(const struct bpe *m, struct tok_ctx *ctx, const char *w, size_t n, struct kiln_token_ids *out,
                    struct kiln_error *err) {
    if (n == 0) return 0;
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&m->vocab, w, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return 0;
        }
    }
    uint64_t h = 0;
    struct bpe_cache *cache = n < CACHE_MAX_WORD ? ctx->cache : NULL;
    if (cache) {
        size_t slot;
        h = tok_hash(w, n);
        if (!h) h = 1;
        const struct bpe_cache_slot *s = cache_find(cache, h, w, n, &slot);
        if (s) {
            for (uint32_t i = 0; i < s->n_ids; i++) tok_ids_push(out, cache->ids[s->ids_off + i]);
            return 0;
        }
    }

    /* Symbols per character; the unk in flight is (unk_pending, unk_len). */
    struct bpe_symbol *sy = symbols(ctx, n * (1 + m->prefix_len + m->suffix_len) + 2);
    size_t ns = 0, unk_len = 0;
    int unk_pending = 0;
    int decorate = m->prefix || m->suffix;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((unsigned char)w[i]);
        if (i + k > n) k = n - i;
        const char *s = w + i;
        size_t slen = k;
        if (decorate) {
            struct buf *b = &ctx->tmp;
            buf_clear(b);
            if (i > 0 && m->prefix) buf_append(b, m->prefix, m->prefix_len);
            buf_append(b, w + i, k);
            if (i + k == n && m->suffix) buf_append(b, m->suffix, m->suffix_len);
            s = b->data;
            slen = b->len;
        }
        int32_t id = tok_strmap_get(&m->vocab, s, slen);
        if (id >= 0) {
            if (unk_pending) {
                add_symbol(sy, &ns, m->unk_id, unk_len);
                unk_pending = 0;
            }
            add_symbol(sy, &ns, id, k);
        } else {
            int fell_back = 0;
            if (m->byte_fallback) {
                fell_back = 1;
                for (size_t j = 0; j < slen; j++)
                    if (m->byte_ids[(unsigned char)s[j]] < 0) fell_back = 0;
                if (fell_back)
                    for (size_t j = 0; j < slen; j++) add_symbol(sy, &ns, m->byte_ids[(unsigned char)s[j]], 1);
            }
            if (!fell_back && m->unk_token) {
                if (m->unk_id < 0)
                    return kiln_errorf(err, "unk_token '%s' is not in the vocabulary", m->unk_token);
                if (unk_pending && m->fuse_unk) {
                    unk_len += k;
                } else {
                    if (unk_pending) add_symbol(sy, &ns, m->unk_id, unk_len);
                    unk_pending = 1;
                    unk_len = k;
                }
            }
        }
        i += k;
    }
    if (unk_pending) add_symbol(sy, &ns, m->unk_id, unk_len);
    for (size_t i = 0; i < ns; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    if (ns > 1) merge_all(m, ctx, sy, ns);
    size_t first = out->n;
    for (size_t i = 0; i < ns; i++)
        if (sy[i].len) tok_ids_push(out, sy[i].id);
    if (cache) cache_put(cache, h, w, n, out->ids + first, out->n - first);
    return 0;
}

int bpe_word(const struct bpe *m, struct tok_ctx *ctx, const char *w, size_t n, struct kiln_token_ids *out,
             struct kiln_error *err) {
    if (!m->split_metaspace || n <= 3) return word_one(m, ctx, w, n, out, err);
    size_t start = 0, i = 3;
    while (i + 3 <= n) {
        const char *hit = memmem(w + i, n - i, METASPACE, 3);
        if (!hit) break;
        size_t at = (size_t)(hit - w);
        if (memcmp(w + at - 3, METASPACE, 3) != 0) {
            if (word_one(m, ctx, w + start, at - start, out, err)) return -1;
            start = at;
        }
        i = at + 3;
    }
    return word_one(m, ctx, w + start, n - start, out, err);
}
