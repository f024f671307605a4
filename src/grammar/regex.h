/* regex.h — the regular-expression translator shared by grammar_compile_regex
 * and the JSON Schema translator (string "pattern"), and the helpers both
 * use to write EBNF literals and character classes.
 *
 * A pattern is parsed into a small tree (alternation, concatenation,
 * repetition, code-point classes) and written as one EBNF expression.
 * Two readings of the output:
 *  - REGEX_RAW: the expression matches the text itself (the whole output
 *    of a regex-constrained request).
 *  - REGEX_JSON: the expression matches the inside of a JSON string (no
 *    quotes) whose decoded value the pattern matches, with each character
 *    written in its one canonical JSON form (raw, or \" \\ \b \f \n \r \t,
 *    other control characters as \u00XX; '/' also as \/), the form
 *    JSON.stringify and json.dumps write. JSON Schema patterns are
 *    unanchored ("a" means "contains a"): each top-level alternative not
 *    anchored by ^ / $ gets any characters before / after it.
 *
 * Semantics follow ECMAScript with the u flag where Python differs: `.`
 * excludes \n, \r, U+2028 and U+2029; \s is ECMAScript's white space; `$`
 * matches only at the very end.
 */
#ifndef KILN_GRAMMAR_REGEX_H
#define KILN_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

struct buf;
struct kiln_error;

enum regex_mode { REGEX_RAW, REGEX_JSON };

/* Appends one EBNF expression to out (REGEX_RAW: a sequence, for the top
 * of a rule; REGEX_JSON: parenthesised). Errors: "regex: <what> at offset N", code KILN_ERR_UNSUPPORTED for
 * valid syntax kiln does not translate (lookaround, backreferences),
 * KILN_ERR_BAD_INPUT for a malformed pattern. Returns 0 or -1. */
int regex_to_ebnf_expr(const char *pattern, size_t len, enum regex_mode mode, struct buf *out,
                       struct kiln_error *err);

/* Appends cp as it is written inside an EBNF "literal" (escaped as needed). */
void ebnf_put_lit_cp(struct buf *out, uint32_t cp);
/* Appends a whole "literal" for the UTF-8 text s[0..n) (must be valid). */
void ebnf_put_lit(struct buf *out, const char *s, size_t n);
/* One character of a JSON string in its canonical form, any code point but
 * the n in cps (a key that leaves a set of names behind). */
void regex_put_json_char_except(struct buf *out, const uint32_t *cps, int n);
/* Appends cp as it is written inside an EBNF [class]. */
void ebnf_put_class_cp(struct buf *out, uint32_t cp);

#endif
