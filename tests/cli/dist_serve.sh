#!/usr/bin/env bash
# kiln serve with the model over 2 ranks (--tp 2, on the CPU) through the
# official openai client: the whole OpenAI route suite (tests/server/openai.js:
# streaming, n > 1, logprobs, ...), 50 concurrent streams and --deterministic
# batch invariance (tests/server/dist.js), 200 concurrent streams, no radix
# cache and a pool so small that requests are retracted
# (tests/server/consistency.js), and a server over two nodes
# (--nnodes 2, separate processes on this machine). Every server stops
# gracefully (SIGTERM to rank 0) with status 0, the other ranks with it. A
# server started with stdin closed serves too (no socket becomes fd 0).
source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/cli/lib/dist.sh"
m="$KILN_MODELS/stories260K"
port=$(free_port)
# node 1 of the two-node server: started first, it waits for rank 0
"$KILN" serve --model "$m" --port 0 --skip-sampler-warmup --tp 2 --nnodes 2 --node-rank 1 \
    --dist-init-addr "127.0.0.1:$port" >"$SERVE_TMP/node1.out" 2>"$SERVE_TMP/node1.log" &
node1=$!
SERVE_PIDS+=("$node1")
serve_start A --model "$m" --skip-sampler-warmup --tp 2
serve_start T --model "$m" --skip-sampler-warmup --tp 2 --chat-template "$KILN_SRC/tests/server/chatml.jinja"
serve_start D --model "$m" --skip-sampler-warmup --tp 2 --deterministic
serve_start B --model "$m" --skip-sampler-warmup --tp 2 --disable-radix-cache
serve_start C --model "$m" --skip-sampler-warmup --tp 2 --max-total-tokens 400 --page-size 4
serve_start N --model "$m" --skip-sampler-warmup --tp 2 --nnodes 2 --node-rank 0 --dist-init-addr "127.0.0.1:$port"
# stdin closed: no socket may become fd 0 (the server's "no socket")
exec 3<&0 0<&-
serve_start Z --model "$m" --skip-sampler-warmup --tp 2
exec 0<&3 3<&-
code=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 4}' "$URL_Z/v1/completions")
[ "$code" = 200 ] || { echo "FAIL: --tp 2 with stdin closed answered $code"; exit 1; }
echo "ok: --tp 2 with stdin closed serves"
grep -h 'job: ' "$LOG_A" "$LOG_N"
serve_node openai.js "$URL_A" "$URL_T" || exit 1
serve_node dist.js "$URL_D" "$URL_N" || exit 1
serve_node consistency.js "$URL_A" "$URL_B" "$URL_C" || exit 1
# graceful stops: rank 0 tells the other ranks, which exit 0
for s in A T D B C N Z; do
    pids=$(job_pids "$SERVE_TMP/$s.log")
    serve_stop "$s" || exit 1
    # shellcheck disable=SC2086
    none_left $pids || { echo "FAIL: server $s: a rank still runs after the job ended"; exit 1; }
done
wait "$node1"; st=$?
[ "$st" = 0 ] || { echo "FAIL: node 1 exited with status $st"; tail -20 "$SERVE_TMP/node1.log"; exit 1; }
[ -s "$SERVE_TMP/node1.out" ] && { echo "FAIL: node 1 printed on stdout"; cat "$SERVE_TMP/node1.out"; exit 1; }
echo "ok: every server and node stopped with status 0"
