#!/usr/bin/env bash
# 200 concurrent streams; greedy outputs identical alone, in a batch of 32,
# without the radix cache, and with a KV pool so small that requests are
# retracted; the KV pool is free afterwards (tests/server/consistency.js).
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
serve_start A --model "$m" --skip-sampler-warmup --threads 1
serve_start B --model "$m" --skip-sampler-warmup --threads 1 --disable-radix-cache
serve_start C --model "$m" --skip-sampler-warmup --threads 1 --max-total-tokens 400 --page-size 4
serve_node consistency.js "$URL_A" "$URL_B" "$URL_C"
