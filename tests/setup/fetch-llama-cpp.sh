#!/usr/bin/env bash
# Fetches the correctness oracle of the model tests: llama.cpp as shipped inside the npm package
# node-llama-cpp@3.21.1 (its source as a git bundle, with the vocabulary GGUFs and tokenizer
# test vectors under models/), and builds the two tools the tests run:
#   llama-perplexity  perplexity with the method polychip perplexity reproduces
#   llama-simple      greedy generation, non-interactive
# Everything goes to $POLYCHIP_CACHE (default ~/.cache/polychip): npm/, llama.cpp/,
# llama.cpp/build/. An existing checkout and build are reused (only the missing targets are
# built, with the same configuration, so ccache and CI caches stay warm).
# The tests find the result through POLYCHIP_LLAMA_CPP_DIR (default $POLYCHIP_CACHE/llama.cpp).
set -euo pipefail

version="3.21.1"
cache="${POLYCHIP_CACHE:-$HOME/.cache/polychip}"
src="${POLYCHIP_LLAMA_CPP_DIR:-$cache/llama.cpp}"
build="$src/build"
jobs="${POLYCHIP_JOBS:-$(nproc)}"
pkg="$cache/npm/node_modules/node-llama-cpp"

log() { echo "[fetch-llama-cpp] $*" >&2; }

# 1. the npm package, by name and exact version
installed=""
if [ -f "$pkg/package.json" ]; then
  installed="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$pkg/package.json" | head -1)"
fi
if [ "$installed" != "$version" ]; then
  log "installing node-llama-cpp@$version into $cache/npm"
  mkdir -p "$cache/npm"
  # --ignore-scripts: we only want the files; its install script would build its own binaries.
  # --omit=optional: skip the prebuilt platform binaries (hundreds of MB) we do not run.
  npm install --no-audit --no-fund --ignore-scripts --omit=optional --prefix "$cache/npm" \
    "node-llama-cpp@$version" >&2
fi

# 2. the source, from the bundle inside the package
if [ ! -f "$src/CMakeLists.txt" ]; then
  bundle="$pkg/llama/gitRelease.bundle"
  [ -f "$bundle" ] || { log "error: $bundle not found in the npm package"; exit 1; }
  log "cloning $bundle into $src"
  rm -rf "$src"
  git clone --quiet "$bundle" "$src"
fi

# 3. the tools: configure once (Release, Ninja, no network features, no tests), build only
#    the targets we need. Reuses an existing build directory as it is.
targets=(llama-perplexity llama-simple)
missing=()
for t in "${targets[@]}"; do
  [ -x "$build/bin/$t" ] || missing+=("$t")
done
if [ ${#missing[@]} -eq 0 ]; then
  log "reusing $build/bin (${targets[*]})"
  exit 0
fi
if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build"
  # ggml enables ccache by itself when it is installed (GGML_CCACHE).
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >&2
fi
log "building ${missing[*]} with $jobs jobs"
cmake --build "$build" -j "$jobs" --target "${missing[@]}" >&2
for t in "${targets[@]}"; do
  [ -x "$build/bin/$t" ] || { log "error: $build/bin/$t was not built"; exit 1; }
done
log "done: $build/bin"
