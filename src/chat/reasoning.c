/* reasoning.c — the <think> splitter (see reasoning.h). */
#include "chat/reasoning.h"

#include <string.h>

#include "base/utf8.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

enum {
    RS_START,    /* before anything but whitespace; may see <think> */
    RS_START_IN, /* the same, inside the think block already */
    RS_LEAD,     /* in the thoughts, dropping whitespace */
    RS_THINK,    /* in the thoughts */
    RS_ANS_LEAD, /* after </think>, dropping whitespace */
    RS_ANSWER,   /* the answer, to the end */
};

int reasoning_format_from_name(const char *name, enum reasoning_format *out) {
    if (!strcmp(name, "qwen3")) *out = REASONING_QWEN3;
    else if (!strcmp(name, "deepseek_r1") || !strcmp(name, "deepseek-r1")) *out = REASONING_DEEPSEEK_R1;
    else if (!strcmp(name, "gpt_oss") || !strcmp(name, "gpt-oss") || !strcmp(name, "openai_gptoss"))
        *out = REASONING_GPT_OSS;
    else return -1;
    return 0;
}

const char *reasoning_format_choices(void) {
    return "qwen3, deepseek_r1 (deepseek-r1), gpt_oss (gpt-oss, openai_gptoss)";
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find_last(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t i = n >= ml ? n - ml + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, m, ml)) return s + i;
    return NULL;
}

int reasoning_starts_in_think(enum reasoning_format f, const char *prompt, size_t len) {
    if (f == REASONING_GPT_OSS) return 0;
    size_t n = len;
    while (n && is_ws(prompt[n - 1])) n--;
    if (n >= strlen(THINK_CLOSE) && !memcmp(prompt + n - strlen(THINK_CLOSE), THINK_CLOSE, strlen(THINK_CLOSE)))
        return 0;
    if (f == REASONING_DEEPSEEK_R1) return 1;
    const char *open = find_last(prompt, len, THINK_OPEN);
    return open && open + strlen(THINK_OPEN) == prompt + n;
}

void reasoning_parser_init(struct reasoning_parser *r, int in_think) {
    memset(r, 0, sizeof *r);
    r->state = in_think ? RS_START_IN : RS_START;
}

void reasoning_parser_init_format(struct reasoning_parser *r, enum reasoning_format f, int in_think) {
    reasoning_parser_init(r, in_think);
    if (f != REASONING_GPT_OSS) return;
    r->harmony = 1;
    harmony_init(&r->hp);
}

void reasoning_parser_free(struct reasoning_parser *r) {
    buf_free(&r->pend);
    if (r->harmony) harmony_free(&r->hp);
}

/* gpt_oss: the harmony splitter's parts into reasoning and content */
struct harmony_out {
    struct buf *reasoning, *content;
};
static void h_reasoning(void *ctx, const char *s, size_t n) {
    buf_append(((struct harmony_out *)ctx)->reasoning, s, n);
}
static void h_content(void *ctx, const char *s, size_t n) { buf_append(((struct harmony_out *)ctx)->content, s, n); }
static void h_call(void *ctx, const char *name, size_t nlen, const char *recipient, size_t rlen, const char *args,
                   size_t alen) {
    (void)name, (void)nlen;
    harmony_call_text(((struct harmony_out *)ctx)->content, recipient, rlen, args, alen);
}

static void harmony_run(struct reasoning_parser *r, const char *text, size_t len, int final, struct buf *reasoning,
                        struct buf *content) {
    struct harmony_out o = {reasoning, content};
    const struct harmony_sink k = {&o, h_reasoning, h_content, h_call};
    harmony_feed(&r->hp, text, len, final, &k);
}

static size_t skip_ws(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* The longest tail of s[0..n) that is a proper prefix of m. */
static size_t partial_tail(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t l = ml - 1 < n ? ml - 1 : n; l; l--)
        if (!memcmp(s + n - l, m, l)) return l;
    return 0;
}

static const char *find(const char *h, size_t hn, const char *nd) {
    size_t n = strlen(nd);
    for (size_t i = 0; i + n <= hn; i++)
        if (!memcmp(h + i, nd, n)) return h + i;
    return NULL;
}

/* One decision; 0 when nothing more can be decided now. */
static int step(struct reasoning_parser *r, int final, struct buf *reasoning, struct buf *content) {
    struct buf *p = &r->pend;
    const char *s = p->data;
    size_t n = p->len;
    switch (r->state) {
    case RS_START:
    case RS_START_IN: {
        size_t i = skip_ws(s, n), ol = strlen(THINK_OPEN), m = n - i < ol ? n - i : ol;
        if (i == n && !final) return 0;
        if (i < n && !memcmp(s + i, THINK_OPEN, m)) {
            if (m < ol && !final) return 0;
            if (m == ol) {
                buf_consume(p, i + ol);
                r->state = RS_LEAD;
                return 1;
            }
        }
        r->state = r->state == RS_START_IN ? RS_LEAD : RS_ANSWER;
        return 1;
    }
    case RS_LEAD:
    case RS_ANS_LEAD: {
        size_t i = skip_ws(s, n);
        buf_consume(p, i);
        if (!p->len) return 0;
        r->state = r->state == RS_LEAD ? RS_THINK : RS_ANSWER;
        return 1;
    }
    case RS_THINK: {
        const char *f = find(s, n, THINK_CLOSE);
        if (f) {
            size_t k = (size_t)(f - s);
            while (k && is_ws(s[k - 1])) k--;
            buf_append(reasoning, s, k);
            buf_consume(p, (size_t)(f - s) + strlen(THINK_CLOSE));
            r->state = RS_ANS_LEAD;
            return 1;
        }
        size_t k = n;
        if (!final) {
            k -= partial_tail(s, n, THINK_CLOSE);
            while (k && is_ws(s[k - 1])) k--;
            k = utf8_cut(s, k);
        }
        buf_append(reasoning, s, k);
        buf_consume(p, k);
        return 0;
    }
    default: {
        size_t k = final ? n : utf8_cut(s, n);
        buf_append(content, s, k);
        buf_consume(p, k);
        return 0;
    }
    }
}

void reasoning_parser_feed(struct reasoning_parser *r, const char *text, size_t len, struct buf *reasoning,
                           struct buf *content) {
    if (r->harmony) {
        harmony_run(r, text, len, 0, reasoning, content);
        return;
    }
    buf_append(&r->pend, text, len);
    while (step(r, 0, reasoning, content)) {}
}

void reasoning_parser_finish(struct reasoning_parser *r, struct buf *reasoning, struct buf *content) {
    if (r->harmony) {
        harmony_run(r, "", 0, 1, reasoning, content);
        return;
    }
    while (step(r, 1, reasoning, content)) {}
}
