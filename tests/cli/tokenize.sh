#!/usr/bin/env bash
# `kiln tokenize` / `kiln detokenize`: known ids, round trips, and errors
# that name the offending line.
set -u
KILN="${KILN:?KILN must point at the kiln binary}"
SRC="${KILN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}"
TOKS="${KILN_TOKENIZERS:-$SRC/.cache/tokenizers}"
TINY="${KILN_FIXTURES:-$SRC/tests/fixtures}/oracle/tiny-models/_tokenizer"
fails=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

check() { # name, expected, actual
    if [[ "$2" != "$3" ]]; then
        echo "FAIL $1"; echo "  want: $2"; echo "  got:  $3"; fails=$((fails + 1))
    else
        echo "ok   $1"
    fi
}

for name in qwen3 llama2; do
    if [[ ! -s "$TOKS/$name/tokenizer.json" ]]; then
        echo "FAIL missing $TOKS/$name/tokenizer.json: run scripts/fetch-tokenizers.sh"
        exit 1
    fi
done

check "qwen3 ids" "[9707,1879]" "$(printf '"Hello world"\n' | "$KILN" tokenize --tokenizer "$TOKS/qwen3")"
check "llama2 ids with BOS" "[1,22557,1526]" \
    "$(printf '"Hello world"\n' | "$KILN" tokenize --tokenizer "$TOKS/llama2" --add-special)"
check "qwen3 special tokens" "[151644,872,198,6023,151645]" \
    "$(printf '"<|im_start|>user\\nhi<|im_end|>"\n' | "$KILN" tokenize --tokenizer "$TOKS/qwen3")"
check "skip special" '"user\nhi"' \
    "$(printf '[151644,872,198,6023,151645]\n' | "$KILN" detokenize --tokenizer "$TOKS/qwen3" --skip-special)"

# Round trips, several lines at once, through each tokenizer.
cat > "$tmp/in.jsonl" <<'JSON'
"Hello, world! How are you today?"
"line one\nline two\n\nline four\r\nwindows line"
"你好，世界！ emoji: 😀🎉👍🏽 café naïve"
"def add(a, b):\n    return a + b\n"
""
"\u0000 nul and \t tab"
JSON
for dir in "$TOKS/qwen3" "$TOKS/llama2" "$TINY"; do
    "$KILN" tokenize --tokenizer "$dir" < "$tmp/in.jsonl" > "$tmp/ids.jsonl"
    check "$(basename "$dir") tokenize exit" 0 $?
    "$KILN" detokenize --tokenizer "$dir" < "$tmp/ids.jsonl" > "$tmp/out.jsonl"
    check "$(basename "$dir") detokenize exit" 0 $?
    # Compare as JSON values: both sides are normalized by the same printer.
    check "$(basename "$dir") round trip lines" "$(wc -l < "$tmp/in.jsonl")" "$(wc -l < "$tmp/out.jsonl")"
    want="$(printf '%s\n' "$(cat "$tmp/in.jsonl")" | "$KILN" tokenize --tokenizer "$dir")"
    got="$("$KILN" tokenize --tokenizer "$dir" < "$tmp/out.jsonl")"
    check "$(basename "$dir") round trip ids" "$want" "$got"
done
check "round trip text (tiny)" '"Hello, world! How are you today?"' "$(head -n 1 "$tmp/out.jsonl" 2>/dev/null || true)"

# Errors: exit 1 and a message naming the line.
expect_error() { # name, command input, tool, extra args..., expected message fragment (last)
    local name="$1" input="$2" tool="$3"; shift 3
    local want="${*: -1}"; set -- "${@:1:$(($#-1))}"
    local err rc
    err="$(printf '%b' "$input" | "$KILN" "$tool" "$@" 2>&1 >/dev/null)"; rc=$?
    if [[ $rc -ne 1 || "$err" != *"$want"* ]]; then
        echo "FAIL $name (rc=$rc): $err"; fails=$((fails + 1))
    else
        echo "ok   $name: $err"
    fi
}
expect_error "bad JSON" '"ok"\nnot json\n' tokenize --tokenizer "$TINY" "line 2: invalid JSON"
expect_error "not a string" '"ok"\n"ok"\n[1,2]\n' tokenize --tokenizer "$TINY" "line 3: expected a JSON string"
expect_error "not an array" '"x"\n' detokenize --tokenizer "$TINY" "line 1: expected a JSON array"
expect_error "bad id" '[1,2]\n[1,-4]\n' detokenize --tokenizer "$TINY" "line 2: element 1 is not a token id"
expect_error "id too large" '[99999999]\n' detokenize --tokenizer "$TINY" "line 1: element 0 is not a token id"
expect_error "missing tokenizer" '"x"\n' tokenize --tokenizer "$tmp/nowhere" "no such file or folder"
mkdir -p "$tmp/bad" && echo '{"model": {"type": "WordPiece"}}' > "$tmp/bad/tokenizer.json"
expect_error "unsupported model" '"x"\n' tokenize --tokenizer "$tmp/bad" "model type 'WordPiece' is not supported"

"$KILN" tokenize 2>/dev/null; check "usage error exit" 2 $?
"$KILN" tokenize --help > /dev/null; check "help exit" 0 $?

if [[ $fails -ne 0 ]]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
