#!/usr/bin/env bash
# Every HTTP error class over raw sockets (tests/server/errors.js): auth,
# 404/405, malformed and truncated bodies, invalid UTF-8, 413, 429, 431,
# 503 over the connection limit, client disconnects; the server survives all.
source "$KILN_SRC/tests/server/serve.sh"
serve_start A --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 --api-key sk-test \
    --max-body-bytes 65536 --max-connections 16 --max-running-requests 1 --max-queued-requests 1
serve_node errors.js "$URL_A"
