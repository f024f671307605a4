#!/usr/bin/env bash
# The model over several ranks, on the CPU: kiln verify --tp 2 and --tp 4 on
# the dense oracle models and --tp 2 --ep 2 on the MoE ones (page sizes 1
# and 16, chunked prefill of 3), Gemma-3 with --tp 2, gpt-oss (bf16 and
# MXFP4 experts) with --tp 2 and 4 and --ep, Gemma-3 and gpt-oss with
# --pp 3 (their hybrid KV pools), every row within 1e-3 of the reference as
# in verify_oracle.sh; two "nodes" on this machine (--nnodes 2, separate
# processes); generate and bench offline over 2 ranks print what one rank
# prints; bad layouts are refused with a reason. After every job no process
# of it is left.
set -u
: "${KILN:?}" "${KILN_FIXTURES:?}" "${KILN_MODELS:?}" "${KILN_SRC:?}"
source "$KILN_SRC/tests/cli/lib/dist.sh"
tmp=$DIST_TMP
fail=0; runs=0

# Some pid a job's layout line named ("rank 1 pid 123") still runs.
leftovers() { ! log_gone "$@"; }

check() {
    local name=$1; shift
    local out rc last
    out=$("$KILN" verify "$@" 2>"$tmp/v.err"); rc=$?
    runs=$((runs + 1))
    last=$(printf '%s\n' "$out" | tail -1)
    if [ $rc -ne 0 ] || ! printf '%s' "$last" | grep -Eq '^max_abs_err=[0-9.e+-]+ rows=[1-9][0-9]*$' ||
        [ "$(printf '%s\n' "$out" | grep -c '^max_abs_err=')" != 1 ] || leftovers "$tmp/v.err"; then
        echo "FAIL: kiln verify $*"; printf '%s\n' "$out"; tail -20 "$tmp/v.err"; fail=$((fail + 1))
    else
        echo "ok: $name -> $last"
    fi
}

oracle="$KILN_FIXTURES/oracle/tiny-models"
for arch in llama qwen2 qwen3; do
    for tp in 2 4; do
        for ps in 1 16; do
            check "$arch --tp $tp --page-size $ps" --model "$oracle/$arch" \
                --reference "$oracle/$arch/reference.safetensors" --tp $tp --page-size $ps --chunk 3
        done
    done
done
for arch in qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
    for ps in 1 16; do
        check "$arch --tp 2 --ep 2 --page-size $ps" --model "$oracle/$arch" \
            --reference "$oracle/$arch/reference.safetensors" --tp 2 --ep 2 --page-size $ps --chunk 3
    done
done

# Sliding and full layers: a hybrid KV pool, whose sliding pages rank 0's
# steps carry to the other ranks; gpt-oss's attention sinks split with
# the heads (--tp 4: two KV heads, each on two ranks), its fused bf16 and
# MXFP4 experts by columns (the down bias added by rank 0 alone) or whole
# (--ep)
more="$KILN_FIXTURES/oracle/tiny-models-more"
for ps in 1 16; do
    check "gemma3 --tp 2 --page-size $ps" --model "$more/gemma3" --reference "$more/gemma3/reference.safetensors" \
        --tp 2 --page-size $ps --chunk 3
done
for arch in gpt_oss gpt_oss_mxfp4; do
    for args in "--tp 2" "--tp 4" "--tp 2 --ep 2" "--tp 4 --ep 4"; do
        # shellcheck disable=SC2086
        check "$arch $args" --model "$more/$arch" --reference "$more/$arch/reference.safetensors" $args \
            --page-size 16 --chunk 3
    done
done
for arch in gemma3 gpt_oss; do
    check "$arch --pp 3" --model "$more/$arch" --reference "$more/$arch/reference.safetensors" --pp 3 --page-size 4 --chunk 3
done

# Two nodes on this machine: node 1 started first (it waits for rank 0).
two_nodes() { # tp, then verify's arguments
    local tp=$1; shift
    local port; port=$(free_port)
    "$KILN" verify "$@" --tp "$tp" --nnodes 2 --node-rank 1 --dist-init-addr "127.0.0.1:$port" \
        >"$tmp/n1.out" 2>"$tmp/n1.err" &
    local n1=$!
    DIST_PIDS+=("$n1")
    check "node 0 of 2, --tp $tp" "$@" --tp "$tp" --nnodes 2 --node-rank 0 --dist-init-addr "127.0.0.1:$port"
    wait "$n1"; local rc=$?
    runs=$((runs + 1))
    if [ $rc -ne 0 ] || [ -s "$tmp/n1.out" ] || leftovers "$tmp/n1.err"; then
        echo "FAIL: node 1 of --tp $tp: exit status $rc, stdout $(wc -c <"$tmp/n1.out") bytes"; tail -20 "$tmp/n1.err"
        fail=$((fail + 1))
    else
        echo "ok: node 1 of --tp $tp ended with the job, printed nothing, its ranks tagged:" \
            "$(grep -o '^\[rank [0-9]*\]' "$tmp/n1.err" | sort -u | tr '\n' ' ')"
    fi
}
two_nodes 2 --model "$oracle/qwen3" --reference "$oracle/qwen3/reference.safetensors" --page-size 16
two_nodes 4 --model "$oracle/qwen3_moe" --reference "$oracle/qwen3_moe/reference.safetensors" --ep 4

# generate: the same ids and text as one rank; the other rank prints nothing
m="$KILN_MODELS/stories260K"
one=$("$KILN" generate --model "$m" --prompt "Once upon a time" --max-tokens 24 --threads 1 2>/dev/null)
two=$("$KILN" generate --model "$m" --prompt "Once upon a time" --max-tokens 24 --tp 2 2>"$tmp/g.err")
runs=$((runs + 1))
if [ -n "$one" ] && [ "$one" = "$two" ] && ! leftovers "$tmp/g.err"; then echo "ok: generate --tp 2 = one rank"; else
    echo "FAIL: generate --tp 2"; echo " one rank: $one"; echo " --tp 2:   $two"; tail "$tmp/g.err"; fail=$((fail + 1)); fi

# bench offline: one report, every request done
out=$("$KILN" bench offline --model "$m" --tp 2 --disable-tqdm --num-prompts 6 --random-input-len 24 \
    --random-output-len 6 --random-range-ratio 1 2>"$tmp/b.err"); rc=$?
runs=$((runs + 1))
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'Serving Benchmark Result')" = 1 ] &&
    printf '%s\n' "$out" | grep -Eq '^Successful requests: +6 *$' && ! leftovers "$tmp/b.err"; then
    echo "ok: bench offline --tp 2"
else
    echo "FAIL: bench offline --tp 2 (status $rc)"; printf '%s\n' "$out"; tail "$tmp/b.err"; fail=$((fail + 1))
fi

# bad layouts: exit status 2 and the reason, before anything starts
refuse() { # expected message, then arguments
    local want=$1; shift
    local err rc
    err=$("$KILN" verify --model "$oracle/llama" --reference "$oracle/llama/reference.safetensors" "$@" 2>&1 >/dev/null)
    rc=$?
    err=$(printf '%s\n' "$err" | grep '^kiln verify')
    runs=$((runs + 1))
    if [ $rc -eq 2 ] && printf '%s' "$err" | grep -q -- "$want"; then echo "ok: refused $*: $err"; else
        echo "FAIL: $* (status $rc): $err"; fail=$((fail + 1)); fi
}
refuse "expert parallel reuses the tensor-parallel group" --tp 2 --ep 3
refuse "must be below --nnodes 2" --tp 2 --nnodes 2 --node-rank 2 --dist-init-addr 127.0.0.1:1
refuse "needs --dist-init-addr" --tp 2 --nnodes 2
refuse "not divisible by --nnodes 2" --tp 3 --nnodes 2 --dist-init-addr 127.0.0.1:1
refuse "dist-init-addr" --tp 2 --dist-init-addr nocolon

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
