#!/usr/bin/env bash
# The official JSON-Schema-Test-Suite's draft-4 schemas as a corpus for
# structured outputs end to end: every distinct schema as response_format
# json_schema (strict), greedy and sampled, to the bundled stories260K and
# the seven oracle models with random weights; outputs judged by JSON.parse
# + ajv, unsupported schemas by their 400 (tests/server/schema_corpus.mjs).
source "$KILN_SRC/tests/server/serve.sh"
: "${KILN_FIXTURES:?}" "${KILN_MODELS:?}"
opts=(--skip-sampler-warmup --threads 1 --max-total-tokens 32768)
serve_start stories260K --model "$KILN_MODELS/stories260K" "${opts[@]}" \
    --chat-template "$KILN_SRC/tests/server/chatml.jinja"
urls=("$URL_stories260K")
for arch in llama qwen2 qwen3 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
    serve_start "$arch" --model "$KILN_FIXTURES/oracle/tiny-models/$arch" "${opts[@]}"
    url="URL_$arch"
    urls+=("${!url}")
done
# 48 of the 77 distinct schemas are supported today: a drop means a keyword
# stopped being supported
serve_node schema_corpus.mjs "$NPM_DIR/node_modules/json-schema-test-suite/tests/draft4" "${urls[@]}" \
    --min-share 0.60
