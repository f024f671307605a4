#!/usr/bin/env bash
# An agent loop of a real framework, the Vercel AI SDK (npm ai,
# @ai-sdk/openai-compatible, zod), against kiln serve
# (tests/server/agent.mjs): a tool call forced by toolChoice "required" or
# a named tool, its arguments checked against the tool's zod schema, the
# tool run and its result sent back, then a text answer; with generateText
# and streamText. The tiny Qwen3 model with the real Qwen3 chat template,
# --tool-call-parser auto and --reasoning-parser qwen3; its copy here has a
# context of 4096 tokens (512 in its config.json; its weights are random,
# so nothing depends on the length it was made for), as the template's
# tool instructions and two tools' schemas take about 950 tokens.
source "$KILN_SRC/tests/server/serve.sh"
MODEL="$SERVE_TMP/qwen3"
mkdir -p "$MODEL"
for f in "$KILN_FIXTURES/oracle/tiny-models/qwen3"/*; do
    [ "$(basename "$f")" = config.json ] || ln -s "$f" "$MODEL/"
done
node -e 'const fs = require("fs"); const c = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
         c.max_position_embeddings = 4096; fs.writeFileSync(process.argv[2], JSON.stringify(c))' \
    "$KILN_FIXTURES/oracle/tiny-models/qwen3/config.json" "$MODEL/config.json" || exit 1
TMPL="$SERVE_TMP/qwen3.jinja"
node -e 'const c = require(process.argv[1]); require("fs").writeFileSync(process.argv[2], c.chat_template)' \
    "$KILN_TOKENIZERS/qwen3/tokenizer_config.json" "$TMPL" || exit 1
serve_start Q --model "$MODEL" --chat-template "$TMPL" --skip-sampler-warmup \
    --threads 1 --tool-call-parser auto --reasoning-parser qwen3
serve_node agent.mjs "$URL_Q" "$NPM_DIR"
