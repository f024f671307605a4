#!/usr/bin/env bash
# fuzz.sh [SECONDS] — builds the libFuzzer targets (clang, ASan + UBSan) in
# build-fuzz/ and runs every tests/fuzz/fuzz_*.c for SECONDS (default 60)
# each. Seeds come from tests/fuzz/corpus/<target>/ (committed, small); what
# the fuzzer discovers goes to build-fuzz/corpus/<target>/ so the repository
# stays clean; tests/fuzz/<target>.dict is used when present. Exits non-zero
# if any target crashes, leaks, times out or runs out of memory; the input
# that did it is left in build-fuzz/artifacts/.
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
failed=()
for t in "${targets[@]}"; do
    work="$build/corpus/$t"
    seeds="$root/tests/fuzz/corpus/$t"
    mkdir -p "$work"
    args=(-max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1
          -artifact_prefix="$build/artifacts/$t-")
    [ -f "$root/tests/fuzz/$t.dict" ] && args+=(-dict="$root/tests/fuzz/$t.dict")
    corpora=("$work")
    [ -d "$seeds" ] && corpora+=("$seeds")
    bin="$build/tests/$t"
    [ -x "$bin" ] || bin="$build/$t"
    echo "== $t: ${seconds}s"
    if ! "$bin" "${args[@]}" "${corpora[@]}" 2>"$build/$t.log"; then
        tail -n 40 "$build/$t.log" >&2
        failed+=("$t")
        continue
    fi
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$build/$t.log" | tail -n 2 || true
done

if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]} (logs in $build/<target>.log)" >&2
    exit 1
fi
echo "fuzz.sh: all ${#targets[@]} targets ran ${seconds}s clean"
