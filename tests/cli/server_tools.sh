#!/usr/bin/env bash
# Tool calling and reasoning through the official openai npm client
# (tests/server/tools.js): a tiny Qwen3 model served with the real Qwen3
# chat template, --tool-call-parser auto and --reasoning-parser qwen3; the
# history of a tool round trip (assistant content null + tool_calls, a tool
# message) renders as transformers renders it, and bad tool_choice values
# get a 400. Unknown parser names stop `kiln serve` before the model loads.
source "$KILN_SRC/tests/server/serve.sh"
fail=0
for opt in --tool-call-parser --reasoning-parser; do
    if out="$("$KILN" serve "$KILN_FIXTURES/oracle/tiny-models/qwen3" $opt nonesuch 2>&1)"; then
        echo "FAIL: $opt nonesuch was accepted"; fail=1
    elif ! grep -q -e "$opt nonesuch: unknown; choose one of .*\(qwen3\|hermes\)" <<<"$out"; then
        echo "FAIL: $opt nonesuch: $out"; fail=1
    fi
done
TMPL="$SERVE_TMP/qwen3.jinja"
node -e 'const c = require(process.argv[1]); require("fs").writeFileSync(process.argv[2], c.chat_template)' \
    "$KILN_TOKENIZERS/qwen3/tokenizer_config.json" "$TMPL" || exit 1
serve_start Q --model "$KILN_FIXTURES/oracle/tiny-models/qwen3" --chat-template "$TMPL" --skip-sampler-warmup \
    --threads 1 --tool-call-parser auto --reasoning-parser qwen3
grep -q "tool calls: the hermes format" "$LOG_Q" || { echo "FAIL: auto did not pick hermes"; cat "$LOG_Q"; fail=1; }
serve_node tools.js "$URL_Q" || fail=1
exit $fail
