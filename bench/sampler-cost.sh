#!/usr/bin/env bash
# The sampler's time per token on qwen2's vocabulary (151,936 tokens), free and under the
# constraints of bench/structured-outputs.sh, masks cached: the host-side cost a grammar adds to
# each constrained sequence of a decode step. Builds bench/sampler_cost.cc against the static
# libraries of the build directory and prints one markdown table.
# usage: bench/sampler-cost.sh
# env:   POLYCHIP_BUILD_DIR, POLYCHIP_LLAMA_CPP_DIR (bench/paths.sh)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
L="$BUILD/lib"
[[ -f "$L/libpolychip_engine.a" ]] || { echo "missing $L/libpolychip_engine.a (build first)" >&2; exit 1; }
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
c++ -std=gnu++20 -O2 -DFMT_SHARED -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB \
  -I"$ROOT/src" -I"$BUILD/generated/op_list" "$ROOT/bench/sampler_cost.cc" -o "$OUT/sampler_cost" \
  "$L/libpolychip_engine.a" "$L/libpolychip_grammar.a" "$L/libpolychip_model.a" \
  "$L/libpolychip_runtime.a" "$L/libpolychip_sdk.a" "$L/libpolychip_util.a" \
  -lspdlog -lfmt -lpcre2-8 -lyaml-cpp -ldl -lpthread
echo "[sampler-cost] $(uptime)" >&2
"$OUT/sampler_cost" "$VOCAB/ggml-vocab-qwen2.gguf"
