#include "tokenizer/normalizer.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"

static void normalizer_fini(struct normalizer *n) {
    for (size_t i = 0; i < n->n_children; i++) normalizer_fini(&n->children[i]);
    free(n->children);
    tok_pattern_free(&n->pattern);
    free(n->content);
    memset(n, 0, sizeof *n);
}

void normalizer_free(struct normalizer *n) {
    if (!n) return;
    normalizer_fini(n);
    free(n);
}

static int parse_into(struct normalizer *n, json_t *json, const char *path, int depth, struct kiln_error *err) {
    char buf[TJ_PATH_MAX];
    const char *type;
    memset(n, 0, sizeof *n);
    if (depth > 16) return kiln_errorf(err, "tokenizer.json: %s: Sequence nested too deeply", path);
    if (tj_type(json, path, &type, err)) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        n->type = NORMALIZER_TYPE_SEQUENCE;
        if (tj_array(json, path, "normalizers", &arr, err)) return -1;
        n->children = xcalloc(json_array_size(arr) + 1, sizeof *n->children);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            n->n_children = i + 1;
            if (parse_into(&n->children[i], json_array_get(arr, i), tj_path_index(buf, sizeof buf, path, "normalizers", i),
                           depth + 1, err))
                return -1;
        }
        return 0;
    }
    static const struct {
        const char *name;
        enum normalizer_type type;
    } simple[] = {{"NFC", NORMALIZER_TYPE_NFC},
                  {"NFD", NORMALIZER_TYPE_NFD},
                  {"NFKC", NORMALIZER_TYPE_NFKC},
                  {"NFKD", NORMALIZER_TYPE_NFKD},
                  {"Lowercase", NORMALIZER_TYPE_LOWERCASE},
                  {"StripAccents", NORMALIZER_TYPE_STRIP_ACCENTS}};
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(type, simple[i].name)) {
            n->type = simple[i].type;
            return 0;
        }
    if (!strcmp(type, "Strip")) {
        n->type = NORMALIZER_TYPE_STRIP;
        if (tj_bool(json, path, "strip_left", 1, &n->strip_left, err)) return -1;
        return tj_bool(json, path, "strip_right", 1, &n->strip_right, err);
    }
    if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
        const char *s;
        size_t len;
        int replace = !strcmp(type, "Replace");
        n->type = replace ? NORMALIZER_TYPE_REPLACE : NORMALIZER_TYPE_PREPEND;
        if (replace && tok_pattern_parse(&n->pattern, json, path, "pattern", err)) return -1;
        if (tj_string(json, path, replace ? "content" : "prepend", 1, &s, &len, err)) return -1;
        n->content = xmalloc(len + 1);
        memcpy(n->content, s, len + 1);
        n->content_len = len;
        return 0;
    }
    return kiln_errorf(err, "tokenizer.json: normalizer type '%s' is not supported (at %s)", type, path);
}

int normalizer_parse(struct normalizer **out, json_t *json, const char *path, struct kiln_error *err) {
    *out = NULL;
    if (!json || json_is_null(json)) return 0;
    struct normalizer *n = xcalloc(1, sizeof *n);
    if (parse_into(n, json, path, 0, err)) {
        normalizer_free(n);
        return -1;
    }
    *out = n;
    return 0;
}

static char *arena_copy(struct tok_ctx *ctx, const char *s, size_t n) {
    char *d = tok_arena_alloc(&ctx->arena, n ? n : 1);
    if (n) memcpy(d, s, n);
    return d;
}

/* Whether `cp` may change under the form (a quick check, conservative):
 * for the composed forms a character is stable unless it reorders (nonzero
 * combining class), can be the second half of a composition, or has a
 * decomposition that does not compose back (exclusions, singletons,
 * non-starter decompositions; for NFKC any compatibility mapping). For the
 * decomposed forms anything with a decomposition or a combining class can
 * change, Hangul syllables included. */
static int may_change(enum normalizer_type t, uint32_t cp) {
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)cp);
    int compat = t == NORMALIZER_TYPE_NFKC || t == NORMALIZER_TYPE_NFKD;
    int has_decomp = pr->decomp_seqindex != UINT16_MAX && (compat || pr->decomp_type == 0);
    if (pr->combining_class != 0) return 1;
    if (t == NORMALIZER_TYPE_NFD || t == NORMALIZER_TYPE_NFKD) return has_decomp || (cp >= 0xAC00 && cp <= 0xD7A3);
    if (pr->comb_index != UINT16_MAX && pr->comb_index >= 0x8000) return 1;
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return 1;
    if (!has_decomp) return 0;
    /* Decompose and compose back (in place, no allocation): stable only if
     * that gives the character again. */
    utf8proc_int32_t d[32];
    utf8proc_int32_t last = 0;
    int opts = compat ? UTF8PROC_COMPAT : 0;
    utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, (utf8proc_option_t)(UTF8PROC_DECOMPOSE | opts), &last);
    if (k < 1 || k > 32) return 1;
    k = utf8proc_normalize_utf32(d, k, (utf8proc_option_t)(UTF8PROC_COMPOSE | UTF8PROC_STABLE | opts));
    return !(k == 1 && d[0] == (utf8proc_int32_t)cp);
}

/* may_change, remembered per thread for the characters that needed the
 * decompose/compose round trip (entries: (key << 1 | result) + 1). */
static int may_change_memo(enum normalizer_type t, uint32_t cp, uint32_t *memo) {
    if (!memo) return may_change(t, cp);
    uint32_t key = cp * 4 + (uint32_t)(t - NORMALIZER_TYPE_NFC);
    uint32_t *e = &memo[(key * 2654435761u) >> (32 - TOK_NF_MEMO_BITS)];
    if (*e && (*e - 1) >> 1 == key) return (int)((*e - 1) & 1);
    int r = may_change(t, cp);
    *e = ((key << 1) | (uint32_t)r) + 1;
    return r;
}

int normalizer_is_stable(enum normalizer_type t, const char *s, size_t n, uint32_t *memo) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        i += utf8_decode(s + i, &cp);
        if (may_change_memo(t, cp, memo)) return 0;
    }
    return 1;
}

static int map_region(const struct normalizer *n, const char *s, size_t len, struct buf *out, struct kiln_error *err) {
    int opts = UTF8PROC_STABLE;
    switch (n->type) {
    case NORMALIZER_TYPE_NFC: opts |= UTF8PROC_COMPOSE; break;
    case NORMALIZER_TYPE_NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NORMALIZER_TYPE_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, (utf8proc_option_t)opts);
    if (r < 0) {
        free(dst);
        return kiln_errorf(err, "unicode normalization failed: %s", utf8proc_errmsg(r));
    }
    buf_append(out, dst, (size_t)r);
    free(dst);
    return 0;
}

/* The unicode forms. Every ASCII character is a safe boundary (it never
 * reorders or composes with what precedes it), so text is handled per run
 * of non-ASCII characters, together with the character before the run
 * (which the run may compose with). A run that passes the quick check is
 * copied; only the others go through utf8proc. */
static int unicode_form(const struct normalizer *n, struct tok_ctx *ctx, struct tok_piece *p, struct kiln_error *err) {
    const char *s = p->s;
    size_t len = p->len, i = 0, copied = 0;
    int changed = 0;
    struct buf *b = &ctx->tmp;
    while (i < len) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        size_t a = i;
        while (i < len && (unsigned char)s[i] >= 0x80) i++;
        if (normalizer_is_stable(n->type, s + a, i - a, ctx->nf_memo)) continue;
        if (a > 0) a--; /* the ASCII character before the run */
        if (!changed) buf_clear(b);
        changed = 1;
        buf_append(b, s + copied, a - copied);
        if (map_region(n, s + a, i - a, b, err)) return -1;
        copied = i;
    }
    if (!changed) return 0;
    buf_append(b, s + copied, len - copied);
    /* zp: the first output character keeps the first input's origin;
     * approximate by the first character. */
    size_t zp = p->zp && b->len ? utf8_seq_len((unsigned char)b->data[0]) : 0;
    p->s = arena_copy(ctx, b->data, b->len);
    p->len = b->len;
    p->zp = zp;
    return 0;
}

static void lowercase(struct tok_ctx *ctx, struct tok_piece *p) {
    struct buf *b = &ctx->tmp;
    buf_clear(b);
    size_t zp = 0;
    for (size_t i = 0; i < p->len;) {
        uint32_t cp;
        size_t k = utf8_decode(p->s + i, &cp);
        if (cp < 0x80) {
            buf_push(b, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        } else if (cp == 0x130) {
            /* The one unconditional multi-character lowercase mapping. */
            buf_append(b, "i\xCC\x87", 3);
        } else {
            buf_push_cp(b, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        }
        if (i < p->zp) zp = b->len;
        i += k;
    }
    p->s = arena_copy(ctx, b->data ? b->data : "", b->len);
    p->len = b->len;
    p->zp = zp;
}

static void strip(const struct normalizer *n, struct tok_piece *p) {
    size_t a = 0, e = p->len;
    if (n->strip_left)
        while (a < e) {
            uint32_t cp;
            size_t k = utf8_decode(p->s + a, &cp);
            if (!uc_is_whitespace(cp)) break;
            a += k;
        }
    if (n->strip_right)
        while (e > a) {
            size_t s = utf8_prev(p->s, a, e);
            uint32_t cp;
            utf8_decode(p->s + s, &cp);
            if (!uc_is_whitespace(cp)) break;
            e = s;
        }
    p->zp = p->zp > a ? p->zp - a : 0;
    if (a > 0) p->zp = 0; /* the first kept char comes from past offset 0 */
    p->s += a;
    p->len = e - a;
}

static void strip_accents(struct tok_ctx *ctx, struct tok_piece *p) {
    struct buf *b = &ctx->tmp;
    buf_clear(b);
    size_t zp = 0;
    for (size_t i = 0; i < p->len;) {
        uint32_t cp;
        size_t k = utf8_decode(p->s + i, &cp);
        if (cp < 0x300 || !uc_is_mark(cp)) buf_append(b, p->s + i, k);
        i += k;
        if (i <= p->zp) zp = b->len;
    }
    p->s = arena_copy(ctx, b->data ? b->data : "", b->len);
    p->len = b->len;
    p->zp = zp;
}

static int replace(const struct normalizer *n, struct tok_ctx *ctx, struct tok_piece *p, struct kiln_error *err) {
    if (tok_pattern_find(&n->pattern, ctx, p->s, p->len, err)) return -1;
    if (ctx->spans.n == 0) return 0;
    struct buf *b = &ctx->tmp;
    buf_clear(b);
    size_t prev = 0, zp = p->zp;
    for (size_t i = 0; i < ctx->spans.n; i++) {
        size_t a = ctx->spans.v[2 * i], e = ctx->spans.v[2 * i + 1];
        buf_append(b, p->s + prev, a - prev);
        if (a == 0 && p->zp) {
            /* Replacement text takes the origin of the last replaced char:
             * offset 0 only when a single character at 0 was replaced. */
            size_t first = e > 0 ? utf8_seq_len((unsigned char)p->s[0]) : 0;
            zp = (e == first && n->content_len) ? n->content_len + (p->zp > e ? p->zp - e : 0) : 0;
        }
        buf_append(b, n->content, n->content_len);
        prev = e;
    }
    buf_append(b, p->s + prev, p->len - prev);
    p->s = arena_copy(ctx, b->data, b->len);
    p->len = b->len;
    p->zp = zp;
    return 0;
}

int normalizer_apply(const struct normalizer *n, struct tok_ctx *ctx, struct tok_piece *p, struct kiln_error *err) {
    switch (n->type) {
    case NORMALIZER_TYPE_SEQUENCE:
        for (size_t i = 0; i < n->n_children; i++)
            if (normalizer_apply(&n->children[i], ctx, p, err)) return -1;
        return 0;
    case NORMALIZER_TYPE_NFC:
    case NORMALIZER_TYPE_NFD:
    case NORMALIZER_TYPE_NFKC:
    case NORMALIZER_TYPE_NFKD:
        return unicode_form(n, ctx, p, err);
    case NORMALIZER_TYPE_LOWERCASE:
        lowercase(ctx, p);
        return 0;
    case NORMALIZER_TYPE_STRIP:
        strip(n, p);
        return 0;
    case NORMALIZER_TYPE_STRIP_ACCENTS:
        strip_accents(ctx, p);
        return 0;
    case NORMALIZER_TYPE_REPLACE:
        return replace(n, ctx, p, err);
    case NORMALIZER_TYPE_PREPEND:
        if (p->len == 0) return 0;
        {
            char *d = tok_arena_alloc(&ctx->arena, n->content_len + p->len);
            memcpy(d, n->content, n->content_len);
            memcpy(d + n->content_len, p->s, p->len);
            p->s = d;
            p->len += n->content_len;
            if (p->zp) p->zp += n->content_len;
        }
        return 0;
    }
    return 0;
}
