#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2 set up as Hugging Face transformers sets it up
(transformers/utils/chat_template_utils.py: _compile_jinja_template), the reference our engine
is compared with byte for byte.

Usage: render_reference.py TEMPLATE_DIR CONVERSATIONS_JSON
Prints JSON: {"now": epoch, "cases": [{"name", "vars"}],
              "results": [{"template", "case", "out" | "error"}]}
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# strftime_now's clock, pinned so that both engines print the same date (local time).
NOW = 1768471200  # 2026-01-15


class AssistantTracker(Extension):
    """transformers' {% generation %} block: marks assistant tokens; renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(NOW).strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    template_dir, conversations_path = sys.argv[1], sys.argv[2]
    with open(conversations_path, encoding="utf-8") as f:
        spec = json.load(f)
    cases = []
    for conv in spec["conversations"]:
        for agp in (False, True):
            variables = dict(spec["common"])
            variables["messages"] = conv["messages"]
            if "tools" in conv:
                variables["tools"] = spec["tools"]
            variables.update(conv.get("kwargs", {}))
            variables["add_generation_prompt"] = agp
            cases.append({"name": f"{conv['name']}/agp={str(agp).lower()}", "vars": variables})
    env = make_env()
    results = []
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8", newline="") as f:
            source = f.read()
        try:
            template = env.from_string(source)
        except Exception as e:  # a template jinja2 refuses to compile
            for i in range(len(cases)):
                results.append({"template": name, "case": i,
                                "error": f"{type(e).__name__}: {e}"})
            continue
        for i, case in enumerate(cases):
            try:
                out = template.render(**case["vars"])
                results.append({"template": name, "case": i, "out": out})
            except Exception as e:
                results.append({"template": name, "case": i, "error": f"{type(e).__name__}: {e}"})
    json.dump({"now": NOW, "cases": cases, "results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
