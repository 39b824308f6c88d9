#!/usr/bin/env bash
# Serving comparison: polychip serve vs llama-server on the same synthesized model (qwen2.5-0.5b
# shape, Q4_0), the same threads and the same per-sequence context, driven by the same
# `polychip bench-serving` load. Prints both results side by side. Long: not part of the tests.
#   bench/compare-serving.sh [BUILD_DIR]   env: THREADS=2 PROMPTS=64 CONC=16 IN=128 OUT=128
# Then, unless PREFIX=0: polychip alone with a shared PREFIX-token system prompt (default 512)
# before IN own tokens, with and without --disable-radix-cache (TTFT is what the cache buys).
#   env: PREFIX=512 PREFIX_PROMPTS=64 PREFIX_OUT=128 PREFIX_RATE=1 SKIP_MAIN=1 (prefix only)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
PC=$BUILD/bin/polychip
LLAMA=${LLAMA_SERVER:-/root/.cache/polychip/llama.cpp/build/bin/llama-server}
VOCAB=/root/.cache/polychip/llama.cpp/models/ggml-vocab-qwen2.gguf
MODEL=${MODEL:-$HOME/.cache/polychip/models/qwen2.5-0.5b-q4_0.gguf}
THREADS=${THREADS:-2}; PROMPTS=${PROMPTS:-64}; CONC=${CONC:-16}; IN=${IN:-128}; OUT=${OUT:-128}
PREFIX=${PREFIX:-512}; PREFIX_PROMPTS=${PREFIX_PROMPTS:-64}; PREFIX_OUT=${PREFIX_OUT:-128}
PREFIX_RATE=${PREFIX_RATE:-1}  # requests/s (Poisson arrivals, a rate both modes sustain), or inf: all at once
SKIP_MAIN=${SKIP_MAIN:-0}
CTX=$((IN + OUT + 64))          # per-sequence context, the same for both servers
PC_PORT=${PC_PORT:-30731}; LL_PORT=${LL_PORT:-30732}
OUTDIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

[ -x "$PC" ] || { echo "build polychip first ($PC)"; exit 1; }
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  "$PC" gguf synth --vocab "$VOCAB" --shape qwen2.5-0.5b --type Q4_0 --out "$MODEL" -q
fi

wait_ready() {  # url
  for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "server at $1 did not come up"; return 1
}

if [ "$SKIP_MAIN" != 1 ]; then
"$PC" serve --model-path "$MODEL" --device cpu:0 --threads "$THREADS" --port "$PC_PORT" \
  --context-length "$CTX" --max-total-tokens $((CTX * CONC * 2)) \
  --max-running-requests "$CONC" >"$OUTDIR/polychip.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$PC_PORT"
"$PC" bench-serving --base-url "http://127.0.0.1:$PC_PORT" --backend openai \
  --num-prompts "$PROMPTS" --max-concurrency "$CONC" --random-input-len "$IN" \
  --random-output-len "$OUT" --seed 1 --output-json "$OUTDIR/polychip.json" >/dev/null || true
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true

if [ -x "$LLAMA" ]; then
  "$LLAMA" -m "$MODEL" --host 127.0.0.1 --port "$LL_PORT" -t "$THREADS" --parallel "$CONC" \
    -c $((CTX * CONC)) >"$OUTDIR/llama.log" 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$LL_PORT"
  "$PC" bench-serving --base-url "http://127.0.0.1:$LL_PORT" --backend openai \
    --num-prompts "$PROMPTS" --max-concurrency "$CONC" --random-input-len "$IN" \
    --random-output-len "$OUT" --seed 1 --output-json "$OUTDIR/llama.json" >/dev/null || true
else
  echo "llama-server not found at $LLAMA: polychip only"
  echo '{}' >"$OUTDIR/llama.json"
fi

python3 - "$OUTDIR/polychip.json" "$OUTDIR/llama.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
rows = ["completed", "failed", "request_throughput", "output_token_throughput",
        "streamed_token_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms",
        "p50_itl_ms", "p99_itl_ms", "p50_e2e_ms", "p99_e2e_ms"]
print(f"{'metric':28} {'polychip':>12} {'llama-server':>14}")
for r in rows:
    f = lambda d: (f"{d[r]:.2f}" if isinstance(d.get(r), float) else str(d.get(r, '-')))
    print(f"{r:28} {f(a):>12} {f(b):>14}")
# output_token_throughput counts completed requests (as sglang.bench_serving does);
# streamed_token_throughput also counts what failed streams delivered before failing.
for r in ["output_token_throughput", "streamed_token_throughput"]:
    if a.get(r) and b.get(r):
        print(f"{r + ' ratio':28} {a[r] / b[r]:>12.2f}x")
PY
fi

# Shared system prompt: the same polychip server settings, radix cache on vs off.
if [ "$PREFIX" -gt 0 ]; then
  PCTX=$((PREFIX + IN + PREFIX_OUT + 64))
  for mode in cache nocache; do
    flag=(); [ "$mode" = nocache ] && flag=(--disable-radix-cache)
    "$PC" serve --model-path "$MODEL" --device cpu:0 --threads "$THREADS" --port "$PC_PORT" \
      --context-length "$PCTX" --max-total-tokens $((PCTX * CONC * 2)) \
      --max-running-requests "$CONC" "${flag[@]}" >"$OUTDIR/prefix-$mode.log" 2>&1 &
    pid=$!; PIDS+=($pid)
    wait_ready "http://127.0.0.1:$PC_PORT"
    "$PC" bench-serving --base-url "http://127.0.0.1:$PC_PORT" --backend openai \
      --num-prompts "$PREFIX_PROMPTS" --max-concurrency "$CONC" \
      --random-input-len $((PREFIX + IN)) --shared-prefix-len "$PREFIX" \
      --random-output-len "$PREFIX_OUT" --seed 2 --request-rate "$PREFIX_RATE" \
      --output-json "$OUTDIR/prefix-$mode.json" >/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
  echo
  echo "shared ${PREFIX}-token prefix + ${IN} own tokens, ${PREFIX_OUT} out, ${PREFIX_PROMPTS} prompts, concurrency $CONC, request rate $PREFIX_RATE/s"
  python3 - "$OUTDIR/prefix-cache.json" "$OUTDIR/prefix-nocache.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
rows = ["completed", "failed", "p50_ttft_ms", "p99_ttft_ms", "output_token_throughput",
        "p50_e2e_ms"]
print(f"{'metric':28} {'radix cache':>12} {'no cache':>12}")
for r in rows:
    f = lambda d: (f"{d[r]:.2f}" if isinstance(d.get(r), float) else str(d.get(r, '-')))
    print(f"{r:28} {f(a):>12} {f(b):>12}")
if a.get("p50_ttft_ms") and b.get("p50_ttft_ms"):
    print(f"{'p50 TTFT speedup':28} {b['p50_ttft_ms'] / a['p50_ttft_ms']:>12.2f}x")
PY
fi
