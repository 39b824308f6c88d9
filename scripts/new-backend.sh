#!/usr/bin/env bash
# scripts/new-backend.sh NAME: starts the device plugin of a new chip. Copies
# plugins/backends/_template to plugins/backends/NAME and renames every spot that names the
# template (file name, CMake target and plugin name, log tag, table name, probe reason, device
# name, comments), so that the copy builds as libpolychip_backend_NAME.so, runs a model through
# the SDK's reference kernels from its first build, and is tested by `make test` with no other
# edit (tests/ iterates over the backends the build produced).
set -euo pipefail

usage() {
  echo "usage: $0 NAME   (NAME: a lowercase letter, then lowercase letters, digits or _)" >&2
  exit 2
}

[ $# -eq 1 ] || usage
name="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
template="$root/plugins/backends/_template"
dest="$root/plugins/backends/$name"

# NAME becomes a file name, a CMake target, a C string and the device flag's prefix
# (--device NAME:0): the characters those all accept. A leading letter keeps it from looking
# like _template or like a number.
if ! [[ "$name" =~ ^[a-z][a-z0-9_]*$ ]]; then
  echo "error: '$name' is not a plugin name: use lowercase letters, digits and _, starting" \
       "with a letter" >&2
  usage
fi
if [ "$name" = "template" ]; then
  echo "error: 'template' is the name of the template plugin itself" >&2
  exit 1
fi
if [ -e "$dest" ]; then
  echo "error: $dest already exists" >&2
  exit 1
fi
# Another folder may already build a plugin of that name (the folder name is a convention).
if grep -qs -E "polychip_add_plugin\([^ ]+ backend $name( |\))" "$root"/plugins/backends/*/CMakeLists.txt; then
  echo "error: a plugin named '$name' is already built by" \
       "$(grep -ls -E "polychip_add_plugin\([^ ]+ backend $name( |\))" "$root"/plugins/backends/*/CMakeLists.txt)" >&2
  exit 1
fi
if [ ! -f "$template/CMakeLists.txt" ] || [ ! -f "$template/template_backend.cc" ]; then
  echo "error: $template is incomplete (CMakeLists.txt and template_backend.cc expected)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$template/CMakeLists.txt" "$tmp/CMakeLists.txt"
cp "$template/template_backend.cc" "$tmp/${name}_backend.cc"

# The rename, most specific first: the folder, the source file, then the word "template" (the
# target polychip_backend_template, the plugin name, the log tag, the strings, the comments). The
# C++ keyword (`template <typename T>`, `template class`, `.template f<`) is left alone.
for f in "$tmp/CMakeLists.txt" "$tmp/${name}_backend.cc"; do
  NAME="$name" perl -pi -e '
    s{plugins/backends/_template}{plugins/backends/$ENV{NAME}}g;
    s{\btemplate_backend\b}{$ENV{NAME}_backend}g;
    s{(?<![.[:alnum:]])template(?!\s*<|\s+class\b|\s+struct\b)(?=\b|_)}{$ENV{NAME}}g;
  ' "$f"
done
# The template's opening paragraph says how to copy it; the copy says where it came from.
NAME="$name" perl -0pi -e '
  s{\A// The \Q$ENV{NAME}\E device plugin:.*?\n//\n}{// The $ENV{NAME} device plugin, made from plugins/backends/_template by scripts/new-backend.sh:\n// the smallest complete polychip backend. Replace every place marked VENDOR with your\n// runtime'"'"'s call, one op at a time.\n//\n}s
    or die "the opening paragraph of template_backend.cc was not found\n";
' "$tmp/${name}_backend.cc"

# Nothing may still name the template, or the copy would collide with it (two targets
# polychip_backend_template, two plugins called "template").
if left=$(grep -n -E '(^|[^.[:alnum:]])template([^[:alnum:]]|$)' "$tmp/CMakeLists.txt" "$tmp/${name}_backend.cc" |
          grep -v -E 'template *<|template +(class|struct)\b|plugins/backends/_template'); then
  echo "error: the rename missed these lines (the template changed; update $0):" >&2
  echo "$left" >&2
  exit 1
fi

mv "$tmp" "$dest"
trap - EXIT

rel="plugins/backends/$name"
echo "created $rel/ from plugins/backends/_template/:"
printf '  %-40s %s\n' "$rel/CMakeLists.txt" \
  "target polychip_backend_$name, plugin \"$name\" (libpolychip_backend_$name.so)" \
  "$rel/${name}_backend.cc" "table name, log tag, probe reason, device name and id: \"$name\""
cat <<EOF
It answers every op through the SDK's reference kernels, so it runs a model now; replace them
with your chip's kernels one op at a time at the VENDOR markers in ${name}_backend.cc.

Next steps (from $root):
  1. build (an existing build folder picks the new plugin up at its next build):
       cmake -S . -B build -G Ninja && cmake --build build --target polychip polychip_backend_$name
  2. check it against the ABI contract and the reference kernels:
       build/bin/polychip conformance --plugin build/lib/polychip/libpolychip_backend_$name.so
  3. run a model on it:
       build/bin/polychip run --device $name:0 --model-path models/polychip-tiny.gguf --prompt "And God said"
  4. its tests (conformance, ops, model), also part of \`make test\`:
       ctest --test-dir build -L conformance -R $name
       ctest --test-dir build -R $name
See docs/adding-a-backend.md for the checklist.
EOF
