#!/usr/bin/env bash
# The knob table (src/base/knob.c): docs/knobs.md is its current Markdown;
# every KILN_* name in src/ and bench/ is a knob of the table, a macro the
# sources or CMakeLists.txt define, or a header guard; only knob.c reads
# KILN_* variables from the environment; a bad value stops a command with
# exit status 2 and a message naming it; the knobs not at their defaults
# are logged at start-up; --device auto says why it took the CPU.
set -u
KILN="${KILN:?KILN must point at the kiln binary}"
SRC="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
source "$SRC/tests/knob_line.sh"
M="${KILN_MODELS:-$SRC/models}/stories260K"
fails=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

# 1. docs/knobs.md is what the table prints
"$KILN" knobs --markdown >"$tmp/knobs.md"
if diff -u "$SRC/docs/knobs.md" "$tmp/knobs.md" >"$tmp/doc.diff"; then ok "docs/knobs.md is current"
else fail "docs/knobs.md differs from the table: run \`kiln knobs --markdown > docs/knobs.md\`"; cat "$tmp/doc.diff"; fi

# 2. every KILN_* name in src/ and bench/ is known
"$KILN" knobs --names | sort -u >"$tmp/allowed"
[[ $(wc -l <"$tmp/allowed") -gt 20 ]] || fail "kiln knobs --names printed too few names"
# compile-time macros: #define'd in the sources, or by CMakeLists.txt
grep -rhoE '#\s*define\s+KILN_[A-Z0-9_]+' "$SRC/src" "$SRC/bench" "$SRC/include" |
    grep -oE 'KILN_[A-Z0-9_]+' >>"$tmp/allowed"
grep -hoE '(PUBLIC|PRIVATE|INTERFACE) KILN_[A-Z0-9_]+=|option\(KILN_[A-Z0-9_]+|set\(KILN_[A-Z0-9_]+ ' \
    "$SRC/CMakeLists.txt" | grep -oE 'KILN_[A-Z0-9_]+' >>"$tmp/allowed"
# enumerators (error codes and the like): a line of an enum body naming one
grep -rhoE '^\s+KILN_[A-Z0-9_]+\s*(=[^,]*)?,' "$SRC/src" "$SRC/include" --include='*.h' |
    grep -oE 'KILN_[A-Z0-9_]+' >>"$tmp/allowed"
sort -u -o "$tmp/allowed" "$tmp/allowed"
grep -rnoE 'KILN_[A-Z0-9_]+' "$SRC/src" "$SRC/bench" --include='*.c' --include='*.h' --include='*.cu' \
    --include='*.cuh' --include='*.py' --include='*.sh' |
    while IFS=: read -r file line name; do
        [[ $name =~ _(H|CUH)$ ]] && continue # header guards
        grep -qxF "$name" "$tmp/allowed" || echo "${file#"$SRC"/}:$line: $name"
    done >"$tmp/unknown"
if [[ -s "$tmp/unknown" ]]; then
    fail "KILN_* names that are no knob of src/base/knob.c (add it to the table or drop it):"
    cat "$tmp/unknown"
else ok "every KILN_* name in src/ and bench/ is in the knob table"; fi
# every file asks base/knob.h; only knob.c reads the environment
grep -rnE 'getenv\("KILN_' "$SRC/src" "$SRC/bench" | grep -v '/src/base/knob\.c:' >"$tmp/getenv"
if [[ -s "$tmp/getenv" ]]; then fail "getenv of a KILN_* variable outside base/knob.c:"; cat "$tmp/getenv"
else ok "no getenv(\"KILN_...\") outside the knob table"; fi

# 3. a bad value stops the command, naming the variable
for cmd in generate verify serve bench knobs; do
    if [[ $cmd == knobs ]]; then out=$(KILN_CUDA_KV=fp8 "$KILN" knobs 2>&1 >/dev/null); rc=$?
    else out=$(KILN_CUDA_KV=fp8 "$KILN" $cmd --model "$M" 2>&1 >/dev/null); rc=$?; fi
    if [[ $rc == 2 && $out == *"KILN_CUDA_KV='fp8': expected one of auto, bf16 or f32"* ]]; then
        ok "kiln $cmd: bad KILN_CUDA_KV, exit 2"
    else fail "kiln $cmd with KILN_CUDA_KV=fp8: rc=$rc, stderr: $out"; fi
done
out=$(KILN_CUDA_GEMV_MAX_ROWS=99 "$KILN" generate --model "$M" --ids 1 --max-tokens 1 2>&1 >/dev/null); rc=$?
[[ $rc == 2 && $out == *"KILN_CUDA_GEMV_MAX_ROWS='99': expected an integer from 0 to 8"* ]] &&
    ok "out-of-range integer, exit 2" || fail "KILN_CUDA_GEMV_MAX_ROWS=99: rc=$rc, stderr: $out"

# 4. the knobs not at their defaults are one INFO line at start-up; kiln
# knobs lists them
out=$(KILN_CUDA_PDL=off KILN_CUDA_FUSE=1 KILN_LOG=info "$KILN" generate --model "$M" --ids 1 --max-tokens 1 2>&1 >/dev/null)
line=$(grep -E "$KNOB_LINE_RE" <<<"$out")
[[ $(wc -l <<<"$line") == 1 && $line == *KILN_CUDA_PDL=0* && $line != *KILN_CUDA_FUSE* && $line != *KILN_LOG* ]] &&
    ok "start-up line lists the knobs not at their defaults" || fail "start-up line: $out"
[[ $(env -i PATH="$PATH" "$KILN" knobs) == "every knob is at its default" ]] && ok "kiln knobs, none set" ||
    fail "kiln knobs with a clean environment: $(env -i PATH="$PATH" "$KILN" knobs)"
[[ $(env -i PATH="$PATH" KILN_CUDA_KV=f32 KILN_LOG=warn "$KILN" knobs) == $'KILN_LOG=warn\nKILN_CUDA_KV=f32' ]] &&
    ok "kiln knobs lists the knobs set" || fail "kiln knobs: $(env -i KILN_CUDA_KV=f32 KILN_LOG=warn "$KILN" knobs)"

# 5. --device auto on the CPU says why
out=$("$KILN" generate --model "$M" --device auto --ids 1 --max-tokens 1 2>&1 >/dev/null)
if grep -q 'device auto: ' <<<"$out"; then
    grep -qE 'INFO\] device auto: .+; using the CPU' <<<"$out" && ok "--device auto explains the CPU" ||
        fail "--device auto line: $out"
else
    grep -qi 'cuda' <<<"$out" && ok "--device auto took the GPU" || fail "--device auto said nothing: $out"
fi

[[ $fails == 0 ]] && echo "knobs: all passed" || { echo "knobs: $fails failed"; exit 1; }
