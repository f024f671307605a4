# serve.sh — sourced by tests/cli/server_*.sh: starts `kiln serve` on a free
# loopback port and guarantees it is stopped when the test exits.
#
#   source "$KILN_SRC/tests/server/serve.sh"
#   serve_start NAME [kiln serve options...]   # sets URL_NAME, PID_NAME, LOG_NAME
#   serve_node script.js [args...]             # node with the openai package
#
# Every server gets --port 0; its "listening on" line gives the port.
set -u
: "${KILN:?}" "${KILN_SRC:?}"
SERVE_TMP="$(mktemp -d)"
SERVE_PIDS=()
serve_cleanup() {
    for pid in "${SERVE_PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$SERVE_TMP"
}
trap serve_cleanup EXIT
trap 'exit 130' INT TERM

NPM_DIR="$("$KILN_SRC/scripts/fetch-npm.sh")" || { echo "FAIL: cannot install the openai npm package"; exit 1; }
export NODE_PATH="$NPM_DIR/node_modules"

serve_start() {
    local name="$1"
    shift
    local out="$SERVE_TMP/$name.out" log="$SERVE_TMP/$name.log"
    "$KILN" serve --port 0 "$@" >"$out" 2>"$log" &
    local pid=$!
    SERVE_PIDS+=("$pid")
    local url=""
    for _ in $(seq 1 600); do
        url="$(grep -o 'http://[^ ]*' "$out" 2>/dev/null | head -n 1)"
        [ -n "$url" ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "FAIL: kiln serve $* exited early"
            cat "$out" "$log"
            exit 1
        fi
        sleep 0.1
    done
    if [ -z "$url" ]; then
        echo "FAIL: kiln serve $* did not start within 60 s"
        cat "$out" "$log"
        exit 1
    fi
    printf -v "URL_$name" '%s' "$url"
    printf -v "PID_$name" '%s' "$pid"
    printf -v "LOG_$name" '%s' "$log"
    export "URL_$name"
    echo "started $name: $url (pid $pid)"
}

serve_node() {
    node "$KILN_SRC/tests/server/$1" "${@:2}"
}
