#!/usr/bin/env bash
# Regular expressions compiled by kiln against JavaScript's RegExp
# (tests/cli/grammar_regex.mjs says how).
set -euo pipefail
: "${KILN:?}" "${KILN_SRC:?}"
node "$KILN_SRC/tests/cli/grammar_regex.mjs" "$KILN"
