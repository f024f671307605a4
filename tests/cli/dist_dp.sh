#!/usr/bin/env bash
# DP attention on the CPU (docs/distributed.md, "DP attention"): kiln verify
# --tp 2 --dp 2 --enable-dp-attention on the MLA oracle models (page sizes 1
# and 16, chunked prefill of 3: verify puts sequence i on group i % 2, so its
# prefill and decode modes leave one group idle every step and its mixed mode
# spreads a batch over both), with --ep 2 and with two ranks a group (--tp 4
# --dp 2); every row within 1e-3 of the reference as in verify_oracle.sh and
# the largest error within 1e-4 of one rank's. bench offline through the
# scheduler (requests spread over the groups by load) generates the same
# texts as one rank. Each group keeps its own requests' KV only: `kiln serve
# --tp 2 --dp 2` with --max-total-tokens 256 caches 256 tokens in each group
# (512 in all), runs two requests of 160 tokens at once where one pool of 256
# cannot, and answers 8 concurrent greedy requests as one rank does. Bad
# combinations are refused with a reason.
SERVE_NODE=0
source "$KILN_SRC/tests/server/serve.sh"
source "$KILN_SRC/tests/cli/lib/dist.sh"
: "${KILN_FIXTURES:?}"
tmp="$SERVE_TMP/dp"
mkdir -p "$tmp"
fail=0; runs=0
oracle="$KILN_FIXTURES/oracle/tiny-models"

err_of() { # verify's arguments; prints the last line's max_abs_err, or nothing
    "$KILN" verify "$@" 2>"$tmp/v.err" | tail -1 | sed -n 's/^max_abs_err=\([0-9.e+-]*\) rows=[1-9][0-9]*$/\1/p'
}

check() { # model, page size, then the ranks' options
    local arch=$1 ps=$2; shift 2
    local name="$* --page-size $ps"
    local args=(--model "$oracle/$arch" --reference "$oracle/$arch/reference.safetensors" --chunk 3 --page-size "$ps")
    local one dp
    one=$(err_of "${args[@]}" --threads 1)
    dp=$(err_of "${args[@]}" "$@" --enable-dp-attention)
    runs=$((runs + 1))
    if [ -n "$one" ] && [ -n "$dp" ] &&
        awk -v a="$one" -v b="$dp" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b <= 1e-3 && d <= 1e-4) }'; then
        echo "ok: $arch $name: max_abs_err $dp (one rank $one)"
    else
        echo "FAIL: $arch $name: max_abs_err '$dp', one rank '$one'"; tail -20 "$tmp/v.err"; fail=$((fail + 1))
    fi
}

for arch in deepseek_v2 deepseek_v3; do
    for ps in 1 16; do
        check $arch $ps --tp 2 --dp 2
    done
    check $arch 16 --tp 2 --ep 2 --dp 2
done
check deepseek_v2 1 --tp 4 --dp 2 # two ranks a group: the heads split within it
check deepseek_v3 16 --tp 4 --ep 4 --dp-size 4

# the scheduler: every request's text as on one rank
texts() { # bench offline's arguments; prints the generated texts' checksum
    rm -f "$tmp/o.json"
    "$KILN" bench offline --model "$oracle/deepseek_v3" --disable-tqdm --num-prompts 8 --random-input-len 24 \
        --random-output-len 6 --random-range-ratio 1 --output-file "$tmp/o.json" --output-details "$@" \
        >/dev/null 2>"$tmp/b.err" || return
    node -e 'const d=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8").split("\n")[0]);
             if (d.completed===8) console.log(JSON.stringify(d.generated_texts))' "$tmp/o.json"
}
one=$(texts --threads 1)
for args in "--tp 2 --dp 2" "--tp 2 --ep 2 --data-parallel-size 2 --page-size 16"; do
    # shellcheck disable=SC2086
    dp=$(texts $args --enable-dp-attention)
    runs=$((runs + 1))
    if [ -n "$one" ] && [ "$one" = "$dp" ]; then echo "ok: bench offline $args: the texts of one rank"; else
        echo "FAIL: bench offline $args"; echo " one rank: $one"; echo " dp: $dp"; tail "$tmp/b.err"
        fail=$((fail + 1)); fi
done

# serve: a KV pool per group. 256 tokens a pool; a request is 100 prompt
# tokens and 60 generated ones, so one pool holds one at a time (admission
# keeps room for half of a running request's remaining tokens), and each
# group's pool one of its own.
m="$oracle/deepseek_v3"
serve_start S1 --model "$m" --skip-sampler-warmup --threads 1 --max-total-tokens 256 --decode-log-interval 1
serve_start DP --model "$m" --skip-sampler-warmup --tp 2 --dp 2 --enable-dp-attention --max-total-tokens 256 \
    --decode-log-interval 1
runs=$((runs + 1))
if grep -q 'KV cache 512 tokens (512 pages of 1), 256 in each of 2 DP attention groups' "$SERVE_TMP/DP.out"; then
    echo "ok: serve --dp 2: $(grep 'KV cache' "$SERVE_TMP/DP.out")"
else echo "FAIL: serve --dp 2's KV cache:"; cat "$SERVE_TMP/DP.out"; fail=$((fail + 1)); fi
post() { # SERVER N I: request I (prompt ids I+5 .. I+104) to SERVER, the answer in $tmp/SERVER.I
    local url_var="URL_$1" ids
    ids=$(seq -s, $(($3 + 5)) $(($3 + 104)))
    curl -sS -o "$tmp/$1.$3" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$ids], \"max_tokens\": 60, \"temperature\": 0, \"ignore_eos\": true}" \
        "${!url_var}/v1/completions" >"$tmp/$1.$3.code"
}
text() { node -e 'const c=JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0];
                  console.log(c.finish_reason + ":" + JSON.stringify(c.text))' "$1" 2>/dev/null; }
for n in 2 8; do
    for s in S1 DP; do
        for i in $(seq 1 $n); do post $s $n "$i" & done
        wait
    done
    for i in $(seq 1 $n); do
        runs=$((runs + 1))
        a=$(text "$tmp/S1.$i"); b=$(text "$tmp/DP.$i")
        if [ "$(cat "$tmp/DP.$i.code")" = 200 ] && [ -n "$b" ] && [ "$a" = "$b" ]; then :; else
            echo "FAIL: serve --dp 2, $n at once, request $i: $(cat "$tmp/DP.$i.code") $b, one rank: $a"
            fail=$((fail + 1)); fi
    done
    echo "ok: serve --dp 2: $n concurrent requests answered as one rank answers them"
done
runs=$((runs + 1))
if grep -q 'Decode batch. #running-req: 2,' "$LOG_DP" && ! grep -q 'Decode batch. #running-req: [2-9]' "$LOG_S1"; then
    echo "ok: two requests decode at once in two groups' pools, never in one pool of the same size"
else
    echo "FAIL: decode rows at once: --dp 2 $(grep -o 'running-req: [0-9]*' "$LOG_DP" | sort -u | tr '\n' ' ')," \
        "one pool $(grep -o 'running-req: [0-9]*' "$LOG_S1" | sort -u | tr '\n' ' ')"
    fail=$((fail + 1))
fi
pids=$(job_pids "$LOG_DP")
for s in S1 DP; do serve_stop $s || fail=$((fail + 1)); done
# shellcheck disable=SC2086
none_left $pids || { echo "FAIL: a rank of serve --dp 2 still runs after the job ended"; fail=$((fail + 1)); }

# refusals: exit status 2 and the reason, before anything starts
refuse() { # expected message, model, then arguments
    local want=$1 arch=$2; shift 2
    local err rc
    err=$("$KILN" verify --model "$oracle/$arch" --reference "$oracle/$arch/reference.safetensors" "$@" 2>&1 >/dev/null)
    rc=$?
    err=$(printf '%s\n' "$err" | grep '^kiln verify')
    runs=$((runs + 1))
    if [ $rc -eq 2 ] && printf '%s' "$err" | grep -q -- "$want"; then echo "ok: refused $arch $*: $err"; else
        echo "FAIL: $arch $* (status $rc): $err"; fail=$((fail + 1)); fi
}
refuse "needs --enable-dp-attention" deepseek_v3 --tp 2 --dp 2
refuse "needs --dp N" deepseek_v3 --tp 2 --enable-dp-attention
refuse "does not divide --tp 4" deepseek_v3 --tp 4 --dp 3 --enable-dp-attention
refuse "does not divide --tp 1" deepseek_v3 --dp 2 --enable-dp-attention
refuse "model_type qwen3_moe has no multi-head latent attention" qwen3_moe --tp 2 --dp 2 --enable-dp-attention
refuse "model_type llama has no multi-head latent attention" llama --tp 2 --dp 2 --enable-dp-attention

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
