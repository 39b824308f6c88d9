#!/usr/bin/env python3
"""Checks every expectation in jinja_cases.json against Python's jinja2 configured as
transformers configures it (render_reference.make_env), so that the unit tests' expected
strings are the reference's. With --update, rewrites "want"/"error" from jinja2.

Usage: verify_cases.py [--update]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render_reference  # noqa: E402

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jinja_cases.json")
with open(path, encoding="utf-8") as f:
    cases = json.load(f)
env = render_reference.make_env()
bad = 0
for case in cases:
    try:
        got = {"want": env.from_string(case["template"]).render(**case.get("vars", {}))}
    except Exception as e:
        got = {"error": f"{type(e).__name__}: {e}"}
    have = {k: case[k] for k in ("want", "error") if k in case}
    if have != got:
        bad += 1
        print(f"{case['name']}: file has {have!r}, jinja2 gives {got!r}")
        case.pop("want", None)
        case.pop("error", None)
        case.update(got)
if "--update" in sys.argv and bad:
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")
print(f"{len(cases) - bad}/{len(cases)} cases agree with jinja2 {render_reference.jinja2.__version__}")
sys.exit(1 if bad and "--update" not in sys.argv else 0)
