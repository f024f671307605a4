#!/usr/bin/env bash
# Builds kiln and runs its main job on the bundled default model
# (models/stories260K). Extra arguments go to `kiln generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build >/dev/null
if [ $# -eq 0 ]; then set -- --prompt "Once upon a time" --max-tokens 64; fi
exec ./build/kiln generate "$@"
