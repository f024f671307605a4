# scripts/gpu/common.sh — the common start of the GPU check scripts in
# scripts/gpu/ (each one run on a GPU machine: build, tests, benchmarks,
# under a time budget). Sourced from the repository root after the script has set
#   OUT     the log folder (summary.log is the short version)
#   BUDGET  seconds the run may take
#   STAGES  (optional) the stage names `want` accepts
# It truncates summary.log, prints the GPU, and sets up kiln's Debian
# libraries (scripts/gpu-check.sh --env: PKGCONF, PKG_CONFIG_LIBDIR,
# LD_LIBRARY_PATH). B (the build folder, default build-gpu) is where
# bench_forward lives.
mkdir -p "$OUT"
S=$OUT/summary.log; : >"$S"
T0=$(date +%s)
B=${B:-build-gpu}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$S"; }
want() { case " ${STAGES:-} " in *" $1 "*) return 0 ;; esac; return 1; }
# a time limit of at most what is left of the budget (at least 1 s)
lim() { local l=$1; [ "$l" -gt "$(left)" ] && l=$(left); [ "$l" -lt 1 ] && l=1; echo "$l"; }

# What `bench` prints of a run's output (stdin) on its summary line; a
# script may redefine it.
bench_show() { grep -E "^(prefill|decode)" | tr '\n' ' '; }
# bench LABEL LIMIT "ENV=V ..." bench_forward-args...: one dummy-weight
# bench_forward run on the GPU, its output appended to bench.log under
# "== LABEL [ENV]", skipped when less than 12 s of the budget are left.
bench() {
  local label=$1 l=$2 envs=$3; shift 3
  [ "$(left)" -gt 12 ] || { say "skip $label (time)"; return; }
  echo "== $label [$envs]" >>"$OUT/bench.log"
  env $envs timeout "$(lim "$l")" "$B/bench_forward" --device cuda --load-format dummy "$@" >>"$OUT/bench.log" 2>&1
  local rc=$?
  say "$label rc=$rc: $(awk -v l="== $label [$envs]" '$0==l{p=1;next} /^== /{p=0} p' "$OUT/bench.log" | bench_show)"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$S"
eval "$(scripts/gpu-check.sh --env)"

# ctest_gpu [LINES]: `ctest -L gpu` when the budget has 150 s left, its
# summary (the last LINES lines, default 14) in summary.log.
ctest_gpu() {
  [ "$(left)" -gt 150 ] || { say "skip ctest -L '^gpu$' (time)"; return; }
  say "ctest -L gpu"
  KILN_TOKENIZERS=/nonexistent timeout "$(lim 400)" ctest --test-dir "$B" -L '^gpu$' --output-on-failure >"$OUT/ctest-gpu.log" 2>&1
  say "ctest rc=$?"
  grep -E 'tests passed|tests failed|Test +#' "$OUT/ctest-gpu.log" | tail -"${1:-14}" | tee -a "$S"
}

# build [TARGETS...]: configures and builds kiln with CUDA in $B (all
# targets when none are named); on failure prints the first errors and exits.
build() {
  say "build"
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPKG_CONFIG_EXECUTABLE=$PKGCONF >"$OUT/build.log" 2>&1 &&
    ninja -C "$B" "$@" >>"$OUT/build.log" 2>&1 ||
    { say "build FAILED"; grep -A12 -m3 error "$OUT/build.log" | head -50 | tee -a "$S"; exit 1; }
  say "build ok"
}
