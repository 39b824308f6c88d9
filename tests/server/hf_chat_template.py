#!/usr/bin/env python3
"""Renders a chat template as Hugging Face transformers does (the reference for our engine).

usage: hf_chat_template.py TEMPLATE.jinja VARIABLES.json
Prints the prompt to stdout, byte for byte; a template that raises exits 1 with the message on
stderr. The environment is transformers' own: Jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols, tojson without ASCII escaping, the globals
raise_exception and strftime_now (pinned to 2026-01-15 so that outputs compare), and the
{% generation %} block rendered as its body.
"""
import datetime
import json
import sys

from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def raise_exception(message):
    raise RuntimeError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime(2026, 1, 15, 9, 30, 0).strftime(fmt)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    with open(sys.argv[1], encoding="utf-8") as f:
        template = env.from_string(f.read())
    with open(sys.argv[2], encoding="utf-8") as f:
        variables = json.load(f)
    try:
        out = template.render(**variables)
    except Exception as e:  # the template refused the conversation, or failed
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    sys.stdout.buffer.write(out.encode("utf-8"))


if __name__ == "__main__":
    main()
