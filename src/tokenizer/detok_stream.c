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
