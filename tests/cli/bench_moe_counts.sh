#!/usr/bin/env bash
# The MoE report of bench_forward and `kiln bench offline --moe-counts` on
# the oracle MoE models (CPU), and --dummy-routing. Hand-computed truths: a
# step of one token touches exactly top_k experts per layer, whatever the
# routing; a step of n tokens between top_k and min(E, n·top_k); an expert of
# hidden 64 and moe_intermediate_size 32 in bf16 holds 3·64·32·2 = 12288
# bytes (DeepSeek-V2's two shared experts twice that); dense layers are not
# listed. Uniform routing is deterministic: two runs print the same counts.
# (test_moe_count checks the counts themselves against the route's ids.)
set -u
src="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
kiln="${KILN:-$src/build/kiln}"
bf="$(dirname "$kiln")/bench_forward"
fx="${KILN_FIXTURES:-$src/tests/fixtures}/oracle/tiny-models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0; runs=0

ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; [ -f "$2" ] && sed 's/^/  | /' "$2"; fail=$((fail + 1)); }

# expect FILE NAME PATTERN...: every pattern (grep -E) matches a line
expect() {
  local f=$1 name=$2; shift 2
  runs=$((runs + 1))
  for p in "$@"; do
    if ! grep -qE -- "$p" "$f"; then bad "$name: no line matches '$p'" "$f"; return; fi
  done
  ok "$name"
}

# A MoE layer line's decode / other figures within [lo, hi].
range() {
  local f=$1 name=$2 what=$3 lo=$4 hi=$5
  runs=$((runs + 1))
  if awk -v w="$what" -v lo="$lo" -v hi="$hi" '
      /^MoE layer/ { n++; s = $0; sub(".*; " w ": ", "", s); split(s, a, /[ (,)]+/)
                     if (a[1] < lo || a[1] > hi || a[3] < lo || a[5] > hi || a[3] > a[1] || a[1] > a[5]) bad = 1 }
      END { exit (n == 0 || bad) }' "$f"; then ok "$name"; else bad "$name" "$f"; fi
}

# batch 1, model routing: every decode step touches top_k = 2 experts per layer
"$bf" --model "$fx/qwen3_moe" --prompt-len 16 --decode 6 --batch 1 --threads 1 --repeat 1 > "$tmp/q1.txt" 2>&1
expect "$tmp/q1.txt" qwen3_moe_batch1 '^MoE routing: the model.s router' \
  '^MoE layer 0: experts touched of 8 \(top 2\), 0\.012 MB each; decode: 2\.0 \(min 2, max 2\) over 6 steps of 1\.0 rows, 0\.025 MB/step; prefill/mixed: [0-9.]+ \(min [0-9]+, max [0-9]+\) over 1 steps of 16\.0 rows' \
  '^MoE layer 1: .*decode: 2\.0 \(min 2, max 2\) over 6 steps' '^MoE layer 2: .*decode: 2\.0 \(min 2, max 2\) over 6 steps' \
  '^expert bytes read per decode step: 0\.0001 GB of routed experts \(mean of 6 steps; all routed experts: 0\.0003 GB\)' \
  '^decode bound batch 1 at context 16: [0-9.]+ GB/step .* experts touched 0\.0001 '
range "$tmp/q1.txt" qwen3_moe_prefill_range prefill/mixed 2 8

# batch 4, uniform routing; DeepSeek-V2: layer 0 dense, two shared experts
for run in 1 2; do
  "$bf" --model "$fx/deepseek_v2" --prompt-len 12 --decode 5 --batch 4 --threads 1 --repeat 1 \
    --dummy-routing uniform > "$tmp/d$run.txt" 2>&1
done
expect "$tmp/d1.txt" deepseek_v2_uniform '^MoE routing: uniform' 'WARN.*--dummy-routing uniform: the 2 MoE layers' \
  '^MoE layer 1: experts touched of 8 \(top 2\), 0\.012 MB each; decode: .* over 5 steps of 4\.0 rows.*over 4 steps of 12\.0 rows.*; shared 0\.025 MB/step$' \
  '^MoE layer 2: ' '^decode bound batch 4 at context 12: '
runs=$((runs + 1))
if grep -q '^MoE layer 0' "$tmp/d1.txt"; then bad "deepseek_v2: the dense layer 0 is listed" "$tmp/d1.txt"; else ok deepseek_v2_dense_layer; fi
range "$tmp/d1.txt" deepseek_v2_decode_range decode 2 8
runs=$((runs + 1))
if grep -q '^MoE layer' "$tmp/d1.txt" &&
   diff <(grep -E '^(MoE|expert)' "$tmp/d1.txt") <(grep -E '^(MoE|expert)' "$tmp/d2.txt") > /dev/null; then
  ok uniform_deterministic
else
  bad "uniform routing: two runs count differently" "$tmp/d2.txt"
fi

# kiln bench offline --moe-counts, one request at a time: decode steps of one
# row. The counts start after the warm-up request, whose prompt is the first
# one's: in the measured run that prompt finds 9 of its 10 tokens cached, so
# its prefill is a step of one token for one sequence, counted with the
# decode steps: 1 + 3 x 4 of them, and 2 prefill steps.
"$kiln" bench offline --model "$fx/qwen3_moe" --threads 1 --disable-tqdm --num-prompts 3 --random-input-len 10 \
  --random-output-len 5 --random-range-ratio 1 --max-concurrency 1 --moe-counts --dummy-routing uniform \
  > "$tmp/off.txt" 2>&1
expect "$tmp/off.txt" bench_offline_counts '^=+ MoE experts touched \(--moe-counts\) =+$' \
  '^MoE layer 0: experts touched of 8 \(top 2\), 0\.012 MB each; decode: 2\.0 \(min 2, max 2\) over 13 steps of 1\.0 rows.*over 2 steps of 10\.0 rows' \
  '^MoE layer 2: .*decode: 2\.0 \(min 2, max 2\) over 13 steps' '^expert bytes read per decode step: '
"$kiln" bench offline --threads 1 --disable-tqdm --num-prompts 1 --random-input-len 4 --random-output-len 2 \
  --moe-counts > "$tmp/dense.txt" 2>&1
expect "$tmp/dense.txt" bench_offline_dense 'the model has no mixture-of-experts layers'

# refusals
for cmd in "$bf --model $fx/qwen3_moe --dummy-routing random" \
           "$kiln bench offline --model $fx/qwen3_moe --dummy-routing random" \
           "$kiln verify $fx/qwen3_moe --reference $fx/qwen3_moe/reference.safetensors --dummy-routing uniform"; do
  runs=$((runs + 1))
  $cmd > "$tmp/bad.txt" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -q -- "--dummy-routing" "$tmp/bad.txt"; then ok "refused: ${cmd##*/}"; else bad "not refused (rc $rc): $cmd" "$tmp/bad.txt"; fi
done

echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
