#include "tokenizer/pretokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"

/* GPT-2's pre-tokenization regex, as ByteLevel(use_regex) uses it. */
#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define WHITESPACE_REGEX "\\w+|[^\\w\\s]+"

static void pretokenizer_fini(struct pretokenizer *p) {
    for (size_t i = 0; i < p->n_children; i++) pretokenizer_fini(&p->children[i]);
    free(p->children);
    tok_pattern_free(&p->pattern);
    memset(p, 0, sizeof *p);
}

void pretokenizer_free(struct pretokenizer *p) {
    if (!p) return;
    pretokenizer_fini(p);
    free(p);
}

static int parse_metaspace(struct pretokenizer *p, json_t *json, const char *path, struct kiln_error *err) {
    const char *scheme;
    int add_prefix_space;
    json_t *aps = json_object_get(json, "add_prefix_space");
    if (tj_char(json, path, "replacement", 0, &p->replacement, err)) return -1;
    p->rep_len = utf8_encode(p->replacement, p->rep);
    if (tj_string(json, path, "prepend_scheme", 0, &scheme, NULL, err)) return -1;
    p->prepend_scheme = PREPEND_SCHEME_ALWAYS;
    if (scheme) {
        if (!strcmp(scheme, "always")) p->prepend_scheme = PREPEND_SCHEME_ALWAYS;
        else if (!strcmp(scheme, "first")) p->prepend_scheme = PREPEND_SCHEME_FIRST;
        else if (!strcmp(scheme, "never")) p->prepend_scheme = PREPEND_SCHEME_NEVER;
        else return kiln_errorf(err, "tokenizer.json: %s.prepend_scheme: unknown value '%s'", path, scheme);
    }
    if (tj_bool(json, path, "add_prefix_space", 1, &add_prefix_space, err)) return -1;
    if (aps && json_is_false(aps)) {
        /* Older files say add_prefix_space: false instead of "never". */
        if (scheme && p->prepend_scheme != PREPEND_SCHEME_NEVER)
            return kiln_errorf(err, "tokenizer.json: %s: add_prefix_space does not match declared prepend_scheme", path);
        p->prepend_scheme = PREPEND_SCHEME_NEVER;
    }
    return tj_bool(json, path, "split", 1, &p->split, err);
}

static int parse_into(struct pretokenizer *p, json_t *json, const char *path, int depth, struct kiln_error *err) {
    char buf[TJ_PATH_MAX];
    const char *type;
    memset(p, 0, sizeof *p);
    if (depth > 16) return kiln_errorf(err, "tokenizer.json: %s: Sequence nested too deeply", path);
    if (tj_type(json, path, &type, err)) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        p->type = PRETOKENIZER_TYPE_SEQUENCE;
        if (tj_array(json, path, "pretokenizers", &arr, err)) return -1;
        p->children = xcalloc(json_array_size(arr) + 1, sizeof *p->children);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            p->n_children = i + 1;
            if (parse_into(&p->children[i], json_array_get(arr, i),
                           tj_path_index(buf, sizeof buf, path, "pretokenizers", i), depth + 1, err))
                return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        p->type = PRETOKENIZER_TYPE_SPLIT;
        if (tok_pattern_parse(&p->pattern, json, path, "pattern", err)) return -1;
        p->has_pattern = 1;
        if (!json_object_get(json, "behavior"))
            return kiln_errorf(err, "tokenizer.json: %s.behavior: missing", path);
        if (tok_split_behavior_parse(json, path, "behavior", SPLIT_BEHAVIOR_ISOLATED, &p->behavior, err)) return -1;
        return tj_bool(json, path, "invert", 0, &p->invert, err);
    }
    if (!strcmp(type, "ByteLevel")) {
        p->type = PRETOKENIZER_TYPE_BYTE_LEVEL;
        if (tj_bool(json, path, "add_prefix_space", 1, &p->add_prefix_space, err)) return -1;
        if (tj_bool(json, path, "use_regex", 1, &p->use_regex, err)) return -1;
        if (p->use_regex) {
            if (tok_pattern_init_regex(&p->pattern, GPT2_REGEX, err)) return -1;
            p->has_pattern = 1;
        }
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        p->type = PRETOKENIZER_TYPE_METASPACE;
        return parse_metaspace(p, json, path, err);
    }
    if (!strcmp(type, "Digits")) {
        p->type = PRETOKENIZER_TYPE_DIGITS;
        return tj_bool(json, path, "individual_digits", 0, &p->individual_digits, err);
    }
    if (!strcmp(type, "Punctuation")) {
        p->type = PRETOKENIZER_TYPE_PUNCTUATION;
        return tok_split_behavior_parse(json, path, "behavior", SPLIT_BEHAVIOR_ISOLATED, &p->behavior, err);
    }
    if (!strcmp(type, "Whitespace")) {
        p->type = PRETOKENIZER_TYPE_WHITESPACE;
        if (tok_pattern_init_regex(&p->pattern, WHITESPACE_REGEX, err)) return -1;
        p->has_pattern = 1;
        return 0;
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        p->type = PRETOKENIZER_TYPE_WHITESPACE_SPLIT;
        return 0;
    }
    if (!strcmp(type, "BertPreTokenizer")) {
        p->type = PRETOKENIZER_TYPE_BERT;
        return 0;
    }
    if (!strcmp(type, "CharDelimiterSplit")) {
        p->type = PRETOKENIZER_TYPE_CHAR_DELIMITER;
        return tj_char(json, path, "delimiter", 0, &p->replacement, err);
    }
    return kiln_errorf(err, "tokenizer.json: pre_tokenizer type '%s' is not supported (at %s)", type, path);
}

int pretokenizer_parse(struct pretokenizer **out, json_t *json, const char *path, struct kiln_error *err) {
    *out = NULL;
    if (!json || json_is_null(json)) return 0;
    struct pretokenizer *p = xcalloc(1, sizeof *p);
    if (parse_into(p, json, path, 0, err)) {
        pretokenizer_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

enum char_class { CHAR_CLASS_NUMERIC, CHAR_CLASS_PUNCT, CHAR_CLASS_SPACE, CHAR_CLASS_EQUAL };

/* Every character of the class is a match of its own, as a `Fn(char) ->
 * bool` pattern is in `tokenizers`. */
static void class_spans(struct tok_ctx *ctx, const struct tok_piece *pc, enum char_class cls, uint32_t ch) {
    ctx->spans.n = 0;
    for (size_t i = 0; i < pc->len;) {
        uint32_t cp;
        size_t k = utf8_decode(pc->s + i, &cp);
        int hit = 0;
        switch (cls) {
        case CHAR_CLASS_NUMERIC: hit = uc_is_numeric(cp); break;
        case CHAR_CLASS_PUNCT: hit = uc_is_punctuation(cp); break;
        case CHAR_CLASS_SPACE: hit = uc_is_whitespace(cp); break;
        case CHAR_CLASS_EQUAL: hit = cp == ch; break;
        }
        if (hit) tok_spans_push(&ctx->spans, i, i + k);
        i += k;
    }
}

static void split_class(struct tok_ctx *ctx, const struct tok_pieces *in, struct tok_pieces *out, enum char_class cls,
                        uint32_t ch, enum split_behavior b) {
    for (size_t i = 0; i < in->n; i++) {
        class_spans(ctx, &in->v[i], cls, ch);
        tok_split_piece(&in->v[i], &ctx->spans, 0, b, out);
    }
}

static int split_pattern(const struct pretokenizer *p, struct tok_ctx *ctx, const struct tok_pieces *in,
                         struct tok_pieces *out, int invert, enum split_behavior b, struct kiln_error *err) {
    for (size_t i = 0; i < in->n; i++) {
        if (tok_pattern_find(&p->pattern, ctx, in->v[i].s, in->v[i].len, err)) return -1;
        tok_split_piece(&in->v[i], &ctx->spans, invert, b, out);
    }
    return 0;
}

/* Maps each byte to its GPT-2 alphabet character. */
static void byte_level_map(struct tok_ctx *ctx, struct tok_piece *pc) {
    char *d = tok_arena_alloc(&ctx->arena, 2 * pc->len);
    size_t o = 0, zp = 0;
    for (size_t i = 0; i < pc->len; i++) {
        o += utf8_encode(bytelevel_cp((unsigned char)pc->s[i]), d + o);
        if (i < pc->zp) zp = o;
    }
    pc->s = d;
    pc->len = o;
    pc->zp = zp;
}

static int byte_level(const struct pretokenizer *p, struct tok_ctx *ctx, const struct tok_pieces *in,
                      struct tok_pieces *out, struct kiln_error *err) {
    size_t start = out->n;
    for (size_t i = 0; i < in->n; i++) {
        struct tok_piece pc = in->v[i];
        if (p->add_prefix_space && pc.s[0] != ' ') {
            char *d = tok_arena_alloc(&ctx->arena, pc.len + 1);
            d[0] = ' ';
            memcpy(d + 1, pc.s, pc.len);
            pc.s = d;
            pc.len++;
            if (pc.zp) pc.zp++;
        }
        if (p->use_regex) {
            if (tok_pattern_find(&p->pattern, ctx, pc.s, pc.len, err)) return -1;
            tok_split_piece(&pc, &ctx->spans, 0, SPLIT_BEHAVIOR_ISOLATED, out);
        } else {
            tok_pieces_push(out, pc.s, pc.len, pc.zp);
        }
    }
    for (size_t i = start; i < out->n; i++) byte_level_map(ctx, &out->v[i]);
    return 0;
}

static void metaspace(const struct pretokenizer *p, struct tok_ctx *ctx, const struct tok_pieces *in,
                      struct tok_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const struct tok_piece *src = &in->v[i];
        size_t spaces = 0;
        for (size_t j = 0; j < src->len; j++) spaces += src->s[j] == ' ';
        char *d = tok_arena_alloc(&ctx->arena, src->len + spaces * (p->rep_len - 1) + p->rep_len);
        size_t o = p->rep_len, zp = 0; /* room for a prepended replacement */
        for (size_t j = 0; j < src->len; j++) {
            if (src->s[j] == ' ') {
                memcpy(d + o, p->rep, p->rep_len);
                o += p->rep_len;
            } else {
                d[o++] = src->s[j];
            }
            if (j < src->zp) zp = o - p->rep_len;
        }
        struct tok_piece pc = {d + p->rep_len, o - p->rep_len, zp};
        int starts = pc.len >= p->rep_len && !memcmp(pc.s, p->rep, p->rep_len);
        int prepend = !starts && (p->prepend_scheme == PREPEND_SCHEME_ALWAYS ||
                                  (p->prepend_scheme == PREPEND_SCHEME_FIRST && src->zp > 0));
        if (prepend) {
            pc.s = d;
            memcpy(d, p->rep, p->rep_len);
            pc.len += p->rep_len;
            if (pc.zp) pc.zp += p->rep_len;
        }
        if (p->split) {
            struct tok_piece one = {pc.s, pc.len, pc.zp};
            ctx->spans.n = 0;
            for (size_t j = 0; j + p->rep_len <= one.len;) {
                if (!memcmp(one.s + j, p->rep, p->rep_len)) {
                    tok_spans_push(&ctx->spans, j, j + p->rep_len);
                    j += p->rep_len;
                } else {
                    j += utf8_seq_len((unsigned char)one.s[j]);
                }
            }
            tok_split_piece(&one, &ctx->spans, 0, SPLIT_BEHAVIOR_MERGED_WITH_NEXT, out);
        } else if (pc.len) {
            tok_pieces_push(out, pc.s, pc.len, pc.zp);
        }
    }
}

static void swap(struct tok_pieces **a, struct tok_pieces **b) {
    struct tok_pieces *t = *a;
    *a = *b;
    *b = t;
}

int pretokenizer_run(const struct pretokenizer *p, struct tok_ctx *ctx, struct tok_pieces **cur,
                     struct tok_pieces **other, struct kiln_error *err) {
    if (p->type == PRETOKENIZER_TYPE_SEQUENCE) {
        for (size_t i = 0; i < p->n_children; i++)
            if (pretokenizer_run(&p->children[i], ctx, cur, other, err)) return -1;
        return 0;
    }
    const struct tok_pieces *in = *cur;
    struct tok_pieces *out = *other;
    out->n = 0;
    switch (p->type) {
    case PRETOKENIZER_TYPE_SEQUENCE:
        break;
    case PRETOKENIZER_TYPE_SPLIT:
        if (split_pattern(p, ctx, in, out, p->invert, p->behavior, err)) return -1;
        break;
    case PRETOKENIZER_TYPE_BYTE_LEVEL:
        if (byte_level(p, ctx, in, out, err)) return -1;
        break;
    case PRETOKENIZER_TYPE_METASPACE:
        metaspace(p, ctx, in, out);
        break;
    case PRETOKENIZER_TYPE_DIGITS:
        split_class(ctx, in, out, CHAR_CLASS_NUMERIC, 0,
                    p->individual_digits ? SPLIT_BEHAVIOR_ISOLATED : SPLIT_BEHAVIOR_CONTIGUOUS);
        break;
    case PRETOKENIZER_TYPE_PUNCTUATION:
        split_class(ctx, in, out, CHAR_CLASS_PUNCT, 0, p->behavior);
        break;
    case PRETOKENIZER_TYPE_WHITESPACE:
        /* Keeps the regex matches, drops what lies between them. */
        if (split_pattern(p, ctx, in, out, 1, SPLIT_BEHAVIOR_REMOVED, err)) return -1;
        break;
    case PRETOKENIZER_TYPE_WHITESPACE_SPLIT:
        split_class(ctx, in, out, CHAR_CLASS_SPACE, 0, SPLIT_BEHAVIOR_REMOVED);
        break;
    case PRETOKENIZER_TYPE_CHAR_DELIMITER:
        split_class(ctx, in, out, CHAR_CLASS_EQUAL, p->replacement, SPLIT_BEHAVIOR_REMOVED);
        break;
    case PRETOKENIZER_TYPE_BERT:
        split_class(ctx, in, out, CHAR_CLASS_SPACE, 0, SPLIT_BEHAVIOR_REMOVED);
        swap(cur, other);
        in = *cur;
        out = *other;
        out->n = 0;
        split_class(ctx, in, out, CHAR_CLASS_PUNCT, 0, SPLIT_BEHAVIOR_ISOLATED);
        break;
    }
    swap(cur, other);
    return 0;
}
