/* token_bytes.c — every token's raw bytes (kiln_tokenizer_token_bytes).
 *
 * A grammar matches bytes, so it needs to know which bytes each token
 * stands for in the middle of a text, not how a whole list decodes. The
 * decoder's stages are applied to one token at a time, as they would act
 * on it inside a sequence:
 *  - ByteLevel: a token whose characters are all in GPT-2's byte alphabet
 *    stands for those bytes (which may be a piece of a UTF-8 sequence),
 *    any other token for its own UTF-8;
 *  - Metaspace: the replacement character (U+2581) is a space (the rule
 *    that drops the first token's leading space applies to the start of a
 *    text only, which a generated token never is);
 *  - ByteFallback: "<0xNN>" is the byte NN;
 *  - Replace: the pattern's matches inside the token are replaced;
 *  - Strip, Fuse and no decoder at all: nothing within a token.
 * Added tokens go through the same stages from their content, as decode
 * does; special ones are flagged.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/tokenizer_impl.h"

void kiln_token_bytes_free(struct kiln_token_bytes *v) {
    if (!v) return;
    free(v->data);
    free((void *)v->bytes);
    free(v->lens);
    free(v->special);
    memset(v, 0, sizeof *v);
}

static void stage_byte_level(struct buf *in, struct buf *out) {
    buf_clear(out);
    for (size_t k = 0; k < in->len;) {
        uint32_t cp;
        k += utf8_decode(in->data + k, &cp);
        int b = bytelevel_byte(cp);
        if (b < 0) return; /* not a byte token: left as it is */
        buf_push(out, (char)b);
    }
    buf_clear(in);
    if (out->len) buf_append(in, out->data, out->len);
}

static void stage_metaspace(const struct decoder *d, struct buf *in, struct buf *out) {
    buf_clear(out);
    for (size_t k = 0; k < in->len;) {
        if (k + d->rep_len <= in->len && !memcmp(in->data + k, d->rep, d->rep_len)) {
            buf_push(out, ' ');
            k += d->rep_len;
        } else {
            buf_push(out, in->data[k++]);
        }
    }
    buf_clear(in);
    if (out->len) buf_append(in, out->data, out->len);
}

/* "<0xNN>" (the same reading as the ByteFallback decoder's). */
static void stage_byte_fallback(struct buf *in) {
    if (in->len != 6 || memcmp(in->data, "<0x", 3) || in->data[5] != '>') return;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = in->data[k];
        int x;
        if (k == 3 && c == '+') continue;
        if (c >= '0' && c <= '9') x = c - '0';
        else if (c >= 'a' && c <= 'f') x = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') x = c - 'A' + 10;
        else return;
        v = v * 16 + x;
    }
    buf_clear(in);
    buf_push(in, (char)v);
}

static int stage_replace(const struct decoder *d, struct tok_ctx *ctx, struct buf *in, struct buf *out) {
    size_t done = 0;
    buf_clear(out);
    if (!in->len) return 0;
    if (d->pattern.is_regex) {
        struct kiln_error e;
        if (tok_pattern_find(&d->pattern, ctx, in->data, in->len, &e)) return -1;
        for (size_t k = 0; k < ctx->spans.n; k++) {
            size_t a = ctx->spans.v[2 * k], b = ctx->spans.v[2 * k + 1];
            buf_append(out, in->data + done, a - done);
            buf_append(out, d->content, d->content_len);
            done = b;
        }
    } else if (d->pattern.literal_len) {
        const char *lit = d->pattern.literal;
        size_t m = d->pattern.literal_len;
        const char *hit;
        while ((hit = memmem(in->data + done, in->len - done, lit, m))) {
            size_t a = (size_t)(hit - in->data);
            buf_append(out, in->data + done, a - done);
            buf_append(out, d->content, d->content_len);
            done = a + m;
        }
    }
    buf_append(out, in->data + done, in->len - done);
    buf_clear(in);
    buf_append(in, out->data, out->len);
    return 0;
}

static int apply(const struct decoder *d, struct tok_ctx *ctx, struct buf *in, struct buf *tmp) {
    if (!d) return 0;
    switch (d->type) {
    case DECODER_TYPE_SEQUENCE:
        for (size_t i = 0; i < d->n_children; i++)
            if (apply(&d->children[i], ctx, in, tmp)) return -1;
        return 0;
    case DECODER_TYPE_BYTE_LEVEL:
        stage_byte_level(in, tmp);
        return 0;
    case DECODER_TYPE_METASPACE:
        stage_metaspace(d, in, tmp);
        return 0;
    case DECODER_TYPE_BYTE_FALLBACK:
        stage_byte_fallback(in);
        return 0;
    case DECODER_TYPE_REPLACE:
        return stage_replace(d, ctx, in, tmp);
    default: /* Fuse, Strip, Join */
        return 0;
    }
}

int kiln_tokenizer_token_bytes(const struct kiln_tokenizer *t, struct kiln_token_bytes *out,
                               struct kiln_error *err) {
    memset(out, 0, sizeof *out);
    int32_t n = t->id_limit;
    struct buf all = {0}, cur = {0}, tmp = {0};
    struct tok_ctx ctx;
    size_t *off = xcalloc((size_t)n + 1, sizeof *off);
    uint8_t *have = xcalloc((size_t)n + 1, 1);
    int rc = -1;
    tok_ctx_init(&ctx);
    out->lens = xcalloc((size_t)n + 1, sizeof *out->lens);
    out->special = xcalloc((size_t)n + 1, 1);
    for (int32_t id = 0; id < n; id++) {
        const char *s;
        size_t len;
        if (!tok_decode_str(t, id, &s, &len)) continue;
        buf_clear(&cur);
        buf_append(&cur, s, len);
        if (apply(t->decoder, &ctx, &cur, &tmp)) {
            kiln_errorf(err, "token %d: the decoder's Replace pattern failed on it", (int)id);
            goto fail;
        }
        off[id] = all.len;
        buf_append(&all, cur.data ? cur.data : "", cur.len);
        out->lens[id] = cur.len;
        out->special[id] = t->special[id];
        have[id] = 1;
        tok_arena_reset(&ctx.arena);
    }
    buf_reserve(&all, 0);
    out->data = buf_take(&all);
    out->bytes = xcalloc((size_t)n + 1, sizeof *out->bytes);
    for (int32_t id = 0; id < n; id++)
        if (have[id]) out->bytes[id] = out->data + off[id];
    out->n = n;
    rc = 0;
fail:
    if (rc) kiln_token_bytes_free(out);
    tok_ctx_free(&ctx);
    buf_free(&all);
    buf_free(&cur);
    buf_free(&tmp);
    free(off);
    free(have);
    return rc;
}
