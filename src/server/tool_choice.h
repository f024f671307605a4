/* tool_choice.h — tool_choice "required" and a named function, enforced:
 * the request's output is constrained to calls in the server's tool-call
 * format (chat/tool_parser.h's frames) whose arguments match each tool's
 * `parameters` JSON Schema, through the grammar engine (grammar/grammar.h).
 *
 * "required": one call of any tool (several, separated as the format
 * separates them, when parallel_tool_calls is not false); a named
 * function: one call of it. The grammar is an EBNF spec like any
 * structured output (so compiled and cached the same way); each tool's
 * schema is translated with compact JSON, its rules under their own
 * prefix. A request that asks for both a forced tool call and another
 * constraint (response_format, guided_*, ...) is a 400, as is a tool whose
 * parameters kiln cannot enforce (the translator's message, naming the
 * tool). */
#ifndef KILN_SERVER_TOOL_CHOICE_H
#define KILN_SERVER_TOOL_CHOICE_H

#include <jansson.h>

#include "chat/tool_parser.h"

struct so_spec;
struct req_error;

/* Fills sp (kind SO_EBNF, param "tool_choice") when body's tool_choice is
 * "required" or names a function, for format fmt (not NONE: validated
 * before); leaves it alone otherwise. 0 or -1 with e. */
int tool_choice_grammar(const json_t *body, enum tool_format fmt, int parallel, struct so_spec *sp,
                        struct req_error *e);

#endif
