#!/usr/bin/env bash
# kiln serve on a model with sliding and full layers (the oracle's tiny
# Gemma-3: two layers slide over 8 positions, one attends to everything)
# with its hybrid KV pool: default, with one pool for every layer
# (--disable-hybrid-swa-memory) and with the fewest sliding pages in a
# small pool (tests/server/hybrid.js).
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_FIXTURES/oracle/tiny-models-more/gemma3"
serve_start A --model "$m" --skip-sampler-warmup --threads 1
serve_start B --model "$m" --skip-sampler-warmup --threads 1 --disable-hybrid-swa-memory
serve_start C --model "$m" --skip-sampler-warmup --threads 1 --swa-full-tokens-ratio 0.01 --max-total-tokens 600 \
    --page-size 4 --max-running-requests 8 --chunked-prefill-size 16
serve_node hybrid.js "$URL_A" "$URL_B" "$URL_C"
