#include "tokenizer/tok_ctx.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

static void tok_pieces_free(struct tok_pieces *p) {
    free(p->v);
    memset(p, 0, sizeof *p);
}

void tok_pieces_push(struct tok_pieces *p, const char *s, size_t len, size_t zp) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = xrealloc(p->v, p->cap * sizeof *p->v);
    }
    p->v[p->n].s = s;
    p->v[p->n].len = len;
    p->v[p->n].zp = zp;
    p->n++;
}

void tok_ctx_init(struct tok_ctx *c) {
    memset(c, 0, sizeof *c);
    c->arena.block_size = (size_t)1 << 16;
    c->md = pcre2_match_data_create(1, NULL);
    c->mc = pcre2_match_context_create(NULL);
    /* Long runs of one class (kilobytes of spaces) can need more than the
     * default 32 KiB of JIT stack. */
    c->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    KILN_ASSERT(c->md && c->mc && c->jit);
    pcre2_jit_stack_assign(c->mc, NULL, c->jit);
}

void tok_ctx_free(struct tok_ctx *c) {
    tok_arena_free(&c->arena);
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mc) pcre2_match_context_free(c->mc);
    if (c->jit) pcre2_jit_stack_free(c->jit);
    tok_spans_free(&c->spans);
    tok_pieces_free(&c->pieces[0]);
    tok_pieces_free(&c->pieces[1]);
    buf_free(&c->tmp);
    free(c->syms);
    free(c->heap);
    memset(c, 0, sizeof *c);
}
