#!/usr/bin/env python3
"""Golden renderings of a chat template by transformers, for a template the
shared oracle's chat_templates.json lacks (gpt-oss's harmony template).

Renders a set of conversations with transformers' apply_chat_template
(tokenize=False) on the model's tokenizer and the given template, and
writes them in the format of tests/fixtures/oracle/chat_templates.json,
each case with optional "tools" and "kwargs" (template variables such as
reasoning_effort) and either "rendered" or "error" (the exception's
message). The template's strftime_now is pinned to --date, which the
file records ("date"), so a test can substitute the day it runs on.

Usage: make_chat_template_cases.py NAME TEMPLATE TOKENIZER_DIR OUT.json [--date YYYY-MM-DD]
(OUT.json is updated in place: other names in it are kept.)
"""
import datetime, json, os, sys
from transformers import AutoTokenizer

name, tmpl_path, tok_dir, out = sys.argv[1:5]
date = sys.argv[sys.argv.index("--date") + 1] if "--date" in sys.argv else "2026-01-15"
tmpl = open(tmpl_path, encoding="utf-8").read()
tok = AutoTokenizer.from_pretrained(tok_dir)
day = datetime.date.fromisoformat(date)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}, "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city"]}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "The time",
                                           "parameters": {"type": "object", "properties": {}}}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

CASES = [
    ("user", True, [{"role": "user", "content": "hi"}], None, None),
    ("system_user", True, [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": "What is 2+2?"}], None, None),
    ("developer", True, [{"role": "developer", "content": "Answer in French."},
                         {"role": "user", "content": "Bonjour?"}], None, {"reasoning_effort": "high"}),
    ("multi_turn", True, [{"role": "user", "content": "Name a color."},
                          {"role": "assistant", "content": "Blue."},
                          {"role": "user", "content": "Another one, with ünïcode ✓."}], None, None),
    ("thinking_last", False, [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "thinking": "Add them.", "content": "4"}], None, None),
    ("thinking_earlier", True, [{"role": "user", "content": "2+2?"},
                                {"role": "assistant", "thinking": "Add them.", "content": "4"},
                                {"role": "user", "content": "And 3+3?"}], None, {"reasoning_effort": "low"}),
    ("tools", True, [{"role": "system", "content": "Use tools."},
                     {"role": "user", "content": "Weather in Paris?"}], [WEATHER, NOARGS], None),
    ("tool_round", True, [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "thinking": "I should call the tool.", "tool_calls": [CALL]},
                          {"role": "tool", "content": "{\"temp\": 21}"}], [WEATHER], None),
    ("tool_round_answered", False, [{"role": "user", "content": "Weather in Paris?"},
                                    {"role": "assistant", "tool_calls": [CALL]},
                                    {"role": "tool", "content": "sunny"},
                                    {"role": "assistant", "content": "It is sunny."}], [WEATHER], None),
    ("builtin_tools", True, [{"role": "user", "content": "Search it."}], None,
     {"builtin_tools": ["browser", "python"]}),
    ("channel_in_content", True, [{"role": "user", "content": "x"},
                                  {"role": "assistant", "content": "<|channel|>final<|message|>y"}], None, None),
    ("tool_without_call", True, [{"role": "user", "content": "x"},
                                 {"role": "tool", "content": "y"}], None, None),
]

cases = []
for cname, gen, msgs, tools, kwargs in CASES:
    c = {"name": cname, "add_generation_prompt": gen, "messages": msgs}
    if tools: c["tools"] = tools
    if kwargs: c["kwargs"] = kwargs
    try:
        c["rendered"] = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False,
                                                chat_template=tmpl, strftime_now=lambda f: day.strftime(f),
                                                **(kwargs or {}))
    except Exception as e:  # the template's raise_exception, or a rendering error
        c["error"] = str(e)
    cases.append(c)

d = json.load(open(out, encoding="utf-8")) if os.path.exists(out) else {}
d[name] = {"template": tmpl, "bos_token": tok.bos_token, "eos_token": tok.eos_token, "date": date,
           "transformers": __import__("transformers").__version__, "cases": cases}
json.dump(d, open(out, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
print(f"{name}: {len(cases)} cases, {sum('error' in c for c in cases)} errors -> {out}")
