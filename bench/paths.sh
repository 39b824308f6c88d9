# Where the comparison scripts find things; sourced by bench/compare-*.sh after `set -euo pipefail`.
#   POLYCHIP_BUILD_DIR      build directory (default: <repo>/build)
#   POLYCHIP_LLAMA_CPP_DIR  llama.cpp from tests/setup/fetch-llama-cpp.sh (build/bin tools, models/
#                           vocabulary GGUFs; default ~/.cache/polychip/llama.cpp)
#   POLYCHIP_BENCH_CACHE    synthesized benchmark models (default ~/.cache/polychip/bench-models)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${POLYCHIP_BUILD_DIR:-$ROOT/build}"
PC="$BUILD/bin/polychip"
LLAMA_DIR="${POLYCHIP_LLAMA_CPP_DIR:-$HOME/.cache/polychip/llama.cpp}"
LB="$LLAMA_DIR/build/bin"
VOCAB="$LLAMA_DIR/models"
CACHE="${POLYCHIP_BENCH_CACHE:-$HOME/.cache/polychip/bench-models}"

# Builds llama.cpp's tool NAME into $LB when it is missing there and the oracle's build is
# configured: tests/setup/fetch-llama-cpp.sh makes only the tools the tests run, the others are
# more targets of the same configuration.
llama_tool() {  # NAME
  if [[ ! -x "$LB/$1" && -f "$LLAMA_DIR/build/build.ninja" ]]; then
    echo "[bench] building $1 in $LLAMA_DIR/build (the oracle's configuration)" >&2
    cmake --build "$LLAMA_DIR/build" -j "${POLYCHIP_BUILD_JOBS:-1}" --target "$1" >&2
  fi
}

# The cpu plugin's static kernel library, which bench/decode_kernels.cc links against.
KERNELS_LIB="$BUILD/lib/libpolychip_cpu_kernels.a"
# Builds bench/decode_kernels.cc into OUTPUT (bench/decode-kernels.sh, bench/lora.sh).
build_decode_kernels() {  # OUTPUT
  c++ -std=c++20 -O2 -I "$ROOT/plugins/backends/cpu" -I "$ROOT/include" \
    "$ROOT/bench/decode_kernels.cc" "$KERNELS_LIB" "$BUILD/lib/libpolychip_sdk.a" -pthread -o "$1"
}
