/* detok_stream.c — incremental detokenization on top of the streaming
 * decoder pipeline (decoder.h): each id goes through the stages as one
 * token; what reaches the end of the pipeline can no longer change. */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tokenizer/tokenizer_impl.h"

struct kiln_detok_stream {
    const struct kiln_tokenizer *tok;
    int skip_special;
    struct dec_run run;
};

int kiln_detok_stream_init(struct kiln_detok_stream **out, const struct kiln_tokenizer *tok, int skip_special_tokens) {
    struct kiln_detok_stream *s = xcalloc(1, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special_tokens;
    dec_run_init(&s->run, tok->decoder);
    *out = s;
    return 0;
}

void kiln_detok_stream_free(struct kiln_detok_stream *s) {
    if (!s) return;
    dec_run_free(&s->run);
    free(s);
}

/* Whether some stage holds text back that later ids can still change. */
static int holds_text(const struct dec_run *r) {
    for (size_t i = 0; i < r->n_stages; i++) {
        const struct dec_stage *st = &r->stages[i];
        if (st->bytes.len || st->held) return 1;
        if (st->d->type == DECODER_TYPE_REPLACE && st->buf.len) return 1;
    }
    return 0;
}

int kiln_detok_stream_prime(struct kiln_detok_stream *s, const int32_t *ids, size_t n) {
    const char *t;
    size_t len;
    for (size_t i = 0; i < n; i++) kiln_detok_stream_push(s, ids[i], &t, &len);
    buf_clear(&s->run.out);
    if (holds_text(&s->run)) {
        dec_run_free(&s->run);
        dec_run_init(&s->run, s->tok->decoder);
    }
    return 0;
}

static void result(struct kiln_detok_stream *s, const char **text, size_t *len) {
    *text = s->run.out.data ? s->run.out.data : "";
    *len = s->run.out.len;
}

int kiln_detok_stream_push(struct kiln_detok_stream *s, int32_t id, const char **text, size_t *len) {
    const char *str;
    size_t n;
    buf_clear(&s->run.out);
    if (tok_decode_str(s->tok, id, &str, &n) && !(s->skip_special && s->tok->special[id])) dec_run_token(&s->run, str, n);
    result(s, text, len);
    return 0;
}

int kiln_detok_stream_flush(struct kiln_detok_stream *s, const char **text, size_t *len) {
    buf_clear(&s->run.out);
    int rc = dec_run_finish(&s->run);
    result(s, text, len);
    return rc;
}
