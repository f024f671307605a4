#!/usr/bin/env bash
# Bounded soak of `kiln serve` (not part of CI): 5,000 requests (or $1) of
# random lengths, half streamed, with random client disconnects, against a
# small KV pool; then checks that no KV page leaked and that resident memory
# is back at its plateau, and prints the figures.
#   scripts/soak.sh [N] [CONCURRENCY]       (KILN=path/to/kiln to override)
set -uo pipefail  # not -e: serve.sh polls with commands that may fail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KILN="${KILN:-$repo/build/kiln}" KILN_SRC="$repo" KILN_MODELS="$repo/models"
[ -x "$KILN" ] || { echo "soak: build first (ninja -C build)"; exit 1; }
source "$repo/tests/server/serve.sh"
serve_start SOAK --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 \
    --max-total-tokens 3000 --max-running-requests 64
serve_node soak.js "$URL_SOAK" "$PID_SOAK" "${1:-5000}" "${2:-48}"
