/* reasoning.h — a reasoning model's output split into its thoughts
 * (reasoning_content) and its answer (content).
 *
 * Two formats, named as vLLM and SGLang name them:
 *   qwen3        the output may open with <think>; the thoughts run to
 *                </think>; without <think> at the start all is answer
 *   deepseek_r1  the chat template opens <think> itself, so the output
 *                starts inside the thoughts and only </think> appears
 *                (all is thought when it never does)
 *   gpt_oss      the harmony format (chat/harmony.h): the analysis
 *                channel is the thoughts, the other channels the answer;
 *                a tool call's message passes to the answer in the
 *                template's form (harmony_call_text), for a harmony tool
 *                parser to read
 * Whether generation starts inside the think block is read from the
 * rendered prompt (reasoning_starts_in_think): a prompt that ends in an
 * open <think> (Qwen3 thinking models, DeepSeek-R1) starts inside it; one
 * that ends in a closed block (Qwen3's enable_thinking=false writes
 * "<think>\n\n</think>\n\n") does not. A <think> the model writes anyway at
 * the start is dropped.
 *
 * Whitespace right after <think>, right before </think> and right after
 * </think> belongs to neither part. Deltas may split a marker or a UTF-8
 * character anywhere: what may still be a marker is held back, and the
 * parts never end inside a character, so the result does not depend on the
 * split (the tests feed every split).
 *
 *     struct reasoning_parser r;
 *     reasoning_parser_init(&r, reasoning_starts_in_think(fmt, prompt, len));
 *     reasoning_parser_feed(&r, text, len, &reasoning, &content);  // appends
 *     reasoning_parser_finish(&r, &reasoning, &content);
 *     reasoning_parser_free(&r);
 */
#ifndef KILN_CHAT_REASONING_H
#define KILN_CHAT_REASONING_H

#include <stddef.h>

#include "base/buf.h"
#include "chat/harmony.h"

enum reasoning_format {
    REASONING_NONE = 0,
    REASONING_QWEN3,
    REASONING_DEEPSEEK_R1,
    REASONING_GPT_OSS,
};

/* qwen3, deepseek_r1 (also deepseek-r1), gpt_oss (also gpt-oss,
 * openai_gptoss); -1 when unknown. */
int reasoning_format_from_name(const char *name, enum reasoning_format *out);
const char *reasoning_format_choices(void);

/* Whether the output of `prompt` starts inside the think block. */
int reasoning_starts_in_think(enum reasoning_format f, const char *prompt, size_t len);

struct reasoning_parser {
    int state;
    struct buf pend; /* text not decided yet */
    int harmony;     /* gpt_oss: hp reads the text */
    struct harmony_parser hp;
};

/* The <think> formats (in_think: reasoning_starts_in_think). */
void reasoning_parser_init(struct reasoning_parser *r, int in_think);
/* Any format: the <think> ones as reasoning_parser_init, gpt_oss's harmony. */
void reasoning_parser_init_format(struct reasoning_parser *r, enum reasoning_format f, int in_think);
void reasoning_parser_free(struct reasoning_parser *r);
/* Appends what the delta decided to `reasoning` and `content`. */
void reasoning_parser_feed(struct reasoning_parser *r, const char *text, size_t len, struct buf *reasoning,
                           struct buf *content);
void reasoning_parser_finish(struct reasoning_parser *r, struct buf *reasoning, struct buf *content);

#endif
