#!/usr/bin/env bash
# The cost of the per-op counters in a decode step: the counting cost of one launch (two clock
# reads, OpWorkOf, Record; bench/op-counters-cost.cc) times the launches of a decode step (from
# the counters themselves, `polychip bench -o json`), against the step's time; then the step
# timed with counters on and off (POLYCHIP_OP_COUNTERS), alternating, median of each.
#   bench/op-counters-overhead.sh [BUILD_DIR]   env: MODEL (default models/polychip-tiny.gguf)
#        THREADS=2 N=64 REPS=10 ROUNDS=3
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
PC=$BUILD/bin/polychip
MODEL=${MODEL:-$ROOT/models/polychip-tiny.gguf}
THREADS=${THREADS:-2}; N=${N:-64}; REPS=${REPS:-10}; ROUNDS=${ROUNDS:-3}
OUTDIR=$(mktemp -d)
c++ -std=c++20 -O2 -I "$ROOT/include" "$ROOT/bench/op-counters-cost.cc" "$ROOT/sdk/quant.cc" \
  -o "$OUTDIR/cost"
"$OUTDIR/cost" | tee "$OUTDIR/cost.txt"
for round in $(seq 1 "$ROUNDS"); do
  for c in on off; do
    POLYCHIP_OP_COUNTERS=$c "$PC" bench --device cpu:0 -t "$THREADS" --model-path "$MODEL" \
      -p 0 -n "$N" -r "$REPS" -o json 2>/dev/null >"$OUTDIR/$c-$round.json"
  done
done
python3 - "$OUTDIR" "$ROUNDS" "$(basename "$MODEL")" <<'PY'
import json, re, statistics, sys
d, rounds, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cost = open(f"{d}/cost.txt").read()
per_launch = max(float(x) for x in re.findall(r"([0-9.]+) ns per launch", cost))
read = float(re.search(r"op_counters_read ([0-9.]+) ns", cost).group(1))
runs = {c: [json.load(open(f"{d}/{c}-{r}.json"))[0] for r in range(1, rounds + 1)]
        for c in ("on", "off")}
on = runs["on"][0]
launches = sum(op["calls"] for op in on["ops_per_step"])
step_ns = statistics.median(r["avg_ns"] for r in runs["off"]) / on["n_gen"]
counted = launches * per_launch + 2 * read  # the runner reads the counters twice a step
print(f"{model}: {launches:.0f} launches per decode step, step {step_ns / 1e3:.1f} us (counters off)")
print(f"counting: {per_launch:.0f} ns per launch + 2 reads of {read:.0f} ns = "
      f"{counted / 1e3:.1f} us per step = {100 * counted / step_ns:.2f}% of the step")
for c in ("on", "off"):
    ts = [s for r in runs[c] for s in r["samples_ts"]]
    print(f"counters {c:3}: median {statistics.median(ts):.1f} t/s over {len(ts)} timed runs")
PY
