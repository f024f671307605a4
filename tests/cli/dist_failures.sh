#!/usr/bin/env bash
# A rank that dies ends the job, on the CPU: `kiln serve --tp 2` whose rank 1
# is SIGKILLed exits within a few seconds, status non-zero, naming rank 1,
# its pid and the signal; whose rank 0 is SIGKILLed leaves no rank behind
# (PR_SET_PDEATHSIG); whose rank 1 crashes (SIGSEGV, SIGABRT) prints the
# crash and a stack trace tagged with the rank before the job ends. Across
# two nodes (separate processes): a node that dies ends rank 0's, and rank
# 0 dying ends the other node. No kiln process of a case outlives it.
set -u
: "${KILN:?}" "${KILN_MODELS:?}" "${KILN_SRC:?}"
source "$KILN_SRC/tests/cli/lib/dist.sh"
fail=0; runs=0
m="$KILN_MODELS/stories260K"
tmp=$DIST_TMP
# start NAME ARGS...: kiln serve of the test model in the background (PID)
start() { local name=$1; shift; job_start "$name" serve --model "$m" --port 0 --skip-sampler-warmup "$@"; }
result() { # NAME OK? DESCRIPTION
    runs=$((runs + 1))
    if [ "$2" = 1 ]; then echo "ok: $3"; else
        echo "FAIL: $3"; sed 's/^/  | /' "$tmp/$1.err" | tail -25; fail=$((fail + 1)); fi
}

# rank 1 SIGKILLed: rank 0 ends the job, naming it
start k1 --tp 2; job_ready k1
p1=$(rank_pid k1 1)
kill -KILL "$p1"
st=$(job_ended k1 5)
ok=0
[ -n "$st" ] && [ "$st" != 0 ] && grep -q "kiln: rank 1 (pid $p1) was killed by SIGKILL (signal 9); ending the job" \
    "$tmp/k1.err" && job_gone k1 && ok=1
result k1 $ok "SIGKILL to rank 1: the server exited (status $st) naming rank 1"

# rank 0 SIGKILLed: rank 1 goes with it
start k0 --tp 2; job_ready k0
p1=$(rank_pid k0 1)
kill -KILL "$PID"
ok=0
job_gone k0 && ok=1
result k0 $ok "SIGKILL to rank 0: rank 1 (pid $p1) is gone too"

# a crash: the stack trace, tagged, then the job ends
for sig in SEGV ABRT; do
    start c$sig --tp 2; job_ready c$sig
    p1=$(rank_pid c$sig 1)
    kill -$sig "$p1"
    st=$(job_ended c$sig 5)
    ok=0
    [ -n "$st" ] && [ "$st" != 0 ] && grep -q "^\[rank 1\] kiln: rank 1 (pid $p1) caught SIG$sig; stack trace:" \
        "$tmp/c$sig.err" && grep -q "kiln(main+" "$tmp/c$sig.err" &&
        grep -q "kiln: rank 1 (pid $p1) was killed by SIG$sig" "$tmp/c$sig.err" && job_gone c$sig && ok=1
    result c$sig $ok "SIG$sig in rank 1: its stack trace, then the job ended (status $st)"
done

# two nodes: node 1's rank dies; then rank 0 dies
port=$(free_port)
start n1 --tp 4 --nnodes 2 --node-rank 1 --dist-init-addr "127.0.0.1:$port"
n1=$PID
start n0 --tp 4 --nnodes 2 --node-rank 0 --dist-init-addr "127.0.0.1:$port"
job_ready n0; job_ready n1
kill -KILL "$n1"
st=$(job_ended n0 5)
ok=0
# (rank 3 dies with its node's first process, rank 2: either may be seen first)
[ -n "$st" ] && [ "$st" != 0 ] && grep -Eq "kiln: rank [23] \([0-9.:]+\) closed its connection; ending the job" \
    "$tmp/n0.err" && job_gone n0 && job_gone n1 && ok=1
result n0 $ok "node 1 SIGKILLed: rank 0 ended the job (status $st) naming a rank of node 1"

port=$(free_port)
start m1 --tp 4 --nnodes 2 --node-rank 1 --dist-init-addr "127.0.0.1:$port"
start m0 --tp 4 --nnodes 2 --node-rank 0 --dist-init-addr "127.0.0.1:$port"
job_ready m0; job_ready m1
kill -KILL "$PID"
st=$(job_ended m1 5)
ok=0
[ -n "$st" ] && [ "$st" != 0 ] && grep -q "rank 0 (127.0.0.1:$port) closed" "$tmp/m1.err" && job_gone m1 &&
    job_gone m0 && ok=1
result m1 $ok "rank 0 SIGKILLed: node 1 ended (status $st) naming rank 0"

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
