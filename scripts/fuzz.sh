#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (-fsanitize=fuzzer,address,undefined) in
# their own build directory and runs each for a set time on its seed corpus (tests/fuzz/corpus/
# <target>/; what a run discovers goes to <build-dir>/corpus/<target>/, a crashing input to
# <build-dir>/crashes/<target>/). `make fuzz` and the ctest test fuzz_smoke call this.
#
# Usage: scripts/fuzz.sh [--build-dir DIR] [--seconds N] [--jobs N] [TARGET...]
#   TARGET: gguf api tokenizer chat_template jinja (default: all). FUZZ_JOBS: build jobs when --jobs
#   is not given (default: nproc). POLYCHIP_FUZZ_VOCAB: the GGUF whose
#   vocabulary the tokenizer and api targets use (default: the bundled model).
# Exit status: 0 no crash, 1 a target crashed (or failed to build), 77 clang++ is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
src_dir=$PWD

build_dir=build-fuzz
seconds=60
jobs=${FUZZ_JOBS:-$(nproc)}
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=(gguf api tokenizer chat_template jinja)

if ! command -v clang++ >/dev/null 2>&1 || ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: skipped: clang/clang++ not installed (scripts/install-deps.sh installs them)"
  exit 77
fi

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S "$src_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DPOLYCHIP_FUZZ=ON >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" --target fuzz_all

failed=()
for t in "${targets[@]}"; do
  bin="$build_dir/bin/fuzz_$t"
  [ -x "$bin" ] || bin="$build_dir/tests/fuzz/fuzz_$t"
  corpus="$build_dir/corpus/$t"
  crashes="$build_dir/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  max_len=4096
  [ "$t" = gguf ] && max_len=65536
  log="$build_dir/fuzz-$t.log"
  echo "fuzz: $t for ${seconds} s"
  set +e
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=$max_len \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "tests/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc, ${runs:-?} runs); the input is in $crashes/, the log $log:"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written|deadly signal|==[0-9]+==" "$log" | head -20
  else
    echo "fuzz: $t ok: ${runs:-?} runs in ${seconds} s, corpus $(ls "$corpus" | wc -l) inputs"
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: crashes in: ${failed[*]}"; exit 1; }
