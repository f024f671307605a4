#!/usr/bin/env bash
# The tokenizer pool: a 2 MB prompt tokenized off the loop thread
# does not stall other streams; pool results equal inline ones; disconnects
# and SIGTERM during tokenization are clean (tests/server/tokpool.js).
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
t="$KILN_SRC/tests/server/chatml.jinja"
fail=0
# P: everything through 2 workers (no inline fast path), and a grace long enough
# for slow (ASan, loaded) builds to finish what the SIGTERM test sends: it is a
# cap, the server exits as soon as that is done; I: all on the loop thread
serve_start P --model "$m" --skip-sampler-warmup --threads 1 --chat-template "$t" \
    --tokenizer-workers 2 --tokenizer-inline-bytes 0 --shutdown-timeout 600
serve_start I --model "$m" --skip-sampler-warmup --threads 1 --chat-template "$t" --tokenizer-workers 0
serve_node tokpool.js "$URL_P" "$URL_I" "$PID_P" "$LOG_P" || fail=1
serve_wait P || fail=1
[ $fail -eq 0 ] && echo "tokpool: ok"
exit $fail
