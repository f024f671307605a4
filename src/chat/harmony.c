/* harmony.c — the harmony message splitter (see harmony.h). */
#include "chat/harmony.h"

#include <string.h>

#include "base/utf8.h"

#define H_START "<|start|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"
#define H_END "<|end|>"
#define H_RETURN "<|return|>"
#define H_CALL "<|call|>"

enum { HS_TEXT, HS_HEADER, HS_BODY };
enum { HK_REASONING, HK_CONTENT, HK_CALL };

/* a header longer than this is not one: its text becomes content */
#define HEADER_MAX 512

void harmony_init(struct harmony_parser *h) { memset(h, 0, sizeof *h); }

void harmony_free(struct harmony_parser *h) {
    buf_free(&h->pend);
    buf_free(&h->recipient);
    buf_free(&h->args);
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find(const char *h, size_t hn, const char *nd) {
    size_t n = strlen(nd);
    for (size_t i = 0; i + n <= hn; i++)
        if (!memcmp(h + i, nd, n)) return h + i;
    return NULL;
}

/* The earliest of marks[] in s[0..n): its offset (n when none), *which. */
static size_t first_of(const char *s, size_t n, const char *const *marks, int *which) {
    size_t best = n;
    *which = -1;
    for (int k = 0; marks[k]; k++) {
        const char *f = find(s, n, marks[k]);
        if (f && (size_t)(f - s) < best) best = (size_t)(f - s), *which = k;
    }
    return best;
}

/* The longest tail of s[0..n) that is a proper prefix of one of marks[]. */
static size_t held_tail(const char *s, size_t n, const char *const *marks) {
    size_t hold = 0;
    for (int k = 0; marks[k]; k++) {
        size_t ml = strlen(marks[k]);
        for (size_t l = ml - 1 < n ? ml - 1 : n; l > hold; l--)
            if (!memcmp(s + n - l, marks[k], l)) {
                hold = l;
                break;
            }
    }
    return hold;
}

/* A header field: the word after `key` (up to whitespace or a marker). */
static int header_word(const char *s, size_t n, const char *key, int at_word, const char **w, size_t *wl) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl <= n; i++) {
        if (memcmp(s + i, key, kl) || (at_word && i && !is_ws(s[i - 1]) && s[i - 1] != '>')) continue;
        size_t j = i + kl;
        while (j < n && !is_ws(s[j]) && s[j] != '<') j++;
        *w = s + i + kl;
        *wl = j - (i + kl);
        return 1;
    }
    return 0;
}

static void begin_body(struct harmony_parser *h, const char *head, size_t n) {
    const char *ch = NULL, *to = NULL;
    size_t chl = 0, tol = 0;
    header_word(head, n, H_CHANNEL, 0, &ch, &chl);
    buf_clear(&h->recipient);
    buf_clear(&h->args);
    if (header_word(head, n, "to=", 1, &to, &tol) && tol) {
        buf_append(&h->recipient, to, tol);
        h->kind = HK_CALL;
    } else {
        h->kind = ch && chl == 8 && !memcmp(ch, "analysis", 8) ? HK_REASONING : HK_CONTENT;
    }
    h->state = HS_BODY;
}

static void body_text(struct harmony_parser *h, const char *s, size_t n, const struct harmony_sink *k) {
    if (!n) return;
    if (h->kind == HK_CALL) buf_append(&h->args, s, n);
    else if (h->kind == HK_REASONING) k->reasoning(k->ctx, s, n);
    else k->content(k->ctx, s, n);
}

static void end_body(struct harmony_parser *h, const struct harmony_sink *k) {
    h->state = HS_TEXT;
    if (h->kind != HK_CALL) return;
    const char *a = h->args.data ? h->args.data : "", *r = h->recipient.data;
    size_t al = h->args.len, rl = h->recipient.len;
    while (al && is_ws(*a)) a++, al--;
    while (al && is_ws(a[al - 1])) al--;
    const char *name = r;
    size_t nl = rl;
    if (nl > 10 && !memcmp(name, "functions.", 10)) name += 10, nl -= 10;
    k->call(k->ctx, name, nl, r, rl, a, al);
}

/* One decision; 0 when nothing more can be decided now. */
static int step(struct harmony_parser *h, int final, const struct harmony_sink *k) {
    static const char *const text_marks[] = {H_START, H_CHANNEL, H_END, H_RETURN, H_CALL, NULL};
    static const char *const head_marks[] = {H_MESSAGE, NULL};
    static const char *const body_marks[] = {H_END, H_RETURN, H_CALL, H_START, NULL};
    struct buf *p = &h->pend;
    const char *s = p->data;
    size_t n = p->len;
    int which;
    if (!h->begun) {
        /* The output opens inside the header the prompt's
         * "<|start|>assistant" began: a recipient may come first
         * (" to=functions.f<|channel|>..."), as OpenAI's harmony parser
         * reads a completion. Held while the text may still be one. */
        static const char *const lead[] = {" to=", "to=", NULL};
        for (int i = 0; lead[i]; i++) {
            size_t l = strlen(lead[i]);
            if (n >= l && !memcmp(s, lead[i], l)) {
                h->begun = 1;
                h->state = HS_HEADER;
                return 1;
            }
            if (n < l && !memcmp(s, lead[i], n) && !final) return 0;
        }
        h->begun = 1;
        return 1;
    }
    switch (h->state) {
    case HS_TEXT: {
        /* whitespace alone since the last message (or the start) is not
         * content; once there is text, what follows it is */
        size_t at = first_of(s, n, text_marks, &which);
        if (which >= 0) {
            size_t w = 0;
            while (!h->in_text && w < at && is_ws(s[w])) w++;
            if (w < at) k->content(k->ctx, s, at);
            h->in_text = 0;
            if (which <= 1) { /* a header: <|channel|> stays in it */
                buf_consume(p, at + (which == 0 ? strlen(H_START) : 0));
                h->state = HS_HEADER;
            } else {
                buf_consume(p, at + strlen(text_marks[which]));
            }
            return 1;
        }
        size_t keep = final ? 0 : held_tail(s, n, text_marks), cut = n - keep;
        size_t w = 0;
        while (!h->in_text && w < cut && is_ws(s[w])) w++;
        if (w == cut && !h->in_text) { /* whitespace alone: may be between messages */
            if (final) buf_clear(p);
            return 0;
        }
        if (!final) cut = utf8_cut(s, cut);
        k->content(k->ctx, s, cut);
        buf_consume(p, cut);
        if (cut) h->in_text = 1;
        return 0;
    }
    case HS_HEADER: {
        size_t at = first_of(s, n, head_marks, &which);
        if (which >= 0 && at <= HEADER_MAX) {
            begin_body(h, s, at);
            buf_consume(p, at + strlen(H_MESSAGE));
            return 1;
        }
        if (n > HEADER_MAX) { /* not a header: its text is content */
            size_t cut = utf8_cut(s, HEADER_MAX + 1); /* the same bytes however the text came */
            k->content(k->ctx, s, cut);
            buf_consume(p, cut);
            h->state = HS_TEXT;
            h->in_text = 1;
            return 1;
        }
        if (final) buf_clear(p); /* cut off by the end */
        return 0;
    }
    default: {
        size_t at = first_of(s, n, body_marks, &which);
        if (which >= 0) {
            body_text(h, s, at, k);
            buf_consume(p, at + (which < 3 ? strlen(body_marks[which]) : 0));
            end_body(h, k);
            return 1;
        }
        if (final) {
            body_text(h, s, n, k);
            buf_clear(p);
            end_body(h, k);
            return 0;
        }
        size_t cut = utf8_cut(s, n - held_tail(s, n, body_marks));
        body_text(h, s, cut, k);
        buf_consume(p, cut);
        return 0;
    }
    }
}

void harmony_feed(struct harmony_parser *h, const char *text, size_t len, int final, const struct harmony_sink *k) {
    buf_append(&h->pend, text, len);
    while (step(h, final, k)) {}
}

void harmony_call_text(struct buf *out, const char *recipient, size_t rlen, const char *args, size_t alen) {
    buf_append(out, H_START "assistant to=", strlen(H_START "assistant to="));
    buf_append(out, recipient, rlen);
    buf_append(out, H_CHANNEL "commentary json" H_MESSAGE, strlen(H_CHANNEL "commentary json" H_MESSAGE));
    buf_append(out, args, alen);
    buf_append(out, H_CALL, strlen(H_CALL));
}
