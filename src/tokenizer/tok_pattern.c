#include "tokenizer/tok_pattern.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"

int tok_pattern_init_regex(struct tok_pattern *p, const char *re, struct kiln_error *err) {
    memset(p, 0, sizeof *p);
    p->is_regex = 1;
    return tok_regex_compile(&p->re, re, strlen(re), err);
}

int tok_pattern_parse(struct tok_pattern *p, json_t *obj, const char *path, const char *key, struct kiln_error *err) {
    char buf[TJ_PATH_MAX];
    memset(p, 0, sizeof *p);
    const char *where = tj_path(buf, sizeof buf, path, key);
    json_t *v = json_object_get(obj, key);
    if (!json_is_object(v)) return kiln_errorf(err, "tokenizer.json: %s: expected {\"String\": ...} or {\"Regex\": ...}", where);
    json_t *s = json_object_get(v, "String"), *r = json_object_get(v, "Regex");
    if (json_is_string(s)) {
        p->literal_len = json_string_length(s);
        p->literal = xmalloc(p->literal_len + 1);
        memcpy(p->literal, json_string_value(s), p->literal_len + 1);
        if (p->literal_len == 0) {
            /* `tokenizers` compiles the escaped literal as a regex; the empty
             * one matches the empty string everywhere. */
            p->is_regex = 1;
            if (tok_regex_compile(&p->re, "", 0, err)) return kiln_error_prefix(err, "tokenizer.json: %s", where);
        }
        return 0;
    }
    if (json_is_string(r)) {
        p->is_regex = 1;
        if (tok_regex_compile(&p->re, json_string_value(r), json_string_length(r), err))
            return kiln_error_prefix(err, "tokenizer.json: %s.Regex", where);
        return 0;
    }
    return kiln_errorf(err, "tokenizer.json: %s: expected {\"String\": ...} or {\"Regex\": ...}", where);
}

void tok_pattern_free(struct tok_pattern *p) {
    free(p->literal);
    tok_regex_free(&p->re);
    memset(p, 0, sizeof *p);
}

int tok_pattern_find(const struct tok_pattern *p, struct tok_ctx *ctx, const char *s, size_t n, struct kiln_error *err) {
    ctx->spans.n = 0;
    if (p->is_regex) return tok_regex_find_all(&p->re, ctx->md, ctx->mc, s, n, &ctx->spans, err);
    size_t pos = 0, m = p->literal_len;
    while (pos + m <= n) {
        const char *hit = memmem(s + pos, n - pos, p->literal, m);
        if (!hit) break;
        size_t a = (size_t)(hit - s);
        tok_spans_push(&ctx->spans, a, a + m);
        pos = a + m;
    }
    return 0;
}

int tok_split_behavior_parse(json_t *obj, const char *path, const char *key, enum split_behavior dflt,
                             enum split_behavior *out, struct kiln_error *err) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *v;
    if (tj_string(obj, path, key, 0, &v, NULL, err)) return -1;
    if (!v) {
        *out = dflt;
        return 0;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v, names[i])) {
            *out = (enum split_behavior)i;
            return 0;
        }
    return kiln_errorf(err, "tokenizer.json: %s%s%s: unknown split behavior '%s'", path, *path ? "." : "", key, v);
}

struct seg {
    size_t a, b;
    int match;
};

static void emit(const struct tok_piece *piece, size_t a, size_t b, struct tok_pieces *out) {
    if (a >= b) return;
    tok_pieces_push(out, piece->s + a, b - a, piece->zp > a ? piece->zp - a : 0);
}

void tok_split_piece(const struct tok_piece *piece, const struct tok_spans *matches, int invert,
                     enum split_behavior behavior, struct tok_pieces *out) {
    if (piece->len == 0) return;
    /* Segments covering the piece: gaps (not matched) and matches, in order;
     * an empty match stays a segment of its own as it does in `tokenizers`. */
    size_t cap = 2 * matches->n + 1, n = 0;
    struct seg small[64];
    struct seg *segs = cap <= 64 ? small : xmalloc(cap * sizeof *segs);
    size_t prev = 0;
    for (size_t i = 0; i < matches->n; i++) {
        size_t a = matches->v[2 * i], b = matches->v[2 * i + 1];
        if (prev != a) segs[n++] = (struct seg){prev, a, invert};
        segs[n++] = (struct seg){a, b, !invert};
        prev = b;
    }
    if (prev != piece->len) segs[n++] = (struct seg){prev, piece->len, invert};

    switch (behavior) {
    case SPLIT_BEHAVIOR_ISOLATED:
        for (size_t i = 0; i < n; i++) emit(piece, segs[i].a, segs[i].b, out);
        break;
    case SPLIT_BEHAVIOR_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!segs[i].match) emit(piece, segs[i].a, segs[i].b, out);
        break;
    case SPLIT_BEHAVIOR_MERGED_WITH_PREVIOUS:
    case SPLIT_BEHAVIOR_CONTIGUOUS: {
        /* Fold into the previous output range in place: k ranges kept. */
        size_t k = 0;
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            int join = behavior == SPLIT_BEHAVIOR_CONTIGUOUS ? segs[i].match == prev_match
                                                             : segs[i].match && !prev_match;
            if (join && k > 0) {
                segs[k - 1].b = segs[i].b;
            } else {
                segs[k++] = segs[i];
            }
            prev_match = segs[i].match;
        }
        for (size_t i = 0; i < k; i++) emit(piece, segs[i].a, segs[i].b, out);
        break;
    }
    case SPLIT_BEHAVIOR_MERGED_WITH_NEXT: {
        /* The same fold from the right end: ranges grow leftwards. */
        size_t k = n; /* kept ranges occupy segs[k..n) */
        int prev_match = 0;
        for (size_t i = n; i-- > 0;) {
            struct seg s = segs[i];
            if (s.match && !prev_match && k < n) {
                segs[k].a = s.a;
            } else {
                segs[--k] = s;
            }
            prev_match = s.match;
        }
        for (size_t i = k; i < n; i++) emit(piece, segs[i].a, segs[i].b, out);
        break;
    }
    }
    if (segs != small) free(segs);
}
