#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, the release build and
# its tests, the same suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# the threaded engine and server tests under ThreadSanitizer, and every fuzz
# target for KILN_FUZZ_SECONDS (default 60) seconds each.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
echo "== lint"
scripts/lint.sh
scripts/deps.sh
if [ -x scripts/fetch-tokenizers.sh ]; then scripts/fetch-tokenizers.sh; fi

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
# GPU tests (label gpu) need a device: scripts/gpu-check.sh runs them there.
ctest --test-dir build --output-on-failure -j "$jobs" -LE gpu

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF >/dev/null
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE gpu

echo "== ThreadSanitizer build (the tests labelled tsan: engine and server threads)"
tsan_start=$(date +%s)
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_TSAN=ON -DKILN_CUDA=OFF >/dev/null
ninja -C build-tsan tsan_deps
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L tsan
echo "ThreadSanitizer stage: $(($(date +%s) - tsan_start)) s"

if [ -x scripts/fuzz.sh ] && [ "${KILN_FUZZ_SECONDS:-60}" != 0 ]; then
  echo "== fuzzing (${KILN_FUZZ_SECONDS:-60} s per target)"
  scripts/fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
fi
echo "== all tests passed"
