#!/usr/bin/env bash
# The OpenAI-compatible and native routes through the official openai npm
# client against the bundled stories260K model (tests/server/openai.js).
source "$KILN_SRC/tests/server/serve.sh"
serve_start A --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1
serve_start T --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 \
    --chat-template "$KILN_SRC/tests/server/chatml.jinja"
serve_start E --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 \
    --chat-template "$KILN_SRC/tests/server/effort.jinja"
serve_node openai.js "$URL_A" "$URL_T" "$URL_E"
