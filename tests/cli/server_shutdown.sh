#!/usr/bin/env bash
# SIGTERM with requests in flight: each ends with a reason, the server exits
# 0 (tests/server/shutdown.js); a second server exits 0 on SIGINT when idle.
source "$KILN_SRC/tests/server/serve.sh"
m="$KILN_MODELS/stories260K"
fail=0
serve_start S --model "$m" --skip-sampler-warmup --threads 1 --shutdown-timeout 0
serve_node shutdown.js "$URL_S" "$PID_S" || fail=1
serve_wait S || fail=1
serve_start I --model "$m" --skip-sampler-warmup --threads 1
kill -INT "$PID_I"
serve_wait I || fail=1
[ $fail -eq 0 ] && echo "shutdown: ok"
exit $fail
