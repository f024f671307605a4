#!/usr/bin/env bash
# kiln serve with speculative decoding (--speculative-algorithm NGRAM) on
# the bundled model: the same greedy texts, streamed and not, as a server
# without it, its drafts counted in /metrics (tests/server/spec.js).
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
serve_start A --model "$m" --skip-sampler-warmup --threads 1
serve_start B --model "$m" --skip-sampler-warmup --threads 1 --speculative-algorithm NGRAM \
    --speculative-num-draft-tokens 5 --page-size 4
serve_node spec.js "$URL_A" "$URL_B"
