#!/usr/bin/env bash
# Installs what the tests need outside the source tree, by package name:
#   - node-llama-cpp@3.21.1 (llama.cpp source bundle, vocabulary GGUFs, tokenizer vectors),
#     and llama.cpp's tools built from that source (the correctness oracle);
#   - the official `openai` and `@anthropic-ai/sdk` npm clients (the server tests talk to
#     polychip through them);
#   - puppeteer-core (drives Debian's chromium, headless, in the chat page's test);
#   - kubernetes-models, typescript, yaml and dockerfile-utils (the deployment examples' checks).
# Everything goes to $POLYCHIP_CACHE (default ~/.cache/polychip); reruns are cheap.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${POLYCHIP_CACHE:-$HOME/.cache/polychip}"
mkdir -p "$cache/npm"

if [ ! -d "$cache/npm/node_modules/openai" ]; then
  echo "[setup] installing the openai npm client into $cache/npm" >&2
  npm install --no-audit --no-fund --prefix "$cache/npm" openai@4 >&2
fi
if [ ! -d "$cache/npm/node_modules/puppeteer-core" ]; then
  echo "[setup] installing puppeteer-core into $cache/npm" >&2
  npm install --no-audit --no-fund --prefix "$cache/npm" puppeteer-core@23 >&2
fi
if [ ! -d "$cache/npm/node_modules/@anthropic-ai/sdk" ]; then
  echo "[setup] installing the @anthropic-ai/sdk npm client into $cache/npm" >&2
  # Its optional zod peer conflicts with the zod puppeteer pins (installed first); the client
  # runs without zod.
  npm install --no-audit --no-fund --legacy-peer-deps --prefix "$cache/npm" \
    @anthropic-ai/sdk@1.16.0 >&2
fi

if [ ! -d "$cache/npm/node_modules/kubernetes-models" ] || [ ! -d "$cache/npm/node_modules/dockerfile-utils" ]; then
  # The deployment examples' checks (tests/deploy): the Kubernetes API's schemas and
  # interfaces (kubernetes-models, compiled with typescript; yaml reads the manifests) and a
  # Dockerfile linter. kubernetes-models asks for node >= 22 and runs on Debian's 18 and 20.
  echo "[setup] installing kubernetes-models, typescript, yaml, dockerfile-utils into $cache/npm" >&2
  # --legacy-peer-deps: npm re-resolves the folder's earlier packages, whose zod peers conflict.
  npm install --no-audit --no-fund --legacy-peer-deps --prefix "$cache/npm" kubernetes-models@5.1.0 \
    typescript@5.9.3 yaml@2.9.1 dockerfile-utils@0.16.3 >&2
fi

"$here/fetch-llama-cpp.sh"
