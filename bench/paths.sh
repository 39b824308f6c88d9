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
