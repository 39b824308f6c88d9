#!/usr/bin/env bash
# Throughput at concurrency C (default 16) with speculative decoding on and off: the same
# `polychip serve` (the bundled model, the same threads, context and KV size), once plain and
# once with the trained draft (models/polychip-tiny-draft.gguf), driven by the same
# `polychip bench-serving` load, alternated for R rounds. With more decoding sequences than
# --speculative-disable-batch-size (4) a step runs without speculation, so the two should be
# within noise of each other (the issue's bound: 5%). Prints a markdown table with each round's
# output tokens/s, the median ratio, and the speculating server's counters over its runs.
#   usage: bench/speculative-concurrency.sh [-c CONC] [-n PROMPTS] [-r ROUNDS] [-t THREADS]
#          [--model M] [--draft D] [--in IN] [--out OUT]
#   env: POLYCHIP_BUILD_DIR (bench/paths.sh)
set -euo pipefail
source "$(dirname "$0")/paths.sh"
CONC=16 PROMPTS=64 ROUNDS=2 THREADS=2 IN=64 OUT=128
MODEL="$ROOT/models/polychip-tiny.gguf" DRAFT="$ROOT/models/polychip-tiny-draft.gguf"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -c) CONC="$2"; shift 2 ;;
    -n) PROMPTS="$2"; shift 2 ;;
    -r) ROUNDS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --draft) DRAFT="$2"; shift 2 ;;
    --in) IN="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[speculative-concurrency] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
OUTDIR="$(mktemp -d)"
PORT=${PORT:-30741}
SERVER=""
cleanup() { [[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null || true; rm -rf "$OUTDIR"; }
trap cleanup EXIT
CTX=$((IN + OUT + 32))

serve() {  # name [flags]
  local name="$1"; shift
  "$PC" serve --model-path "$MODEL" --device cpu:0 --threads "$THREADS" --port "$PORT" \
    --context-length "$CTX" --max-total-tokens $((CTX * CONC * 2)) \
    --max-running-requests "$CONC" "$@" >"$OUTDIR/$name.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER" 2>/dev/null || { cat "$OUTDIR/$name.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "the server did not come up" >&2; exit 1
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""; }
load() {  # name round
  "$PC" bench-serving --base-url "http://127.0.0.1:$PORT" --backend openai \
    --num-prompts "$PROMPTS" --max-concurrency "$CONC" --random-input-len "$IN" \
    --random-output-len "$OUT" --seed "$2" --output-json "$OUTDIR/$1-$2.json" >/dev/null
}
for r in $(seq "$ROUNDS"); do
  log "round $r/$ROUNDS: without speculation"
  serve plain
  load plain "$r"
  stop
  log "round $r/$ROUNDS: with the draft"
  serve spec --speculative-draft-model "$DRAFT"
  load spec "$r"
  curl -sf "http://127.0.0.1:$PORT/metrics" | grep '^polychip_spec_' >"$OUTDIR/metrics-$r.txt" || true
  stop
done

echo "$(basename "$MODEL"), draft $(basename "$DRAFT"), $THREADS threads, concurrency $CONC," \
  "$PROMPTS prompts of ~$IN tokens, $OUT tokens each; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$OUTDIR" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| round | output tok/s, plain | output tok/s, speculative | ratio | spec. steps skipped | verification steps |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
ratios = []
for r in range(1, rounds + 1):
    a = json.load(open(f"{out}/plain-{r}.json"))["output_token_throughput"]
    b = json.load(open(f"{out}/spec-{r}.json"))["output_token_throughput"]
    m = {}
    for line in open(f"{out}/metrics-{r}.txt"):
        k, v = line.split()[:2]
        m[k] = float(v)
    ratios.append(b / a)
    print(f"| {r} | {a:.1f} | {b:.1f} | {b / a:.3f} | "
          f"{m.get('polychip_spec_skipped_steps_total', 0):.0f} | "
          f"{m.get('polychip_spec_verify_steps_total', 0):.0f} |")
print(f"\nmedian ratio (speculative / plain): {statistics.median(ratios):.3f}")
PY
