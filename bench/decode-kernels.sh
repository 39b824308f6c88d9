#!/usr/bin/env bash
# The cpu plugin's decode kernels without the rest of the engine (bench/decode_kernels.cc, built
# here against the build's static kernel library): a qwen2.5-0.5b Q4_K_M decode step's 169
# matmuls (m = 1), in rounds that alternate the settings below, against this machine's read
# bandwidth (bench/membw.c, probed in every round); then the default settings' step alternated
# with a plain read of the same weights, per weight shape; three streams against one, and one
# without prefetch against one with, per ISA (alternated in one process); each dtype's kernel
# from L2 (compute speed without DRAM in the way); a LoRA adapter's launches in the step (rank
# 16 and 64, beside the step without them); then one layer's decode attention.
#   settings: auto,small pages        (the default: the tuner's choice, streams_tuner.h)
#             streams=1,small pages   (one sequential read per thread, 4 KiB pages)
#             streams=1 without prefetch
#             streams=2,small pages   (two runs in lockstep: the default until session 9)
#             streams=3,small pages   (three: the default of sessions 9-10)
#             streams=3,huge pages    (POLYCHIP_CPU_HUGE_PAGES=on as well)
# usage: bench/decode-kernels.sh [-r ROUNDS] [-t THREADS]   env: POLYCHIP_BUILD_DIR
set -euo pipefail
source "$(dirname "$0")/paths.sh"
ROUNDS=5 THREADS=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r) ROUNDS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -f "$KERNELS_LIB" ]] || { echo "missing $KERNELS_LIB (build first: cmake --build $BUILD --target polychip_cpu_kernels polychip_sdk)" >&2; exit 1; }
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
echo "[decode-kernels] building bench/decode_kernels.cc and bench/membw.c" >&2
build_decode_kernels "$OUT/decode_kernels"
cc -O3 -march=native -pthread "$ROOT/bench/membw.c" -o "$OUT/membw"
export THREADS
SETTINGS=("POLYCHIP_CPU_WEIGHT_STREAMS=auto POLYCHIP_CPU_HUGE_PAGES=off"
          "POLYCHIP_CPU_WEIGHT_STREAMS=1 POLYCHIP_CPU_HUGE_PAGES=off"
          "POLYCHIP_CPU_WEIGHT_STREAMS=1 POLYCHIP_CPU_WEIGHT_PREFETCH=off POLYCHIP_CPU_HUGE_PAGES=off"
          "POLYCHIP_CPU_WEIGHT_STREAMS=2 POLYCHIP_CPU_HUGE_PAGES=off"
          "POLYCHIP_CPU_WEIGHT_STREAMS=3 POLYCHIP_CPU_HUGE_PAGES=off"
          "POLYCHIP_CPU_WEIGHT_STREAMS=3 POLYCHIP_CPU_HUGE_PAGES=on")
NAMES=("auto (the tuner's choice),small pages" "streams=1,small pages"
       "streams=1 without prefetch,small pages" "streams=2,small pages" "streams=3,small pages"
       "streams=3,huge pages")
for r in $(seq "$ROUNDS"); do
  echo "[decode-kernels] round $r/$ROUNDS" >&2
  "$OUT/membw" "$THREADS" 2>/dev/null >> "$OUT/membw.txt"; echo >> "$OUT/membw.txt"
  for i in "${!SETTINGS[@]}"; do
    env ${SETTINGS[$i]} "$OUT/decode_kernels" matmul 10 | sed -n 's/.*, \([0-9.]*\) GB\/s$/\1/p' >> "$OUT/s$i.txt"
  done
done
python3 - "$OUT" "$THREADS" "${NAMES[@]}" <<'PY'
import statistics, sys
out, threads, names = sys.argv[1], sys.argv[2], sys.argv[3:]
bw = [float(x) for x in open(f"{out}/membw.txt").read().split()]
mbw = statistics.median(bw)
print(f"Read bandwidth ({threads} threads, bench/membw.c, one probe per round): median {mbw:.1f} GB/s "
      f"({min(bw):.1f}-{max(bw):.1f})\n")
print("| decode matmuls (qwen2.5-0.5b Q4_K_M step, 169 calls) | median GB/s (lowest-highest) | % of the median bandwidth |")
print("| --- | ---: | ---: |")
for i, n in enumerate(names):
    v = [float(x) for x in open(f"{out}/s{i}.txt").read().split()]
    print(f"| {n} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) | {100 * statistics.median(v) / mbw:.0f}% |")
PY
echo
echo "The default settings' step alternated with a plain read of the same weights (decode_kernels"
echo "matmul-vs-read: the kernels' speed beside what a read alone reaches at the same moments):"
echo
"$OUT/decode_kernels" matmul-vs-read 20 | sed 's/^/    /'
echo
echo "Three weight streams against one, and one without software prefetch against one with,"
echo "alternated step by step in one process (decode_kernels matmul-streams), for each ISA's"
echo "kernel table this CPU runs:"
echo
for isa in avx512 avx2; do
  for pair in "1 3" "1 1n"; do
    POLYCHIP_CPU_ISA=$isa "$OUT/decode_kernels" matmul-streams $pair 30 2>/dev/null | sed "s/^/    $isa: /" || true
  done
done
echo
echo "Each dtype's kernel on a matrix that stays in L2 (decode_kernels matmul-hot, one thread: with"
echo "two, a call this short is mostly the fork-join): the GB/s of weights one core can consume when"
echo "DRAM is not the limit, beside each core's share of the bandwidth above."
echo
THREADS=1 "$OUT/decode_kernels" matmul-hot 20 | sed 's/^/    /'
echo
echo "A LoRA adapter's LORA launches (F16, rank 16 and 64) interleaved with the step's matmuls,"
echo "alternated with the step alone (decode_kernels lora): the adapter's share of a decode step;"
echo "and a plain read of the same bytes in the launches' places, what reading them costs alone."
echo
for rank in 16 64; do
  RANK=$rank "$OUT/decode_kernels" lora 20 | sed 's/^/    /'
done
echo
echo "| decode attention, one layer (F16 cache, 2 KV heads of 64, 14 query heads) | median |"
echo "| --- | ---: |"
for len in 64 1024 4096; do
  "$OUT/decode_kernels" attention "$len" 14 | sed -n 's/attention: \([0-9]*\) positions.*median \([0-9.]*\) us.*/| \1 positions | \2 us |/p'
done
