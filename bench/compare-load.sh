#!/usr/bin/env bash
# Load time and peak resident memory of the polychip cpu backend against llama.cpp on the same
# GGUF files, measured back to back, with a warm page cache and (by default) a cold one. Prints
# one markdown table (stdout; progress on stderr):
#   model | page cache | load s (polychip, llama.cpp) | ratio | peak RSS / (file + KV cache)
#
# polychip: `polychip bench -p 0 -n N -r 1 -t T` ("loaded in": plugin, file, tokenizer, weights,
# KV cache and workspace; its log line also gives the KV cache bytes). llama.cpp: `llama-simple
# -n N` (its "load time": model file, vocabulary, tensors and repacking; the KV size from its
# "llama_kv_cache: size" line). Peak RSS from /usr/bin/time. Each cell is the median of -r runs.
# A cold run first evicts the file from the page cache (dd iflag=nocache: no root needed).
#
# usage: bench/compare-load.sh [-t THREADS] [-r REPS] [-n N_GEN] [--warm-only]
#                              [--models "qwen05-q4_0 qwen05-q8_0"]
# env:   POLYCHIP_BUILD_DIR (default: build), POLYCHIP_LLAMA_CPP_DIR (default:
#        /root/.cache/polychip/llama.cpp), POLYCHIP_BENCH_CACHE (models, as compare-cpu.sh
#        synthesizes them; default ~/.cache/polychip/bench-models)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 REPS=3 NG=16 COLD=1
MODELS="qwen05-q4_0 qwen05-q8_0"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    --warm-only) COLD=0; shift ;;
    --models) MODELS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[compare-load] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
[[ -x "$LB/llama-simple" ]] || { echo "missing $LB/llama-simple" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "missing /usr/bin/time (GNU time)" >&2; exit 1; }
export LD_LIBRARY_PATH="$LB:${LD_LIBRARY_PATH:-}"
export POLYCHIP_DEVICE_BACKEND="${POLYCHIP_DEVICE_BACKEND:-cpu}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

evict() { dd if="$1" iflag=nocache count=0 status=none; }
warm() { cat "$1" > /dev/null; }

# One run of each tool; appends "load_s rss_kb kv_bytes" to $OUT/<model>.<cache>.<tool>.
run_ours() {
  local f="$1" dst="$2" err="$OUT/ours.err"
  /usr/bin/time -f "RSS_KB %M" "$PC" bench --model-path "$f" -p 0 -n "$NG" -r 1 -t "$THREADS" \
    > /dev/null 2> "$err" || { cat "$err" >&2; return 1; }
  local load kv rss
  load=$(grep -o 'loaded in [0-9.]* s' "$err" | awk '{print $3}')
  kv=$(grep -o '[0-9]* bytes of KV cache' "$err" | awk '{print $1}')
  rss=$(awk '/^RSS_KB/ {print $2}' "$err")
  echo "$load $rss $kv" >> "$dst"
}
run_theirs() {
  local f="$1" dst="$2" err="$OUT/theirs.err"
  /usr/bin/time -f "RSS_KB %M" "$LB/llama-simple" -m "$f" -n "$NG" "hi" \
    > /dev/null 2> "$err" || { cat "$err" >&2; return 1; }
  local load kv rss
  load=$(awk '/load time =/ {print $(NF-1) / 1000}' "$err")
  kv=$(sed -n 's/.*llama_kv_cache: size = *\([0-9.]*\) MiB.*/\1/p' "$err" | head -1)
  kv=$(awk -v m="$kv" 'BEGIN {printf "%d", m * 1048576}')
  rss=$(awk '/^RSS_KB/ {print $2}' "$err")
  echo "$load $rss $kv" >> "$dst"
}

caches="warm"
[[ $COLD == 1 ]] && caches="warm cold"
for m in $MODELS; do
  f="$CACHE/$m.gguf"
  [[ -f "$f" ]] || { echo "missing $f (bench/compare-cpu.sh synthesizes it)" >&2; exit 1; }
  stat -c %s "$f" > "$OUT/$m.size"
  for c in $caches; do
    log "$m, $c page cache: $REPS x (polychip, llama.cpp)"
    for ((i = 0; i < REPS; i++)); do
      if [[ $c == cold ]]; then evict "$f"; else warm "$f"; fi
      run_ours "$f" "$OUT/$m.$c.ours"
      if [[ $c == cold ]]; then evict "$f"; else warm "$f"; fi
      run_theirs "$f" "$OUT/$m.$c.theirs"
    done
  done
done

python3 - "$OUT" "$MODELS" "$caches" "$THREADS" "$NG" <<'PY'
import statistics, sys
out, models, caches, threads, ng = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4], sys.argv[5]
def rows(path):
    with open(path) as f:
        return [tuple(float(x) for x in line.split()) for line in f if line.strip()]
print(f"polychip bench -p 0 -n {ng} -t {threads} vs llama-simple -n {ng}; medians\n")
print("| model | page cache | load s polychip | load s llama.cpp | ratio | "
      "peak RSS / (file + KV) polychip | peak RSS / (file + KV) llama.cpp |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for m in models:
    size = int(open(f"{out}/{m}.size").read())
    for c in caches:
        cells = []
        for tool in ("ours", "theirs"):
            r = rows(f"{out}/{m}.{c}.{tool}")
            load = statistics.median(x[0] for x in r)
            rss = statistics.median(x[1] for x in r) * 1024
            kv = r[0][2]
            cells.append((load, rss, kv))
        (lo, ro, ko), (lt, rt, kt) = cells
        def mem(rss, kv):
            return f"{rss / (size + kv):.3f} ({rss / 2**20:.0f} MiB / ({size / 2**20:.0f} + {kv / 2**20:.1f}) MiB)"
        print(f"| {m} | {c} | {lo:.3f} | {lt:.3f} | {lo / lt:.2f}x | {mem(ro, ko)} | {mem(rt, kt)} |")
PY
