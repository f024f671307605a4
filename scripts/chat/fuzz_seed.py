#!/usr/bin/env python3
"""Writes a seed corpus for tests/fuzz/fuzz_template: the oracle's chat
templates and the snippets of jinja_cases.py, one file each.

    scripts/chat/fuzz_seed.py corpus/
    build-fuzz/tests/fuzz_template -max_total_time=60 -rss_limit_mb=4096 \
        -dict=tests/fuzz/fuzz_template.dict corpus/
"""
import hashlib, json, os, sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
oracle = json.load(open(os.path.join(here, "../../tests/fixtures/oracle/chat_templates.json")))
templates = [v["template"] for v in oracle.values()]
try:
    import jinja_cases
    templates += [t for t, _ in jinja_cases.CASES]
except Exception:  # the oracle templates alone are a fine seed
    pass
for t in templates:
    b = t.encode()
    open(os.path.join(out, hashlib.sha1(b).hexdigest()), "wb").write(b)
print(f"{len(templates)} seeds in {out}")
