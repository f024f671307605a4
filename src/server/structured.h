/* structured.h — structured-output constraints of a request: the fields
 * that ask for one, in the OpenAI, vLLM and SGLang spellings, read into a
 * spec, and compiled grammars kept in a small shared cache.
 *
 * Accepted (exactly one per request; more is a 400):
 *  - OpenAI routes (the body): response_format {type: text | json_object |
 *    json_schema {name, schema, strict}}; vLLM's guided_json (a schema
 *    object or its text), guided_regex, guided_grammar (EBNF),
 *    guided_choice (strings: the output is one of them) and
 *    structured_outputs {json, regex, grammar, choice, json_object};
 *    SGLang's regex and ebnf.
 *  - /generate (sampling_params): SGLang's regex, json_schema (a schema's
 *    text, or the object) and ebnf.
 * What kiln cannot enforce (structural tags, whitespace patterns) is a 400.
 * JSON comes out compact (no whitespace between tokens), schemas and
 * json_object alike.
 *
 * Compiling happens on the thread that prepares the request (the tokenizer
 * pool or the loop), never the engine's; the grammar is met with the
 * model's vocabulary there too (grammar_prepare). Compiled grammars are
 * cached by (kind, strict, text), least recently used out, so that a client
 * sending the same schema again pays nothing. An invalid schema, regex or
 * grammar is a 400 whose message is the compiler's (it says where), with
 * `param` naming the field. */
#ifndef KILN_SERVER_STRUCTURED_H
#define KILN_SERVER_STRUCTURED_H

#include <stddef.h>

#include <jansson.h>

struct gen_params;
struct grammar;
struct grammar_vocab;
struct req_error;
struct server;

enum so_kind { SO_NONE = 0, SO_JSON_SCHEMA, SO_JSON_OBJECT, SO_REGEX, SO_EBNF, SO_CHOICE };

struct so_spec {
    enum so_kind kind;
    char *text;      /* schema JSON, regex or EBNF (choices: the EBNF of their alternatives) */
    size_t len;
    int strict;      /* json_schema.strict */
    char param[64];  /* the field it came from */
};

/* Reads the constraint fields of `o` (the body on the OpenAI routes,
 * sampling_params on /generate: `native`). 0 (kind SO_NONE when there is
 * none) or -1 with e. */
int so_parse(struct so_spec *sp, const json_t *o, int native, struct req_error *e);
void so_spec_free(struct so_spec *sp);

struct so_cache;
struct so_cache *so_cache_create(int capacity);
void so_cache_free(struct so_cache *c);
/* The grammar of sp, from the cache or compiled and prepared for v (then
 * cached): *out is a new reference (NULL for SO_NONE). Thread-safe.
 * Returns 0, or -1 with e (400 with the compiler's message). */
int so_compile(struct so_cache *c, const struct grammar_vocab *v, const struct so_spec *sp, struct grammar **out,
               struct req_error *e);

/* Compiles gp->so with the server's cache and vocabulary into gp->grammar
 * and gp->r.grammar. 0 or -1 with e. */
int server_structured(struct server *s, struct gen_params *gp, struct req_error *e);

#endif
