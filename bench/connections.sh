#!/usr/bin/env bash
# A server under a crowd of 10,000 connections that never finish a request (a third idle, a
# third trickling a header byte every 300 ms, a third half-sent): the latency of /health and of
# a one-token completion meanwhile, each on a new connection. `polychip serve` runs with its
# default limits on the tiny synthesized model (2 layers, qwen2 vocabulary). Not a test: prints
# one markdown table. The crowd needs an open file limit above 10,100 (the tool raises its soft
# limit to the hard one).
#   bench/connections.sh [BUILD_DIR]   env: IDLE=3334 TRICKLING=3333 HALF=3333 DURATION=20
#   POLYCHIP=path/to/polychip (default BUILD_DIR/bin/polychip): measure another build (before)
set -euo pipefail
source "$(dirname "$0")/paths.sh"
BUILD=${1:-$BUILD}
PC=${POLYCHIP:-$BUILD/bin/polychip}
IDLE=${IDLE:-3334}; TRICKLING=${TRICKLING:-3333}; HALF=${HALF:-3333}; DURATION=${DURATION:-20}
PORT=${PORT:-30741}
MODEL=$CACHE/connections-tiny-qwen2-q8_0.gguf
OUT=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$OUT"; }
trap cleanup EXIT

[ -x "$PC" ] || { echo "build polychip first ($PC)" >&2; exit 1; }
if [ ! -f "$MODEL" ]; then
  mkdir -p "$CACHE"
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" --shape tiny --type Q8_0 --seed 7 -q \
    --out "$MODEL"
fi
c++ -std=gnu++20 -O2 -pthread "$ROOT/bench/connections.cc" -o "$OUT/connections"

# The server needs as many descriptors as the crowd (it raises its own soft limit).
"$PC" serve --model-path "$MODEL" --device cpu:0 --threads 1 --host 127.0.0.1 --port "$PORT" \
  >"$OUT/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$OUT/serve.log" >&2; exit 1; }
  sleep 0.5
done
echo "[connections] $("$PC" --version 2>/dev/null | head -1) $PC; $(uptime)" >&2
"$OUT/connections" "$PORT" "$IDLE" "$TRICKLING" "$HALF" "$DURATION"
