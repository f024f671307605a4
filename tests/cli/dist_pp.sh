#!/usr/bin/env bash
# Pipeline parallel on the CPU (--pp): kiln verify --pp 2 and 3 on the
# oracle models, alone and with --tp 2 (and --ep 2 on the MoE ones), page
# sizes 1 and 16, chunked prefill of 3 (its mixed steps are cut into
# micro-batches), every row within 1e-3 of the reference as in
# verify_oracle.sh, the same max_abs_err as without --pp (the same bits:
# one rank's, or --tp's alone) and within 1e-4 of one rank's. Layouts that cannot
# run are refused with a reason. `kiln serve --pp 2` (and --pp 2 --tp 2)
# answers concurrent greedy completions as one rank does, stops with
# status 0, and ends the job, naming the rank, when a stage's process is
# killed.
SERVE_NODE=0
source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/cli/lib/dist.sh"
: "${KILN_FIXTURES:?}" "${KILN_MODELS:?}"
fail=0
oracle="$KILN_FIXTURES/oracle/tiny-models"
D="$SERVE_TMP/pp"
mkdir -p "$D"
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# verify ARCH ARGS...: the last line ("max_abs_err=X rows=N") in $last
verify() {
    local arch=$1; shift
    local out
    out=$("$KILN" verify --model "$oracle/$arch" --reference "$oracle/$arch/reference.safetensors" --chunk 3 "$@" \
        2>"$D/v.err")
    local rc=$?
    last=$(printf '%s\n' "$out" | tail -1)
    if [ $rc -ne 0 ] || ! printf '%s' "$last" | grep -Eq '^max_abs_err=[0-9.e+-]+ rows=[1-9][0-9]*$'; then
        bad "kiln verify $arch $* (status $rc)"; printf '%s\n' "$out"; tail -20 "$D/v.err"; return 1
    fi
}
# case ARCH PAGE "BASE" ARGS...: within 1e-3 of the reference, the same
# max_abs_err as with BASE (the options without --pp; "" one rank), and
# within 1e-4 of one rank's
case_pp() {
    local arch=$1 ps=$2 base=$3; shift 3
    verify "$arch" --page-size "$ps" || return
    local one=$last want=$last
    if [ -n "$base" ]; then
        # shellcheck disable=SC2086
        verify "$arch" --page-size "$ps" $base || return
        want=$last
    fi
    verify "$arch" --page-size "$ps" "$@" || return
    local e1=${one%% *} e2=${last%% *}
    if [ "$want" != "$last" ]; then
        bad "$arch $* --page-size $ps: $last, without --pp $want (expected the same bits)"
    elif ! awk -v a="${e1#*=}" -v b="${e2#*=}" 'BEGIN { d = a - b; exit !(d <= 1e-4 && d >= -1e-4) }'; then
        bad "$arch $* --page-size $ps: $last, one rank $one"
    else
        echo "ok: $arch $* --page-size $ps -> $last (one rank: $one)"
    fi
}
for ps in 1 16; do
    for arch in llama qwen3; do case_pp "$arch" "$ps" "" --pp 2; done
    case_pp qwen3 "$ps" "" --pp 3
    case_pp llama "$ps" "--tp 2" --pp 2 --tp 2
done
case_pp qwen2 1 "--tp 2" --pp 3 --tp 2
case_pp qwen3_moe 16 "" --pp 2
case_pp deepseek_v2 1 "--tp 2 --ep 2" --pp 2 --tp 2 --ep 2
case_pp deepseek_v3 16 "" --pp 2

# refused: more stages than layers; a node's edge through a stage's group
refused() { # STATUS TEXT ARGS...
    local want=$1 text=$2; shift 2
    "$KILN" verify --model "$oracle/llama" --reference "$oracle/llama/reference.safetensors" "$@" >"$D/r.out" 2>"$D/r.err"
    local rc=$?
    if [ $rc -ne "$want" ] || ! grep -qF "$text" "$D/r.err"; then
        bad "kiln verify $*: status $rc, expected $want and '$text'"; tail -5 "$D/r.err"
    else echo "ok: refused $*"; fi
}
refused 1 "num_hidden_layers (3) is smaller than the pipeline parallel size 4" --pp 4
refused 2 "would cut a stage's tensor parallel group at a node's edge" --tp 2 --pp 3 --nnodes 2 \
    --dist-init-addr 127.0.0.1:1
refused 2 "is not divisible by --nnodes 4" --tp 2 --pp 3 --nnodes 4 --dist-init-addr 127.0.0.1:1

# serve: concurrent greedy completions (a prefill of several sequences cut
# into micro-batches) answered as one rank answers them
m="$KILN_MODELS/stories260K"
serve_start ONE --model "$m" --skip-sampler-warmup
serve_start PP --model "$m" --skip-sampler-warmup --pp 2
serve_start PT --model "$m" --skip-sampler-warmup --pp 2 --tp 2
grep -h 'job: ' "$LOG_PP" "$LOG_PT"
post() { # URL NAME PROMPT
    curl -sS -o "$D/$2.out" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"$3\", \"max_tokens\": 16, \"temperature\": 0}" "$1/v1/completions" >"$D/$2.code"
}
text() { node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0].text)' "$1"; }
prompts=("Once upon a time" "The little dog" "Lily and Tom went to the park" "One day")
for s in ONE PP PT; do
    url_var="URL_$s"
    for i in 0 1 2 3; do post "${!url_var}" "$s$i" "${prompts[$i]}" & done
    wait
done
for s in PP PT; do
    for i in 0 1 2 3; do
        if [ "$(cat "$D/$s$i.code")" != 200 ] || [ "$(text "$D/$s$i.out")" != "$(text "$D/ONE$i.out")" ]; then
            bad "serve $s, prompt $i: $(cat "$D/$s$i.code") $(cat "$D/$s$i.out"), one rank: $(cat "$D/ONE$i.out")"
        fi
    done
done
echo "ok: serve --pp 2, --pp 2 --tp 2: '$(text "$D/PP0.out")' ... as one rank"
for s in ONE PP PT; do
    pids=$(job_pids "$SERVE_TMP/$s.log")
    serve_stop "$s" || bad "server $s did not stop"
    # shellcheck disable=SC2086
    none_left $pids || bad "server $s: a rank still runs after the job ended"
done

# the last stage's process SIGKILLed: rank 0 ends the job, naming it
serve_start K --model "$m" --skip-sampler-warmup --pp 2
sleep 0.3 # the other rank's layout line
p1=$(job_pids "$LOG_K" | sed -n 2p)
kill -KILL "$p1"
for _ in $(seq 1 100); do [ -s "$SERVE_TMP/K.status" ] && break; sleep 0.05; done
st=$(cat "$SERVE_TMP/K.status" 2>/dev/null)
if [ -n "$st" ] && [ "$st" != 0 ] && grep -q "kiln: rank 1 (pid $p1) was killed by SIGKILL" "$LOG_K"; then
    echo "ok: SIGKILL to stage 1 ended the server (status $st)"
    rm -f "$SERVE_TMP/K.pid" "$SERVE_TMP/K.status" # not a failure for the cleanup
else
    bad "SIGKILL to stage 1: status '$st'"; tail -20 "$LOG_K"
fi
[ $fail = 0 ] || { echo "$fail failure(s)"; exit 1; }
echo "dist_pp: all passed"
