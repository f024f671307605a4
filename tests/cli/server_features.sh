#!/usr/bin/env bash
# Serving features through the official openai npm client and plain HTTP
# (tests/server/features.js): prompt logprobs (echo + logprobs,
# return_logprob + logprob_start_len), the first output token's leading
# space, generation_config.json sampling defaults (and
# --sampling-defaults openai), /health_generate, /get_server_info,
# /v1/models/{id}, CORS, error codes and the periodic log lines.
source "$KILN_SRC/tests/server/serve.sh"
GEN="$SERVE_TMP/greedy-model"
mkdir -p "$GEN"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    ln -s "$KILN_MODELS/stories260K/$f" "$GEN/$f"
done
# top_k 1: a model whose authors want greedy decoding by default
echo '{"bos_token_id": 1, "eos_token_id": 2, "top_k": 1}' >"$GEN/generation_config.json"
serve_start A --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 --decode-log-interval 1
serve_start G --model "$GEN" --skip-sampler-warmup --threads 1
serve_start O --model "$GEN" --skip-sampler-warmup --threads 1 --sampling-defaults openai
serve_start C --model "$KILN_MODELS/stories260K" --skip-sampler-warmup --threads 1 \
    --allowed-origins "http://allowed.example, http://other.example"
serve_node features.js "$URL_A" "$LOG_A" "$URL_G" "$URL_O" "$URL_C"
