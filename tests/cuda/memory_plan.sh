#!/usr/bin/env bash
# The GPU memory plan (kiln serve on CUDA): weights, activations, then the
# KV pool from what is left under --mem-fraction-static.
#  1. default: the log states the plan (device, weights, activations, KV
#     tokens) and the server reaches "listening"; the KV cache it reports
#     equals the plan's token count, and is larger than the CPU's 2 GiB
#     default would give (the GPU has tens of GiB free);
#  2. Llama-3.1-8B's shapes (16 GB of weights) under --mem-fraction-static
#     0.1, which no GPU of up to 150 GB fits (a smaller model fit an H200's
#     2%, served, and the check waited on it): start-up fails with exit
#     status 1 and a message giving the numbers;
#  3. --mem-fraction-static 1.5: rejected as a bad value (exit 2);
#  4. --kv-cache-dtype fp8_e4m3: the same KV bytes hold twice the tokens
#     (one byte an element against bf16's two), both plans under
#     --mem-fraction-static 0.2 and 64 requests (so that neither is capped
#     by requests x context on an 80 or 141 GB card).
set -u
M="$KILN_SRC/models/configs/qwen3-0.6b.json"
fail=0
log=$(mktemp); trap 'rm -f "$log"' EXIT
"$KILN" serve --model "$M" --load-format dummy --device cuda --port 0 --skip-sampler-warmup \
  --max-running-requests 8 >"$log" 2>&1 &
pid=$!
for i in $(seq 1 600); do grep -q "listening on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -TERM $pid 2>/dev/null; wait $pid
plan=$(grep -o 'KV cache [0-9.]* GiB ([0-9]* tokens' "$log" | grep -o '([0-9]*' | tr -d '(')
served=$(grep -o 'kiln serve: KV cache [0-9]* tokens' "$log" | grep -o '[0-9][0-9]*')
if ! grep -q "listening on" "$log" || [ -z "$plan" ] || [ "$plan" != "$served" ]; then
  echo "FAIL: default plan (plan '$plan' tokens, served '$served')"; cat "$log"; fail=1
else
  # Qwen3-0.6B: 28 layers x 8 kv heads x 128 x 2 (K, V) x 2 bytes = 114688 bytes a token;
  # 2 GiB would hold 18724 tokens; 8 requests at 40960 context = 327680 at most
  if [ "$plan" -le 18724 ]; then echo "FAIL: plan of $plan tokens is not above the CPU default"; fail=1; fi
  echo "ok: default plan $plan tokens: $(grep 'memory plan' "$log" | sed 's/.*memory plan/memory plan/')"
fi
out=$(timeout 120 "$KILN" serve --model "$KILN_SRC/models/configs/llama-3.1-8b.json" --load-format dummy --device cuda \
  --port 0 --skip-sampler-warmup --mem-fraction-static 0.1 2>&1); rc=$?
if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -q "not enough device memory for the KV cache: the device has [0-9.]* GiB, weights take [0-9.]* GiB"; then
  echo "FAIL: --mem-fraction-static 0.1 gave rc=$rc: $out"; fail=1
else
  echo "ok: too small: $(printf '%s' "$out" | tail -1)"
fi
out=$("$KILN" serve --model "$M" --load-format dummy --device cuda --mem-fraction-static 1.5 2>&1); rc=$?
if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q "mem-fraction-static"; then
  echo "FAIL: --mem-fraction-static 1.5 gave rc=$rc: $out"; fail=1
else
  echo "ok: bad value rejected"
fi
plan_tokens() { # the plan's KV tokens of a served start-up with extra options $@
  local lg; lg=$(mktemp)
  "$KILN" serve --model "$M" --load-format dummy --device cuda --port 0 --skip-sampler-warmup \
    --max-running-requests 64 --mem-fraction-static 0.2 "$@" >"$lg" 2>&1 &
  local p=$!
  for i in $(seq 1 600); do grep -q "listening on" "$lg" && break; kill -0 $p 2>/dev/null || break; sleep 0.1; done
  kill -TERM $p 2>/dev/null; wait $p
  grep -o 'KV cache [0-9.]* GiB ([0-9]* tokens' "$lg" | grep -o '([0-9]*' | tr -d '('
  rm -f "$lg"
}
t16=$(plan_tokens)
t8=$(plan_tokens --kv-cache-dtype fp8_e4m3)
if [ -z "$t16" ] || [ -z "$t8" ] || ! awk -v a="$t8" -v b="$t16" 'BEGIN { r = a / b; exit !(r > 1.95 && r < 2.05) }'; then
  echo "FAIL: FP8 KV plan '$t8' tokens against bf16's '$t16' (expected twice)"; fail=1
else
  echo "ok: FP8 KV cache plan $t8 tokens, bf16 $t16"
fi
exit $fail
