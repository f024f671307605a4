#!/usr/bin/env bash
# Chat completions through a tiny oracle model's ChatML template, and
# /v1/score against the oracle's reference logits for every tiny
# architecture (tests/server/chat_score.js).
source "$KILN_SRC/tests/server/serve.sh"
models="$KILN_FIXTURES/oracle/tiny-models"
fail=0
serve_start qwen3 --model "$models/qwen3" --skip-sampler-warmup --threads 1
serve_node chat_score.js "$URL_qwen3" "$models/qwen3" || fail=1
for arch in llama qwen2 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
    [ -f "$models/$arch/reference.safetensors" ] || continue
    serve_start "$arch" --model "$models/$arch" --skip-sampler-warmup --threads 1
    url_var="URL_$arch"
    serve_node chat_score.js "${!url_var}" "$models/$arch" score-only || fail=1
    serve_stop "$arch" || fail=1
done
serve_stop qwen3 || fail=1
exit $fail
