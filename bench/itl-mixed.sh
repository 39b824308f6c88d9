#!/usr/bin/env bash
# Inter-token latency of running streams when long prompts arrive, with the fixed
# --chunked-prefill-size and with --max-itl-ms (prefill chunks sized from the learned step
# costs). Two `polychip bench-serving` loads against one `polychip serve` at a time: STREAMS
# steady decoding streams (short prompts, OUT tokens each) and, a second later, LONG_N prompts
# of LONG tokens (1 output token) at LONG_RATE per second. Prints p50/p99 ITL of the streams,
# their token throughput, the long prompts' TTFT and the total token throughput, as a table.
# Long: not part of the tests.
#   bench/itl-mixed.sh [BUILD_DIR]
#   env: MODEL (default: a synthesized qwen2.5-0.5b Q4_0), THREADS=2 STREAMS=4 OUT=160
#        LONG=1024 LONG_N=4 LONG_RATE=0.5 CHUNK=512 (the fixed chunk, and the ceiling with the
#        target) ITL_MS (default: 2 x the decode-only step, measured first)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
PC=$BUILD/bin/polychip
VOCAB=${VOCAB:-$HOME/.cache/polychip/llama.cpp/models/ggml-vocab-qwen2.gguf}
MODEL=${MODEL:-$HOME/.cache/polychip/models/qwen2.5-0.5b-q4_0.gguf}
THREADS=${THREADS:-2}; STREAMS=${STREAMS:-4}; OUT=${OUT:-160}
LONG=${LONG:-1024}; LONG_N=${LONG_N:-4}; LONG_RATE=${LONG_RATE:-0.5}; CHUNK=${CHUNK:-512}
ITL_MS=${ITL_MS:-}
PORT=${PORT:-30741}
CTX=$((LONG + OUT + 64))
OUTDIR=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT

[ -x "$PC" ] || { echo "build polychip first ($PC)"; exit 1; }
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  "$PC" gguf synth --vocab "$VOCAB" --shape qwen2.5-0.5b --type Q4_0 --out "$MODEL" -q
fi

serve() {  # extra flags...
  "$PC" serve --model-path "$MODEL" --device cpu:0 --threads "$THREADS" --port "$PORT" \
    --context-length "$CTX" --max-total-tokens $((CTX * (STREAMS + LONG_N) + CTX)) \
    --max-running-requests $((STREAMS + LONG_N)) --chunked-prefill-size "$CHUNK" \
    --disable-radix-cache "$@" >"$OUTDIR/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server did not come up:"; cat "$OUTDIR/serve.log"; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }
load() {  # name seed num concurrency rate in out
  "$PC" bench-serving --base-url "http://127.0.0.1:$PORT" --backend openai --seed "$2" \
    --num-prompts "$3" --max-concurrency "$4" --request-rate "$5" --random-input-len "$6" \
    --random-output-len "$7" --output-json "$OUTDIR/$1.json" >/dev/null
}

# The decode-only step, for the default target: the streams alone.
if [ -z "$ITL_MS" ]; then
  serve
  load calibrate 9 "$STREAMS" "$STREAMS" inf 16 32
  stop
  ITL_MS=$(python3 -c "import json; print(round(2 * json.load(open('$OUTDIR/calibrate.json'))['p50_itl_ms'], 1))")
fi

for mode in fixed target; do
  if [ "$mode" = fixed ]; then serve; else serve --max-itl-ms "$ITL_MS"; fi
  load "$mode-streams" 1 "$STREAMS" "$STREAMS" inf 16 "$OUT" &
  streams=$!
  sleep 1
  load "$mode-long" 2 "$LONG_N" "$LONG_N" "$LONG_RATE" "$LONG" 1
  wait "$streams"
  stop
done

echo "$STREAMS streams (16 in, $OUT out) + $LONG_N prompts of $LONG tokens at $LONG_RATE/s;" \
     "cpu, $THREADS threads, $(basename "$MODEL")"
python3 - "$OUTDIR" "$CHUNK" "$ITL_MS" <<'PY'
import json, sys
d, chunk, itl = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for mode, label in [("fixed", f"--chunked-prefill-size {chunk}"),
                    ("target", f"--max-itl-ms {itl} (ceiling {chunk})")]:
    s = json.load(open(f"{d}/{mode}-streams.json"))
    l = json.load(open(f"{d}/{mode}-long.json"))
    span = max(s["duration_s"], l["duration_s"] + 1)
    tokens = (s["total_input_tokens"] + s["total_output_tokens"] + l["total_input_tokens"] +
              l["total_output_tokens"])
    rows.append((label, s["p50_itl_ms"], s["p99_itl_ms"], s["output_token_throughput"],
                 l["p50_ttft_ms"], tokens / span, s["failed"] + l["failed"]))
print("| mode | streams p50 ITL ms | streams p99 ITL ms | streams out tok/s |"
      " long p50 TTFT ms | total tok/s | failed |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.2f} | {r[4]:.0f} | {r[5]:.1f} | {r[6]} |")
PY
