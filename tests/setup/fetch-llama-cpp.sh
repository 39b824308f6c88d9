#!/usr/bin/env bash
# Fetches the correctness oracle of the model tests: llama.cpp as shipped inside the npm package
# node-llama-cpp@3.21.1 (its source as a git bundle, with the vocabulary GGUFs and tokenizer
# test vectors under models/), and builds the two tools the tests run:
#   llama-perplexity  perplexity with the method polychip perplexity reproduces
#   llama-simple      greedy generation, non-interactive
#   llama-embedding   pooled, normalised embeddings (/v1/embeddings is checked against it)
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
  # --legacy-peer-deps: npm re-resolves the folder's earlier packages (setup-test-deps.sh's
  # clients), whose optional zod peers conflict (openai@4 wants zod 3, @anthropic-ai/sdk takes 4).
  npm install --no-audit --no-fund --ignore-scripts --omit=optional --legacy-peer-deps --prefix "$cache/npm" \
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
#    the targets we need. The CPU's own instruction sets (native), but never AMX: ggml's AMX
#    matmul faults on the Xeon VMs that advertise amx_int8/amx_tile (SIGILL/SIGSEGV on every
#    quantized model), and the oracle must run on every x86-64. GCC lets an explicit -mno-*
#    win over -march=native whatever their order. A cached build configured with other flags
#    is rebuilt from scratch (the flags are recorded in $build/polychip-oracle-flags).
targets=(llama-perplexity llama-simple llama-embedding)
cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
        -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
        "-DCMAKE_C_FLAGS=$cflags" "-DCMAKE_CXX_FLAGS=$cflags")
stamp="$build/polychip-oracle-flags"
if [ -d "$build" ] && [ "$(cat "$stamp" 2>/dev/null)" != "${config[*]}" ]; then
  log "cached build in $build was configured with other flags (or before they were recorded):" \
      "rebuilding it without AMX"
  rm -rf "$build"
fi
missing=()
for t in "${targets[@]}"; do
  [ -x "$build/bin/$t" ] || missing+=("$t")
done
if [ ${#missing[@]} -eq 0 ]; then
  log "reusing $build/bin (${targets[*]})"
  exit 0
fi
if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build (${config[*]})"
  # ggml enables ccache by itself when it is installed (GGML_CCACHE).
  cmake -S "$src" -B "$build" "${config[@]}" >&2
  echo "${config[*]}" >"$stamp"
fi
log "building ${missing[*]} with $jobs jobs"
cmake --build "$build" -j "$jobs" --target "${missing[@]}" >&2
for t in "${targets[@]}"; do
  [ -x "$build/bin/$t" ] || { log "error: $build/bin/$t was not built"; exit 1; }
done
# Prove the build holds no AMX code: the AMX tile instructions would show in a disassembly.
if command -v objdump >/dev/null 2>&1; then
  for lib in "$build"/bin/libggml-cpu*.so "$build"/bin/llama-perplexity; do
    [ -f "$lib" ] || continue
    if objdump -d "$lib" | grep -qE '\b(tdpbssd|tdpbusd|tileloadd|ldtilecfg)\b'; then
      log "error: $lib contains AMX instructions"; exit 1
    fi
  done
fi
log "done: $build/bin"
