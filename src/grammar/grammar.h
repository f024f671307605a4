/* grammar.h — grammar-constrained decoding: grammars compiled to a
 * pushdown automaton over bytes, and per-request matchers that say which
 * tokens of a vocabulary may come next.
 *
 * Three kinds of objects:
 *  - struct grammar: a compiled grammar, immutable once built and shared by
 *    every request that uses it (reference counted; grammar_ref and
 *    grammar_unref may be called from any thread). Built from EBNF text
 *    (the GBNF dialect of llama.cpp and the EBNF dialect of xgrammar, which
 *    SGLang's `ebnf` parameter takes), from a regular expression, from a
 *    JSON Schema, or as "any JSON object" (response_format json_object).
 *    Regular expressions and JSON Schemas are translated to EBNF text first
 *    (grammar_ebnf_from_regex, grammar_ebnf_from_json_schema), so what a
 *    schema means can be read as a grammar (`kiln grammar` prints it).
 *  - struct grammar_vocab: a tokenizer's tokens as raw byte strings in a
 *    trie, built once per model; special tokens (added tokens flagged
 *    special) never match grammar text. Immutable, shareable.
 *  - struct grammar_matcher: one request's position in one grammar: a set
 *    of automaton stacks. Not thread-safe; owned by the engine thread.
 *
 * Matching is over bytes: a token is allowed when all its bytes can be
 * consumed from the current state (a token may end inside a UTF-8
 * sequence; the next one continues it). Character classes of the grammar
 * are over code points and are compiled to UTF-8 byte ranges.
 *
 * The end of the grammar is not a token: grammar_matcher_can_end says the
 * root rule is complete (the caller then allows its end-of-sequence and
 * stop token ids), grammar_matcher_is_done says it is complete and no byte
 * can follow (the caller allows only those ids, and finishes the request
 * with reason "stop" when one is drawn).
 *
 * Cost: grammar_matcher_fill_mask walks the token trie only for tokens
 * whose acceptance depends on the stack below the current rule position;
 * tokens accepted or rejected by the position alone are cached per
 * position when the grammar meets the vocabulary (grammar_prepare), the
 * idea of xgrammar's adaptive token mask cache.
 *
 *     struct grammar *g = grammar_compile_json_schema(schema, len, NULL, &err);
 *     struct grammar_matcher *m = grammar_matcher_create(g, vocab, &err);
 *     grammar_matcher_fill_mask(m, bits);      // before each step
 *     ... sample with bits applied ...
 *     grammar_matcher_accept_token(m, token);  // after it
 *     grammar_matcher_free(m); grammar_unref(g);
 */
#ifndef KILN_GRAMMAR_GRAMMAR_H
#define KILN_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct buf;
struct kiln_error;
struct grammar;
struct grammar_vocab;
struct grammar_matcher;

/* ---- compiling ---- */

/* EBNF text; `root` names the start rule (NULL: "root"). Errors name the
 * line and column: "grammar:3:14: expected '::='". Left-recursive rules
 * are refused with the rule's name. */
struct grammar *grammar_compile_ebnf(const char *text, size_t len, const char *root,
                                     struct kiln_error *err);
/* The same; *empty (not NULL) says whether it failed because the root rule
 * matches no text at all (1), or compiled or failed otherwise (0). */
struct grammar *grammar_compile_ebnf_empty(const char *text, size_t len, const char *root, int *empty,
                                           struct kiln_error *err);
/* A regular expression (ECMAScript / Python `re` syntax subset: literals,
 * escapes, classes, `.`, groups, alternation, greedy and lazy quantifiers,
 * {m,n}; anchors ^ and $ only at the ends). The whole output must match.
 * Errors give the byte offset in the pattern. */
struct grammar *grammar_compile_regex(const char *pattern, size_t len, struct kiln_error *err);

/* JSON Schema options. */
struct grammar_json_opts {
    /* whitespace between JSON tokens: -1 any amount (json_object, non-strict
     * schemas), >= 0 none (compact, the default for strict schemas) */
    int any_whitespace;
    /* strict (OpenAI json_schema.strict): additionalProperties false unless
     * the schema says otherwise; every property required */
    int strict;
};
/* A JSON Schema (draft 2020-12 / draft-07 keywords: type, properties,
 * required, additionalProperties, enum, const, items, prefixItems,
 * minItems, maxItems, anyOf, oneOf, allOf of one schema, $ref to
 * #/$defs/... and #/definitions/..., string minLength / maxLength /
 * pattern / format (date, time, date-time, email, uuid, uri, ipv4),
 * integer and number minimum / maximum where a grammar can express them).
 * A keyword kiln cannot enforce is refused ("json_schema: 'not' at
 * /properties/a is not supported"), never ignored. opts may be NULL. */
struct grammar *grammar_compile_json_schema(const char *schema, size_t len,
                                            const struct grammar_json_opts *opts,
                                            struct kiln_error *err);
/* Any JSON object (response_format {"type": "json_object"}). */
struct grammar *grammar_compile_json_object(struct kiln_error *err);

/* The translations behind the two compilers above, appending EBNF text
 * (root rule "root") to out. Return 0, or -1 with err set. */
int grammar_ebnf_from_regex(const char *pattern, size_t len, struct buf *out, struct kiln_error *err);
int grammar_ebnf_from_json_schema(const json_t *schema, const struct grammar_json_opts *opts,
                                  struct buf *out, struct kiln_error *err);

/* Copies EBNF text to out with every rule name (definitions and
 * references) prefixed, so that several translated grammars (each with
 * its own "root", "value", "r3", ...) can live in one: a name is a word
 * outside literals, classes and bounds. Returns 0, or -1 on an
 * unterminated literal or class (err set). */
int grammar_ebnf_prefix_rules(const char *text, size_t len, const char *prefix, struct buf *out,
                              struct kiln_error *err);

void grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g);

/* ---- vocabulary ---- */

/* tokens[i] / lens[i]: token i's raw bytes (after the tokenizer's byte
 * decoding; NULL or a special token: never allowed by a grammar).
 * special[i] != 0 marks special tokens (may be NULL). */
struct grammar_vocab *grammar_vocab_create(int n_tokens, const char *const *tokens,
                                           const size_t *lens, const uint8_t *special);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);
/* Words of the bitmask a matcher fills: (n_tokens + 31) / 32. */
int grammar_mask_words(const struct grammar_vocab *v);

/* Builds g's per-position token cache for v (once per grammar and
 * vocabulary; matchers do it on first use otherwise). Thread-safe: the
 * server calls it off the engine thread. Returns 0 or -1. */
int grammar_prepare(struct grammar *g, const struct grammar_vocab *v, struct kiln_error *err);

/* ---- matching ---- */

struct grammar_matcher *grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v,
                                               struct kiln_error *err);
void grammar_matcher_free(struct grammar_matcher *m);
/* Back to the start of the grammar. */
void grammar_matcher_reset(struct grammar_matcher *m);
/* Advances over a token's bytes. Returns 0, or -1 (state unchanged) when
 * the grammar does not allow it. Special tokens are refused. */
int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t token);
/* Advances over bytes (forced text, tests). 0 or -1 (state unchanged). */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n);
/* bits[grammar_mask_words(v)]: bit (i & 31) of word i >> 5 set when token
 * i may come next. End-of-sequence ids are not set (see can_end). */
void grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits);
int grammar_matcher_can_end(const struct grammar_matcher *m);
int grammar_matcher_is_done(const struct grammar_matcher *m);

#endif
