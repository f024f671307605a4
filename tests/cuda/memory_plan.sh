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
#  3. --mem-fraction-static 1.5: rejected as a bad value (exit 2).
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
exit $fail
