#!/usr/bin/env bash
# Installs the npm packages the server tests use (the official `openai`
# client) into ${KILN_NPM:-<repo>/.cache/npm}/node_modules. Idempotent: does
# nothing when the pinned version is already there. Prints the folder that
# holds node_modules (tests set NODE_PATH to its node_modules).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KILN_NPM:-$repo/.cache/npm}"
version=4.104.0
want="openai@$version"
have=""
if [[ -f "$dest/node_modules/openai/package.json" ]]; then
    have="openai@$(node -p "require('$dest/node_modules/openai/package.json').version" 2>/dev/null || true)"
fi
if [[ "$have" != "$want" ]]; then
    command -v npm >/dev/null || { echo "fetch-npm: npm is needed" >&2; exit 1; }
    mkdir -p "$dest"
    # a lock next to the cache: parallel test runs must not install twice at once
    exec 9>"$dest/.lock"
    flock 9
    if [[ ! -f "$dest/node_modules/openai/package.json" ]] ||
       [[ "openai@$(node -p "require('$dest/node_modules/openai/package.json').version")" != "$want" ]]; then
        echo "fetch-npm: installing $want into $dest" >&2
        npm install --silent --no-audit --no-fund --no-save --prefix "$dest" "$want" >&2
    fi
fi
echo "$dest"
