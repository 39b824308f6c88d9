#!/usr/bin/env python3
"""Renders one template with one set of variables as transformers does (render_reference's
environment), for tests that check a prompt polychip serves.

Usage: render_one.py TEMPLATE.jinja VARIABLES.json
Prints the prompt byte for byte; a template that raises exits 1 with the message on stderr.
"""
import json
import sys

from render_reference import make_env


def main():
    with open(sys.argv[1], encoding="utf-8", newline="") as f:
        template = make_env().from_string(f.read())
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
