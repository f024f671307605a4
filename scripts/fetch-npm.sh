#!/usr/bin/env bash
# Installs the npm packages the server tests use (the official `openai`
# client, the OpenTelemetry JS SDK, the Vercel AI SDK) into
# ${KILN_NPM:-<repo>/.cache/npm}/node_modules. Idempotent: does nothing when
# the pinned versions are already there. Prints the folder that holds
# node_modules (tests set NODE_PATH to its node_modules).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KILN_NPM:-$repo/.cache/npm}"
# pinned: the openai client, ajv (the JSON Schema validator the structured
# output tests check outputs with), the OpenTelemetry SDK the tracing test
# uses as the reference for trace context and the OTLP JSON encoding, the
# JSON Schema test suite the grammar translator is checked against, and the
# Vercel AI SDK (ai, its OpenAI-compatible provider, zod for tool schemas)
# the agent test runs a tool loop with: its 6.x line, the newest that runs
# on Debian 12's node 18 (ai 7 needs node 22); openai-harmony (OpenAI's
# harmony library as WebAssembly) and tiktoken (the o200k ranks it reads),
# the truth of the gpt-oss output parsers
pkgs=(openai@4.104.0 ajv@8.17.1 @opentelemetry/api@1.10.0 @opentelemetry/core@3.1.1 @opentelemetry/sdk-trace@3.1.1
      @opentelemetry/otlp-transformer@0.301.1 json-schema-test-suite@0.0.10
      ai@6.0.325 @ai-sdk/openai-compatible@2.0.92 zod@4.6.7 openai-harmony@0.4.0 tiktoken@1.0.22)
have_all() {
    local p name ver
    for p in "${pkgs[@]}"; do
        name="${p%@*}" ver="${p##*@}"
        [[ -f "$dest/node_modules/$name/package.json" ]] || return 1
        [[ "$(node -p "require('$dest/node_modules/$name/package.json').version" 2>/dev/null)" == "$ver" ]] || return 1
    done
}
if ! have_all; then
    command -v npm >/dev/null || { echo "fetch-npm: npm is needed" >&2; exit 1; }
    mkdir -p "$dest"
    # a lock next to the cache: parallel test runs must not install twice at once
    exec 9>"$dest/.lock"
    flock 9
    if ! have_all; then
        echo "fetch-npm: installing ${pkgs[*]} into $dest" >&2
        npm install --silent --no-audit --no-fund --no-save --prefix "$dest" "${pkgs[@]}" >&2
    fi
fi
echo "$dest"
