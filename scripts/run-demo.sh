#!/usr/bin/env bash
# The README's first command ends here: serve the bundled model, ask it one chat question over
# the OpenAI API, print the answer, stop the server.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/bin/polychip"
model="${POLYCHIP_MODEL:-$root/models/polychip-tiny.gguf}"
port="${POLYCHIP_PORT:-30000}"
question="${POLYCHIP_QUESTION:-Tell me about the beginning.}"

if [ ! -f "$model" ]; then
  echo "error: model $model not found (set POLYCHIP_MODEL=/path/to/model.gguf)" >&2
  exit 1
fi

"$bin" serve --model-path "$model" --device cpu:0 --host 127.0.0.1 --port "$port" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then echo "error: the server exited during start-up" >&2; exit 1; fi
  sleep 0.5
done

echo ">>> user: $question" >&2
curl -sf "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"default\", \"max_tokens\": 64, \"temperature\": 0.7, \"seed\": 1,
       \"messages\": [{\"role\": \"user\", \"content\": \"$question\"}]}" \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["message"]["content"])'
