#!/usr/bin/env bash
# Installs the Debian 12 packages that `make run` and `make test` need. The README and .ci/run
# both call this script, so the two can never drift apart. Every package a feature adds goes in
# the list below.
#
# Node.js: Debian's `nodejs` comes without npm (package `npm`), NodeSource's `nodejs` bundles npm
# and conflicts with Debian's `npm`. So nodejs/npm are asked for only when `npm` is missing, and
# then both from the same place (Debian): an existing Node.js install is never touched.
#
# Usage: scripts/install-deps.sh [--dry-run]   (as root, or through sudo)
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build ccache pkg-config git curl python3
  # libraries of the framework
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libpcre2-dev
  # HTTP: the server's event-driven transport and bench-serving's client (Boost.Beast/Asio,
  # header-only)
  libboost-dev
  # the tests' independent HTTP client (not linked by the product)
  libcpp-httplib-dev
  # MPI comm plugin (and mpirun for its tests)
  libopenmpi-dev openmpi-bin
  # Gloo comm plugin (TCP collectives for --nnodes launches without mpirun); iproute2 for the
  # two-host tests (network namespaces)
  libgloo-dev iproute2
  # tests (chromium: the chat page at / is tested in a headless browser)
  libgtest-dev libgmock-dev chromium
  # the Jinja engine's reference: chat templates rendered by Python's jinja2 (tests/jinja)
  python3-jinja2
  # Vulkan device plugin: loader + headers, GLSL->SPIR-V compiler, Mesa's lavapipe (a CPU Vulkan
  # driver, so its tests run without a GPU) and vulkaninfo for diagnosis
  libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools
  # the deployment examples' checks (tests/deploy): systemd-analyze verify on the unit;
  # objdump (binutils) reads what the binary and plugins link, for the Dockerfile's packages
  systemd binutils
  # fuzzing: the libFuzzer targets of tests/fuzz (`make fuzz`, and a short run in `make test`);
  # libFuzzer and the sanitizer runtimes are in libclang-rt, only a recommendation of clang
  clang libclang-rt-14-dev
)

log() { echo "[install-deps] $*"; }

dry_run=0
[ "${1:-}" = "--dry-run" ] && dry_run=1

if command -v npm >/dev/null 2>&1; then
  log "npm found ($(command -v npm), $(npm --version 2>/dev/null || echo '?')): nodejs/npm left as they are"
else
  log "npm not found: adding Debian's nodejs and npm"
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  log "all ${#packages[@]} packages already installed"
  exit 0
fi
log "installing ${#missing[@]} of ${#packages[@]} packages: ${missing[*]}"
[ $dry_run -eq 1 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { log "error: run as root or install sudo"; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${missing[@]}"
log "done"
