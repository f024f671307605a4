#!/usr/bin/env bash
# fuzz.sh [SECONDS] — builds the libFuzzer targets (clang, ASan + UBSan) in
# build-fuzz/ and runs every tests/fuzz/fuzz_*.c for SECONDS (default 60)
# each. Seeds come from tests/fuzz/corpus/<target>/ (committed, small); what
# the fuzzer discovers goes to build-fuzz/corpus/<target>/ so the repository
# stays clean; tests/fuzz/<target>.dict is used when present. Exits non-zero
# if any target crashes, leaks, times out or runs out of memory; the input
# that did it is left in build-fuzz/artifacts/. Targets run side by side,
# one per core (KILN_FUZZ_JOBS).
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-fuzz"

cmake -S "$root" -B "$build" -G Ninja -DKILN_FUZZ=ON -DKILN_CUDA=OFF -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

targets=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    targets+=("$(basename "$src" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "fuzz.sh: no targets in tests/fuzz/" >&2
    exit 1
fi
ninja -C "$build" "${targets[@]}"

mkdir -p "$build/artifacts"
# one target per core at a time (KILN_FUZZ_JOBS overrides): each fuzzer is
# single-threaded, so this divides the wall time without shortening any run
jobs=${KILN_FUZZ_JOBS:-$(nproc)}
run_target() {
    local t=$1 work="$build/corpus/$1" seeds="$root/tests/fuzz/corpus/$1"
    mkdir -p "$work"
    # -timeout: a unit that runs this long is a hang. ASan + UBSan run some
    # 20x slower than the release build: the grammar compiler takes 0.15 s
    # to refuse the largest nested repetitions it refuses (its work bound),
    # 2-4 s here, more beside other work; 30 s still catches a real hang
    local args=(-max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1
                -artifact_prefix="$build/artifacts/$t-")
    [ -f "$root/tests/fuzz/$t.dict" ] && args+=(-dict="$root/tests/fuzz/$t.dict")
    local corpora=("$work")
    [ -d "$seeds" ] && corpora+=("$seeds")
    local bin="$build/tests/$t"
    [ -x "$bin" ] || bin="$build/$t"
    local rc=0
    "$bin" "${args[@]}" "${corpora[@]}" 2>"$build/$t.log" || rc=$?
    echo "$rc" >"$build/$t.status"
}
for t in "${targets[@]}"; do
    rm -f "$build/$t.status"
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    echo "== $t: ${seconds}s"
    run_target "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
    if [ "$(cat "$build/$t.status" 2>/dev/null)" != 0 ]; then
        echo "== $t FAILED" >&2
        tail -n 40 "$build/$t.log" >&2
        failed+=("$t")
        continue
    fi
    echo "== $t: $(grep -E "Done [0-9]+ runs" "$build/$t.log" | tail -n 1)"
done

if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]} (logs in $build/<target>.log)" >&2
    exit 1
fi
echo "fuzz.sh: all ${#targets[@]} targets ran ${seconds}s clean"
