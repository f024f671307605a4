#!/usr/bin/env bash
# kiln serve with the prefix cache's host tier (--enable-hierarchical-cache)
# on the bundled model in a small KV pool: a conversation's prompts
# evicted by other traffic come back from host memory (usage's
# cached_tokens, /metrics) with the texts of a server without the tier;
# the options it cannot serve are refused (tests/server/hicache.js).
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
serve_start A --model "$m" --skip-sampler-warmup --threads 1 --max-total-tokens 384 --page-size 4
serve_start B --model "$m" --skip-sampler-warmup --threads 1 --max-total-tokens 384 --page-size 4 \
    --enable-hierarchical-cache --hicache-ratio 4
# refused at start-up, naming the option
if out=$("$KILN" serve --model "$m" --enable-hierarchical-cache --disable-radix-cache --port 0 2>&1); then
  echo "FAIL: --enable-hierarchical-cache with --disable-radix-cache started"; exit 1
fi
grep -q -- "--disable-radix-cache" <<<"$out" || { echo "FAIL: the refusal does not name the option: $out"; exit 1; }
serve_node hicache.js "$URL_A" "$URL_B"
