#!/usr/bin/env python3
"""Every relative link of the Markdown files (README.md, docs/, the other *.md of the tree)
resolves: the file exists and, for a link with #anchor, the target has a heading of that slug
(GitHub's: lower case, punctuation dropped, spaces to dashes).
Usage: doc_links.py SOURCE_DIR [FILE.md ...]   (default: every tracked-looking *.md)"""
import os
import re
import sys

LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
FENCE = re.compile(r'^\s*(```|~~~)')
SKIP_DIRS = {'.git', 'node_modules', '__pycache__'}


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r'`', '', s)
    s = re.sub(r'[^\w\- ]', '', s)  # keeps letters, digits, _, -, spaces
    return s.replace(' ', '-')


def headings(path):
    out, seen, fenced = set(), {}, False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            m = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f'{s}-{n}')
    return out


def links(path):
    fenced = False
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            line = re.sub(r'`[^`]*`', '', line)  # code spans are not links
            for m in LINK.finditer(line):
                yield number, m.group(1)


def main():
    root = os.path.abspath(sys.argv[1])
    files = sys.argv[2:]
    if not files:
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith('build')]
            files += [os.path.join(d, n) for n in names if n.endswith('.md')]
    broken, checked = [], 0
    for path in sorted(files):
        for number, target in links(path):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:, ...
                continue
            checked += 1
            file_part, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
                else path
            where = f'{os.path.relpath(path, root)}:{number}: ({target})'
            if not os.path.exists(dest):
                broken.append(f'{where} no such file {os.path.relpath(dest, root)}')
            elif anchor and dest.endswith('.md') and anchor not in headings(dest):
                broken.append(f'{where} no heading #{anchor} in {os.path.relpath(dest, root)}')
    for b in broken:
        print(b)
    print(f'{checked} relative links in {len(files)} Markdown files, {len(broken)} broken')
    return 1 if broken else 0


if __name__ == '__main__':
    sys.exit(main())
