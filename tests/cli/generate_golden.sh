#!/usr/bin/env bash
# Greedy decoding of the bundled stories260K model reproduces llama2.c's
# run.c output token for token (models/stories260K/reference_llama2c.json:
# -n 200 forward passes, stop when the next token is BOS = 1).
set -u
ref="$KILN_MODELS/stories260K/reference_llama2c.json"
fail=0; runs=0
while IFS=$'\t' read -r name ids max want; do
  got=$("$KILN" generate --model "$KILN_MODELS/stories260K" --ids "$ids" --max-tokens "$max")
  runs=$((runs + 1))
  if [ "$got" = "$want" ]; then echo "ok: $name ($max steps)"; else
    echo "FAIL: $name"; echo " want: $want"; echo " got:  $got"; fail=$((fail + 1)); fi
done < <(node -e '
  const r = require(process.argv[1]);
  for (const p of r.prompts)
    console.log([JSON.stringify(p.prompt), p.prompt_ids.join(","),
                 r.steps - (p.prompt_ids.length - 1), p.generated_ids.join(",")].join("\t"));
' "$ref")
# --prompt goes through the tokenizer (BOS added as tokenizer.json says) and
# must give the same ids as llama2.c's own encoder, and the same text.
while IFS=$'\t' read -r prompt max want text; do
  out=$("$KILN" generate --model "$KILN_MODELS/stories260K" --prompt "$prompt" --max-tokens "$max")
  runs=$((runs + 1))
  got_ids=$(printf '%s\n' "$out" | head -1)
  got_text=$(printf '%s\n' "$out" | tail -n +2)
  if [ "$got_ids" = "$want" ] && [ "$got_text" = "$(printf '%b' "$text")" ]; then echo "ok: --prompt \"$prompt\""; else
    echo "FAIL: --prompt \"$prompt\""; echo " want: $want"; echo " got:  $got_ids"; fail=$((fail + 1)); fi
done < <(node -e '
  const r = require(process.argv[1]);
  for (const p of r.prompts.filter(p => p.prompt.length > 0 && !p.stopped_on_bos))
    console.log([p.prompt, r.steps - (p.prompt_ids.length - 1), p.generated_ids.join(","),
                 p.text.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")].join("\t"));
' "$ref")
[ $runs -ge 5 ] || { echo "FAIL: read only $runs cases from $ref"; fail=$((fail + 1)); }
echo "$((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
