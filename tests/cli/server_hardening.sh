#!/usr/bin/env bash
# Hostile and broken clients (tests/server/hardening.js): slow heads and
# bodies, clients that never read, the API key before the body, strict
# framing, and long work kept off the event loop.
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
serve_start A --model "$m" --skip-sampler-warmup --threads 1 --api-key sk-test --max-queued-requests 4 \
    --request-head-timeout 2 --request-body-timeout 2
serve_start B --model "$m" --skip-sampler-warmup --threads 1
serve_node hardening.js "$URL_A" "$PID_A" "$URL_B"
