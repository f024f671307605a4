#!/usr/bin/env bash
# kiln profile-report: three traces in the three formats with
# hand-computed answers (overlaps credited once), the CSV and HTML files,
# gputrc2graph-style rules, and clear errors for bad input.
set -u
: "${KILN:?}"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

# nsys cuda_gpu_trace: A [0,100) attention, B [50,150) gemm (50 ns under A),
# C [200,250) memcpy. Busy 200 ns: attention 100, gemm 50, memory 50.
cat >"$d/nsys.csv" <<'T'
Generating SQLite file run.sqlite from run.nsys-rep
Start (ns),Duration (ns),CorrId,Strm,Name
0,100,1,7,"void flash_fwd_kernel<Traits<128, 64>>(Params)"
50,100,2,8,sm90_xmma_gemm_bf16bf16_bf16f32
200,50,3,7,[CUDA memcpy Host-to-Device]
T
# CUPTI records: two gemv calls [1000,1400) and [1100,1200) (inside the
# first), a norm [1400,1500): gemm 400, norm 100.
cat >"$d/cupti.csv" <<'T'
K,1000,1400,1,1,132x1x1,128,0,64,_Z11gemv_kernelPf
K,1100,1200,2,1,132x1x1,128,0,64,_Z11gemv_kernelPf
K,1400,1500,3,1,64x1x1,256,0,32,_Z19rmsnorm_warp_kernelPfPKfS1_lf
T
# Chrome trace (µs): a kernel of 2 µs, a CPU op (ignored), a copy of 1 µs
cat >"$d/torch.json" <<'T'
{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "my_custom_kernel", "ts": 10, "dur": 2},
 {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
 {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 11, "dur": 1}]}
T
out=$("$KILN" profile-report --title 'Run <1> & co' --out "$d/r" "$d/nsys.csv,nsys,0.000001" "$d/cupti.csv,cupti" \
      "$d/torch.json,torch" 2>&1)
rc=$?
check "profile-report ran: $out" '[ $rc -eq 0 ]'
check "csv and html written" '[ -s "$d/r.csv" ] && [ -s "$d/r.html" ]'
check "csv header" '[ "$(head -1 "$d/r.csv")" = "trace,category,kernel,count,total_ms,gpu_ms" ]'
# gpu ns per (trace, category) from the CSV
sum() { awk -F'","|",|,' -v t="$1" -v c="$2" 'NR>1 { gsub(/^"/, "", $1); if ($1 == t && $2 == c) s += $NF }
        END { printf "%.0f", s * 1e6 }' "$d/r.csv"; }
check "nsys attention 100 ns (got $(sum nsys attention))" '[ "$(sum nsys attention)" = 100 ]'
check "nsys gemm 50 ns: its overlap is not counted twice (got $(sum nsys gemm))" '[ "$(sum nsys gemm)" = 50 ]'
check "nsys memory 50 ns (got $(sum nsys memory))" '[ "$(sum nsys memory)" = 50 ]'
check "nsys idle 1000 - 200 ns (got $(sum nsys idle))" '[ "$(sum nsys idle)" = 800 ]'
check "cupti gemm 400 ns over 2 calls (got $(sum cupti gemm))" '[ "$(sum cupti gemm)" = 400 ]'
check "cupti gemv count 2" 'grep -q "\"cupti\",\"gemm\",\"_Z11gemv_kernelPf\",2,0.000500,0.000400" "$d/r.csv"'
check "cupti norm 100 ns (got $(sum cupti norm))" '[ "$(sum cupti norm)" = 100 ]'
check "torch: the kernel 2000 ns, the copy under it 0 ns, the CPU op not at all" \
  '[ "$(sum torch misc)" = 2000 ] && [ "$(sum torch memory)" = 0 ] && ! grep -q aten "$d/r.csv"'
check "names with commas and quotes survive the CSV" 'grep -q "\"void flash_fwd_kernel<Traits<128, 64>>(Params)\"" "$d/r.csv"'
check "stdout summary" 'echo "$out" | grep -q "nsys: GPU busy 0.000 ms (3 activities"'
check "html: title escaped, one bar per trace" \
  'grep -q "<title>Run &lt;1&gt; &amp; co</title>" "$d/r.html" && [ "$(grep -c "<text x=\"154\"" "$d/r.html")" = 3 ]'
check "html: a segment per category with its time" \
  'grep -q "<title>gemm: 0.000050 ms</title>" "$d/r.html" && grep -q "<title>idle: 0.000800 ms</title>" "$d/r.html"'

# gputrc2graph-style rules: engine and model chosen, the file's order decides
cat >"$d/rules.json" <<'T'
{"sglang": {"llama": {"gemv|xmma": "matmul", "flash|gemm": "attention-or-gemm", "CUDA mem": "non-gpu-H_D_memops"}},
 "kiln": {"default": {".*": "everything"}}}
T
"$KILN" profile-report --rules "$d/rules.json" --engine sglang --model llama --out "$d/s" "$d/nsys.csv,n" >/dev/null 2>&1
check "rules: xmma → matmul, flash → attention-or-gemm, memcpy → non-gpu-H_D_memops" \
  'grep -q "\"n\",\"matmul\",\"sm90_xmma" "$d/s.csv" && grep -q "\"n\",\"attention-or-gemm\",\"void flash" "$d/s.csv" &&
   grep -q "\"n\",\"non-gpu-H_D_memops\"" "$d/s.csv"'
"$KILN" profile-report --rules "$d/rules.json" --out "$d/k" "$d/cupti.csv" >/dev/null 2>&1
check "rules: a catch-all of the file" '[ "$(grep -c ",\"everything\"," "$d/k.csv")" = 2 ]'

# errors name what is wrong
err() { "$KILN" profile-report --out "$d/e" "$@" 2>&1 >/dev/null; }
check "missing file" 'err "$d/none.csv" | grep -q "none.csv"'
printf 'Start (ns),Duration (ns),Name\n1,x,k\n' >"$d/bad.csv"
check "bad number names the file and record" 'err "$d/bad.csv" | grep -q "bad.csv: record 2"'
check "bad elapsed" 'err "$d/nsys.csv,n,-3" | grep -q "ELAPSED_S"'
check "unknown engine in rules" 'err --rules "$d/rules.json" --engine vllm "$d/nsys.csv" | grep -q "rules.json: no rules for engine .vllm."'
printf '{"sglang": {"llama": {"(": "x"}}}' >"$d/badre.json"
check "bad regex names the rule" 'err --rules "$d/badre.json" --engine sglang --model llama "$d/nsys.csv" | grep -q "rule .(."'
check "no trace: exit 2" '"$KILN" profile-report >/dev/null 2>&1; [ $? -eq 2 ]'
check "unknown option: exit 2" '"$KILN" profile-report --frobnicate x >/dev/null 2>&1; [ $? -eq 2 ]'
[ $fail -eq 0 ] && echo "profile-report: ok"
exit $fail
