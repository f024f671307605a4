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
    local rc=$? name st
    # a graceful stop of every server still up: its exit status (and, in
    # sanitizer builds, its leak report) is part of the test
    for f in "$SERVE_TMP"/*.pid; do
        [ -f "$f" ] || continue
        name="$(basename "$f" .pid)"
        [ -s "$SERVE_TMP/$name.status" ] && continue
        kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    for f in "$SERVE_TMP"/*.pid; do
        [ -f "$f" ] || continue
        name="$(basename "$f" .pid)"
        for _ in $(seq 1 200); do
            [ -s "$SERVE_TMP/$name.status" ] && break
            sleep 0.05
        done
        st="$(cat "$SERVE_TMP/$name.status" 2>/dev/null || echo "still running")"
        if [ "$st" != 0 ]; then
            echo "FAIL: server $name: exit status $st"
            rc=1
        fi
    done
    if [ "$rc" != 0 ]; then
        for log in "$SERVE_TMP"/*.log; do
            [ -f "$log" ] || continue
            echo "---- $(basename "$log") (last 40 lines)"
            tail -n 40 "$log"
        done
    fi
    for pid in "${SERVE_PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$SERVE_TMP"
    exit "$rc"
}
trap serve_cleanup EXIT
trap 'exit 130' INT TERM

# SERVE_NODE=0: a test that talks HTTP without node (the GPU machine has
# no network to install the openai package from)
if [ "${SERVE_NODE:-1}" != 0 ]; then
    NPM_DIR="$("$KILN_SRC/scripts/fetch-npm.sh")" || { echo "FAIL: cannot install the openai npm package"; exit 1; }
    export NODE_PATH="$NPM_DIR/node_modules"
fi

serve_start() {
    local name="$1"
    shift
    local out="$SERVE_TMP/$name.out" log="$SERVE_TMP/$name.log"
    # a wrapper records the exit status; the server's own pid is what we signal
    ( "$KILN" serve --port 0 "$@" >"$out" 2>"$log" &
      echo $! >"$SERVE_TMP/$name.pid"
      wait $!
      echo $? >"$SERVE_TMP/$name.status" ) 2>/dev/null &
    disown $! 2>/dev/null || true
    local pid=""
    for _ in $(seq 1 100); do
        pid="$(cat "$SERVE_TMP/$name.pid" 2>/dev/null)"
        [ -n "$pid" ] && break
        sleep 0.05
    done
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

# Waits (up to 30 s) for server NAME to exit; fails unless its status is 0.
serve_wait() {
    for _ in $(seq 1 300); do
        [ -s "$SERVE_TMP/$1.status" ] && break
        sleep 0.1
    done
    if [ ! -s "$SERVE_TMP/$1.status" ]; then
        echo "FAIL: $1 did not exit within 30 s"
        return 1
    fi
    local st
    st="$(cat "$SERVE_TMP/$1.status")"
    [ "$st" = 0 ] || { echo "FAIL: $1 exited with status $st"; tail -5 "$SERVE_TMP/$1.log"; return 1; }
}

# SIGTERM, then serve_wait.
serve_stop() {
    local pid_var="PID_$1"
    kill -TERM "${!pid_var}" 2>/dev/null || return 1
    serve_wait "$1"
}

serve_node() {
    node "$KILN_SRC/tests/server/$1" "${@:2}"
}
