#!/usr/bin/env bash
# A broken checkpoint gets one clear line naming the file and the field or
# tensor, and exit code 1 — never a crash.
set -u
src="$KILN_FIXTURES/oracle/tiny-models/llama"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; runs=0
mk() { rm -rf "$tmp/m"; cp -r "$src" "$tmp/m"; chmod -R u+w "$tmp/m"; }
expect() { # expect NAME PATTERN...: runs verify on $tmp/m, wants exit 1 and every pattern in stderr
  local name=$1; shift
  local err rc
  err=$("$KILN" verify --model "$tmp/m" --reference "$src/reference.safetensors" 2>&1 >/dev/null)
  rc=$?
  runs=$((runs + 1))
  local ok=1
  [ $rc -eq 1 ] || ok=0
  for p in "$@"; do printf '%s' "$err" | grep -Fq -- "$p" || ok=0; done
  [ "$(printf '%s\n' "$err" | grep -vc '^\[[0-9:.]* INFO\] ')" -eq 1 ] || ok=0 # one line besides the log
  if [ $ok -eq 1 ]; then echo "ok: $name: $err"; else echo "FAIL: $name (rc=$rc): $err"; fail=$((fail + 1)); fi
}
mk; head -c 5000 "$src/model.safetensors" > "$tmp/m/model.safetensors"
expect truncated model.safetensors
mk; printf 'X' | dd of="$tmp/m/model.safetensors" bs=1 seek=8 conv=notrunc 2>/dev/null
expect bad-header-json model.safetensors header
mk; perl -0777 -pi -e 's/model\.norm\.weight/model.norm.weighx/' "$tmp/m/model.safetensors"
expect missing-tensor "model.norm.weight" missing
mk; perl -0777 -pi -e 's/"intermediate_size": 128/"intermediate_size": 96/' "$tmp/m/config.json"
expect wrong-shape "mlp" "expected shape"
mk; perl -0777 -pi -e 's/"model_type": "llama"/"model_type": "gpt9"/' "$tmp/m/config.json"
expect unknown-architecture config.json gpt9
mk; perl -0777 -pi -e 's/"hidden_size": 64/"hidden_size": "64"/' "$tmp/m/config.json"
expect wrong-type config.json hidden_size
mk; rm "$tmp/m/model.safetensors" "$tmp/m/reference.safetensors"
expect no-weights "$tmp/m" model.safetensors
mk; printf '{' > "$tmp/m/config.json"
expect bad-config-json config.json
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
