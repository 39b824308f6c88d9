#!/usr/bin/env bash
# The cost of structured outputs: decode throughput of `polychip serve` with and without a
# grammar at 1 and 16 concurrent requests on the qwen2.5-0.5b shape (vocabulary 151,936), and
# the mask time per token from the server's /metrics (polychip_grammar_*). Prints one markdown
# table (stdout; progress on stderr):
#   temperature | concurrency | constraint | tok/s free | tok/s constrained | overhead | mask ms/token
# Every request generates exactly -n tokens (the constraints below cannot finish sooner and
# free requests ignore EOS), so the batches stay the same size in both runs. At temperature 1
# a mask also shrinks the sampler's work (fewer candidates), so the overhead can be negative;
# greedy (temperature 0) isolates the grammar's own cost (the free run takes a no-copy argmax).
#
# usage: bench/structured-outputs.sh [-t THREADS] [-n TOKENS] [-c "1 16"] [-T "1 0"]
# env:   POLYCHIP_BUILD_DIR, POLYCHIP_LLAMA_CPP_DIR, POLYCHIP_BENCH_CACHE (bench/paths.sh)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 NTOK=48 CONC="1 16" TEMPS="1 0"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -n) NTOK="$2"; shift 2 ;;
    -c) CONC="$2"; shift 2 ;;
    -T) TEMPS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[structured-outputs] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
export POLYCHIP_DEVICE_BACKEND="${POLYCHIP_DEVICE_BACKEND:-cpu}"
mkdir -p "$CACHE"
MODEL="$CACHE/qwen05-q4_0.gguf"
if [[ ! -f "$MODEL" ]]; then
  log "synthesizing $MODEL"
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" --shape qwen2.5-0.5b --type Q4_0 \
    --out "$MODEL" -q >&2
fi
PORT=$((20000 + RANDOM % 20000))
LOG="$(mktemp)"
"$PC" serve --model-path "$MODEL" --port "$PORT" --threads "$THREADS" --context-length 2048 \
  > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.5
done

python3 - "$PORT" "$NTOK" "$CONC" "$TEMPS" <<'PY'
import json, sys, time, threading, urllib.request

port, ntok = int(sys.argv[1]), int(sys.argv[2])
conc, temps = [int(c) for c in sys.argv[3].split()], [float(t) for t in sys.argv[4].split()]
base = f"http://127.0.0.1:{port}"

# Constraints that cannot complete within ntok tokens: every request runs to max_tokens.
schema = {"type": "array", "minItems": 1000, "items": {
    "type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "maxLength": 12},
        "tag": {"enum": ["red", "green", "blue"]}},
    "required": ["id", "name", "tag"], "additionalProperties": False}}
constraints = {
    "json_schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "rows", "schema": schema}}},
    "regex": {"regex": "([a-z]+ ){1000}"},
}

def post(body):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())

def metrics():
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("polychip_grammar_"):
            k, v = line.split()
            out[k] = float(v)
    return out

def run(n, extra, temperature=1.0):
    results, errors = [], []
    def one(i):
        try:
            body = {"prompt": f"Row {i}:", "max_tokens": ntok, "temperature": temperature, "seed": i,
                    "ignore_eos": True, **extra}
            results.append(post(body)["usage"]["completion_tokens"])
        except Exception as e:  # noqa: BLE001 (reported)
            errors.append(str(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in threads: t.start()
    for t in threads: t.join()
    dt = time.time() - t0
    if errors: raise SystemExit(f"request failed: {errors[0]}")
    return sum(results) / dt, sum(results)

run(1, {})  # warm-up (first-request allocations, the grammar compiler's token trie)
print("| temperature | concurrency | constraint | tok/s free | tok/s constrained | overhead | mask ms/token | mask build ms/token | masks built |")
print("|---|---|---|---|---|---|---|---|---|")
for temp in temps:
    for c in conc:
        free, _ = run(c, {}, temp)
        for name, extra in constraints.items():
            run(1, dict(extra), temp)  # compile once (the cache keeps the grammar and its masks)
            m0 = metrics()
            constrained, tokens = run(c, dict(extra), temp)
            m1 = metrics()
            d = {k: m1[k] - m0.get(k, 0) for k in m1}
            masks = max(d["polychip_grammar_masks_total"], 1)
            print(f"| {temp:g} | {c} | {name} | {free:.1f} | {constrained:.1f} "
                  f"| {100 * (1 - constrained / free):+.1f}% "
                  f"| {1e3 * d['polychip_grammar_mask_seconds_total'] / masks:.3f} "
                  f"| {1e3 * d['polychip_grammar_mask_build_seconds_total'] / masks:.3f} "
                  f"| {int(d['polychip_grammar_masks_built_total'])}/{int(masks)} |", flush=True)
PY
