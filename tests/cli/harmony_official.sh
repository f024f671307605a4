#!/usr/bin/env bash
# kiln's harmony parsers (gpt-oss: --tool-call-parser harmony,
# --reasoning-parser gpt_oss) against OpenAI's own harmony library: the
# openai-harmony npm package (OpenAI's Rust openai-harmony compiled to
# WebAssembly) parses each completion, kiln parse-output splits the same
# text, whole and in deltas; tests/cli/harmony_official.mjs says how.
set -euo pipefail
: "${KILN:?}" "${KILN_SRC:?}"
NPM_DIR="$("$KILN_SRC/scripts/fetch-npm.sh")" || { echo "FAIL: cannot install the npm test packages"; exit 1; }
node "$KILN_SRC/tests/cli/harmony_official.mjs" "$KILN" "$NPM_DIR/node_modules"
