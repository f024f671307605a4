# shellcheck shell=bash
# dist.sh — sourced by tests/cli/dist_*.sh: kiln jobs of several ranks in
# the background, free ports, waiting for a job, and checking that no
# process of a job is left. Source tests/server/serve.sh first where the
# test also uses serve_start (this file's exit handler then ends with
# serve.sh's).
#
#   free_port                      a free loopback TCP port outside the ephemeral range
#   job_start NAME CMD ARGS...     `kiln CMD ARGS` in the background: stdout,
#                                  stderr, pid and (once it exited) exit status
#                                  in $DIST_TMP/NAME.{out,err,pid,status}; sets PID
#   job_ready NAME                 waits (15 s at most) until it listens (rank
#                                  0's node) or follows rank 0 (another node);
#                                  the pids of its ranks join $DIST_TMP/NAME.pids
#   job_ended NAME SECONDS         its exit status once it exited within
#                                  SECONDS, else ""
#   rank_pid NAME R                the pid of rank R (from the layout lines)
#   job_pids FILE...               every pid the layout lines in FILE name
#                                  ("rank 1 pid 123")
#   none_left PID...               every PID has exited, within 5 s; else prints
#                                  the ones left and returns 1
#   job_gone NAME / log_gone FILE  none_left for the job's pids / the pids FILE names
#
# At exit every process started here or named by a layout line in
# $DIST_TMP gets SIGKILL (a failed test leaves nothing behind).
: "${KILN:?}"
DIST_TMP="$(mktemp -d)"
DIST_PIDS=()

dist_cleanup() {
    local rc=$? p
    for p in "${DIST_PIDS[@]}" $(cat "$DIST_TMP"/*.pids 2>/dev/null) \
        $(grep -ho 'rank [0-9]* pid [0-9]*' "$DIST_TMP"/*.err 2>/dev/null | awk '{print $4}'); do
        kill -KILL "$p" 2>/dev/null
    done
    rm -rf "$DIST_TMP"
    if declare -F serve_cleanup >/dev/null; then
        (exit "$rc")
        serve_cleanup
    fi
    exit "$rc"
}
trap dist_cleanup EXIT
trap 'exit 130' INT TERM

# A port below the kernel's ephemeral range (32768 and up on Linux), free
# when tried: a job's other nodes may try to connect to it before its
# first node listens, and a port the kernel hands out for `--port 0` or a
# single-node job's own rendezvous (another test running at the same time)
# could be taken in between and answer them.
free_port() {
    node -e 'const net=require("net");
const go=()=>{const p=20000+Math.floor(Math.random()*12000),s=net.createServer();
s.once("error",go);s.listen(p,"127.0.0.1",()=>{console.log(p);s.close()})};go()'
}

job_start() {
    local name=$1 cmd=$2; shift 2
    ( "$KILN" "$cmd" "$@" >"$DIST_TMP/$name.out" 2>"$DIST_TMP/$name.err" &
      echo $! >"$DIST_TMP/$name.pid"; wait $!; echo $? >"$DIST_TMP/$name.status" ) 2>/dev/null &
    for _ in $(seq 1 100); do [ -s "$DIST_TMP/$name.pid" ] && break; sleep 0.05; done
    PID=$(cat "$DIST_TMP/$name.pid")
    DIST_PIDS+=("$PID")
    echo "$PID" >"$DIST_TMP/$name.pids"
}

job_ready() {
    for _ in $(seq 1 300); do
        grep -q 'listening on\|following rank 0' "$DIST_TMP/$1.out" "$DIST_TMP/$1.err" 2>/dev/null && break
        sleep 0.05
    done
    job_pids "$DIST_TMP/$1.err" >>"$DIST_TMP/$1.pids"
    sleep 0.2 # the other ranks' first lines
}

job_ended() {
    local t=$(($2 * 20))
    for _ in $(seq 1 $t); do [ -s "$DIST_TMP/$1.status" ] && break; sleep 0.05; done
    cat "$DIST_TMP/$1.status" 2>/dev/null
}

rank_pid() { grep -o "rank $2 pid [0-9]*" "$DIST_TMP/$1.err" | awk '{print $4}'; }

job_pids() { grep -ho 'rank [0-9]* pid [0-9]*' "$@" 2>/dev/null | awk '{print $4}'; }

none_left() {
    local p left
    for _ in $(seq 1 100); do
        left=""
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
        [ -z "$left" ] && return 0
        sleep 0.05
    done
    echo "  left running:$left"
    return 1
}

# shellcheck disable=SC2046
job_gone() { none_left $(cat "$DIST_TMP/$1.pids"); }
# shellcheck disable=SC2046
log_gone() { none_left $(job_pids "$@"); }
