#!/usr/bin/env bash
# SGLang's /separate_reasoning and /parse_function_call on kiln serve with
# the bundled model (tests/server/parse.js).
source "$KILN_SRC/tests/server/serve.sh"
serve_start A --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1
serve_node parse.js "$URL_A"
