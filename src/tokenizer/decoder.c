#include "tokenizer/decoder.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"

#define REPLACEMENT_CHAR "\xEF\xBF\xBD"

/* ---- loading ---------------------------------------------------------- */

static void decoder_fini(struct decoder *d) {
    for (size_t i = 0; i < d->n_children; i++) decoder_fini(&d->children[i]);
    free(d->children);
    tok_pattern_free(&d->pattern);
    free(d->content);
    memset(d, 0, sizeof *d);
}

void decoder_free(struct decoder *d) {
    if (!d) return;
    decoder_fini(d);
    free(d);
}

static int parse_into(struct decoder *d, json_t *json, const char *path, int depth, struct kiln_error *err) {
    char buf[TJ_PATH_MAX];
    const char *type;
    memset(d, 0, sizeof *d);
    if (depth > 16) return kiln_errorf(err, "tokenizer.json: %s: Sequence nested too deeply", path);
    if (tj_type(json, path, &type, err)) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        d->type = DECODER_TYPE_SEQUENCE;
        if (tj_array(json, path, "decoders", &arr, err)) return -1;
        d->children = xcalloc(json_array_size(arr) + 1, sizeof *d->children);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            d->n_children = i + 1;
            if (parse_into(&d->children[i], json_array_get(arr, i), tj_path_index(buf, sizeof buf, path, "decoders", i),
                           depth + 1, err))
                return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        d->type = DECODER_TYPE_BYTE_LEVEL;
        return 0;
    }
    if (!strcmp(type, "ByteFallback")) {
        d->type = DECODER_TYPE_BYTE_FALLBACK;
        return 0;
    }
    if (!strcmp(type, "Fuse")) {
        d->type = DECODER_TYPE_FUSE;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        uint32_t rep;
        const char *scheme;
        int aps;
        d->type = DECODER_TYPE_METASPACE;
        if (tj_char(json, path, "replacement", 0, &rep, err)) return -1;
        d->rep_len = utf8_encode(rep, d->rep);
        if (tj_string(json, path, "prepend_scheme", 0, &scheme, NULL, err)) return -1;
        if (tj_bool(json, path, "add_prefix_space", 1, &aps, err)) return -1;
        if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never"))
            return kiln_errorf(err, "tokenizer.json: %s.prepend_scheme: unknown value '%s'", path, scheme);
        if (!aps && scheme && strcmp(scheme, "never"))
            return kiln_errorf(err, "tokenizer.json: %s: add_prefix_space does not match declared prepend_scheme", path);
        d->prepend = aps && !(scheme && !strcmp(scheme, "never"));
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        int64_t start, stop;
        d->type = DECODER_TYPE_STRIP;
        if (tj_char(json, path, "content", 0, &d->strip_char, err)) return -1;
        if (tj_uint(json, path, "start", 0, 1 << 20, &start, err) || tj_uint(json, path, "stop", 0, 1 << 20, &stop, err))
            return -1;
        d->strip_start = (size_t)start;
        d->strip_stop = (size_t)stop;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const char *s;
        size_t n;
        d->type = DECODER_TYPE_REPLACE;
        if (tok_pattern_parse(&d->pattern, json, path, "pattern", err)) return -1;
        if (tj_string(json, path, "content", 1, &s, &n, err)) return -1;
        d->content = xmalloc(n + 1);
        memcpy(d->content, s, n + 1);
        d->content_len = n;
        return 0;
    }
    return kiln_errorf(err, "tokenizer.json: decoder type '%s' is not supported (at %s)", type, path);
}

int decoder_parse(struct decoder **out, json_t *json, const char *path, struct kiln_error *err) {
    *out = NULL;
    if (!json || json_is_null(json)) return 0;
    struct decoder *d = xcalloc(1, sizeof *d);
    if (parse_into(d, json, path, 0, err)) {
        decoder_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

/* ---- the stage pipeline ------------------------------------------------ */

static const struct decoder join_decoder = {.type = DECODER_TYPE_JOIN};

static size_t count_leaves(const struct decoder *d) {
    if (d->type != DECODER_TYPE_SEQUENCE) return 1;
    size_t n = 0;
    for (size_t i = 0; i < d->n_children; i++) n += count_leaves(&d->children[i]);
    return n;
}

static void add_leaves(struct dec_run *r, const struct decoder *d) {
    if (d->type != DECODER_TYPE_SEQUENCE) {
        r->stages[r->n_stages++].d = d;
        return;
    }
    for (size_t i = 0; i < d->n_children; i++) add_leaves(r, &d->children[i]);
}

void dec_run_init(struct dec_run *r, const struct decoder *d) {
    memset(r, 0, sizeof *r);
    if (!d) d = &join_decoder;
    size_t n = count_leaves(d);
    r->stages = xcalloc(n + 1, sizeof *r->stages);
    add_leaves(r, d);
    for (size_t i = 0; i < r->n_stages; i++) {
        const struct decoder *s = r->stages[i].d;
        if (s->type == DECODER_TYPE_REPLACE && s->pattern.is_regex && !r->ctx) {
            r->ctx = xmalloc(sizeof *r->ctx);
            tok_ctx_init(r->ctx);
        }
    }
}

/* Forgets all state (keeps r->out). */
static void dec_run_reset(struct dec_run *r) {
    for (size_t i = 0; i < r->n_stages; i++) {
        struct dec_stage *s = &r->stages[i];
        buf_clear(&s->buf);
        buf_clear(&s->bytes);
        s->index = s->lead = s->held = s->checked = 0;
        s->lead_done = s->open = s->invalid = 0;
    }
}

void dec_run_free(struct dec_run *r) {
    for (size_t i = 0; i < r->n_stages; i++) {
        buf_free(&r->stages[i].buf);
        buf_free(&r->stages[i].bytes);
    }
    free(r->stages);
    buf_free(&r->out);
    if (r->ctx) {
        tok_ctx_free(r->ctx);
        free(r->ctx);
    }
    memset(r, 0, sizeof *r);
}

static void on_begin(struct dec_run *r, size_t i);
static void on_data(struct dec_run *r, size_t i, const char *p, size_t n);
static void on_end(struct dec_run *r, size_t i);
static int on_finish(struct dec_run *r, size_t i);

static void emit_token(struct dec_run *r, size_t i, const char *p, size_t n) {
    on_begin(r, i);
    on_data(r, i, p, n);
    on_end(r, i);
}

/* Longest proper prefix of `lit` that `s` ends with. */
static size_t partial_suffix(const char *s, size_t n, const char *lit, size_t m) {
    size_t k = m - 1 < n ? m - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, lit, k)) return k;
    return 0;
}

/* Replace: literal patterns stream (keeping a tail that could start a
 * match); regex patterns wait for the whole token. */
static int replace_flush(struct dec_run *r, size_t i, int all) {
    struct dec_stage *st = &r->stages[i];
    const struct decoder *d = st->d;
    const char *s = st->buf.data;
    size_t n = st->buf.len, done = 0;
    if (!n) return 0;
    if (d->pattern.is_regex) {
        if (!all) return 0;
        struct kiln_error e;
        if (tok_pattern_find(&d->pattern, r->ctx, s, n, &e)) return -1;
        for (size_t k = 0; k < r->ctx->spans.n; k++) {
            size_t a = r->ctx->spans.v[2 * k], b = r->ctx->spans.v[2 * k + 1];
            if (a > done) on_data(r, i + 1, s + done, a - done);
            on_data(r, i + 1, d->content, d->content_len);
            done = b;
        }
    } else {
        const char *lit = d->pattern.literal;
        size_t m = d->pattern.literal_len;
        for (;;) {
            const char *hit = memmem(s + done, n - done, lit, m);
            if (!hit) break;
            size_t a = (size_t)(hit - s);
            if (a > done) on_data(r, i + 1, s + done, a - done);
            on_data(r, i + 1, d->content, d->content_len);
            done = a + m;
        }
        if (!all) {
            size_t keep = partial_suffix(s + done, n - done, lit, m);
            if (n - keep > done) on_data(r, i + 1, s + done, n - keep - done);
            memmove(st->buf.data, s + n - keep, keep);
            st->buf.len = keep;
            st->buf.data[keep] = 0;
            return 0;
        }
    }
    if (n > done) on_data(r, i + 1, s + done, n - done);
    buf_clear(&st->buf);
    return 0;
}

/* "<0xAB>" as `tokenizers` reads it (u8::from_str_radix, which also takes
 * a leading '+'); -1 when the token is not a byte. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int x;
        if (k == 3 && c == '+') continue;
        if (c >= '0' && c <= '9') x = c - '0';
        else if (c >= 'a' && c <= 'f') x = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') x = c - 'A' + 10;
        else return -1;
        v = v * 16 + x;
    }
    return v;
}

/* State of the byte run: 1 valid, 0 a valid prefix so far, -1 invalid.
 * Only the bytes after the last whole character are looked at, so a run of
 * n byte tokens costs O(n), not O(n^2). */
static int run_state(struct dec_stage *st) {
    const unsigned char *u = (const unsigned char *)st->bytes.data;
    while (st->checked < st->bytes.len) {
        size_t el;
        int inc;
        size_t k = utf8_next(u + st->checked, st->bytes.len - st->checked, &el, &inc);
        if (!k) return inc ? 0 : -1;
        st->checked += k;
    }
    return 1;
}

static void run_clear(struct dec_stage *st) {
    buf_clear(&st->bytes);
    st->checked = 0;
}

static void fallback_flush(struct dec_run *r, size_t i) {
    struct dec_stage *st = &r->stages[i];
    if (!st->invalid && st->bytes.len) {
        if (run_state(st) == 1) {
            emit_token(r, i + 1, st->bytes.data, st->bytes.len);
        } else {
            for (size_t k = 0; k < st->bytes.len; k++) emit_token(r, i + 1, REPLACEMENT_CHAR, 3);
        }
    }
    st->invalid = 0;
    run_clear(st);
}

static void fallback_token(struct dec_run *r, size_t i) {
    struct dec_stage *st = &r->stages[i];
    int b = byte_token(st->buf.data ? st->buf.data : "", st->buf.len);
    if (b < 0) {
        fallback_flush(r, i);
        emit_token(r, i + 1, st->buf.data ? st->buf.data : "", st->buf.len);
        return;
    }
    if (st->invalid) {
        /* The run is already known to be invalid: one U+FFFD per byte. */
        emit_token(r, i + 1, REPLACEMENT_CHAR, 3);
        return;
    }
    char c = (char)b;
    buf_append(&st->bytes, &c, 1);
    if (run_state(st) < 0) {
        for (size_t k = 0; k < st->bytes.len; k++) emit_token(r, i + 1, REPLACEMENT_CHAR, 3);
        run_clear(st);
        st->invalid = 1;
    }
}

static void strip_data(struct dec_run *r, size_t i, const char *p, size_t n) {
    struct dec_stage *st = &r->stages[i];
    const struct decoder *d = st->d;
    char c[4];
    size_t clen = utf8_encode(d->strip_char, c);
    size_t run = 0; /* start of text to pass on unchanged */
    for (size_t k = 0; k < n;) {
        uint32_t cp;
        size_t len = utf8_decode(p + k, &cp);
        if (!st->lead_done) {
            if (st->lead < d->strip_start && cp == d->strip_char) {
                st->lead++;
                k += len;
                run = k;
                continue;
            }
            st->lead_done = 1;
        }
        if (d->strip_stop && cp == d->strip_char) {
            /* Hold back up to strip_stop of them: they go if the token ends. */
            if (k > run) on_data(r, i + 1, p + run, k - run);
            k += len;
            run = k;
            if (++st->held > d->strip_stop) {
                on_data(r, i + 1, c, clen);
                st->held--;
            }
            continue;
        }
        if (st->held) {
            if (k > run) on_data(r, i + 1, p + run, k - run);
            for (; st->held; st->held--) on_data(r, i + 1, c, clen);
            run = k;
        }
        k += len;
    }
    if (n > run) on_data(r, i + 1, p + run, n - run);
}

static void metaspace_data(struct dec_run *r, size_t i, const char *p, size_t n) {
    struct dec_stage *st = &r->stages[i];
    const struct decoder *d = st->d;
    size_t run = 0;
    for (size_t k = 0; k + d->rep_len <= n;) {
        if (memcmp(p + k, d->rep, d->rep_len)) {
            k += utf8_seq_len((unsigned char)p[k]);
            continue;
        }
        if (k > run) on_data(r, i + 1, p + run, k - run);
        if (!(st->index == 0 && d->prepend)) on_data(r, i + 1, " ", 1);
        k += d->rep_len;
        run = k;
    }
    if (n > run) on_data(r, i + 1, p + run, n - run);
}

/* ByteLevel: a token whose characters are all in the byte alphabet stands
 * for those bytes, any other token for its own UTF-8. */
static void byte_level_token(struct dec_run *r, size_t i, int final) {
    struct dec_stage *st = &r->stages[i];
    if (!final) {
        const char *s = st->buf.data ? st->buf.data : "";
        size_t n = st->buf.len, start = st->bytes.len;
        int mapped = 1;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            k += utf8_decode(s + k, &cp);
            int b = bytelevel_byte(cp);
            if (b < 0) {
                mapped = 0;
                break;
            }
            buf_push(&st->bytes, (char)b);
        }
        if (!mapped) {
            st->bytes.len = start;
            buf_append(&st->bytes, s, n);
        }
    }
    struct buf tmp = {0};
    size_t used = utf8_lossy_append(&tmp, st->bytes.data ? st->bytes.data : "", st->bytes.len, final);
    if (tmp.len) {
        if (!st->open) {
            st->open = 1;
            on_begin(r, i + 1);
        }
        on_data(r, i + 1, tmp.data, tmp.len);
    }
    buf_free(&tmp);
    if (used) {
        memmove(st->bytes.data, st->bytes.data + used, st->bytes.len - used);
        st->bytes.len -= used;
    }
}

static void on_begin(struct dec_run *r, size_t i) {
    if (i == r->n_stages) return;
    struct dec_stage *st = &r->stages[i];
    switch (st->d->type) {
    case DECODER_TYPE_JOIN:
        if (st->index > 0) on_data(r, i + 1, " ", 1);
        break;
    case DECODER_TYPE_FUSE:
        if (!st->open) {
            st->open = 1;
            on_begin(r, i + 1);
        }
        break;
    case DECODER_TYPE_STRIP:
        st->lead = st->held = 0;
        st->lead_done = 0;
        on_begin(r, i + 1);
        break;
    case DECODER_TYPE_BYTE_LEVEL:
    case DECODER_TYPE_BYTE_FALLBACK:
        buf_clear(&st->buf);
        break;
    case DECODER_TYPE_REPLACE:
        buf_clear(&st->buf);
        on_begin(r, i + 1);
        break;
    default:
        on_begin(r, i + 1);
        break;
    }
}

static void on_data(struct dec_run *r, size_t i, const char *p, size_t n) {
    if (i == r->n_stages) {
        buf_append(&r->out, p, n);
        return;
    }
    struct dec_stage *st = &r->stages[i];
    switch (st->d->type) {
    case DECODER_TYPE_STRIP:
        strip_data(r, i, p, n);
        break;
    case DECODER_TYPE_METASPACE:
        metaspace_data(r, i, p, n);
        break;
    case DECODER_TYPE_REPLACE:
        buf_append(&st->buf, p, n);
        if (!st->d->pattern.is_regex) replace_flush(r, i, 0);
        break;
    case DECODER_TYPE_BYTE_LEVEL:
    case DECODER_TYPE_BYTE_FALLBACK:
        buf_append(&st->buf, p, n);
        break;
    default:
        on_data(r, i + 1, p, n);
        break;
    }
}

static void on_end(struct dec_run *r, size_t i) {
    if (i == r->n_stages) return;
    struct dec_stage *st = &r->stages[i];
    switch (st->d->type) {
    case DECODER_TYPE_JOIN:
        st->index++;
        break;
    case DECODER_TYPE_FUSE:
        break;
    case DECODER_TYPE_STRIP:
        st->held = 0; /* trailing characters stripped */
        on_end(r, i + 1);
        break;
    case DECODER_TYPE_METASPACE:
        st->index++;
        on_end(r, i + 1);
        break;
    case DECODER_TYPE_REPLACE:
        /* A regex that PCRE2 gives up on leaves the token as it is. */
        if (replace_flush(r, i, 1)) {
            on_data(r, i + 1, st->buf.data, st->buf.len);
            buf_clear(&st->buf);
        }
        on_end(r, i + 1);
        break;
    case DECODER_TYPE_BYTE_FALLBACK:
        fallback_token(r, i);
        break;
    case DECODER_TYPE_BYTE_LEVEL:
        byte_level_token(r, i, 0);
        break;
    default:
        on_end(r, i + 1);
        break;
    }
}

static int on_finish(struct dec_run *r, size_t i) {
    if (i == r->n_stages) return 0;
    struct dec_stage *st = &r->stages[i];
    switch (st->d->type) {
    case DECODER_TYPE_FUSE:
        /* Fuse of nothing is still one (empty) token. */
        if (!st->open) on_begin(r, i + 1);
        st->open = 0;
        on_end(r, i + 1);
        break;
    case DECODER_TYPE_BYTE_LEVEL:
        byte_level_token(r, i, 1);
        if (!st->open) on_begin(r, i + 1);
        st->open = 0;
        on_end(r, i + 1);
        break;
    case DECODER_TYPE_BYTE_FALLBACK:
        fallback_flush(r, i);
        break;
    default:
        break;
    }
    return on_finish(r, i + 1);
}

int dec_run_token(struct dec_run *r, const char *s, size_t n) {
    emit_token(r, 0, s, n);
    return 0;
}

int dec_run_finish(struct dec_run *r) {
    int rc = on_finish(r, 0);
    dec_run_reset(r);
    return rc;
}
