/* tool_parser.h — model output text into content and tool calls, for the
 * tool-call formats of the model families kiln serves.
 *
 * A model asked to call a tool writes the call in its own format:
 *
 *   hermes       (Qwen2.5, Qwen3)  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *                                  several in a row, separated by "\n"
 *   llama3_json  (Llama-3.1/3.2)   {"name": "f", "parameters": {...}}, maybe after
 *                                  <|python_tag|>, several separated by ";";
 *                                  only when the output starts with the call
 *   deepseek_v3  (DeepSeek-V3)     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
 *                                  ```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 *   deepseek_v31 (DeepSeek-V3.1)   the same markers around f<｜tool▁sep｜>{...}
 *                                  (both parsers read both bodies)
 *   mistral                        [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
 *                                  or [TOOL_CALLS]f[ARGS]{...} / [TOOL_CALLS]f{...}
 *                                  (tokenizers v11+), one marker per call
 *   harmony      (gpt-oss)         <|start|>assistant<|channel|>commentary to=functions.f
 *                                  <|constrain|>json<|message|>{...}<|call|> (the recipient
 *                                  may stand before <|channel|>); the other messages of the
 *                                  harmony format are content (chat/harmony.h)
 *
 * A tool_parser reads the text as the engine streams it, in deltas split
 * anywhere (inside a marker, inside a UTF-8 character): text that may still
 * be the start of a marker is held back until it is decided, and content
 * never ends inside a character. Each feed returns the events it decided:
 * content text, and whole calls. A call is reported once its text is
 * complete and well formed (its name, an id, and its arguments: the text of
 * the arguments object exactly as the model wrote it, which is a JSON
 * string of the object as OpenAI's `arguments` is); so streamed and
 * non-streamed answers agree byte for byte, however the text was split.
 *
 * Rules, as vLLM's and SGLang's parsers behave:
 * - a malformed call (not JSON, no name, arguments not an object, a marker
 *   never closed before the end) becomes plain content, its markers
 *   included (deepseek's section markers and a stray call-end marker
 *   excepted: they are dropped wherever they appear, as SGLang does);
 * - whitespace right before a call, and whitespace between calls or after
 *   the last one up to the end, is not content;
 * - llama3_json: only an output that starts (after whitespace) with
 *   <|python_tag|> or "{" holds calls; text after the calls ends them;
 * - ids are "call_" and 24 letters or digits (mistral: 9, what its
 *   templates require), drawn from the seed given at init.
 *
 *     struct tool_parser p;
 *     tool_parser_init(&p, TOOL_FORMAT_HERMES, seed);
 *     for each delta: ev = tool_parser_feed(&p, text, len); use ev->v[0..n)
 *     ev = tool_parser_finish(&p);
 *     tool_parser_free(&p);
 */
#ifndef KILN_CHAT_TOOL_PARSER_H
#define KILN_CHAT_TOOL_PARSER_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "chat/harmony.h"

enum tool_format {
    TOOL_FORMAT_NONE = 0,
    TOOL_FORMAT_HERMES,
    TOOL_FORMAT_LLAMA3_JSON,
    TOOL_FORMAT_DEEPSEEK_V3,
    TOOL_FORMAT_DEEPSEEK_V31,
    TOOL_FORMAT_MISTRAL,
    TOOL_FORMAT_HARMONY,
};

/* The format of a --tool-call-parser name (vLLM's and SGLang's spellings:
 * hermes, qwen25, qwen, llama3_json, llama3, deepseek_v3, deepseekv3,
 * deepseek_v31, deepseekv31, mistral, harmony, openai, gpt_oss); -1 when unknown. "auto" is not a
 * format: see tool_format_detect. */
int tool_format_from_name(const char *name, enum tool_format *out);
/* The names accepted, for error messages. */
const char *tool_format_choices(void);
/* The canonical name of a format ("hermes", ...; "none"). */
const char *tool_format_name(enum tool_format f);
/* The format a chat template writes tool calls in, from what its text
 * contains; TOOL_FORMAT_NONE when none is recognised. */
enum tool_format tool_format_detect(const char *template_text);

/* How one call of a format is written, for a grammar that forces a call of
 * function NAME: trigger (the text whose appearance starts a call),
 * before_name NAME after_name ARGUMENTS-OBJECT end, and `separator` between
 * two calls in a row. NAME is written as is (hermes and llama3_json put it
 * inside a JSON string: the caller escapes it there). */
struct tool_call_frame {
    const char *trigger;
    const char *before_name;
    const char *after_name;
    const char *end;
    const char *separator;
};
/* 0, or -1 for TOOL_FORMAT_NONE and TOOL_FORMAT_HARMONY (its calls end in
 * an end-of-generation token and usually follow the thoughts: a grammar
 * does not force them). */
int tool_format_frame(enum tool_format f, struct tool_call_frame *out);

enum tool_event_kind {
    TOOL_EVENT_CONTENT, /* text: content */
    TOOL_EVENT_CALL,    /* a whole call: index, id, name, text = arguments */
};

struct tool_event {
    enum tool_event_kind kind;
    int index;  /* calls: 0, 1, ... in the order they were made */
    char *text; /* content, or the arguments JSON; NUL-terminated */
    size_t len;
    char *name; /* calls */
    char id[32];
};

struct tool_events {
    struct tool_event *v;
    int n, cap;
};

/* Empties the list (keeps its memory). */
void tool_events_clear(struct tool_events *e);
void tool_events_free(struct tool_events *e);

struct tool_parser {
    enum tool_format fmt;
    struct buf pend;   /* text not decided yet */
    struct buf held;   /* whitespace before the call being read */
    struct buf opener; /* the marker that opened it */
    int state;         /* TP_* in tool_parser.c */
    size_t scan;       /* bytes of pend searched for the end already */
    struct buf name;   /* mistral: the name of the call being read */
    int depth, in_str, esc, jstart; /* the JSON value being scanned */
    int jkind;                      /* what that value is (J_* in tool_parser.c) */
    int n_calls;
    int last_was_call; /* no content since the last call */
    uint64_t rng;
    struct harmony_parser hp; /* harmony: the message splitter */
    struct tool_events ev; /* the last feed's events */
};

void tool_parser_init(struct tool_parser *p, enum tool_format fmt, uint64_t seed);
void tool_parser_free(struct tool_parser *p);
/* Reads a delta; the events it decided (valid until the next call). */
const struct tool_events *tool_parser_feed(struct tool_parser *p, const char *text, size_t len);
/* The end of the output: whatever was held back is decided. */
const struct tool_events *tool_parser_finish(struct tool_parser *p);

/* A whole output at once: `out` (caller's, emptied first) gets the content
 * as one event (if any) followed by the calls. Equal to feeding the text in
 * any pieces and merging the events. */
void tool_parse_whole(enum tool_format fmt, uint64_t seed, const char *text, size_t len, struct tool_events *out);

#endif
