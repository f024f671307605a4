#!/usr/bin/env bash
# `kiln chat-template` prints exactly what transformers' apply_chat_template
# renders (no newline added), and fails with one clear line and exit 1 on a
# template error or bad input.
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check NAME EXPECTED_FILE ACTUAL_FILE
  if cmp -s "$2" "$3"; then echo "ok: $1"; else echo "FAIL: $1"; echo " expected: $(od -c "$2" | head -5)"; echo " got:      $(od -c "$3" | head -5)"; fail=$((fail + 1)); fi
}
expect_fail() { # expect_fail NAME PATTERN -- kiln args... (stdin from $tmp/in)
  local name=$1 pat=$2; shift 3
  local err rc
  err=$("$KILN" chat-template "$@" < "$tmp/in" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 1 ] && printf '%s' "$err" | grep -Fq -- "$pat" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then
    echo "ok: $name: $err"
  else
    echo "FAIL: $name (rc=$rc): $err"; fail=$((fail + 1))
  fi
}

# Every oracle case through the CLI, byte for byte.
python3 - "$KILN_FIXTURES/oracle/chat_templates.json" "$tmp" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1])); out = sys.argv[2]
def tok(x): return x["content"] if isinstance(x, dict) else x
for name, v in d.items():
    os.makedirs(f"{out}/{name}", exist_ok=True)
    cfg = {"chat_template": v["template"], "bos_token": v["bos_token"], "eos_token": v["eos_token"]}
    json.dump(cfg, open(f"{out}/{name}/tokenizer_config.json", "w"), ensure_ascii=False)
    for i, c in enumerate(v["cases"]):
        base = f"{out}/{name}/case{i}"
        json.dump(c["messages"], open(base + ".json", "w"), ensure_ascii=False)
        open(base + ".gen", "w").write("1" if c["add_generation_prompt"] else "0")
        if "rendered" in c: open(base + ".want", "w", encoding="utf-8", newline="").write(c["rendered"])
PY
n=0
for want in "$tmp"/*/case*.want; do
  base=${want%.want}; dir=$(dirname "$base")
  args=(--tokenizer "$dir"); [ "$(cat "$base.gen")" = 0 ] && args+=(--no-generation-prompt)
  "$KILN" chat-template "${args[@]}" < "$base.json" > "$base.got" || { echo "FAIL: $base exited $?"; fail=$((fail + 1)); continue; }
  check "oracle $(basename "$dir")/$(basename "$base")" "$want" "$base.got" >/dev/null || true
  cmp -s "$want" "$base.got" || { echo "FAIL: oracle $base"; fail=$((fail + 1)); }
  n=$((n + 1))
done
echo "oracle cases through the CLI: $n"
[ "$n" -ge 32 ] || { echo "FAIL: expected at least 32 oracle cases"; fail=$((fail + 1)); }

# gpt-oss's harmony template (chat_templates_more.json, transformers'
# renderings by scripts/oracle/make_chat_template_cases.py): tools as a
# request object, template variables (reasoning_effort, builtin_tools)
# through --kwargs, and the template's own errors (exit 1, the message).
# Its strftime_now was pinned to the file's "date"; kiln renders today,
# which the expected text takes (checked the day before and after the
# run, so a run across midnight still compares).
python3 - "$KILN_FIXTURES/oracle/chat_templates_more.json" "$tmp/more" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1], encoding="utf-8")); out = sys.argv[2]
for name, v in d.items():
    os.makedirs(f"{out}/{name}", exist_ok=True)
    cfg = {"chat_template": v["template"], "bos_token": v["bos_token"], "eos_token": v["eos_token"]}
    json.dump(cfg, open(f"{out}/{name}/tokenizer_config.json", "w"), ensure_ascii=False)
    open(f"{out}/{name}/date", "w").write(v["date"])
    for c in v["cases"]:
        base = f"{out}/{name}/{c['name']}"
        req = {"messages": c["messages"]}
        if "tools" in c: req["tools"] = c["tools"]
        json.dump(req, open(base + ".req", "w"), ensure_ascii=False)
        open(base + ".gen", "w").write("1" if c["add_generation_prompt"] else "0")
        open(base + ".kwargs", "w").write(json.dumps(c.get("kwargs", {})))
        if "rendered" in c: open(base + ".want", "w", encoding="utf-8", newline="").write(c["rendered"])
        else: open(base + ".error", "w", encoding="utf-8").write(c["error"])
PY
m=0
for req in "$tmp"/more/*/*.req; do
  base=${req%.req}; dir=$(dirname "$base"); what="$(basename "$dir")/$(basename "$base")"
  args=(--tokenizer "$dir" --kwargs "$(cat "$base.kwargs")"); [ "$(cat "$base.gen")" = 0 ] && args+=(--no-generation-prompt)
  m=$((m + 1))
  if [ -f "$base.error" ]; then
    err=$("$KILN" chat-template "${args[@]}" < "$req" 2>&1 >/dev/null); rc=$?
    if [ $rc -eq 1 ] && printf '%s' "$err" | grep -Fq -- "$(cat "$base.error")"; then echo "ok: $what refused: $err"
    else echo "FAIL: $what: expected exit 1 with '$(cat "$base.error")', got $rc: $err"; fail=$((fail + 1)); fi
    continue
  fi
  d0=$(date +%F)
  "$KILN" chat-template "${args[@]}" < "$req" > "$base.got" || { echo "FAIL: $what exited $?"; fail=$((fail + 1)); continue; }
  d1=$(date +%F) pinned=$(cat "$dir/date") same=0
  for d in "$d0" "$d1"; do
    sed "s/Current date: $pinned/Current date: $d/" "$base.want" > "$base.today"
    cmp -s "$base.today" "$base.got" && same=1
  done
  [ $same = 1 ] && echo "ok: $what" || { check "$what" "$base.today" "$base.got"; fail=$((fail + 1)); }
done
echo "harmony template cases: $m"
[ "$m" -ge 12 ] || { echo "FAIL: expected at least 12 harmony template cases"; fail=$((fail + 1)); }

# --kwargs reaches the template (Qwen3's enable_thinking).
echo '[{"role": "user", "content": "hi"}]' > "$tmp/in"
"$KILN" chat-template --tokenizer "$tmp/qwen3" --kwargs '{"enable_thinking": false}' < "$tmp/in" > "$tmp/got"
printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' > "$tmp/want"
check "qwen3 enable_thinking=false" "$tmp/want" "$tmp/got"

# --template with tools given as an object on stdin.
printf '%s' '{%- for t in tools %}{{ t.function.name }}:{{ t|tojson }}{% endfor %}|{{ messages[0].content }}' > "$tmp/t.jinja"
echo '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1.5, null]}}}]}' > "$tmp/in2"
"$KILN" chat-template --template "$tmp/t.jinja" < "$tmp/in2" > "$tmp/got"
printf '%s' 'f:{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1.5, null]}}}|x' > "$tmp/want"
check "template file with tools" "$tmp/want" "$tmp/got"

# Llama-2, Llama-3 and gpt-oss ship "model_max_length": int(1e30) written out
# (beyond int64): their tokenizer_config.json must load. A real-shaped file
# (Meta-Llama-3-8B-Instruct's fields), and the cached real ones when present.
mkdir -p "$tmp/llama3big"
python3 - "$tmp/llama3big/tokenizer_config.json" <<'PY'
import json, sys
tpl = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
       "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
       "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
       "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
cfg = {"added_tokens_decoder": {"128000": {"content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
       "rstrip": False, "single_word": False, "special": True}}, "bos_token": "<|begin_of_text|>",
       "chat_template": tpl, "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>",
       "model_input_names": ["input_ids", "attention_mask"], "model_max_length": int(1e30),
       "tokenizer_class": "PreTrainedTokenizerFast"}
open(sys.argv[1], "w").write(json.dumps(cfg, indent=2))
PY
grep -q '"model_max_length": 1000000000000000019884624838656' "$tmp/llama3big/tokenizer_config.json" || { echo "FAIL: fixture"; fail=$((fail + 1)); }
echo '[{"role": "user", "content": "hi"}]' > "$tmp/in"
"$KILN" chat-template --tokenizer "$tmp/llama3big" < "$tmp/in" > "$tmp/got" 2> "$tmp/err" || cat "$tmp/err"
printf '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' > "$tmp/want"
check "tokenizer_config.json with model_max_length 1e30" "$tmp/want" "$tmp/got"
for m in llama2 llama3 gptoss; do
  d="${KILN_TOKENIZERS:-}/$m"
  [ -f "$d/tokenizer_config.json" ] || { echo "FAIL: no cached $m tokenizer in '$d' (scripts/fetch-tokenizers.sh)"; fail=$((fail + 1)); continue; }
  if "$KILN" chat-template --tokenizer "$d" < "$tmp/in" > "$tmp/got" 2> "$tmp/err" && [ -s "$tmp/got" ]; then
    echo "ok: cached $m tokenizer_config.json renders"
  elif grep -q "no chat template (expected" "$tmp/err"; then # read, but its template lives in a file not cached
    echo "ok: cached $m tokenizer_config.json reads"
  else
    echo "FAIL: cached $m: $(cat "$tmp/err")"; fail=$((fail + 1))
  fi
done

# Errors: one line, exit 1.
printf '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]' > "$tmp/in"
expect_fail "raise_exception" "Conversation roles must alternate" -- --tokenizer "$tmp/gemma3"
printf '{%% for m in messages %%}\n{{ m.content }' > "$tmp/bad.jinja"
expect_fail "syntax error" "bad.jinja: template:2:" -- --template "$tmp/bad.jinja"
printf 'not json' > "$tmp/in"
expect_fail "bad stdin" "stdin: invalid JSON" -- --tokenizer "$tmp/qwen3"
printf '[]' > "$tmp/in"
expect_fail "missing dir" "tokenizer_config.json" -- --tokenizer "$tmp/nonexistent"
expect_fail "bad kwargs" "--kwargs" -- --tokenizer "$tmp/qwen3" --kwargs '[1'

"$KILN" chat-template > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "ok: usage exit 2" || { echo "FAIL: usage exit $rc"; fail=$((fail + 1)); }

[ $fail -eq 0 ] && echo "all chat-template CLI checks passed"
exit $fail
