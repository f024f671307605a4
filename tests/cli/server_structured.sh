#!/usr/bin/env bash
# Structured outputs (response_format, guided_*, SGLang's regex / json_schema
# / ebnf) through the official openai npm client against the bundled
# stories260K model, outputs judged by JSON.parse + ajv and RegExp
# (tests/server/structured.js).
source "$KILN_SRC/tests/server/serve.sh"
serve_start S --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 \
    --chat-template "$KILN_SRC/tests/server/chatml.jinja"
serve_node structured.js "$URL_S"
