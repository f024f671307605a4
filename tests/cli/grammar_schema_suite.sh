#!/usr/bin/env bash
# The JSON Schema translator against the official JSON-Schema-Test-Suite
# (npm json-schema-test-suite): tests/cli/grammar_schema_suite.mjs says how.
set -euo pipefail
: "${KILN:?}" "${KILN_SRC:?}"
NPM_DIR="$("$KILN_SRC/scripts/fetch-npm.sh")" || { echo "FAIL: cannot install the npm test packages"; exit 1; }
# the share of the suite's draft-4 schemas translated today is 48 of 79:
# a drop means a keyword stopped being supported
node "$KILN_SRC/tests/cli/grammar_schema_suite.mjs" "$KILN" \
    "$NPM_DIR/node_modules/json-schema-test-suite/tests/draft4" --min-share 0.60
