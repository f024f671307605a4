/* harmony.h — gpt-oss's output in the harmony format, split by channel.
 *
 * A gpt-oss answer is a run of messages, each a header and a body:
 *
 *   <|channel|>analysis<|message|>THOUGHTS<|end|>
 *   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
 *   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
 *
 * (the first header's "<|start|>assistant" is the prompt's, so the output
 * opens inside it; the recipient " to=..." may also stand before
 * <|channel|>, the output's first bytes included). A body ends at <|end|>,
 * <|return|> or <|call|> (the last two are end-of-generation tokens, so
 * usually absent from the text), at the next <|start|>, or at the end of
 * the output. What the parser makes of a message:
 *   - a recipient (to=...): a tool call, its name the recipient without
 *     "functions.", its arguments the body (trimmed);
 *   - channel analysis: reasoning;
 *   - any other channel (final, a commentary preamble): content.
 * Text outside any message is content (whitespace alone between messages
 * is dropped); stray end markers are dropped; a header cut off by the end
 * of the output is dropped. Deltas may split a marker or a UTF-8 character
 * anywhere: what may still be a marker is held back, and text never ends
 * inside a character, so the result does not depend on the split.
 *
 * The text must keep the special tokens (skip_special_tokens false): the
 * server turns it off for requests read by a harmony parser. */
#ifndef KILN_CHAT_HARMONY_H
#define KILN_CHAT_HARMONY_H

#include <stddef.h>

#include "base/buf.h"

struct harmony_sink {
    void *ctx;
    void (*reasoning)(void *ctx, const char *s, size_t n);
    void (*content)(void *ctx, const char *s, size_t n);
    /* name without "functions."; recipient as written (for re-emitting) */
    void (*call)(void *ctx, const char *name, size_t nlen, const char *recipient, size_t rlen, const char *args,
                 size_t alen);
};

struct harmony_parser {
    int state;            /* HS_* in harmony.c */
    int kind;             /* where the current body goes */
    int in_text;          /* text outside messages emitted since the last one */
    int begun;            /* the output's first bytes decided (a leading recipient or not) */
    struct buf pend;      /* text not decided yet */
    struct buf recipient; /* the current message's to=... */
    struct buf args;      /* a call's body so far */
};

void harmony_init(struct harmony_parser *h);
void harmony_free(struct harmony_parser *h);
/* Reads a delta (final: the end of the output) into the sink. */
void harmony_feed(struct harmony_parser *h, const char *text, size_t len, int final, const struct harmony_sink *k);
/* The canonical text of a call, as the chat template writes one:
 * <|start|>assistant to=RECIPIENT<|channel|>commentary json<|message|>ARGS<|call|> */
void harmony_call_text(struct buf *out, const char *recipient, size_t rlen, const char *args, size_t alen);

#endif
