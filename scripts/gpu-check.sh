#!/usr/bin/env bash
# gpu-check.sh — build kiln with CUDA on a GPU machine and check it there:
# the GPU tests (ctest -L gpu), `kiln verify --device cuda` on every oracle
# model with page sizes 1 and 16, and bench_forward on two real model
# shapes with dummy weights. Prints a short table at the end.
#
# The GPU machine has nvcc, cmake and ninja but not kiln's Debian libraries.
# When pkg-config cannot find them there, the script unpacks .deb files
# carried in .gpu-debs/ (fetch them here with `scripts/gpu-check.sh --fetch-debs`)
# into a private prefix and points pkg-config and the loader at it; nothing
# is installed into the system.
#
#   scripts/gpu-check.sh [--fetch-debs] [--quick] [--decode] [--bench] [--sanitize]
#   --sanitize: every CUDA unit test (tests/cuda/test_*.c but test_cuda_oom) under
#   compute-sanitizer, once with memcheck (out-of-bounds and misaligned
#   accesses, leaks of device memory) and once with racecheck (shared-memory
#   hazards), each run limited to KILN_SANITIZE_TIMEOUT seconds (default
#   900; the tools slow kernels 10-100x); prints a table of errors per test
#   and tool and exits 1 when any run found errors, failed or timed out.
#   KILN_SANITIZE_TESTS (names, space-separated) runs a subset,
#   KILN_SANITIZE_TOOLS (default "memcheck racecheck") other tools.
#   --bench: ctest -L gpu, then the benchmark matrix docs/perf.md reports
#   (batch-1 decode at contexts 128 and 4096, prefill 512 and 8192,
#   decode with 64 and 256 concurrent sequences, for Qwen3-0.6B and
#   Llama-3.1-8B with dummy weights), plus the device's copy bandwidth;
#   KILN_BENCH_ONLY=1 skips the tests and the warm-up check
#   env: KILN_CUDA_TOL (verify tolerance, default in tests/cuda/verify_cuda.sh),
#        KILN_GPU_BUILD (build folder, default build-gpu), OUT (logs go there)
set -uo pipefail
cd "$(dirname "$0")/.."
DEBS=.gpu-debs
PKGS="libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libpcre2-16-0 libpcre2-32-0
  libpcre2-posix3 libutf8proc2 libutf8proc-dev libevent-2.1-7 libevent-core-2.1-7
  libevent-extra-2.1-7 libevent-pthreads-2.1-7 libevent-openssl-2.1-7 libevent-dev libopenblas0
  libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5 libcmocka0
  libcmocka-dev pkgconf pkgconf-bin libpkgconf3"
if [ "${1:-}" = "--fetch-debs" ]; then
  mkdir -p "$DEBS" && (cd "$DEBS" && apt-get download $PKGS)
  exit $?
fi
quick=0; decode=0; benchmx=0; sanitize=0
[ "${1:-}" = "--sanitize" ] && sanitize=1
[ "${1:-}" = "--bench" ] && benchmx=1
[ "${1:-}" = "--quick" ] && quick=1
[ "${1:-}" = "--decode" ] && decode=1 # decode speed work: graph/op tests, GEMV and decode benches, then ctest
envonly=0; [ "${1:-}" = "--env" ] && envonly=1 # print the exports that let cmake and the programs find the libraries
B=${KILN_GPU_BUILD:-build-gpu}
LOG=${OUT:-/tmp}/gpu-check.log
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }

# --env prints only the export lines (callers eval it); the rest goes to stderr
if [ "$envonly" = 1 ]; then exec 3>&1 1>&2; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
nvcc --version | tail -1

need="jansson libpcre2-8 libutf8proc libevent libevent_pthreads openblas cmocka"
pc_args=()
if [ -n "${KILN_GPU_FORCE_DEBS:-}" ] || ! command -v pkg-config >/dev/null || ! pkg-config --exists $need 2>/dev/null; then
  [ -d "$DEBS" ] || { echo "missing libraries and no $DEBS/ to unpack: run $0 --fetch-debs on a Debian machine"; exit 1; }
  P=/tmp/kiln-deps
  rm -rf "$P" && mkdir -p "$P"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$P"; done
  # .pc files say prefix=/usr: move them into the private prefix
  pcdirs=$(find "$P" -name '*.pc' -printf '%h\n' | sort -u)
  for d in $pcdirs; do sed -i "s|=/usr|=$P/usr|g; s|-I/usr/|-I$P/usr/|g; s|-L/usr/|-L$P/usr/|g" "$d"/*.pc; done
  export PKG_CONFIG_LIBDIR=$(echo $pcdirs | tr ' ' ':')
  libdirs=$(find "$P" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:-}
  # update-alternatives did not run: make the generic openblas names exist
  ob=$(find "$P" -path '*openblas-pthread*' -name 'libopenblas.so.0' | head -1)
  [ -n "$ob" ] && ln -sf "$ob" "$P/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
  PKGCONF="$P/usr/bin/pkgconf"
  [ -x "$PKGCONF" ] || PKGCONF=$(command -v pkg-config)
  pc_args=(-DPKG_CONFIG_EXECUTABLE="$PKGCONF")
  say "deps: unpacked $(ls "$DEBS"/*.deb | wc -l) .deb files into $P"
fi

# NCCL (the communicator between GPUs): in the CUDA toolkit, or from the
# nvidia-nccl wheel of the machine's Python (NCCL_HOME for CMake)
if [ -z "${NCCL_HOME:-}" ] && [ ! -e "$(dirname "$(command -v nvcc)")/../include/nccl.h" ]; then
  nh=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nh" ] && [ -e "$nh/include/nccl.h" ]; then
    export NCCL_HOME=$nh LD_LIBRARY_PATH=$nh/lib:${LD_LIBRARY_PATH:-}
    say "NCCL: $nh"
  fi
fi

if [ "$envonly" = 1 ]; then
  exec 1>&3
  [ -n "${NCCL_HOME:-}" ] && echo "export NCCL_HOME='$NCCL_HOME' LD_LIBRARY_PATH='$LD_LIBRARY_PATH'"
  [ -n "${PKG_CONFIG_LIBDIR:-}" ] && echo "export PKG_CONFIG_LIBDIR='$PKG_CONFIG_LIBDIR' LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}'"
  echo "export PKGCONF='${PKGCONF:-$(command -v pkg-config)}'"
  exit 0
fi
say "== build ($B)"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${pc_args[@]}" >>"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
ninja -C "$B" >>"$LOG" 2>&1 || { grep -B2 -A12 -m3 'error' "$LOG" | head -60; exit 1; }
say "build ok"

if [ "$benchmx" = 1 ]; then
  O=${OUT:-/tmp}
  ctest_rc=0
  if [ -z "${KILN_BENCH_ONLY:-}" ]; then # KILN_BENCH_ONLY=1: the benchmarks alone
    say "== ctest -L gpu"
    KILN_TOKENIZERS=/nonexistent timeout 420 ctest --test-dir "$B" -L '^gpu$' --output-on-failure >"$O/ctest-gpu.log" 2>&1
    ctest_rc=$?
    grep -E 'tests passed|tests failed|Test +#' "$O/ctest-gpu.log" | tail -12 | tee -a "$LOG"
  fi
  BF="$B/bench_forward --load-format dummy --device cuda"
  for cfg in qwen3-0.6b llama-3.1-8b; do
    for args in "--prompt-len 128,4096 --decode 64 --repeat 2" \
                "--prompt-len 512,8192 --decode 0 --repeat 3" \
                "--prompt-len 128 --decode 32 --batch 64 --repeat 2" \
                "--prompt-len 128 --decode 32 --batch 256 --repeat 2"; do
      out=$(timeout 150 $BF --model models/configs/$cfg.json $args 2>&1)
      echo "$out" >>"$LOG"
      say "-- $cfg $args"
      echo "$out" | grep -E '^(device copy|prefill|decode|bench_forward)' | tee -a "$LOG"
    done
    # llama-batched-bench's S column for -npp 128 -ntg 128 -npl 64: every
    # prompt and generated token over the whole time (prefill of the 64
    # prompts, then 128 decode steps), beside the decode-only rate
    out=$(timeout 150 $BF --model models/configs/$cfg.json --prompt-len 128 --decode 128 --batch 64 --repeat 2 --prefill-batch 2>&1)
    echo "$out" >>"$LOG"
    say "-- $cfg --prompt-len 128 --decode 128 --batch 64 --prefill-batch (batched-bench S)"
    pp=$(echo "$out" | grep '^prefill' | tail -1 | sed -n 's/.*(\([0-9.]*\) ms).*/\1/p')
    st=$(echo "$out" | grep '^decode' | tail -1 | sed -n 's/.*(\([0-9.]*\) ms\/step.*/\1/p')
    echo "$out" | grep '^decode' | tail -1 | tee -a "$LOG"
    [ -n "$pp" ] && [ -n "$st" ] && awk -v pp="$pp" -v st="$st" 'BEGIN {
      printf "S = 64 x (128 + 128) tokens / (%.1f ms prefill + 128 x %.3f ms) = %.0f tok/s\n",
             pp, st, 64 * 256 / ((pp + 128 * st) / 1000) }' | tee -a "$LOG"
  done
  say "-- llama-3.1-8b --prompt-len 128 --decode 32 --batch 64 with KILN_CUDA_WGMMA=0 (cuBLASLt for every product)"
  KILN_CUDA_WGMMA=0 timeout 150 $BF --model models/configs/llama-3.1-8b.json --prompt-len 128 --decode 32 --batch 64 --repeat 2 2>&1 |
    grep -E '^decode' | tee -a "$LOG"
  [ -n "${KILN_BENCH_ONLY:-}" ] && exit 0
  for w in "" "--no-warmup"; do
    say "-- bench_warmup qwen3-0.6b $w (first decode step per bucket vs steady state)"
    timeout 120 "$B/bench_warmup" --model models/configs/qwen3-0.6b.json --load-format dummy $w 2>&1 | tee -a "$LOG"
  done
  say "ctest -L gpu: $([ $ctest_rc = 0 ] && echo PASS || echo FAIL rc=$ctest_rc)"
  exit $ctest_rc
fi

if [ "$sanitize" = 1 ]; then
  O=${OUT:-/tmp}
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$CS" ] || { say "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 1; }
  say "== compute-sanitizer ($("$CS" --version | grep -o 'Version.*' | head -1))"
  # test_cuda_oom fills the device on purpose: the tools report each failed
  # allocation as an error and need device memory of their own.
  tests=${KILN_SANITIZE_TESTS:-$(ls tests/cuda/test_*.c | xargs -n1 basename | sed 's/\.c$//' |
                                 grep -vx test_cuda_oom)}
  tools=${KILN_SANITIZE_TOOLS:-memcheck racecheck}
  limit=${KILN_SANITIZE_TIMEOUT:-900}
  # The environment ctest gives the tests (tests/CMakeLists.txt).
  export KILN_DEVICE=cpu KILN_FIXTURES=$PWD/tests/fixtures KILN_TOKENIZERS=/nonexistent \
    KILN_MODELS=$PWD/models KILN=$PWD/$B/kiln KILN_SRC=$PWD
  rows=(); bad=0
  for t in $tests; do
    for tool in $tools; do
      args=(--tool "$tool" --error-exitcode 86 --print-limit 50)
      # memcheck: device-memory leaks count too (every test frees its
      # backends); racecheck: hazards are errors, "analysis" groups them
      # by source line.
      [ "$tool" = memcheck ] && args+=(--leak-check full)
      [ "$tool" = racecheck ] && args+=(--racecheck-report analysis)
      log="$O/sanitize-$t-$tool.log"
      start=$(date +%s)
      timeout --signal=INT --kill-after=30 "$limit" "$CS" "${args[@]}" "$B/tests/$t" >"$log" 2>&1
      rc=$?
      secs=$(( $(date +%s) - start ))
      # The tool's last word: "ERROR SUMMARY: N errors" (racecheck also
      # prints "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)").
      errs=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
      haz=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)' "$log" | tail -1 |
            sed -E 's/.*\(([0-9]+) errors?, ([0-9]+) warnings?\)/ (\1 race errors, \2 warnings)/')
      if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status="TIMEOUT after ${limit}s"; bad=1
      elif [ "$rc" = 86 ] || [ "${errs:-0}" != 0 ]; then
        status="ERRORS ${errs:-?}$haz"; bad=1
      elif [ "$rc" != 0 ]; then
        status="FAIL rc=$rc (the test itself)"; bad=1
      else
        status="clean$haz"
      fi
      rows+=("$(printf '%-22s %-10s %5ss  %s' "$t" "$tool" "$secs" "$status")")
      say "${rows[-1]}"
      [ "$status" = clean ] || [ "${status#clean}" != "$status" ] || grep -m5 -E '^========= (Invalid|Race|Error|Leaked|Program hit)' "$log" | tee -a "$LOG"
    done
  done
  say ""
  say "=================== compute-sanitizer summary (logs: $O/sanitize-*.log) ==================="
  for r in "${rows[@]}"; do say "$r"; done
  say "compute-sanitizer: $([ $bad = 0 ] && echo PASS || echo FAIL)"
  exit $bad
fi

if [ "$decode" = 1 ]; then
  O=${OUT:-/tmp}
  BF="$B/bench_forward --load-format dummy --device cuda"
  say "== test_cuda_graphs, test_cuda_ops"
  (cd "$B/tests" && KILN_FIXTURES=$PWD/../../tests/fixtures timeout 120 ./test_cuda_graphs) >"$O/graphs.log" 2>&1
  say "test_cuda_graphs rc=$? $(grep -c 'differ$' "$O/graphs.log") steps compared; $(grep -E 'PASSED|FAILED' "$O/graphs.log" | tr '\n' ' ')"
  grep -E 'N=(3|13) step 4' "$O/graphs.log" | head -6 | tee -a "$LOG"
  timeout 120 "$B/tests/test_cuda_ops" >"$O/ops.log" 2>&1
  say "test_cuda_ops rc=$? $(grep -E 'PASSED|FAILED' "$O/ops.log" | tr '\n' ' ')"
  grep -E 'qk_rope|matmul bf16 n=(2|5|8) ' -A1 "$O/ops.log" | grep 'rel err' | head -8 | tee -a "$LOG"
  timeout 120 "$B/tests/test_matmul_wgmma" >"$O/wgmma.log" 2>&1
  say "test_matmul_wgmma rc=$? $(grep -E 'PASSED|FAILED' "$O/wgmma.log" | tr '\n' ' ')"
  say "== bench_forward decode (prompt 128, best of 2)"
  for args in "qwen3-0.6b 64 --batch 1 --no-graphs" "qwen3-0.6b 64 --batch 1" "qwen3-0.6b 64 --batch 64" \
              "qwen3-0.6b 32 --batch 256" "llama-3.1-8b 64 --batch 1" "llama-3.1-8b 32 --batch 1 --no-graphs" \
              "llama-3.1-8b 32 --batch 64" "llama-3.1-8b 32 --batch 256"; do
    set -- $args
    cfg=$1 dec=$2; shift 2
    out=$(timeout 100 $BF --model models/configs/$cfg.json --prompt-len 128 --decode $dec --repeat 2 "$@" 2>&1)
    echo "$out" >>"$LOG"
    say "$cfg $*: $(echo "$out" | grep -E '^(prefill|decode|bench_forward)' | tr '\n' ' ')"
  done
  echo "$out" | grep '^device copy' | tee -a "$LOG"
  say "== bench_gemv (Llama-3.1-8B shapes)"
  timeout 90 "$B/bench_gemv" 2>&1 | tee -a "$LOG"
  say "== bench_gemm_fp8 (Llama-3.1-8B shapes, 2,048 rows)"
  timeout 90 "$B/bench_gemm_fp8" --n 2048 2>&1 | tee -a "$LOG"
  command -v cuobjdump >/dev/null && cuobjdump -sass "$B/CMakeFiles/kiln_backend_cuda.dir/src/backend/cuda/cuda_matmul.cu.o" >"$O/gemv.sass" 2>&1
  say "== ctest -L gpu"
  KILN_TOKENIZERS=/nonexistent timeout ${KILN_CTEST_TIMEOUT:-200} ctest --test-dir "$B" -L '^gpu$' --output-on-failure -V >"$O/ctest-gpu.log" 2>&1
  ctest_rc=$?
  grep -E 'passed, |Test +#|tests passed|FAIL' "$O/ctest-gpu.log" | tail -12 | tee -a "$LOG"
  say "ctest -L gpu: $([ $ctest_rc = 0 ] && echo PASS || echo FAIL rc=$ctest_rc)"
  exit $ctest_rc
fi

say "== ctest -L gpu"
KILN_TOKENIZERS=/nonexistent ctest --test-dir "$B" -L '^gpu$' --output-on-failure -V >"${OUT:-/tmp}/ctest-gpu.log" 2>&1
ctest_rc=$?
grep -E 'rel err|  (matmul|attention|route|moe_ffn) |PASSED  \]|FAILED|ERROR|ok:|FAIL|passed|KILN_TEST_SEED|Test +#' "${OUT:-/tmp}/ctest-gpu.log" | tee -a "$LOG" | tail -80

say "== verify --device cuda (max abs error over prefill/decode/mixed, chunk 64; default bf16 and KILN_CUDA_MATMUL=bf16x2)"
K="$B/kiln"
F=tests/fixtures/oracle/tiny-models
table=()
for arch in llama qwen2 qwen3 qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
  row="$arch"
  for ps in 1 16; do
    e=$("$K" verify --device cuda --model "$F/$arch" --reference "$F/$arch/reference.safetensors" \
        --page-size $ps --chunk 64 --tolerance 1e9 2>&1 | tail -1 | sed -n 's/^max_abs_err=\([^ ]*\).*/\1/p')
    row="$row ps$ps=${e:-ERR}"
  done
  for ps in 1 16; do
    e=$(KILN_CUDA_MATMUL=bf16x2 "$K" verify --device cuda --model "$F/$arch" \
        --reference "$F/$arch/reference.safetensors" --page-size $ps --chunk 64 --tolerance 1e9 2>&1 \
        | tail -1 | sed -n 's/^max_abs_err=\([^ ]*\).*/\1/p')
    row="$row bf16x2:ps$ps=${e:-ERR}"
  done
  ref_max=$(python3 -c "
import json,struct,sys
f=open('$F/$arch/reference.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n))
import array; m=0.0
for k,v in h.items():
    if k.endswith('.logits'):
        f.seek(8+n+v['data_offsets'][0]); a=array.array('f'); a.frombytes(f.read(v['data_offsets'][1]-v['data_offsets'][0])); m=max(m,max(abs(x) for x in a))
print('%.2f'%m)" 2>/dev/null)
  table+=("$row |logit|max=${ref_max:-?}")
done

say "== bench_forward --device cuda (dummy weights)"
bench=()
for cfg in qwen3-0.6b llama-3.1-8b; do
  pps="128 1024"; [ $cfg = llama-3.1-8b ] && pps=1024
  for pp in $pps; do
    out=$("$B/bench_forward" --model models/configs/$cfg.json --load-format dummy --device cuda \
          --prompt-len $pp --decode 64 --repeat 3 2>&1)
    echo "$out" >>"$LOG"
    bench+=("$cfg pp$pp: $(echo "$out" | grep -E '^(prefill|decode)' | tr '\n' ' ')")
    [ "$quick" = 1 ] && break
  done
done
if [ "$quick" = 0 ]; then
  out=$(KILN_CUDA_MATMUL=bf16x2 "$B/bench_forward" --model models/configs/qwen3-0.6b.json \
        --load-format dummy --device cuda --prompt-len 1024 --decode 16 --repeat 3 2>&1)
  bench+=("qwen3-0.6b pp1024 bf16x2: $(echo "$out" | grep -E '^prefill' | tr '\n' ' ')")
fi

say ""
say "=================== summary ==================="
say "ctest -L gpu: $([ $ctest_rc = 0 ] && echo PASS || echo FAIL)"
for r in "${table[@]}"; do say "verify $r"; done
for r in "${bench[@]}"; do say "bench $r"; done
exit $ctest_rc
