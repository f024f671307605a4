/* json_req.h — reading and validating request bodies.
 *
 * Every field a client sends is checked for type and range here, with a
 * message that names the field (it becomes the OpenAI error's `param`), so
 * that nothing invalid reaches the engine. Absent and null fields take their
 * defaults. Unknown fields are ignored, as vLLM and SGLang do.
 *
 * gen_params_parse reads the sampling and stopping fields shared by the
 * OpenAI routes (top level of the body) and SGLang's /generate (its
 * `sampling_params` object) into an engine_request template; the arrays it
 * points to are owned by the gen_params.
 */
#ifndef KILN_SERVER_JSON_REQ_H
#define KILN_SERVER_JSON_REQ_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/error.h"
#include "scheduler/engine.h"
#include "server/structured.h"

struct kiln_tokenizer;

struct req_error {
    int status;       /* 400 unless said otherwise */
    const char *code; /* e.g. "invalid_value" */
    char param[64];   /* the offending field, "" when none */
    char msg[KILN_ERROR_MAX];
};

/* Fills e and returns -1. */
int req_errorf(struct req_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Parses a request body: a JSON object, or an error naming line and column. */
json_t *jr_parse_body(const char *body, size_t len, struct req_error *e);

/* Field readers: 1 when present, 0 when absent or null (out untouched), -1
 * on a wrong type or a value out of range. */
int jr_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, struct req_error *e);
int jr_bool(const json_t *o, const char *key, int *out, struct req_error *e);
int jr_str(const json_t *o, const char *key, const char **out, struct req_error *e);

enum jr_dialect {
    JR_COMPLETION, /* OpenAI /v1/completions: max_tokens, default 16 */
    JR_CHAT,       /* OpenAI /v1/chat/completions: max_tokens or max_completion_tokens */
    JR_NATIVE,     /* SGLang sampling_params: max_new_tokens (default 128), min_new_tokens */
};

enum { JR_MAX_N = 128, JR_MAX_STOP = 64 };

struct gen_params {
    struct engine_request r; /* prompt, callback and user left unset */
    int n;
    char **stop;
    int32_t *stop_ids;
    struct logit_bias_entry *bias;
    char *salt;
    struct so_spec so;        /* the structured-output constraint asked for */
    struct grammar *grammar;  /* its compiled grammar (a reference), once compiled */
    int32_t *grammar_after;   /* r.grammar_after's storage (a reasoning model's end of thinking) */
};

void gen_params_init(struct gen_params *p);
void gen_params_free(struct gen_params *p);
/* `o` is the body (OpenAI) or sampling_params (native); `top` is the body,
 * where cache_salt / extra_key / priority live in both dialects. The
 * structured-output fields are read into p->so (compiled later, off the
 * loop: server_structured). */
int gen_params_parse(struct gen_params *p, const json_t *o, const json_t *top, enum jr_dialect d, int vocab,
                     struct req_error *e);

/* One prompt as token ids; `text` is the prompt text when it was given as
 * text (NULL for ids). */
struct prompt {
    int32_t *ids;
    int n;
    char *text;
};

struct prompt_list {
    struct prompt *v;
    int n;
};

void prompt_list_free(struct prompt_list *l);
/* Text to ids the way Hugging Face encodes a completion prompt:
 * add_special_tokens=True, and a BOS when tokenizer_config.json asks for one
 * and the post-processor did not add it. With add_special == 0 the text is
 * taken as is (chat prompts: the template already holds the special tokens). */
int jr_encode(const struct kiln_tokenizer *tok, const char *text, size_t len, int add_special, struct prompt *out,
              const char *param, struct req_error *e);
/* A prompt value: a string, an array of strings, an array of token ids or an
 * array of arrays of token ids. `single` restricts it to one prompt. */
int jr_prompts(const json_t *v, const char *param, const struct kiln_tokenizer *tok, int vocab, int single,
               struct prompt_list *out, struct req_error *e);
/* A token id array (each id in [0, vocab)). Caller frees *ids. */
int jr_ids(const json_t *v, const char *param, int vocab, int32_t **ids, int *n, struct req_error *e);

#endif
